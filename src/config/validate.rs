//! Validation: every field and the relations between them, each refusal naming its key.

use std::net::SocketAddr;

use super::{
    invalid, redact_url, split_list, Config, ConfigError, CONSISTENCY_NAMES, MAX_WAIT_REPLICAS,
    OWNED_KAFKA_PROPERTIES, SERIAL_CONSISTENCY_NAMES, WEAK_CONSISTENCY_NAMES,
};

impl Config {
    /// Checks every field and the relations between them, section by section; the first problem
    /// is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.retention.policy().validate()?;
        self.validate_redis()?;
        self.validate_scylla()?;
        self.validate_kafka()?;
        self.validate_log()?;
        self.validate_http()
    }

    /// `[store.redis]`: URLs, timeouts, WAIT, the patrol and the key prefix.
    fn validate_redis(&self) -> Result<(), ConfigError> {
        let redis = &self.store.redis;
        for (key, url) in std::iter::once(("store.redis.url", &redis.url)).chain(
            redis
                .cluster_nodes
                .iter()
                .map(|n| ("store.redis.cluster_nodes", n)),
        ) {
            let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
                .iter()
                .any(|scheme| url.starts_with(scheme));
            if !scheme_ok {
                return Err(invalid(
                    key,
                    format!(
                        "{} must start with redis://, rediss:// or redis+unix://",
                        redact_url(url)
                    ),
                ));
            }
        }
        in_range(
            "store.redis.connect_timeout_ms",
            redis.connect_timeout_ms,
            1,
            600_000,
        )?;
        in_range(
            "store.redis.command_timeout_ms",
            redis.command_timeout_ms,
            1,
            600_000,
        )?;
        if redis.wait_replicas > MAX_WAIT_REPLICAS {
            return Err(invalid(
                "store.redis.wait_replicas",
                format!(
                    "{} is more than {MAX_WAIT_REPLICAS} replicas",
                    redis.wait_replicas
                ),
            ));
        }
        // 0 would make WAIT block forever.
        in_range(
            "store.redis.wait_timeout_ms",
            redis.wait_timeout_ms,
            1,
            600_000,
        )?;
        if redis.wait_replicas > 0 && redis.wait_timeout_ms >= redis.command_timeout_ms {
            // At or above the command timeout the client would give up first and never read
            // the acknowledgement count.
            return Err(invalid(
                "store.redis.wait_timeout_ms",
                format!(
                    "{} must be below store.redis.command_timeout_ms ({}) when wait_replicas > 0",
                    redis.wait_timeout_ms, redis.command_timeout_ms
                ),
            ));
        }
        if redis.patrol_rate_per_second == 0 {
            return Err(invalid(
                "store.redis.patrol_rate_per_second",
                "must be at least 1",
            ));
        }
        if redis.key_prefix.is_empty()
            || redis.key_prefix.len() > 64
            || !redis
                .key_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
        {
            return Err(invalid(
                "store.redis.key_prefix",
                format!(
                    "{:?} must be 1..=64 characters of [A-Za-z0-9._:-]",
                    redis.key_prefix
                ),
            ));
        }
        Ok(())
    }

    /// `[store.scylla]`: nodes, keyspace, consistency, credentials, limits and TLS files.
    fn validate_scylla(&self) -> Result<(), ConfigError> {
        let scylla = &self.store.scylla;
        if scylla.nodes.is_empty() {
            return Err(invalid(
                "store.scylla.nodes",
                "at least one host:port is required",
            ));
        }
        for node in &scylla.nodes {
            validate_host_port("store.scylla.nodes", node)?;
        }
        let keyspace_ok = !scylla.keyspace.is_empty()
            && scylla.keyspace.len() <= 48
            && scylla
                .keyspace
                .starts_with(|c: char| c.is_ascii_alphabetic())
            && scylla
                .keyspace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !keyspace_ok {
            return Err(invalid(
                "store.scylla.keyspace",
                format!(
                    "{:?} must be 1..=48 characters of [A-Za-z0-9_] starting with a letter",
                    scylla.keyspace
                ),
            ));
        }

        let consistency = scylla.consistency.as_str();
        if !CONSISTENCY_NAMES.contains(&consistency) {
            let why = if WEAK_CONSISTENCY_NAMES.contains(&consistency) {
                "is below LOCAL_QUORUM: a write it acknowledges can be lost with one replica, and \
                 a record counts as final only once durable (SPEC 7)"
            } else if consistency == "EACH_QUORUM" {
                "is for writes only in CQL, and this level also serves every read"
            } else {
                "is not a CQL consistency level"
            };
            return Err(invalid(
                "store.scylla.consistency",
                format!(
                    "{consistency:?} {why}; use one of {}",
                    CONSISTENCY_NAMES.join(", ")
                ),
            ));
        }
        if !SERIAL_CONSISTENCY_NAMES.contains(&scylla.serial_consistency.as_str()) {
            return Err(invalid(
                "store.scylla.serial_consistency",
                format!(
                    "{:?} is not a serial consistency: the commit point's conditions need SERIAL or \
                     LOCAL_SERIAL",
                    scylla.serial_consistency
                ),
            ));
        }
        if !scylla.replication.trim_start().starts_with('{') {
            return Err(invalid(
                "store.scylla.replication",
                "must be a CQL replication map such as {'class': 'NetworkTopologyStrategy', 'dc1': 3}",
            ));
        }
        if scylla.username.is_some() != scylla.password.is_some() {
            return Err(invalid(
                "store.scylla.username",
                "username and password go together (MATERIALIZER_SCYLLA_USERNAME / _PASSWORD)",
            ));
        }
        in_range(
            "store.scylla.connect_timeout_ms",
            scylla.connect_timeout_ms,
            1,
            600_000,
        )?;
        in_range(
            "store.scylla.max_in_flight_appends",
            scylla.max_in_flight_appends as u64,
            1,
            super::MAX_SCYLLA_APPENDS_IN_FLIGHT as u64,
        )?;
        if scylla.local_dc.len() > 256 || scylla.local_dc.chars().any(char::is_control) {
            return Err(invalid(
                "store.scylla.local_dc",
                "must be a datacenter name (at most 256 printable characters)",
            ));
        }
        if let Some(tls) = scylla.tls.as_ref().filter(|t| t.enabled) {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(invalid(
                    "store.scylla.tls.cert_file",
                    "cert_file and key_file go together (a client certificate needs its key)",
                ));
            }
            for (key, path) in [
                ("store.scylla.tls.ca_file", &tls.ca_file),
                ("store.scylla.tls.cert_file", &tls.cert_file),
                ("store.scylla.tls.key_file", &tls.key_file),
            ] {
                if let Some(path) = path {
                    if let Err(e) = std::fs::File::open(path) {
                        return Err(invalid(key, format!("cannot read {}: {e}", path.display())));
                    }
                }
            }
        }
        Ok(())
    }

    /// `[kafka]`: brokers, topics, the drain against the poll interval, the window and the owned
    /// properties.
    fn validate_kafka(&self) -> Result<(), ConfigError> {
        let kafka = &self.kafka;
        if kafka.brokers.trim().is_empty() {
            return Err(invalid(
                "kafka.brokers",
                "at least one host:port is required",
            ));
        }
        for broker in split_list(&kafka.brokers) {
            validate_host_port("kafka.brokers", &broker)?;
        }
        for (key, value) in [
            ("kafka.topic", &kafka.topic),
            ("kafka.dlq_topic", &kafka.dlq_topic),
        ] {
            validate_topic(key, value)?;
        }
        // The poll thread stops at the start of a drain; past librdkafka's max.poll.interval.ms
        // the member is evicted and the final commit fails. Keep the drain inside it.
        let max_poll_ms: u64 = kafka
            .properties
            .get("max.poll.interval.ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(300_000);
        if kafka.shutdown_deadline_ms + 10_000 > max_poll_ms {
            return Err(invalid(
                "kafka.shutdown_deadline_ms",
                format!(
                    "{} leaves less than 10 s before max.poll.interval.ms ({max_poll_ms}): the consumer would be evicted during the drain and the final commit lost",
                    kafka.shutdown_deadline_ms
                ),
            ));
        }
        if kafka.topic == kafka.dlq_topic {
            return Err(invalid(
                "kafka.dlq_topic",
                "must differ from kafka.topic: dead letters would be consumed again",
            ));
        }
        if kafka.group_id.trim().is_empty() {
            return Err(invalid("kafka.group_id", "must not be empty"));
        }
        for (key, value, low, high) in [
            (
                "kafka.max_in_flight_records",
                kafka.max_in_flight_records as u64,
                1,
                100_000,
            ),
            (
                "kafka.max_record_bytes",
                kafka.max_record_bytes as u64,
                64,
                64 << 20,
            ),
            (
                "kafka.max_in_flight_bytes",
                kafka.max_in_flight_bytes as u64,
                1 << 20,
                16 << 30,
            ),
            (
                "kafka.dlq_max_message_bytes",
                kafka.dlq_max_message_bytes as u64,
                // Room for the headers and a useful excerpt; librdkafka's own ceiling.
                64 << 10,
                1_000_000_000,
            ),
            (
                "kafka.commit_interval_ms",
                kafka.commit_interval_ms,
                10,
                600_000,
            ),
            (
                "kafka.growth_allowance_ms",
                kafka.growth_allowance_ms,
                0,
                3_600_000,
            ),
            ("kafka.retry_initial_ms", kafka.retry_initial_ms, 1, 600_000),
            ("kafka.retry_max_ms", kafka.retry_max_ms, 1, 3_600_000),
            (
                "kafka.shutdown_deadline_ms",
                kafka.shutdown_deadline_ms,
                0,
                3_600_000,
            ),
            (
                "kafka.statistics_interval_ms",
                kafka.statistics_interval_ms,
                100,
                600_000,
            ),
            (
                "kafka.stalled_after_ms",
                kafka.stalled_after_ms,
                1000,
                3_600_000,
            ),
            (
                "kafka.assignment_timeout_ms",
                kafka.assignment_timeout_ms,
                1000,
                3_600_000,
            ),
            (
                "kafka.max_blocked_mailboxes",
                kafka.max_blocked_mailboxes,
                1,
                1_000_000,
            ),
        ] {
            in_range(key, value, low, high)?;
        }
        if kafka.retry_max_ms < kafka.retry_initial_ms {
            return Err(invalid(
                "kafka.retry_max_ms",
                "must be at least kafka.retry_initial_ms",
            ));
        }
        for key in kafka.properties.keys() {
            if OWNED_KAFKA_PROPERTIES.contains(&key.as_str()) {
                return Err(invalid(
                    &format!("kafka.properties.\"{key}\""),
                    "is set by the daemon itself (use kafka.brokers / kafka.group_id, or leave it out)",
                ));
            }
        }
        Ok(())
    }

    /// `[log]`.
    fn validate_log(&self) -> Result<(), ConfigError> {
        if !["text", "json"].contains(&self.log.format.as_str()) {
            return Err(invalid(
                "log.format",
                format!("{:?} is not text or json", self.log.format),
            ));
        }
        Ok(())
    }

    /// `[http]`.
    fn validate_http(&self) -> Result<(), ConfigError> {
        self.http
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("{:?}: {e}", self.http.listen)))?;
        in_range(
            "http.liveness_timeout_ms",
            self.http.liveness_timeout_ms,
            1_000,
            3_600_000,
        )?;
        Ok(())
    }
}

/// The one range check: `value` within `low..=high`, or a refusal naming `key` and the range.
fn in_range(key: &str, value: u64, low: u64, high: u64) -> Result<(), ConfigError> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(invalid(key, format!("{value} is outside {low}..={high}")))
    }
}

fn validate_host_port(key: &str, value: &str) -> Result<(), ConfigError> {
    let ok = value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(invalid(key, format!("{value:?} is not host:port")))
    }
}

fn validate_topic(key: &str, topic: &str) -> Result<(), ConfigError> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{topic:?} is not a Kafka topic name (1..=249 of [A-Za-z0-9._-])"),
        ))
    }
}
