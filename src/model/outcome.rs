//! What store operations return when they succeed.
//!
//! The snake_case words returned by `as_str` are a stable interface: they are the `outcome` field of
//! `materializer apply` and the `outcome` label of the metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::group::Event;

/// The successful results of [`append`](crate::store::MailboxStore::append) (SPEC 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AppendOutcome {
    /// A new group was written.
    Inserted,
    /// A same-day replay with identical content; nothing changed.
    Unchanged,
    /// A same-day replay with different content replaced the whole old group.
    Replaced,
    /// A same-day replay with different content from an older offset of the log and partition
    /// that wrote the seq's stored version (SPEC 7.2): a zombie's late write or a replay of a
    /// record the log has since superseded. Nothing changed; final, like every outcome here.
    Superseded,
    /// The input's day is already expired and no identity exists: the seq was merged into the
    /// expired gap boundary and no event was written.
    ExpiredMerged,
    /// `seq < user_trim_seq`: the seq was explicitly truncated; nothing written.
    Trimmed,
    /// The input's epoch is older than the user's current epoch; nothing written.
    StaleEpoch,
}

impl AppendOutcome {
    pub(crate) const ALL: [AppendOutcome; 7] = [
        Self::Inserted,
        Self::Unchanged,
        Self::Replaced,
        Self::Superseded,
        Self::ExpiredMerged,
        Self::Trimmed,
        Self::StaleEpoch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inserted => "inserted",
            Self::Unchanged => "unchanged",
            Self::Replaced => "replaced",
            Self::Superseded => "superseded",
            Self::ExpiredMerged => "expired_merged",
            Self::Trimmed => "trimmed",
            Self::StaleEpoch => "stale_epoch",
        }
    }
}

/// Result of [`truncate_before`](crate::store::MailboxStore::truncate_before).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TruncateOutcome {
    /// The trim after the call: `max(previous, before_seq)`.
    pub user_trim_seq: u64,
    /// Groups removed by this call.
    pub removed_groups: u64,
}

/// Result of [`promote`](crate::store::MailboxStore::promote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PromoteOutcome {
    /// Expired days compacted by this call.
    pub expired_days: u32,
    /// The boundary after the call.
    pub expired_gap_boundary: u64,
}

/// Arguments of [`range_scan`](crate::store::MailboxStore::range_scan) (SPEC 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanRequest {
    /// Exclusive lower bound: the reader's cursor.
    pub after_seq: u64,
    /// Inclusive upper bound, if any.
    pub until_seq: Option<u64>,
    /// Most whole groups returned; `1..=MAX_SCAN_LIMIT`.
    pub limit_groups: u32,
}

/// Ceiling on `limit_groups`: bounds the memory of one page.
pub(crate) const MAX_SCAN_LIMIT: u32 = 10_000;

/// One group as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScannedGroup {
    pub mailbox_seq: u64,
    pub created_at: u64,
    /// Shared with the store where the backend can (memory), copied otherwise.
    pub events: Arc<[Event]>,
}

/// A page of a mailbox: every live event with `after_seq < seq <= up_to` is in `groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScanPage {
    pub groups: Vec<ScannedGroup>,
    pub up_to: u64,
    pub has_more: bool,
}

impl ScanPage {
    /// A page that covers nothing beyond the cursor.
    pub fn empty(after_seq: u64) -> Self {
        Self {
            groups: Vec::new(),
            up_to: after_seq,
            has_more: false,
        }
    }
}

/// The proof a mailbox keeps for one active day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ActiveDay {
    /// `bucket_max_seq:<day>`: largest seq ever written into the day.
    pub max_seq: u64,
    /// `bucket_expires_at:<day>`.
    pub expires_at: u64,
}

/// A read-only dump of a mailbox's metadata, as stored (no promote runs first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MailboxInspection {
    /// `retention_format_version` of the meta; `None` when the mailbox has no meta.
    pub format_version: Option<u32>,
    /// The user's current epoch; `None` for a user never written.
    pub current_epoch: Option<u32>,
    pub min_day: Option<u64>,
    pub max_day: Option<u64>,
    pub active_day_count: u32,
    pub active_days: BTreeMap<u64, ActiveDay>,
    pub expired_gap_boundary: u64,
    pub seqbucket_max_seq: u64,
    pub user_trim_seq: u64,
    /// Members of the identity index, expired ones included until a promote drops them.
    pub identity_count: u64,
    /// Whether the identity index exists at all.
    pub identity_index_present: bool,
}

impl MailboxInspection {
    /// What a promote would do at `now` (seconds), decided by the rule every backend's promote
    /// follows ([`plan_promote`](super::rules::plan_promote)) on the proofs this inspection
    /// read; changes nothing (`promote --dry-run`, `patrol --dry-run`). A proof that would make
    /// the promote refuse is the same `corrupt` error.
    pub fn promote_preview(&self, now: u64) -> Result<PromoteOutcome, super::StoreError> {
        let plan = super::rules::plan_promote(
            self.active_days.iter().map(|(day, d)| (*day, d.expires_at)),
            |day| super::rules::Proof {
                max_seq: self.active_days.get(&day).map(|d| d.max_seq),
                expires_at: self.active_days.get(&day).map(|d| d.expires_at),
            },
            self.expired_gap_boundary,
            self.user_trim_seq,
            now,
        )?;
        Ok(PromoteOutcome {
            expired_days: u32::try_from(plan.expired_days.len()).unwrap_or(u32::MAX),
            expired_gap_boundary: plan.new_boundary,
        })
    }

    /// SPEC 7.3: a piece of the mailbox lost, as its own metadata shows at `now` (seconds): the
    /// pieces are written together, so one without the others was lost. `explain` names it
    /// (a scan of a Redis mailbox reads the day buckets, not the identity index, so it reads
    /// fine while the index is gone, and every later append of a new seq refuses).
    pub fn missing_piece(&self, now: u64) -> Option<String> {
        let meta = self.format_version.is_some();
        if meta && self.current_epoch.is_none() {
            return Some("the epoch key is missing although the mailbox's meta exists".to_owned());
        }
        if !meta && self.identity_index_present {
            return Some("the meta is missing although the identity index exists".to_owned());
        }
        let live_groups = self.active_days.iter().any(|(_, day)| {
            day.expires_at > now
                && day.max_seq >= self.user_trim_seq
                && day.max_seq > self.expired_gap_boundary
        });
        if meta && !self.identity_index_present && live_groups {
            return Some(format!(
                "the identity index is missing although the meta proves live groups up to seq {}",
                self.seqbucket_max_seq
            ));
        }
        None
    }
}

/// The final, successful outcome of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// A group delivery's append outcome.
    Append(AppendOutcome),
    /// A `truncate_before` record moved the trim to `user_trim_seq`.
    Truncated { user_trim_seq: u64 },
    /// A `truncate_before` record for an epoch older than the user's current one: nothing done,
    /// like a stale append.
    TruncateStale,
}

impl DeliveryOutcome {
    /// The outcome word of SPEC 8.1.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Append(outcome) => outcome.as_str(),
            Self::Truncated { .. } => "truncated",
            Self::TruncateStale => "stale_epoch",
        }
    }
}
