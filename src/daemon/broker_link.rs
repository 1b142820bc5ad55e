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

/// Whether a librdkafka log line (its facility) is about a connection failing or closing.
pub(crate) fn is_transport_log(facility: &str) -> bool {
    matches!(facility, "FAIL" | "BROKERFAIL" | "ALLBROKERSDOWN")
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
        assert!(!is_transport_log("PROTOERR"));
    }
}
