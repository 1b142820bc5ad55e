//! Configuration: TOML files (see `config/materializer.example.toml`), then environment
//! overrides, then command-line overrides, then validation.
//!
//! Every section and field has a default, so an empty file (or none) is a working memory-store
//! configuration. Unknown keys are refused so a typo cannot silently fall back to a default.
//! Secrets (Redis passwords in the URL, Scylla credentials) may come from the environment and are
//! never printed: `Debug` and [`Config::redacted`] mask them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{RetentionPolicy, RetentionPolicyError};

/// Why a configuration is refused. Every variant names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    #[error(transparent)]
    Retention(#[from] RetentionPolicyError),
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which backend holds the mailboxes, and how to reach it.
    pub store: StoreConfig,
    /// What a mailbox keeps.
    pub retention: RetentionConfig,
    /// How dispatch records are decoded.
    pub ingest: IngestConfig,
    /// The dispatch topic and the consumer group.
    pub kafka: KafkaConfig,
    /// Metrics and health endpoints.
    pub http: HttpConfig,
    /// Log format and filter.
    pub log: LogConfig,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (human) or `json` (one object a line, for log shippers).
    pub format: String,
    /// A `tracing` filter such as `info` or `info,mailbox_materializer=debug`; `RUST_LOG` wins.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: "text".to_owned(),
            filter: "info".to_owned(),
        }
    }
}

/// The storage backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In-process, lost on exit: the reference and the embedded default.
    #[default]
    Memory,
    Redis,
    Scylla,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Scylla => "scylla",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Self::Memory),
            "redis" => Ok(Self::Redis),
            "scylla" => Ok(Self::Scylla),
            other => Err(invalid(
                "store.backend",
                format!("unknown backend {other:?}; expected memory, redis or scylla"),
            )),
        }
    }
}

/// `[store]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `memory` (default), `redis` or `scylla`.
    pub backend: Backend,
    pub memory: MemoryConfig,
    pub redis: RedisConfig,
    pub scylla: ScyllaConfig,
}

/// `[store.memory]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// JSON file the memory store is loaded from at start and saved to after a command that
    /// changes it, so separate CLI invocations share one store. Unset: nothing is kept.
    pub snapshot: Option<PathBuf>,
    /// Pins the memory store's clock to this Unix second, for reproducible scripted checks.
    /// Unset: the system clock.
    pub fixed_now: Option<u64>,
}

/// Most replicas `store.redis.wait_replicas` may ask for: far beyond any real deployment, low
/// enough to catch a typo.
pub const MAX_WAIT_REPLICAS: u32 = 64;

/// `[store.redis]`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` or `rediss://` for TLS.
    pub url: String,
    /// Use the Redis Cluster client.
    pub cluster: bool,
    /// Prefix of every key (`P` in the key layout).
    pub key_prefix: String,
    /// Further Cluster seed nodes (`redis://host:port`), besides `url`.
    pub cluster_nodes: Vec<String>,
    /// Time allowed to establish a connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Time allowed for one command or script, in milliseconds.
    pub command_timeout_ms: u64,
    /// Most mailboxes the patrol promotes per second.
    pub patrol_rate_per_second: u32,
    /// Durable before commit (SPEC 7): replicas that must acknowledge every write (`WAIT`)
    /// before its record counts as final; 0 trusts the master alone.
    pub wait_replicas: u32,
    /// How long one `WAIT` may block, in milliseconds; fewer acknowledgements by then is a
    /// transient error. Must stay below `command_timeout_ms`.
    pub wait_timeout_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: default_redis_url(),
            cluster: false,
            key_prefix: "mm".to_owned(),
            cluster_nodes: Vec::new(),
            connect_timeout_ms: 5_000,
            command_timeout_ms: 5_000,
            patrol_rate_per_second: 200,
            wait_replicas: 0,
            wait_timeout_ms: 1_000,
        }
    }
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".to_owned()
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("cluster_nodes", &self.cluster_nodes)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .field("patrol_rate_per_second", &self.patrol_rate_per_second)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .finish()
    }
}

/// `[store.scylla]`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScyllaConfig {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Keyspace holding the mailbox tables.
    pub keyspace: String,
    /// Replication map used when the keyspace is created (an existing keyspace is kept).
    pub replication: String,
    /// Consistency of reads and plain writes: `LOCAL_QUORUM` (default), `QUORUM`, `ONE`, ...
    pub consistency: String,
    /// Consistency of the lightweight transactions: `SERIAL` (default) or `LOCAL_SERIAL`.
    pub serial_consistency: String,
    /// Username, when the cluster requires authentication (or `MATERIALIZER_SCYLLA_USERNAME`).
    pub username: Option<String>,
    /// Password (prefer `MATERIALIZER_SCYLLA_PASSWORD`; never printed).
    pub password: Option<String>,
    /// Time allowed to connect, in milliseconds.
    pub connect_timeout_ms: u64,
    /// The datacenter this process runs next to: requests go only to its nodes (datacenter-aware
    /// routing), which is what `LOCAL_*` consistency levels mean. Empty: no preference.
    pub local_dc: String,
    /// `[store.scylla.tls]`: client-to-node encryption. Absent: plain connections.
    pub tls: Option<ScyllaTlsConfig>,
}

/// `[store.scylla.tls]`: TLS to the cluster, with the server certificate verified by default.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ScyllaTlsConfig {
    /// `false` turns TLS off while keeping the table (e.g. in an overlay file).
    pub enabled: bool,
    /// PEM file of the CA(s) the nodes' certificates must chain to; empty: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for clusters that require client authentication; goes with
    /// `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (unencrypted; mount it from a secret).
    pub key_file: Option<PathBuf>,
    /// Verify each node's certificate (chain to the CA, and the node's IP address in it). On by
    /// default; turning it off leaves the connection open to interception.
    pub verify: bool,
}

impl Default for ScyllaTlsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ca_file: None,
            cert_file: None,
            key_file: None,
            verify: true,
        }
    }
}

impl Default for ScyllaConfig {
    fn default() -> Self {
        Self {
            nodes: vec!["127.0.0.1:9042".to_owned()],
            keyspace: "mailbox".to_owned(),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".to_owned(),
            consistency: "LOCAL_QUORUM".to_owned(),
            serial_consistency: "SERIAL".to_owned(),
            username: None,
            password: None,
            connect_timeout_ms: 10_000,
            local_dc: String::new(),
            tls: None,
        }
    }
}

impl fmt::Debug for ScyllaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaConfig")
            .field("nodes", &self.nodes)
            .field("keyspace", &self.keyspace)
            .field("replication", &self.replication)
            .field("consistency", &self.consistency)
            .field("serial_consistency", &self.serial_consistency)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("local_dc", &self.local_dc)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The CQL consistency levels `[store.scylla] consistency` accepts. A record counts as final
/// only once its write is durable (SPEC 7): at least a quorum of the local datacenter, which is
/// also what the commit point's reads need to see every acknowledged commit. `EACH_QUORUM` is
/// refused because CQL allows it for writes only, and this level serves reads too.
pub const CONSISTENCY_NAMES: &[&str] = &["LOCAL_QUORUM", "QUORUM", "ALL"];

/// Levels below a local quorum: a write acknowledged by them can be lost with one node.
const WEAK_CONSISTENCY_NAMES: &[&str] = &["ANY", "ONE", "TWO", "THREE", "LOCAL_ONE"];

/// The serial consistency levels of lightweight transactions (the commit point's conditions).
pub const SERIAL_CONSISTENCY_NAMES: &[&str] = &["SERIAL", "LOCAL_SERIAL"];

/// `[retention]`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Days a bucket lives after its day ends.
    pub days: u32,
    /// How many days into the future a `committed_at` may lie.
    pub future_window_days: u32,
    /// Largest span between a mailbox's oldest and newest active day.
    pub max_active_span_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let p = RetentionPolicy::default();
        Self {
            days: p.retention_days,
            future_window_days: p.future_window_days,
            max_active_span_days: p.max_active_span_days,
        }
    }
}

impl RetentionConfig {
    pub fn policy(&self) -> RetentionPolicy {
        RetentionPolicy {
            retention_days: self.days,
            future_window_days: self.future_window_days,
            max_active_span_days: self.max_active_span_days,
        }
    }
}

/// `[ingest]`: how dispatch records are decoded (SPEC 3).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// `false` (default): a field the decoder does not know is ignored and counted in
    /// `materializer_unknown_fields_total{field}`. `true`: it makes the record malformed
    /// (`unknown_field`) and dead-lettered.
    pub strict_fields: bool,
}

impl Config {
    /// The decoder's options: `[ingest]` plus `kafka.max_record_bytes`. The daemon, `replay` and
    /// `apply` decode with these, so a record means the same whichever door it comes through.
    pub fn decode_options(&self) -> crate::ingest::DecodeOptions {
        crate::ingest::DecodeOptions {
            max_record_bytes: self.kafka.max_record_bytes,
            strict_fields: self.ingest.strict_fields,
        }
    }
}

/// `[kafka]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// The dispatch topic.
    pub topic: String,
    /// Consumer group of the daemon.
    pub group_id: String,
    /// Where malformed, rejected and conflicting records go.
    pub dlq_topic: String,
    /// Most records of one partition in the in-flight window (admitted and not yet committable).
    /// When full, the partition is paused until the window has drained to half.
    pub max_in_flight_records: usize,
    /// Most bytes records in flight may hold, all partitions together, each charged its raw
    /// bytes (kept until final, for its dead letter) plus its decoded form and store request
    /// (`DispatchRecord::in_flight_bytes`); each partition gets an even share and is paused at
    /// it until half is free. librdkafka's prefetch is derived from it (a quarter, see
    /// `daemon::kafka::prefetch_sizes`), and the peak memory of a catch-up is about 64 MiB +
    /// 1.25 × (this + prefetch) (`daemon::memory_limit`, README "Memory").
    pub max_in_flight_bytes: usize,
    /// Largest dead letter the producer sends (librdkafka `message.max.bytes` of the producer;
    /// keep it at or below the dead-letter topic's `max.message.bytes`). Larger dead letters
    /// carry a bounded excerpt of the record instead of the whole record.
    pub dlq_max_message_bytes: usize,
    /// Largest record accepted, in bytes; a larger one is malformed (oversized).
    pub max_record_bytes: usize,
    /// How often the contiguous watermark of each partition is committed.
    pub commit_interval_ms: u64,
    /// First retry delay of a transient error or a corrupt mailbox; doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// SIGTERM/SIGINT: how long in-flight work may drain before the final commit and exit.
    pub shutdown_deadline_ms: u64,
    /// librdkafka statistics interval: how fresh `consumer_lag` and broker readiness are.
    pub statistics_interval_ms: u64,
    /// A partition with records waiting of which none could be read for this long is reported
    /// unreadable (`partition_unreadable`, an error log) and the daemon turns not ready.
    pub stalled_after_ms: u64,
    /// Passed to librdkafka as they are (TLS, SASL, ...), to the consumer and the dead-letter
    /// producer alike. Secrets can come from `MATERIALIZER_KAFKA_PROPERTY_<NAME>` instead.
    pub properties: BTreeMap<String, String>,
}

/// librdkafka properties the daemon sets itself: its offset and delivery guarantees depend on
/// them, so a configuration may not override them.
pub const OWNED_KAFKA_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "statistics.interval.ms",
    "auto.commit.interval.ms",
];

impl KafkaConfig {
    /// The backoff of every retry (store, dead letters, fences).
    pub fn backoff(&self) -> crate::retry::Backoff {
        crate::retry::Backoff::new(
            std::time::Duration::from_millis(self.retry_initial_ms),
            std::time::Duration::from_millis(self.retry_max_ms.max(self.retry_initial_ms)),
        )
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".to_owned(),
            topic: "dispatch".to_owned(),
            group_id: "mailbox-materializer".to_owned(),
            dlq_topic: "dispatch.dlq".to_owned(),
            max_in_flight_records: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            dlq_max_message_bytes: 1_000_000,
            max_record_bytes: crate::ingest::decode::DEFAULT_MAX_RECORD_BYTES,
            commit_interval_ms: 1000,
            retry_initial_ms: 100,
            retry_max_ms: 30_000,
            shutdown_deadline_ms: 25_000,
            statistics_interval_ms: 2000,
            stalled_after_ms: 30_000,
            properties: BTreeMap::new(),
        }
    }
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz`.
    pub listen: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9898".to_owned(),
        }
    }
}

/// Overrides from the command line; `None` keeps the configured value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub backend: Option<Backend>,
    pub memory_snapshot: Option<PathBuf>,
    pub redis_url: Option<String>,
    pub scylla_nodes: Option<Vec<String>>,
    pub scylla_keyspace: Option<String>,
}

/// Environment variables read by [`Config::apply_env`], in the order applied.
pub const ENV_VARS: &[&str] = &[
    "MATERIALIZER_STORE",
    "MATERIALIZER_MEMORY_SNAPSHOT",
    "MATERIALIZER_REDIS_URL",
    "MATERIALIZER_SCYLLA_NODES",
    "MATERIALIZER_SCYLLA_KEYSPACE",
    "MATERIALIZER_SCYLLA_USERNAME",
    "MATERIALIZER_SCYLLA_PASSWORD",
    "MATERIALIZER_SCYLLA_LOCAL_DC",
    "MATERIALIZER_SCYLLA_TLS_CA_FILE",
    "MATERIALIZER_SCYLLA_TLS_CERT_FILE",
    "MATERIALIZER_SCYLLA_TLS_KEY_FILE",
    "MATERIALIZER_KAFKA_BROKERS",
    "MATERIALIZER_KAFKA_TOPIC",
    "MATERIALIZER_KAFKA_GROUP_ID",
    "MATERIALIZER_KAFKA_DLQ_TOPIC",
    "MATERIALIZER_HTTP_LISTEN",
    "MATERIALIZER_LOG_FORMAT",
    "MATERIALIZER_INGEST_STRICT_FIELDS",
];

/// Prefix of the environment variables that set `[kafka.properties]`:
/// `MATERIALIZER_KAFKA_PROPERTY_SASL_PASSWORD=...` sets `sasl.password` (lowercased, `_` -> `.`).
pub const KAFKA_PROPERTY_ENV_PREFIX: &str = "MATERIALIZER_KAFKA_PROPERTY_";

impl Config {
    /// Reads a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<text>".to_owned(),
            message: e.to_string(),
        })
    }

    /// Loads the file (or the defaults), applies the environment and the overrides, validates.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        config.apply_env(|name| std::env::var(name).ok())?;
        config.apply_env_properties(std::env::vars());
        config.apply_overrides(overrides);
        config.validate()?;
        Ok(config)
    }

    /// Applies the environment variables of [`ENV_VARS`], read through `get`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = get("MATERIALIZER_STORE") {
            self.store.backend = v.parse()?;
        }
        if let Some(v) = get("MATERIALIZER_MEMORY_SNAPSHOT") {
            self.store.memory.snapshot = Some(PathBuf::from(v));
        }
        if let Some(v) = get("MATERIALIZER_REDIS_URL") {
            self.store.redis.url = v;
        }
        if let Some(v) = get("MATERIALIZER_SCYLLA_NODES") {
            self.store.scylla.nodes = split_list(&v);
        }
        if let Some(v) = get("MATERIALIZER_SCYLLA_KEYSPACE") {
            self.store.scylla.keyspace = v;
        }
        if let Some(v) = get("MATERIALIZER_SCYLLA_USERNAME") {
            self.store.scylla.username = Some(v);
        }
        if let Some(v) = get("MATERIALIZER_SCYLLA_PASSWORD") {
            self.store.scylla.password = Some(v);
        }
        if let Some(v) = get("MATERIALIZER_SCYLLA_LOCAL_DC") {
            self.store.scylla.local_dc = v;
        }
        // A TLS file given in the environment turns TLS on (paths of mounted secrets).
        for (name, field) in [
            ("MATERIALIZER_SCYLLA_TLS_CA_FILE", 0),
            ("MATERIALIZER_SCYLLA_TLS_CERT_FILE", 1),
            ("MATERIALIZER_SCYLLA_TLS_KEY_FILE", 2),
        ] {
            if let Some(v) = get(name) {
                let tls = self.store.scylla.tls.get_or_insert_with(Default::default);
                let path = Some(PathBuf::from(v));
                match field {
                    0 => tls.ca_file = path,
                    1 => tls.cert_file = path,
                    _ => tls.key_file = path,
                }
            }
        }
        if let Some(v) = get("MATERIALIZER_KAFKA_BROKERS") {
            self.kafka.brokers = v;
        }
        if let Some(v) = get("MATERIALIZER_KAFKA_TOPIC") {
            self.kafka.topic = v;
        }
        if let Some(v) = get("MATERIALIZER_KAFKA_GROUP_ID") {
            self.kafka.group_id = v;
        }
        if let Some(v) = get("MATERIALIZER_KAFKA_DLQ_TOPIC") {
            self.kafka.dlq_topic = v;
        }
        if let Some(v) = get("MATERIALIZER_HTTP_LISTEN") {
            self.http.listen = v;
        }
        if let Some(v) = get("MATERIALIZER_LOG_FORMAT") {
            self.log.format = v;
        }
        if let Some(v) = get("MATERIALIZER_INGEST_STRICT_FIELDS") {
            self.ingest.strict_fields = match v.as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                other => {
                    return Err(invalid(
                        "ingest.strict_fields",
                        format!("MATERIALIZER_INGEST_STRICT_FIELDS={other:?} is not true or false"),
                    ))
                }
            };
        }
        Ok(())
    }

    /// Applies `MATERIALIZER_KAFKA_PROPERTY_<NAME>` variables to `[kafka.properties]`, so TLS
    /// and SASL secrets never need to be in a file.
    pub fn apply_env_properties(&mut self, vars: impl IntoIterator<Item = (String, String)>) {
        for (name, value) in vars {
            if let Some(rest) = name.strip_prefix(KAFKA_PROPERTY_ENV_PREFIX) {
                if !rest.is_empty() {
                    let key = rest.to_ascii_lowercase().replace('_', ".");
                    self.kafka.properties.insert(key, value);
                }
            }
        }
    }

    pub fn apply_overrides(&mut self, overrides: &Overrides) {
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

    /// Checks every field and the relations between them; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.retention.policy().validate()?;

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
        for (key, value) in [
            ("store.redis.connect_timeout_ms", redis.connect_timeout_ms),
            ("store.redis.command_timeout_ms", redis.command_timeout_ms),
        ] {
            if value == 0 || value > 600_000 {
                return Err(invalid(key, format!("{value} is outside 1..=600000")));
            }
        }
        if redis.wait_replicas > MAX_WAIT_REPLICAS {
            return Err(invalid(
                "store.redis.wait_replicas",
                format!(
                    "{} is more than {MAX_WAIT_REPLICAS} replicas",
                    redis.wait_replicas
                ),
            ));
        }
        if redis.wait_timeout_ms == 0 || redis.wait_timeout_ms > 600_000 {
            // 0 would make WAIT block forever.
            return Err(invalid(
                "store.redis.wait_timeout_ms",
                format!("{} is outside 1..=600000", redis.wait_timeout_ms),
            ));
        }
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
        if scylla.connect_timeout_ms == 0 || scylla.connect_timeout_ms > 600_000 {
            return Err(invalid(
                "store.scylla.connect_timeout_ms",
                format!("{} is outside 1..=600000", scylla.connect_timeout_ms),
            ));
        }
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
        ] {
            if !(low..=high).contains(&value) {
                return Err(invalid(key, format!("{value} is outside {low}..={high}")));
            }
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
        if !["text", "json"].contains(&self.log.format.as_str()) {
            return Err(invalid(
                "log.format",
                format!("{:?} is not text or json", self.log.format),
            ));
        }

        self.http
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("{:?}: {e}", self.http.listen)))?;
        Ok(())
    }

    /// The configuration as JSON with secrets masked, for `check-config`.
    pub fn redacted(&self) -> serde_json::Value {
        let mut copy = self.clone();
        copy.store.redis.url = redact_url(&copy.store.redis.url);
        for node in copy.store.redis.cluster_nodes.iter_mut() {
            *node = redact_url(node);
        }
        if copy.store.scylla.password.is_some() {
            copy.store.scylla.password = Some("***".to_owned());
        }
        for (key, value) in copy.kafka.properties.iter_mut() {
            if is_secret_key(key) {
                *value = "***".to_owned();
            }
        }
        serde_json::to_value(&copy).unwrap_or(serde_json::Value::Null)
    }
}

/// Whether a librdkafka property holds a secret: passwords and passphrases (`sasl.password`,
/// `ssl.key.password`, `ssl.keystore.password`, `*.passphrase`), secrets and tokens
/// (`sasl.oauthbearer.client.secret`, anything with `token`), the OAuth bearer configuration
/// (`sasl.oauthbearer.config` carries credentials), inline private keys (`ssl.key.pem`,
/// `ssl_key`), and anything else named like one. Erring on the side of masking costs nothing.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "oauthbearer.config",
        "key.pem",
        "ssl_key",
        "private",
    ]
    .iter()
    .any(|needle| key.contains(needle))
}

/// `text` with every secret value of the Kafka properties replaced by `***`: librdkafka's error
/// for a refused property quotes the value, which must never reach a log or a terminal.
pub fn redact_secrets(text: &str, kafka: &KafkaConfig) -> String {
    let mut out = text.to_owned();
    for (key, value) in &kafka.properties {
        if is_secret_key(key) && !value.is_empty() {
            out = out.replace(value.as_str(), "***");
        }
    }
    out
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
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

/// Masks the password of a Redis URL: `redis://user:***@host`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_properties_are_recognised_and_their_values_redacted_from_text() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "ssl.key.pem",
            "my.api.token",
            "some.passphrase",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        assert!(!is_secret_key("security.protocol"));
        let mut kafka = KafkaConfig::default();
        kafka
            .properties
            .insert("ssl.key.password".into(), "hunter2".into());
        assert_eq!(
            redact_secrets("Invalid value \"hunter2\" for property", &kafka),
            "Invalid value \"***\" for property"
        );
    }

    #[test]
    fn empty_config_is_the_memory_default() {
        let c = Config::from_toml("").unwrap();
        c.validate().unwrap();
        assert_eq!(c.store.backend, Backend::Memory);
        assert_eq!(c.retention.policy(), RetentionPolicy::default());
    }

    #[test]
    fn the_example_file_parses_and_validates() {
        let text = include_str!("../config/materializer.example.toml");
        let c = Config::from_toml(text).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn redis_wait_is_off_by_default_and_validated() {
        let c =
            Config::from_toml("[store.redis]\nwait_replicas = 2\nwait_timeout_ms = 250\n").unwrap();
        c.validate().unwrap();
        assert_eq!(
            (c.store.redis.wait_replicas, c.store.redis.wait_timeout_ms),
            (2, 250)
        );
        let d = Config::default();
        assert_eq!(
            (d.store.redis.wait_replicas, d.store.redis.wait_timeout_ms),
            (0, 1_000)
        );
        for (toml, key) in [
            (
                "wait_replicas = 1\nwait_timeout_ms = 5000\ncommand_timeout_ms = 5000",
                "store.redis.wait_timeout_ms",
            ),
            ("wait_replicas = 65", "store.redis.wait_replicas"),
        ] {
            let c = Config::from_toml(&format!("[store.redis]\n{toml}\n")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        // Without replicas to wait for, the WAIT timeout does not bind the command timeout.
        Config::from_toml("[store.redis]\ncommand_timeout_ms = 500\n")
            .unwrap()
            .validate()
            .unwrap();
        let e = Config::from_toml("[store.redis]\nwait_replicas = -1\n").unwrap_err();
        assert!(e.to_string().contains("wait_replicas"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = Config::from_toml("[store]\nbakend = \"redis\"\n").unwrap_err();
        assert!(e.to_string().contains("bakend"), "{e}");
    }

    #[test]
    fn errors_name_the_key() {
        let mut c = Config::default();
        c.store.redis.url = "http://x".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("store.redis.url"));
        let mut c = Config::default();
        c.retention.days = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("retention.days"));
        let mut c = Config::default();
        c.kafka.dlq_topic = c.kafka.topic.clone();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("kafka.dlq_topic"));
        let mut c = Config::default();
        c.http.listen = "nowhere".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("http.listen"));
    }

    #[test]
    fn scylla_consistency_below_local_quorum_is_refused() {
        for weak in [
            "ANY",
            "ONE",
            "TWO",
            "THREE",
            "LOCAL_ONE",
            "EACH_QUORUM",
            "SERIAL",
            "one",
        ] {
            let mut c = Config::default();
            c.store.scylla.consistency = weak.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.starts_with("store.scylla.consistency") && e.contains("LOCAL_QUORUM"),
                "{weak}: {e}"
            );
        }
        for strong in CONSISTENCY_NAMES {
            let mut c = Config::default();
            c.store.scylla.consistency = (*strong).into();
            c.validate().unwrap();
        }
        for bad in ["QUORUM", "ONE", "LOCAL_QUORUM", ""] {
            let mut c = Config::default();
            c.store.scylla.serial_consistency = bad.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.starts_with("store.scylla.serial_consistency") && e.contains("SERIAL"),
                "{bad}: {e}"
            );
        }
        let mut c = Config::default();
        c.store.scylla.serial_consistency = "LOCAL_SERIAL".into();
        c.validate().unwrap();
    }

    #[test]
    fn scylla_tls_and_local_dc_are_checked() {
        let c = Config::from_toml(
            "[store.scylla]\nlocal_dc = \"dc1\"\n[store.scylla.tls]\nverify = true\n",
        )
        .unwrap();
        c.validate().unwrap();
        let tls = c.store.scylla.tls.as_ref().unwrap();
        assert!(tls.enabled && tls.verify && tls.ca_file.is_none());
        assert_eq!(c.store.scylla.local_dc, "dc1");

        let mut c = Config::default();
        c.store.scylla.tls = Some(ScyllaTlsConfig {
            ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..Default::default()
        });
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("store.scylla.tls.ca_file") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );

        let mut c = Config::default();
        c.store.scylla.tls = Some(ScyllaTlsConfig {
            cert_file: Some(PathBuf::from("Cargo.toml")),
            ..Default::default()
        });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("store.scylla.tls.cert_file"), "{e}");

        let mut c = Config::default();
        c.apply_env(|name| {
            (name == "MATERIALIZER_SCYLLA_TLS_CA_FILE").then(|| "Cargo.toml".to_owned())
        })
        .unwrap();
        assert_eq!(
            c.store.scylla.tls.as_ref().and_then(|t| t.ca_file.clone()),
            Some(PathBuf::from("Cargo.toml"))
        );
        c.validate().unwrap();
    }

    #[test]
    fn retention_beyond_the_backends_ttl_limit_is_refused_for_every_backend() {
        for backend in [Backend::Memory, Backend::Redis, Backend::Scylla] {
            let mut c = Config::default();
            c.store.backend = backend;
            c.retention.days = 3_650;
            c.retention.future_window_days = 3_649;
            c.validate().unwrap();
            c.retention.future_window_days = 3_650;
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("retention.days") && e.contains("retention.future_window_days"),
                "{e}"
            );
        }
    }

    #[test]
    fn environment_then_flags_override_the_file() {
        let mut c = Config::default();
        c.apply_env(|name| match name {
            "MATERIALIZER_STORE" => Some("redis".into()),
            "MATERIALIZER_REDIS_URL" => Some("redis://env:1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.store.backend, Backend::Redis);
        c.apply_overrides(&Overrides {
            redis_url: Some("redis://flag:2".into()),
            ..Default::default()
        });
        assert_eq!(c.store.redis.url, "redis://flag:2");
    }

    #[test]
    fn unknown_fields_are_lenient_unless_strict_fields() {
        let c = Config::from_toml("").unwrap();
        assert!(!c.decode_options().strict_fields);
        let c = Config::from_toml("[ingest]\nstrict_fields = true\n").unwrap();
        assert!(c.decode_options().strict_fields);
        assert_eq!(
            c.decode_options().max_record_bytes,
            c.kafka.max_record_bytes
        );
        let mut c = Config::default();
        c.apply_env(|name| (name == "MATERIALIZER_INGEST_STRICT_FIELDS").then(|| "true".into()))
            .unwrap();
        assert!(c.ingest.strict_fields);
        let e = c
            .apply_env(|name| (name == "MATERIALIZER_INGEST_STRICT_FIELDS").then(|| "yes".into()))
            .unwrap_err();
        assert!(e.to_string().starts_with("ingest.strict_fields"), "{e}");
        assert!(Config::from_toml("[ingest]\nstrict = true\n").is_err());
    }

    #[test]
    fn secrets_are_masked() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("rediss://pw@h:1"), "rediss://***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        let mut c = Config::default();
        c.store.redis.url = "redis://u:hunter2@h:1".into();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!c.redacted().to_string().contains("hunter2"));
    }
}
