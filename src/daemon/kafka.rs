//! librdkafka clients of the daemon: the group consumer with its rebalance, statistics and
//! commit callbacks, the dead-letter producer, and the property validation of `check-config`.
//!
//! **Offsets.** The daemon never commits what librdkafka polled. It *stores* the contiguous
//! watermark of each partition (`enable.auto.offset.store = false`, see `engine`), and librdkafka
//! commits the stored offsets every `commit_interval_ms` (`enable.auto.commit`), on every revoke
//! (librdkafka commits a removed partition's stored offset when it leaves the assignment) and at
//! close. So the committed offset is always a watermark: every record below it is final and
//! durable. With a store that dies with the process (memory) nothing is stored or committed.

use crate::locks::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::events::{CommitFailed, Event, OffsetCommitted};
use super::http::Health;
use crate::config::KafkaConfig;

/// Which client a configuration is for. `[kafka.properties]` holds the settings of every client
/// (TLS, SASL, and the group's own), and each client is handed only those that apply to it, so
/// librdkafka never warns (CONFWARN) about a property its client ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientRole {
    /// The daemon's group member: everything but producer-only properties.
    GroupConsumer,
    /// The dead-letter producer: everything but consumer-only properties.
    Producer,
    /// A consumer that never joins the daemon's group (replay's reader and offset watcher,
    /// check-config's metadata client): no producer-only properties and none of the group
    /// membership ones (a `group.instance.id` of the daemon's pod must never be claimed by a
    /// second client).
    Standalone,
    /// The admin client that reads the topic's configuration (`daemon::topic_policy`): a
    /// producer-type handle that neither fetches nor produces, so it takes neither kind's
    /// properties (an `enable.idempotence` would make it ask for a producer id it never uses).
    Admin,
}

/// librdkafka's consumer-only properties (`C` in its CONFIGURATION.md, librdkafka 2.12) besides
/// the group membership ones ([`GROUP_MEMBERSHIP`]): fetching, offsets, commits.
const CONSUMER_ONLY: &[&str] = &[
    "coordinator.query.interval.ms",
    "enable.auto.commit",
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "fetch.wait.max.ms",
    "fetch.queue.backoff.ms",
    "fetch.message.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.error.backoff.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "auto.offset.reset",
    "consume.callback.max.messages",
];

/// librdkafka's producer-only properties (`P` in its CONFIGURATION.md, librdkafka 2.12).
const PRODUCER_ONLY: &[&str] = &[
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "linger.ms",
    "message.send.max.retries",
    "retries",
    "queue.buffering.backpressure.threshold",
    "compression.codec",
    "compression.type",
    "compression.level",
    "batch.num.messages",
    "batch.size",
    "delivery.report.only.error",
    "sticky.partitioning.linger.ms",
    "request.required.acks",
    "acks",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queuing.strategy",
    "produce.offset.report",
    "partitioner",
];

/// The group membership properties (consumer-only too): a standalone consumer never takes them.
const GROUP_MEMBERSHIP: &[&str] = &[
    "group.id",
    "group.instance.id",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
    "group.protocol",
    "group.remote.assignor",
    "max.poll.interval.ms",
];

/// Whether `key` of `[kafka.properties]` is handed to a client of `role`.
pub(crate) fn applies_to(key: &str, role: ClientRole) -> bool {
    match role {
        ClientRole::GroupConsumer => !PRODUCER_ONLY.contains(&key),
        ClientRole::Producer => !CONSUMER_ONLY.contains(&key) && !GROUP_MEMBERSHIP.contains(&key),
        ClientRole::Standalone => !PRODUCER_ONLY.contains(&key) && !GROUP_MEMBERSHIP.contains(&key),
        ClientRole::Admin => {
            !PRODUCER_ONLY.contains(&key)
                && !CONSUMER_ONLY.contains(&key)
                && !GROUP_MEMBERSHIP.contains(&key)
        }
    }
}

/// The settings a client of `role` starts from: brokers, then the pass-through properties that
/// apply to it (TLS, SASL, the group's settings).
pub(crate) fn base_config(kafka: &KafkaConfig, role: ClientRole) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    for (key, value) in &kafka.properties {
        if applies_to(key, role) {
            config.set(key, value);
        }
    }
    config
}

/// librdkafka's prefetch, derived from the in-flight byte budget unless the operator sets its
/// properties: a quarter of the budget (16 MiB for the default 64 MiB) instead of librdkafka's
/// 64 MiB queue plus 50 MiB fetch. One fetch response (`fetch.max.bytes`, which the queue may
/// overshoot by) gets a thirty-second, the consumer queue (`queued.max.messages.kbytes`) the
/// rest. The fetch is kept small because its bytes are compressed ones and every message it
/// brings costs librdkafka a few hundred bytes besides its payload: an 8 MiB fetch of 100-byte
/// records held over 100 MiB (BENCHMARKS.md "Memory during a catch-up"). The daemon's peak
/// memory is then a fixed overhead plus the budget plus this (docs/operations.md "Memory"). A
/// response of very compressible records still decompresses to more (docs/decisions.md).
pub fn prefetch_sizes(kafka: &KafkaConfig) -> PrefetchSizes {
    let quarter = kafka.max_in_flight_bytes / 4;
    let fetch_part = (kafka.max_in_flight_bytes / 32).max(MIN_PREFETCH_PART_BYTES);
    let queue_kbytes = match kafka.properties.get("queued.max.messages.kbytes") {
        Some(v) => v.parse::<usize>().unwrap_or(0),
        None => {
            quarter
                .saturating_sub(fetch_part)
                .max(MIN_PREFETCH_PART_BYTES)
                / 1024
        }
    };
    let fetch_bytes = match kafka.properties.get("fetch.max.bytes") {
        Some(v) => v.parse::<usize>().unwrap_or(0),
        // librdkafka refuses a fetch size below its `message.max.bytes` (1,000,000).
        None => fetch_part.max(LIBRDKAFKA_MESSAGE_MAX_BYTES),
    };
    PrefetchSizes {
        queue_bytes: queue_kbytes * 1024,
        fetch_bytes,
    }
}

/// librdkafka's prefetch sizes, as [`prefetch_sizes`] sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchSizes {
    /// The consumer queue (`queued.max.messages.kbytes`), in bytes.
    pub queue_bytes: usize,
    /// One fetch response (`fetch.max.bytes`).
    pub fetch_bytes: usize,
}

impl PrefetchSizes {
    /// Everything librdkafka may hold of records not yet polled: the queue plus one response.
    pub fn total(self) -> usize {
        self.queue_bytes + self.fetch_bytes
    }
}

/// The record size below which the prefetch queue is bounded by count (`queued.min.messages`
/// = queue bytes / this) rather than by bytes.
const PREFETCH_MESSAGE_BYTES: usize = 1024;

/// The smallest per-partition fetch the budget gives.
const MIN_PARTITION_FETCH_BYTES: usize = 64 << 10;

/// The smallest part of the prefetch the budget gives (a tiny budget still fetches).
const MIN_PREFETCH_PART_BYTES: usize = 1 << 20;
/// librdkafka's default `message.max.bytes`, the floor of `fetch.max.bytes`.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// librdkafka's fetch postponement when its queue is at the threshold, unless the operator sets
/// it (see `consumer_config`).
const DEFAULT_FETCH_QUEUE_BACKOFF_MS: &str = "20";

/// The group consumer. `commit_offsets` false (the memory store) turns committing off entirely.
pub(crate) fn consumer_config(kafka: &KafkaConfig, commit_offsets: bool) -> ClientConfig {
    let mut config = base_config(kafka, ClientRole::GroupConsumer);
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.offset.store", "false")
        .set(
            "enable.auto.commit",
            if commit_offsets { "true" } else { "false" },
        )
        .set(
            "auto.commit.interval.ms",
            kafka.commit_interval_ms.to_string(),
        )
        .set("enable.partition.eof", "false")
        .set(
            "statistics.interval.ms",
            kafka.statistics_interval_ms.to_string(),
        );
    if !kafka.properties.contains_key("auto.offset.reset") {
        config.set("auto.offset.reset", "earliest");
    }
    let prefetch = prefetch_sizes(kafka);
    if !kafka.properties.contains_key("queued.max.messages.kbytes") {
        config.set(
            "queued.max.messages.kbytes",
            (prefetch.queue_bytes / 1024).to_string(),
        );
    }
    if !kafka.properties.contains_key("fetch.max.bytes") {
        config.set("fetch.max.bytes", prefetch.fetch_bytes.to_string());
    }
    // One partition's part of a fetch, a 256th of the budget (256 KiB by default, librdkafka's
    // is 1 MiB): a fetch of 100-byte records decompresses to tens of thousands of messages, each
    // costing librdkafka a few hundred bytes; 1 MiB per partition held twice the formula's
    // prefetch. A record batch larger than this still comes, one partition per fetch, so
    // records near 1 MB catch up slower (docs/operations.md "Memory").
    if !kafka.properties.contains_key("max.partition.fetch.bytes") {
        config.set(
            "max.partition.fetch.bytes",
            (kafka.max_in_flight_bytes / 256)
                .max(MIN_PARTITION_FETCH_BYTES)
                .to_string(),
        );
    }
    // The queue's byte bound counts payloads only; each queued message also costs librdkafka a
    // few hundred bytes, so small records are bounded by count too (librdkafka's 100,000 of
    // 100-byte records held more than their payloads' worth).
    if !kafka.properties.contains_key("queued.min.messages") {
        config.set(
            "queued.min.messages",
            (prefetch.queue_bytes / PREFETCH_MESSAGE_BYTES)
                .max(1000)
                .to_string(),
        );
    }
    // When the store is the bottleneck the prefetch queue sits at its threshold, and librdkafka
    // then postpones the partition's next fetch by this much (1 s by default). A partition the
    // engine paused and resumed (its queue purged) would wait that long for its next record
    // while the store idles: refetch promptly instead.
    if !kafka.properties.contains_key("fetch.queue.backoff.ms") {
        config.set("fetch.queue.backoff.ms", DEFAULT_FETCH_QUEUE_BACKOFF_MS);
    }
    config
}

/// The dead-letter producer: idempotent, acknowledged by every in-sync replica, so a dead letter
/// is durable before the source offset is committed. Its message limit is explicit, and the dead
/// letters are built to fit it (see `dead_letter`).
pub(crate) fn producer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = base_config(kafka, ClientRole::Producer);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.max.bytes", kafka.dlq_max_message_bytes.to_string());
    if !kafka.properties.contains_key("message.timeout.ms") {
        config.set("message.timeout.ms", "30000");
    }
    config
}

/// Checks that librdkafka knows every property and accepts its value, without connecting. The
/// error never echoes a secret value (librdkafka's message quotes the value it refused).
pub(crate) fn validate_properties(kafka: &KafkaConfig) -> Result<(), String> {
    let redact = |e: KafkaError| crate::config::redact_secrets(&e.to_string(), kafka);
    consumer_config(kafka, true)
        .create_native_config()
        .map_err(|e| format!("kafka.properties: {}", redact(e)))?;
    producer_config(kafka)
        .create_native_config()
        .map_err(|e| format!("kafka.properties (dead-letter producer): {}", redact(e)))?;
    Ok(())
}

/// What the consumer callbacks tell the poll thread, in the order they happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// Partitions assigned, with the assignment's generation (see `DaemonContext::generation`).
    Assigned(Vec<i32>, u64),
    Revoked(Vec<i32>),
    /// A rebalance failed: librdkafka dropped the whole assignment without a revoke.
    Lost,
}

/// A revoke's request to the engine (`engine::handover` answers it): the callback enum sits
/// beside the context that sends it, so the engine depends on this module and not the reverse.
#[derive(Debug)]
pub struct Handover {
    pub partitions: Vec<i32>,
    /// The generation of the latest assignment when the revoke ran: only windows opened by
    /// that assignment or an earlier one are handed over (a newer assignment's are not this
    /// revoke's, however late it arrives).
    pub generation: u64,
    /// The assignment was lost (this replica left the group, e.g. frozen past its session):
    /// the partitions already belong to another replica, so nothing is waited for or committed;
    /// they are only cancelled at once.
    pub lost: bool,
    /// Answered with the final watermark of every revoked partition that has one (the offsets
    /// to commit; empty when this daemon commits nothing). Dropped unanswered when the engine
    /// stops first.
    pub done: std::sync::mpsc::SyncSender<Vec<(i32, i64)>>,
}

/// The consumer's context: rebalance, statistics, commits, errors and logs.
///
/// librdkafka calls these from inside `poll`, on the poll thread (`intake`). Rebalance events are
/// queued here and forwarded by the poll thread *after* the records it polled before them, so
/// the engine sees every partition's records strictly inside its assignment.
/// A copy of [`DaemonContext`]'s offsets by partition, for one round of gauges.
pub(crate) struct PartitionOffsets {
    /// High watermarks (statistics, or the broker's answer at assignment).
    pub highs: HashMap<i32, i64>,
    /// The committed offset when each partition was assigned.
    pub starts: HashMap<i32, i64>,
    /// The offsets the group last committed.
    pub committed: HashMap<i32, i64>,
}

pub struct DaemonContext {
    topic: String,
    group_events: Mutex<Vec<GroupEvent>>,
    /// High watermarks from the statistics, for `consumer_lag`.
    high_watermarks: Arc<Mutex<HashMap<i32, i64>>>,
    /// The committed offset of each partition when it was assigned (lag before any record).
    start_offsets: Arc<Mutex<HashMap<i32, i64>>>,
    /// The offsets the group last committed, from the commit callback.
    committed: Arc<Mutex<HashMap<i32, i64>>>,
    /// The partitions of the topic assigned to this instance now (late callbacks of a revoked
    /// partition must not bring its gauges back).
    assigned: Mutex<std::collections::HashSet<i32>>,
    health: Arc<Health>,
    /// Where a revoke asks the engine to hand its partitions over (SPEC 7.2), and how long it
    /// waits for the answer; `None` until the engine runs.
    handover: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Handover>>>,
    handover_wait: std::time::Duration,
    /// Woken on every assignment: the topic's cleanup policy is read again then
    /// ([`super::topic_policy::watch`]).
    assigned_notify: Arc<tokio::sync::Notify>,
    /// Since when this replica has been waiting for an assignment: set at start and when an
    /// assignment is lost, cleared by any assignment (an empty one too). Readiness
    /// (`health::subscription`) turns false when the wait exceeds `kafka.assignment_timeout_ms`.
    waiting_since: Mutex<Option<std::time::Instant>>,
    /// The generation of the latest assignment: raised by every assignment before its event is
    /// queued. A hand-over names the generation it revokes, so one that reaches the engine late
    /// (a lost assignment's is never waited for) can only close windows opened by that
    /// assignment or an earlier one, never a newer assignment of the same partition.
    generation: std::sync::atomic::AtomicU64,
    /// Partitions the engine wants read again from an offset (a blocked mailbox healed: its
    /// skipped deliveries come from the log), with the request's token; the poll thread seeks
    /// between two polls and answers with `IntakeEvent::Reread`.
    rereads: Mutex<Vec<(i32, i64, u64)>>,
}

impl DaemonContext {
    pub fn new(topic: &str, health: Arc<Health>, handover_wait: std::time::Duration) -> Self {
        Self {
            topic: topic.to_owned(),
            group_events: Mutex::new(Vec::new()),
            high_watermarks: Arc::default(),
            start_offsets: Arc::default(),
            committed: Arc::default(),
            assigned: Mutex::default(),
            health,
            handover: Mutex::default(),
            handover_wait,
            assigned_notify: Arc::default(),
            waiting_since: Mutex::new(Some(std::time::Instant::now())),
            generation: std::sync::atomic::AtomicU64::new(0),
            rereads: Mutex::new(Vec::new()),
        }
    }

    /// The dispatch topic this context follows.
    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// Where the engine takes revokes' hand-over requests (SPEC 7.2): set once, before the
    /// consumer subscribes.
    pub(crate) fn hand_over_to(&self, engine: tokio::sync::mpsc::UnboundedSender<Handover>) {
        *lock(&self.handover) = Some(engine);
    }

    /// Woken on every assignment.
    pub(crate) fn assigned_notify(&self) -> Arc<tokio::sync::Notify> {
        self.assigned_notify.clone()
    }

    /// How many partitions are assigned now, and since when this replica has been waiting for
    /// an assignment (readiness, `health::subscription`).
    pub(crate) fn assignment(&self) -> (usize, Option<std::time::Duration>) {
        let assigned = lock(&self.assigned).len();
        let waiting_for = lock(&self.waiting_since).map(|since| since.elapsed());
        (assigned, waiting_for)
    }

    /// What the broker said of a newly assigned partition: its high watermark (kept unless the
    /// statistics already gave one) and the group's committed offset (its start, for the lag
    /// before any record). False, and nothing kept of the start, when the partition was revoked
    /// meanwhile: a late answer must not bring its gauges back.
    pub(crate) fn partition_opened(&self, partition: i32, high: i64, committed: i64) -> bool {
        lock(&self.high_watermarks).entry(partition).or_insert(high);
        if !self.is_assigned(partition) {
            return false;
        }
        lock(&self.start_offsets).insert(partition, committed);
        true
    }

    /// The partitions' offsets as last known: high watermarks, starts and commits.
    pub(crate) fn offsets(&self) -> PartitionOffsets {
        PartitionOffsets {
            highs: lock(&self.high_watermarks).clone(),
            starts: lock(&self.start_offsets).clone(),
            committed: lock(&self.committed).clone(),
        }
    }

    /// Whether `partition` is assigned to this instance now.
    pub(crate) fn is_assigned(&self, partition: i32) -> bool {
        lock(&self.assigned).contains(&partition)
    }

    /// The group events queued since the last call.
    pub(crate) fn take_group_events(&self) -> Vec<GroupEvent> {
        std::mem::take(&mut *lock(&self.group_events))
    }

    /// Asks the poll thread to read `partition` again from `offset` (see `rereads`).
    pub(crate) fn request_reread(&self, partition: i32, offset: i64, token: u64) {
        lock(&self.rereads).push((partition, offset, token));
    }

    pub(crate) fn take_rereads(&self) -> Vec<(i32, i64, u64)> {
        std::mem::take(&mut *lock(&self.rereads))
    }
}

impl ClientContext for DaemonContext {
    fn stats(&self, statistics: Statistics) {
        let broker_up = statistics
            .brokers
            .values()
            .any(|b| b.nodeid >= 0 && b.state == "UP");
        self.health.set_broker(broker_up);
        if broker_up {
            super::broker_link::working();
        }
        // The group's own word on whether this member holds its (possibly empty) assignment:
        // the rebalance callback is not called for an empty incremental assignment under every
        // protocol, the statistics' join state always says `steady` once the member is settled.
        if let Some(group) = &statistics.cgrp {
            let mut waiting = lock(&self.waiting_since);
            if group.state == "up" && group.join_state == "steady" {
                *waiting = None;
            } else if waiting.is_none() {
                *waiting = Some(std::time::Instant::now());
            }
        }
        if let Some(topic) = statistics.topics.get(&self.topic) {
            let mut highs = lock(&self.high_watermarks);
            for (partition, stats) in &topic.partitions {
                if *partition >= 0 && stats.hi_offset >= 0 {
                    highs.insert(*partition, stats.hi_offset);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown)
        ) {
            self.health.set_broker(false);
        }
        super::kafka_grants::GroupAnswers::error(error.rdkafka_error_code());
        super::broker_link::client_error("consumer", &error, reason);
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        super::broker_link::client_log("consumer", level, fac, message);
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}

impl DaemonContext {
    /// The revoke's side of the hand-over (see `engine::handover`): asks the engine to finish
    /// the revoked partitions' calls already sent, waits (bounded) for their final watermarks,
    /// and commits them before the revoke completes, so the next owner starts right after this
    /// replica's last final record.
    fn hand_over(&self, consumer: &BaseConsumer<Self>, revoked: &[i32]) {
        if revoked.is_empty() {
            return;
        }
        let Some(engine) = lock(&self.handover).clone() else {
            return;
        };
        let lost = consumer.assignment_lost();
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        let request = Handover {
            partitions: revoked.to_vec(),
            generation: self.generation.load(std::sync::atomic::Ordering::SeqCst),
            lost,
            done,
        };
        if lost {
            // Nobody waits for a lost assignment's hand-over: it may reach the engine after a
            // newer assignment of the same partitions (its generation keeps it off them).
            late_handover::send(engine, request);
            tracing::warn!(partitions = ?revoked, "assignment lost (this replica left the group): its partitions are cancelled, nothing is committed");
            return;
        }
        if engine.send(request).is_err() {
            if lost {
                tracing::warn!(partitions = ?revoked, "assignment lost (this replica left the group): its partitions are cancelled, nothing is committed");
            }
            return;
        }
        self.health.liveness.poll_waiting(true);
        let answered = answer.recv_timeout(self.handover_wait);
        self.health.liveness.poll_waiting(false);
        let watermarks = match answered {
            Ok(watermarks) => watermarks,
            Err(e) => {
                tracing::warn!(error = %e, "revoke: no hand-over answer; the next owner starts at the last commit");
                return;
            }
        };
        if watermarks.is_empty() {
            return;
        }
        let mut offsets = TopicPartitionList::new();
        for (partition, offset) in &watermarks {
            let _ = offsets.add_partition_offset(&self.topic, *partition, Offset::Offset(*offset));
        }
        match consumer.commit(&offsets, rdkafka::consumer::CommitMode::Sync) {
            Ok(()) => tracing::info!(offsets = ?watermarks, "revoke: final offsets committed"),
            Err(e) => {
                tracing::warn!(error = %e, "revoke: final commit failed; the next owner starts at the last commit")
            }
        }
    }
}

impl ConsumerContext for DaemonContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let revoked = partitions_of(tpl, &self.topic);
                tracing::info!(partitions = ?revoked, "partitions revoked");
                {
                    let mut assigned = lock(&self.assigned);
                    for partition in &revoked {
                        assigned.remove(partition);
                    }
                }
                {
                    let mut committed = lock(&self.committed);
                    let mut starts = lock(&self.start_offsets);
                    let mut highs = lock(&self.high_watermarks);
                    for partition in &revoked {
                        committed.remove(partition);
                        starts.remove(partition);
                        highs.remove(partition);
                    }
                }
                self.hand_over(consumer, &revoked);
                lock(&self.group_events).push(GroupEvent::Revoked(revoked));
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                // rust-rdkafka unassigns everything after a rebalance error, without a revoke:
                // the engine must drop every partition's state too.
                tracing::error!(error = %e, "rebalance error: the assignment is dropped");
                lock(&self.assigned).clear();
                *lock(&self.waiting_since) = Some(std::time::Instant::now());
                lock(&self.group_events).push(GroupEvent::Lost);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let assigned = partitions_of(tpl, &self.topic);
            // librdkafka keeps a partition's pause flag across assignments: a partition paused
            // by a full window, revoked and assigned again would never fetch. Every partition
            // starts a new assignment resumed, matching the engine's fresh state.
            let mut resume = TopicPartitionList::new();
            for partition in &assigned {
                resume.add_partition(&self.topic, *partition);
            }
            if let Err(e) = consumer.resume(&resume) {
                tracing::warn!(error = %e, "resume of newly assigned partitions failed");
            }
            tracing::info!(partitions = ?assigned, "partitions assigned");
            super::kafka_grants::GroupAnswers::accepted();
            lock(&self.assigned).extend(assigned.iter().copied());
            let generation = self
                .generation
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            lock(&self.group_events).push(GroupEvent::Assigned(assigned, generation));
            *lock(&self.waiting_since) = None;
            self.assigned_notify.notify_one();
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                let assigned = lock(&self.assigned);
                let mut committed = lock(&self.committed);
                for element in offsets.elements() {
                    if element.topic() != self.topic || !assigned.contains(&element.partition()) {
                        continue;
                    }
                    if let Offset::Offset(offset) = element.offset() {
                        committed.insert(element.partition(), offset);
                        OffsetCommitted {
                            partition: element.partition(),
                            offset,
                        }
                        .emit();
                    }
                }
            }
            // "No offset" means nothing new was stored since the last commit: not a failure.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => CommitFailed { error: &e }.emit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC 7.2: consumer-only properties never reach the dead-letter producer (librdkafka
    /// would log a CONFWARN for each at every start), producer-only ones never reach a consumer,
    /// and a standalone consumer never claims the group membership of the daemon's pod.
    #[test]
    fn each_client_gets_only_its_properties() {
        let mut kafka = KafkaConfig::default();
        for (key, value) in [
            ("group.instance.id", "pod-0"),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("session.timeout.ms", "10000"),
            ("linger.ms", "5"),
            ("security.protocol", "ssl"),
        ] {
            kafka.properties.insert(key.to_owned(), value.to_owned());
        }
        let producer = producer_config(&kafka);
        assert_eq!(producer.get("group.instance.id"), None);
        assert_eq!(producer.get("partition.assignment.strategy"), None);
        assert_eq!(producer.get("session.timeout.ms"), None);
        assert_eq!(producer.get("linger.ms"), Some("5"));
        assert_eq!(producer.get("security.protocol"), Some("ssl"));

        let consumer = consumer_config(&kafka, true);
        assert_eq!(consumer.get("group.instance.id"), Some("pod-0"));
        assert_eq!(
            consumer.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(consumer.get("linger.ms"), None);
        assert_eq!(consumer.get("security.protocol"), Some("ssl"));

        let standalone = base_config(&kafka, ClientRole::Standalone);
        assert_eq!(standalone.get("group.instance.id"), None);
        assert_eq!(standalone.get("session.timeout.ms"), None);
        assert_eq!(standalone.get("linger.ms"), None);
        assert_eq!(standalone.get("security.protocol"), Some("ssl"));

        kafka
            .properties
            .insert("fetch.max.bytes".to_owned(), "1048576".to_owned());
        let admin = base_config(&kafka, ClientRole::Admin);
        assert_eq!(admin.get("group.instance.id"), None);
        assert_eq!(admin.get("linger.ms"), None);
        assert_eq!(admin.get("fetch.max.bytes"), None);
        assert_eq!(admin.get("security.protocol"), Some("ssl"));
    }
}

/// How a lost assignment's hand-over reaches the engine: at once, or (test builds with
/// `MATERIALIZER_DELAY_LOST_HANDOVER_MS=<ms>`) that much later from another thread, as a
/// hand-over the engine takes up only after a newer assignment of the same partitions.
mod late_handover {
    use super::Handover;

    type Engine = tokio::sync::mpsc::UnboundedSender<Handover>;

    #[cfg(not(feature = "failpoints"))]
    pub(super) fn send(engine: Engine, request: Handover) {
        let _ = engine.send(request);
    }

    #[cfg(feature = "failpoints")]
    pub(super) fn send(engine: Engine, request: Handover) {
        let delay = std::env::var("MATERIALIZER_DELAY_LOST_HANDOVER_MS")
            .ok()
            .and_then(|ms| ms.parse().ok());
        match delay {
            None => {
                let _ = engine.send(request);
            }
            Some(ms) => {
                eprintln!("delaying the lost assignment's hand-over by {ms} ms");
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                    eprintln!("the lost assignment's hand-over reaches the engine");
                    let _ = engine.send(request);
                });
            }
        }
    }
}

/// Whether the consumer group committed an offset on any partition of `topic` (SPEC 7.3: an
/// empty store under a group that committed was wiped).
pub(crate) fn group_has_committed(
    consumer: &BaseConsumer<DaemonContext>,
    topic: &str,
) -> KafkaResult<bool> {
    let timeout = std::time::Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for partition in t.partitions() {
            tpl.add_partition(topic, partition.id());
        }
    }
    if tpl.count() == 0 {
        return Ok(false);
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    Ok(committed
        .elements()
        .iter()
        .any(|e| matches!(e.offset(), Offset::Offset(o) if o > 0)))
}
