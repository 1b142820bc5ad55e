//! Configuration: TOML files (see `config/materializer.example.toml`), then environment
//! overrides, then command-line overrides, then validation.
//!
//! Every section and field has a default, so an empty file (or none) is a working memory-store
//! configuration. Unknown keys are refused so a typo cannot silently fall back to a default.
//! Secrets (Redis passwords in the URL, Scylla credentials) may come from the environment and are
//! never printed: `Debug` and [`Config::redacted`] mask them.
//!
//! This file holds the schema (the sections, their defaults) and loading; `env` the
//! environment and command-line overrides, `validate` the checks, `redact` the masking.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{RetentionPolicy, RetentionPolicyError};

pub(crate) mod env;
mod redact;
pub(crate) mod secrets;
mod validate;

pub use env::{Setter, ENV, KAFKA_PROPERTY_ENV_PREFIX};
pub use redact::{is_secret_key, redact_secrets, redact_url};

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

/// `kafka.on_records_lost`: the policy after the log deleted records before this group read
/// them (SPEC 7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRecordsLost {
    /// Name, count and alert the loss, and carry on from the log's start.
    #[default]
    Continue,
    /// The same, and hold the partition until an operator accepts the loss.
    Hold,
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
pub(crate) const MAX_WAIT_REPLICAS: u32 = 64;

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
    /// Run on a Redis whose `maxmemory-policy` evicts keys (anything but `noeviction`, on any
    /// master). Refused by default: an evicted key takes mailbox groups with it. When true the
    /// daemon warns at start and exports `materializer_store_evicting` 1.
    pub allow_eviction: bool,
    /// A file holding the password (a mounted secret), read at start and put into `url`'s
    /// credentials (`redis://user@host` becomes `redis://user:<password>@host`). The URL must
    /// not carry a password of its own. Env: `MATERIALIZER_REDIS_PASSWORD_FILE`.
    pub password_file: Option<PathBuf>,
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
            allow_eviction: false,
            password_file: None,
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
            .field("allow_eviction", &self.allow_eviction)
            .field("password_file", &self.password_file)
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
    /// Password (prefer `MATERIALIZER_SCYLLA_PASSWORD` or `password_file`; never printed).
    pub password: Option<String>,
    /// A file holding the password (a mounted secret), read at start; excludes `password`.
    /// Env: `MATERIALIZER_SCYLLA_PASSWORD_FILE`.
    pub password_file: Option<PathBuf>,
    /// At connect, create what the schema lacks (a new keyspace, a column a newer release
    /// added): needs DDL grants. `false`: refuse to start, naming what is missing, and leave the
    /// schema to `materializer schema apply` run with a schema role. A complete schema is only
    /// read, never altered, either way.
    pub create_schema: bool,
    /// Time allowed to connect, in milliseconds.
    pub connect_timeout_ms: u64,
    /// The datacenter this process runs next to: requests go only to its nodes (datacenter-aware
    /// routing), which is what `LOCAL_*` consistency levels mean. Empty: no preference.
    pub local_dc: String,
    /// Most appends sent to the cluster and not answered yet. Each holds its statements'
    /// serialized values and the driver's request state while it waits for its Paxos round
    /// (about 8 KiB beside the payloads), and a cluster answers no faster for a deeper queue:
    /// on a 2-core Cassandra, 8,192 in flight held 64 MiB more than 512 and were slower
    /// (BENCHMARKS.md "Memory during a catch-up"). `1..=MAX_SCYLLA_APPENDS_IN_FLIGHT`.
    pub max_in_flight_appends: usize,
    /// `[store.scylla.tls]`: client-to-node encryption. Absent: plain connections.
    pub tls: Option<ScyllaTlsConfig>,
}

/// Upper limit of `store.scylla.max_in_flight_appends`: the most deliveries the store calls
/// in flight ever hold.
pub(crate) const MAX_SCYLLA_APPENDS_IN_FLIGHT: usize =
    crate::ingest::runner::MAX_BATCH * crate::ingest::runner::MAX_BATCHES_IN_FLIGHT;
/// Default of `store.scylla.max_in_flight_appends` (the store's own default).
pub const DEFAULT_SCYLLA_APPENDS_IN_FLIGHT: usize = crate::store::scylla::DEFAULT_APPENDS_IN_FLIGHT;

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
            password_file: None,
            create_schema: true,
            connect_timeout_ms: 10_000,
            local_dc: String::new(),
            max_in_flight_appends: DEFAULT_SCYLLA_APPENDS_IN_FLIGHT,
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
            .field("password_file", &self.password_file)
            .field("create_schema", &self.create_schema)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("local_dc", &self.local_dc)
            .field("max_in_flight_appends", &self.max_in_flight_appends)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The CQL consistency levels `[store.scylla] consistency` accepts. A record counts as final
/// only once its write is durable (SPEC 7): at least a quorum of the local datacenter, which is
/// also what the commit point's reads need to see every acknowledged commit. `EACH_QUORUM` is
/// refused because CQL allows it for writes only, and this level serves reads too.
pub(crate) const CONSISTENCY_NAMES: &[&str] = &["LOCAL_QUORUM", "QUORUM", "ALL"];

/// Levels below a local quorum: a write acknowledged by them can be lost with one node.
const WEAK_CONSISTENCY_NAMES: &[&str] = &["ANY", "ONE", "TWO", "THREE", "LOCAL_ONE"];

/// The serial consistency levels of lightweight transactions (the commit point's conditions).
pub(crate) const SERIAL_CONSISTENCY_NAMES: &[&str] = &["SERIAL", "LOCAL_SERIAL"];

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
    pub(crate) fn decode_options(&self) -> crate::ingest::DecodeOptions {
        crate::ingest::DecodeOptions {
            max_record_bytes: self.kafka.max_record_bytes,
            strict_fields: self.ingest.strict_fields,
        }
    }
}

/// `[kafka]`.
#[derive(Clone, Deserialize, Serialize)]
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
    /// 1.25 × (this + prefetch) (`daemon::memory_limit`, docs/operations.md "Memory").
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
    /// A replica that joined its group and got no partition assignment at all (not even an
    /// empty one) for this long while the topic has partitions turns not ready, saying so.
    pub assignment_timeout_ms: u64,
    /// Mailboxes this replica may hold failing closed (corrupt, each holding only itself) before
    /// it turns not ready: beyond it an incident damages mailboxes in bulk (an evicting Redis, a
    /// log written out of order) and an operator must look. Each costs its head record and about
    /// 300 bytes while it waits; the replica keeps applying every other mailbox's records.
    pub max_blocked_mailboxes: u64,
    /// What a partition does after the log deleted records this group never read (retention or
    /// `DeleteRecords` overtook it, SPEC 7.3); the loss is named, counted and alerted either way.
    /// `continue` (the default): carry on from the log's start, since nothing can bring the
    /// records back and holding would stop every other user of the partition. `hold`: the
    /// partition waits, readiness false, until an operator accepts the loss (`POST
    /// /records-lost/accept?partition=N`), for a pipeline that can re-produce the records first.
    pub on_records_lost: OnRecordsLost,
    /// After a growth of the dispatch topic, how long producers may keep writing a user to an
    /// old partition after this group first saw the new one (their metadata refresh; SPEC 7.2):
    /// a new partition's first records wait for the older partitions' records written up to this
    /// long after that moment (and never for records written after themselves). 0 (the default):
    /// up to the moment the group saw the new partition. Raise it to the producers' metadata age
    /// (`metadata.max.age.ms`, `topic.metadata.refresh.interval.ms`: 300000 by default) when
    /// many producers write the topic; the cost is that a partition new to the group also waits
    /// that long behind a mailbox failing closed on an older one (see `daemon::partition_growth`).
    pub growth_allowance_ms: u64,
    /// Passed to librdkafka as they are (TLS, SASL, ...), to the consumer and the dead-letter
    /// producer alike. Secrets can come from `MATERIALIZER_KAFKA_PROPERTY_<NAME>` instead.
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties read from files at start (mounted secrets): `"sasl.password" =
    /// "/var/run/secrets/kafka/password"`. A property may come from here or `properties`, not
    /// both.
    pub property_files: BTreeMap<String, PathBuf>,
}

/// librdkafka properties the daemon sets itself: its offset and delivery guarantees depend on
/// them, so a configuration may not override them.
pub(crate) const OWNED_KAFKA_PROPERTIES: &[&str] = &[
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
    pub(crate) fn backoff(&self) -> crate::retry::Backoff {
        crate::retry::Backoff::new(
            std::time::Duration::from_millis(self.retry_initial_ms),
            std::time::Duration::from_millis(self.retry_max_ms.max(self.retry_initial_ms)),
        )
    }
}

/// Secret properties (`sasl.password`, ...) show as `***`.
impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if is_secret_key(k) { "***" } else { v.as_str() },
                )
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group_id", &self.group_id)
            .field("dlq_topic", &self.dlq_topic)
            .field("max_in_flight_records", &self.max_in_flight_records)
            .field("max_in_flight_bytes", &self.max_in_flight_bytes)
            .field("dlq_max_message_bytes", &self.dlq_max_message_bytes)
            .field("max_record_bytes", &self.max_record_bytes)
            .field("commit_interval_ms", &self.commit_interval_ms)
            .field("retry_initial_ms", &self.retry_initial_ms)
            .field("retry_max_ms", &self.retry_max_ms)
            .field("shutdown_deadline_ms", &self.shutdown_deadline_ms)
            .field("statistics_interval_ms", &self.statistics_interval_ms)
            .field("stalled_after_ms", &self.stalled_after_ms)
            .field("assignment_timeout_ms", &self.assignment_timeout_ms)
            .field("max_blocked_mailboxes", &self.max_blocked_mailboxes)
            .field("growth_allowance_ms", &self.growth_allowance_ms)
            .field("properties", &properties)
            .field("property_files", &self.property_files)
            .finish()
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
            assignment_timeout_ms: 120_000,
            max_blocked_mailboxes: 1_000,
            on_records_lost: OnRecordsLost::Continue,
            growth_allowance_ms: 0,
            properties: BTreeMap::new(),
            property_files: BTreeMap::new(),
        }
    }
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz`.
    pub listen: String,
    /// `/healthz` fails when the engine loop or the poll thread made no progress this long
    /// while running (a wedged replica; see `daemon::liveness`).
    pub liveness_timeout_ms: u64,
    /// Serve `/debug/blocked` (the mailboxes failing closed, with partition, offset and error,
    /// for `materializer explain`). Off by default: it names users, which `/metrics` never does.
    pub debug_endpoints: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9898".to_owned(),
            liveness_timeout_ms: 60_000,
            debug_endpoints: false,
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

impl Config {
    /// Reads a TOML file.
    pub(crate) fn from_file(path: &Path) -> Result<Self, ConfigError> {
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
    pub(crate) fn from_toml(text: &str) -> Result<Self, ConfigError> {
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
        config.read_secret_files(|path| std::fs::read_to_string(path))?;
        config.validate()?;
        Ok(config)
    }
}

/// A comma-separated list, blanks dropped (`kafka.brokers`, `MATERIALIZER_SCYLLA_NODES`).
fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests;
