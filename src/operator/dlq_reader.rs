//! Reading the dead-letter topic back, for `materializer dlq`: its messages with their headers
//! decoded, read up to the end each partition had when the read began (a daemon still producing
//! dead letters does not make a read endless), and the original record of a truncated letter
//! fetched from its source topic.
//!
//! The reader has its own manual assignment and group id; it commits only when told to
//! ([`DlqReader::commit`], the re-drive's progress) and never joins the daemon's group.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::daemon::kafka::{base_config, ClientRole};

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read waits for the next message while offsets below the end remain.
const STALL: Duration = Duration::from_secs(30);

/// One message of the dead-letter topic.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetterMessage {
    pub partition: i32,
    pub offset: i64,
    /// When the dead letter was produced (the message's timestamp), in ms since the epoch.
    pub timestamp_ms: Option<i64>,
    pub headers: BTreeMap<String, String>,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

impl DeadLetterMessage {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// `error_kind` (`store_refused`, `future_created_at`, `invalid_json`, ...).
    pub(crate) fn kind(&self) -> &str {
        self.header("error_kind").unwrap_or("unknown")
    }

    /// `error_outcome` (`rejected`, `conflict`, `malformed`, ...).
    pub(crate) fn outcome(&self) -> &str {
        self.header("error_outcome").unwrap_or("unknown")
    }

    /// Whether `--kind` names this letter: its kind or its outcome.
    pub(crate) fn is_of_kind(&self, kind: &str) -> bool {
        self.kind() == kind || self.outcome() == kind
    }

    /// The value is an excerpt (`dlq_truncated: true`); the record is at its source.
    pub(crate) fn truncated(&self) -> bool {
        self.header("dlq_truncated") == Some("true")
    }

    /// Where the record came from: topic, partition and offset.
    pub(crate) fn source(&self) -> Option<(&str, i32, i64)> {
        Some((
            self.header("source_topic")?,
            self.header("source_partition")?.parse().ok()?,
            self.header("source_offset")?.parse().ok()?,
        ))
    }

    /// The source position of the letter's record: its log (the `source_log` header, written
    /// since positions name their log), partition and offset. `None` for a letter without
    /// them: its deliveries re-apply without a position.
    pub(crate) fn source_position(&self) -> Option<crate::model::SourcePosition> {
        let log = crate::model::LogId::parse(self.header("source_log")?)?;
        let (_, partition, offset) = self.source()?;
        Some(crate::model::SourcePosition::new(log, partition, offset))
    }

    /// The indexes of the deliveries the letter names as failed (`failed_deliveries`), when the
    /// list names every one (`failed_deliveries_total`); `None` for a malformed record's letter,
    /// a list cut short by its size bound, or a letter without the headers.
    pub(crate) fn failed_deliveries(&self) -> Option<std::collections::BTreeSet<usize>> {
        let total: usize = self.header("failed_deliveries_total")?.parse().ok()?;
        let list: Vec<serde_json::Value> =
            serde_json::from_str(self.header("failed_deliveries")?).ok()?;
        let listed: std::collections::BTreeSet<usize> = list
            .iter()
            .filter_map(|entry| entry.get("delivery")?.as_u64())
            .filter_map(|index| usize::try_from(index).ok())
            .collect();
        (listed.len() == total && list.len() == total).then_some(listed)
    }

    fn from_message(message: &impl Message) -> Self {
        let mut headers = BTreeMap::new();
        if let Some(h) = message.headers() {
            for header in h.iter() {
                let value = header
                    .value
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                headers.insert(header.key.to_owned(), value);
            }
        }
        Self {
            partition: message.partition(),
            offset: message.offset(),
            timestamp_ms: message.timestamp().to_millis(),
            headers,
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        }
    }
}

/// A partition of the dead-letter topic: its offsets when the read began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionSpan {
    pub partition: i32,
    pub low: i64,
    pub high: i64,
}

/// Reads the dead-letter topic (`kafka.dlq_topic`).
pub(crate) struct DlqReader {
    consumer: StreamConsumer,
    topic: String,
    /// Per assigned partition, the offset the read stops at.
    ends: BTreeMap<i32, i64>,
    done: BTreeSet<i32>,
}

fn consumer_config(config: &Config, group: &str) -> rdkafka::ClientConfig {
    let mut client = base_config(&config.kafka, ClientRole::Standalone);
    client
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    client
}

impl DlqReader {
    /// A reader under `group` (its committed offsets are the re-drive's progress).
    pub(crate) fn open(config: &Config, group: &str) -> Result<Self, String> {
        let consumer: StreamConsumer = consumer_config(config, group)
            .create()
            .map_err(|e| format!("kafka: {e}"))?;
        Ok(Self {
            consumer,
            topic: config.kafka.dlq_topic.clone(),
            ends: BTreeMap::new(),
            done: BTreeSet::new(),
        })
    }

    /// Every partition of the topic with its offsets now.
    pub(crate) fn partitions(&self) -> Result<Vec<PartitionSpan>, String> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(&self.topic), KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: metadata of {}: {e}", self.topic))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| format!("the dead-letter topic {} does not exist", self.topic))?;
        let mut spans = Vec::new();
        for partition in topic.partitions() {
            let (low, high) = self
                .consumer
                .fetch_watermarks(&self.topic, partition.id(), KAFKA_TIMEOUT)
                .map_err(|e| format!("kafka: offsets of partition {}: {e}", partition.id()))?;
            spans.push(PartitionSpan {
                partition: partition.id(),
                low,
                high,
            });
        }
        spans.sort_by_key(|s| s.partition);
        Ok(spans)
    }

    /// The reader's group's committed offset of each partition that has one.
    pub(crate) fn committed(&self, partitions: &[i32]) -> Result<BTreeMap<i32, i64>, String> {
        let mut tpl = TopicPartitionList::new();
        for partition in partitions {
            tpl.add_partition(&self.topic, *partition);
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: committed offsets: {e}"))?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect())
    }

    /// The first offset of each partition whose timestamp is at or after `ms` (the partition's
    /// end when none is).
    pub(crate) fn offsets_for_time(
        &self,
        spans: &[PartitionSpan],
        ms: i64,
    ) -> Result<BTreeMap<i32, i64>, String> {
        let mut tpl = TopicPartitionList::new();
        for span in spans {
            tpl.add_partition_offset(&self.topic, span.partition, Offset::Offset(ms))
                .map_err(|e| format!("kafka: {e}"))?;
        }
        let found = self
            .consumer
            .offsets_for_times(tpl, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: offsets for the time: {e}"))?;
        Ok(spans
            .iter()
            .map(|span| {
                let offset = found
                    .find_partition(&self.topic, span.partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
                    .unwrap_or(span.high);
                (span.partition, offset)
            })
            .collect())
    }

    /// Reads each partition from its start to its end (`start >= end`: nothing to read).
    pub(crate) fn assign(&mut self, ranges: &BTreeMap<i32, (i64, i64)>) -> Result<(), String> {
        let mut tpl = TopicPartitionList::new();
        for (partition, (start, end)) in ranges {
            self.ends.insert(*partition, *end);
            if start >= end {
                self.done.insert(*partition);
            } else {
                tpl.add_partition_offset(&self.topic, *partition, Offset::Offset(*start))
                    .map_err(|e| format!("kafka: {e}"))?;
            }
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| format!("kafka: assign: {e}"))
    }

    /// The next message before its partition's end; `None` once every partition is read.
    pub(crate) async fn next(&mut self) -> Result<Option<DeadLetterMessage>, String> {
        let give_up = Instant::now() + STALL;
        loop {
            if self.done.len() >= self.ends.len() {
                return Ok(None);
            }
            match tokio::time::timeout(Duration::from_secs(1), self.consumer.recv()).await {
                Ok(Ok(message)) => {
                    let partition = message.partition();
                    let end = self.ends.get(&partition).copied().unwrap_or(i64::MIN);
                    if message.offset() < end {
                        return Ok(Some(DeadLetterMessage::from_message(&message)));
                    }
                    self.finish(partition);
                }
                Ok(Err(e)) => return Err(format!("kafka: reading {}: {e}", self.topic)),
                Err(_) => {}
            }
            // The last offsets may be transaction markers, never delivered: the position says
            // when a partition is read.
            let position = self
                .consumer
                .position()
                .map_err(|e| format!("kafka: {e}"))?;
            for element in position.elements() {
                if let Offset::Offset(o) = element.offset() {
                    if self
                        .ends
                        .get(&element.partition())
                        .is_some_and(|end| o >= *end)
                    {
                        self.finish(element.partition());
                    }
                }
            }
            if self.done.len() < self.ends.len() && Instant::now() >= give_up {
                return Err(format!(
                    "no message of {} arrived for {STALL:?} while offsets below the end remained; is the broker reachable?",
                    self.topic
                ));
            }
        }
    }

    fn finish(&mut self, partition: i32) {
        if self.done.insert(partition) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, partition);
            let _ = self.consumer.pause(&tpl);
        }
    }

    /// Commits `offsets` (the next offset to read, per partition) for the reader's group.
    pub(crate) fn commit(&self, offsets: &BTreeMap<i32, i64>) -> Result<(), String> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in offsets {
            tpl.add_partition_offset(&self.topic, *partition, Offset::Offset(*offset))
                .map_err(|e| format!("kafka: {e}"))?;
        }
        self.consumer
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| format!("kafka: commit: {e}"))
    }
}

/// The identity of `topic`'s log now (SPEC 7.2): a letter whose `source_log` differs was read
/// from another log (the topic was deleted and recreated, or cut over under the same name), so
/// the record at its coordinates now is not its original.
pub(crate) async fn log_identity(
    config: &Config,
    topic: &str,
) -> Result<crate::model::LogId, String> {
    let group = format!("{}-dlq-inspect", config.kafka.group_id);
    let consumer: BaseConsumer = consumer_config(config, &group)
        .create()
        .map_err(|e| format!("kafka: {e}"))?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        crate::daemon::log_identity::read(consumer.client(), &topic, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: the identity of {topic}: {e}"))
    })
    .await
    .map_err(|e| format!("the reader stopped: {e}"))?
}

/// The one message at `offset` of `topic`'s `partition`; `None` when the partition no longer
/// (or does not yet) hold it.
pub(crate) async fn fetch(
    config: &Config,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<DeadLetterMessage>, String> {
    let group = format!("{}-dlq-inspect", config.kafka.group_id);
    let consumer: BaseConsumer = consumer_config(config, &group)
        .set("auto.offset.reset", "error")
        .create()
        .map_err(|e| format!("kafka: {e}"))?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let (low, high) = consumer
            .fetch_watermarks(&topic, partition, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: offsets of {topic} partition {partition}: {e}"))?;
        if offset < low || offset >= high {
            return Ok(None);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(offset))
            .map_err(|e| format!("kafka: {e}"))?;
        consumer
            .assign(&tpl)
            .map_err(|e| format!("kafka: assign: {e}"))?;
        let give_up = Instant::now() + STALL;
        while Instant::now() < give_up {
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(message)) if message.offset() == offset => {
                    return Ok(Some(DeadLetterMessage::from_message(&message)));
                }
                // A transaction marker or a compacted offset: the next one is later.
                Some(Ok(_)) => return Ok(None),
                Some(Err(e)) => return Err(format!("kafka: reading {topic}: {e}")),
                None => {}
            }
        }
        Err(format!(
            "{topic} partition {partition} offset {offset} did not arrive within {STALL:?}"
        ))
    })
    .await
    .map_err(|e| format!("the reader stopped: {e}"))?
}
