//! Redis as a conformance harness: a real `redis-server` per fixture under libfaketime (standalone),
//! or a shared Redis Cluster on a fixed clock with a fresh key prefix per fixture.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use mailbox_materializer::model::{MailboxId, RetentionPolicy, UserId};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::redis::keys::MailboxKeys;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;

use super::{Fixture, Harness};
use crate::support::redis_server::{Clock, Listen, RedisCluster, RedisServer};

/// Starts one faketime'd server per fixture.
#[derive(Debug, Clone, Copy)]
pub struct RedisHarness;

pub struct RedisFixture {
    /// The server whose clock this fixture moves; `None` on a shared cluster (fixed clock).
    pub server: Option<Arc<RedisServer>>,
    pub store: Arc<RedisStore>,
    pub prefix: String,
}

impl RedisFixture {
    pub async fn start(policy: RetentionPolicy, now_secs: u64) -> Self {
        let server = tokio::task::spawn_blocking(move || {
            RedisServer::start(Clock::Fake(now_secs), Listen::Unix, &[])
        })
        .await
        .expect("server start");
        let store = RedisStore::connect(RedisSettings::new(server.url(), "mm"), policy)
            .await
            .expect("connect to the test server");
        Self {
            server: Some(Arc::new(server)),
            store: Arc::new(store),
            prefix: "mm".to_owned(),
        }
    }

    fn server(&self) -> &Arc<RedisServer> {
        self.server
            .as_ref()
            .expect("this fixture runs on a shared cluster with a fixed clock")
    }

    pub fn set_now_sync(&self, now_secs: u64) {
        self.server().set_now(now_secs);
    }

    /// Runs a set-up or inspection command on the store's own connection. A timed-out or
    /// dropped connection is tried again (at most three attempts, each reported on stderr): a
    /// loaded machine can stall one command, and a test's set-up is not what it asserts. Every
    /// other error, and a third failure, fails the test.
    pub async fn cmd<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut attempt = 1;
        loop {
            match cmd.query_async(&mut self.store.conn()).await {
                Ok(value) => return value,
                Err(e)
                    if attempt < 3
                        && (e.is_timeout() || e.is_io_error() || e.is_connection_dropped()) =>
                {
                    eprintln!("admin command attempt {attempt} failed ({e}); trying again");
                    attempt += 1;
                }
                Err(e) => panic!("admin command: {e}"),
            }
        }
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn fixture(&self, policy: RetentionPolicy, now_secs: u64) -> Box<dyn Fixture> {
        Box::new(RedisFixture::start(policy, now_secs).await)
    }
}

#[async_trait]
impl Fixture for RedisFixture {
    fn store(&self) -> Arc<dyn MailboxStore> {
        self.store.clone()
    }

    async fn set_now(&self, now_secs: u64) {
        self.server().set_now(now_secs);
    }

    async fn jump_during_next_scan(&self, now_secs: u64) {
        let server = Arc::clone(self.server());
        let store = Arc::downgrade(&self.store);
        self.store
            .set_after_scan_read_hook(Some(super::one_shot_hook(
                move || server.set_now(now_secs),
                move || {
                    if let Some(store) = store.upgrade() {
                        store.set_after_scan_read_hook(None);
                    }
                },
            )));
    }

    async fn corrupt(&self, mb: &MailboxId, corruption: Corruption) -> bool {
        let keys = MailboxKeys::new(&self.prefix, mb);
        match corruption {
            Corruption::FormatVersion(version) => {
                let exists: i64 = self.cmd(redis::cmd("EXISTS").arg(&keys.meta)).await;
                if exists == 1 {
                    let _: i64 = self
                        .cmd(
                            redis::cmd("HSET")
                                .arg(&keys.meta)
                                .arg("retention_format_version")
                                .arg(version),
                        )
                        .await;
                }
                exists == 1
            }
            Corruption::LoseIdentityIndex => {
                self.cmd::<i64>(redis::cmd("DEL").arg(&keys.seqbucket))
                    .await
                    == 1
            }
            Corruption::LoseIdentity(seq) => {
                self.cmd::<i64>(
                    redis::cmd("ZREM")
                        .arg(&keys.seqbucket)
                        .arg(format!("{seq:016}")),
                )
                .await
                    == 1
            }
            Corruption::LoseMeta => self.cmd::<i64>(redis::cmd("DEL").arg(&keys.meta)).await == 1,
            Corruption::LoseIdentityTtl => {
                self.cmd::<i64>(redis::cmd("PERSIST").arg(&keys.seqbucket))
                    .await
                    == 1
            }
            Corruption::LoseDayEvents(day) => {
                self.cmd::<i64>(redis::cmd("DEL").arg(keys.day(day))).await == 1
            }
            Corruption::LoseEpochKey => {
                self.cmd::<i64>(redis::cmd("DEL").arg(&keys.epoch)).await == 1
            }
            Corruption::LoseDaySet => self.cmd::<i64>(redis::cmd("DEL").arg(&keys.days)).await == 1,
            Corruption::BreakProof(day) => {
                self.cmd::<i64>(
                    redis::cmd("HDEL")
                        .arg(&keys.meta)
                        .arg(format!("bucket_max_seq:{day}")),
                )
                .await
                    == 1
            }
        }
    }

    async fn fingerprint(&self, user: &UserId) -> String {
        // Epochs 0..=8 besides the ones the user names: a stray write to another epoch shows.
        let epochs: Vec<u32> = (0..=8).collect();
        let dump = self.store.dump_user(user, &epochs).await.expect("dump");
        dump.iter()
            .map(|(key, bytes, expire)| {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                format!("{key} {expire} {hex}\n")
            })
            .collect()
    }
}

/// A 3-master Redis Cluster shared by every fixture of a test, each fixture with its own key
/// prefix. Its clock is fixed at the start time (jumping a cluster's clock would trip its failure
/// detector), so only cases that do not move time run on it.
pub struct ClusterHarness {
    pub cluster: RedisCluster,
    pub start: u64,
    next: AtomicU64,
}

impl ClusterHarness {
    /// Starts the cluster (see [`RedisCluster::start`]).
    pub fn start(now_secs: u64) -> Self {
        Self {
            cluster: RedisCluster::start(Clock::Fake(now_secs)),
            start: now_secs,
            next: AtomicU64::new(0),
        }
    }

    pub fn seed_urls(&self) -> Vec<String> {
        self.cluster.seed_urls()
    }

    pub async fn fixture_with_prefix(&self, policy: RetentionPolicy) -> RedisFixture {
        let prefix = format!("c{}", self.next.fetch_add(1, Ordering::SeqCst));
        let urls = self.seed_urls();
        let mut settings = RedisSettings::new(urls[0].clone(), prefix.clone());
        settings.cluster = true;
        settings.extra_nodes = urls[1..].to_vec();
        let store = RedisStore::connect(settings, policy)
            .await
            .expect("connect to the test cluster");
        RedisFixture {
            server: None,
            store: Arc::new(store),
            prefix,
        }
    }
}

#[async_trait]
impl Harness for ClusterHarness {
    async fn fixture(&self, policy: RetentionPolicy, now_secs: u64) -> Box<dyn Fixture> {
        assert_eq!(now_secs, self.start, "the cluster's clock is fixed");
        Box::new(self.fixture_with_prefix(policy).await)
    }
}
