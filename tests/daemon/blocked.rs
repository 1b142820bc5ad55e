//! SPEC 7: a corrupt mailbox fails closed and holds only itself, however many records it
//! receives. User `hot` gets 10 records, then loses its identity index (its next write fails
//! closed), then receives thousands more interleaved with 200 healthy users spread over four
//! partitions, `hot`'s partition among them. Before, `hot`'s held deliveries filled its
//! partition's window (64 records here) and every mailbox sharing that partition stopped for as
//! long as `hot` was not repaired. Now:
//!
//! - every healthy mailbox completes while `hot` stays corrupt, and the committed offset of
//!   `hot`'s partition never passes its first held record;
//! - a kill -9 while `hot` is blocked loses nothing and holds nothing: the next daemon blocks it
//!   again from the committed offset;
//! - after `replay --reset-mailboxes --user hot`, the daemon finds `hot` healthy, reads the
//!   partition again from the committed offset (`materializer_rereads_total`), and the offset
//!   catches up with every one of `hot`'s records applied in order; a kill -9 after that goes on
//!   from the committed offset.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::store::MailboxStore;
use support::kafka::{committed, create_topic, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{
    drop_scylla_keyspace, group_record, lose_scylla_identity_rows, redis_store, scan_seqs,
    scylla_store,
};

const PARTITIONS: i32 = 4;
const HEALTHY: usize = 200;
const ROUNDS: u64 = 10;
/// `hot`'s records after its damage: far more than its partition's window (64).
const HOT_LATER: u64 = 2_000;

fn is_hot(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .is_ok_and(|v| v["deliveries"][0]["user_id"] == "hot")
}

/// The store under test and how to damage `hot`.
enum Backend {
    Redis(RedisServer),
    Scylla { nodes: String, keyspace: String },
}

impl Backend {
    async fn store(&self) -> Arc<dyn MailboxStore> {
        match self {
            Self::Redis(server) => Arc::new(redis_store(&server.url()).await),
            Self::Scylla { nodes, keyspace } => Arc::new(scylla_store(nodes, keyspace).await),
        }
    }

    /// Deletes `hot`'s identity index: its next write fails closed (`index_lost`).
    async fn damage_hot(&self) {
        match self {
            Self::Redis(server) => {
                let deleted = server.raw("DEL mm:mbseqbucket:{hot}:1");
                assert!(deleted.contains(":1"), "deleted: {deleted}");
            }
            Self::Scylla { nodes, keyspace } => {
                lose_scylla_identity_rows(&scylla_store(nodes, keyspace).await, "hot").await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_mailbox_holds_only_itself_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("hot-redis", Some(server.url()));
    setup.max_in_flight = 64;
    holds_only_itself(setup, Backend::Redis(server)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_mailbox_holds_only_itself_on_scylla() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmd_hot_{}", std::process::id());
    let mut setup = DaemonSetup::new("hot-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    setup.max_in_flight = 64;
    let backend = Backend::Scylla { nodes, keyspace };
    holds_only_itself(setup, backend).await;
}

async fn holds_only_itself(setup: DaemonSetup, backend: Backend) {
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut daemon = Daemon::start(&setup);
    let first: Vec<(i32, Vec<u8>)> = (1..=10)
        .map(|seq| (0, group_record("hot", seq, "b")))
        .collect();
    produce(&setup.topic, &first).await;
    wait_for(
        "hot's first records committed",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, PARTITIONS)[0] == 10,
        || daemon.log(),
    );
    backend.damage_hot().await;

    // hot's next records interleaved with the healthy users' (a quarter of them on hot's
    // partition).
    let mut later = Vec::new();
    let mut hot_seq = 10;
    for round in 1..=ROUNDS {
        for u in 0..HEALTHY {
            later.push((
                (u % PARTITIONS as usize) as i32,
                group_record(&format!("u{u}"), round, "b"),
            ));
            if hot_seq < 10 + HOT_LATER {
                hot_seq += 1;
                later.push((0, group_record("hot", hot_seq, "b")));
            }
        }
    }
    let offsets = produce(&setup.topic, &later).await;
    let mut ends = vec![0i64; PARTITIONS as usize];
    ends[0] = 10;
    for ((partition, _), offset) in later.iter().zip(&offsets) {
        let end = &mut ends[*partition as usize];
        *end = (*end).max(offset + 1);
    }
    // hot's first record after its damage: where it blocks.
    let floor = later
        .iter()
        .zip(&offsets)
        .find(|((_, bytes), _)| is_hot(bytes))
        .map(|(_, offset)| *offset)
        .expect("a record of hot");

    let store = backend.store().await;
    let runtime = tokio::runtime::Handle::current();
    let healthy_done = |store: &Arc<dyn MailboxStore>| {
        let want: Vec<u64> = (1..=ROUNDS).collect();
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                for u in 0..HEALTHY {
                    if scan_seqs(store.as_ref(), &format!("u{u}")).await != want {
                        return false;
                    }
                }
                true
            })
        })
    };
    wait_for(
        "every healthy mailbox complete while hot stays corrupt",
        Duration::from_secs(180),
        || {
            let c = committed(&setup.group, &setup.topic, PARTITIONS);
            c[1..] == ends[1..] && healthy_done(&store)
        },
        || daemon.log(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        committed(&setup.group, &setup.topic, PARTITIONS)[0],
        floor,
        "the committed offset of hot's partition stays at its first held record"
    );
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_partition_blocked{partition=\"0\"}"),
        1.0
    );
    assert!(
        metrics.get("materializer_partition_blocked_skipped{partition=\"0\"}") >= 1.0,
        "hot's later deliveries are counted as skipped"
    );
    // Nothing of hot's thousands of records is held: what is in flight is its head's record.
    let in_flight = metrics.get("materializer_in_flight_bytes");
    assert!(
        in_flight < 64.0 * 1024.0,
        "{in_flight} bytes in flight with hot blocked"
    );

    // kill -9 while hot is blocked: the next daemon starts from the committed offset, blocks hot
    // again, and the healthy mailboxes stay as they are.
    daemon.kill9();
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the next daemon to block hot again",
        Duration::from_secs(120),
        || {
            daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 1.0
        },
        || daemon.log(),
    );
    assert_eq!(committed(&setup.group, &setup.topic, PARTITIONS)[0], floor);
    assert!(healthy_done(&store));

    // The operator repairs hot while the daemon runs: the partition is read again and every one
    // of hot's records lands, in order; the offset catches up.
    support::cli::repair(&setup.config_file(free_port()), 0, "hot");
    wait_for(
        "hot's partition committed to its end",
        Duration::from_secs(180),
        || committed(&setup.group, &setup.topic, PARTITIONS) == ends,
        || daemon.log(),
    );
    let want: Vec<u64> = (1..=10 + HOT_LATER).collect();
    assert_eq!(scan_seqs(store.as_ref(), "hot").await, want);
    assert!(healthy_done(&store));
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_partition_blocked{partition=\"0\"}"),
        0.0
    );
    assert!(
        metrics.get("materializer_rereads_total") >= 1.0,
        "the partition was read again"
    );
    let log = daemon.log();
    assert!(log.contains("the partition is read again from its committed position"));
    wait_for(
        "the re-read to say it caught up",
        Duration::from_secs(30),
        || daemon.log().contains("the re-read caught up"),
        || daemon.log(),
    );
    for line in daemon.log().lines().filter(|l| {
        l.contains("read again from its committed position") || l.contains("re-read caught up")
    }) {
        eprintln!("  {line}");
    }

    // kill -9 after the repair: the next daemon goes on from the committed offset and hot takes
    // new records like any mailbox.
    daemon.kill9();
    let mut daemon = Daemon::start(&setup);
    let more = vec![
        (0, group_record("hot", 11 + HOT_LATER, "b")),
        (1, group_record("u1", ROUNDS + 1, "b")),
    ];
    let more_offsets = produce(&setup.topic, &more).await;
    ends[0] = more_offsets[0] + 1;
    ends[1] = more_offsets[1] + 1;
    wait_for(
        "the records after a kill -9 that followed the repair",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, PARTITIONS) == ends,
        || daemon.log(),
    );
    let want: Vec<u64> = (1..=11 + HOT_LATER).collect();
    assert_eq!(scan_seqs(store.as_ref(), "hot").await, want);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    if let Backend::Scylla { nodes, keyspace } = &backend {
        drop_scylla_keyspace(&scylla_store(nodes, keyspace).await).await;
    }
}

/// `kafka.max_blocked_mailboxes`: more mailboxes failing closed than the limit turn the replica
/// not ready, saying why, while every other mailbox still flows.
#[tokio::test(flavor = "multi_thread")]
async fn more_blocked_mailboxes_than_the_limit_turn_the_replica_not_ready() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("blocked-limit", Some(server.url()));
    setup.kafka_extra = vec!["max_blocked_mailboxes = 1".to_owned()];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start(&setup);
    let users = ["va", "vb"];
    produce(
        &setup.topic,
        &users
            .iter()
            .map(|u| (0, group_record(u, 1, "b")))
            .collect::<Vec<_>>(),
    )
    .await;
    wait_for(
        "the first records committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [2],
        || daemon.log(),
    );
    for user in users {
        let deleted = server.raw(&format!("DEL mm:mbseqbucket:{{{user}}}:1"));
        assert!(deleted.contains(":1"), "deleted: {deleted}");
    }
    let mut later: Vec<(i32, Vec<u8>)> =
        users.iter().map(|u| (0, group_record(u, 2, "b"))).collect();
    later.push((0, group_record("bystander", 1, "b")));
    produce(&setup.topic, &later).await;
    wait_for(
        "readiness false naming the limit",
        Duration::from_secs(60),
        || {
            support::kafka::http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                status == 503
                    && body.contains(
                        "blocked mailboxes: 2 mailboxes fail closed, more than kafka.max_blocked_mailboxes = 1",
                    )
            })
        },
        || daemon.log(),
    );
    let metrics = daemon.metrics();
    assert_eq!(metrics.get("materializer_blocked_mailboxes"), 2.0);
    assert_eq!(metrics.get("materializer_blocked_mailboxes_limit"), 1.0);
    let store = redis_store(&server.url()).await;
    assert_eq!(
        scan_seqs(&store, "bystander").await,
        vec![1],
        "the others flow"
    );
}
