//! Which log the dispatch topic is (SPEC 7.2): the topic's ID as the broker reports it
//! (KIP-516), or, where the broker reports none, the cluster ID and the topic name.
//!
//! A source position names its log so that offsets of two logs are never compared: a topic
//! deleted and recreated, a cut-over to a new topic or to a mirror on another cluster starts its
//! offsets again, and the old log's offsets say nothing about the new one's. rdkafka 0.38 does not
//! wrap DescribeTopics (librdkafka 2.3+): `kafka_ffi::describe_topics` calls it.
//!
//! Every front end that reads the log asks here before it tags records with positions: the
//! daemon's poll thread on each assignment, `replay` once per run. When the identity cannot be
//! read (a broker that does not answer, a refusal), the caller tags no position at all: the
//! records apply as `apply`'s do and fence nothing, which can never make a new log's record lose
//! to an old log's.

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};

use super::kafka_ffi::{describe_topics, AdminError};

use crate::model::LogId;

/// Why the identity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LogIdentityError {
    #[error("describing topic {topic} timed out after {timeout:?}")]
    TimedOut { topic: String, timeout: Duration },
    #[error("describing topic {topic} failed: {detail}")]
    Refused { topic: String, detail: String },
    #[error("the broker reports no topic ID for {topic} and no cluster ID")]
    Unnamed { topic: String },
}

/// The identity of `topic` on the cluster `client` talks to. Blocks up to `timeout` (call it
/// from a blocking context).
pub(crate) fn read<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<LogId, LogIdentityError> {
    match describe_topic_id(client, topic, timeout)? {
        Some(id) => LogId::topic_id(&id).ok_or_else(|| LogIdentityError::Refused {
            topic: topic.to_owned(),
            detail: format!("the broker's topic ID {id:?} is not printable"),
        }),
        None => {
            // An older broker: no topic IDs. The cluster ID still tells two clusters apart.
            let cluster =
                client
                    .fetch_cluster_id(timeout)
                    .ok_or_else(|| LogIdentityError::Unnamed {
                        topic: topic.to_owned(),
                    })?;
            LogId::cluster_topic(&cluster, topic).ok_or_else(|| LogIdentityError::Unnamed {
                topic: topic.to_owned(),
            })
        }
    }
}

/// DescribeTopics for one topic (`kafka_ffi::describe_topics`): its ID as base64 text, `None`
/// when the broker reports the zero UUID (no topic IDs).
fn describe_topic_id<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<String>, LogIdentityError> {
    let refused = |detail: String| LogIdentityError::Refused {
        topic: topic.to_owned(),
        detail,
    };
    let described = describe_topics(client, &[topic], timeout, false).map_err(|e| match e {
        AdminError::TimedOut => LogIdentityError::TimedOut {
            topic: topic.to_owned(),
            timeout,
        },
        AdminError::Failed(detail) => refused(detail),
    })?;
    let Some(first) = described.into_iter().next() else {
        return Err(refused("the answer describes no topic".to_owned()));
    };
    match first.error {
        Some((_, detail)) => Err(refused(detail)),
        None => Ok(first.id),
    }
}
