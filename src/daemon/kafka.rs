//! librdkafka clients of the daemon: the group consumer with its rebalance and statistics
//! callbacks, the dead-letter producer, and the property validation of `check-config`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::http::Health;
use crate::config::KafkaConfig;

/// The settings every client shares: brokers, then the pass-through properties (TLS, SASL).
pub fn base_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// The group consumer: offsets are committed by the daemon only, from its contiguous watermark,
/// never by librdkafka's auto-commit of whatever was polled.
pub fn consumer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = base_config(kafka);
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set(
            "statistics.interval.ms",
            kafka.statistics_interval_ms.to_string(),
        );
    if !kafka.properties.contains_key("auto.offset.reset") {
        config.set("auto.offset.reset", "earliest");
    }
    config
}

/// The dead-letter producer: idempotent, acknowledged by every in-sync replica, so a dead letter
/// is durable before the source offset is committed.
pub fn producer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = base_config(kafka);
    config.set("enable.idempotence", "true").set("acks", "all");
    if !kafka.properties.contains_key("message.timeout.ms") {
        config.set("message.timeout.ms", "30000");
    }
    config
}

/// Checks that librdkafka knows every property and accepts its value, without connecting.
pub fn validate_properties(kafka: &KafkaConfig) -> Result<(), String> {
    consumer_config(kafka)
        .create_native_config()
        .map_err(|e| format!("kafka.properties: {e}"))?;
    producer_config(kafka)
        .create_native_config()
        .map_err(|e| format!("kafka.properties (dead-letter producer): {e}"))?;
    Ok(())
}

/// What the consumer callbacks tell the daemon's loop.
#[derive(Debug)]
pub enum GroupEvent {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
}

/// Offsets the loop has made committable per assigned partition: `(watermark, committed)`.
/// Entries exist only while the partition is assigned, so a late watermark of a revoked
/// partition can never be committed.
pub type Committable = Arc<Mutex<HashMap<i32, (Option<i64>, Option<i64>)>>>;

pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The consumer's context: rebalance, statistics, errors and logs.
///
/// librdkafka calls these from inside the consumer's poll (rust-rdkafka issue #738: only while the
/// consumer is polled), which the daemon's loop does continuously, also while partitions are
/// paused.
pub struct DaemonContext {
    pub topic: String,
    pub events: mpsc::UnboundedSender<GroupEvent>,
    pub committable: Committable,
    /// High watermarks from the statistics, for `consumer_lag`.
    pub high_watermarks: Arc<Mutex<HashMap<i32, i64>>>,
    pub health: Arc<Health>,
    /// False when offsets are not committed at all (a store that dies with the process).
    pub commit_offsets: bool,
}

impl ClientContext for DaemonContext {
    fn stats(&self, statistics: Statistics) {
        let broker_up = statistics
            .brokers
            .values()
            .any(|b| b.nodeid >= 0 && b.state == "UP");
        self.health.set_broker(broker_up);
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
        tracing::error!(error = %error, reason, "kafka client error");
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", fac, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}

impl ConsumerContext for DaemonContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let revoked = partitions_of(tpl, &self.topic);
                // Commit what is final before the partitions go: the new owner starts exactly
                // at the watermark, never past an unfinished record.
                let mut commit = TopicPartitionList::new();
                {
                    let mut committable = lock(&self.committable);
                    for partition in &revoked {
                        if let Some((Some(watermark), committed)) = committable.remove(partition) {
                            if committed != Some(watermark) {
                                let _ = commit.add_partition_offset(
                                    &self.topic,
                                    *partition,
                                    Offset::Offset(watermark),
                                );
                            }
                        }
                    }
                }
                if commit.count() > 0 && self.commit_offsets {
                    if let Err(e) = consumer.commit(&commit, CommitMode::Sync) {
                        tracing::warn!(error = %e, "commit on revoke failed; the new owner re-reads from the last commit");
                    }
                }
                tracing::info!(partitions = ?revoked, "partitions revoked");
                let _ = self.events.send(GroupEvent::Revoked(revoked));
            }
            Rebalance::Assign(tpl) => {
                let assigned = partitions_of(tpl, &self.topic);
                {
                    let mut committable = lock(&self.committable);
                    for partition in &assigned {
                        committable.entry(*partition).or_insert((None, None));
                    }
                }
                tracing::info!(partitions = ?assigned, "partitions assigned");
                let _ = self.events.send(GroupEvent::Assigned(assigned));
            }
            Rebalance::Error(e) => tracing::error!(error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "offset commit failed; retried at the next interval");
            // Forget what was believed committed, so the next interval commits again.
            let mut committable = lock(&self.committable);
            for element in offsets.elements() {
                if let Some(entry) = committable.get_mut(&element.partition()) {
                    entry.1 = None;
                }
            }
        }
    }
}
