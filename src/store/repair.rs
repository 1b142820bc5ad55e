//! Repair of a user's mailboxes from the log (SPEC 7.1): the fence, the staging copy and the swap.
//!
//! A repair never edits the live state in place. It takes the user's **fence** (a lease that makes
//! every live write to the user wait with `UnderRepair`), rebuilds the user's mailboxes into a
//! **staging copy** through the same rules as a live append, and then **swaps**: one atomic step
//! that, only while the fence is still held by this repair, replaces the live state with the
//! staging copy and lifts the fence. Until the swap the live mailbox is exactly as it was (a
//! corrupt one still fails closed); a crash, a signal, a lost lease or an error leaves it so, and
//! the staging copy becomes garbage that the next repair of the user or the patrol removes.
//!
//! Every backend implements the same steps ([`crate::store::MailboxStore::repair_begin`] and the
//! methods after it): Redis with staging keys under the user's hash tag and one swap script,
//! Scylla with staging rows and a lightweight transaction that flips the live generation, memory
//! with a staging map swapped under the user's lock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use super::MailboxStore;
use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, ScanPage, ScanRequest,
    StoreError, TruncateOutcome, UserId,
};

/// Default lease of a repair fence (`replay --fence-lease-secs`). The repair renews it every
/// third of the lease from a task of its own (so two renewals may fail before it lapses), and a
/// rebuild that is busy (or a store call that is slow) never lets it lapse unnoticed; a process
/// that dies stops renewing and the fence lapses by itself after at most the lease.
pub const REPAIR_LEASE: Duration = Duration::from_secs(60);

/// This machine's host name (as `hostname` prints it), `unknown` when it cannot be read.
pub(crate) fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// One repair in progress: the user, and the unique holder id that owns both the fence and the
/// staging copy. Only the process that took the fence has it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepairToken {
    pub user: UserId,
    /// Unique per repair attempt (never reused), so a lapsed-then-retaken fence of another
    /// attempt is never mistaken for this one's.
    pub holder: String,
}

impl RepairToken {
    /// A token with a fresh holder id, `repair-<host>-<pid>-<nanos>-<n>`: the host and pid of
    /// the process (so an operator, and `replay --take-over-fence`, can tell whether the holder
    /// is still alive), wall-clock nanoseconds and a process-wide counter.
    pub fn new(user: UserId) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let holder = format!(
            "repair-{}-{}-{nanos:x}-{}",
            this_host(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        Self { user, holder }
    }

    /// The host and pid a holder id names (`None` for an id of another form).
    pub(crate) fn holder_process(holder: &str) -> Option<(&str, u32)> {
        let rest = holder.strip_prefix("repair-")?;
        let mut back = rest.rsplitn(3, '-');
        let (_counter, _nanos, host_pid) = (back.next()?, back.next()?, back.next()?);
        let (host, pid) = host_pid.rsplit_once('-')?;
        Some((host, pid.parse().ok()?))
    }

    /// A repair writes only its own user: a staging copy is per user, and a write for another
    /// would land outside the fence that guards it.
    pub(crate) fn check_user(
        &self,
        user: &UserId,
        backend: &'static str,
    ) -> Result<(), StoreError> {
        if *user == self.user {
            Ok(())
        } else {
            Err(StoreError::Unsupported {
                backend,
                operation: "writing another user into a repair's staging copy",
            })
        }
    }
}

/// What a swap replaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SwapReport {
    /// Groups the staging copy held, now live.
    pub staged_groups: u64,
    /// Keys (Redis) or rows/partitions (Scylla) or mailboxes (memory) of the old live state
    /// that the swap removed.
    pub replaced: u64,
}

/// The staging copy of one repair seen as a store: appends and truncates go to
/// [`MailboxStore::repair_append`] and [`MailboxStore::repair_truncate`], so the rebuild runs
/// through exactly the code path of a live delivery (`ingest::apply_delivery`). Reads are not
/// offered: nothing reads a staging copy before it is live.
pub struct StagingView {
    store: Arc<dyn MailboxStore>,
    token: RepairToken,
}

impl StagingView {
    pub fn new(store: Arc<dyn MailboxStore>, token: RepairToken) -> Self {
        Self { store, token }
    }

    pub fn token(&self) -> &RepairToken {
        &self.token
    }

    fn check_user(&self, user: &UserId) -> Result<(), StoreError> {
        self.token.check_user(user, self.store.backend())
    }

    fn no_reads(&self) -> StoreError {
        StoreError::Unsupported {
            backend: self.store.backend(),
            operation: "reading a repair's staging copy",
        }
    }
}

#[async_trait]
impl MailboxStore for StagingView {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    fn max_appends_in_flight(&self) -> Option<usize> {
        self.store.max_appends_in_flight()
    }

    /// The store's count: a staging copy's promotes are the store's.
    fn promoted_buckets_total(&self) -> u64 {
        self.store.promoted_buckets_total()
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        self.check_user(&group.mailbox.user_id)?;
        self.store.repair_append(&self.token, group).await
    }

    /// A run of the repair's user goes to the store as one ([`MailboxStore::repair_append_run`]);
    /// a group of another user is refused on its own, as [`append`](Self::append) refuses it.
    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        if run
            .iter()
            .any(|g| self.check_user(&g.mailbox.user_id).is_err())
        {
            return crate::store::append_one_by_one(self, run).await;
        }
        self.store.repair_append_run(&self.token, run).await
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.check_user(&mailbox.user_id)?;
        self.store
            .repair_truncate(&self.token, mailbox, before_seq)
            .await
    }

    async fn range_scan(&self, _: &MailboxId, _: ScanRequest) -> Result<ScanPage, StoreError> {
        Err(self.no_reads())
    }

    async fn promote(&self, _: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        Err(self.no_reads())
    }

    async fn inspect(&self, _: &MailboxId) -> Result<MailboxInspection, StoreError> {
        Err(self.no_reads())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}

/// The fence renewals of a running repair, from a task of their own: a rebuild that is busy, or
/// a store call that is slow, never delays them. [`Renewal::lost`] resolves when a fence is lost
/// (`FenceLost`, or renewals failing until the lease must have lapsed): the repair must then
/// abort without swapping.
pub(crate) struct Renewal {
    task: tokio::task::JoinHandle<()>,
    lost: tokio::sync::watch::Receiver<Option<String>>,
    /// The tokens still renewed; a swapped one leaves the set.
    tokens: Arc<std::sync::Mutex<Vec<RepairToken>>>,
}

impl Renewal {
    /// Renews every token every `period` for `lease`; a transient failure is retried every
    /// second while the lease may still hold.
    pub(crate) fn start(
        store: Arc<dyn MailboxStore>,
        tokens: Vec<RepairToken>,
        lease: Duration,
        every: Duration,
    ) -> Self {
        let (tx, lost) = tokio::sync::watch::channel(None);
        let tokens = Arc::new(std::sync::Mutex::new(tokens));
        let renewed = tokens.clone();
        let task = tokio::spawn(async move {
            let mut renewed_at = std::time::Instant::now();
            let mut wait = every;
            loop {
                tokio::time::sleep(wait).await;
                let mut failure = None;
                let current: Vec<RepairToken> = renewed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                for token in &current {
                    match store.repair_renew(token, lease).await {
                        Ok(()) => {}
                        Err(StoreError::FenceLost { detail }) => {
                            let still_renewed = renewed
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .contains(token);
                            // A token released meanwhile was swapped: its fence is gone by design.
                            if still_renewed {
                                let _ = tx.send(Some(detail));
                                return;
                            }
                        }
                        Err(e) => failure = Some(e),
                    }
                }
                match failure {
                    None => {
                        renewed_at = std::time::Instant::now();
                        wait = every;
                    }
                    Some(e) if renewed_at.elapsed() >= lease => {
                        let _ = tx.send(Some(format!(
                            "the fence could not be renewed for the whole lease ({lease:?}): {e}"
                        )));
                        return;
                    }
                    Some(e) => {
                        tracing::warn!(error = %e, "repair fence renewal failed; retrying");
                        wait = Duration::from_secs(1).min(every);
                    }
                }
            }
        });
        Self { task, lost, tokens }
    }

    /// Stops renewing `token` (its swap lifted the fence).
    pub(crate) fn release(&self, token: &RepairToken) {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|t| t != token);
    }

    /// Resolves with the reason once a fence is lost; pending forever otherwise.
    pub(crate) async fn lost(&mut self) -> String {
        loop {
            if let Some(reason) = self.lost.borrow().clone() {
                return reason;
            }
            if self.lost.changed().await.is_err() {
                // The renewal task ended without reporting a loss: it was stopped.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The reason, if a fence is already lost.
    pub(crate) fn is_lost(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Stops renewing.
    pub(crate) fn stop(self) {
        self.task.abort();
    }
}
