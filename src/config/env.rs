//! The environment and the command line over the file, in that order (`Config::load`).
//!
//! [`ENV`] is the one list of the `MATERIALIZER_*` variables: each name with what it sets, so a
//! variable cannot be documented and forgotten, or read and undocumented.

use std::path::PathBuf;

use super::{invalid, split_list, Config, ConfigError, Overrides};

/// What one variable does to the configuration, given its value.
pub type Setter = fn(&mut Config, String) -> Result<(), ConfigError>;

/// Every variable [`Config::apply_env`] reads, in the order applied, with what it sets.
pub const ENV: &[(&str, Setter)] = &[
    ("MATERIALIZER_STORE", |c, v| {
        c.store.backend = v.parse()?;
        Ok(())
    }),
    ("MATERIALIZER_MEMORY_SNAPSHOT", |c, v| {
        c.store.memory.snapshot = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_REDIS_URL", |c, v| {
        c.store.redis.url = v;
        Ok(())
    }),
    ("MATERIALIZER_REDIS_PASSWORD_FILE", |c, v| {
        c.store.redis.password_file = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_NODES", |c, v| {
        c.store.scylla.nodes = split_list(&v);
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_KEYSPACE", |c, v| {
        c.store.scylla.keyspace = v;
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_USERNAME", |c, v| {
        c.store.scylla.username = Some(v);
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_PASSWORD", |c, v| {
        c.store.scylla.password = Some(v);
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_PASSWORD_FILE", |c, v| {
        c.store.scylla.password_file = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_LOCAL_DC", |c, v| {
        c.store.scylla.local_dc = v;
        Ok(())
    }),
    // A TLS file given in the environment turns TLS on (paths of mounted secrets).
    ("MATERIALIZER_SCYLLA_TLS_CA_FILE", |c, v| {
        c.store
            .scylla
            .tls
            .get_or_insert_with(Default::default)
            .ca_file = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_TLS_CERT_FILE", |c, v| {
        c.store
            .scylla
            .tls
            .get_or_insert_with(Default::default)
            .cert_file = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_SCYLLA_TLS_KEY_FILE", |c, v| {
        c.store
            .scylla
            .tls
            .get_or_insert_with(Default::default)
            .key_file = Some(PathBuf::from(v));
        Ok(())
    }),
    ("MATERIALIZER_KAFKA_BROKERS", |c, v| {
        c.kafka.brokers = v;
        Ok(())
    }),
    ("MATERIALIZER_KAFKA_TOPIC", |c, v| {
        c.kafka.topic = v;
        Ok(())
    }),
    ("MATERIALIZER_KAFKA_GROUP_ID", |c, v| {
        c.kafka.group_id = v;
        Ok(())
    }),
    ("MATERIALIZER_KAFKA_DLQ_TOPIC", |c, v| {
        c.kafka.dlq_topic = v;
        Ok(())
    }),
    ("MATERIALIZER_HTTP_LISTEN", |c, v| {
        c.http.listen = v;
        Ok(())
    }),
    ("MATERIALIZER_LOG_FORMAT", |c, v| {
        c.log.format = v;
        Ok(())
    }),
    ("MATERIALIZER_INGEST_STRICT_FIELDS", |c, v| {
        c.ingest.strict_fields = match v.as_str() {
            "true" | "1" => true,
            "false" | "0" => false,
            other => {
                return Err(invalid(
                    "ingest.strict_fields",
                    format!("MATERIALIZER_INGEST_STRICT_FIELDS={other:?} is not true or false"),
                ))
            }
        };
        Ok(())
    }),
];

/// Prefix of the environment variables that set `[kafka.properties]`:
/// `MATERIALIZER_KAFKA_PROPERTY_SASL_PASSWORD=...` sets `sasl.password` (lowercased, `_` -> `.`).
pub const KAFKA_PROPERTY_ENV_PREFIX: &str = "MATERIALIZER_KAFKA_PROPERTY_";

impl Config {
    /// Applies the variables of [`ENV`] that `get` knows, in its order.
    pub(crate) fn apply_env(
        &mut self,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for (name, set) in ENV {
            if let Some(value) = get(name) {
                set(self, value)?;
            }
        }
        Ok(())
    }

    /// Applies `MATERIALIZER_KAFKA_PROPERTY_<NAME>` variables to `[kafka.properties]`, so TLS
    /// and SASL secrets never need to be in a file.
    pub(crate) fn apply_env_properties(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) {
        for (name, value) in vars {
            if let Some(rest) = name.strip_prefix(KAFKA_PROPERTY_ENV_PREFIX) {
                if !rest.is_empty() {
                    let key = rest.to_ascii_lowercase().replace('_', ".");
                    self.kafka.properties.insert(key, value);
                }
            }
        }
    }

    pub(crate) fn apply_overrides(&mut self, overrides: &Overrides) {
        if let Some(backend) = overrides.backend {
            self.store.backend = backend;
        }
        if let Some(path) = &overrides.memory_snapshot {
            self.store.memory.snapshot = Some(path.clone());
        }
        if let Some(url) = &overrides.redis_url {
            self.store.redis.url = url.clone();
        }
        if let Some(nodes) = &overrides.scylla_nodes {
            self.store.scylla.nodes = nodes.clone();
        }
        if let Some(keyspace) = &overrides.scylla_keyspace {
            self.store.scylla.keyspace = keyspace.clone();
        }
    }
}
