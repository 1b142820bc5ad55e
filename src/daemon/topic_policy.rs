//! Whether the dispatch topic keeps every record (SPEC 7.1 as amended).
//!
//! A topic whose `cleanup.policy` contains `compact` keeps only the newest record per key, and
//! dispatch records are keyed by user: once the log cleaner has run, a user's history in the log
//! may be down to its last record. A repair (`replay --reset-mailboxes`) rebuilds a mailbox from
//! the log and swaps it in, so on such a topic it would replace a mailbox of 100 groups with one
//! of 1. Compaction therefore removes the product's only recovery path, silently:
//!
//! - every repair refuses a compacted topic before anything is touched, with no override (a
//!   rebuild from a compacted log is never a repair);
//! - `check-config --connect` prints a FAIL line for it;
//! - the daemon logs a warning at start and on every assignment, and exports
//!   `materializer_topic_compacted` (1 compacted, 0 not, -1 unknown), which an alert rule watches.
//!
//! The policy is read with the admin API's DescribeConfigs, which needs the `DescribeConfigs`
//! permission on the topic. The value read is the effective one (the topic's own setting, or
//! the broker's `log.cleanup.policy` default). A policy that cannot be read is never taken as
//! safe: a repair stops with a retryable error naming the grant, and the daemon and
//! `check-config` say they could not tell.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaConfig;

/// How long the broker may take to describe the topic.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the daemon reads the policy besides at start and on every assignment: a policy
/// changed with `kafka-configs --alter` shows within this.
const RECHECK: Duration = Duration::from_secs(300);

/// The topic configuration key read.
pub const CLEANUP_POLICY: &str = "cleanup.policy";

/// A topic's effective `cleanup.policy`, as the broker reports it (`delete`, `compact`, or
/// `compact,delete`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupPolicy(String);

impl CleanupPolicy {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value as the broker reports it.
    pub fn value(&self) -> &str {
        &self.0
    }

    /// Whether the log cleaner may remove records that are not the newest of their key:
    /// `compact` alone or with `delete` (the list is comma-separated; case and spaces ignored).
    pub fn is_compacted(&self) -> bool {
        self.0
            .split(',')
            .any(|policy| policy.trim().eq_ignore_ascii_case("compact"))
    }

    /// What the policy means for the mailboxes, in the words every front end prints: the
    /// refusal of a repair, check-config's FAIL line and the daemon's warning.
    pub fn consequence(&self, topic: &str) -> String {
        format!(
            "topic {topic} has {CLEANUP_POLICY}={}: compaction keeps only the newest record of each key (dispatch records are keyed by user), so the log no longer holds every record of a mailbox and a rebuild from it would swap in a mailbox that lost its history; repairs (replay --reset-mailboxes) are refused; set {CLEANUP_POLICY}=delete with a retention that covers the history",
            self.0
        )
    }
}

/// Why the policy could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot create a Kafka admin client: {0}")]
    Client(KafkaError),
    #[error("DescribeConfigs of topic {topic} failed: {source} (is the broker reachable?)")]
    Request { topic: String, source: KafkaError },
    #[error("DescribeConfigs of topic {topic} was refused: {code} (the client needs the DescribeConfigs permission on the topic, and the topic must exist)")]
    Refused {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error(
        "the broker described topic {topic} without a {CLEANUP_POLICY} (does the topic exist?)"
    )]
    Missing { topic: String },
}

impl PolicyError {
    /// Whether asking again may succeed without an operator's change: a broker that did not
    /// answer. A refusal (a missing grant, a missing topic) waits for the operator.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Request { .. })
    }
}

/// Reads `topic`'s effective `cleanup.policy` with the configured brokers, TLS and SASL.
pub async fn read(
    kafka: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> Result<CleanupPolicy, PolicyError> {
    let admin: AdminClient<DefaultClientContext> =
        super::kafka::base_config(kafka, super::kafka::ClientRole::Admin)
            .create()
            .map_err(PolicyError::Client)?;
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let described = tokio::time::timeout(
        // The request timeout bounds the broker's answer; this bounds a client that never
        // reached a broker at all.
        timeout + Duration::from_secs(1),
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &options),
    )
    .await
    .map_err(|_| PolicyError::Request {
        topic: topic.to_owned(),
        source: KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut),
    })?
    .map_err(|source| PolicyError::Request {
        topic: topic.to_owned(),
        source,
    })?;
    let resource = match described.into_iter().next() {
        Some(Ok(resource)) => resource,
        Some(Err(code)) => {
            return Err(PolicyError::Refused {
                topic: topic.to_owned(),
                code,
            })
        }
        None => {
            return Err(PolicyError::Missing {
                topic: topic.to_owned(),
            })
        }
    };
    resource
        .get(CLEANUP_POLICY)
        .and_then(|entry| entry.value.clone())
        .map(CleanupPolicy::new)
        .ok_or_else(|| PolicyError::Missing {
            topic: topic.to_owned(),
        })
}

/// The daemon's watch (SPEC 7.1): reads the policy at start, on every assignment (`assigned`
/// is notified by the rebalance callback) and every [`RECHECK`]; sets
/// `materializer_topic_compacted`; logs a warning with the consequence at start, on every
/// assignment and whenever the answer changes while the topic is compacted, and once per change
/// when the policy cannot be read. It never stops the daemon: the records are still
/// materialized, only repairs become impossible.
pub fn watch(
    kafka: KafkaConfig,
    assigned: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let topic = kafka.topic.clone();
        let mut last: Option<Option<bool>> = None;
        let mut announce = true;
        loop {
            let read = read(&kafka, &topic, READ_TIMEOUT).await;
            let compacted = read.as_ref().ok().map(CleanupPolicy::is_compacted);
            super::events::Event::emit(super::events::TopicCompacted(compacted));
            let changed = last != Some(compacted);
            match &read {
                Ok(policy) if policy.is_compacted() && (announce || changed) => {
                    tracing::warn!(topic = %topic, policy = policy.value(), "{}", policy.consequence(&topic));
                }
                Ok(policy) if changed => {
                    tracing::info!(topic = %topic, policy = policy.value(), "the dispatch topic is not compacted: repairs can rebuild from it");
                }
                Err(e) if changed => {
                    tracing::warn!(topic = %topic, error = %e, "cannot read the dispatch topic's cleanup.policy: nobody can tell whether it is compacted, and repairs are refused until it can be read");
                }
                _ => {}
            }
            last = Some(compacted);
            announce = tokio::select! {
                _ = assigned.notified() => true,
                _ = tokio::time::sleep(RECHECK) => false,
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC 7.1: `compact` alone or with `delete`, in any case and spacing, is compacted;
    /// `delete` alone is not.
    #[test]
    fn compact_in_any_form_is_compacted_and_delete_alone_is_not() {
        for compacted in [
            "compact",
            "compact,delete",
            "delete,compact",
            " Compact , DELETE",
        ] {
            assert!(CleanupPolicy::new(compacted).is_compacted(), "{compacted}");
        }
        for kept in ["delete", "", "Delete", "compacted"] {
            assert!(!CleanupPolicy::new(kept).is_compacted(), "{kept}");
        }
    }

    #[test]
    fn the_consequence_names_the_topic_the_policy_and_the_fix() {
        let text = CleanupPolicy::new("compact,delete").consequence("dispatch");
        assert!(text.contains("topic dispatch"), "{text}");
        assert!(text.contains("cleanup.policy=compact,delete"), "{text}");
        assert!(
            text.contains("repairs (replay --reset-mailboxes) are refused"),
            "{text}"
        );
        assert!(text.contains("cleanup.policy=delete"), "{text}");
    }
}
