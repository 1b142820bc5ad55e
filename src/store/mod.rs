//! The store contract (SPEC section 4) and its backends.
//!
//! One async trait, [`MailboxStore`], is implemented by every backend. Ingest and the CLI reach a
//! store only through it; backends never import each other.

pub mod classify;
pub mod clock;
pub mod fault;
pub mod memory;
pub mod redis;
pub mod repair;
pub mod scylla;
pub mod wrapper;

use async_trait::async_trait;

use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, ScanPage, ScanRequest,
    StoreError, TruncateOutcome, UserId,
};

pub use clock::{Clock, ManualClock, SystemClock};

/// Expired day buckets one store compacted into gap boundaries, by every write and explicit
/// promote that was applied (committed): inside appends and truncates (live or staged), and
/// `promote` itself. A scan's compaction is a read's and is not counted (no backend's scan
/// reply carries it). Each store keeps one and answers it as
/// [`MailboxStore::promoted_buckets_total`]; the daemon reports its increase as
/// `promote_expired_buckets_total`, whatever write triggered the compaction.
#[derive(Debug, Default)]
pub(crate) struct PromotedBuckets(std::sync::atomic::AtomicU64);

impl PromotedBuckets {
    /// Counts `days` compacted by a promote that was applied.
    pub(crate) fn add(&self, days: u64) {
        if days > 0 {
            self.0.fetch_add(days, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}
pub use repair::{RepairToken, StagingView, SwapReport};

/// A run answered by [`MailboxStore::append`] one group at a time, stopping after the first
/// answer that is not final (the run's rule, [`MailboxStore::append_run`]). The `append_run` of
/// a wrapper that overrides `append` (never of one that does not: `append` is a run of one).
pub async fn append_one_by_one<S: MailboxStore + ?Sized>(
    store: &S,
    run: &[&EventGroup],
) -> Vec<Result<AppendOutcome, StoreError>> {
    each_in_order(run, |group| store.append(group)).await
}

/// `call` on each group of `run` in order, answering as a run does: a prefix, stopping after
/// the first answer that is not final ([`ends_run`]). The one-by-one form of every run: live
/// ([`append_one_by_one`]) and a repair's staging copy alike.
pub(crate) async fn each_in_order<'g, F, Fut>(
    run: &[&'g EventGroup],
    mut call: F,
) -> Vec<Result<AppendOutcome, StoreError>>
where
    F: FnMut(&'g EventGroup) -> Fut,
    Fut: std::future::Future<Output = Result<AppendOutcome, StoreError>>,
{
    let mut answers = Vec::with_capacity(run.len());
    for group in run {
        let answer = call(group).await;
        let stop = ends_run(&answer);
        answers.push(answer);
        if stop {
            break;
        }
    }
    answers
}

/// Whether every group of `run` is of one mailbox (user and epoch): the runs a backend decides
/// in one call. Anything else is answered one by one ([`append_one_by_one`]).
pub(crate) fn one_mailbox(run: &[&EventGroup]) -> bool {
    run.first()
        .is_some_and(|first| run.iter().all(|g| g.mailbox == first.mailbox))
}

/// A run the store answered with nothing (a backend's bug, never the contract): transient, so
/// the delivery is tried again rather than lost.
pub(crate) fn no_answer(backend: &'static str) -> StoreError {
    StoreError::Unavailable {
        backend,
        detail: "the store answered fewer appends than it was sent".to_owned(),
    }
}

/// Whether a run stops after this answer: an error that is not final.
pub(crate) fn ends_run(answer: &Result<AppendOutcome, StoreError>) -> bool {
    answer.as_ref().is_err_and(|e| !e.is_final())
}

/// The same rule for a backend that decides the groups itself, synchronously (under a lock).
pub(crate) fn answer_run(
    run: &[&EventGroup],
    mut append: impl FnMut(&EventGroup) -> Result<AppendOutcome, StoreError>,
) -> Vec<Result<AppendOutcome, StoreError>> {
    let mut answers = Vec::with_capacity(run.len());
    for group in run {
        let answer = append(group);
        let stop = ends_run(&answer);
        answers.push(answer);
        if stop {
            break;
        }
    }
    answers
}

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
///
/// # What a backend writes, and what it is given
///
/// The required core is what every backend does its own way: [`append_run`] (the one append:
/// every other shape derives from it), `truncate_before`, `range_scan`, `promote`, `inspect`,
/// and its name and counter. Everything else is provided: [`append`] is a run of one,
/// [`append_runs`] runs concurrently and [`append_many`] runs of one; a repair's
/// [`repair_append`] is a run of one of [`repair_append_run`]. A backend overrides a provided
/// method only where it is cheaper with the same answers (Redis pipelines `append_runs`;
/// Redis and memory keep a single-group path), and a backend without repairs leaves the
/// `repair_*` methods refusing.
///
/// [`append_run`]: MailboxStore::append_run
/// [`append`]: MailboxStore::append
/// [`append_runs`]: MailboxStore::append_runs
/// [`append_many`]: MailboxStore::append_many
/// [`repair_append`]: MailboxStore::repair_append
/// [`repair_append_run`]: MailboxStore::repair_append_run
#[async_trait]
pub trait MailboxStore: Send + Sync {
    /// Short backend name for logs and metric labels: `memory`, `redis`, `scylla`.
    fn backend(&self) -> &'static str;

    /// Most appends this store wants in flight at once, across every batch, a run counting as
    /// one (its groups go one call at a time, or in one call); `None`: no limit of its own (the
    /// runner's `MAX_BATCH × MAX_BATCHES_IN_FLIGHT` applies). Scylla holds a
    /// driver request per append while it waits for its Paxos round, so its limit keeps that
    /// memory bounded whatever the window holds.
    fn max_appends_in_flight(&self) -> Option<usize> {
        None
    }

    /// Expired day buckets this store compacted so far ([`PromotedBuckets`]).
    fn promoted_buckets_total(&self) -> u64;

    /// Reads what tells this store's data from a wiped store (SPEC 7.3; Redis's store markers,
    /// `redis::store_marker`): `Some((slots known to hold data, whether any key of the product
    /// exists))`, or `None` for a backend without markers.
    async fn load_data_markers(&self) -> Result<Option<(u32, bool)>, StoreError> {
        Ok(None)
    }

    /// The store was found wiped at start (empty while the consumer group committed): every
    /// call that answers from a mailbox waits (`store_lost`) until an operator acts.
    fn expect_data_everywhere(&self) {}

    /// Whether this store keeps how far it holds each partition of the log (SPEC 7.3, a store
    /// that went back in time: `redis::applied`). The daemon then writes it before each offset
    /// it hands to the consumer, and reads it at each assignment.
    fn keeps_applied(&self) -> bool {
        false
    }

    /// Records that the store holds every write of `topic`'s partitions below these offsets:
    /// `(partition, offset, floor)`, the floor being the caller's own last record of the
    /// partition that the store acknowledged, if any. A record found below its floor means the
    /// store went back in time since (a failover to a replica that missed the last writes): it
    /// is left as it is (the evidence the next assignment's check reads) and answered, per
    /// partition, with what it holds; the others are written.
    async fn record_applied(
        &self,
        _topic: &str,
        _positions: &[(i32, i64, Option<i64>)],
    ) -> Result<std::collections::BTreeMap<i32, i64>, StoreError> {
        Ok(std::collections::BTreeMap::new())
    }

    /// The offsets below which the store holds every write of `partitions` (those recorded).
    async fn applied(
        &self,
        _topic: &str,
        _partitions: &[i32],
    ) -> Result<std::collections::BTreeMap<i32, i64>, StoreError> {
        Ok(std::collections::BTreeMap::new())
    }

    /// `materializer accept-store-loss`: the operator accepts that the store lost data (a wiped
    /// store or master): the data markers of every slot are written again, so the calls that
    /// waited answer from what the store holds now. `Some(markers written)`, or `None` for a
    /// backend without markers.
    async fn accept_data_loss(&self) -> Result<Option<u32>, StoreError> {
        Ok(None)
    }

    /// Appends one group (SPEC 4.2, in that order): a run of one
    /// ([`append_run`](MailboxStore::append_run)). A backend with a cheaper single path (Redis's
    /// one-group script, memory's lock of one) overrides it with the same answers.
    ///
    /// Outcomes: `Inserted`, `Unchanged` (identical same-day replay), `Replaced` (different-content
    /// same-day replay; the whole old group is replaced), `ExpiredMerged` (expired input without
    /// identity: only the gap boundary moves), `Trimmed`, `StaleEpoch`. Errors: `Rejected`
    /// (validation, future window, span), `Conflict(CrossDay)`, `Corrupt` (fail closed).
    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        let mut answers = self.append_run(std::slice::from_ref(&group)).await;
        answers
            .pop()
            .unwrap_or_else(|| Err(no_answer(self.backend())))
    }

    /// Appends several groups, each exactly as [`append`](MailboxStore::append) would (each atomic
    /// on its own, in no particular order between them), answering in the order given. The
    /// caller sends groups of distinct users only. One [`append_runs`](MailboxStore::append_runs)
    /// of runs of one group.
    async fn append_many(&self, groups: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        let runs: Vec<&[&EventGroup]> = groups.iter().map(std::slice::from_ref).collect();
        self.append_runs(&runs)
            .await
            .into_iter()
            .map(|mut answers| {
                answers
                    .pop()
                    .unwrap_or_else(|| Err(no_answer(self.backend())))
            })
            .collect()
    }

    /// Appends several runs ([`append_run`](MailboxStore::append_run)), each of another user,
    /// in no particular order between them, answering each run in the order given. Backends
    /// that can do better than concurrent calls do: Redis sends them as one pipeline, a run as
    /// one script call.
    async fn append_runs(
        &self,
        runs: &[&[&EventGroup]],
    ) -> Vec<Vec<Result<AppendOutcome, StoreError>>> {
        futures::future::join_all(runs.iter().map(|run| self.append_run(run))).await
    }

    /// Appends a **run**: consecutive groups of one mailbox, in source order, answering each
    /// exactly as if they had been appended one by one in that order (SPEC 4 unchanged), in
    /// fewer round trips and commits where the backend can (Redis: one script call; memory:
    /// one lock).
    ///
    /// The answer is a prefix of the run: it stops after the first error that is not final
    /// ([`StoreError::is_final`]: unavailable, under repair, corrupt, fence lost). That group
    /// was not applied, and neither was any group after it, so the caller sends them again in
    /// order; applying a later group first would break the mailbox's source order. A final
    /// refusal (rejected, conflict) changes nothing and the run goes on, as one-by-one appends
    /// would. Groups of several mailboxes are still answered correctly, one by one
    /// ([`append_one_by_one`]).
    ///
    /// The one append every backend writes itself; the other shapes derive from it.
    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>>;

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

    /// What [`promote`](MailboxStore::promote) would compact now, by this machine's clock, from
    /// the mailbox's inspection ([`MailboxInspection::promote_preview`]); changes nothing
    /// (`promote --dry-run`, `patrol --dry-run`).
    async fn promote_preview(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        let now = crate::wall_clock::now_ms() / 1000;
        self.inspect(mailbox).await?.promote_preview(now)
    }

    /// Takes the repair fence of `token.user` for `lease`, held by `token.holder` (SPEC 7.1).
    /// The caller makes the token first, so that after an error whose outcome is unknown (a
    /// timeout: the fence may be up) it can still lift it with
    /// [`repair_abort`](MailboxStore::repair_abort) instead of leaving it for a whole lease.
    ///
    /// While the fence is held, every live append and truncate of the user — through any handle,
    /// in any process — fails with `UnderRepair` and writes nothing, atomically with the check.
    /// Fails with `UnderRepair { holder }` when another repair holds a fence that has not lapsed.
    /// Removes whatever staging copy an earlier, aborted repair of the user left behind, so the
    /// rebuild starts from nothing. Never touches the live mailboxes. The lease is measured by the
    /// backend's time authority.
    async fn repair_fence(
        &self,
        token: &RepairToken,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        let _ = (token, lease);
        Err(self.repair_unsupported())
    }

    /// [`repair_fence`](MailboxStore::repair_fence) with a new token for `user`.
    async fn repair_begin(
        &self,
        user: &UserId,
        lease: std::time::Duration,
    ) -> Result<RepairToken, StoreError> {
        let token = RepairToken::new(user.clone());
        self.repair_fence(&token, lease).await?;
        Ok(token)
    }

    /// Extends the fence of `token` by `lease` from now. Fails with `FenceLost` when the fence
    /// lapsed or is held by someone else: a lost fence is never silently taken back, because
    /// live writes may have happened while it was down.
    async fn repair_renew(
        &self,
        token: &RepairToken,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        let _ = (token, lease);
        Err(self.repair_unsupported())
    }

    /// Appends `group` to the repair's staging copy with exactly the rules of [`append`]
    /// (SPEC 4.2), atomically checking that `token` still holds the fence (`FenceLost`
    /// otherwise, nothing written): a run of one ([`repair_append_run`]).
    ///
    /// [`append`]: MailboxStore::append
    /// [`repair_append_run`]: MailboxStore::repair_append_run
    async fn repair_append(
        &self,
        token: &RepairToken,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        let mut answers = self
            .repair_append_run(token, std::slice::from_ref(&group))
            .await;
        answers
            .pop()
            .unwrap_or_else(|| Err(no_answer(self.backend())))
    }

    /// Appends a run (consecutive groups of one mailbox, [`append_run`]) to the repair's
    /// staging copy, each group exactly as [`repair_append`] would, answered as [`append_run`]
    /// answers: a prefix, stopping after an answer that is not final. A repair rebuilds one
    /// mailbox from its whole log, so its groups come as long runs; Redis sends a run as one
    /// script call.
    ///
    /// [`append_run`]: MailboxStore::append_run
    /// [`repair_append`]: MailboxStore::repair_append
    async fn repair_append_run(
        &self,
        token: &RepairToken,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        let _ = (token, run);
        vec![Err(self.repair_unsupported())]
    }

    /// [`truncate_before`](MailboxStore::truncate_before) on the staging copy, under the same
    /// fence check as [`repair_append`](MailboxStore::repair_append).
    async fn repair_truncate(
        &self,
        token: &RepairToken,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        let _ = (token, mailbox, before_seq);
        Err(self.repair_unsupported())
    }

    /// The one atomic step of a repair: if `token` still holds the fence, replaces every live
    /// mailbox of the user (all epochs, and the epoch record) with the staging copy and lifts the
    /// fence; otherwise fails with `FenceLost` and changes nothing.
    async fn repair_swap(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        let _ = token;
        Err(self.repair_unsupported())
    }

    /// Abandons a repair: removes its staging copy and lifts its fence if it still holds it. The
    /// live mailboxes are untouched. Safe to call after a failed or partial step.
    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        let _ = token;
        Err(self.repair_unsupported())
    }

    /// Removes staging copies whose fence has lapsed (repairs that crashed). Returns how many
    /// users' staging copies were removed. Run by `patrol`. With `dry_run` nothing is removed
    /// and the count is of the copies the same decision would remove now (`patrol --dry-run`):
    /// the decision is the one each backend makes for the real pass, not a second copy of it.
    async fn repair_collect_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        let _ = dry_run;
        Err(self.repair_unsupported())
    }

    /// The error of a backend without repair support.
    fn repair_unsupported(&self) -> StoreError {
        StoreError::Unsupported {
            backend: self.backend(),
            operation: "repair (replay --reset-mailboxes)",
        }
    }

    /// A cheap round trip proving the backend answers (readiness).
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// The repair fence held on `user`, if any (`materializer explain`): its holder and the
    /// lease left, by the backend's time authority. Read-only; a lapsed fence is none.
    async fn fence_of(&self, user: &UserId) -> Result<Option<FenceView>, StoreError> {
        let _ = user;
        Ok(None)
    }

    /// The mailbox's live seqs (an identity whose day has not expired), in seq order, each with
    /// the source position of its stored version (`materializer explain`). Read-only; at most
    /// one entry per live seq, which the retention window bounds.
    async fn seq_positions(&self, mailbox: &MailboxId) -> Result<Vec<SeqPosition>, StoreError> {
        let _ = mailbox;
        Err(StoreError::Unsupported {
            backend: self.backend(),
            operation: "seq_positions",
        })
    }
}

/// A live seq of a mailbox and the log position its stored version was written from
/// (`materializer explain`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SeqPosition {
    pub seq: u64,
    /// `None`: written without a position (`apply`, a re-drive whose letter lacks its source
    /// headers) or by a release that kept none.
    pub position: Option<crate::model::SourcePosition>,
}

/// A repair fence as `explain` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FenceView {
    /// The repair's holder id (`repair-<host>-<pid>-...`).
    pub holder: String,
    /// How long the lease has left, in milliseconds.
    pub lease_left_ms: u64,
}
