//! The drive loop: what happens to a record between its source and its final result, written
//! once for every front end.
//!
//! A record's path, whichever door it came through (the daemon, `replay`, `apply`, `dlq
//! redrive`):
//!
//! 1. [`Driver::admit`] puts it in its source's window ([`PartitionPipeline`]); a lane with
//!    nothing out becomes ready, and while the [`Runner`] wants more the driver forms runs from
//!    ready lanes (one per window in turn) and starts them (against [`Policy::target`], the live
//!    store unless a repair stages the user elsewhere).
//! 2. [`Driver::next`] waits for a finished store call; [`Driver::handle`] reads its result
//!    through [`Disposition`]:
//!    - final by the table (advance, dead letter): the delivery completes, its lane is ready
//!      again once the whole current run is back, and a settled record with a refusal
//!      goes to [`Policy::dead_letter`];
//!    - not reached (its run stopped at an earlier answer that is not final): it waits in its
//!      lane and leads the next run;
//!    - not final (block, retry, abort): the front end's [`Policy::not_final`] answers with a
//!      [`Verdict`]: retry after a delay (the daemon, always), take it as final (`apply`,
//!      `replay` and `dlq redrive` report a corrupt mailbox and go on, and the driver holds
//!      that mailbox for the rest of the run: its later deliveries are skipped and reported
//!      `held`) or stop the run (`apply` and `replay` after a few attempts, a lost repair fence).
//! 3. The front end takes final records out of the window in source order
//!    ([`PartitionPipeline::pop_final`]) and reports or commits them.
//!
//! What differs between front ends is only their [`Policy`] and where their records come from,
//! so "what happens to a record whose store call times out, in the daemon, in replay, in
//! apply?" is answered by this file and each policy's `not_final`.
//!
//! Bounds: each window holds at most its `max_records` records; the runner holds at most one
//! run per lane (at most `RUN_MAX_GROUPS` deliveries), so at most the deliveries in the
//! windows (and its own batch bounds).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::pipeline::{DeliveryRef, PartitionPipeline, Settled};
use super::runner::{Attempt, Cancel, Runner, StoreCall, MAX_BATCH};
use super::{DecodeError, Delivery, DeliveryOutcome, DispatchRecord};
use crate::disposition::Disposition;
use crate::model::StoreError;
use crate::store::MailboxStore;

/// A delivery's key in the runner: answers for a closed (or closed and reopened) source are
/// recognised by `generation` and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<S> {
    pub source: S,
    pub at: DeliveryRef,
    generation: u64,
}

/// One source's window and the front end's own state of it.
pub(crate) struct Window<R, M, X> {
    pub pipeline: PartitionPipeline<R, M>,
    /// What the front end keeps per source (the daemon: pause, blocked users, offsets).
    pub state: X,
    generation: u64,
    cancel: Cancel,
    closing: bool,
    /// Attempts started and not handed back yet.
    calls: usize,
}

impl<R, M, X> Window<R, M, X> {
    /// Store calls started for this source and not answered yet (a hand-over waits for them).
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    /// Closing (see [`Driver::begin_close`]): nothing new starts.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Told apart from an earlier window of the same source.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

/// One finished attempt, as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a, S> {
    pub source: &'a S,
    pub at: DeliveryRef,
    /// 0 for the first attempt.
    pub attempt: u32,
    pub delivery: &'a Delivery,
}

/// What a front end makes of a result the table does not make final.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict<E> {
    /// Try the delivery again after this delay; it stays at its lane's head meanwhile.
    Retry(Duration),
    /// The same, and park its user meanwhile ([`PartitionPipeline::park`]): its other
    /// deliveries are skipped, so the rest of the window flows (a corrupt mailbox holds only
    /// itself). The front end re-reads the source from [`PartitionPipeline::reread_from`] once
    /// the delivery is final.
    Park(Duration),
    /// Take the result as final here (reported, not waited for).
    Final,
    /// Stop the run.
    Stop(E),
}

/// A front end's decisions: everything the drive loop does not decide by itself.
pub(crate) trait Policy<S, X> {
    /// Why a run stops ([`Verdict::Stop`]).
    type Stop;

    /// The store the delivery goes to; `None` is the driver's store. Called once per attempt.
    fn target(&mut self, _delivery: &Delivery) -> Option<Arc<dyn MailboxStore>> {
        None
    }

    /// A result whose [`Disposition`] is `Block`, `Retry` or `AbortRepair`.
    fn not_final(
        &mut self,
        step: Step<'_, S>,
        state: &mut X,
        result: &Result<DeliveryOutcome, StoreError>,
        disposition: Disposition,
    ) -> Verdict<Self::Stop>;

    /// A delivery's final result, just before its lane moves on.
    fn delivery_final(
        &mut self,
        _step: Step<'_, S>,
        _state: &mut X,
        _result: &Result<DeliveryOutcome, StoreError>,
    ) {
    }

    /// A record settled with a refusal (or malformed). `true`: it is done with now (reported);
    /// `false`: the front end sends a dead letter and calls [`Driver::dead_lettered`] once it is
    /// acknowledged.
    fn dead_letter(&mut self, _source: &S, _settled: Settled) -> bool {
        true
    }

    /// Every answer of the runner, also for a closed source: its store calls (each once) and,
    /// when it reached the store for a live source, the attempt's time.
    fn answered(&mut self, _calls: &[StoreCall], _elapsed: Option<Duration>) {}
}

/// The windows of a front end's sources and the store calls in flight for them.
pub(crate) struct Driver<S, R, M, X> {
    store: Arc<dyn MailboxStore>,
    windows: HashMap<S, Window<R, M, X>>,
    runner: Runner<Key<S>>,
    generations: u64,
}

impl<S, R, M, X> Driver<S, R, M, X>
where
    S: Copy + Eq + Hash + Send + Sync + 'static,
{
    pub(crate) fn new(store: Arc<dyn MailboxStore>) -> Self {
        Self {
            store,
            windows: HashMap::new(),
            runner: Runner::default(),
            generations: 0,
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn MailboxStore> {
        &self.store
    }

    /// Opens a window of at most `max_records` records for `source`; `false` (and nothing
    /// changes) when it is open already.
    pub(crate) fn open(&mut self, source: S, max_records: usize, state: X) -> bool {
        if self.windows.contains_key(&source) {
            return false;
        }
        self.generations += 1;
        self.windows.insert(
            source,
            Window {
                pipeline: PartitionPipeline::new(max_records),
                state,
                generation: self.generations,
                cancel: Cancel::default(),
                closing: false,
                calls: 0,
            },
        );
        true
    }

    /// Cancels `source`'s attempts not yet sent and starts nothing new for it; the calls already
    /// sent still come back and complete their records.
    pub(crate) fn begin_close(&mut self, source: &S) {
        if let Some(window) = self.windows.get_mut(source) {
            window.cancel.cancel();
            window.closing = true;
        }
    }

    /// Removes `source`'s window, cancelling what it still has in flight (answers that arrive
    /// later are ignored).
    pub(crate) fn close(&mut self, source: &S) -> Option<Window<R, M, X>> {
        let window = self.windows.remove(source)?;
        window.cancel.cancel();
        Some(window)
    }

    /// A front end's run stopped: starts nothing new for `source` and waits, at most `deadline`,
    /// for the calls already sent, handling their answers, so a delivery the store applied is
    /// final in the window rather than unknown. Stops the calls raise meanwhile are not
    /// returned: the first stop is the one the run reports. False when the deadline passed
    /// first.
    pub(crate) async fn drain_after_stop<P: Policy<S, X>>(
        &mut self,
        source: &S,
        policy: &mut P,
        deadline: Duration,
    ) -> bool {
        self.begin_close(source);
        tokio::time::timeout(deadline, async {
            while self.window(source).is_some_and(|w| w.calls() > 0) {
                let attempt = self.next().await;
                let _ = self.handle(attempt, policy);
            }
        })
        .await
        .is_ok()
    }

    /// Cancels every source's attempts not yet sent (the run ends).
    pub(crate) fn cancel_all(&self) {
        for window in self.windows.values() {
            window.cancel.cancel();
        }
    }

    pub(crate) fn window(&self, source: &S) -> Option<&Window<R, M, X>> {
        self.windows.get(source)
    }

    pub(crate) fn window_mut(&mut self, source: &S) -> Option<&mut Window<R, M, X>> {
        self.windows.get_mut(source)
    }

    pub(crate) fn windows(&self) -> impl Iterator<Item = (&S, &Window<R, M, X>)> {
        self.windows.iter()
    }

    pub(crate) fn windows_mut(&mut self) -> impl Iterator<Item = (&S, &mut Window<R, M, X>)> {
        self.windows.iter_mut()
    }

    pub(crate) fn sources(&self) -> Vec<S> {
        self.windows.keys().copied().collect()
    }

    /// No record in any window.
    pub(crate) fn is_empty(&self) -> bool {
        self.windows.values().all(|w| w.pipeline.is_empty())
    }

    /// Whether a front end that has taken `taken` records from its source in this pass may take
    /// one more without waiting: at most [`MAX_BATCH`] per pass (their deliveries go to the store
    /// together), and only while `source`'s window has room. Ask before taking the record: one
    /// taken and then not admitted would be lost.
    pub(crate) fn room_for_more(&self, source: &S, taken: usize) -> bool {
        taken < MAX_BATCH
            && self
                .windows
                .get(source)
                .is_some_and(|w| !w.closing && !w.pipeline.is_full())
    }

    /// Admits the record at `offset` into `source`'s window and starts its runnable deliveries.
    /// `false` when the source has no open window (closed, closing) or the offset was admitted
    /// before (a redelivery).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit<P: Policy<S, X>>(
        &mut self,
        source: S,
        offset: i64,
        raw: R,
        size: usize,
        meta: M,
        decoded: Result<DispatchRecord, DecodeError>,
        policy: &mut P,
    ) -> bool {
        let Some(window) = self.windows.get_mut(&source).filter(|w| !w.closing) else {
            return false;
        };
        let Some(admission) = window.pipeline.admit(offset, raw, size, meta, decoded) else {
            return false;
        };
        if let Some(settled) = admission.settled {
            self.settle(source, settled, policy);
        }
        self.pump(policy);
        true
    }

    /// The next finished attempt; pending forever while nothing is in flight (so it can sit in a
    /// `select!` next to the source).
    pub(crate) async fn next(&mut self) -> Attempt<Key<S>> {
        self.runner.next().await
    }

    /// Handles `attempt` and every other attempt already finished, in one wake-up.
    pub(crate) fn handle_with_ready<P: Policy<S, X>>(
        &mut self,
        attempt: Attempt<Key<S>>,
        policy: &mut P,
    ) -> Result<(), P::Stop> {
        self.handle(attempt, policy)?;
        self.handle_ready(policy)
    }

    /// Handles every attempt that has already finished, without waiting.
    pub(crate) fn handle_ready<P: Policy<S, X>>(&mut self, policy: &mut P) -> Result<(), P::Stop> {
        while let Some(attempt) = self.runner.try_next() {
            self.handle(attempt, policy)?;
        }
        Ok(())
    }

    /// Handles one finished attempt: see the module's step 2.
    pub(crate) fn handle<P: Policy<S, X>>(
        &mut self,
        attempt: Attempt<Key<S>>,
        policy: &mut P,
    ) -> Result<(), P::Stop> {
        let Attempt {
            key,
            delivery,
            attempt,
            result,
            elapsed,
            calls,
        } = attempt;
        let live = self
            .windows
            .get_mut(&key.source)
            .filter(|w| w.generation == key.generation);
        policy.answered(
            &calls,
            (live.is_some() && result.is_some()).then_some(elapsed),
        );
        let Some(window) = live else {
            return Ok(());
        };
        window.calls = window.calls.saturating_sub(1);
        let Some(result) = result else {
            // Cancelled before it reached the store: the record stays unfinished, uncommitted.
            // Otherwise its run stopped before it: it waits in its lane for the next run.
            if !window.cancel.is_cancelled() {
                window.pipeline.not_reached(key.at);
                self.pump(policy);
            }
            return Ok(());
        };
        let step = Step {
            source: &key.source,
            at: key.at,
            attempt,
            delivery: &delivery,
        };
        let disposition = Disposition::of(&result);
        let mut held = Vec::new();
        if !disposition.is_final() {
            match policy.not_final(step, &mut window.state, &result, disposition) {
                Verdict::Retry(delay) => {
                    self.restart(key, delivery, attempt + 1, delay, policy);
                    return Ok(());
                }
                Verdict::Park(delay) => {
                    for settled in window.pipeline.park(key.at) {
                        self.settle(key.source, settled, policy);
                    }
                    self.restart(key, delivery, attempt + 1, delay, policy);
                    self.pump(policy);
                    return Ok(());
                }
                Verdict::Final if disposition == Disposition::Block => {
                    // A corrupt answer taken as final holds its mailbox for the rest of the
                    // run: its later deliveries are skipped and reported held, never applied
                    // over a mailbox that failed closed (SPEC 7.3; the daemon parks instead).
                    held = window.pipeline.hold(key.at);
                }
                Verdict::Final => {}
                Verdict::Stop(stop) => return Err(stop),
            }
        }
        policy.delivery_final(step, &mut window.state, &result);
        let settled = window.pipeline.complete(key.at, result);
        for settled in held.into_iter().chain(settled) {
            self.settle(key.source, settled, policy);
        }
        self.pump(policy);
        Ok(())
    }

    /// The dead letter of the record at `offset` was acknowledged: it is final.
    pub(crate) fn dead_lettered(&mut self, source: &S, offset: i64) {
        if let Some(window) = self.windows.get_mut(source) {
            window.pipeline.dead_lettered(offset);
        }
    }

    fn settle<P: Policy<S, X>>(&mut self, source: S, settled: Settled, policy: &mut P) {
        if settled.dead_letter.is_none() {
            return;
        }
        let offset = settled.offset;
        if policy.dead_letter(&source, settled) {
            self.dead_lettered(&source, offset);
        }
    }

    /// Forms and starts runs of ready lanes while the runner wants more, taking one run from
    /// each window in turn so no source starves another.
    fn pump<P: Policy<S, X>>(&mut self, policy: &mut P) {
        while self.runner.wants_more() {
            let mut started = false;
            let sources: Vec<S> = self
                .windows
                .iter()
                .filter(|(_, w)| !w.closing && w.pipeline.has_ready())
                .map(|(s, _)| *s)
                .collect();
            for source in sources {
                if !self.runner.wants_more() {
                    return;
                }
                let run = self
                    .windows
                    .get_mut(&source)
                    .and_then(|w| w.pipeline.take_run());
                if let Some(run) = run {
                    self.start_run(source, run, policy);
                    started = true;
                }
            }
            if !started {
                return;
            }
        }
    }

    /// Starts the first attempt of a run of `source`'s window (consecutive deliveries of one
    /// lane, see `pipeline`), as one entry of the next batch.
    fn start_run<P: Policy<S, X>>(&mut self, source: S, run: Vec<DeliveryRef>, policy: &mut P) {
        let Some(window) = self.windows.get_mut(&source).filter(|w| !w.closing) else {
            return;
        };
        let deliveries: Vec<(Key<S>, Arc<Delivery>)> = run
            .into_iter()
            .filter_map(|at| {
                let delivery = window.pipeline.delivery(at)?.clone();
                let key = Key {
                    source,
                    at,
                    generation: window.generation,
                };
                Some((key, delivery))
            })
            .collect();
        Self::send(
            &mut self.runner,
            &self.store,
            window,
            deliveries,
            0,
            Duration::ZERO,
            policy,
        );
    }

    /// Starts another attempt of `delivery` unless its source is closing (or closed, or
    /// reopened since).
    fn restart<P: Policy<S, X>>(
        &mut self,
        key: Key<S>,
        delivery: Arc<Delivery>,
        attempt: u32,
        delay: Duration,
        policy: &mut P,
    ) {
        let Some(window) = self
            .windows
            .get_mut(&key.source)
            .filter(|w| !w.closing && w.generation == key.generation)
        else {
            return;
        };
        Self::send(
            &mut self.runner,
            &self.store,
            window,
            vec![(key, delivery)],
            attempt,
            delay,
            policy,
        );
    }

    /// Hands an attempt of a run of `window`'s deliveries to the runner, against the target of
    /// its first delivery (a policy's target depends on the user alone, and a run is one
    /// user's).
    #[allow(clippy::too_many_arguments)]
    fn send<P: Policy<S, X>>(
        runner: &mut Runner<Key<S>>,
        store: &Arc<dyn MailboxStore>,
        window: &mut Window<R, M, X>,
        run: Vec<(Key<S>, Arc<Delivery>)>,
        attempt: u32,
        delay: Duration,
        policy: &mut P,
    ) {
        let Some((_, first)) = run.first() else {
            return;
        };
        let target = policy.target(first).unwrap_or_else(|| store.clone());
        window.calls += run.len();
        runner.start_run(target, run, attempt, delay, window.cancel.clone());
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sim;
