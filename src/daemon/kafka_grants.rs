//! The Kafka ACLs the daemon needs, and whether the configured principal holds them, asked
//! without producing, consuming, joining or committing anything (docs/grants.md).
//!
//! The daemon needs (every resource LITERAL, on the dispatch topic `T`, the dead-letter topic
//! `D` and the group `G`):
//!
//! - `Read` on topic `T`: its consumer fetches it (`Describe`, which metadata, the topic ID and
//!   the offsets need, is implied);
//! - `DescribeConfigs` on topic `T`: the compaction watch reads its `cleanup.policy`
//!   (`daemon::topic_policy`; without it repairs are refused);
//! - `Read` on group `G`: its consumer joins the group and commits (implies `Describe`);
//! - `Write` on topic `D`: the idempotent dead-letter producer (on Kafka >= 3.0 `Write` on a
//!   topic is what its producer ID needs, no cluster `IdempotentWrite`).
//!
//! **How it is asked.** The broker says which operations the asking principal may perform on a
//! resource when a describe asks for them (KIP-430, "include authorized operations"): the
//! authorizer itself answers, with every implication, DENY rule and host restriction applied,
//! so nothing has to be tried. rdkafka 0.38 does not wrap DescribeTopics or
//! DescribeConsumerGroups with that option, so librdkafka 2.12's C functions are called on the
//! client's own handle, with a queue of their own, waiting for the one result (DescribeTopics by
//! `kafka_ffi::describe_topics`, which the log's identity shares; DescribeConsumerGroups here). Every
//! object it creates is destroyed by an [`Owned`] guard on every path out; what a result holds
//! (descriptions, operation lists, error strings) belongs to its event and is copied out before
//! the event is destroyed. The operation lists are read as the C enum's integer values, never as
//! Rust enums, so an operation a later broker adds is only an unknown number.
//!
//! A resource the principal may not even describe is refused as a whole
//! (`TOPIC_AUTHORIZATION_FAILED`, `GROUP_AUTHORIZATION_FAILED`): then no operation implying
//! `Describe` (`Read`, `Write`) is granted either, and the others cannot be told.
//!
//! **The running daemon never describes its group.** DescribeConsumerGroups goes to the group
//! coordinator, and librdkafka 2.12 aborts the whole process when the connection to the
//! coordinator drops during such a request (a use-after-free in `rd_kafka_admin_coord_request`'s
//! error path, librdkafka issue #4605, fix proposed in PR #5397): the daemon, re-asking every
//! 30 s, was killed by `Assertion 'eonce->refcnt > 0' failed` when two of three brokers went
//! down (tests/daemon_broker_cluster.rs). So the daemon's probe asks only DescribeTopics (sent to
//! any broker) and learns `Read` on the group from the group itself ([`GroupAnswers`]): a
//! `GROUP_AUTHORIZATION_FAILED` from the consumer (joining, fetching offsets, committing) makes
//! it missing, an assignment or an acknowledged commit makes it held again. `check-config`, a
//! process of a few seconds, still asks both.

#![allow(unsafe_code)] // the C bindings of DescribeConsumerGroups (DescribeTopics is kafka_ffi's): each unsafe block says why it is sound

use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use super::kafka_ffi::{operation_values, options, resource_error, wait, AdminError, Owned};

use crate::config::KafkaConfig;

/// An operation of Kafka's ACL model, spelled as `kafka-acls --operation` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Operation {
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    /// librdkafka's `rd_kafka_AclOperation_t` value; `None` for ANY, ALL, UNKNOWN and values
    /// this build does not know.
    fn from_c(value: u32) -> Option<Self> {
        Some(match value {
            3 => Self::Read,
            4 => Self::Write,
            5 => Self::Create,
            6 => Self::Delete,
            7 => Self::Alter,
            8 => Self::Describe,
            9 => Self::ClusterAction,
            10 => Self::DescribeConfigs,
            11 => Self::AlterConfigs,
            12 => Self::IdempotentWrite,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Read => "Read",
            Self::Write => "Write",
            Self::Create => "Create",
            Self::Delete => "Delete",
            Self::Alter => "Alter",
            Self::Describe => "Describe",
            Self::ClusterAction => "ClusterAction",
            Self::DescribeConfigs => "DescribeConfigs",
            Self::AlterConfigs => "AlterConfigs",
            Self::IdempotentWrite => "IdempotentWrite",
        }
    }

    /// Whether holding this operation implies `Describe` (Kafka's ACL implication): a resource
    /// refused as a whole lacks it.
    fn implies_describe(self) -> bool {
        matches!(
            self,
            Self::Read | Self::Write | Self::Delete | Self::Alter | Self::Describe
        )
    }
}

/// The kind of a resource an ACL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    Topic,
    Group,
}

impl ResourceKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Topic => "topic",
            Self::Group => "group",
        }
    }
}

/// One ACL the daemon needs: an operation on a LITERAL resource, and what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acl {
    pub kind: ResourceKind,
    pub name: String,
    pub operation: Operation,
    /// What fails without it.
    pub without: &'static str,
}

impl Acl {
    /// `Read on group mailbox-materializer`.
    pub(crate) fn named(&self) -> String {
        format!(
            "{} on {} {}",
            self.operation.as_str(),
            self.kind.as_str(),
            self.name
        )
    }

    /// The command that grants it, whoever the principal is.
    pub(crate) fn fix(&self) -> String {
        format!(
            "kafka-acls --add --allow-principal User:<you> --operation {} --{} {}",
            self.operation.as_str(),
            self.kind.as_str(),
            self.name
        )
    }
}

/// The ACLs the daemon (`materializer run`) needs with `kafka`'s topics and group.
pub(crate) fn daemon_acls(kafka: &KafkaConfig) -> Vec<Acl> {
    vec![
        Acl {
            kind: ResourceKind::Topic,
            name: kafka.topic.clone(),
            operation: Operation::Read,
            without: "the daemon could not consume the dispatch topic",
        },
        Acl {
            kind: ResourceKind::Topic,
            name: kafka.topic.clone(),
            operation: Operation::DescribeConfigs,
            without: "nobody can tell whether the topic is compacted, and every repair is refused",
        },
        Acl {
            kind: ResourceKind::Group,
            name: kafka.group_id.clone(),
            operation: Operation::Read,
            without: "the daemon could not join its consumer group nor commit offsets",
        },
        Acl {
            kind: ResourceKind::Topic,
            name: kafka.dlq_topic.clone(),
            operation: Operation::Write,
            without: "dead letters could not be written, and records needing one would wait",
        },
    ]
}

/// What the broker said of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Authorized {
    /// The operations the principal may perform on it.
    Operations(Vec<Operation>),
    /// The broker answered without the list (a broker older than Kafka 2.3).
    NotReported,
    /// The principal may not describe it (`TOPIC_AUTHORIZATION_FAILED`,
    /// `GROUP_AUTHORIZATION_FAILED`): the broker's error text.
    Refused(String),
    /// Another error for this resource (e.g. the topic does not exist): the error name and text.
    Error(String),
}

/// Whether one ACL is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Granted,
    Missing,
    /// Cannot be told, because of the resource itself (it does not exist, or the client may not
    /// describe it and the operation does not imply Describe): why.
    Hidden(String),
    /// The broker does not report the operations it grants (older than Kafka 2.3).
    NotReported,
}

impl Authorized {
    /// Whether `operation` is granted on the resource this describes.
    pub(crate) fn verdict(&self, operation: Operation) -> Verdict {
        match self {
            Self::Operations(granted) if granted.contains(&operation) => Verdict::Granted,
            Self::Operations(_) => Verdict::Missing,
            Self::Refused(_) if operation.implies_describe() => Verdict::Missing,
            Self::Refused(e) => Verdict::Hidden(format!(
                "it cannot be described ({e}), so its other grants cannot be read"
            )),
            Self::NotReported => Verdict::NotReported,
            Self::Error(e) => Verdict::Hidden(e.clone()),
        }
    }
}

/// `Read` on the group as the group's own answers to the daemon's consumer tell it (the module's
/// doc says why the daemon does not describe its group). One per process, shared by the
/// consumer's callbacks and the readiness probe.
pub(crate) struct GroupAnswers;

/// The last answer: `true` after a `GROUP_AUTHORIZATION_FAILED` not followed by an assignment
/// or an acknowledged commit.
static GROUP_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl GroupAnswers {
    /// An error the consumer reported (a poll, the error callback, a commit).
    pub(crate) fn error(code: Option<rdkafka::types::RDKafkaErrorCode>) {
        if code == Some(rdkafka::types::RDKafkaErrorCode::GroupAuthorizationFailed) {
            GROUP_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The group assigned partitions or acknowledged a commit: the principal reads it.
    pub(crate) fn accepted() {
        GROUP_REFUSED.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The group as [`verdicts`] takes it: refused, or nothing known against `Read` (and
    /// `Describe`, which it implies).
    pub(crate) fn authorized() -> Authorized {
        if GROUP_REFUSED.load(std::sync::atomic::Ordering::Relaxed) {
            Authorized::Refused(
                "GROUP_AUTHORIZATION_FAILED: the group refused the consumer".to_owned(),
            )
        } else {
            Authorized::Operations(vec![Operation::Read, Operation::Describe])
        }
    }
}

/// Asks the broker which operations the principal of `client` may perform on each of `topics`
/// (one DescribeTopics request, to any broker), bounded by `timeout`. Blocks (call it from a
/// blocking context). `Err`: no answer at all.
pub(crate) fn authorized_topics<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<Authorized>, String> {
    describe_topics(client, topics, timeout)
}

/// Asks the broker which operations the principal of `client` may perform on each of `topics`
/// and on `group`: one DescribeTopics and one DescribeConsumerGroups request, each bounded by
/// `timeout`. Blocks (call it from a blocking context). `Err`: no answer at all.
pub(crate) fn authorized<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    group: &str,
    timeout: Duration,
) -> Result<(Vec<Authorized>, Authorized), String> {
    let topics = describe_topics(client, topics, timeout)?;
    let group = describe_group(client, group, timeout)?;
    Ok((topics, group))
}

/// For each ACL of `acls`, whether it is held, from [`authorized`]'s answers (`topics` in the
/// order of `topic_names`).
pub(crate) fn verdicts(
    acls: &[Acl],
    topic_names: &[&str],
    topics: &[Authorized],
    group: &Authorized,
) -> Vec<Verdict> {
    acls.iter()
        .map(|acl| {
            let described = match acl.kind {
                ResourceKind::Group => Some(group),
                ResourceKind::Topic => topic_names
                    .iter()
                    .position(|t| *t == acl.name)
                    .and_then(|i| topics.get(i)),
            };
            match described {
                Some(described) => described.verdict(acl.operation),
                None => Verdict::Hidden(format!("{} was not described", acl.name)),
            }
        })
        .collect()
}

/// What the broker said of a resource, from its error and its operations
/// (`kafka_ffi::describe_topics`, `describe_group`): refused (no Describe), another error, the
/// operations granted, or none reported.
fn authorized_of(error: Option<(String, String)>, operations: Option<Vec<u32>>) -> Authorized {
    if let Some((name, text)) = error {
        let detail = format!("{name}: {text}");
        return if name.ends_with("AUTHORIZATION_FAILED") {
            Authorized::Refused(detail)
        } else {
            Authorized::Error(detail)
        };
    }
    let Some(values) = operations else {
        return Authorized::NotReported;
    };
    let mut granted: Vec<Operation> = values
        .iter()
        .filter_map(|v| Operation::from_c(*v))
        .collect();
    granted.sort_unstable();
    granted.dedup();
    Authorized::Operations(granted)
}

/// An admin request's failure as the ACL check words it.
fn failed(what: &str, timeout: Duration, error: AdminError) -> String {
    match error {
        AdminError::TimedOut => format!("{what}: no answer within {} ms", timeout.as_millis()),
        AdminError::Failed(detail) => format!("{what}: {detail}"),
    }
}

/// DescribeTopics with authorized operations, one answer per topic in the order asked.
fn describe_topics<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<Authorized>, String> {
    let answers = super::kafka_ffi::describe_topics(client, topics, timeout, true)
        .map_err(|e| failed("DescribeTopics", timeout, e))?;
    Ok(topics
        .iter()
        .map(|topic| {
            answers.iter().find(|a| a.name == *topic).map_or_else(
                || Authorized::Error("the answer does not describe it".to_owned()),
                |a| authorized_of(a.error.clone(), a.operations.clone()),
            )
        })
        .collect())
}

/// DescribeConsumerGroups of one group with authorized operations.
fn describe_group<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    timeout: Duration,
) -> Result<Authorized, String> {
    let name = CString::new(group).map_err(|_| format!("the group name {group:?} holds a NUL"))?;
    let mut names = [name.as_ptr()];
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = client.native_ptr();
    // SAFETY: as in `kafka_ffi::describe_topics`: librdkafka objects of the live handle `rk`, checked for
    // null, destroyed by their guards after the last use; the group name outlives the call that
    // copies it; the description belongs to the event and is read before it is destroyed.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_new(rk),
            destroy: rd::rd_kafka_queue_destroy,
        };
        if queue.ptr.is_null() {
            return Err(
                "DescribeConsumerGroups: librdkafka could not build the request".to_owned(),
            );
        }
        let options = options(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
            timeout_ms,
            true,
        )
        .map_err(|e| failed("DescribeConsumerGroups", timeout, e))?;
        rd::rd_kafka_DescribeConsumerGroups(
            rk,
            names.as_mut_ptr(),
            names.len(),
            options.ptr,
            queue.ptr,
        );
        let event = wait(queue.ptr, timeout_ms)
            .map_err(|e| failed("DescribeConsumerGroups", timeout, e))?;
        let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event.ptr);
        if result.is_null() {
            return Err(
                "DescribeConsumerGroups: the answer is not a DescribeConsumerGroups result"
                    .to_owned(),
            );
        }
        let mut count = 0usize;
        let described = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
        for i in 0..count {
            let description = *described.add(i);
            if description.is_null() {
                continue;
            }
            let error = resource_error(rd::rd_kafka_ConsumerGroupDescription_error(description));
            if error.is_some() {
                return Ok(authorized_of(error, None));
            }
            let mut n = 0usize;
            let ops =
                rd::rd_kafka_ConsumerGroupDescription_authorized_operations(description, &mut n);
            return Ok(authorized_of(None, operation_values(ops, n)));
        }
        Err("DescribeConsumerGroups: the answer describes no group".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka() -> KafkaConfig {
        KafkaConfig {
            topic: "dispatch".to_owned(),
            dlq_topic: "dispatch.dlq".to_owned(),
            group_id: "mailbox-materializer".to_owned(),
            ..KafkaConfig::default()
        }
    }

    #[test]
    fn the_daemon_needs_four_acls_each_with_its_fix() {
        let acls = daemon_acls(&kafka());
        let named: Vec<String> = acls.iter().map(Acl::named).collect();
        assert_eq!(
            named,
            [
                "Read on topic dispatch",
                "DescribeConfigs on topic dispatch",
                "Read on group mailbox-materializer",
                "Write on topic dispatch.dlq",
            ]
        );
        assert_eq!(
            acls[2].fix(),
            "kafka-acls --add --allow-principal User:<you> --operation Read --group mailbox-materializer"
        );
        assert_eq!(
            acls[3].fix(),
            "kafka-acls --add --allow-principal User:<you> --operation Write --topic dispatch.dlq"
        );
    }

    #[test]
    fn a_refused_resource_lacks_what_implies_describe_and_hides_the_rest() {
        let refused = Authorized::Refused("TOPIC_AUTHORIZATION_FAILED: no".to_owned());
        assert_eq!(refused.verdict(Operation::Read), Verdict::Missing);
        assert_eq!(refused.verdict(Operation::Write), Verdict::Missing);
        assert!(matches!(
            refused.verdict(Operation::DescribeConfigs),
            Verdict::Hidden(_)
        ));
        let described = Authorized::Operations(vec![Operation::Describe, Operation::Read]);
        assert_eq!(described.verdict(Operation::Read), Verdict::Granted);
        assert_eq!(described.verdict(Operation::Write), Verdict::Missing);
        assert_eq!(
            Authorized::NotReported.verdict(Operation::Read),
            Verdict::NotReported
        );
    }

    #[test]
    fn verdicts_follow_the_resource_each_acl_names() {
        let k = kafka();
        let acls = daemon_acls(&k);
        let names = [k.topic.as_str(), k.dlq_topic.as_str()];
        let topics = [
            Authorized::Operations(vec![Operation::Read, Operation::Describe]),
            Authorized::Operations(vec![Operation::Describe, Operation::Write]),
        ];
        let group = Authorized::Refused("GROUP_AUTHORIZATION_FAILED".to_owned());
        assert_eq!(
            verdicts(&acls, &names, &topics, &group),
            [
                Verdict::Granted,
                Verdict::Missing,
                Verdict::Missing,
                Verdict::Granted
            ]
        );
    }
}
