//! What the log says when the connection to the brokers breaks and comes back: once per change,
//! not once per retry.
//!
//! A broker restarting (a rolling upgrade, a leader moving, a node replaced) is routine, and
//! librdkafka reconnects by itself; but it reports the same failure up to three times per
//! reconnect attempt (its log callback, its error callback, the consumer's poll), from every
//! client of the process, several times a second. Logged as they come, a 10-second restart
//! was a dozen ERROR lines, each of which an operator's alerting takes for a page. So every
//! transport failure of every client of the daemon comes here, and the log says:
//!
//! - **one WARN** when the first failure follows a working connection (what failed, and that
//!   librdkafka reconnects by itself);
//! - **one ERROR** if the failures go on for a minute ([`super::outage::NEEDS_A_PERSON`]) with no working connection
//!   between them: a broker that stays away is for a person (readiness turned false earlier,
//!   through the statistics: `health`);
//! - **one INFO** when a working connection is seen again (the statistics name a broker `UP`),
//!   with how long it was away and how many failures were held back.
//!
//! Everything in between goes to DEBUG, and the metric of consumer errors still counts each.
//! Errors that are not about the connection (an unknown topic, an authorization failure, a
//! record that cannot be read) are not routine and are logged as before.
//!
//! Offset commits have a link of their own ([`commit_failed`], [`commit_succeeded`]): while the
//! group coordinator's broker is down, or the coordinator moves to another broker, every commit
//! fails until the group finds the new one (several a second, each `WaitingForCoordinator` or
//! `NotCoordinator`), and each used to be a WARN: 58 of them for one coordinator killed -9 on
//! three brokers. They are told the same way: one WARN, one INFO when a commit succeeds again,
//! one ERROR after a minute (the group's progress is not being saved). A commit refused for
//! any other reason (authorization, an unknown member after the group moved on) is a WARN each.

use std::sync::Mutex;
use std::time::Instant;

use rdkafka::types::RDKafkaErrorCode;

use super::outage::{Link, Say};

/// Whether a client error is about the connection to the brokers (librdkafka reconnects).
pub(crate) fn is_transport(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::BrokerNotAvailable
                | RDKafkaErrorCode::NetworkException
        )
    )
}

/// Whether a librdkafka log line (its facility) is about a broker being away: a connection
/// failing or closing, requests timing out on it (`REQTMOUT`), the idempotent producer's ID
/// asked again of a coordinator still loading (`GETPID`, "retrying").
pub(crate) fn is_transport_log(facility: &str) -> bool {
    matches!(
        facility,
        "FAIL" | "BROKERFAIL" | "ALLBROKERSDOWN" | "REQTMOUT" | "GETPID"
    )
}

/// The one link of the process: every client's failures count against it.
static LINK: Mutex<Link> = Mutex::new(Link::new());

/// A transport failure of `client` (`consumer`, `dead-letter producer`, ...), said once per
/// change.
pub(crate) fn failed(client: &str, detail: &str) {
    let say = crate::locks::lock(&LINK).failure(Instant::now());
    match say {
        Say::Lost => tracing::warn!(
            client,
            detail,
            "lost the connection to a Kafka broker; librdkafka reconnects by itself (said once until it works again; the retries are at DEBUG)"
        ),
        Say::StillLost { down_for } => tracing::error!(
            client,
            detail,
            down_for = ?down_for,
            "no Kafka broker has answered for a minute: check the brokers and the network"
        ),
        Say::Restored { .. } | Say::Nothing => {
            tracing::debug!(client, detail, "kafka connection failure (held back)")
        }
    }
}

/// A working connection seen: said once after an outage.
pub(crate) fn working() {
    if let Say::Restored {
        down_for,
        held_back,
    } = crate::locks::lock(&LINK).working(Instant::now())
    {
        tracing::info!(
            down_for = ?down_for,
            held_back,
            "the connection to the Kafka brokers works again"
        );
    }
}

/// The one link of the process's offset commits to the group coordinator: one server answers
/// them, so the first acknowledged commit ends an outage (after the last records of a burst
/// there may be no later commit to wait for).
static COMMITS: Mutex<Link> = Mutex::new(Link::with_quiet(std::time::Duration::ZERO));

/// Whether a failed commit is routine while the coordinator or the broker holding it moves or
/// restarts (the group finds it again by itself and the next interval commits).
pub(crate) fn is_coordinator_moving(code: Option<RDKafkaErrorCode>) -> bool {
    is_transport(code)
        || matches!(
            code,
            Some(
                RDKafkaErrorCode::WaitingForCoordinator
                    | RDKafkaErrorCode::NotCoordinator
                    | RDKafkaErrorCode::CoordinatorNotAvailable
                    | RDKafkaErrorCode::CoordinatorLoadInProgress
                    | RDKafkaErrorCode::RequestTimedOut
                    | RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::NotEnoughReplicas
                    | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
            )
        )
}

/// A commit failed (the stored offsets are committed again at the next interval): routine
/// failures said once per outage, any other each time.
pub(crate) fn commit_failed(error: &rdkafka::error::KafkaError) {
    if !is_coordinator_moving(error.rdkafka_error_code()) {
        tracing::warn!(
            error = %error,
            "offset commit failed; the stored offsets are committed again at the next interval"
        );
        return;
    }
    match crate::locks::lock(&COMMITS).failure(Instant::now()) {
        Say::Lost => tracing::warn!(
            error = %error,
            "offset commits fail while the group coordinator is unavailable (a broker restarting, the coordinator moving); the stored offsets are committed again at the next interval (said once until a commit succeeds; the retries are at DEBUG)"
        ),
        Say::StillLost { down_for } => tracing::error!(
            error = %error,
            down_for = ?down_for,
            "no offset commit has succeeded for a minute: the group's progress is not being saved; check the brokers"
        ),
        Say::Restored { .. } | Say::Nothing => {
            tracing::debug!(error = %error, "offset commit failed (held back)")
        }
    }
}

/// A commit the coordinator acknowledged: said once after an outage of commits.
pub(crate) fn commit_succeeded() {
    if let Say::Restored {
        down_for,
        held_back,
    } = crate::locks::lock(&COMMITS).working(Instant::now())
    {
        tracing::info!(
            down_for = ?down_for,
            held_back,
            "offset commits succeed again"
        );
    }
}

/// A client's error callback: a transport failure through the link, anything else an ERROR.
pub(crate) fn client_error(client: &str, error: &rdkafka::error::KafkaError, reason: &str) {
    if is_transport(error.rdkafka_error_code()) {
        failed(client, reason);
    } else {
        tracing::error!(client, error = %error, reason, "kafka client error");
    }
}

/// A client's log callback at its level; a connection failing or closing goes through the
/// link instead.
pub(crate) fn client_log(
    client: &str,
    level: rdkafka::config::RDKafkaLogLevel,
    facility: &str,
    message: &str,
) {
    use rdkafka::config::RDKafkaLogLevel as Level;
    match level {
        Level::Emerg | Level::Alert | Level::Critical | Level::Error | Level::Warning
            if is_transport_log(facility) =>
        {
            failed(client, message);
        }
        Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
            tracing::error!(target: "librdkafka", client, fac = facility, "{message}")
        }
        Level::Warning => tracing::warn!(target: "librdkafka", client, fac = facility, "{message}"),
        Level::Notice | Level::Info => {
            tracing::info!(target: "librdkafka", client, fac = facility, "{message}")
        }
        Level::Debug => tracing::debug!(target: "librdkafka", client, fac = facility, "{message}"),
    }
}

/// The dead-letter producer's context: its connection failures go through the link like the
/// consumer's (librdkafka's default context would log each as an ERROR).
pub struct LinkContext;

impl rdkafka::ClientContext for LinkContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        client_log("dead-letter producer", level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error("dead-letter producer", &error, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connection_errors_are_routine() {
        assert!(is_transport(Some(RDKafkaErrorCode::BrokerTransportFailure)));
        assert!(is_transport(Some(RDKafkaErrorCode::AllBrokersDown)));
        assert!(!is_transport(Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(!is_transport(Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        assert!(!is_transport(None));
        assert!(is_transport_log("FAIL"));
        assert!(is_transport_log("REQTMOUT"));
        assert!(!is_transport_log("PROTOERR"));
    }

    #[test]
    fn a_commit_failing_while_the_coordinator_moves_is_routine_and_nothing_else_is() {
        for code in [
            RDKafkaErrorCode::WaitingForCoordinator,
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert!(is_coordinator_moving(Some(code)), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::UnknownMemberId,
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::OffsetMetadataTooLarge,
        ] {
            assert!(!is_coordinator_moving(Some(code)), "{code:?}");
        }
        assert!(!is_coordinator_moving(None));
    }
}
