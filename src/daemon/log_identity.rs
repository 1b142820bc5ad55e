//! Which log the dispatch topic is (SPEC 7.2): the topic's ID as the broker reports it
//! (KIP-516), or, where the broker reports none, the cluster ID and the topic name.
//!
//! A source position names its log so that offsets of two logs are never compared: a topic
//! deleted and recreated, a cut-over to a new topic or to a mirror on another cluster starts its
//! offsets again, and the old log's offsets say nothing about the new one's. rdkafka 0.38 does not
//! wrap DescribeTopics (librdkafka 2.3+), so this module calls it through the C bindings on the
//! client's own handle, with a queue of its own, and waits for the one result.
//!
//! Every front end that reads the log asks here before it tags records with positions: the
//! daemon's poll thread on each assignment, `replay` once per run. When the identity cannot be
//! read (a broker that does not answer, a refusal), the caller tags no position at all: the
//! records apply as `apply`'s do and fence nothing, which can never make a new log's record lose
//! to an old log's.

#![allow(unsafe_code)] // the C bindings of DescribeTopics: each unsafe block says why it is sound

use std::ffi::CString;
use std::os::raw::c_char;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use super::kafka_ffi::{text, Owned};

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

/// DescribeTopics for one topic: its ID as base64 text, `None` when the broker reports the
/// zero UUID (no topic IDs).
fn describe_topic_id<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<String>, LogIdentityError> {
    let refused = |detail: String| LogIdentityError::Refused {
        topic: topic.to_owned(),
        detail,
    };
    let name = CString::new(topic).map_err(|_| refused("the topic name holds a NUL".to_owned()))?;
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = client.native_ptr();
    // SAFETY: every pointer below comes from librdkafka for the client's live handle `rk`, is
    // checked for null before use, and is destroyed by its `Owned` guard after the last use; the
    // result's descriptions are owned by the event and read before it is destroyed.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_new(rk),
            destroy: rd::rd_kafka_queue_destroy,
        };
        let mut names = [name.as_ptr()];
        let topics = Owned {
            ptr: rd::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1),
            destroy: rd::rd_kafka_TopicCollection_destroy,
        };
        let options = Owned {
            ptr: rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            ),
            destroy: rd::rd_kafka_AdminOptions_destroy,
        };
        if queue.ptr.is_null() || topics.ptr.is_null() || options.ptr.is_null() {
            return Err(refused("librdkafka could not build the request".to_owned()));
        }
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        rd::rd_kafka_DescribeTopics(rk, topics.ptr, options.ptr, queue.ptr);
        // The request times out on its own after `timeout`; wait a little longer for its answer.
        let event = Owned {
            ptr: rd::rd_kafka_queue_poll(queue.ptr, timeout_ms.saturating_add(1_000)),
            destroy: rd::rd_kafka_event_destroy,
        };
        if event.ptr.is_null() {
            return Err(LogIdentityError::TimedOut {
                topic: topic.to_owned(),
                timeout,
            });
        }
        let code = rd::rd_kafka_event_error(event.ptr);
        if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let detail = text(rd::rd_kafka_event_error_string(event.ptr));
            if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT {
                return Err(LogIdentityError::TimedOut {
                    topic: topic.to_owned(),
                    timeout,
                });
            }
            return Err(refused(detail));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event.ptr);
        if result.is_null() {
            return Err(refused(
                "the answer is not a DescribeTopics result".to_owned(),
            ));
        }
        let mut count = 0usize;
        let described = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        for i in 0..count {
            let description = *described.add(i);
            if description.is_null() {
                continue;
            }
            let error = rd::rd_kafka_TopicDescription_error(description);
            if !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                return Err(refused(text(rd::rd_kafka_error_string(error))));
            }
            let id = rd::rd_kafka_TopicDescription_topic_id(description);
            if id.is_null()
                || (rd::rd_kafka_Uuid_most_significant_bits(id) == 0
                    && rd::rd_kafka_Uuid_least_significant_bits(id) == 0)
            {
                return Ok(None);
            }
            let id = text(rd::rd_kafka_Uuid_base64str(id));
            return Ok((!id.is_empty()).then_some(id));
        }
        Err(refused("the answer describes no topic".to_owned()))
    }
}
