//! Building the configured store: the one place a [`Config`] becomes a [`MailboxStore`]. It is
//! composition, so it lives with the commands that compose (the daemon is one of them, `run`);
//! the stores never read the configuration.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use scylla::statement::{Consistency, SerialConsistency};

use crate::config::{Backend, Config};
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisSettings, RedisStore};
use crate::store::scylla::{ScyllaSettings, ScyllaStore, ScyllaTls};
use crate::store::{Clock, MailboxStore, ManualClock, SystemClock};

/// A store built from the configuration, with what it takes to keep a memory store's content.
pub struct OpenedStore {
    pub store: Arc<dyn MailboxStore>,
    memory_snapshot: Option<(Arc<MemoryStore>, PathBuf)>,
    /// The same store when it is Redis, for the Redis-only commands (patrol).
    redis: Option<Arc<RedisStore>>,
    /// The same store when it is Scylla (its grants probe).
    scylla: Option<Arc<ScyllaStore>>,
}

impl OpenedStore {
    /// The same store when it is Redis, for the Redis-only commands (patrol, check-config).
    pub fn redis(&self) -> Option<&Arc<RedisStore>> {
        self.redis.as_ref()
    }

    /// The permissions the store's user or role lacks for what this product does, each as
    /// what to grant (Redis: an ACL rule such as `+zadd`; Scylla: the server's refusal, naming
    /// the permission and the table). Empty for the memory store and a user with every grant.
    pub async fn missing_grants(&self) -> Result<Vec<String>, crate::model::StoreError> {
        if let Some(redis) = &self.redis {
            return redis.missing_grants().await;
        }
        if let Some(scylla) = &self.scylla {
            return scylla.missing_grants().await;
        }
        Ok(Vec::new())
    }

    /// Saves a memory store to its snapshot file, if one is configured.
    pub(crate) fn persist(&self) -> Result<(), String> {
        match &self.memory_snapshot {
            Some((store, path)) => store.save_snapshot(path).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// The Redis store settings of a configuration.
fn redis_settings(redis: &crate::config::RedisConfig) -> RedisSettings {
    RedisSettings {
        url: redis.url.clone(),
        cluster: redis.cluster,
        extra_nodes: redis.cluster_nodes.clone(),
        key_prefix: redis.key_prefix.clone(),
        connect_timeout: Duration::from_millis(redis.connect_timeout_ms),
        command_timeout: Duration::from_millis(redis.command_timeout_ms),
        wait_replicas: redis.wait_replicas,
        wait_timeout: Duration::from_millis(redis.wait_timeout_ms),
        markers: !redis.allow_eviction,
        applied: true,
    }
}

/// Builds the configured backend.
pub async fn open(config: &Config) -> Result<OpenedStore, String> {
    let policy = config.retention.policy();
    match config.store.backend {
        Backend::Memory => {
            let clock: Arc<dyn Clock> = match config.store.memory.fixed_now {
                Some(now) => Arc::new(ManualClock::new(now)),
                None => Arc::new(SystemClock),
            };
            let store = Arc::new(MemoryStore::new(policy, clock));
            let memory_snapshot = match &config.store.memory.snapshot {
                Some(path) => {
                    store.load_snapshot(path).map_err(|e| e.to_string())?;
                    Some((store.clone(), path.clone()))
                }
                None => None,
            };
            Ok(OpenedStore {
                store,
                memory_snapshot,
                redis: None,
                scylla: None,
            })
        }
        Backend::Redis => {
            let store = Arc::new(
                RedisStore::connect(redis_settings(&config.store.redis), policy)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            Ok(OpenedStore {
                store: store.clone(),
                memory_snapshot: None,
                redis: Some(store),
                scylla: None,
            })
        }
        Backend::Scylla => {
            let store = ScyllaStore::connect(
                scylla_settings(&config.store.scylla),
                policy,
                Arc::new(SystemClock),
            )
            .await
            .map_err(|e| e.to_string())?;
            let store = Arc::new(store);
            Ok(OpenedStore {
                store: store.clone(),
                memory_snapshot: None,
                redis: None,
                scylla: Some(store),
            })
        }
    }
}

/// The Scylla store settings of a configuration (validated names).
pub(crate) fn scylla_settings(scylla: &crate::config::ScyllaConfig) -> ScyllaSettings {
    let mut settings = ScyllaSettings::new(scylla.nodes.clone(), scylla.keyspace.clone());
    settings.replication = scylla.replication.clone();
    settings.username = scylla.username.clone();
    settings.password = scylla.password.clone();
    settings.create_schema = scylla.create_schema;
    settings.connect_timeout = Duration::from_millis(scylla.connect_timeout_ms);
    settings.local_dc = Some(scylla.local_dc.clone()).filter(|dc| !dc.is_empty());
    settings.max_in_flight_appends = scylla.max_in_flight_appends;
    settings.tls = scylla
        .tls
        .as_ref()
        .filter(|t| t.enabled)
        .map(|t| ScyllaTls {
            ca_file: t.ca_file.clone(),
            client_cert: t.cert_file.clone().zip(t.key_file.clone()),
            verify: t.verify,
        });
    settings.consistency = match scylla.consistency.as_str() {
        "ANY" => Consistency::Any,
        "ONE" => Consistency::One,
        "TWO" => Consistency::Two,
        "THREE" => Consistency::Three,
        "QUORUM" => Consistency::Quorum,
        "ALL" => Consistency::All,
        "EACH_QUORUM" => Consistency::EachQuorum,
        "LOCAL_ONE" => Consistency::LocalOne,
        _ => Consistency::LocalQuorum,
    };
    settings.serial_consistency = match scylla.serial_consistency.as_str() {
        "LOCAL_SERIAL" => SerialConsistency::LocalSerial,
        _ => SerialConsistency::Serial,
    };
    settings
}
