//! The errors of the store contract (SPEC 4).
//!
//! Every error carries a kind word from SPEC 8.1 (`kind()`), which the CLI prints and the metrics
//! use as a label. What the product does with each error is decided in `crate::disposition`.

/// Why an input was rejected before anything was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    DuplicateOrdinal,
    CrossBucketGroup,
    FutureCreatedAt,
    SpanExceeded,
    InvalidField,
}

impl RejectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DuplicateOrdinal => "duplicate_ordinal",
            Self::CrossBucketGroup => "cross_bucket_group",
            Self::FutureCreatedAt => "future_created_at",
            Self::SpanExceeded => "span_exceeded",
            Self::InvalidField => "invalid_field",
        }
    }
}

/// A replay that disagrees with what the mailbox holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConflictKind {
    /// The seq already lives in another day bucket.
    CrossDay {
        existing_day: u64,
        incoming_day: u64,
    },
}

impl ConflictKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CrossDay { .. } => "cross_day",
        }
    }
}

/// Mailbox state that cannot be interpreted safely.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorruptKind {
    /// Meta of another retention format (V2/V3); never read or written.
    UnsupportedFormat { found: String },
    /// Meta proves live groups but the identity index is wholly missing.
    IndexLost,
    /// An identity index exists without its meta.
    MetaLost,
    /// A live-day input at or below `seqbucket_max_seq` has no identity.
    IdentityMissing { seq: u64, seqbucket_max_seq: u64 },
    /// A day's proof is missing, unparseable or disagrees with the day set.
    BadProof { detail: String },
}

impl CorruptKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::UnsupportedFormat { .. } => "unsupported_format",
            Self::IndexLost => "index_lost",
            Self::MetaLost => "meta_lost",
            Self::IdentityMissing { .. } => "identity_missing",
            Self::BadProof { .. } => "bad_proof",
        }
    }
}

/// Why a cursor can no longer be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CursorExpired {
    /// `after_seq + 1 < user_trim_seq`: resume after `resume_after` (= `user_trim_seq - 1`).
    Trimmed { resume_after: u64 },
    /// `after_seq < expired_gap_boundary`: events up to `boundary` may be gone by natural expiry.
    ExpiredGap { boundary: u64 },
}

impl CursorExpired {
    pub fn reason(self) -> &'static str {
        match self {
            Self::Trimmed { .. } => "trimmed",
            Self::ExpiredGap { .. } => "expired_gap",
        }
    }
}

/// What a store error means for the delivery that met it (SPEC 7's error classes), decided in
/// one exhaustive `match` ([`StoreError::class`]): what a front end does
/// (`crate::disposition`), where a run of deliveries stops ([`StoreError::is_final`]), what is
/// dead-lettered and every command's exit status derive from it. A new error kind that nobody
/// classified does not compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Final: the input or the mailbox refuses the write (rejected, conflict, epoch mismatch,
    /// cursor expired, store refused, unsupported). Dead-lettered; a command exits 1.
    Refused,
    /// Not final: the mailbox fails closed until a repair rebuilds it. A command exits 3 (SPEC 8.2).
    Corrupt,
    /// Not final: the store did not answer (unreachable, timeout, failover, too few replica
    /// acknowledgements). Retried; a command exits 2.
    Unavailable,
    /// Not final: a repair holds the user; retried until it swaps. A command exits 2.
    UnderRepair,
    /// A repair's own staged write found its fence gone: the repair aborts.
    FenceLost,
}

/// Every way a store operation can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("rejected ({}): {detail}", kind.as_str())]
    Rejected { kind: RejectKind, detail: String },
    #[error("conflict ({}): {}", kind.as_str(), conflict_detail(kind))]
    Conflict { kind: ConflictKind },
    #[error("corrupt mailbox ({}): {}", kind.as_str(), corrupt_detail(kind))]
    Corrupt { kind: CorruptKind },
    #[error("epoch mismatch: current epoch is {}", fmt_epoch(*current))]
    EpochMismatch { current: Option<u32> },
    #[error("cursor expired ({}): {}", cursor.reason(), cursor_detail(*cursor))]
    CursorExpired { cursor: CursorExpired },
    /// The backend is unreachable or failed in a way a retry may fix.
    #[error("store unavailable ({backend}): {detail}")]
    Unavailable {
        backend: &'static str,
        detail: String,
    },
    /// The user's mailboxes are being rebuilt by `replay --reset-mailboxes` (held by `holder`):
    /// a writer waits and retries; nothing was written.
    #[error("user under repair by {holder}: writes wait until the rebuild ends")]
    UnderRepair { holder: String },
    /// The backend refused the operation deterministically: a Lua runtime error, a CQL invalid
    /// request, a value it cannot hold. Retrying the same input can never succeed, so the
    /// delivery ends `rejected` with kind `store_refused` and its record is dead-lettered (SPEC 7,
    /// error classes). Which native errors land here is decided in `store::classify` alone.
    #[error("store refused ({backend}): {detail}")]
    Refused {
        backend: &'static str,
        detail: String,
    },
    /// This repair no longer holds its user's fence (the lease lapsed or another repair took it
    /// over): the repair aborts without swapping, leaving the live mailbox as it was.
    #[error("repair fence lost: {detail}")]
    FenceLost { detail: String },
    /// The backend does not offer this operation.
    #[error("{backend} does not support {operation}")]
    Unsupported {
        backend: &'static str,
        operation: &'static str,
    },
}

/// How a [`StoreError::store_lost`] detail starts.
const STORE_LOST: &str = "store lost: ";

fn fmt_epoch(current: Option<u32>) -> String {
    current.map_or_else(|| "none".to_owned(), |e| e.to_string())
}

fn conflict_detail(kind: &ConflictKind) -> String {
    match kind {
        ConflictKind::CrossDay {
            existing_day,
            incoming_day,
        } => format!(
            "seq already lives in day {existing_day}; the replay is dated day {incoming_day}"
        ),
    }
}

fn corrupt_detail(kind: &CorruptKind) -> String {
    match kind {
        CorruptKind::UnsupportedFormat { found } => {
            format!("meta has retention_format_version {found}; only 4 is read or written")
        }
        CorruptKind::IndexLost => {
            "meta proves live groups but the identity index is missing; replay the mailbox from the log"
                .to_owned()
        }
        CorruptKind::MetaLost => {
            "identity index exists without meta; replay the mailbox from the log".to_owned()
        }
        CorruptKind::IdentityMissing {
            seq,
            seqbucket_max_seq,
        } => format!(
            "seq {seq} is at or below seqbucket_max_seq {seqbucket_max_seq} but has no identity; replay the mailbox from the log"
        ),
        CorruptKind::BadProof { detail } => detail.clone(),
    }
}

fn cursor_detail(cursor: CursorExpired) -> String {
    match cursor {
        CursorExpired::Trimmed { resume_after } => format!("resume after {resume_after}"),
        CursorExpired::ExpiredGap { boundary } => {
            format!("events up to seq {boundary} may have expired")
        }
    }
}

impl StoreError {
    /// Shorthand for a rejection.
    pub fn rejected(kind: RejectKind, detail: impl Into<String>) -> Self {
        Self::Rejected {
            kind,
            detail: detail.into(),
        }
    }

    /// Shorthand for corruption.
    pub fn corrupt(kind: CorruptKind) -> Self {
        Self::Corrupt { kind }
    }

    /// The outcome word of SPEC 8.1 (`rejected`, `conflict`, `corrupt`) or the error's own kind
    /// where SPEC gives the error no outcome word.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Rejected { .. } => "rejected",
            Self::Conflict { .. } => "conflict",
            Self::Corrupt { .. } => "corrupt",
            Self::EpochMismatch { .. } => "rejected",
            Self::CursorExpired { .. } => "cursor_expired",
            Self::Unavailable { .. } => "unavailable",
            Self::UnderRepair { .. } => "under_repair",
            Self::Refused { .. } => "rejected",
            Self::FenceLost { .. } => "fence_lost",
            Self::Unsupported { .. } => "rejected",
        }
    }

    /// Whether this error is the delivery's final answer: a refusal decided from the input and
    /// the mailbox (rejected, conflict, epoch mismatch, cursor expired, store refused,
    /// unsupported). The others (unavailable, under repair, corrupt, fence lost) decide nothing
    /// about the delivery: it was not applied and must be tried again or wait for a repair, so
    /// a run of deliveries stops there ([`MailboxStore::append_run`]). Derived from
    /// [`StoreError::class`], as `crate::disposition` is.
    ///
    /// [`MailboxStore::append_run`]: crate::store::MailboxStore::append_run
    pub fn is_final(&self) -> bool {
        self.class() == ErrorClass::Refused
    }

    /// The error's class: the one place that decides it.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Rejected { .. }
            | Self::Conflict { .. }
            | Self::EpochMismatch { .. }
            | Self::CursorExpired { .. }
            | Self::Refused { .. }
            | Self::Unsupported { .. } => ErrorClass::Refused,
            Self::Corrupt { .. } => ErrorClass::Corrupt,
            Self::Unavailable { .. } => ErrorClass::Unavailable,
            Self::UnderRepair { .. } => ErrorClass::UnderRepair,
            Self::FenceLost { .. } => ErrorClass::FenceLost,
        }
    }

    /// The store lost the data this call would read or write (SPEC 7.3, a wiped store or
    /// master): transient like an unreachable store (retried, never dead-lettered) while an
    /// operator decides; `detail` names what is gone and the two ways on.
    pub fn store_lost(backend: &'static str, detail: String) -> Self {
        Self::Unavailable {
            backend,
            detail: format!("{STORE_LOST}{detail}"),
        }
    }

    /// Whether this is [`Self::store_lost`].
    pub fn is_store_lost(&self) -> bool {
        matches!(self, Self::Unavailable { detail, .. } if detail.starts_with(STORE_LOST))
    }

    /// The store refused the call for memory (Redis `OOM`: used memory over `maxmemory`), a
    /// transient state that readiness names "store full" (SPEC 7.3).
    pub fn out_of_memory(&self) -> bool {
        matches!(self, Self::Unavailable { detail, .. }
            if detail.contains("OOM") || detail.contains("used memory > 'maxmemory'"))
    }

    /// The error kind word of SPEC 8.1.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Rejected { kind, .. } => kind.as_str(),
            Self::Conflict { kind } => kind.as_str(),
            Self::Corrupt { kind } => kind.as_str(),
            Self::EpochMismatch { .. } => "epoch_mismatch",
            Self::CursorExpired { .. } => "cursor_expired",
            Self::Unavailable { .. } => "unavailable",
            Self::UnderRepair { .. } => "under_repair",
            Self::Refused { .. } => "store_refused",
            Self::FenceLost { .. } => "fence_lost",
            Self::Unsupported { .. } => "unsupported",
        }
    }

    /// Human-readable detail without the kind prefix.
    pub fn detail(&self) -> String {
        match self {
            Self::Rejected { detail, .. } => detail.clone(),
            Self::Conflict { kind } => conflict_detail(kind),
            Self::Corrupt { kind } => corrupt_detail(kind),
            Self::EpochMismatch { current } => {
                format!("current epoch is {}", fmt_epoch(*current))
            }
            Self::CursorExpired { cursor } => cursor_detail(*cursor),
            Self::Unavailable { detail, .. } => detail.clone(),
            Self::UnderRepair { holder } => format!("under repair by {holder}"),
            Self::Refused { backend, detail } => format!("{backend} refused: {detail}"),
            Self::FenceLost { detail } => detail.clone(),
            Self::Unsupported { backend, operation } => {
                format!("{backend} does not support {operation}")
            }
        }
    }
}
