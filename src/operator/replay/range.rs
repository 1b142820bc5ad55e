//! What a replay reads: the partition's offsets, the refusals decided from them, and the reader
//! that walks a range without ever jumping.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::{now_ms, Refusal, ReplayRequest, ReplayStart, STALL};
use crate::config::Config;
use crate::ingest::decode;
use crate::model::{LogId, UserId};

/// The offsets of the partition, read from the broker.
pub(crate) struct Range {
    /// The partition's log start when the replay began.
    pub(crate) low: i64,
    pub(crate) from: i64,
    pub(crate) end: i64,
}

/// The replay's Kafka clients: a reader with its own assignment (never committing) and a
/// watcher that only asks the daemon's consumer group what it committed.
pub(crate) struct Clients {
    topic: String,
    partition: i32,
    pub(super) reader: StreamConsumer,
    watcher: BaseConsumer,
}

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts of an offset fetch while the group's coordinator moves or loads (200 ms, 400 ms, ...:
/// 3 s in all).
const COORDINATOR_RETRIES: u32 = 5;

/// Whether a Kafka error says the group coordinator is moving, loading or not yet known.
fn coordinator_moving(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Code::NotCoordinator
                | Code::CoordinatorLoadInProgress
                | Code::CoordinatorNotAvailable
                | Code::WaitingForCoordinator
        )
    )
}

impl Clients {
    pub(crate) fn new(config: &Config, partition: i32) -> Result<Self, rdkafka::error::KafkaError> {
        let mut reader = crate::daemon::kafka::base_config(
            &config.kafka,
            crate::daemon::kafka::ClientRole::Standalone,
        );
        // librdkafka wants a group id even for a manual assignment; nothing is ever committed
        // to it, and it is not the daemon's group.
        reader
            .set("group.id", format!("{}-replay", config.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // A position that retention deleted mid-read must stop the replay, never jump to
            // the end (librdkafka's default reset), which would look like a complete range.
            .set("auto.offset.reset", "error");
        let mut watcher = crate::daemon::kafka::base_config(
            &config.kafka,
            crate::daemon::kafka::ClientRole::Standalone,
        );
        // The daemon's group, only to read its committed offsets (OffsetFetch): this client never
        // subscribes, so it never joins the group or disturbs its members.
        watcher
            .set("group.id", &config.kafka.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        Ok(Self {
            topic: config.kafka.topic.clone(),
            partition,
            reader: reader.create()?,
            watcher: watcher.create()?,
        })
    }

    /// (low, high) watermarks and the daemon group's committed offset of the partition.
    pub(crate) fn offsets(&self) -> Result<(i64, i64, Option<i64>), String> {
        let (low, high) = self.fetch_watermarks(self.partition)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, self.partition);
        // The group's coordinator may be moving or still loading (a broker that just started, a
        // rebalance of the offsets topic): that is a moment, not an answer. Ask again, briefly.
        let mut attempt = 0;
        let fetched = loop {
            match self.watcher.committed_offsets(tpl.clone(), KAFKA_TIMEOUT) {
                Err(e) if attempt < COORDINATOR_RETRIES && coordinator_moving(&e) => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
                }
                other => break other,
            }
        };
        let committed = fetched
            .map_err(|e| {
                format!(
                    "kafka: committed offset of partition {}: {e}",
                    self.partition
                )
            })?
            .find_partition(&self.topic, self.partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        Ok((low, high, committed))
    }

    /// Resolves the requested range, or refuses it. `Err` is an unreachable broker.
    pub(crate) async fn resolve(
        &self,
        request: &ReplayRequest,
    ) -> Result<Result<Range, Refusal>, String> {
        let (low, high, committed) = tokio::task::block_in_place(|| self.offsets())?;
        let refuse = |reason, detail| Ok(Err(Refusal { reason, detail }));
        let from = match request.start {
            ReplayStart::Offset(offset) => offset,
            ReplayStart::TimeMs(ms) => {
                if ms > now_ms() {
                    return refuse(
                        "from_time_in_future",
                        format!("--from-time {ms} ms is in the future: there is nothing to replay"),
                    );
                }
                match self.offset_at(self.partition, ms)? {
                    // The first record at or after the time is the log start, and the log lost
                    // records before it: they may be newer than the time asked for.
                    Some(offset)
                        if offset == low
                            && low > 0
                            && request.reset_mailboxes
                            && !request.allow_partial_history =>
                    {
                        return refuse(
                            "log_start_above_start",
                            format!(
                                "--from-time {ms} ms resolves to the log start {low}: retention already deleted the records before it, which may include records after that time; pass --allow-partial-history to rebuild from {low}"
                            ),
                        );
                    }
                    Some(offset) if offset < high => offset,
                    _ => {
                        return refuse(
                            "from_time_past_end",
                            format!(
                                "no record of partition {} at or after --from-time {ms} ms",
                                self.partition
                            ),
                        )
                    }
                }
            }
        };
        let from = if from < low {
            if !request.allow_partial_history {
                return refuse(
                    "log_start_above_start",
                    format!(
                        "records lost: the log deleted offsets {from}..{low} of partition {} before this replay read them (its log starts at offset {low}, above the requested start {from}): a rebuild would miss them; pass --allow-partial-history to replay from {low}",
                        request.partition
                    ),
                );
            }
            low
        } else {
            from
        };
        let end = request
            .to_offset
            .map_or(high, |to| to.saturating_add(1).min(high));
        if from >= end {
            return refuse(
                "empty_range",
                format!("offsets {from}..{end} of partition {} hold no record (the partition ends at {high})", self.partition),
            );
        }
        if request.reset_mailboxes {
            if let Some(committed) = committed.filter(|c| end < *c) {
                return refuse("end_below_committed", end_below(end, committed));
            }
        }
        Ok(Ok(Range { low, from, end }))
    }

    /// The first record in `low..from` that delivers to one of `users`, read (never applied).
    pub(super) async fn first_record_of(
        &self,
        users: &[UserId],
        low: i64,
        from: i64,
        config: &Config,
    ) -> Result<Option<(i64, UserId)>, String> {
        let mut found = None;
        self.read_users(users, low, from, config, |offset, user| {
            found = Some((offset, user.clone()));
            true
        })
        .await?;
        Ok(found)
    }

    /// Which of `users` have a record in `from..end`, read (never applied) before anything is
    /// fenced: a rebuild of a user without one would empty the mailbox (`user_not_in_range`).
    pub(super) async fn users_in_range(
        &self,
        users: &[UserId],
        from: i64,
        end: i64,
        config: &Config,
    ) -> Result<BTreeSet<UserId>, String> {
        let mut seen = BTreeSet::new();
        self.read_users(users, from, end, config, |_, user| {
            seen.insert(user.clone());
            seen.len() == users.len()
        })
        .await?;
        Ok(seen)
    }

    /// Reads `low..end`, calling `found(offset, user)` for each delivery to one of `users`,
    /// until it returns true or the range ends.
    async fn read_users(
        &self,
        users: &[UserId],
        low: i64,
        end: i64,
        config: &Config,
        mut found: impl FnMut(i64, &UserId) -> bool,
    ) -> Result<(), String> {
        self.read_records(low, end, |offset, payload| {
            if let Ok(record) = decode(payload, &config.decode_options()).map(|d| d.record) {
                for delivery in record.deliveries() {
                    let user = &delivery.mailbox().user_id;
                    if users.contains(user) && found(offset, user) {
                        return true;
                    }
                }
            }
            false
        })
        .await
        .map_err(|(reason, _)| reason)
    }

    /// Reads `low..end` in offset order, calling `each(offset, payload)` for every record until
    /// it returns true or the range ends. `Err` carries whether a rerun may succeed.
    pub(crate) async fn read_records(
        &self,
        low: i64,
        end: i64,
        mut each: impl FnMut(i64, &[u8]) -> bool,
    ) -> Result<(), (String, bool)> {
        self.read_partition(self.partition, low, end, |offset, _, payload| {
            each(offset, payload)
        })
        .await
    }

    /// Reads `low..end` of any partition of the topic in offset order, calling
    /// `each(offset, timestamp_ms, payload)` for every record until it returns true or the range
    /// ends. `Err` carries whether a rerun may succeed.
    pub(super) async fn read_partition(
        &self,
        partition: i32,
        low: i64,
        end: i64,
        mut each: impl FnMut(i64, Option<i64>, &[u8]) -> bool,
    ) -> Result<(), (String, bool)> {
        if low >= end {
            return Ok(());
        }
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&self.topic, partition, Offset::Offset(low))
            .map_err(|e| (format!("kafka: {e}"), true))?;
        self.reader
            .assign(&assignment)
            .map_err(|e| (format!("kafka: {e}"), true))?;
        let mut give_up = Instant::now() + STALL;
        loop {
            let record =
                match next_in_range(&self.reader, &self.topic, partition, end, give_up).await? {
                    Next::Done => return Ok(()),
                    Next::Record(record) => record,
                };
            give_up = Instant::now() + STALL;
            if each(record.offset, record.timestamp_ms, &record.payload) {
                return Ok(());
            }
        }
    }

    /// The topic's partitions as the broker reports them now, in ascending order.
    pub(super) fn partitions(&self) -> Result<Vec<i32>, String> {
        let metadata = tokio::task::block_in_place(|| {
            self.watcher
                .fetch_metadata(Some(&self.topic), KAFKA_TIMEOUT)
        })
        .map_err(|e| format!("kafka: metadata of {}: {e}", self.topic))?;
        let mut ids: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == self.topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// (low, high) watermarks of any partition of the topic, from an async context.
    pub(super) fn watermarks(&self, partition: i32) -> Result<(i64, i64), String> {
        tokio::task::block_in_place(|| self.fetch_watermarks(partition))
    }

    /// (low, high) watermarks of `partition`: the one broker call behind [`Self::offsets`] and
    /// [`Self::watermarks`] (blocks).
    fn fetch_watermarks(&self, partition: i32) -> Result<(i64, i64), String> {
        self.watcher
            .fetch_watermarks(&self.topic, partition, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: watermarks of partition {partition}: {e}"))
    }

    /// The offset of `partition`'s first record at or after `time_ms`; `None` when every record
    /// is older (`--from-time`, and the other partitions' check).
    pub(super) fn offset_at(&self, partition: i32, time_ms: i64) -> Result<Option<i64>, String> {
        let mut query = TopicPartitionList::new();
        query
            .add_partition_offset(&self.topic, partition, Offset::Offset(time_ms))
            .map_err(|e| format!("kafka: {e}"))?;
        let found =
            tokio::task::block_in_place(|| self.watcher.offsets_for_times(query, KAFKA_TIMEOUT))
                .map_err(|e| {
                    format!("kafka: offsets of partition {partition} at {time_ms} ms: {e}")
                })?;
        Ok(found
            .find_partition(&self.topic, partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o),
                _ => None,
            }))
    }

    /// The identity of the log the replay reads (its topic ID, or cluster and topic name).
    pub(crate) fn log_identity(
        &self,
    ) -> Result<LogId, crate::daemon::log_identity::LogIdentityError> {
        tokio::task::block_in_place(|| {
            crate::daemon::log_identity::read(self.reader.client(), &self.topic, KAFKA_TIMEOUT)
        })
    }

    /// With the fences up: the end moves to the high watermark now (unless `--to-offset` fixed
    /// it), and must still cover what the daemon committed.
    pub(super) async fn recheck_after_fence(
        &self,
        request: &ReplayRequest,
        range: &Range,
    ) -> Result<Result<i64, Refusal>, String> {
        let (_, high, committed) = tokio::task::block_in_place(|| self.offsets())?;
        // The daemon may have applied (not yet committed) every record below `high` before the
        // fence went up: a rebuild that stops earlier would drop the user's groups it wrote.
        if let Some(to) = request.to_offset.filter(|to| to.saturating_add(1) < high) {
            return Ok(Err(Refusal {
                reason: "end_below_log_end",
                detail: format!(
                    "--to-offset {to} is below the partition's end {high} at the fence: the daemon may already have written records after it, which the rebuilt mailbox would lose; a repair runs to the end of the partition (leave --to-offset out)"
                ),
            }));
        }
        let end = high.max(range.end);
        match committed.filter(|c| end < *c) {
            Some(committed) => Ok(Err(Refusal {
                reason: "end_below_committed",
                detail: end_below(end, committed),
            })),
            None => Ok(Ok(end)),
        }
    }
}

/// One record a replay read.
pub(super) struct ReadRecord {
    pub(super) offset: i64,
    /// The record's timestamp, when it carries one.
    pub(super) timestamp_ms: Option<i64>,
    pub(super) payload: Vec<u8>,
}

/// How a read of `[.., end)` goes on.
pub(super) enum Next {
    Record(ReadRecord),
    /// The reader's position reached `end`: the range is read.
    Done,
}

/// The next record of the partition before `end`, or [`Next::Done`] once the reader's position
/// reached `end` — the last offsets of a range may be transaction markers, which are never
/// delivered, so the position, not the last offset seen, says when a range is read. `Err` when
/// the position was lost (retention deleted it: never a silent jump) or nothing arrived until
/// `give_up` (the broker is unreachable; retryable).
pub(super) async fn next_in_range(
    reader: &StreamConsumer,
    topic: &str,
    partition: i32,
    end: i64,
    give_up: Instant,
) -> Result<Next, (String, bool)> {
    loop {
        match tokio::time::timeout(Duration::from_secs(1), reader.recv()).await {
            Ok(Ok(message)) => {
                let offset = message.offset();
                if offset >= end {
                    return Ok(Next::Done);
                }
                let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
                return Ok(Next::Record(ReadRecord {
                    offset,
                    timestamp_ms: message.timestamp().to_millis(),
                    payload,
                }));
            }
            Ok(Err(e)) if position_lost(&e) => {
                return Err((
                    format!("the read position of partition {partition} is gone ({e}): retention deleted records of the range while it was read; rerun (with --allow-partial-history if the history is truly gone)"),
                    false,
                ))
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "replay consumer error"),
            Err(_) => {}
        }
        let position = reader.position().ok().and_then(|tpl| {
            tpl.find_partition(topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        });
        if position.is_some_and(|p| p >= end) {
            return Ok(Next::Done);
        }
        if Instant::now() >= give_up {
            return Err((
                format!("no record arrived for {STALL:?} while offsets up to {end} remained; is the broker reachable?"),
                true,
            ));
        }
    }
}

/// Whether a consumer error means the read position no longer exists.
pub(super) fn position_lost(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode;
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
    )
}

fn end_below(end: i64, committed: i64) -> String {
    format!(
        "the replay would end at offset {end} but the daemon's group already committed {committed}: the rebuilt mailbox would miss records {end}..{committed}; raise --to-offset or leave it out"
    )
}
