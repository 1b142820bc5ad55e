//! The store contract (SPEC section 4) and its backends.
//!
//! One async trait, [`MailboxStore`], is implemented by every backend. Ingest and the CLI reach a
//! store only through it; backends never import each other.

pub mod clock;
pub mod fault;
pub mod memory;
pub mod redis;
pub mod scylla;

use async_trait::async_trait;

use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, ScanPage, ScanRequest,
    StoreError, TruncateOutcome, UserId,
};

pub use clock::{Clock, ManualClock, SystemClock};

/// An async callback a backend runs at a fixed point inside an operation. Tests use it to move
/// time between a scan's read and its post-read check ("expiry between the check and the read").
pub type PhaseHook = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
>;

/// A mailbox store.
///
/// # Guarantees every backend gives (checked by the conformance suite in `tests/`)
///
/// - **Atomic per mailbox.** Each operation on one `(user, epoch)` is atomic with respect to every
///   other operation on that mailbox, including two processes racing during a rebalance.
/// - **Idempotent replay.** Appending the same group again returns `Unchanged` and changes nothing;
///   a log replay therefore makes the visible state exactly-once.
/// - **Nothing half-written.** An error leaves the mailbox as it was before the call: no partial
///   group, no empty meta for a rejected cold user.
/// - **Time from the backend's authority.** "Now" is the store's [`Clock`] (memory, Scylla) or the
///   server's `TIME` (Redis), never the caller's.
/// - **Bounded metadata.** At most `max_active_span_days + 1` day proofs, one gap boundary, and
///   identities only for events that can still physically exist.
#[async_trait]
pub trait MailboxStore: Send + Sync {
    /// Short backend name for logs and metric labels: `memory`, `redis`, `scylla`.
    fn backend(&self) -> &'static str;

    /// Appends one group (SPEC 4.2, in that order).
    ///
    /// Outcomes: `Inserted`, `Unchanged` (identical same-day replay), `Replaced` (different-content
    /// same-day replay; the whole old group is replaced), `ExpiredMerged` (expired input without
    /// identity: only the gap boundary moves), `Trimmed`, `StaleEpoch`. Errors: `Rejected`
    /// (validation, future window, span), `Conflict(CrossDay)`, `Corrupt` (fail closed).
    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError>;

    /// Raises `user_trim_seq` to `before_seq` (never lowers it) and deletes every group below it
    /// (SPEC 4.3). Natural expiry never calls this.
    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError>;

    /// Reads whole groups with `after_seq < seq <= until_seq` (SPEC 4.4).
    ///
    /// A reverse range returns an empty page without reading storage. A cursor behind the trim or
    /// the expired gap boundary gets `CursorExpired`, also when expiry crossed it during the read.
    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError>;

    /// Compacts expired days into the gap boundary, in two phases (SPEC 4.5): a corrupt proof
    /// anywhere changes nothing.
    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError>;

    /// Dumps the mailbox metadata as stored, without promoting first.
    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError>;

    /// Fences `user` for a rebuild by this store handle: until [`MailboxStore::end_repair`] or
    /// `lease_secs` pass, appends and truncates of the user through *other* handles (a running
    /// daemon) fail with `UnderRepair` and write nothing, atomically with the check; this
    /// handle's own writes go through. Calling it again renews the lease. Fails with
    /// `UnderRepair` when another handle holds the fence.
    async fn begin_repair(&self, user: &UserId, lease_secs: u64) -> Result<(), StoreError> {
        let _ = (user, lease_secs);
        Err(StoreError::Unsupported {
            backend: self.backend(),
            operation: "repair fences (replay --reset-mailboxes)",
        })
    }

    /// Deletes every mailbox of `user` (every epoch) and its epoch record, so a replay rebuilds
    /// it from the log. Requires the fence of [`MailboxStore::begin_repair`] held by this handle.
    /// Returns how many keys or rows were removed.
    async fn reset_user(&self, user: &UserId) -> Result<u64, StoreError> {
        let _ = user;
        Err(StoreError::Unsupported {
            backend: self.backend(),
            operation: "resetting mailboxes",
        })
    }

    /// Lifts this handle's fence on `user`; writers waiting on it resume.
    async fn end_repair(&self, user: &UserId) -> Result<(), StoreError> {
        let _ = user;
        Err(StoreError::Unsupported {
            backend: self.backend(),
            operation: "repair fences (replay --reset-mailboxes)",
        })
    }

    /// A cheap round trip proving the backend answers (readiness).
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
