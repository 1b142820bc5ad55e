//! Reaching Redis: the settings, the standalone or cluster connection, and the connections a
//! SCAN must walk (every master of a cluster).

use super::node_url::node_url;
use super::*;

/// How to reach Redis.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]`, `rediss://` for TLS, or `redis+unix://`.
    pub url: String,
    /// Use the Redis Cluster client (`url` is one seed node; more may follow in `extra_nodes`).
    pub cluster: bool,
    /// Further cluster seed nodes.
    pub extra_nodes: Vec<String>,
    /// Prefix `P` of every key.
    pub key_prefix: String,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// Replicas that must acknowledge a write before it counts as done (`WAIT`); 0: none.
    pub wait_replicas: u32,
    /// How long `WAIT` may block; must stay below `command_timeout`.
    pub wait_timeout: Duration,
    /// Keep and check the store markers (`store_marker`: a wiped store is found before a write
    /// lands). Off under `store.redis.allow_eviction`: an evicting Redis drops markers like any
    /// other key, which would hold writes as if the store were wiped; such a store accepts
    /// losing keys, and a lost mailbox key fails closed on its own.
    pub markers: bool,
    /// Keep the record of how far the store holds each partition (`applied`: a store that went
    /// back in time is found and healed). Always on in the product; off only where a bench
    /// measures what it costs.
    pub applied: bool,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &crate::url_redact::redact_url(&self.url))
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("wait_replicas", &self.wait_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisSettings {
    pub fn new(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            cluster: false,
            extra_nodes: Vec::new(),
            key_prefix: key_prefix.into(),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
            markers: true,
            applied: true,
        }
    }
}

/// A standalone or a cluster connection; both are cheap to clone and multiplexed.
#[derive(Clone)]
pub enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisStore {
    /// Redirections the batched appends met on a Redis Cluster, by kind (as
    /// [`REDIRECT_KINDS`](super::slot_router::REDIRECT_KINDS) names them); `None` on one server.
    pub fn cluster_redirects(&self) -> Option<[u64; 5]> {
        self.router.as_ref().map(|r| r.redirects())
    }

    /// Connects (standalone or cluster) and checks the server answers.
    pub async fn connect(
        settings: RedisSettings,
        policy: RetentionPolicy,
    ) -> Result<Self, StoreError> {
        let mut cluster_client = None;
        let connection = if settings.cluster {
            let mut nodes = vec![settings.url.clone()];
            nodes.extend(settings.extra_nodes.iter().cloned());
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(settings.connect_timeout)
                .response_timeout(settings.command_timeout)
                .build()
                .map_err(classified)?;
            let connection =
                Connection::Cluster(client.get_async_connection().await.map_err(classified)?);
            cluster_client = Some(client);
            connection
        } else {
            let client = redis::Client::open(settings.url.as_str()).map_err(classified)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.command_timeout))
                .set_number_of_retries(2);
            let manager = tokio::time::timeout(
                settings.connect_timeout,
                client.get_connection_manager_with_config(config),
            )
            .await
            .map_err(|_| StoreError::Unavailable {
                backend: BACKEND,
                detail: format!(
                    "no connection to {} within {:?}",
                    crate::url_redact::redact_url(&settings.url),
                    settings.connect_timeout
                ),
            })?
            .map_err(classified)?;
            Connection::Single(manager)
        };
        let connection: super::cluster_watch::Shared =
            std::sync::Arc::new(std::sync::RwLock::new(connection));
        if let Some(client) = cluster_client {
            super::cluster_watch::spawn(
                client,
                &connection,
                settings.command_timeout,
                settings.connect_timeout,
            );
        }
        let store = Self {
            connection,
            router: settings
                .cluster
                .then(|| super::slot_router::SlotRouter::new(&settings)),
            settings,
            policy,
            scripts: Scripts::new(),
            after_scan_read: Mutex::new(None),
            promoted: Default::default(),
            expected: Default::default(),
            pending_markers: Mutex::default(),
        };
        let _: String = redis::cmd("PING")
            .query_async(&mut store.conn())
            .await
            .map_err(classified)?;
        Ok(store)
    }

    /// The connections SCAN must walk: the one server, or every master of the cluster.
    pub(super) async fn scan_targets(&self) -> Result<Vec<Connection>, StoreError> {
        Ok(self
            .masters()
            .await?
            .into_iter()
            .map(|(_, connection)| connection)
            .collect())
    }

    /// Every master with its address (the configured URL, redacted, for a standalone server).
    pub(super) async fn masters(&self) -> Result<Vec<(String, Connection)>, StoreError> {
        if !self.settings.cluster {
            return Ok(vec![(
                crate::url_redact::redact_url(&self.settings.url),
                self.conn(),
            )]);
        }
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        let mut targets = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 3 || !fields[2].split(',').any(|f| f == "master") {
                continue;
            }
            if fields[2].contains("fail") {
                continue;
            }
            let address = fields[1].split('@').next().unwrap_or_default();
            let url = node_url(&self.settings.url, address);
            let client = redis::Client::open(url.as_str()).map_err(classified)?;
            let manager = client
                .get_connection_manager_with_config(
                    ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.settings.connect_timeout))
                        .set_response_timeout(Some(self.settings.command_timeout)),
                )
                .await
                .map_err(classified)?;
            targets.push((address.to_owned(), Connection::Single(manager)));
        }
        Ok(targets)
    }
}

/// One step of `SCAN cursor MATCH pattern` on one node: the next cursor (0 when done) and a
/// batch of keys. Walking batch by batch keeps the patrol's memory flat however many mailboxes
/// there are.
pub(super) async fn scan_batch(
    node: &mut Connection,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<String>), StoreError> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(500)
        .query_async(node)
        .await
        .map_err(classified)
}
