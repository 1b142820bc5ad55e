//! The Prometheus metrics of SPEC section 9, in one place: names, labels and help texts.
//!
//! Labels are bounded: outcome and error words, partitions, the backend name. No user id or
//! mailbox ever becomes a label (a label per user would be unbounded cardinality).

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const RECORDS_TOTAL: &str = "materializer_records_total";
pub const GROUPS_TOTAL: &str = "materializer_groups_total";
pub const DLQ_TOTAL: &str = "materializer_dlq_total";
pub const PARTITION_BLOCKED: &str = "materializer_partition_blocked";
pub const CONSUMER_LAG: &str = "materializer_consumer_lag";
pub const APPLY_DURATION: &str = "materializer_apply_duration_seconds";
pub const STORE_ERRORS_TOTAL: &str = "materializer_store_errors_total";
pub const PROMOTE_EXPIRED_DAYS_TOTAL: &str = "materializer_promote_expired_days_total";
pub const REPLAY_RECORDS_TOTAL: &str = "materializer_replay_records_total";
pub const COMMITTED_OFFSET: &str = "materializer_committed_offset";
pub const READY: &str = "materializer_ready";
pub const LAST_RECORD_TIMESTAMP: &str = "materializer_last_record_timestamp_seconds";
pub const PARTITION_STALLED: &str = "materializer_partition_stalled";
pub const CONSUMER_ERRORS_TOTAL: &str = "materializer_consumer_errors_total";

/// A gauge not set for this long disappears from `/metrics`. The daemon sets the gauges of every
/// assigned partition at each housekeeping tick (every second), so this is how a revoked
/// partition's gauges are removed instead of staying frozen on its old owner (where `sum()` would
/// count them twice).
pub const GAUGE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Record outcomes (`records_total{outcome}`): every delivery final and written or a no-op
/// (`applied`), some delivery rejected or conflicting so the record went to the dead-letter topic
/// (`dead_lettered`), or not decodable (`malformed`, also dead-lettered).
pub const RECORD_APPLIED: &str = "applied";
pub const RECORD_DEAD_LETTERED: &str = "dead_lettered";
pub const RECORD_MALFORMED: &str = "malformed";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once and describes every metric; later calls return the
/// same handle.
pub fn install() -> Result<PrometheusHandle, String> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .idle_timeout(
            metrics_util::MetricKindMask::GAUGE,
            Some(GAUGE_IDLE_TIMEOUT),
        )
        .set_buckets_for_metric(
            Matcher::Full(APPLY_DURATION.to_owned()),
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0,
            ],
        )
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
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
    describe_gauge!(
        PARTITION_BLOCKED,
        "Mailboxes of the partition failing closed on a corrupt store state (0 when flowing)"
    );
    describe_gauge!(
        CONSUMER_LAG,
        "Records of the partition after the committed watermark (high watermark minus watermark)"
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
        PROMOTE_EXPIRED_DAYS_TOTAL,
        "Expired days compacted into gap boundaries by explicit promotes (promote, patrol)"
    );
    describe_counter!(
        REPLAY_RECORDS_TOTAL,
        "Records read by replay, by outcome (applied, dead_lettered, malformed, corrupt, skipped)"
    );
    describe_gauge!(
        COMMITTED_OFFSET,
        "The last committed offset (next record to read) of each assigned partition"
    );
    describe_gauge!(READY, "1 when the store and the broker answer, 0 otherwise");
    describe_gauge!(
        LAST_RECORD_TIMESTAMP,
        metrics::Unit::Seconds,
        "Kafka timestamp of the partition's last final record: lag in time is now minus this"
    );
    describe_gauge!(
        PARTITION_STALLED,
        "1 while the partition has records to read but the consumer cannot read them (consumer errors, no progress)"
    );
    describe_counter!(
        CONSUMER_ERRORS_TOTAL,
        "Errors the Kafka consumer reported while fetching, by librdkafka error code"
    );
}

/// The registered handle, if [`install`] ran.
pub fn handle() -> Option<PrometheusHandle> {
    HANDLE.get().cloned()
}

pub fn record(outcome: &'static str) {
    record_n(outcome, 1);
}

pub fn record_n(outcome: &'static str, n: u64) {
    counter!(RECORDS_TOTAL, "outcome" => outcome).increment(n);
}

pub fn group(outcome: &'static str) {
    counter!(GROUPS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn dead_letter(reason: &'static str) {
    counter!(DLQ_TOTAL, "reason" => reason).increment(1);
}

pub fn store_error(backend: &'static str, kind: &'static str) {
    counter!(STORE_ERRORS_TOTAL, "backend" => backend, "kind" => kind).increment(1);
}

pub fn apply_duration(seconds: f64) {
    histogram!(APPLY_DURATION).record(seconds);
}

pub fn partition_blocked(partition: i32, blocked_mailboxes: usize) {
    gauge!(PARTITION_BLOCKED, "partition" => partition.to_string()).set(blocked_mailboxes as f64);
}

pub fn consumer_lag(partition: i32, lag: i64) {
    gauge!(CONSUMER_LAG, "partition" => partition.to_string()).set(lag.max(0) as f64);
}

pub fn committed_offset(partition: i32, offset: i64) {
    gauge!(COMMITTED_OFFSET, "partition" => partition.to_string()).set(offset as f64);
}

pub fn promote_expired_days(days: u32) {
    counter!(PROMOTE_EXPIRED_DAYS_TOTAL).increment(u64::from(days));
}

pub fn replay_record(outcome: &'static str) {
    counter!(REPLAY_RECORDS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn ready(ready: bool) {
    gauge!(READY).set(if ready { 1.0 } else { 0.0 });
}

/// The Kafka timestamp (ms) of the partition's last final record.
pub fn last_record_timestamp(partition: i32, timestamp_ms: i64) {
    gauge!(LAST_RECORD_TIMESTAMP, "partition" => partition.to_string())
        .set(timestamp_ms as f64 / 1000.0);
}

pub fn partition_stalled(partition: i32, stalled: bool) {
    gauge!(PARTITION_STALLED, "partition" => partition.to_string()).set(if stalled {
        1.0
    } else {
        0.0
    });
}

pub fn consumer_error(code: &str) {
    counter!(CONSUMER_ERRORS_TOTAL, "code" => code.to_owned()).increment(1);
}
