//! A CQL server as a conformance harness: ScyllaDB or Apache Cassandra at `SCYLLA_NODES`
//! (`scripts/test` starts a Cassandra and sets it). Every fixture gets its own keyspace and its own
//! [`ManualClock`]: the Scylla store takes time from its clock, not from the server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use mailbox_materializer::model::{MailboxId, RetentionPolicy, UserId, DAY_SECS};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
use mailbox_materializer::store::{MailboxStore, ManualClock};

use super::{Fixture, Harness, NOW0};

/// The contact points of the CQL server the tests use; a loud failure when unset.
pub fn nodes() -> Vec<String> {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_default();
    assert!(
        !nodes.trim().is_empty(),
        "SCYLLA_NODES is not set: run the tests through scripts/test (which starts a Cassandra), \
         or start one with `scripts/cassandra start` and export SCYLLA_NODES=127.0.0.1:19042"
    );
    nodes.split(',').map(|n| n.trim().to_owned()).collect()
}

#[derive(Debug, Clone, Copy)]
pub struct ScyllaHarness;

pub struct ScyllaFixture {
    pub store: Arc<ScyllaStore>,
    pub clock: ManualClock,
    /// Whether this fixture created its keyspace (and drops it when done).
    owns_keyspace: bool,
}

static NEXT_KEYSPACE: AtomicU64 = AtomicU64::new(0);

impl ScyllaFixture {
    /// A fresh keyspace with the schema, and a store on a manual clock.
    pub async fn start(policy: RetentionPolicy, now_secs: u64) -> Self {
        let keyspace = format!(
            "mmt_{}_{}",
            std::process::id(),
            NEXT_KEYSPACE.fetch_add(1, Ordering::SeqCst)
        );
        let mut fixture = Self::start_in(keyspace, policy, now_secs).await;
        fixture.owns_keyspace = true;
        fixture
    }

    pub async fn start_in(keyspace: String, policy: RetentionPolicy, now_secs: u64) -> Self {
        let clock = ManualClock::new(now_secs);
        let store = ScyllaStore::connect(
            ScyllaSettings::new(nodes(), keyspace),
            policy,
            Arc::new(clock.clone()),
        )
        .await
        .expect("connect to the CQL server at SCYLLA_NODES");
        Self {
            store: Arc::new(store),
            clock,
            owns_keyspace: false,
        }
    }

    pub async fn cql(&self, cql: String) {
        self.query(cql).await;
    }

    /// An admin statement or query, which must succeed.
    async fn query(&self, cql: String) -> scylla::response::query_result::QueryResult {
        self.store
            .session()
            .query_unpaged(cql, ())
            .await
            .expect("admin query")
    }

    async fn scalar_i32(&self, cql: String) -> Option<i32> {
        self.query(cql)
            .await
            .into_rows_result()
            .ok()?
            .maybe_first_row::<(Option<i32>,)>()
            .ok()
            .flatten()
            .and_then(|r| r.0)
    }

    /// The first column of every row, as far as it is a bigint.
    async fn i64s(&self, cql: String) -> Vec<i64> {
        let Ok(rows) = self.query(cql).await.into_rows_result() else {
            return Vec::new();
        };
        let Ok(typed) = rows.rows::<(Option<i64>,)>() else {
            return Vec::new();
        };
        typed
            .filter_map(|row| row.ok().and_then(|(v,)| v))
            .collect()
    }

    async fn has_rows(&self, cql: String) -> bool {
        self.query(cql)
            .await
            .into_rows_result()
            .map(|r| r.rows_num() > 0)
            .unwrap_or(false)
    }
}

impl Drop for ScyllaFixture {
    /// Drops the fixture's keyspace so a long test run does not pile up tables in the server.
    /// Runs on its own thread and session: a `Drop` cannot await, and the fixture may be dropped
    /// inside a blocking section of the test runtime.
    fn drop(&mut self) {
        if !self.owns_keyspace {
            return;
        }
        let keyspace = self.store.keyspace().to_owned();
        let handle = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(session) = scylla::client::session_builder::SessionBuilder::new()
                    .known_nodes(nodes())
                    .build()
                    .await
                {
                    let _ = session
                        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
                        .await;
                }
            });
        });
        let _ = handle.join();
    }
}

#[async_trait]
impl Harness for ScyllaHarness {
    async fn fixture(&self, policy: RetentionPolicy, now_secs: u64) -> Box<dyn Fixture> {
        Box::new(ScyllaFixture::start(policy, now_secs).await)
    }
}

#[async_trait]
impl Fixture for ScyllaFixture {
    fn store(&self) -> Arc<dyn MailboxStore> {
        self.store.clone()
    }

    async fn set_now(&self, now_secs: u64) {
        self.clock.set(now_secs);
    }

    async fn jump_during_next_scan(&self, now_secs: u64) {
        let clock = self.clock.clone();
        let store = Arc::downgrade(&self.store);
        self.store
            .set_after_scan_read_hook(Some(super::one_shot_hook(
                move || clock.set(now_secs),
                move || {
                    if let Some(store) = store.upgrade() {
                        store.set_after_scan_read_hook(None);
                    }
                },
            )));
    }

    async fn corrupt(&self, mb: &MailboxId, corruption: Corruption) -> bool {
        let ks = self.store.keyspace();
        let user = mb.user_id.as_str();
        // The live slot, and whether it holds the meta of this epoch.
        let live_slot = self
            .scalar_i32(format!(
                "SELECT live_slot FROM {ks}.user_mailbox WHERE user_id = '{user}' AND slot = -1 AND seq = 0"
            ))
            .await
            .unwrap_or(0);
        let meta_row = format!("user_id = '{user}' AND slot = {live_slot} AND seq = 0");
        let slot = format!("user_id = '{user}' AND slot = {live_slot}");
        let meta_exists = self
            .has_rows(format!(
                "SELECT format_version FROM {ks}.user_mailbox WHERE {meta_row} \
                 AND epoch = {} AND format_version > 0 ALLOW FILTERING",
                mb.epoch
            ))
            .await;
        match corruption {
            Corruption::FormatVersion(v) => {
                if meta_exists {
                    self.cql(format!(
                        "UPDATE {ks}.user_mailbox SET format_version = {v} WHERE {meta_row}"
                    ))
                    .await;
                }
                meta_exists
            }
            Corruption::LoseIdentityIndex => {
                let had = self
                    .has_rows(format!(
                        "SELECT seq FROM {ks}.user_mailbox WHERE {slot} AND seq > 0 LIMIT 1"
                    ))
                    .await;
                self.cql(format!(
                    "DELETE FROM {ks}.user_mailbox WHERE {slot} AND seq > 0"
                ))
                .await;
                had
            }
            Corruption::LoseIdentity(seq) => {
                let had = self
                    .has_rows(format!(
                        "SELECT seq FROM {ks}.user_mailbox WHERE {slot} AND seq = {seq}"
                    ))
                    .await;
                self.cql(format!(
                    "DELETE FROM {ks}.user_mailbox WHERE {slot} AND seq = {seq}"
                ))
                .await;
                had
            }
            Corruption::LoseMeta => {
                // The meta fields go; the slot's epoch and generation (the user's epoch record)
                // stay, as `P:epoch` stays on Redis when `mbmeta` is lost.
                self.cql(format!(
                    "DELETE format_version, expired_gap_boundary, seqbucket_max_seq, \
                     user_trim_seq, days, proof_max_seq, proof_expires_at FROM {ks}.user_mailbox \
                     WHERE {meta_row}"
                ))
                .await;
                meta_exists
            }
            Corruption::BreakProof(day) => {
                let inspected = self.store.inspect(mb).await.expect("inspect");
                let had = inspected
                    .active_days
                    .get(&day)
                    .is_some_and(|d| d.max_seq > 0);
                self.cql(format!(
                    "DELETE proof_max_seq[{day}] FROM {ks}.user_mailbox WHERE {meta_row}"
                ))
                .await;
                had
            }
            Corruption::LoseDayEvents(day) => {
                // The day's seqs are the identities expiring with it; their rows go.
                let inspected = self.store.inspect(mb).await.expect("inspect");
                let Some(expires_at) = inspected.active_days.get(&day).map(|d| d.expires_at) else {
                    return false;
                };
                let generation = self
                    .i64s(format!(
                        "SELECT generation FROM {ks}.user_mailbox WHERE {meta_row}"
                    ))
                    .await;
                let seqs = self
                    .i64s(format!(
                        "SELECT seq FROM {ks}.user_mailbox WHERE {slot} AND seq > 0 \
                         AND expires_at = {expires_at} ALLOW FILTERING"
                    ))
                    .await;
                let (Some(generation), false) = (generation.first(), seqs.is_empty()) else {
                    return false;
                };
                let bucket = mailbox_materializer::store::scylla::schema::event_bucket(day as i64);
                let list = seqs
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                self.cql(format!(
                    "DELETE FROM {ks}.mailbox_events WHERE user_id = '{user}' \
                     AND generation = {generation} AND bucket = {bucket} AND seq IN ({list})"
                ))
                .await;
                true
            }
            // Each identity row is written with its own TTL in the same statement: no index
            // key whose expiry could be lost on its own.
            Corruption::LoseIdentityTtl => false,
            // The user's row of record: which slot is live (slot -1).
            Corruption::LoseEpochKey => {
                let pointer = format!("user_id = '{user}' AND slot = -1 AND seq = 0");
                let had = self
                    .has_rows(format!(
                        "SELECT live_slot FROM {ks}.user_mailbox WHERE {pointer}"
                    ))
                    .await;
                self.cql(format!(
                    "DELETE FROM {ks}.user_mailbox WHERE user_id = '{user}' AND slot = -1"
                ))
                .await;
                had
            }
            // The days are a column of the meta row: lost only with it (`LoseMeta`).
            Corruption::LoseDaySet => false,
        }
    }

    async fn fingerprint(&self, user: &UserId) -> String {
        let today = NOW0 / DAY_SECS;
        let days: Vec<u64> = (today - 70..=today + 40).collect();
        self.store.dump_user(user, &days).await.expect("dump")
    }
}
