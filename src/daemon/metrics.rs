//! The Prometheus metrics of SPEC section 9, in one place: names, labels, help texts, and when
//! each one is set.
//!
//! Labels are bounded: outcome and error words, partitions, the backend name, and at most
//! [`MAX_UNKNOWN_FIELD_LABELS`] field paths. No user id or mailbox ever becomes a label (a label
//! per user would be unbounded cardinality).
//!
//! Two kinds of storage:
//! - Process-wide counters, the histogram and the process gauges live in the `metrics` crate's
//!   Prometheus recorder. Every counter whose label set is known at start is registered at 0 by
//!   [`install`] (and [`backend`] for the store's error kinds), so `rate()` and alerts see a
//!   series from the first scrape instead of "no data" until the first event.
//! - Per-partition gauges (`consumer_lag`, `partition_blocked`, `committed_offset`,
//!   `last_record_timestamp_seconds`, `partition_unreadable`) live in a small table of their own
//!   ([`PARTITIONS`]), rendered after the recorder's output. The `metrics` facade cannot remove a
//!   series, and a partition revoked in a rebalance must disappear from this instance (its new
//!   owner exports it), or `sum()` over instances double-counts a frozen lag.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const RECORDS_TOTAL: &str = "materializer_records_total";
pub const GROUPS_TOTAL: &str = "materializer_groups_total";
pub const DLQ_TOTAL: &str = "materializer_dlq_total";
pub const PARTITION_BLOCKED: &str = "materializer_partition_blocked";
pub const PARTITION_BLOCKED_SKIPPED: &str = "materializer_partition_blocked_skipped";
pub const PARTITION_REREAD_BEHIND: &str = "materializer_partition_reread_behind";
pub const REREADS_TOTAL: &str = "materializer_rereads_total";
pub const BLOCKED_MAILBOXES: &str = "materializer_blocked_mailboxes";
pub const BLOCKED_MAILBOXES_LIMIT: &str = "materializer_blocked_mailboxes_limit";
pub const CONSUMER_LAG: &str = "materializer_consumer_lag";
pub(crate) const APPLY_DURATION: &str = "materializer_apply_duration_seconds";
pub(crate) const STORE_CALL_DURATION: &str = "materializer_store_call_duration_seconds";
pub const STORE_ERRORS_TOTAL: &str = "materializer_store_errors_total";
pub const PROMOTE_EXPIRED_BUCKETS_TOTAL: &str = "materializer_promote_expired_buckets_total";
pub const REPLAY_RECORDS_TOTAL: &str = "materializer_replay_records_total";
pub const COMMITTED_OFFSET: &str = "materializer_committed_offset";
pub const READY: &str = "materializer_ready";
pub const BUILD_INFO: &str = "materializer_build_info";
pub const LAST_RECORD_TIMESTAMP: &str = "materializer_last_record_timestamp_seconds";
pub const UNKNOWN_FIELDS_TOTAL: &str = "materializer_unknown_fields_total";
pub(crate) const PARTITION_UNREADABLE: &str = "materializer_partition_unreadable";
pub(crate) const CONSUMER_ERRORS_TOTAL: &str = "materializer_consumer_errors_total";
pub(crate) const IN_FLIGHT_BYTES: &str = "materializer_in_flight_bytes";
pub(crate) const IN_FLIGHT_BUDGET_BYTES: &str = "materializer_in_flight_budget_bytes";
pub(crate) const MEMORY_LIMIT_BYTES: &str = "materializer_memory_limit_bytes";
pub const TOPIC_COMPACTED: &str = "materializer_topic_compacted";
pub const STORE_EVICTING: &str = "materializer_store_evicting";
pub const STORE_FULL: &str = "materializer_store_full";
pub const STORE_LOST: &str = "materializer_store_lost";
pub const STORE_WENT_BACK_TOTAL: &str = "materializer_store_went_back_total";
pub const STORE_OPEN_SLOTS: &str = "materializer_store_open_slots";
pub const STORE_REDIRECTS_TOTAL: &str = "materializer_store_redirects_total";
pub const ASSIGNED_PARTITIONS: &str = "materializer_assigned_partitions";
pub const TOPIC_PARTITIONS: &str = "materializer_topic_partitions";
pub const SUBSCRIPTION_AVAILABLE: &str = "materializer_subscription_available";
pub const RECORDS_LOST_TOTAL: &str = "materializer_records_lost_total";
pub const PARTITION_HELD_LOST: &str = "materializer_partition_held_records_lost";
pub const PARTITION_GROWTH_WAITING: &str = "materializer_partition_growth_waiting";

/// Record outcomes (`records_total{outcome}`): every delivery final and written or a no-op
/// (`applied`), some delivery rejected or conflicting so the record went to the dead-letter topic
/// (`dead_lettered`), or not decodable (`malformed`, also dead-lettered).
pub(crate) const RECORD_APPLIED: &str = "applied";
pub(crate) const RECORD_DEAD_LETTERED: &str = "dead_lettered";
pub(crate) const RECORD_MALFORMED: &str = "malformed";

/// `records_total{outcome}`, exported at 0 from the start.
pub(crate) const RECORD_OUTCOMES: &[&str] =
    &[RECORD_APPLIED, RECORD_DEAD_LETTERED, RECORD_MALFORMED];

/// `groups_total{outcome}`: the delivery outcome words of SPEC 8.1 (a record-level `malformed`
/// has no delivery), exported at 0 from the start.
pub(crate) const GROUP_OUTCOMES: &[&str] = &[
    "inserted",
    "unchanged",
    "replaced",
    "superseded",
    "expired_merged",
    "trimmed",
    "stale_epoch",
    "truncated",
    "rejected",
    "conflict",
    "corrupt",
];

/// `dlq_total{reason}`: why a record went to the dead-letter topic.
pub(crate) const DLQ_REASONS: &[&str] = &["malformed", "rejected", "conflict"];

/// `store_errors_total{backend,kind}`: every `StoreError::kind()` word.
pub(crate) const STORE_ERROR_KINDS: &[&str] = &[
    "duplicate_ordinal",
    "cross_bucket_group",
    "future_created_at",
    "span_exceeded",
    "invalid_field",
    "cross_day",
    "unsupported_format",
    "index_lost",
    "meta_lost",
    "identity_missing",
    "bad_proof",
    "epoch_mismatch",
    "cursor_expired",
    "unavailable",
    "under_repair",
    "store_refused",
    "fence_lost",
    "unsupported",
];

/// `replay_records_total{outcome}`: what `replay` did with each record it read.
pub(crate) const REPLAY_OUTCOMES: &[&str] = &[
    "applied",
    "dead_lettered",
    "malformed",
    "corrupt",
    "skipped",
    "planned",
];

/// Most distinct `unknown_fields_total{field}` labels; further field paths count as
/// [`OTHER_FIELD`]. An upstream producer controls field names, so they must not grow the series
/// count without bound.
pub(crate) const MAX_UNKNOWN_FIELD_LABELS: usize = 64;
/// Longest field path kept as a label, in bytes; a longer one counts as [`OTHER_FIELD`].
pub(crate) const MAX_UNKNOWN_FIELD_BYTES: usize = 128;
/// The label of every unknown field beyond the bound (or with characters outside
/// `[A-Za-z0-9_.:@$[]-]`).
pub(crate) const OTHER_FIELD: &str = "other";

/// The version label of `build_info`.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The revision label of `build_info`: the source revision the binary was built from (`build.rs`).
pub(crate) const REVISION: &str = env!("MATERIALIZER_REVISION");

static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();

/// The scrape: the recorder's metrics followed by the per-partition gauges.
#[derive(Clone)]
pub struct MetricsHandle {
    prometheus: PrometheusHandle,
    /// The standard `process_*` metrics (resident memory, CPU, open fds), read at each scrape.
    process: Arc<metrics_process::Collector>,
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

impl MetricsHandle {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.process.collect();
        let mut text = self.prometheus.render();
        process_cpu::refine(&mut text);
        render_partitions(&mut text);
        text
    }
}

/// Installs the process-wide recorder once, describes every metric and exports every counter
/// whose label set is known at start at 0; later calls return the same handle.
///
/// Call [`backend`] next (it adds `build_info` and the store's error counters): the daemon, the
/// demo and `replay` do it where they read the configuration.
pub fn install() -> Result<MetricsHandle, String> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    // From 100 µs (a memory call) to 5 s (a batch waiting for a slow cluster).
    const LATENCY_BUCKETS: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0,
    ];
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(APPLY_DURATION.to_owned()), LATENCY_BUCKETS)
        .map_err(|e| e.to_string())?
        .set_buckets_for_metric(
            Matcher::Full(STORE_CALL_DURATION.to_owned()),
            LATENCY_BUCKETS,
        )
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    zero_counters();
    let process = Arc::new(metrics_process::Collector::default());
    process.describe();
    let handle = MetricsHandle {
        prometheus,
        process,
    };
    let _ = HANDLE.set(handle.clone());
    Ok(handle)
}

fn describe() {
    describe_counter!(
        RECORDS_TOTAL,
        "Dispatch records whose every delivery is final, by outcome (applied, dead_lettered, malformed)"
    );
    describe_counter!(
        GROUPS_TOTAL,
        "Deliveries (event groups and truncates) with a final outcome, by outcome word"
    );
    describe_counter!(
        DLQ_TOTAL,
        "Records written to the dead-letter topic, by reason (malformed, rejected, conflict)"
    );
    describe_histogram!(
        STORE_CALL_DURATION,
        metrics::Unit::Seconds,
        "Duration of one call to the store, by backend and operation (append: one batch of appends)"
    );
    describe_histogram!(
        APPLY_DURATION,
        metrics::Unit::Seconds,
        "Duration of one store operation of a delivery, retries counted separately"
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        "Store operations that failed, by backend and error kind"
    );
    describe_counter!(
        PROMOTE_EXPIRED_BUCKETS_TOTAL,
        "Expired day buckets compacted into gap boundaries (the promote inside appends and truncates)"
    );
    describe_counter!(
        REPLAY_RECORDS_TOTAL,
        "Records read by replay, by outcome (applied, dead_lettered, malformed, corrupt, skipped, planned)"
    );
    describe_gauge!(
        READY,
        "1 when /readyz answers 200 (store and broker reachable, store writes and dead letters succeeding, every partition readable, the topic subscribed, no Redis evicting or slot left open, blocked mailboxes within their limit), 0 otherwise"
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the labels name the running version and the configured store backend"
    );
    describe_counter!(
        UNKNOWN_FIELDS_TOTAL,
        "Records carrying a field the decoder does not know and ignored, by field path without indices; at most 64 paths, then other"
    );
    describe_gauge!(
        IN_FLIGHT_BYTES,
        metrics::Unit::Bytes,
        "Bytes held by records in flight (raw, decoded and store request), against in_flight_budget_bytes"
    );
    describe_gauge!(
        IN_FLIGHT_BUDGET_BYTES,
        metrics::Unit::Bytes,
        "The in-flight byte budget, kafka.max_in_flight_bytes"
    );
    describe_gauge!(
        MEMORY_LIMIT_BYTES,
        metrics::Unit::Bytes,
        "The process's cgroup memory limit, 0 without one"
    );
    describe_gauge!(
        ASSIGNED_PARTITIONS,
        "Partitions of the dispatch topic assigned to this replica (0 when idle or unassigned)"
    );
    describe_gauge!(
        TOPIC_PARTITIONS,
        "Partitions of the dispatch topic in the brokers' metadata (0 when it is missing or unreadable)"
    );
    describe_gauge!(
        SUBSCRIPTION_AVAILABLE,
        "1 while the dispatch topic exists, can be read and has partitions, and an assignment arrived within kafka.assignment_timeout_ms; 0 otherwise"
    );
    describe_gauge!(
        STORE_EVICTING,
        "1 when a Redis master's maxmemory-policy evicts keys (only run with store.redis.allow_eviction = true), 0 otherwise"
    );
    describe_gauge!(
        STORE_FULL,
        "1 while the store refuses writes for memory (a Redis master at its maxmemory, or an OOM answer in the last 5 s): the writes wait, nothing is dead-lettered; 0 otherwise"
    );
    describe_counter!(
        STORE_WENT_BACK_TOTAL,
        "Assignments at which the store held a partition only below the group's committed offset (it went back in time: a failover to a replica behind, an older snapshot), so the partition was read again from there, by partition"
    );
    describe_gauge!(
        STORE_LOST,
        "1 while the store's data is found gone (a wiped store or master, SPEC 7.3: a script found its slot's store marker missing in the last 5 s): writes wait until an operator rebuilds from the log or runs materializer accept-store-loss; 0 otherwise"
    );
    describe_gauge!(
        BLOCKED_MAILBOXES,
        "Mailboxes this replica holds failing closed (corrupt), all partitions; each holds only itself"
    );
    describe_gauge!(
        BLOCKED_MAILBOXES_LIMIT,
        "kafka.max_blocked_mailboxes: more blocked mailboxes than this turn the replica not ready"
    );
    describe_counter!(
        REREADS_TOTAL,
        "Partitions read again from their committed position because a blocked mailbox was repaired (its skipped deliveries come from the log)"
    );
    describe_gauge!(
        STORE_OPEN_SLOTS,
        "Redis Cluster slots left migrating or importing on two reads 10 s apart (an interrupted reshard: their users wait), 0 otherwise"
    );
    describe_counter!(
        STORE_REDIRECTS_TOTAL,
        "Redis Cluster redirections of batched appends by kind (moved, ask, tryagain, clusterdown, loading), each request sent again alone"
    );
    describe_gauge!(
        TOPIC_COMPACTED,
        "1 when the dispatch topic's cleanup.policy contains compact (repairs are refused), 0 when it does not, -1 when it could not be read"
    );
    describe_counter!(
        RECORDS_LOST_TOTAL,
        "Offsets of the dispatch topic the log deleted before this group read them (retention or DeleteRecords overtook it), by partition and reason (committed_below_log_start, offset_out_of_range)"
    );
    describe_gauge!(
        PARTITION_HELD_LOST,
        "1 while a partition waits after records were lost (kafka.on_records_lost = hold) for an operator to accept the loss, 0 otherwise"
    );
    describe_gauge!(
        PARTITION_GROWTH_WAITING,
        "1 while a partition that appeared with a growth of the dispatch topic waits for the older partitions to be consumed past the records written before it (SPEC 7.2), 0 otherwise"
    );
    describe_counter!(
        CONSUMER_ERRORS_TOTAL,
        "Errors the Kafka consumer returned instead of a record, by librdkafka error code"
    );
}

fn zero_counters() {
    for outcome in RECORD_OUTCOMES {
        counter!(RECORDS_TOTAL, "outcome" => *outcome).absolute(0);
    }
    for outcome in GROUP_OUTCOMES {
        counter!(GROUPS_TOTAL, "outcome" => *outcome).absolute(0);
    }
    for reason in DLQ_REASONS {
        counter!(DLQ_TOTAL, "reason" => *reason).absolute(0);
    }
    for outcome in REPLAY_OUTCOMES {
        counter!(REPLAY_RECORDS_TOTAL, "outcome" => *outcome).absolute(0);
    }
    counter!(PROMOTE_EXPIRED_BUCKETS_TOTAL).absolute(0);
    counter!(REREADS_TOTAL).absolute(0);
    gauge!(BLOCKED_MAILBOXES).set(0.0);
    // Only a Redis store can evict; every other store exports 0 from the start.
    gauge!(STORE_EVICTING).set(0.0);
    gauge!(STORE_FULL).set(0.0);
    gauge!(STORE_LOST).set(0.0);
    gauge!(STORE_OPEN_SLOTS).set(0.0);
}

/// The in-flight byte budget (`kafka.max_in_flight_bytes`), beside [`in_flight_bytes`].
pub(crate) fn in_flight_budget(bytes: usize) {
    gauge!(IN_FLIGHT_BUDGET_BYTES).set(bytes as f64);
}

/// The bytes records in flight are charged (raw, decoded and store request), all partitions.
pub(crate) fn in_flight_bytes(bytes: usize) {
    gauge!(IN_FLIGHT_BYTES).set(bytes as f64);
}

/// The process's cgroup memory limit, 0 without one (the RSS alert compares with it).
pub fn memory_limit(bytes: u64) {
    gauge!(MEMORY_LIMIT_BYTES).set(bytes as f64);
}

/// Whether the store may evict the mailboxes' keys ([`STORE_EVICTING`]).
pub(crate) fn store_evicting(evicting: bool) {
    gauge!(STORE_EVICTING).set(if evicting { 1.0 } else { 0.0 });
}

/// `partition` was read again because the store went back in time ([`STORE_WENT_BACK_TOTAL`]).
pub(crate) fn store_went_back(partition: i32) {
    counter!(STORE_WENT_BACK_TOTAL, "partition" => partition.to_string()).increment(1);
}

/// Whether a call found the store's data gone within the last seconds ([`STORE_LOST`]).
pub(crate) fn store_lost(lost: bool) {
    gauge!(STORE_LOST).set(f64::from(u8::from(lost)));
}

/// Whether the store refuses writes for memory ([`STORE_FULL`]).
pub(crate) fn store_full(full: bool) {
    gauge!(STORE_FULL).set(f64::from(u8::from(full)));
}

/// Redis Cluster slots left open by an interrupted reshard on two reads in a row
/// ([`STORE_OPEN_SLOTS`]; 0 on every other store).
pub(crate) fn store_open_slots(slots: usize) {
    gauge!(STORE_OPEN_SLOTS).set(slots as f64);
}

/// The Redis Cluster redirections batched appends met so far, by kind
/// ([`STORE_REDIRECTS_TOTAL`]; the store counts them, this exports its totals).
pub(crate) fn store_redirects(kind: &'static str, total: u64) {
    counter!(STORE_REDIRECTS_TOTAL, "kind" => kind).absolute(total);
}

/// What the readiness probe learned of the subscription (`daemon::health`).
pub(crate) fn subscription(available: bool, topic_partitions: usize, assigned: usize) {
    gauge!(SUBSCRIPTION_AVAILABLE).set(if available { 1.0 } else { 0.0 });
    gauge!(TOPIC_PARTITIONS).set(topic_partitions as f64);
    gauge!(ASSIGNED_PARTITIONS).set(assigned as f64);
}

/// The dispatch topic's cleanup policy as [`TOPIC_COMPACTED`] exports it: `Some(true)`
/// compacted, `Some(false)` not, `None` unknown (-1).
pub(crate) fn topic_compacted(compacted: Option<bool>) {
    let value = match compacted {
        Some(true) => 1.0,
        Some(false) => 0.0,
        None => -1.0,
    };
    gauge!(TOPIC_COMPACTED).set(value);
}

/// The registered handle, if [`install`] ran.
pub fn handle() -> Option<MetricsHandle> {
    HANDLE.get().cloned()
}

/// Names the configured store backend: sets `build_info{version,revision,backend}` to 1 and exports
/// `store_errors_total{backend,kind}` at 0 for every error kind. Call once the configuration is
/// known, before the store is first reached (a store that is down still shows what runs).
pub fn backend(backend: &'static str) {
    gauge!(BUILD_INFO, "version" => VERSION, "revision" => REVISION, "backend" => backend).set(1.0);
    for kind in STORE_ERROR_KINDS {
        counter!(STORE_ERRORS_TOTAL, "backend" => backend, "kind" => *kind).absolute(0);
    }
}

/// Call once per record whose every delivery is final (or that was dead-lettered).
pub fn record(outcome: &'static str) {
    record_n(outcome, 1);
}

/// [`record`] for `n` records of one outcome at once.
pub(crate) fn record_n(outcome: &'static str, n: u64) {
    counter!(RECORDS_TOTAL, "outcome" => outcome).increment(n);
}

/// Call once per delivery with a final outcome.
pub fn group(outcome: &'static str) {
    counter!(GROUPS_TOTAL, "outcome" => outcome).increment(1);
}

/// Call once per record acknowledged by the dead-letter topic.
pub(crate) fn dead_letter(reason: &'static str) {
    counter!(DLQ_TOTAL, "reason" => reason).increment(1);
}

/// Call on every failed store operation, with `StoreError::kind()`.
pub(crate) fn store_error(backend: &'static str, kind: &'static str) {
    counter!(STORE_ERRORS_TOTAL, "backend" => backend, "kind" => kind).increment(1);
}

pub(crate) fn apply_duration(seconds: f64) {
    histogram!(APPLY_DURATION).record(seconds);
}

/// Call once per store call (a batch of appends is one call): `op` is `append` or
/// `truncate_before`. Beside [`apply_duration`], which a batch feeds once per delivery, this
/// answers "is the store slow?" per call and per backend.
pub(crate) fn store_call_duration(backend: &'static str, op: &'static str, seconds: f64) {
    histogram!(STORE_CALL_DURATION, "backend" => backend, "op" => op).record(seconds);
}

/// Call with the number of expired days the store compacted into gap boundaries since the last
/// call (its `promoted_buckets_total()` grew by that): the promote inside every append and
/// truncate (SPEC 4.5), so the counter moves whatever write triggered the compaction.
pub(crate) fn promote_expired_buckets(days: u32) {
    counter!(PROMOTE_EXPIRED_BUCKETS_TOTAL).increment(u64::from(days));
}

/// Call once per record `replay` read, with its outcome word ([`REPLAY_OUTCOMES`]).
pub(crate) fn replay_record(outcome: &'static str) {
    counter!(REPLAY_RECORDS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn ready(ready: bool) {
    gauge!(READY).set(if ready { 1.0 } else { 0.0 });
}

/// Call when the consumer returns an error instead of a record, with the librdkafka error code's
/// name (`NotImplemented`, `BadMessage`, ...: a closed set, so the label stays bounded).
/// The records-lost reasons (`records_lost_total{partition,reason}`), exported at 0 for every
/// assigned partition so an alert sees the first loss as an increase.
pub(crate) const LOSS_REASONS: &[&str] = &["committed_below_log_start", "offset_out_of_range"];

/// Offsets `count` of `partition` deleted before they were read (SPEC 7.3).
pub(crate) fn records_lost(partition: i32, reason: &'static str, count: u64) {
    counter!(RECORDS_LOST_TOTAL, "partition" => partition.to_string(), "reason" => reason)
        .increment(count);
}

/// Whether `partition` waits for an operator to accept a loss.
pub(crate) fn partition_held_lost(partition: i32, held: bool) {
    gauge!(PARTITION_HELD_LOST, "partition" => partition.to_string())
        .set(f64::from(u8::from(held)));
}

/// Whether `partition` waits for older partitions after a growth of the topic.
pub(crate) fn partition_growth_waiting(partition: i32, waiting: bool) {
    gauge!(PARTITION_GROWTH_WAITING, "partition" => partition.to_string())
        .set(f64::from(u8::from(waiting)));
}

pub(crate) fn consumer_error(code: &str) {
    let code = if code.len() <= 64 && code.chars().all(|c| c.is_ascii_alphanumeric()) {
        code.to_owned()
    } else {
        "other".to_owned()
    };
    counter!(CONSUMER_ERRORS_TOTAL, "code" => code).increment(1);
}

/// Unknown-field label bookkeeping: the first distinct paths seen keep their own label.
static UNKNOWN_FIELD_LABELS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The label an unknown field path is counted under: itself while fewer than
/// [`MAX_UNKNOWN_FIELD_LABELS`] distinct paths have been seen (and it is short and plain),
/// [`OTHER_FIELD`] after that.
pub(crate) fn unknown_field_label(path: &str) -> String {
    let plain = path.len() <= MAX_UNKNOWN_FIELD_BYTES
        && !path.is_empty()
        && path.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '@' | '$' | '[' | ']' | '-')
        });
    if !plain || path == OTHER_FIELD {
        return OTHER_FIELD.to_owned();
    }
    let mut seen = UNKNOWN_FIELD_LABELS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.contains(path) {
        return path.to_owned();
    }
    if seen.len() < MAX_UNKNOWN_FIELD_LABELS {
        seen.insert(path.to_owned());
        return path.to_owned();
    }
    OTHER_FIELD.to_owned()
}

/// Counts the ignored unknown fields of one decoded record (`Decoded::unknown_fields`: each
/// distinct path once per record). Call after every successful decode. Under
/// `ingest.strict_fields` an unknown field is an error instead, counted as a malformed record.
pub(crate) fn unknown_fields<S: AsRef<str>>(paths: &[S]) {
    for path in paths {
        let label = unknown_field_label(path.as_ref());
        counter!(UNKNOWN_FIELDS_TOTAL, "field" => label).increment(1);
    }
}

/// The gauges of one partition this instance owns. `None`: not known yet, not exported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct PartitionGauges {
    lag: Option<f64>,
    blocked: f64,
    /// Deliveries skipped for the partition's blocked mailboxes (re-read once they heal).
    skipped: f64,
    /// Records a re-read still has to go to reach where the partition had been read.
    reread_behind: Option<f64>,
    committed: Option<f64>,
    last_record_timestamp: Option<f64>,
    unreadable: f64,
}

/// Per-partition gauges of the partitions this instance owns (bounded by the topic's partition
/// count).
static PARTITIONS: Mutex<BTreeMap<i32, PartitionGauges>> = Mutex::new(BTreeMap::new());

fn partitions() -> MutexGuard<'static, BTreeMap<i32, PartitionGauges>> {
    PARTITIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Call when the consumer group assigns `partition` to this instance, with its lag at that
/// moment (high watermark minus committed offset, both known at assignment), so
/// `consumer_lag` exists from the assignment rather than from the first statistics tick. Also
/// exports `partition_blocked` and `partition_unreadable` at 0.
pub(crate) fn partition_assigned(partition: i32, lag: i64) {
    for reason in LOSS_REASONS {
        records_lost(partition, reason, 0);
    }
    let mut table = partitions();
    let entry = table.entry(partition).or_default();
    entry.lag = Some(lag.max(0) as f64);
}

/// Call when `partition` is revoked from this instance (or the consumer stops): every gauge of
/// the partition disappears from this instance's scrape; its new owner exports them.
pub(crate) fn partition_revoked(partition: i32) {
    partitions().remove(&partition);
}

/// Call on every statistics tick and commit, for each partition this instance owns.
pub fn consumer_lag(partition: i32, lag: i64) {
    partitions().entry(partition).or_default().lag = Some(lag.max(0) as f64);
}

/// Call whenever the number of mailboxes failing closed in `partition` changes.
pub(crate) fn partition_blocked(partition: i32, blocked_mailboxes: usize) {
    partitions().entry(partition).or_default().blocked = blocked_mailboxes as f64;
}

/// The deliveries skipped for `partition`'s blocked mailboxes so far (they wait in the log).
pub(crate) fn partition_blocked_skipped(partition: i32, skipped: u64) {
    partitions().entry(partition).or_default().skipped = skipped as f64;
}

/// The mailboxes this replica holds failing closed, and `kafka.max_blocked_mailboxes`.
pub(crate) fn blocked_mailboxes(blocked: usize, limit: usize) {
    gauge!(BLOCKED_MAILBOXES).set(blocked as f64);
    gauge!(BLOCKED_MAILBOXES_LIMIT).set(limit as f64);
}

/// A re-read of `partition` started (a blocked mailbox healed).
pub(crate) fn reread_started(partition: i32) {
    counter!(REREADS_TOTAL).increment(1);
    partitions().entry(partition).or_default().reread_behind = None;
}

/// How far a re-read of `partition` is behind where it had been read to (0 once caught up).
pub(crate) fn reread_behind(partition: i32, records: i64) {
    partitions().entry(partition).or_default().reread_behind = Some(records.max(0) as f64);
}

/// Call after each successful commit, for each committed partition.
pub(crate) fn committed_offset(partition: i32, offset: i64) {
    partitions().entry(partition).or_default().committed = Some(offset as f64);
}

/// Call for each record that becomes final (applied or dead-lettered), with its Kafka timestamp
/// in milliseconds; records without a timestamp are skipped by the caller. Records of a
/// partition may become final out of offset order (mailboxes run concurrently), so the gauge
/// keeps the largest timestamp seen: `time() - last_record_timestamp_seconds` is the lag in time.
pub(crate) fn last_record_timestamp(partition: i32, timestamp_ms: i64) {
    let seconds = timestamp_ms as f64 / 1000.0;
    let mut table = partitions();
    let entry = table.entry(partition).or_default();
    if entry.last_record_timestamp.is_none_or(|old| seconds > old) {
        entry.last_record_timestamp = Some(seconds);
    }
}

/// Call with `true` when the consumer cannot read `partition` (a fetch or decompression error
/// that repeats at the same offset), `false` once a record of it is read again. While it is 1,
/// the daemon should also report not ready after a threshold and log what to do.
pub(crate) fn partition_unreadable(partition: i32, unreadable: bool) {
    partitions().entry(partition).or_default().unreadable = if unreadable { 1.0 } else { 0.0 };
}

/// The per-partition gauges as Prometheus text, one family at a time.
fn render_partitions(out: &mut String) {
    let table = partitions().clone();
    type Pick = fn(&PartitionGauges) -> Option<f64>;
    let families: [(&str, &str, Pick); 7] = [
        (
            CONSUMER_LAG,
            "Records of the partition after the committed watermark (high watermark minus watermark)",
            |g| g.lag,
        ),
        (
            PARTITION_BLOCKED,
            "Mailboxes of the partition failing closed on a corrupt store state (0 when flowing)",
            |g| Some(g.blocked),
        ),
        (
            PARTITION_BLOCKED_SKIPPED,
            "Deliveries of the partition's blocked mailboxes skipped so far: read again from the log once the mailbox is repaired",
            |g| Some(g.skipped),
        ),
        (
            PARTITION_REREAD_BEHIND,
            "Records a re-read of the partition (after a blocked mailbox was repaired) still has to read to get back to where it was",
            |g| g.reread_behind,
        ),
        (
            COMMITTED_OFFSET,
            "The last committed offset (next record to read) of each assigned partition",
            |g| g.committed,
        ),
        (
            LAST_RECORD_TIMESTAMP,
            "Kafka timestamp of the newest record of the partition that reached a final outcome",
            |g| g.last_record_timestamp,
        ),
        (
            PARTITION_UNREADABLE,
            "1 while the consumer cannot read the partition (fetch or decompression errors)",
            |g| Some(g.unreadable),
        ),
    ];
    for (name, help, pick) in families {
        let samples: Vec<(i32, f64)> = table
            .iter()
            .filter_map(|(p, g)| pick(g).map(|v| (*p, v)))
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (partition, value) in samples {
            let _ = writeln!(
                out,
                "{name}{{partition=\"{partition}\"}} {}",
                format_value(value)
            );
        }
        out.push('\n');
    }
}

/// A sample value as the exposition format spells it.
fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value == f64::INFINITY {
        "+Inf".to_owned()
    } else if value == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        value.to_string()
    }
}

mod process_cpu;
#[cfg(test)]
mod tests;
