//! The daemon's loop: records in, store calls and dead letters out, offsets stored.
//!
//! One task owns every assigned partition's window ([`PartitionPipeline`]) and polls, in one
//! `select!`, the poll thread's batches, the store calls in flight ([`Runner`]), the dead letters
//! in flight, and a one-second housekeeping tick. Each finished store call is turned into an
//! action by [`Disposition`]; each record that leaves a window final moves the partition's
//! watermark, which is stored for librdkafka to commit. Nothing here waits on the store or the
//! broker: every wait is a future in one of the in-flight sets.
//!
//! Bounds: per partition, `kafka.max_in_flight_records` records in the window and an even share of
//! `kafka.max_in_flight_bytes` (paused when either is reached, resumed when both are half free),
//! each record charged its raw bytes plus its decoded form and store request
//! ([`DispatchRecord::in_flight_bytes`]).
//! Beyond that, a paused partition may still receive what was already in transit from the poll
//! thread (at most 4 batches of 256 KiB, see `intake`). Store calls in flight are at most one per
//! lane, so at most the records in the windows.
//!
//! Beside this file: `letters` (dead letters in flight), `housekeeping` (the one-second tick:
//! gauges and stalled partitions) and `handover` (revokes waiting for the calls already sent).

mod handover;
mod housekeeping;
mod letters;

use letters::LetterDone;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};

use super::dead_letter::{self, Letter, Source};
use super::fetch_waker::FetchWaker;
use super::intake::{IntakeEvent, Polled, RawRecord};
use super::kafka::{lock, DaemonContext, GroupEvent};
use super::metrics;
use super::telemetry::Telemetry;
use crate::config::Config;
use crate::disposition::Disposition;
use crate::ingest::pipeline::{DeliveryRef, PartitionPipeline, Settled};
use crate::ingest::runner::{Attempt, Cancel, Runner};
use crate::ingest::{Delivery, DispatchRecord};
use crate::model::UserId;
use crate::retry::Backoff;
use crate::store::MailboxStore;

pub use handover::Handover;

/// What a record carries through the window besides its raw bytes.
#[derive(Debug, Clone, Copy)]
struct RecordMeta {
    timestamp_ms: Option<i64>,
}

/// A delivery's key in the runner: stale results (a revoked partition) are recognised by
/// `generation`.
#[derive(Debug, Clone, Copy)]
struct Key {
    partition: i32,
    generation: u64,
    at: DeliveryRef,
}

struct PartitionState {
    generation: u64,
    pipeline: PartitionPipeline<RawRecord, RecordMeta>,
    /// Users of this partition failing closed, with the reason.
    blocked: HashMap<UserId, String>,
    paused: bool,
    cancel: Cancel,
    /// The last watermark handed to librdkafka's offset store.
    stored: Option<i64>,
    /// The committed offset when the partition was assigned (lag before the first record).
    start: Option<i64>,
    /// When a record of the partition was last admitted (stall detection).
    last_record: Instant,
    stalled: bool,
    /// Revoked, handing over (see `handover`): nothing new starts, records arriving are dropped.
    revoking: bool,
    /// Store calls started and not handed back yet (a hand-over waits for them).
    store_calls: usize,
    /// Dead letters sent and not acknowledged yet (a hand-over waits for them too).
    letters: usize,
}

/// Settings the engine takes from the configuration once.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub topic: Arc<str>,
    pub dlq_topic: Arc<str>,
    pub max_records: usize,
    pub max_bytes: usize,
    pub dlq_max_message_bytes: usize,
    pub backoff: Backoff,
    pub commit_offsets: bool,
    pub shutdown_deadline: Duration,
    pub stalled_after: Duration,
}

impl EngineSettings {
    pub fn from_config(config: &Config, commit_offsets: bool) -> Self {
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

pub struct Engine {
    settings: EngineSettings,
    consumer: Arc<BaseConsumer<DaemonContext>>,
    /// Restarts librdkafka's fetcher after a resume (see `fetch_waker`).
    waker: FetchWaker,
    producer: FutureProducer,
    store: Arc<dyn MailboxStore>,
    telemetry: Telemetry,
    partitions: HashMap<i32, PartitionState>,
    next_generation: u64,
    runner: Runner<Key>,
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
}

impl Engine {
    pub fn new(
        settings: EngineSettings,
        consumer: Arc<BaseConsumer<DaemonContext>>,
        producer: FutureProducer,
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
            store,
            telemetry,
            partitions: HashMap::new(),
            next_generation: 0,
            runner: Runner::default(),
            letters: FuturesUnordered::new(),
            last_consumer_error: None,
            intake_lost: false,
            fatal: None,
            promoted_reported,
            handovers: Vec::new(),
        }
    }

    /// Runs until `shutdown` flips and the drain ends (or its deadline passes).
    pub async fn run(
        mut self,
        intake: mpsc::Receiver<IntakeEvent>,
        mut handovers: mpsc::UnboundedReceiver<Handover>,
        mut shutdown: watch::Receiver<bool>,
    ) -> RunReport {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Dropped (set to `None`) when the drain starts: a poll thread blocked on handing over a
        // batch is released and stops.
        let mut intake = Some(intake);
        let mut deadline: Option<tokio::time::Instant> = None;
        if *shutdown.borrow() {
            deadline = Some(tokio::time::Instant::now());
            intake = None;
        }
        loop {
            if self.fatal.is_some() && deadline.is_none() {
                tracing::error!(reason = ?self.fatal, "a Kafka client failed fatally; draining and exiting so the process is restarted");
                intake = None;
                deadline = Some(tokio::time::Instant::now() + self.settings.shutdown_deadline);
            }
            if deadline.is_some() && self.partitions.values().all(|p| p.pipeline.is_empty()) {
                break;
            }
            let until = deadline.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if deadline.is_none() => {
                    if changed.is_err() || *shutdown.borrow() {
                        let in_flight: usize =
                            self.partitions.values().map(|p| p.pipeline.in_flight()).sum();
                        tracing::info!(in_flight, "shutdown: fetching stopped, draining");
                        deadline = Some(tokio::time::Instant::now() + self.settings.shutdown_deadline);
                        // Records not yet admitted stay uncommitted; the next owner reads them.
                        intake = None;
                    }
                }
                event = async { intake.as_mut()?.recv().await }, if intake.is_some() => {
                    match event {
                        Some(event) => {
                            self.on_intake(event);
                            // Take what else is waiting (one wake-up per burst, not per batch),
                            // settling what finished in between so the windows do not fill
                            // with work that is already done.
                            for _ in 0..8 {
                                self.drain_finished();
                                if self.partitions.values().any(|p| p.paused) {
                                    break;
                                }
                                match intake.as_mut().map(|rx| rx.try_recv()) {
                                    Some(Ok(event)) => self.on_intake(event),
                                    _ => break,
                                }
                            }
                        }
                        None => {
                            // The poll thread is gone (it panicked or its consumer failed):
                            // nothing more arrives, so drain what is here and stop with an error.
                            tracing::error!("the poll thread stopped; draining and exiting so the process is restarted");
                            intake = None;
                            self.intake_lost = true;
                            deadline = Some(tokio::time::Instant::now() + self.settings.shutdown_deadline);
                        }
                    }
                }
                attempt = self.runner.next() => {
                    self.on_attempt(attempt);
                    self.drain_finished();
                }
                Some(handover) = handovers.recv() => self.begin_handover(handover),
                _ = tokio::time::sleep_until(self.handovers.iter().map(|h| h.deadline()).min().unwrap_or(until)), if !self.handovers.is_empty() => {}
                Some(done) = self.letters.next(), if !self.letters.is_empty() => self.on_letter(done),
                _ = tick.tick() => self.housekeeping(),
                _ = tokio::time::sleep_until(until), if deadline.is_some() => {
                    tracing::warn!("shutdown deadline reached with records in flight; their offsets stay uncommitted");
                    break;
                }
            }
            self.advance();
            self.finish_handovers();
        }
        self.advance();
        let mut report = RunReport::default();
        if self.intake_lost {
            report.failure = Some("the Kafka poll thread stopped".to_owned());
        } else if let Some(reason) = &self.fatal {
            report.failure = Some(reason.clone());
        }
        for (partition, state) in &self.partitions {
            metrics::partition_revoked(*partition);
            report.abandoned_records += state.pipeline.in_flight();
            state.cancel.cancel();
            if let Some(watermark) = state.pipeline.watermark() {
                report.committed.insert(*partition, watermark);
            }
        }
        report
    }

    /// Handles every store call that has already finished, then moves the windows.
    fn drain_finished(&mut self) {
        while let Some(attempt) = self.runner.try_next() {
            self.on_attempt(attempt);
        }
        self.advance();
    }

    fn on_intake(&mut self, event: IntakeEvent) {
        match event {
            IntakeEvent::Group(GroupEvent::Assigned(partitions)) => {
                for partition in partitions {
                    self.assign(partition);
                }
            }
            IntakeEvent::Group(GroupEvent::Lost) => {
                let all: Vec<i32> = self.partitions.keys().copied().collect();
                self.revoke(all);
            }
            IntakeEvent::Group(GroupEvent::Revoked(partitions)) => self.revoke(partitions),
            IntakeEvent::Records(records) => {
                for polled in records {
                    self.admit(polled);
                }
                self.drain_finished();
            }
            IntakeEvent::Error(error) => {
                let code = error
                    .rdkafka_error_code()
                    .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"));
                metrics::consumer_error(&code);
                tracing::warn!(error = %error, "consumer error");
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
            metrics::partition_revoked(partition);
            if let Some(state) = self.partitions.remove(&partition) {
                state.cancel.cancel();
                let abandoned = state.pipeline.in_flight();
                if abandoned > 0 {
                    tracing::info!(
                        partition,
                        abandoned,
                        "revoked with records in flight: abandoned, not committed"
                    );
                }
            }
        }
    }

    fn assign(&mut self, partition: i32) {
        if self.partitions.contains_key(&partition) {
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
        self.next_generation += 1;
        self.partitions.insert(
            partition,
            PartitionState {
                generation: self.next_generation,
                pipeline: PartitionPipeline::new(self.settings.max_records),
                blocked: HashMap::new(),
                paused: false,
                cancel: Cancel::default(),
                stored: None,
                start: None,
                last_record: Instant::now(),
                stalled: false,
                revoking: false,
                store_calls: 0,
                letters: 0,
            },
        );
        metrics::partition_assigned(partition, 0);
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
            lock(&consumer.context().high_watermarks)
                .entry(partition)
                .or_insert(high);
            if consumer.context().is_assigned(partition) {
                lock(&consumer.context().start_offsets).insert(partition, committed);
                metrics::partition_assigned(partition, high - committed);
            }
        });
    }

    fn admit(&mut self, polled: Polled) {
        let Polled {
            raw: record,
            decoded,
        } = polled;
        let Some(state) = self
            .partitions
            .get_mut(&record.partition)
            .filter(|s| !s.revoking)
        else {
            tracing::debug!(
                partition = record.partition,
                "record of a partition not assigned (or being handed over): dropped"
            );
            return;
        };
        state.last_record = Instant::now();
        // What the record holds while in flight: its raw bytes (kept for a dead letter), its
        // decoded form and its store request.
        let size = record.size() + decoded.as_ref().map_or(0, DispatchRecord::in_flight_bytes);
        let (partition, offset) = (record.partition, record.offset);
        let meta = RecordMeta {
            timestamp_ms: record.timestamp_ms,
        };
        let decoded = decoded.map(|d| d.at_position(partition, offset));
        let Some(admission) = state.pipeline.admit(offset, record, size, meta, decoded) else {
            return;
        };
        let generation = state.generation;
        for at in admission.ready {
            self.start(partition, generation, at, 0, Duration::ZERO);
        }
        if let Some(settled) = admission.settled {
            self.on_settled(partition, settled);
        }
    }

    fn start(
        &mut self,
        partition: i32,
        generation: u64,
        at: DeliveryRef,
        attempt: u32,
        delay: Duration,
    ) {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        if state.revoking {
            return;
        }
        let Some(delivery) = state.pipeline.delivery(at).cloned() else {
            return;
        };
        state.store_calls += 1;
        self.runner.start(
            Key {
                partition,
                generation,
                at,
            },
            self.store.clone(),
            delivery,
            attempt,
            delay,
            state.cancel.clone(),
        );
    }

    fn on_attempt(&mut self, attempt: Attempt<Key>) {
        let Attempt {
            key,
            delivery,
            attempt,
            result,
            elapsed,
            calls,
        } = attempt;
        self.telemetry.store_calls(&calls);
        let Some(state) = self
            .partitions
            .get_mut(&key.partition)
            .filter(|s| s.generation == key.generation)
        else {
            return;
        };
        state.store_calls = state.store_calls.saturating_sub(1);
        let Some(result) = result else { return };
        self.telemetry.store_call(elapsed.as_secs_f64());
        let user = &delivery.mailbox().user_id;
        let disposition = Disposition::of(&result);
        if disposition.is_final() {
            if state.blocked.remove(user).is_some() {
                self.telemetry
                    .unblocked(key.partition, user, state.blocked.len());
            }
            let (word, error) = match &result {
                Ok(outcome) => (outcome.as_str(), None),
                Err(e) => (e.outcome(), Some(e)),
            };
            self.telemetry
                .delivery_final(key.partition, key.at.offset, key.at.index, word, error);
            let (next, settled) = state.pipeline.complete(key.at, result);
            if let Some(next) = next {
                self.start(key.partition, key.generation, next, 0, Duration::ZERO);
            }
            if let Some(settled) = settled {
                self.on_settled(key.partition, settled);
            }
            return;
        }
        let Err(error) = &result else { return };
        self.telemetry.attempt_failed(
            key.partition,
            key.at.offset,
            user,
            error,
            disposition,
            attempt,
        );
        if matches!(disposition, Disposition::Block | Disposition::AbortRepair)
            && !state.blocked.contains_key(user)
        {
            state.blocked.insert(user.clone(), error.to_string());
            self.telemetry.blocked(
                key.partition,
                key.at.offset,
                user,
                error,
                state.blocked.len(),
            );
        }
        let delay = self.settings.backoff.delay(attempt);
        retry(self, key, delivery, attempt + 1, delay);
    }

    fn on_settled(&mut self, partition: i32, settled: Settled) {
        let Some(dead_letter) = settled.dead_letter else {
            return;
        };
        let Some(state) = self.partitions.get(&partition) else {
            return;
        };
        let Some(raw) = state.pipeline.raw(settled.offset) else {
            return;
        };
        let letter = dead_letter::build(
            Source {
                topic: &self.settings.topic,
                partition,
                offset: settled.offset,
                dispatch_id: settled.dispatch_id.as_deref(),
            },
            &dead_letter,
            raw.key.as_deref(),
            &raw.payload,
            self.settings.dlq_max_message_bytes,
            false,
        );
        let generation = state.generation;
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
        for (partition, state) in self.partitions.iter_mut() {
            let finals = state.pipeline.pop_final();
            self.telemetry
                .records_final(*partition, &finals, |r| r.meta.timestamp_ms);
            if let Some(watermark) = state.pipeline.watermark() {
                if state.stored != Some(watermark) {
                    state.stored = Some(watermark);
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
            if let Err(e) = self.consumer.store_offsets(&store) {
                // A partition revoked a moment ago: its new owner re-reads from the last commit.
                tracing::debug!(error = %e, "offset store refused");
            }
        }
        self.apply_backpressure();
    }

    /// Pauses partitions whose window is full or whose bytes exceed their share of the budget,
    /// and resumes them once both are half free. The byte budget is shared out evenly among the
    /// assigned partitions, so a mailbox blocked in one partition can fill that partition's share
    /// but never pause the others.
    fn apply_backpressure(&mut self) {
        let share = self.settings.max_bytes / self.partitions.len().max(1);
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        let mut total = 0;
        for (partition, state) in self.partitions.iter_mut() {
            let bytes = state.pipeline.bytes();
            total += bytes;
            if !state.paused && (state.pipeline.is_full() || bytes >= share) {
                state.paused = true;
                pause.add_partition(&self.settings.topic, *partition);
            } else if state.paused && state.pipeline.has_room() && bytes <= share / 2 {
                state.paused = false;
                resume.add_partition(&self.settings.topic, *partition);
            }
        }
        metrics::in_flight_bytes(total);
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

/// Starts the next attempt of a delivery that is not final.
fn retry(engine: &mut Engine, key: Key, delivery: Arc<Delivery>, attempt: u32, delay: Duration) {
    let Some(state) = engine
        .partitions
        .get_mut(&key.partition)
        .filter(|s| !s.revoking)
    else {
        return;
    };
    state.store_calls += 1;
    engine.runner.start(
        key,
        engine.store.clone(),
        delivery,
        attempt,
        delay,
        state.cancel.clone(),
    );
}
