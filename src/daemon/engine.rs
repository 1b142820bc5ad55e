//! The daemon's loop: records in, store calls and dead letters out, offsets stored.
//!
//! One task owns the drive loop ([`Driver`]: every assigned partition's window and the store
//! calls in flight) and polls, in one `select!`, the shutdown signal, the poll thread's batches,
//! the store calls' answers, the dead letters in flight, the revokes handed over by the
//! rebalance callback and their deadlines, the drain deadline, and a one-second housekeeping
//! tick. What a finished
//! store call means is the drive loop's, with the daemon's [`DaemonPolicy`] (wait for
//! everything); each record that leaves a window final moves the partition's watermark, which
//! is stored for librdkafka to commit. Nothing here waits on the store or the
//! broker: every wait is a future in one of the in-flight sets.
//!
//! Bounds: per partition, `kafka.max_in_flight_records` records in the window and an even share of
//! `kafka.max_in_flight_bytes` (paused when either is reached, resumed when both are half free),
//! each record charged its raw bytes plus its decoded form and store request
//! ([`DispatchRecord::in_flight_bytes`]).
//! Beyond that, a paused partition may still receive what was already in transit from the poll
//! thread (at most 4 batches of 256 KiB, see `intake`). The runner holds at most one run per
//! lane, so at most the deliveries in the windows, in at most its `MAX_BATCHES_IN_FLIGHT`
//! batches (`ingest::runner`).
//!
//! Beside this file: `letters` (dead letters in flight), `housekeeping` (the one-second tick:
//! gauges and stalled partitions) and `handover` (revokes waiting for the calls already sent).

mod handover;
mod housekeeping;
mod letters;
mod reread;
mod went_back;

use letters::LetterDone;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};

use super::dead_letter::{self, Letter, Source};
use super::events::{
    BlockedMailboxes, ConsumerError, Event, ExpiredBucketsPromoted, InFlightBytes,
    PartitionAssigned, PartitionGauges, PartitionReadable, PartitionRevoked,
};
use super::fetch_waker::FetchWaker;
use super::intake::{IntakeEvent, Polled, RawRecord};
use super::kafka::{DaemonContext, GroupEvent, Handover, PartitionOffsets};
use super::telemetry::Telemetry;
use crate::config::Config;
use crate::disposition::Disposition;
use crate::ingest::drive::{Driver, Policy, Step, Verdict};
use crate::ingest::pipeline::Settled;
use crate::ingest::runner::StoreCall;
use crate::ingest::{DeliveryOutcome, DispatchRecord};
use crate::model::{StoreError, UserId};
use crate::retry::Backoff;
use crate::store::MailboxStore;

/// What a record carries through the window besides its raw bytes.
#[derive(Debug, Clone, Copy)]
struct RecordMeta {
    timestamp_ms: Option<i64>,
}

/// What the engine keeps per assigned partition besides its window (the driver's).
struct PartitionState {
    /// Users of this partition failing closed: where and why (`/debug/blocked`).
    blocked: HashMap<UserId, super::http::Blocked>,
    paused: bool,
    /// The last watermark handed to librdkafka's offset store.
    stored: Option<i64>,
    /// The committed offset when the partition was assigned (lag before the first record).
    start: Option<i64>,
    /// When a record of the partition was last admitted (stall detection).
    last_record: Instant,
    stalled: bool,
    /// Dead letters sent and not acknowledged yet (a hand-over waits for them too).
    letters: usize,
    /// The generation of the assignment that opened this window (`DaemonContext::generation`).
    generation: u64,
    /// A healed mailbox's skipped deliveries are to be re-read: the window is closing and is
    /// read again from its watermark once its calls and dead letters are back.
    reread: bool,
    /// Opened by a re-read: the offset the window it replaced had read up to, while the
    /// re-read is behind it.
    reread_until: Option<i64>,
    /// The store went back in time under this window (`went_back.rs`): it closes like a re-read
    /// and the partition is read again from this offset, what the store holds; its watermarks
    /// are neither recorded nor stored meanwhile.
    rewind_to: Option<i64>,
}

impl PartitionState {
    fn new(generation: u64) -> Self {
        Self {
            blocked: HashMap::new(),
            paused: false,
            stored: None,
            start: None,
            last_record: Instant::now(),
            stalled: false,
            letters: 0,
            generation,
            reread: false,
            reread_until: None,
            rewind_to: None,
        }
    }
}

/// A partition between its old window and the one a re-read opens (see [`Engine::reread`]).
struct Rereading {
    token: u64,
    from: i64,
    until: Option<i64>,
    generation: u64,
}

/// Settings the engine takes from the configuration once.
#[derive(Debug, Clone)]
pub(crate) struct EngineSettings {
    pub topic: Arc<str>,
    pub dlq_topic: Arc<str>,
    pub max_records: usize,
    pub max_bytes: usize,
    pub dlq_max_message_bytes: usize,
    pub backoff: Backoff,
    pub commit_offsets: bool,
    pub shutdown_deadline: Duration,
    pub stalled_after: Duration,
    pub max_blocked_mailboxes: usize,
}

impl EngineSettings {
    pub(crate) fn from_config(config: &Config, commit_offsets: bool) -> Self {
        let kafka = &config.kafka;
        Self {
            topic: Arc::from(kafka.topic.as_str()),
            dlq_topic: Arc::from(kafka.dlq_topic.as_str()),
            max_records: kafka.max_in_flight_records,
            max_bytes: kafka.max_in_flight_bytes,
            dlq_max_message_bytes: kafka.dlq_max_message_bytes,
            backoff: config.kafka.backoff(),
            commit_offsets,
            shutdown_deadline: Duration::from_millis(kafka.shutdown_deadline_ms),
            stalled_after: Duration::from_millis(kafka.stalled_after_ms),
            max_blocked_mailboxes: usize::try_from(kafka.max_blocked_mailboxes)
                .unwrap_or(usize::MAX),
        }
    }
}

/// What the daemon committed when it stopped.
#[derive(Debug, Default)]
pub struct RunReport {
    /// Why the run could not go on, when it stopped on its own (not on a signal).
    pub failure: Option<String>,
    /// The last watermark of each partition still assigned at the end.
    pub committed: std::collections::BTreeMap<i32, i64>,
    /// Records still in flight at the deadline (their offsets were not committed).
    pub abandoned_records: usize,
}

pub(crate) struct Engine {
    settings: EngineSettings,
    consumer: Arc<BaseConsumer<DaemonContext>>,
    /// Restarts librdkafka's fetcher after a resume (see `fetch_waker`).
    waker: FetchWaker,
    producer: crate::daemon::DlqProducer,
    telemetry: Telemetry,
    /// Every assigned partition's window (a revoked one is closing while it hands over) and the
    /// store calls in flight for them.
    driver: Driver<i32, RawRecord, RecordMeta, PartitionState>,
    letters: FuturesUnordered<BoxFuture<'static, LetterDone>>,
    /// The last consumer error, for the stall log, and when it happened.
    last_consumer_error: Option<(Instant, String)>,
    /// The poll thread stopped on its own: the run ends in an error.
    intake_lost: bool,
    /// A client the daemon cannot continue without (the dead-letter producer, the consumer) hit
    /// a fatal error: the run drains and ends in this error (SPEC 7.2 "No silent stall").
    fatal: Option<String>,
    /// The store's `promoted_buckets_total()` already added to `promote_expired_buckets_total`.
    promoted_reported: u64,
    /// Revokes waiting for the calls already sent (see `handover`).
    handovers: Vec<handover::Pending>,
    /// Partitions whose window closed for a re-read, until the poll thread says it seeked.
    rereading: HashMap<i32, Rereading>,
    /// The last re-read's token.
    rereads: u64,
    /// More mailboxes fail closed than `kafka.max_blocked_mailboxes` (logged once per crossing).
    over_blocked_limit: bool,
    /// The store, for the record of how far it holds each partition (`keeps_applied`).
    store: Arc<dyn MailboxStore>,
    /// With a store that keeps it: watermarks not yet recorded in the store, so not yet handed
    /// to the consumer's offset store (see [`Engine::record_applied`]). One per partition.
    unstored: std::collections::BTreeMap<i32, i64>,
    /// A record write is in flight (one at a time), and when the last one started.
    applied_in_flight: bool,
    applied_started: Option<Instant>,
    /// The last record write failed (logged once per change).
    applied_failing: bool,
    /// Where a record write's task answers (the receiver is `run`'s).
    applied_done: Option<mpsc::UnboundedSender<AppliedDone>>,
    /// Per partition, the last record this process wrote and the store acknowledged since the
    /// partition was assigned: the floor of its next write (`went_back.rs`).
    recorded: std::collections::BTreeMap<i32, i64>,
}

/// A record write's answer: the watermarks it was to record, and, when it was written, the
/// partitions the store holds below their floor (`went_back.rs`).
type AppliedDone = (
    Vec<(i32, i64)>,
    Option<std::collections::BTreeMap<i32, i64>>,
);

/// How often the record of what the store holds is written at most (SPEC 7.3, a store that
/// went back in time): the commits of a busy partition wait up to this long more.
const APPLIED_EVERY: Duration = Duration::from_millis(200);

/// Where a run is (as mini-redis's `Shutdown`): taking records from the poll thread, or draining
/// what it holds until a deadline. Every way a run ends (a signal, a fatal client error, the poll
/// thread gone) enters the drain through [`Phase::drain`], once.
enum Phase {
    Taking(mpsc::Receiver<IntakeEvent>),
    Draining { until: tokio::time::Instant },
}

impl Phase {
    /// Starts the drain, ending `within` from now; a second call changes nothing. Dropping the
    /// intake releases a poll thread blocked on handing over a batch, and it stops: records not
    /// yet admitted stay uncommitted for the next owner.
    fn drain(&mut self, within: Duration) {
        if let Phase::Taking(_) = self {
            *self = Phase::Draining {
                until: tokio::time::Instant::now() + within,
            };
        }
    }

    fn draining(&self) -> bool {
        matches!(self, Phase::Draining { .. })
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        match self {
            Phase::Taking(_) => None,
            Phase::Draining { until } => Some(*until),
        }
    }

    fn intake(&mut self) -> Option<&mut mpsc::Receiver<IntakeEvent>> {
        match self {
            Phase::Taking(intake) => Some(intake),
            Phase::Draining { .. } => None,
        }
    }
}

impl Engine {
    pub(crate) fn new(
        settings: EngineSettings,
        consumer: Arc<BaseConsumer<DaemonContext>>,
        producer: crate::daemon::DlqProducer,
        store: Arc<dyn MailboxStore>,
        telemetry: Telemetry,
    ) -> Self {
        let waker = FetchWaker::start(consumer.clone(), settings.topic.clone());
        let promoted_reported = store.promoted_buckets_total();
        Self {
            settings,
            consumer,
            waker,
            producer,
            driver: Driver::new(store.clone()),
            telemetry,
            letters: FuturesUnordered::new(),
            last_consumer_error: None,
            intake_lost: false,
            fatal: None,
            promoted_reported,
            handovers: Vec::new(),
            rereading: HashMap::new(),
            rereads: 0,
            over_blocked_limit: false,
            store,
            unstored: std::collections::BTreeMap::new(),
            applied_in_flight: false,
            applied_started: None,
            applied_failing: false,
            applied_done: None,
            recorded: std::collections::BTreeMap::new(),
        }
    }

    /// Runs until `shutdown` flips and the drain ends (or its deadline passes).
    pub(crate) async fn run(
        mut self,
        intake: mpsc::Receiver<IntakeEvent>,
        mut handovers: mpsc::UnboundedReceiver<Handover>,
        mut shutdown: watch::Receiver<bool>,
    ) -> RunReport {
        let (applied_tx, mut applied_rx) = mpsc::unbounded_channel::<AppliedDone>();
        self.applied_done = Some(applied_tx);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let drain_within = self.settings.shutdown_deadline;
        let mut phase = Phase::Taking(intake);
        if *shutdown.borrow() {
            phase.drain(Duration::ZERO);
        }
        loop {
            self.telemetry.health().liveness.engine_beat();
            if self.fatal.is_some() && !phase.draining() {
                tracing::error!(reason = ?self.fatal, "a Kafka client failed fatally; draining and exiting so the process is restarted");
                phase.drain(drain_within);
            }
            if phase.draining() && self.driver.is_empty() {
                break;
            }
            let draining = phase.draining();
            let until = phase.deadline().unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if !draining => {
                    if changed.is_err() || *shutdown.borrow() {
                        let in_flight: usize =
                            self.driver.windows().map(|(_, w)| w.pipeline.in_flight()).sum();
                        tracing::info!(in_flight, "shutdown: fetching stopped, draining");
                        // Records not yet admitted stay uncommitted; the next owner reads them.
                        phase.drain(drain_within);
                    }
                }
                event = async { phase.intake()?.recv().await }, if !draining => {
                    match event {
                        Some(event) => {
                            self.on_intake(event);
                            // Take what else is waiting (one wake-up per burst, not per batch),
                            // settling what finished in between so the windows do not fill
                            // with work that is already done.
                            for _ in 0..8 {
                                self.drain_finished();
                                if self.driver.windows().any(|(_, w)| w.state.paused) {
                                    break;
                                }
                                match phase.intake().map(|rx| rx.try_recv()) {
                                    Some(Ok(event)) => self.on_intake(event),
                                    _ => break,
                                }
                            }
                        }
                        None => {
                            // The poll thread is gone (it panicked or its consumer failed):
                            // nothing more arrives, so drain what is here and stop with an error.
                            tracing::error!("the poll thread stopped; draining and exiting so the process is restarted");
                            self.intake_lost = true;
                            phase.drain(drain_within);
                        }
                    }
                }
                attempt = self.driver.next() => {
                    let mut policy = DaemonPolicy::new(&self.telemetry, self.settings.backoff);
                    let Ok(()) = self.driver.handle_with_ready(attempt, &mut policy);
                    self.send_dead_letters(policy.refused);
                    self.advance();
                }
                Some(handover) = handovers.recv() => self.begin_handover(handover),
                Some((positions, answer)) = applied_rx.recv() => self.applied_recorded(positions, answer),
                _ = tokio::time::sleep_until(self.handovers.iter().map(|h| h.deadline()).min().unwrap_or(until)), if !self.handovers.is_empty() => {}
                Some(done) = self.letters.next(), if !self.letters.is_empty() => self.on_letter(done),
                _ = tick.tick() => self.housekeeping(),
                _ = tokio::time::sleep_until(until), if draining => {
                    tracing::warn!("shutdown deadline reached with records in flight; their offsets stay uncommitted");
                    break;
                }
            }
            self.advance();
            self.finish_handovers();
        }
        self.advance();
        self.record_applied_now().await;
        self.telemetry.health().liveness.engine_stopped();
        let mut report = RunReport::default();
        if self.intake_lost {
            report.failure = Some("the Kafka poll thread stopped".to_owned());
        } else if let Some(reason) = &self.fatal {
            report.failure = Some(reason.clone());
        }
        self.driver.cancel_all();
        for (partition, window) in self.driver.windows() {
            // Counted in the report; the line is the report's.
            PartitionRevoked {
                partition: *partition,
                abandoned: 0,
            }
            .emit();
            report.abandoned_records += window.pipeline.in_flight();
            if let Some(watermark) = window.pipeline.watermark() {
                report.committed.insert(*partition, watermark);
            }
        }
        report
    }

    /// Handles every store call that has already finished, then moves the windows.
    fn drain_finished(&mut self) {
        let mut policy = DaemonPolicy::new(&self.telemetry, self.settings.backoff);
        let Ok(()) = self.driver.handle_ready(&mut policy);
        self.send_dead_letters(policy.refused);
        self.advance();
    }

    fn on_intake(&mut self, event: IntakeEvent) {
        match event {
            IntakeEvent::Group(GroupEvent::Assigned(partitions, generation)) => {
                for partition in partitions {
                    self.assign(partition, generation);
                }
            }
            IntakeEvent::Group(GroupEvent::Lost) => {
                let all = self.driver.sources();
                self.revoke(all);
                // A re-read waiting for its seek belongs to an assignment that is gone too.
                self.rereading.clear();
            }
            IntakeEvent::Group(GroupEvent::Revoked(partitions)) => self.revoke(partitions),
            IntakeEvent::Records(records) => {
                wedge::engine();
                for polled in records {
                    self.admit(polled);
                }
                self.drain_finished();
            }
            IntakeEvent::Positions(positions) => {
                for (partition, position) in positions {
                    if let Some(window) = self
                        .driver
                        .window_mut(&partition)
                        .filter(|w| !w.is_closing())
                    {
                        window.pipeline.skip_to(position);
                    }
                }
                self.advance();
            }
            IntakeEvent::Reread {
                partition,
                offset,
                token,
                ok,
            } => self.reread_started(partition, offset, token, ok),
            IntakeEvent::Error(error) => {
                ConsumerError { error: &error }.emit();
                if let Some((code, reason)) = self.consumer.client().fatal_error() {
                    self.telemetry.health().set_consumer(false);
                    self.fatal = Some(format!("the consumer failed fatally: {code:?}: {reason}"));
                }
                self.last_consumer_error = Some((Instant::now(), error.to_string()));
            }
        }
    }

    /// Drops the state of `partitions`: their pending retries are cancelled and their gauges
    /// removed; nothing of them is committed past their watermark.
    fn revoke(&mut self, partitions: Vec<i32>) {
        for partition in partitions {
            self.rereading.remove(&partition);
            let abandoned = self
                .driver
                .close(&partition)
                .map_or(0, |window| window.pipeline.in_flight());
            PartitionRevoked {
                partition,
                abandoned,
            }
            .emit();
        }
    }

    fn assign(&mut self, partition: i32, generation: u64) {
        // A re-read in progress is superseded: the assignment reads from the committed offset,
        // which is at or before the re-read's start.
        self.rereading.remove(&partition);
        // Another owner may have written the record since (read again from a lower one): this
        // process's floor starts over with its first record of this assignment.
        self.recorded.remove(&partition);
        if let Some(window) = self.driver.window_mut(&partition) {
            // Still open: an earlier assignment's window, closing or not. The new assignment
            // owns it from here, so a late hand-over of the earlier one leaves it alone.
            window.state.generation = window.state.generation.max(generation);
            return;
        }
        // The engine's own pause of an earlier assignment of this partition may have reached
        // librdkafka after the rebalance callback resumed it: resume here, after every pause
        // of the old state, so the new state's "not paused" is true.
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.settings.topic, partition);
        if let Err(e) = self.consumer.resume(&tpl) {
            tracing::warn!(partition, error = %e, "resume of an assigned partition failed");
        }
        self.driver.open(
            partition,
            self.settings.max_records,
            PartitionState::new(generation),
        );
        PartitionAssigned { partition, lag: 0 }.emit();
        // Lag is known as soon as the partition is: ask the broker now, off this task.
        let consumer = self.consumer.clone();
        let topic = self.settings.topic.clone();
        tokio::task::spawn_blocking(move || {
            let timeout = Duration::from_secs(5);
            let Ok((low, high)) = consumer.fetch_watermarks(&topic, partition, timeout) else {
                return;
            };
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            let committed = consumer
                .committed_offsets(tpl, timeout)
                .ok()
                .and_then(|c| c.find_partition(&topic, partition).map(|e| e.offset()))
                .and_then(|o| match o {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(low);
            if consumer
                .context()
                .partition_opened(partition, high, committed)
            {
                PartitionAssigned {
                    partition,
                    lag: high - committed,
                }
                .emit();
            }
        });
    }

    fn admit(&mut self, polled: Polled) {
        let Polled {
            raw: record,
            decoded,
        } = polled;
        let Some(window) = self
            .driver
            .window_mut(&record.partition)
            .filter(|w| !w.is_closing())
        else {
            tracing::debug!(
                partition = record.partition,
                "record of a partition not assigned (or being handed over): dropped"
            );
            return;
        };
        window.state.last_record = Instant::now();
        // What the record holds while in flight: its raw bytes (kept for a dead letter), its
        // decoded form and its store request.
        let size = record.size() + decoded.as_ref().map_or(0, DispatchRecord::in_flight_bytes);
        let (partition, offset) = (record.partition, record.offset);
        let meta = RecordMeta {
            timestamp_ms: record.timestamp_ms,
        };
        let mut policy = DaemonPolicy::new(&self.telemetry, self.settings.backoff);
        self.driver
            .admit(partition, offset, record, size, meta, decoded, &mut policy);
        self.send_dead_letters(policy.refused);
    }

    /// Sends the dead letters of records settled with a refusal.
    fn send_dead_letters(&mut self, refused: Vec<(i32, Settled)>) {
        for (partition, settled) in refused {
            self.send_dead_letter(partition, settled);
        }
    }

    /// The dead letter of one record settled with a refusal, built from its raw record.
    fn send_dead_letter(&mut self, partition: i32, settled: Settled) {
        let Some(dead_letter) = settled.dead_letter else {
            return;
        };
        let Some(window) = self.driver.window(&partition) else {
            return;
        };
        let Some(raw) = window.pipeline.raw(settled.offset) else {
            return;
        };
        let letter = dead_letter::build(
            Source {
                topic: &self.settings.topic,
                partition,
                offset: settled.offset,
                log: raw.log.as_ref(),
                dispatch_id: settled.dispatch_id.as_deref(),
            },
            &dead_letter,
            raw.key.as_deref(),
            &raw.payload,
            self.settings.dlq_max_message_bytes,
            false,
        );
        let generation = window.generation();
        self.send_letter(
            partition,
            generation,
            settled.offset,
            dead_letter.reason(),
            Arc::new(letter),
            0,
            Duration::ZERO,
        );
    }

    /// Moves every partition's final records out of its window in source order, reports them,
    /// stores the new watermarks, and resumes partitions with room again.
    fn advance(&mut self) {
        let mut store = TopicPartitionList::new();
        for (partition, window) in self.driver.windows_mut() {
            let finals = window.pipeline.pop_final();
            self.telemetry
                .records_final(*partition, &finals, |r| r.meta.timestamp_ms);
            if window.state.rewind_to.is_some() {
                // Read again from what the store holds: nothing of this window is recorded or
                // stored (`went_back.rs`).
                continue;
            }
            if let Some(watermark) = window.pipeline.watermark() {
                if window.state.stored != Some(watermark) {
                    window.state.stored = Some(watermark);
                    if self.settings.commit_offsets {
                        let _ = store.add_partition_offset(
                            &self.settings.topic,
                            *partition,
                            Offset::Offset(watermark),
                        );
                    }
                }
            }
        }
        if store.count() > 0 {
            if self.store.keeps_applied() {
                for element in store.elements() {
                    if let Offset::Offset(offset) = element.offset() {
                        self.unstored.insert(element.partition(), offset);
                    }
                }
            } else if let Err(e) = self.consumer.store_offsets(&store) {
                // A partition revoked a moment ago: its new owner re-reads from the last commit.
                tracing::debug!(error = %e, "offset store refused");
            }
        }
        self.record_applied();
        self.rereads_due();
        self.reread_progress();
        self.apply_backpressure();
    }

    /// SPEC 7.3, a store that went back in time: the watermarks of [`Self::unstored`] are
    /// written to the store's record of what it holds (`store::redis::applied`) before they are
    /// handed to the consumer's offset store, so the group never commits past what the store
    /// says it holds. One write in flight at a time, at most every [`APPLIED_EVERY`]; its answer
    /// comes back through [`Self::applied_recorded`].
    fn record_applied(&mut self) {
        if self.applied_in_flight
            || self.unstored.is_empty()
            || self
                .applied_started
                .is_some_and(|at| at.elapsed() < APPLIED_EVERY)
        {
            return;
        }
        let Some(done) = self.applied_done.clone() else {
            return;
        };
        let positions: Vec<(i32, i64)> = std::mem::take(&mut self.unstored).into_iter().collect();
        self.applied_in_flight = true;
        self.applied_started = Some(Instant::now());
        let store = self.store.clone();
        let topic = self.settings.topic.clone();
        let with_floors = self.with_floors(&positions);
        tokio::spawn(async move {
            let answer = match store.record_applied(&topic, &with_floors).await {
                Ok(behind) => Some(behind),
                Err(e) => {
                    tracing::debug!(error = %e, "the store's record of what it holds could not be written: the offsets wait (retried)");
                    None
                }
            };
            let _ = done.send((positions, answer));
        });
    }

    /// A record write answered: its watermarks go to the consumer's offset store (the ones of
    /// partitions still assigned; a later watermark of a partition waits for the next write), or
    /// back to [`Self::unstored`] when it failed.
    fn applied_recorded(
        &mut self,
        mut positions: Vec<(i32, i64)>,
        answer: Option<std::collections::BTreeMap<i32, i64>>,
    ) {
        self.applied_in_flight = false;
        let ok = answer.is_some();
        if ok == self.applied_failing {
            self.applied_failing = !ok;
            if ok {
                tracing::info!("the store's record of what it holds is written again: the offsets are committed");
            } else {
                tracing::warn!("the store's record of what it holds cannot be written (the store is unreachable or lost its data): the offsets wait, retried every 200 ms");
            }
        }
        let Some(behind) = answer else {
            for (partition, offset) in positions {
                self.unstored.entry(partition).or_insert(offset);
            }
            return;
        };
        self.went_back_found(&mut positions, &behind);
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in positions {
            if self.driver.window(&partition).is_some() {
                let _ = tpl.add_partition_offset(
                    &self.settings.topic,
                    partition,
                    Offset::Offset(offset),
                );
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.store_offsets(&tpl) {
                tracing::debug!(error = %e, "offset store refused");
            }
        }
        self.record_applied();
    }

    /// At the end of a run: the last watermarks are recorded and stored before the consumer
    /// closes (and commits them).
    async fn record_applied_now(&mut self) {
        if self.unstored.is_empty() {
            return;
        }
        let positions: Vec<(i32, i64)> = std::mem::take(&mut self.unstored).into_iter().collect();
        let with_floors = self.with_floors(&positions);
        match self
            .store
            .record_applied(&self.settings.topic, &with_floors)
            .await
        {
            Ok(behind) => self.applied_recorded(positions, Some(behind)),
            Err(e) => {
                tracing::warn!(error = %e, "the store's record of what it holds could not be written at shutdown: the last offsets stay uncommitted and are read again")
            }
        }
    }

    /// Pauses partitions whose window is full or whose bytes exceed their share of the budget,
    /// and resumes them once both are half free. The byte budget is shared out evenly among the
    /// assigned partitions, so a mailbox blocked in one partition can fill that partition's share
    /// but never pause the others.
    fn apply_backpressure(&mut self) {
        let share = self.settings.max_bytes / self.driver.windows().count().max(1);
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        let mut total = 0;
        for (partition, window) in self.driver.windows_mut() {
            let bytes = window.pipeline.bytes();
            total += bytes;
            let state = &mut window.state;
            if !state.paused && (window.pipeline.is_full() || bytes >= share) {
                state.paused = true;
                pause.add_partition(&self.settings.topic, *partition);
            } else if state.paused && window.pipeline.drained_to_half() && bytes <= share / 2 {
                state.paused = false;
                resume.add_partition(&self.settings.topic, *partition);
            }
        }
        InFlightBytes(total).emit();
        if pause.count() > 0 {
            if let Err(e) = self.consumer.pause(&pause) {
                tracing::warn!(error = %e, "pause failed");
            }
        }
        if resume.count() > 0 {
            if let Err(e) = self.consumer.resume(&resume) {
                tracing::warn!(error = %e, "resume failed");
            }
            for element in resume.elements() {
                self.waker.wake(element.partition());
            }
        }
    }
}

/// The daemon's answers to results the table does not make final: it waits for all of them. A
/// corrupt mailbox (and a repair's lost fence, which only a repair's own write can meet) blocks
/// its user and is retried with backoff until a repair heals it; an unreachable store and a
/// user under repair are retried with backoff. Nothing stops the run, and a refused record
/// goes to the dead-letter topic.
struct DaemonPolicy<'a> {
    telemetry: &'a Telemetry,
    backoff: Backoff,
    /// Records settled with a refusal, whose dead letters [`Engine::send_dead_letters`] sends.
    refused: Vec<(i32, Settled)>,
}

impl<'a> DaemonPolicy<'a> {
    fn new(telemetry: &'a Telemetry, backoff: Backoff) -> Self {
        Self {
            telemetry,
            backoff,
            refused: Vec::new(),
        }
    }
}

impl Policy<i32, PartitionState> for DaemonPolicy<'_> {
    type Stop = std::convert::Infallible;

    fn not_final(
        &mut self,
        step: Step<'_, i32>,
        state: &mut PartitionState,
        result: &Result<DeliveryOutcome, StoreError>,
        disposition: Disposition,
    ) -> Verdict<Self::Stop> {
        let partition = *step.source;
        let user = &step.delivery.mailbox().user_id;
        if let Err(error) = result {
            self.telemetry.attempt_failed(
                partition,
                step.at.offset,
                user,
                error,
                disposition,
                step.attempt,
            );
            if matches!(disposition, Disposition::Block | Disposition::AbortRepair)
                && !state.blocked.contains_key(user)
            {
                state.blocked.insert(
                    user.clone(),
                    super::http::Blocked {
                        partition,
                        user_id: user.as_str().to_owned(),
                        epoch: step.delivery.mailbox().epoch,
                        offset: step.at.offset,
                        kind: error.kind().to_owned(),
                        detail: error.to_string(),
                        since_ms: super::http::now_ms(),
                    },
                );
                self.telemetry.blocked(
                    partition,
                    step.at.offset,
                    user,
                    step.delivery.mailbox().epoch,
                    error,
                    state.blocked.len(),
                );
            }
        }
        let delay = self.backoff.delay(step.attempt);
        if disposition == Disposition::Block {
            // A corrupt mailbox holds only itself: its other deliveries are skipped and re-read
            // from the log once it heals (`engine/reread.rs`).
            return Verdict::Park(delay);
        }
        Verdict::Retry(delay)
    }

    fn delivery_final(
        &mut self,
        step: Step<'_, i32>,
        state: &mut PartitionState,
        result: &Result<DeliveryOutcome, StoreError>,
    ) {
        let user = &step.delivery.mailbox().user_id;
        if state.blocked.remove(user).is_some() {
            self.telemetry
                .unblocked(*step.source, user, state.blocked.len());
        }
        let (word, error) = match result {
            Ok(outcome) => (outcome.as_str(), None),
            Err(e) => (e.outcome(), Some(e)),
        };
        self.telemetry
            .delivery_final(*step.source, step.at.offset, step.at.index, word, error);
        self.telemetry
            .tap(*step.source, step.at.offset, step.delivery, word, error);
    }

    fn dead_letter(&mut self, source: &i32, settled: Settled) -> bool {
        self.refused.push((*source, settled));
        false
    }

    fn answered(&mut self, calls: &[StoreCall], elapsed: Option<Duration>) {
        self.telemetry.store_calls(calls);
        if let Some(elapsed) = elapsed {
            self.telemetry.store_call(elapsed.as_secs_f64());
        }
    }
}

/// A fault-injection point for the liveness tests: with `MATERIALIZER_WEDGE=engine` (test
/// builds), the engine loop blocks for good on the first records it is handed, as a loop stuck
/// in a call that never returns would.
mod wedge {
    #[cfg(not(feature = "failpoints"))]
    pub(super) fn engine() {}

    #[cfg(feature = "failpoints")]
    pub(super) fn engine() {
        if std::env::var("MATERIALIZER_WEDGE").as_deref() == Ok("engine") {
            eprintln!("the engine loop is wedged");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}
