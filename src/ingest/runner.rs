//! Store calls in flight: the one place a delivery meets the store.
//!
//! A [`Runner`] holds every delivery whose store call is running (or waiting out its backoff) in
//! one `FuturesUnordered`, polled by the front end's own loop: no task and no channel round trip
//! per delivery. Runs started together (the next run of many lanes, after a batch of records or
//! a batch of completions; a run is one mailbox's waiting appends, or one truncate) go to the
//! store as **one batch** ([`MailboxStore::append_runs`]): on Redis one pipeline with a script
//! call per run, one round trip and one `WAIT` for all of them; elsewhere concurrent calls. A
//! run is never split, and lanes guarantee a batch never holds two runs of one user, so the
//! order between the runs of a batch does not matter.
//!
//! What is in flight is bounded twice: at most [`MAX_BATCHES_IN_FLIGHT`] batches of at most
//! [`MAX_BATCH`] deliveries, and at most the store's own
//! [`MailboxStore::max_appends_in_flight`] runs (Scylla's requests wait for a Paxos round each
//! and hold the driver's state meanwhile; a run holds one request at a time).
//!
//! Each attempt is exactly one store call; what happens next (advance, retry, block) is the
//! front end's decision through [`crate::disposition`], so a retry is just another
//! [`Runner::start_run`] with a delay.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::{apply_delivery, Delivery, DeliveryOutcome};
use crate::model::{EventGroup, StoreError};
use crate::store::MailboxStore;

/// Most deliveries sent to the store in one batch: bounds one pipeline's size (and the latency
/// of its first reply) while amortizing the round trip over many.
pub const MAX_BATCH: usize = 256;

/// Most batches sent and not answered at once: what the store is asked to hold in its queue.
/// Each batch holds its encoded request (every payload once more, plus keys and arguments), so
/// this bounds that memory whatever the window holds; the other started deliveries wait, as
/// cheap references, for a batch to come back. Eight kept a Redis server only 40% busy with
/// 1 KB records; 32 matched the unbounded throughput (BENCHMARKS.md "Memory during a
/// catch-up"). Retries waiting out their backoff are not counted.
pub(crate) const MAX_BATCHES_IN_FLIGHT: usize = 32;

/// A finished attempt.
#[derive(Debug)]
pub(crate) struct Attempt<K> {
    /// The caller's key of the delivery (its partition, generation and place in the window).
    pub key: K,
    pub delivery: Arc<Delivery>,
    /// 0 for the first attempt.
    pub attempt: u32,
    /// `None` when the attempt never reached the store: cancelled, or its run stopped before it.
    pub result: Option<Result<DeliveryOutcome, StoreError>>,
    /// Time spent in the store call (not in the backoff before it).
    pub elapsed: Duration,
    /// The store calls the attempt's batch made, each once: handed out with the batch's first
    /// attempt, empty on the others (one sample per call, not per delivery, for
    /// `store_call_duration_seconds`).
    pub calls: Vec<StoreCall>,
}

/// One call to the store, timed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoreCall {
    /// [`MailboxStore::backend`].
    pub backend: &'static str,
    /// `append` (one `append_runs` of a batch) or `truncate_before`.
    pub op: &'static str,
    /// Deliveries the call carried.
    pub deliveries: usize,
    pub elapsed: Duration,
}

/// Cancels the not-yet-started attempts of one source (a revoked partition, a stopping replay):
/// an attempt still waiting out its backoff never reaches the store once cancelled. A call
/// already sent may still land; idempotent replay makes that harmless for the next owner.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<CancelState>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: AtomicBool,
    /// Wakes attempts waiting out their backoff, so a cancelled retry ends at once (a revoke's
    /// hand-over waits for its partition's attempts to come back).
    wake: tokio::sync::Notify,
}

impl Cancel {
    pub(crate) fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        self.0.wake.notify_waiters();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Completes once [`cancel`](Self::cancel) was called.
    pub(crate) async fn cancelled(&self) {
        let woken = self.0.wake.notified();
        if self.is_cancelled() {
            return;
        }
        woken.await;
    }
}

/// One delivery of a run waiting to be sent.
struct Member<K> {
    key: K,
    delivery: Arc<Delivery>,
    attempt: u32,
}

/// A run waiting to be sent (see `pipeline`'s runs): one delivery, or consecutive appends of
/// one mailbox that go to the store in one [`MailboxStore::append_runs`] entry. Never split.
struct Queued<K> {
    target: Arc<dyn MailboxStore>,
    run: Vec<Member<K>>,
    cancel: Cancel,
}

/// A batch come back: its runs when it counted against the bounds (a retry on its own does
/// not), and its attempts.
type Finished<K> = (Option<usize>, Vec<Attempt<K>>);

/// The store calls in flight.
pub(crate) struct Runner<K> {
    /// Runs started since the last flush, sent together at the next one.
    queued: Vec<Queued<K>>,
    /// Deliveries in `queued`.
    queued_deliveries: usize,
    /// Each future answers the runs of its batch when it was a counted one, and its attempts.
    inflight: FuturesUnordered<BoxFuture<'static, Finished<K>>>,
    /// Batches in `inflight` sent without delay (bounded by [`MAX_BATCHES_IN_FLIGHT`]).
    batches: usize,
    /// Runs in those batches (bounded by the store's `max_appends_in_flight`: a run is one
    /// call's worth of the store's attention, whatever its length).
    sent: usize,
    /// Attempts of finished batches not handed out yet.
    done: VecDeque<Attempt<K>>,
}

impl<K> Default for Runner<K> {
    fn default() -> Self {
        Self {
            queued: Vec::new(),
            queued_deliveries: 0,
            inflight: FuturesUnordered::new(),
            batches: 0,
            sent: 0,
            done: VecDeque::new(),
        }
    }
}

impl<K: Send + Sync + 'static> Runner<K> {
    /// Starts an attempt of a run against `target` after `delay`: `deliveries` in their lane's
    /// order, all of one mailbox (or one truncate), each at `attempt`. A run without delay
    /// joins the next batch to `target`; a delayed one (a retry) goes on its own.
    pub(crate) fn start_run(
        &mut self,
        target: Arc<dyn MailboxStore>,
        deliveries: Vec<(K, Arc<Delivery>)>,
        attempt: u32,
        delay: Duration,
        cancel: Cancel,
    ) {
        if deliveries.is_empty() {
            return;
        }
        let queued = Queued {
            target,
            run: deliveries
                .into_iter()
                .map(|(key, delivery)| Member {
                    key,
                    delivery,
                    attempt,
                })
                .collect(),
            cancel,
        };
        if delay.is_zero() {
            self.queued_deliveries += queued.run.len();
            self.queued.push(queued);
        } else {
            self.inflight.push(Box::pin(async move {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = queued.cancel.cancelled() => {}
                }
                (None, run_batch(vec![queued]).await)
            }));
        }
    }

    /// Sends what was started since the last flush: one batch per target, at most
    /// [`MAX_BATCH`] deliveries each, while fewer than [`MAX_BATCHES_IN_FLIGHT`] are out and the
    /// target's `max_appends_in_flight` has room for more runs. Runs are never split: a run
    /// that does not fit waits for the next batch (a run is at most `RUN_MAX_GROUPS`, below
    /// [`MAX_BATCH`], so it always fits an empty one). What does not fit waits, in order, for a
    /// batch to come back.
    fn flush(&mut self) {
        while !self.queued.is_empty() && self.batches < MAX_BATCHES_IN_FLIGHT {
            let target = self.queued[0].target.clone();
            let limit = target
                .max_appends_in_flight()
                .unwrap_or(MAX_BATCH * MAX_BATCHES_IN_FLIGHT)
                .max(1);
            let room = limit.saturating_sub(self.sent);
            if room == 0 {
                break;
            }
            let mut batch: Vec<Queued<K>> = Vec::new();
            let mut deliveries = 0;
            let mut rest = Vec::new();
            for queued in self.queued.drain(..) {
                let len = queued.run.len();
                let fits = batch.len() < room
                    && (batch.is_empty() || deliveries + len <= MAX_BATCH)
                    && Arc::ptr_eq(&queued.target, &target);
                if fits {
                    deliveries += len;
                    batch.push(queued);
                } else {
                    rest.push(queued);
                }
            }
            self.queued = rest;
            self.queued_deliveries -= deliveries;
            if batch.is_empty() {
                break;
            }
            let runs = batch.len();
            self.batches += 1;
            self.sent += runs;
            self.inflight.push(Box::pin(
                async move { (Some(runs), run_batch(batch).await) },
            ));
        }
    }

    /// Whether another run would be sent soon: fewer than a batch's worth waits unsent, and
    /// another batch may go out. Front ends form runs only then (`pipeline::take_run`), so a
    /// lane's deliveries keep gathering while the store is busy instead of waiting here in
    /// runs formed too early.
    pub(crate) fn wants_more(&self) -> bool {
        self.queued_deliveries < MAX_BATCH && self.batches < MAX_BATCHES_IN_FLIGHT
    }

    fn hand_out(&mut self) -> Option<Attempt<K>> {
        self.done.pop_front()
    }

    /// The next finished attempt; pending forever while nothing is in flight (so it can sit in
    /// a `select!` next to the source).
    pub(crate) async fn next(&mut self) -> Attempt<K> {
        self.flush();
        loop {
            if let Some(attempt) = self.hand_out() {
                return attempt;
            }
            match self.inflight.next().await {
                Some(finished) => {
                    self.finished(finished);
                    self.flush();
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// A finished attempt if one is ready now, without waiting.
    pub(crate) fn try_next(&mut self) -> Option<Attempt<K>> {
        use futures::FutureExt;
        self.flush();
        if let Some(attempt) = self.hand_out() {
            return Some(attempt);
        }
        let finished = self.inflight.next().now_or_never().flatten()?;
        self.finished(finished);
        self.flush();
        self.hand_out()
    }

    fn finished(&mut self, (runs, attempts): Finished<K>) {
        if let Some(runs) = runs {
            self.batches -= 1;
            self.sent -= runs;
        }
        self.done.extend(attempts);
    }
}

/// Runs one batch against its target: the runs of appends in one
/// [`MailboxStore::append_runs`], the truncates one by one; cancelled runs never reach the
/// store. A delivery of a run that the store did not reach (it stopped the run at an earlier
/// answer that is not final) comes back without a result, like a cancelled one.
async fn run_batch<K: Send + Sync>(batch: Vec<Queued<K>>) -> Vec<Attempt<K>> {
    let Some(target) = batch.first().map(|q| q.target.clone()) else {
        return Vec::new();
    };
    let started = Instant::now();
    let live: Vec<bool> = batch.iter().map(|q| !q.cancel.is_cancelled()).collect();
    // The batch is decided (its cancel checks are behind it): a test may freeze it here.
    #[cfg(feature = "failpoints")]
    let paused = failpoint::pause_before_send(failpoint::deliveries(&batch).into_iter()).await;
    let is_append = |q: &Queued<K>| {
        q.run
            .iter()
            .all(|m| matches!(&*m.delivery, Delivery::Append(_)))
    };
    let runs: Vec<Vec<&EventGroup>> = batch
        .iter()
        .zip(&live)
        .filter(|(q, live)| **live && is_append(q))
        .map(|(q, _)| {
            q.run
                .iter()
                .filter_map(|m| match &*m.delivery {
                    Delivery::Append(group) => Some(group),
                    Delivery::Truncate { .. } => None,
                })
                .collect()
        })
        .collect();
    let mut calls = Vec::new();
    let mut appended = if runs.is_empty() {
        Vec::new()
    } else {
        let slices: Vec<&[&EventGroup]> = runs.iter().map(Vec::as_slice).collect();
        let call = Instant::now();
        let appended = target.append_runs(&slices).await;
        calls.push(StoreCall {
            backend: target.backend(),
            op: "append",
            deliveries: runs.iter().map(Vec::len).sum(),
            elapsed: call.elapsed(),
        });
        appended
    }
    .into_iter();
    let mut results: Vec<Vec<Option<Result<DeliveryOutcome, StoreError>>>> =
        Vec::with_capacity(batch.len());
    for (q, live) in batch.iter().zip(&live) {
        if !live {
            results.push(q.run.iter().map(|_| None).collect());
        } else if is_append(q) {
            let mut answers = appended.next().unwrap_or_default().into_iter();
            let mut run: Vec<_> = q
                .run
                .iter()
                .map(|_| answers.next().map(|r| r.map(DeliveryOutcome::Append)))
                .collect();
            if run.first().is_some_and(Option::is_none) {
                // The store answered nothing for this run: transient, tried again.
                run[0] = Some(Err(crate::store::no_answer(target.backend())));
            }
            results.push(run);
        } else {
            let mut run = Vec::with_capacity(q.run.len());
            for member in &q.run {
                let call = Instant::now();
                let result = apply_delivery(target.as_ref(), &member.delivery).await;
                calls.push(StoreCall {
                    backend: target.backend(),
                    op: "truncate_before",
                    deliveries: 1,
                    elapsed: call.elapsed(),
                });
                run.push(Some(result));
            }
            results.push(run);
        }
    }
    let elapsed = started.elapsed();
    #[cfg(feature = "failpoints")]
    if paused {
        eprintln!("sent the paused batch");
    }
    let mut calls = Some(calls);
    batch
        .into_iter()
        .zip(results)
        .flat_map(|(q, results)| q.run.into_iter().zip(results))
        .map(|(member, result)| Attempt {
            key: member.key,
            delivery: member.delivery,
            attempt: member.attempt,
            result,
            elapsed,
            calls: calls.take().unwrap_or_default(),
        })
        .collect()
}

/// A fault-injection point for the zombie tests (SPEC 7.2): with
/// `MATERIALIZER_PAUSE_BEFORE_SEND=<user>:<ms>` in the environment, the first batch holding an
/// append for `<user>` prints `paused before sending <user>` on stderr and waits `ms` after it was
/// decided and before it reaches the store (and prints `sent the paused batch` once answered), so a test can freeze the replica there (SIGSTOP),
/// move its partition to another replica, and let it go on. Test builds only.
#[cfg(feature = "failpoints")]
mod failpoint {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::ingest::Delivery;

    static FIRED: AtomicBool = AtomicBool::new(false);

    /// Every delivery of a batch (a named function: a closure here trips the async
    /// lifetime inference of the future that holds it).
    pub(super) fn deliveries<K>(batch: &[super::Queued<K>]) -> Vec<&Delivery> {
        let mut all = Vec::new();
        for queued in batch {
            for member in &queued.run {
                all.push(&*member.delivery);
            }
        }
        all
    }
    /// The point's setting, read once (an environment lookup per batch would cost the benches,
    /// which build with this feature, a measurable share of a record's time).
    static SPEC: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();

    /// True when this batch was the one paused (its answer is then reported on stderr too).
    pub(super) async fn pause_before_send<'a>(
        deliveries: impl Iterator<Item = &'a Delivery>,
    ) -> bool {
        let spec = SPEC.get_or_init(|| {
            let spec = std::env::var("MATERIALIZER_PAUSE_BEFORE_SEND").ok()?;
            let (user, ms) = spec.split_once(':')?;
            Some((user.to_owned(), ms.parse().ok()?))
        });
        let Some((user, ms)) = spec else {
            return false;
        };
        let (user, ms) = (user.as_str(), *ms);
        if FIRED.load(Ordering::Relaxed) {
            return false;
        }
        let mut deliveries = deliveries;
        let holds = deliveries
            .any(|d| matches!(d, Delivery::Append(g) if g.mailbox.user_id.as_str() == user));
        if !holds || FIRED.swap(true, Ordering::SeqCst) {
            return false;
        }
        eprintln!("paused before sending {user}");
        tokio::time::sleep(Duration::from_millis(ms)).await;
        true
    }
}

#[cfg(test)]
mod tests;
