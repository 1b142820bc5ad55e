//! The daemon's internal events (as Vector's `internal_events`): one small struct per thing that
//! happens, whose `emit` writes its metrics and, where the event deserves one, its log line,
//! together. A metric and the line that explains it are written in one place, so they never
//! drift apart, and an event is named where it happens instead of spelled out in metric calls.
//!
//! The engine, the intake, the Kafka context and the monitors emit events; the metric names and
//! the recorder stay in `metrics`, which only this module and `telemetry` (the outcome counts
//! the demo's table shares with `/metrics`) call; `crate::layers`' test holds that.

use std::time::Duration;

use super::metrics;

/// Something that happened, reported by [`emit`](Event::emit) and consumed by it.
pub(crate) trait Event {
    fn emit(self);
}

/// A partition was assigned; `lag` is what the broker holds past its committed offset (0 until
/// the broker answered).
pub(crate) struct PartitionAssigned {
    pub partition: i32,
    pub lag: i64,
}

impl Event for PartitionAssigned {
    fn emit(self) {
        metrics::partition_assigned(self.partition, self.lag);
    }
}

/// A partition left this replica (revoked, or the run ended): its gauges disappear. `abandoned`
/// records were in flight and stay uncommitted for the next owner.
pub(crate) struct PartitionRevoked {
    pub partition: i32,
    pub abandoned: usize,
}

impl Event for PartitionRevoked {
    fn emit(self) {
        metrics::partition_revoked(self.partition);
        if self.abandoned > 0 {
            tracing::info!(
                partition = self.partition,
                abandoned = self.abandoned,
                "revoked with records in flight: abandoned, not committed"
            );
        }
    }
}

/// The consumer reported an error (most are transient and librdkafka retries them).
pub(crate) struct ConsumerError<'a> {
    pub error: &'a rdkafka::error::KafkaError,
}

impl Event for ConsumerError<'_> {
    fn emit(self) {
        let code = self
            .error
            .rdkafka_error_code()
            .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"));
        metrics::consumer_error(&code);
        super::kafka_grants::GroupAnswers::error(self.error.rdkafka_error_code());
        if super::broker_link::is_transport(self.error.rdkafka_error_code()) {
            super::broker_link::failed("consumer", &self.error.to_string());
        } else {
            tracing::warn!(error = %self.error, "consumer error");
        }
    }
}

/// The log deleted offsets of a partition before this group read them (SPEC 7.3): named in an
/// ERROR, counted; `held`: the partition waits for an operator (`kafka.on_records_lost`).
pub(crate) struct RecordsLost {
    pub loss: super::records_lost::Loss,
    pub held: bool,
}

impl Event for RecordsLost {
    fn emit(self) {
        let loss = self.loss;
        let count = u64::try_from(loss.to - loss.from).unwrap_or(0);
        metrics::records_lost(loss.partition, loss.reason.as_str(), count);
        let then = if self.held {
            "the partition is held (kafka.on_records_lost = \"hold\") until an operator accepts the loss: POST /records-lost/accept?partition=N on this replica"
        } else {
            "carrying on from the log's start (kafka.on_records_lost = \"continue\"): the mailboxes of these records miss them; produce them again if they can be had"
        };
        tracing::error!(
            partition = loss.partition,
            from = loss.from,
            to = loss.to,
            count,
            reason = loss.reason.as_str(),
            "records lost: the log deleted offsets {}..{} of partition {} before this group read them (retention or DeleteRecords overtook it); {then}",
            loss.from,
            loss.to,
            loss.partition,
        );
        if self.held {
            metrics::partition_held_lost(loss.partition, true);
        }
    }
}

/// A partition new to the group (the topic grew) waits: its records apply only once each older
/// partition is consumed past the offsets in `ends`, the records written before its first one
/// (SPEC 7.2).
pub(crate) struct PartitionGrowthWait {
    pub partition: i32,
    pub ends: std::collections::BTreeMap<i32, i64>,
}

impl Event for PartitionGrowthWait {
    fn emit(self) {
        metrics::partition_growth_waiting(self.partition, true);
        tracing::info!(
            partition = self.partition,
            older = ?self.ends,
            "partition {} is new to the group (the topic grew): its records wait until the older partitions are consumed past {:?}, the records written before its first one, so a user's older records apply first",
            self.partition,
            self.ends,
        );
    }
}

/// Waiting partitions left this replica (revoked): their gauges go to 0 here; the next owner
/// waits on its own.
pub(crate) struct PartitionGrowthLeft<'a>(pub &'a [i32]);

impl Event for PartitionGrowthLeft<'_> {
    fn emit(self) {
        for partition in self.0 {
            metrics::partition_growth_waiting(*partition, false);
        }
    }
}

/// A grown partition's wait ended: its records flow.
pub(crate) struct PartitionGrowthDone {
    pub partition: i32,
    pub waited: Duration,
}

impl Event for PartitionGrowthDone {
    fn emit(self) {
        metrics::partition_growth_waiting(self.partition, false);
        tracing::info!(
            partition = self.partition,
            waited_ms = u64::try_from(self.waited.as_millis()).unwrap_or(u64::MAX),
            "partition {}'s older partitions are consumed past the records written before it: its records flow (waited {:?})",
            self.partition,
            self.waited,
        );
    }
}

/// The store went back in time (SPEC 7.3): it holds `partition` only below `holds_below` while
/// the group committed `committed` (a failover to a replica that missed the last writes, an
/// older snapshot). The partition is read again from there: WARN, counted.
pub(crate) struct StoreWentBack {
    pub partition: i32,
    pub holds_below: i64,
    pub committed: i64,
}

impl Event for StoreWentBack {
    fn emit(self) {
        metrics::store_went_back(self.partition);
        tracing::warn!(
            partition = self.partition,
            holds_below = self.holds_below,
            committed = self.committed,
            "the store went back in time: it holds partition {} only below offset {} while the group committed {} (a failover to a replica that missed the last writes, or an older snapshot); the partition is read again from {}, so the lost writes are applied again",
            self.partition,
            self.holds_below,
            self.committed,
            self.holds_below,
        );
    }
}

/// An operator accepted a held loss: the partition carries on from `from`.
pub(crate) struct RecordsLostAccepted {
    pub partition: i32,
    pub from: i64,
}

impl Event for RecordsLostAccepted {
    fn emit(self) {
        metrics::partition_held_lost(self.partition, false);
        tracing::warn!(
            partition = self.partition,
            from = self.from,
            "the loss of records was accepted by an operator: the partition carries on from the log's start"
        );
    }
}

/// The bytes every window's records in flight are charged, all partitions.
pub(crate) struct InFlightBytes(pub usize);

impl Event for InFlightBytes {
    fn emit(self) {
        metrics::in_flight_bytes(self.0);
    }
}

/// The window's byte budget and the process's memory limit, known at start.
pub(crate) struct WindowBudget {
    pub bytes: usize,
    pub memory_limit: Option<u64>,
}

impl Event for WindowBudget {
    fn emit(self) {
        metrics::in_flight_budget(self.bytes);
        metrics::memory_limit(self.memory_limit.unwrap_or(0));
    }
}

/// The broker acknowledged a commit of `offset` on an assigned partition.
pub(crate) struct OffsetCommitted {
    pub partition: i32,
    pub offset: i64,
}

impl Event for OffsetCommitted {
    fn emit(self) {
        metrics::committed_offset(self.partition, self.offset);
        super::kafka_grants::GroupAnswers::accepted();
        super::broker_link::commit_succeeded();
    }
}

/// An offset commit failed (the stored offsets are sent again at the next interval); told
/// through `broker_link`, once per outage of the coordinator.
pub(crate) struct CommitFailed<'a> {
    pub error: &'a rdkafka::error::KafkaError,
}

impl Event for CommitFailed<'_> {
    fn emit(self) {
        super::kafka_grants::GroupAnswers::error(self.error.rdkafka_error_code());
        super::broker_link::commit_failed(self.error);
    }
}

/// A decoded record carried fields this build does not know (SPEC 3: ignored, counted).
pub(crate) struct UnknownFields<'a, S: AsRef<str>>(pub &'a [S]);

impl<S: AsRef<str>> Event for UnknownFields<'_, S> {
    fn emit(self) {
        if !self.0.is_empty() {
            metrics::unknown_fields(self.0);
        }
    }
}

/// A partition is read again from its committed position (a blocked mailbox healed).
pub(crate) struct RereadStarted {
    pub partition: i32,
}

impl Event for RereadStarted {
    fn emit(self) {
        metrics::reread_started(self.partition);
    }
}

/// How far a re-read still is behind the offset the partition had been read to.
pub(crate) struct RereadBehind {
    pub partition: i32,
    pub behind: i64,
    /// The offset the old window had reached.
    pub until: i64,
}

impl Event for RereadBehind {
    fn emit(self) {
        metrics::reread_behind(self.partition, self.behind);
        if self.behind == 0 {
            tracing::info!(
                partition = self.partition,
                offset = self.until,
                "the re-read caught up with where the partition had been read to"
            );
        }
    }
}

/// Expired day buckets the store compacted since the last report.
pub(crate) struct ExpiredBucketsPromoted(pub u64);

impl Event for ExpiredBucketsPromoted {
    fn emit(self) {
        metrics::promote_expired_buckets(u32::try_from(self.0).unwrap_or(u32::MAX));
    }
}

/// One assigned partition's gauges, refreshed every second.
pub(crate) struct PartitionGauges {
    pub partition: i32,
    pub blocked_mailboxes: usize,
    pub skipped_deliveries: u64,
    pub committed: Option<i64>,
    pub lag: Option<i64>,
}

impl Event for PartitionGauges {
    fn emit(self) {
        metrics::partition_blocked(self.partition, self.blocked_mailboxes);
        metrics::partition_blocked_skipped(self.partition, self.skipped_deliveries);
        if let Some(offset) = self.committed {
            metrics::committed_offset(self.partition, offset);
        }
        if let Some(lag) = self.lag {
            metrics::consumer_lag(self.partition, lag);
        }
    }
}

/// Whether a partition has records waiting that none could be read of (SPEC 10 readiness);
/// the log line is written when it becomes so.
pub(crate) struct PartitionReadable<'a> {
    pub partition: i32,
    pub stalled: bool,
    pub was_stalled: bool,
    pub lag: Option<i64>,
    pub last_consumer_error: Option<&'a str>,
    pub stalled_after: Duration,
}

impl Event for PartitionReadable<'_> {
    fn emit(self) {
        if self.stalled && !self.was_stalled {
            tracing::error!(
                partition = self.partition,
                lag = self.lag.unwrap_or(0),
                last_consumer_error = self.last_consumer_error.unwrap_or("none"),
                "partition stalled: records are waiting but none could be read for {:?}; check the consumer errors above (a 'Not implemented' error means the topic uses a compression codec or format this build cannot read) and the broker's health",
                self.stalled_after
            );
        }
        metrics::partition_unreadable(self.partition, self.stalled);
    }
}

/// The mailboxes failing closed on every partition, against `kafka.max_blocked_mailboxes`; the
/// log line is written when the count crosses the limit.
pub(crate) struct BlockedMailboxes {
    pub blocked: usize,
    pub limit: usize,
    pub was_over: bool,
}

impl Event for BlockedMailboxes {
    fn emit(self) {
        metrics::blocked_mailboxes(self.blocked, self.limit);
        if self.blocked > self.limit && !self.was_over {
            tracing::error!(
                blocked = self.blocked,
                limit = self.limit,
                "not ready: more mailboxes fail closed than kafka.max_blocked_mailboxes; damage in bulk (an evicting Redis, a log written out of order?): find the cause, repair them with materializer replay --reset-mailboxes (every other mailbox keeps flowing meanwhile)"
            );
        }
    }
}

/// What the readiness probe learned of the subscription.
pub(crate) struct Subscription {
    pub available: bool,
    pub topic_partitions: usize,
    pub assigned: usize,
}

impl Event for Subscription {
    fn emit(self) {
        metrics::subscription(self.available, self.topic_partitions, self.assigned);
    }
}

/// A command or the daemon opens its store: `build_info` names the backend (before the store
/// answers, so a daemon waiting for it already says what it runs), and every store error kind
/// of that backend is exported at 0.
pub(crate) struct StoreOpening(pub &'static str);

impl Event for StoreOpening {
    fn emit(self) {
        metrics::backend(self.0);
    }
}

/// The daemon starts: not ready until its checks pass and its partitions are assigned.
pub(crate) struct Starting;

impl Event for Starting {
    fn emit(self) {
        metrics::ready(false);
    }
}

/// Whether the store may evict the mailboxes' keys.
pub(crate) struct StoreEvicting(pub bool);

impl Event for StoreEvicting {
    fn emit(self) {
        metrics::store_evicting(self.0);
    }
}

/// Redis Cluster slots left open on two reads in a row.
pub(crate) struct StoreOpenSlots(pub usize);

impl Event for StoreOpenSlots {
    fn emit(self) {
        metrics::store_open_slots(self.0);
    }
}

/// The Redis Cluster redirections met so far, by kind (the store counts them).
pub(crate) struct StoreRedirects<'a> {
    pub totals: &'a [(&'static str, u64)],
}

impl Event for StoreRedirects<'_> {
    fn emit(self) {
        for (kind, total) in self.totals {
            metrics::store_redirects(kind, *total);
        }
    }
}

/// The dispatch topic's cleanup policy: `Some(true)` compacted, `None` unknown.
pub(crate) struct TopicCompacted(pub Option<bool>);

impl Event for TopicCompacted {
    fn emit(self) {
        metrics::topic_compacted(self.0);
    }
}

/// A replay record reached its outcome.
pub(crate) struct ReplayRecord(pub &'static str);

impl Event for ReplayRecord {
    fn emit(self) {
        metrics::replay_record(self.0);
    }
}
