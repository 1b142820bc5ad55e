//! The expected state of a daemon run: the memory reference fed the same records in the same
//! per-partition order, and the checks that compare a store with it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::demo::{demo_shard, synthetic_workload, DEMO_SHARDS};
use mailbox_materializer::ingest::{apply_record, decode_record};
use mailbox_materializer::model::{
    MailboxId, RetentionPolicy, ScanPage, ScanRequest, StoreError, UserId,
};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};

use super::kafka::{committed, wait_for, Daemon, DaemonSetup, Metrics};

pub const PARTITIONS: i32 = DEMO_SHARDS as i32;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A generated stream: fresh groups, identical and different replays, cross-day conflicts,
/// expired input, stale epochs, a truncate and malformed records, each with its partition.
pub fn stream(users: u64, rounds: u64, seed: u64) -> Vec<(i32, Vec<u8>)> {
    synthetic_workload(users, rounds, now_ms(), seed)
        .records
        .into_iter()
        .map(|r| (demo_shard(&r), r))
        .collect()
}

/// What the memory reference computes from the records, partition by partition in order.
pub struct Reference {
    pub store: MemoryStore,
    /// `(partition, offset)` -> dead-letter reason.
    pub dead_letters: BTreeMap<(i32, i64), String>,
    pub groups: BTreeMap<&'static str, u64>,
    pub records: BTreeMap<&'static str, u64>,
    users: Vec<String>,
}

pub async fn reference(records: &[(i32, Vec<u8>)], offsets: &[i64]) -> Reference {
    let store = MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock));
    let mut dead_letters = BTreeMap::new();
    let mut groups = BTreeMap::new();
    let mut outcomes = BTreeMap::new();
    let mut users = BTreeSet::new();
    for ((partition, raw), offset) in records.iter().zip(offsets) {
        match decode_record(raw, 1 << 20) {
            Err(_) => {
                dead_letters.insert((*partition, *offset), "malformed".to_owned());
                *outcomes.entry("malformed").or_default() += 1;
            }
            Ok(record) => {
                let mut failed = None;
                for delivery in apply_record(&store, &record).await {
                    users.insert(delivery.mailbox.user_id.as_str().to_owned());
                    let word = match &delivery.result {
                        Ok(o) => o.as_str(),
                        Err(e) => {
                            failed.get_or_insert(e.outcome());
                            e.outcome()
                        }
                    };
                    *groups.entry(word).or_default() += 1;
                }
                match failed {
                    Some(reason) => {
                        dead_letters.insert((*partition, *offset), reason.to_owned());
                        *outcomes.entry("dead_lettered").or_default() += 1;
                    }
                    None => *outcomes.entry("applied").or_default() += 1,
                }
            }
        }
    }
    Reference {
        store,
        dead_letters,
        groups,
        records: outcomes,
        users: users.into_iter().collect(),
    }
}

/// A scan of `user`'s epoch-1 mailbox from its start (one page of up to 10,000 groups), with
/// the store's answer as it is.
pub async fn scan_from_start(store: &dyn MailboxStore, user: &str) -> Result<ScanPage, StoreError> {
    let mailbox = MailboxId::new(UserId::parse(user).expect("user"), 1);
    let request = ScanRequest {
        after_seq: 0,
        until_seq: None,
        limit_groups: 10_000,
    };
    store.range_scan(&mailbox, request).await
}

/// The seqs a full scan of `user`'s epoch-1 mailbox returns (none when the scan fails, e.g. on
/// a corrupt mailbox).
pub async fn scan_seqs(store: &dyn MailboxStore, user: &str) -> Vec<u64> {
    scan_from_start(store, user)
        .await
        .map(|page| page.groups.iter().map(|g| g.mailbox_seq).collect())
        .unwrap_or_default()
}

/// Every `groups_total{outcome}` and `records_total{outcome}` the reference counted, equal in a
/// daemon's scrape: each record got exactly its own outcome.
pub fn assert_counters_match(reference: &Reference, metrics: &Metrics) {
    for (word, count) in &reference.groups {
        assert_eq!(
            metrics.get(&format!("materializer_groups_total{{outcome=\"{word}\"}}")),
            *count as f64,
            "groups_total{{outcome={word}}}"
        );
    }
    for (word, count) in &reference.records {
        assert_eq!(
            metrics.get(&format!("materializer_records_total{{outcome=\"{word}\"}}")),
            *count as f64,
            "records_total{{outcome={word}}}"
        );
    }
}

/// The dead-letter topic names exactly the records the reference dead-letters (each once or
/// more: dead letters are at-least-once).
pub fn assert_dead_letters_are_the_references(reference: &Reference, dlq_topic: &str) {
    let mut got: Vec<(i32, i64)> = super::kafka::read_all(dlq_topic)
        .iter()
        .map(|l| {
            (
                l.headers["source_partition"].parse().expect("partition"),
                l.headers["source_offset"].parse().expect("offset"),
            )
        })
        .collect();
    got.sort();
    got.dedup();
    let want: Vec<(i32, i64)> = reference.dead_letters.keys().copied().collect();
    assert_eq!(got, want, "the dead letters are exactly the reference's");
}

/// Every mailbox of the reference's users, read back the way a client would, must be identical.
pub async fn assert_same_state(reference: &Reference, actual: &dyn MailboxStore) {
    for user in &reference.users {
        for epoch in [0u32, 1] {
            let mailbox = MailboxId::new(UserId::parse(user).expect("user id"), epoch);
            let request = ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10_000,
            };
            let want = reference.store.range_scan(&mailbox, request).await;
            let got = actual.range_scan(&mailbox, request).await;
            assert_eq!(
                got, want,
                "mailbox {user} epoch {epoch} differs from the reference"
            );
            let want = reference.store.inspect(&mailbox).await.expect("inspect");
            let got = actual.inspect(&mailbox).await.expect("inspect");
            assert_eq!(
                (
                    got.current_epoch,
                    got.user_trim_seq,
                    got.expired_gap_boundary,
                    got.seqbucket_max_seq
                ),
                (
                    want.current_epoch,
                    want.user_trim_seq,
                    want.expired_gap_boundary,
                    want.seqbucket_max_seq
                ),
                "meta of {user} epoch {epoch} differs from the reference"
            );
        }
    }
}

pub fn end_offsets(records: &[(i32, Vec<u8>)], offsets: &[i64]) -> Vec<i64> {
    let mut ends = vec![0i64; PARTITIONS as usize];
    for ((partition, _), offset) in records.iter().zip(offsets) {
        let end = &mut ends[*partition as usize];
        *end = (*end).max(offset + 1);
    }
    ends
}

/// Waits until the group has committed part of the stream on some partition: the daemon runs
/// and has written, before a test breaks something under it.
pub fn wait_first_commit(setup: &DaemonSetup, daemon: &Daemon, timeout: Duration) {
    wait_for(
        "part of the stream committed",
        timeout,
        || {
            committed(&setup.group, &setup.topic, PARTITIONS)
                .iter()
                .any(|c| *c > 0)
        },
        || daemon.log(),
    );
}

pub fn wait_committed(setup: &DaemonSetup, ends: &[i64], daemons: &[&Daemon], timeout: Duration) {
    wait_for(
        "every record committed",
        timeout,
        || committed(&setup.group, &setup.topic, PARTITIONS) == ends,
        || {
            format!(
                "committed {:?}, expected {ends:?}\n{}",
                committed(&setup.group, &setup.topic, PARTITIONS),
                daemons
                    .iter()
                    .map(|d| d.log())
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            )
        },
    );
}

pub fn redis_store_settings(url: &str) -> RedisSettings {
    RedisSettings::new(url, "mm")
}

pub async fn redis_store(url: &str) -> RedisStore {
    RedisStore::connect(redis_store_settings(url), RetentionPolicy::default())
        .await
        .expect("connect to the test redis")
}

/// A Scylla store on `nodes` in `keyspace` (created if missing), on the real clock.
pub async fn scylla_store(
    nodes: &str,
    keyspace: &str,
) -> mailbox_materializer::store::scylla::ScyllaStore {
    use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
    ScyllaStore::connect(
        ScyllaSettings::new(vec![nodes.to_owned()], keyspace),
        RetentionPolicy::default(),
        Arc::new(SystemClock),
    )
    .await
    .expect("connect to the CQL server")
}

/// Deletes the identity rows of `user`'s live slot (epoch 1) on Scylla: its next append fails
/// closed (`index_lost`).
pub async fn lose_scylla_identity_rows(
    store: &mailbox_materializer::store::scylla::ScyllaStore,
    user: &str,
) {
    let ks = store.keyspace().to_owned();
    let slot: i32 = store
        .session()
        .query_unpaged(
            format!(
                "SELECT live_slot FROM {ks}.user_mailbox WHERE user_id = '{user}' AND slot = -1 AND seq = 0"
            ),
            (),
        )
        .await
        .expect("live slot")
        .into_rows_result()
        .expect("rows")
        .first_row::<(Option<i32>,)>()
        .expect("a row")
        .0
        .unwrap_or(0);
    store
        .session()
        .query_unpaged(
            format!("DELETE FROM {ks}.user_mailbox WHERE user_id = '{user}' AND slot = {slot} AND seq > 0"),
            (),
        )
        .await
        .expect("identity rows deleted");
}

/// Drops the keyspace of a test's Scylla store.
pub async fn drop_scylla_keyspace(store: &mailbox_materializer::store::scylla::ScyllaStore) {
    let _ = store
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {}", store.keyspace()), ())
        .await;
}

/// One record of one group of `user` at `seq` (epoch 1, today), its one event carrying `body`.
pub fn group_record(user: &str, seq: u64, body: &str) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": body}}]}]
    })
    .to_string()
    .into_bytes()
}
