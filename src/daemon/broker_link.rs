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
//! - **one ERROR** if the failures go on for [`NEEDS_A_PERSON`] with no working connection
//!   between them: a broker that stays away is for a person (readiness turned false earlier,
//!   through the statistics: `health`);
//! - **one INFO** when a working connection is seen again (the statistics name a broker `UP`),
//!   with how long it was away and how many failures were held back.
//!
//! Everything in between goes to DEBUG, and the metric of consumer errors still counts each.
//! Errors that are not about the connection (an unknown topic, an authorization failure, a
//! record that cannot be read) are not routine and are logged as before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::types::RDKafkaErrorCode;

/// How long the brokers may stay unreachable before it is for a person.
pub(crate) const NEEDS_A_PERSON: Duration = Duration::from_secs(60);

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

/// What the log says about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Say {
    /// The connection broke after working.
    Lost,
    /// It has stayed broken for [`NEEDS_A_PERSON`].
    StillLost { down_for: Duration },
    /// It works again.
    Restored { down_for: Duration, held_back: u64 },
    /// Nothing above DEBUG.
    Nothing,
}

/// The state of the process's connection to the brokers, as the log tells it.
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// Since when failures have come with no working connection between them.
    down_since: Option<Instant>,
    /// The ERROR was said for this outage.
    escalated: bool,
    /// Failures logged at DEBUG in this outage.
    held_back: u64,
}

impl Link {
    /// A transport failure of any client at `now`.
    pub(crate) fn failure(&mut self, now: Instant) -> Say {
        let Some(since) = self.down_since else {
            self.down_since = Some(now);
            self.escalated = false;
            self.held_back = 0;
            return Say::Lost;
        };
        let down_for = now.saturating_duration_since(since);
        if !self.escalated && down_for >= NEEDS_A_PERSON {
            self.escalated = true;
            return Say::StillLost { down_for };
        }
        self.held_back += 1;
        Say::Nothing
    }

    /// A working connection seen at `now` (a broker `UP` in the statistics).
    pub(crate) fn working(&mut self, now: Instant) -> Say {
        match self.down_since.take() {
            Some(since) => Say::Restored {
                down_for: now.saturating_duration_since(since),
                held_back: self.held_back,
            },
            None => Say::Nothing,
        }
    }
}

/// The one link of the process: every client's failures count against it.
static LINK: Mutex<Link> = Mutex::new(Link {
    down_since: None,
    escalated: false,
    held_back: 0,
});

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
    fn a_restart_is_one_warning_then_one_info_however_many_retries() {
        let mut link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        for ms in (100..10_000).step_by(100) {
            assert_eq!(link.failure(t0 + Duration::from_millis(ms)), Say::Nothing);
        }
        assert_eq!(
            link.working(t0 + Duration::from_secs(12)),
            Say::Restored {
                down_for: Duration::from_secs(12),
                held_back: 99
            }
        );
        assert_eq!(link.working(t0 + Duration::from_secs(13)), Say::Nothing);
        // The next outage is a change again.
        assert_eq!(link.failure(t0 + Duration::from_secs(20)), Say::Lost);
    }

    #[test]
    fn an_outage_of_a_minute_is_said_once_as_an_error() {
        let mut link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON - Duration::from_millis(1)),
            Say::Nothing
        );
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON),
            Say::StillLost {
                down_for: NEEDS_A_PERSON
            }
        );
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON * 2),
            Say::Nothing,
            "once per outage"
        );
    }

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
