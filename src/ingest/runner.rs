//! Store calls in flight: the one place a delivery meets the store.
//!
//! A [`Runner`] holds every delivery whose store call is running (or waiting out its backoff) in
//! one `FuturesUnordered`, polled by the front end's own loop: no task and no channel round trip
//! per delivery. Deliveries started together (the runnable heads of many lanes, after a batch of
//! records or a batch of completions) go to the store as **one batch**
//! ([`MailboxStore::append_many`]): on Redis one pipeline of scripts, one round trip and one
//! `WAIT` for all of them; elsewhere concurrent calls. Lanes guarantee a batch never holds two
//! deliveries of one user, so the order inside a batch does not matter.
//!
//! What is in flight is bounded twice: at most [`MAX_BATCHES_IN_FLIGHT`] batches of at most
//! [`MAX_BATCH`] deliveries, and at most the store's own
//! [`MailboxStore::max_appends_in_flight`] deliveries (Scylla's requests wait for a Paxos round
//! each and hold the driver's state meanwhile).
//!
//! Each attempt is exactly one store call; what happens next (advance, retry, block) is the
//! front end's decision through [`crate::disposition`], so a retry is just another
//! [`Runner::start`] with a delay.

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
    /// `None` when the attempt was cancelled before it reached the store.
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
    /// `append` (one `append_many` of a batch) or `truncate_before`.
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

/// One delivery waiting to be sent.
struct Queued<K> {
    key: K,
    target: Arc<dyn MailboxStore>,
    delivery: Arc<Delivery>,
    attempt: u32,
    cancel: Cancel,
}

/// The store calls in flight.
pub(crate) struct Runner<K> {
    /// Deliveries started since the last flush, sent together at the next one.
    queued: Vec<Queued<K>>,
    /// Each future answers whether it was a counted batch, and its attempts.
    inflight: FuturesUnordered<BoxFuture<'static, (bool, Vec<Attempt<K>>)>>,
    /// Batches in `inflight` sent without delay (bounded by [`MAX_BATCHES_IN_FLIGHT`]).
    batches: usize,
    /// Deliveries in those batches (bounded by the store's `max_appends_in_flight`).
    sent: usize,
    /// Attempts of finished batches not handed out yet.
    done: VecDeque<Attempt<K>>,
}

impl<K> Default for Runner<K> {
    fn default() -> Self {
        Self {
            queued: Vec::new(),
            inflight: FuturesUnordered::new(),
            batches: 0,
            sent: 0,
            done: VecDeque::new(),
        }
    }
}

impl<K: Send + Sync + 'static> Runner<K> {
    /// Starts one attempt of `delivery` against `target` after `delay`. An attempt without delay
    /// joins the next batch to `target`; a delayed one (a retry) goes on its own.
    pub(crate) fn start(
        &mut self,
        key: K,
        target: Arc<dyn MailboxStore>,
        delivery: Arc<Delivery>,
        attempt: u32,
        delay: Duration,
        cancel: Cancel,
    ) {
        let queued = Queued {
            key,
            target,
            delivery,
            attempt,
            cancel,
        };
        if delay.is_zero() {
            self.queued.push(queued);
        } else {
            self.inflight.push(Box::pin(async move {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = queued.cancel.cancelled() => {}
                }
                (false, run_batch(vec![queued]).await)
            }));
        }
    }

    /// Sends what was started since the last flush: one batch per target, at most
    /// [`MAX_BATCH`] deliveries each, while fewer than [`MAX_BATCHES_IN_FLIGHT`] are out and the
    /// target's `max_appends_in_flight` has room. What does not fit waits, in order, for a
    /// batch to come back.
    fn flush(&mut self) {
        while !self.queued.is_empty() && self.batches < MAX_BATCHES_IN_FLIGHT {
            let target = self.queued[0].target.clone();
            let limit = target
                .max_appends_in_flight()
                .unwrap_or(MAX_BATCH * MAX_BATCHES_IN_FLIGHT)
                .max(1);
            let size = MAX_BATCH.min(limit.saturating_sub(self.sent));
            if size == 0 {
                break;
            }
            let mut batch = Vec::new();
            let mut rest = Vec::new();
            for queued in self.queued.drain(..) {
                if batch.len() < size && Arc::ptr_eq(&queued.target, &target) {
                    batch.push(queued);
                } else {
                    rest.push(queued);
                }
            }
            self.queued = rest;
            self.batches += 1;
            self.sent += batch.len();
            self.inflight
                .push(Box::pin(async move { (true, run_batch(batch).await) }));
        }
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

    fn finished(&mut self, (counted, attempts): (bool, Vec<Attempt<K>>)) {
        if counted {
            self.batches -= 1;
            self.sent -= attempts.len();
        }
        self.done.extend(attempts);
    }
}

/// Runs one batch against its target: the appends in one [`MailboxStore::append_many`], the
/// truncates one by one; cancelled deliveries never reach the store.
async fn run_batch<K: Send + Sync>(batch: Vec<Queued<K>>) -> Vec<Attempt<K>> {
    let Some(target) = batch.first().map(|q| q.target.clone()) else {
        return Vec::new();
    };
    let started = Instant::now();
    let live: Vec<bool> = batch.iter().map(|q| !q.cancel.is_cancelled()).collect();
    // The batch is decided (its cancel checks are behind it): a test may freeze it here.
    #[cfg(feature = "failpoints")]
    let paused = failpoint::pause_before_send(batch.iter().map(|q| &*q.delivery)).await;
    let groups: Vec<&EventGroup> = batch
        .iter()
        .zip(&live)
        .filter_map(|(q, live)| match (&*q.delivery, live) {
            (Delivery::Append(group), true) => Some(group),
            _ => None,
        })
        .collect();
    let mut calls = Vec::new();
    let mut appended = if groups.is_empty() {
        Vec::new()
    } else {
        let call = Instant::now();
        let appended = target.append_many(&groups).await;
        calls.push(StoreCall {
            backend: target.backend(),
            op: "append",
            deliveries: groups.len(),
            elapsed: call.elapsed(),
        });
        appended
    }
    .into_iter();
    let mut results = Vec::with_capacity(batch.len());
    for (q, live) in batch.iter().zip(&live) {
        let result = match (&*q.delivery, live) {
            (_, false) => None,
            (Delivery::Append(_), true) => Some(
                appended
                    .next()
                    .map(|r| r.map(DeliveryOutcome::Append))
                    .unwrap_or_else(|| {
                        Err(StoreError::Unavailable {
                            backend: target.backend(),
                            detail: "the store answered fewer appends than it was sent".to_owned(),
                        })
                    }),
            ),
            (Delivery::Truncate { .. }, true) => {
                let call = Instant::now();
                let result = apply_delivery(target.as_ref(), &q.delivery).await;
                calls.push(StoreCall {
                    backend: target.backend(),
                    op: "truncate_before",
                    deliveries: 1,
                    elapsed: call.elapsed(),
                });
                Some(result)
            }
        };
        results.push(result);
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
        .map(|(q, result)| Attempt {
            key: q.key,
            delivery: q.delivery,
            attempt: q.attempt,
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
