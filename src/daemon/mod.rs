//! The daemon (SPEC section 7): a consumer group on the dispatch topic, materializing every
//! record into the store in per-mailbox source order, committing only what is final and durable.
//!
//! Shape: one loop owns every partition's state ([`pipeline::PartitionPipeline`]); store
//! operations and dead letters run as tasks that report back over a channel. Nothing is shared
//! and mutated from two places except the committable offsets the rebalance callback needs.
//!
//! - **Order.** A user's deliveries run one at a time in offset order; users run concurrently.
//! - **Offsets.** The committed offset of a partition is its contiguous watermark: every record
//!   below it has every delivery written (or dead-lettered with an acknowledged dead letter).
//! - **Retries.** Transient store errors and repair fences are retried with capped exponential
//!   backoff; a corrupt mailbox is retried the same way until an operator repairs it, and only
//!   that user's lane waits. Neither is ever skipped.
//! - **Bounds.** At most `kafka.max_in_flight_records` records per partition are in the window
//!   (the partition is paused when it is full); each holds its raw bytes (<= `max_record_bytes`)
//!   for a possible dead letter.
//! - **Rebalance.** On revoke the watermark is committed synchronously and the partition's work is
//!   abandoned (tasks aborted); a write already sent may still land, which idempotent replay makes
//!   harmless for the next owner.
//! - **Shutdown.** SIGTERM/SIGINT: stop fetching, drain until the deadline, commit, leave.

pub mod http;
pub mod kafka;
pub mod logging;
pub mod metrics;
pub mod pipeline;
pub mod replay;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

use crate::config::Config;
use crate::ingest::{apply_delivery, decode_record, Delivery, DeliveryOutcome};
use crate::model::error::RetryClass;
use crate::model::{StoreError, UserId};
use crate::store::MailboxStore;

use http::Health;
use kafka::{lock, Committable, DaemonContext, GroupEvent};
use pipeline::{DeadLetter, DeliveryRef, PartitionPipeline, Settled};

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Capped exponential backoff.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl RetryPolicy {
    pub fn from_config(config: &Config) -> Self {
        Self {
            initial: Duration::from_millis(config.kafka.retry_initial_ms),
            max: Duration::from_millis(config.kafka.retry_max_ms),
        }
    }

    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Outcome counts of a run, for the demo's table and for tests of the library.
#[derive(Debug, Default, Clone)]
pub struct ProgressCounts {
    /// Record outcomes (`applied`, `dead_lettered`, `malformed`).
    pub records: BTreeMap<&'static str, u64>,
    /// Delivery outcome words.
    pub groups: BTreeMap<&'static str, u64>,
    /// Records final (applied or dead-lettered), all partitions.
    pub final_records: u64,
}

#[derive(Debug, Default)]
pub struct Progress(Mutex<ProgressCounts>);

impl Progress {
    pub fn snapshot(&self) -> ProgressCounts {
        lock(&self.0).clone()
    }

    fn record(&self, outcome: &'static str) {
        let mut counts = lock(&self.0);
        *counts.records.entry(outcome).or_default() += 1;
        counts.final_records += 1;
    }

    fn group(&self, outcome: &'static str) {
        *lock(&self.0).groups.entry(outcome).or_default() += 1;
    }
}

/// What a caller hands the daemon besides its configuration.
pub struct DaemonOptions {
    /// Flips to true to start the drain (SIGTERM, SIGINT, or the demo when it is done).
    pub shutdown: watch::Receiver<bool>,
    pub progress: Arc<Progress>,
    pub health: Arc<Health>,
    /// Commit offsets to the group. False for a store that does not outlive the process (the
    /// memory store): a restart must re-read the log, since nothing it wrote survived.
    pub commit_offsets: bool,
}

/// What the daemon committed when it stopped.
#[derive(Debug, Default)]
pub struct RunReport {
    pub committed: BTreeMap<i32, i64>,
    /// Records still in flight at the deadline (their offsets were not committed).
    pub abandoned_records: usize,
}

enum TaskEvent {
    Delivered {
        partition: i32,
        generation: u64,
        at: DeliveryRef,
        result: Result<DeliveryOutcome, StoreError>,
    },
    Blocked {
        partition: i32,
        generation: u64,
        user: UserId,
        reason: String,
    },
    Unblocked {
        partition: i32,
        generation: u64,
        user: UserId,
    },
    DeadLettered {
        partition: i32,
        generation: u64,
        offset: i64,
        reason: &'static str,
    },
}

struct RawRecord {
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

struct PartitionState {
    generation: u64,
    pipeline: PartitionPipeline,
    raw: HashMap<i64, RawRecord>,
    tasks: HashMap<DeliveryRef, AbortHandle>,
    dead_letters: HashMap<i64, AbortHandle>,
    blocked: HashMap<UserId, String>,
    paused: bool,
}

impl PartitionState {
    fn abort_all(&mut self) {
        for handle in self.tasks.values().chain(self.dead_letters.values()) {
            handle.abort();
        }
        self.tasks.clear();
        self.dead_letters.clear();
    }
}

/// Shared by every task the loop spawns.
#[derive(Clone)]
struct TaskContext {
    store: Arc<dyn MailboxStore>,
    producer: FutureProducer,
    events: mpsc::UnboundedSender<TaskEvent>,
    retry: RetryPolicy,
    health: Arc<Health>,
    source_topic: Arc<str>,
    dlq_topic: Arc<str>,
}

struct Daemon {
    config: Config,
    consumer: Arc<StreamConsumer<DaemonContext>>,
    committable: Committable,
    high_watermarks: Arc<Mutex<HashMap<i32, i64>>>,
    partitions: HashMap<i32, PartitionState>,
    next_generation: u64,
    tasks: TaskContext,
    progress: Arc<Progress>,
    commit_offsets: bool,
}

/// Runs the daemon until `options.shutdown` flips and the drain ends.
pub async fn run(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    options: DaemonOptions,
) -> Result<RunReport, DaemonError> {
    let (group_tx, mut group_rx) = mpsc::unbounded_channel();
    let (task_tx, mut task_rx) = mpsc::unbounded_channel();
    let committable: Committable = Arc::default();
    let high_watermarks: Arc<Mutex<HashMap<i32, i64>>> = Arc::default();
    let context = DaemonContext {
        topic: config.kafka.topic.clone(),
        events: group_tx,
        committable: committable.clone(),
        high_watermarks: high_watermarks.clone(),
        health: options.health.clone(),
        commit_offsets: options.commit_offsets,
    };
    let consumer: Arc<StreamConsumer<DaemonContext>> =
        Arc::new(kafka::consumer_config(&config.kafka).create_with_context(context)?);
    let producer: FutureProducer = kafka::producer_config(&config.kafka).create()?;
    consumer.subscribe(&[config.kafka.topic.as_str()])?;
    tracing::info!(
        topic = %config.kafka.topic,
        group = %config.kafka.group_id,
        backend = store.backend(),
        "consuming"
    );

    let health_checks = spawn_health_checks(
        store.clone(),
        consumer.clone(),
        config.kafka.topic.clone(),
        options.health.clone(),
    );

    let mut daemon = Daemon {
        config: config.clone(),
        consumer: consumer.clone(),
        committable,
        high_watermarks,
        partitions: HashMap::new(),
        next_generation: 0,
        tasks: TaskContext {
            store,
            producer,
            events: task_tx,
            retry: RetryPolicy::from_config(config),
            health: options.health.clone(),
            source_topic: Arc::from(config.kafka.topic.as_str()),
            dlq_topic: Arc::from(config.kafka.dlq_topic.as_str()),
        },
        progress: options.progress.clone(),
        commit_offsets: options.commit_offsets,
    };

    let mut shutdown = options.shutdown;
    let mut commit_tick =
        tokio::time::interval(Duration::from_millis(config.kafka.commit_interval_ms));
    commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining: Option<tokio::time::Instant> = None;
    if *shutdown.borrow() {
        draining = Some(tokio::time::Instant::now());
    }

    loop {
        if draining.is_some() && daemon.partitions.values().all(|p| p.pipeline.is_empty()) {
            break;
        }
        let deadline = draining.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            biased;
            Some(event) = group_rx.recv() => daemon.on_group_event(event),
            Some(event) = task_rx.recv() => daemon.on_task_event(event),
            _ = commit_tick.tick() => daemon.commit(CommitMode::Async),
            changed = shutdown.changed(), if draining.is_none() => {
                if changed.is_err() || *shutdown.borrow() {
                    let in_flight: usize =
                        daemon.partitions.values().map(|p| p.pipeline.in_flight()).sum();
                    tracing::info!(in_flight, "shutdown: fetching stopped, draining");
                    draining = Some(
                        tokio::time::Instant::now()
                            + Duration::from_millis(config.kafka.shutdown_deadline_ms),
                    );
                }
            }
            _ = tokio::time::sleep_until(deadline), if draining.is_some() => {
                tracing::warn!("shutdown deadline reached with records in flight; their offsets stay uncommitted");
                break;
            }
            message = consumer.recv(), if draining.is_none() => match message {
                Ok(message) => {
                    let partition = message.partition();
                    let offset = message.offset();
                    let raw = RawRecord {
                        key: message.key().map(<[u8]>::to_vec),
                        payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    };
                    drop(message);
                    daemon.on_message(partition, offset, raw);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "consumer error");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }

    // Final commit of what is final, then leave the group.
    daemon.commit(CommitMode::Sync);
    let mut report = RunReport::default();
    for (partition, state) in daemon.partitions.iter_mut() {
        report.abandoned_records += state.pipeline.in_flight();
        state.abort_all();
        if let Some(watermark) = state.pipeline.watermark() {
            report.committed.insert(*partition, watermark);
        }
    }
    health_checks.abort();
    consumer.unsubscribe();
    tracing::info!(committed = ?report.committed, abandoned = report.abandoned_records, "stopped");
    Ok(report)
}

/// Store ping and broker metadata every few seconds: `/readyz` turns false while either fails.
fn spawn_health_checks(
    store: Arc<dyn MailboxStore>,
    consumer: Arc<StreamConsumer<DaemonContext>>,
    topic: String,
    health: Arc<Health>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let store_ok = matches!(
                tokio::time::timeout(Duration::from_secs(2), store.ping()).await,
                Ok(Ok(()))
            );
            if store_ok != health.store_ok() {
                tracing::info!(store_ok, "store readiness changed");
            }
            health.set_store(store_ok);
            let consumer = consumer.clone();
            let topic = topic.clone();
            let broker_ok = tokio::task::spawn_blocking(move || {
                consumer
                    .fetch_metadata(Some(&topic), Duration::from_secs(2))
                    .is_ok()
            })
            .await
            .unwrap_or(false);
            if broker_ok != health.broker_ok() {
                tracing::info!(broker_ok, "broker readiness changed");
            }
            health.set_broker(broker_ok);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

impl Daemon {
    fn new_state(&mut self) -> PartitionState {
        self.next_generation += 1;
        PartitionState {
            generation: self.next_generation,
            pipeline: PartitionPipeline::new(self.config.kafka.max_in_flight_records),
            raw: HashMap::new(),
            tasks: HashMap::new(),
            dead_letters: HashMap::new(),
            blocked: HashMap::new(),
            paused: false,
        }
    }

    fn on_group_event(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Assigned(partitions) => {
                for partition in partitions {
                    if !self.partitions.contains_key(&partition) {
                        let state = self.new_state();
                        self.partitions.insert(partition, state);
                    }
                }
            }
            GroupEvent::Revoked(partitions) => {
                for partition in partitions {
                    if let Some(mut state) = self.partitions.remove(&partition) {
                        let abandoned = state.pipeline.in_flight();
                        if abandoned > 0 {
                            tracing::info!(
                                partition,
                                abandoned,
                                "revoked with records in flight: abandoned, not committed"
                            );
                        }
                        state.abort_all();
                    }
                    metrics::partition_blocked(partition, 0);
                }
            }
        }
    }

    fn on_message(&mut self, partition: i32, offset: i64, raw: RawRecord) {
        if !self.partitions.contains_key(&partition) {
            let state = self.new_state();
            self.partitions.insert(partition, state);
        }
        let max_record_bytes = self.config.kafka.max_record_bytes;
        let decoded = decode_record(&raw.payload, max_record_bytes);
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        let Some((ready, settled)) = state.pipeline.admit(offset, decoded) else {
            tracing::debug!(partition, offset, "redelivered record ignored");
            return;
        };
        state.raw.insert(offset, raw);
        for at in ready {
            spawn_delivery(&self.tasks, partition, state, at);
        }
        if let Some(settled) = settled {
            self.on_settled(partition, settled);
        }
        let tpl = self.tpl(partition);
        if let Some(state) = self.partitions.get_mut(&partition) {
            if state.pipeline.is_full() && !state.paused {
                if let Err(e) = self.consumer.pause(&tpl) {
                    tracing::warn!(partition, error = %e, "pause failed");
                } else {
                    state.paused = true;
                    tracing::debug!(
                        partition,
                        in_flight = state.pipeline.in_flight(),
                        "window full: partition paused"
                    );
                }
            }
        }
    }

    fn tpl(&self, partition: i32) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.config.kafka.topic, partition);
        tpl
    }

    fn on_settled(&mut self, partition: i32, settled: Settled) {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        match settled.dead_letter {
            None => {
                metrics::record(metrics::RECORD_APPLIED);
                self.progress.record(metrics::RECORD_APPLIED);
                self.finish(partition, settled.offset);
            }
            Some(dead_letter) => {
                let Some(raw) = state.raw.get(&settled.offset) else {
                    return;
                };
                let headers = dead_letter_headers(
                    &self.tasks.source_topic,
                    partition,
                    settled.offset,
                    settled.dispatch_id.as_deref(),
                    &dead_letter,
                );
                let reason = match &dead_letter {
                    DeadLetter::Malformed(_) => "malformed",
                    DeadLetter::Failed(failures) => {
                        failures.first().map_or("rejected", |f| f.error.outcome())
                    }
                };
                let handle = tokio::spawn(send_dead_letter(
                    self.tasks.clone(),
                    partition,
                    state.generation,
                    settled.offset,
                    raw.key.clone(),
                    raw.payload.clone(),
                    headers,
                    reason,
                ))
                .abort_handle();
                state.dead_letters.insert(settled.offset, handle);
            }
        }
    }

    fn finish(&mut self, partition: i32, offset: i64) {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        if !state.pipeline.finish(offset) {
            return;
        }
        state.raw.remove(&offset);
        if let Some(watermark) = state.pipeline.watermark() {
            if let Some(entry) = lock(&self.committable).get_mut(&partition) {
                entry.0 = Some(watermark);
            }
        }
        if state.paused && !state.pipeline.is_full() {
            let tpl = self.tpl(partition);
            if let Some(state) = self.partitions.get_mut(&partition) {
                match self.consumer.resume(&tpl) {
                    Ok(()) => state.paused = false,
                    Err(e) => tracing::warn!(partition, error = %e, "resume failed"),
                }
            }
        }
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        match event {
            TaskEvent::Delivered {
                partition,
                generation,
                at,
                result,
            } => {
                let Some(state) = self.partitions.get_mut(&partition) else {
                    return;
                };
                if state.generation != generation {
                    return;
                }
                state.tasks.remove(&at);
                let word = match &result {
                    Ok(outcome) => outcome.as_str(),
                    Err(e) => e.outcome(),
                };
                metrics::group(word);
                self.progress.group(word);
                if let Err(e) = &result {
                    tracing::info!(
                        partition,
                        offset = at.offset,
                        delivery = at.index,
                        outcome = word,
                        kind = e.kind(),
                        detail = %e.detail(),
                        "delivery refused; the record goes to the dead-letter topic"
                    );
                }
                let (next, settled) = state.pipeline.complete(at, &result);
                if let Some(next) = next {
                    spawn_delivery(&self.tasks, partition, state, next);
                }
                if let Some(settled) = settled {
                    self.on_settled(partition, settled);
                }
            }
            TaskEvent::Blocked {
                partition,
                generation,
                user,
                reason,
            } => {
                if let Some(state) = self.partitions.get_mut(&partition) {
                    if state.generation == generation {
                        state.blocked.insert(user, reason);
                        metrics::partition_blocked(partition, state.blocked.len());
                    }
                }
            }
            TaskEvent::Unblocked {
                partition,
                generation,
                user,
            } => {
                if let Some(state) = self.partitions.get_mut(&partition) {
                    if state.generation == generation {
                        state.blocked.remove(&user);
                        metrics::partition_blocked(partition, state.blocked.len());
                        tracing::info!(partition, user = %user.as_str(), "mailbox repaired: flowing again");
                    }
                }
            }
            TaskEvent::DeadLettered {
                partition,
                generation,
                offset,
                reason,
            } => {
                let Some(state) = self.partitions.get_mut(&partition) else {
                    return;
                };
                if state.generation != generation {
                    return;
                }
                state.dead_letters.remove(&offset);
                let outcome = if state.pipeline.was_malformed(offset) {
                    metrics::RECORD_MALFORMED
                } else {
                    metrics::RECORD_DEAD_LETTERED
                };
                metrics::record(outcome);
                metrics::dead_letter(reason);
                self.progress.record(outcome);
                self.finish(partition, offset);
            }
        }
    }

    /// Commits every partition whose watermark moved, and refreshes the lag gauges.
    fn commit(&mut self, mode: CommitMode) {
        let mut tpl = TopicPartitionList::new();
        {
            let mut committable = lock(&self.committable);
            for (partition, (watermark, committed)) in committable.iter_mut() {
                if let Some(watermark) = *watermark {
                    if *committed != Some(watermark) {
                        let _ = tpl.add_partition_offset(
                            &self.config.kafka.topic,
                            *partition,
                            Offset::Offset(watermark),
                        );
                        *committed = Some(watermark);
                        metrics::committed_offset(*partition, watermark);
                    }
                }
            }
        }
        if tpl.count() > 0 && self.commit_offsets {
            if let Err(e) = self.consumer.commit(&tpl, mode) {
                tracing::warn!(error = %e, "offset commit failed; retried at the next interval");
                let mut committable = lock(&self.committable);
                for element in tpl.elements() {
                    if let Some(entry) = committable.get_mut(&element.partition()) {
                        entry.1 = None;
                    }
                }
            }
        }
        let highs = lock(&self.high_watermarks).clone();
        for (partition, state) in &self.partitions {
            if let (Some(high), Some(watermark)) =
                (highs.get(partition), state.pipeline.watermark())
            {
                metrics::consumer_lag(*partition, high - watermark);
            }
        }
    }
}

fn spawn_delivery(
    tasks: &TaskContext,
    partition: i32,
    state: &mut PartitionState,
    at: DeliveryRef,
) {
    let Some(delivery) = state.pipeline.delivery(at).cloned() else {
        return;
    };
    let handle = tokio::spawn(deliver(
        tasks.clone(),
        partition,
        state.generation,
        at,
        delivery,
    ))
    .abort_handle();
    state.tasks.insert(at, handle);
}

/// Runs one delivery to a final outcome: transient errors and repair fences are retried, a
/// corrupt mailbox is retried (failing closed) until it is repaired.
async fn deliver(
    tasks: TaskContext,
    partition: i32,
    generation: u64,
    at: DeliveryRef,
    delivery: Delivery,
) {
    let backend = tasks.store.backend();
    let user = delivery.mailbox().user_id.clone();
    let mut attempt = 0u32;
    let mut blocked = false;
    loop {
        let started = Instant::now();
        let result = apply_delivery(tasks.store.as_ref(), &delivery).await;
        metrics::apply_duration(started.elapsed().as_secs_f64());
        let class = match &result {
            Ok(_) => None,
            Err(e) => {
                metrics::store_error(backend, e.kind());
                Some(e.retry_class())
            }
        };
        match (class, &result) {
            (Some(RetryClass::Transient), Err(e)) => {
                if matches!(e, StoreError::Unavailable { .. }) {
                    tasks.health.set_store(false);
                    tracing::warn!(partition, offset = at.offset, error = %e, attempt, "store unavailable; retrying");
                } else {
                    tracing::info!(partition, offset = at.offset, user = %user.as_str(), error = %e, "mailbox under repair; waiting");
                }
            }
            (Some(RetryClass::Corrupt), Err(e)) => {
                if !blocked {
                    blocked = true;
                    tracing::error!(
                        partition,
                        offset = at.offset,
                        user = %user.as_str(),
                        reason = %e,
                        "corrupt mailbox: failing closed; its later deliveries wait and the committed offset stays before it until it is replayed (materializer replay --reset-mailboxes)"
                    );
                    let _ = tasks.events.send(TaskEvent::Blocked {
                        partition,
                        generation,
                        user: user.clone(),
                        reason: e.to_string(),
                    });
                }
            }
            _ => {
                if result.is_ok() && !tasks.health.store_ok() {
                    tasks.health.set_store(true);
                }
                if blocked {
                    let _ = tasks.events.send(TaskEvent::Unblocked {
                        partition,
                        generation,
                        user,
                    });
                }
                let _ = tasks.events.send(TaskEvent::Delivered {
                    partition,
                    generation,
                    at,
                    result,
                });
                return;
            }
        }
        tokio::time::sleep(tasks.retry.delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

/// The headers of a dead letter: what failed, why, and where the record came from.
pub fn dead_letter_headers(
    source_topic: &str,
    partition: i32,
    offset: i64,
    dispatch_id: Option<&str>,
    dead_letter: &DeadLetter,
) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    match dead_letter {
        DeadLetter::Malformed(error) => {
            headers.push(("error_outcome", "malformed".to_owned()));
            headers.push(("error_kind", error.kind.as_str().to_owned()));
            headers.push(("error_detail", error.to_string()));
        }
        DeadLetter::Failed(failures) => {
            if let Some(first) = failures.first() {
                headers.push(("error_outcome", first.error.outcome().to_owned()));
                headers.push(("error_kind", first.error.kind().to_owned()));
                headers.push(("error_detail", first.error.detail()));
            }
            let list: Vec<serde_json::Value> = failures
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "delivery": f.index,
                        "user_id": f.delivery.mailbox().user_id.as_str(),
                        "epoch": f.delivery.mailbox().epoch,
                        "mailbox_seq": f.delivery.mailbox_seq(),
                        "outcome": f.error.outcome(),
                        "kind": f.error.kind(),
                        "detail": f.error.detail(),
                    })
                })
                .collect();
            headers.push((
                "failed_deliveries",
                serde_json::Value::Array(list).to_string(),
            ));
        }
    }
    headers.push(("source_topic", source_topic.to_owned()));
    headers.push(("source_partition", partition.to_string()));
    headers.push(("source_offset", offset.to_string()));
    if let Some(id) = dispatch_id {
        headers.push(("dispatch_id", id.to_owned()));
    }
    headers
}

/// Produces the original record to the dead-letter topic, retrying until the broker
/// acknowledges it: only then is the source offset final.
#[allow(clippy::too_many_arguments)]
async fn send_dead_letter(
    tasks: TaskContext,
    partition: i32,
    generation: u64,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Vec<(&'static str, String)>,
    reason: &'static str,
) {
    let mut attempt = 0u32;
    loop {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (name, value) in &headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(value.as_str()),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&tasks.dlq_topic)
            .payload(&payload[..])
            .headers(owned);
        if let Some(key) = &key {
            record = record.key(&key[..]);
        }
        match tasks.producer.send(record, Duration::from_secs(30)).await {
            Ok(_) => {
                let _ = tasks.events.send(TaskEvent::DeadLettered {
                    partition,
                    generation,
                    offset,
                    reason,
                });
                return;
            }
            Err((e, _)) => {
                tracing::warn!(partition, offset, error = %e, attempt, "dead letter not acknowledged; retrying");
                tokio::time::sleep(tasks.retry.delay(attempt)).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let retry = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        };
        assert_eq!(retry.delay(0), Duration::from_millis(100));
        assert_eq!(retry.delay(1), Duration::from_millis(200));
        assert_eq!(retry.delay(5), Duration::from_millis(3200));
        assert_eq!(retry.delay(6), Duration::from_secs(5));
        assert_eq!(retry.delay(u32::MAX), Duration::from_secs(5));
    }
}
