//! SPEC 7.2 "The fleet": replicas of one consumer group on a real Kafka broker.
//!
//! - **Zombies are fenced** (one test per store topology): replica A is frozen after it decided a
//!   batch and before the batch reaches the store (the `MATERIALIZER_PAUSE_BEFORE_SEND`
//!   failpoint, then SIGSTOP past the session timeout), its partition moves to replica B, B
//!   applies the record and a newer same-day replacement of the same seq and commits, then A goes
//!   on and sends its old decision. The mailbox keeps B's version.
//! - **Every rebalance protocol** (classic, `cooperative-sticky`, KIP-848 `group.protocol =
//!   consumer`): three replicas (static members under cooperative-sticky, as the chart runs
//!   them), a log that keeps arriving, rolling SIGTERM restarts, a kill -9
//!   and a replica frozen past its session and continued, with one mailbox damaged early and
//!   repaired (`replay --reset-mailboxes`) only at the end. Every mailbox ends equal to the memory
//!   reference of the whole log and the dead-letter topic holds exactly the expected records
//!   (duplicates allowed). Each run prints what it measured: groups applied more than once, and
//!   revokes of partitions that came straight back to the same replica (pauses of partitions the
//!   rebalance did not move).

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::model::{MailboxId, RetentionPolicy, ScanRequest, UserId};
use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};
use support::cli::top_once;
use support::kafka::{committed, create_topic, produce, read_all, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisCluster, RedisServer};
use support::reference::{
    assert_same_state, end_offsets, now_ms, redis_store, reference, stream, PARTITIONS,
};

/// The classic group session of the test setup (`session.timeout.ms`, and the broker's
/// `group.consumer.session.timeout.ms` for KIP-848 groups), plus a margin.
const PAST_THE_SESSION: Duration = Duration::from_secs(10);

fn record(user: &str, seq: u64, body: &str, committed_at: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}/{body}"), "group_id": "g", "committed_at": committed_at,
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": body}}]}]
    })
    .to_string()
    .into_bytes()
}

async fn bodies(store: &dyn MailboxStore, user: &str) -> Vec<String> {
    let page = store
        .range_scan(
            &MailboxId::new(UserId::parse(user).expect("user"), 1),
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 100,
            },
        )
        .await
        .expect("scan");
    page.groups
        .iter()
        .flat_map(|g| g.events.iter().map(|e| e.payload.as_str().to_owned()))
        .collect()
}

/// The zombie scenario on whatever store `setup` names; `store` reads the result.
async fn zombie_loses_to_the_new_owner(setup: DaemonSetup, store: &dyn MailboxStore) {
    zombie_loses_to_a_new_owner_started_with(setup, store, &[]).await;
}

/// The zombie scenario with the new owner B started with `b_env` (its failpoints).
async fn zombie_loses_to_a_new_owner_started_with(
    setup: DaemonSetup,
    store: &dyn MailboxStore,
    b_env: &[(&str, &str)],
) {
    let user = "zombie-u";
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let now = now_ms();
    produce(&setup.topic, &[(0, record(user, 1, "v1", now))]).await;

    // A decides the batch holding v1, then is frozen before sending it.
    let mut a = Daemon::start_with_env(
        &setup,
        &[("MATERIALIZER_PAUSE_BEFORE_SEND", &format!("{user}:12000"))],
    );
    wait_for(
        "replica A to decide the batch",
        Duration::from_secs(60),
        || a.log().contains(&format!("paused before sending {user}")),
        || a.log(),
    );
    a.freeze();
    std::thread::sleep(PAST_THE_SESSION);

    // B owns the partition now: it applies v1, then the newer replacement v2, and commits both.
    let mut b = Daemon::start_with_env(&setup, b_env);
    produce(&setup.topic, &[(0, record(user, 1, "v2", now))]).await;
    wait_for(
        "replica B to commit both records",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![2],
        || b.log(),
    );
    assert_eq!(bodies(store, user).await, vec!["{\"body\":\"v2\"}"]);

    // A goes on: its old decision reaches the store, and must change nothing.
    a.thaw();
    wait_for(
        "replica A to send its old batch",
        Duration::from_secs(60),
        || a.log().contains("sent the paused batch"),
        || a.log(),
    );
    assert_eq!(
        bodies(store, user).await,
        vec!["{\"body\":\"v2\"}"],
        "the zombie's late write put an older version back"
    );
    // And the store says so: `superseded` (never `unchanged`), logged with both positions. (A's
    // partition was cancelled when it found its assignment lost, so A counts no outcome of it.)
    wait_for(
        "replica A's write logged as superseded",
        Duration::from_secs(30),
        || a.log().contains("superseded: the seq holds a version"),
        || a.log(),
    );
    let line = a
        .log()
        .lines()
        .find(|l| l.contains("superseded: the seq holds a version"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        line.contains("incoming=\"0:0@id:") && line.contains("held=\"0:1@id:"),
        "both positions: {line}"
    );
    assert_eq!(
        a.metrics()
            .get("materializer_groups_total{outcome=\"unchanged\"}"),
        0.0
    );
    a.kill9();
    assert!(b.terminate(Duration::from_secs(30)).success());
    assert_eq!(bodies(store, user).await, vec!["{\"body\":\"v2\"}"]);
}

/// SPEC 7.2: a hand-over carries the generation of the assignment it revokes. A replica frozen
/// past its session finds its assignment lost when it goes on; nobody waits for a lost
/// assignment's hand-over, so it can reach the engine after the replica was given the same
/// partition again. Here it is held back (a failpoint) until then: it must leave the newer
/// assignment's window alone, and records produced afterwards are applied and committed.
/// Before, it closed the new window, and the partition's later records were dropped unread.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_hand_over_of_a_lost_assignment_never_closes_a_newer_one() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("latehandover", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let user = "late-u";
    let now = now_ms();
    produce(&setup.topic, &[(0, record(user, 1, "v1", now))]).await;
    let mut a = Daemon::start_with_env(&setup, &[("MATERIALIZER_DELAY_LOST_HANDOVER_MS", "8000")]);
    wait_for(
        "the first record committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![1],
        || a.log(),
    );
    a.freeze();
    std::thread::sleep(PAST_THE_SESSION);
    a.thaw();
    wait_for(
        "the partition assigned again, then the old hand-over",
        Duration::from_secs(60),
        || {
            let log = a.log();
            log.matches("partitions assigned").count() >= 2
                && log.contains("the lost assignment's hand-over reaches the engine")
        },
        || a.log(),
    );
    let log = a.log();
    let reassigned = log.rfind("partitions assigned").unwrap_or(0);
    let late = log
        .find("the lost assignment's hand-over reaches the engine")
        .unwrap_or(0);
    assert!(
        reassigned < late,
        "the hand-over came after the new assignment: {log}"
    );
    // Records of the newer assignment flow.
    produce(&setup.topic, &[(0, record(user, 2, "v2", now))]).await;
    wait_for(
        "the record after the late hand-over committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![2],
        || a.log(),
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        bodies(&store, user).await,
        vec!["{\"body\":\"v1\"}", "{\"body\":\"v2\"}"]
    );
    assert!(
        a.log().contains(
            "a hand-over of an earlier assignment arrived after the partition was assigned again"
        ),
        "{}",
        a.log()
    );
    assert!(a.terminate(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_write_never_overwrites_the_new_owner_on_redis() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("zombie-redis", Some(redis.url()));
    zombie_loses_to_the_new_owner(setup, &redis_store(&redis.url()).await).await;
}

/// SPEC 7.3 "Positions are never forgotten": the new owner cannot read the log's identity for
/// its first 12 s (a DescribeTopics that times out in a broker roll). Before, its records applied
/// without a position meanwhile, a positionless replace deleted the seq's stored position, and
/// the zombie's older write then applied and reverted the seq for good. Now B's records wait for
/// the identity, are written with their positions, and the zombie's write is `superseded`.
#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_write_never_wins_after_the_new_owner_failed_to_read_the_logs_identity() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("zombie-identity", Some(redis.url()));
    let store = redis_store(&redis.url()).await;
    zombie_loses_to_a_new_owner_started_with(
        setup,
        &store,
        &[("MATERIALIZER_FAIL_IDENTITY", "12000")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_write_never_overwrites_the_new_owner_on_a_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster start");
    let mut setup = DaemonSetup::new("zombie-cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    zombie_loses_to_the_new_owner(setup, &cluster.store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_write_never_overwrites_the_new_owner_on_scylla() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmz_{}", std::process::id());
    let mut setup = DaemonSetup::new("zombie-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    let store = ScyllaStore::connect(
        ScyllaSettings::new(vec![nodes], &keyspace),
        RetentionPolicy::default(),
        Arc::new(SystemClock),
    )
    .await
    .expect("connect to the CQL server");
    zombie_loses_to_the_new_owner(setup, &store).await;
    let _ = store
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
        .await;
}

/// A rebalance protocol, as `[kafka.properties]` chooses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Classic,
    CooperativeSticky,
    Kip848,
}

/// What one replica process said about its assignment, from its log.
#[derive(Debug, Default)]
struct AssignmentLog {
    /// Partitions revoked and then assigned straight back to the same process: a pause of a
    /// partition the rebalance did not move.
    paused_unmoved: usize,
    revokes: usize,
}

fn partitions_in(line: &str) -> Vec<i32> {
    line.split("partitions=[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map(|list| {
            list.split(',')
                .filter_map(|p| p.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn assignment_log(log: &str) -> AssignmentLog {
    let mut result = AssignmentLog::default();
    let mut just_revoked: Vec<i32> = Vec::new();
    for line in log.lines() {
        if line.contains("partitions revoked") {
            result.revokes += 1;
            just_revoked = partitions_in(line);
        } else if line.contains("assignment lost") {
            // This replica left the group (frozen past its session): its partitions moved to
            // another replica before any came back.
            just_revoked.clear();
        } else if line.contains("partitions assigned") {
            let assigned = partitions_in(line);
            result.paused_unmoved += just_revoked.iter().filter(|p| assigned.contains(p)).count();
            just_revoked.clear();
        }
    }
    result
}

/// Three replicas under churn; returns (groups applied more than once, pauses of partitions a
/// rebalance did not move).
async fn three_replicas_under_churn(protocol: Protocol, name: &str) -> (f64, usize) {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new(name, Some(redis.url()));
    setup.max_in_flight = 16;
    match protocol {
        Protocol::Classic => setup
            .properties_extra
            .push("\"partition.assignment.strategy\" = \"range\"".to_owned()),
        Protocol::CooperativeSticky => setup
            .properties_extra
            .push("\"partition.assignment.strategy\" = \"cooperative-sticky\"".to_owned()),
        Protocol::Kip848 => {
            // The broker owns the session of a KIP-848 group; librdkafka refuses the classic
            // session settings with it.
            setup.group_properties.clear();
            setup
                .properties_extra
                .push("\"group.protocol\" = \"consumer\"".to_owned());
        }
    }
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    // One mailbox, `hot`, is damaged early and repaired only at the end: it receives a record in
    // every ten on partition 0 meanwhile, and must hold only itself through every hand-over.
    let mut records = Vec::new();
    for (i, r) in stream(45, 8, 17 + protocol as u64).into_iter().enumerate() {
        if i % 10 == 0 {
            let seq = i as u64 / 10 + 1;
            records.push((0, record("hot", seq, &format!("hot-{seq}"), now_ms())));
        }
        records.push(r);
    }
    let chunk = records.len().div_ceil(4);
    let chunks: Vec<&[(i32, Vec<u8>)]> = records.chunks(chunk).collect();
    let mut offsets = Vec::new();
    let mut logs = Vec::new();
    let mut applied = 0.0;
    // Groups a replica found already applied (identical replays), summed over every replica's
    // life (scraped right before it stops, so a lower bound).
    let retire = |daemon: &Daemon, applied: &mut f64, logs: &mut Vec<String>| {
        *applied += daemon
            .metrics()
            .get("materializer_groups_total{outcome=\"unchanged\"}");
        logs.push(daemon.log());
    };

    // Under cooperative-sticky every replica slot also joins statically, as the chart's pods do
    // (`group.instance.id`); a restarted slot comes back under its own id, as a StatefulSet's pod
    // would.
    let static_ids: Vec<String> = (0..3).map(|i| format!("{}-{i}", setup.group)).collect();
    let start = |slot: usize| {
        if protocol == Protocol::CooperativeSticky {
            Daemon::start_with_env(
                &setup,
                &[(
                    "MATERIALIZER_KAFKA_PROPERTY_GROUP_INSTANCE_ID",
                    static_ids[slot].as_str(),
                )],
            )
        } else {
            Daemon::start(&setup)
        }
    };
    let mut replicas: Vec<Daemon> = (0..3).map(start).collect();
    offsets.extend(produce(&setup.topic, chunks[0]).await);
    wait_for(
        "the fleet to make progress",
        Duration::from_secs(60),
        || {
            replicas
                .iter()
                .map(|d| d.metrics().sum("materializer_records_total"))
                .sum::<f64>()
                >= chunks[0].len() as f64 / 2.0
        },
        || {
            replicas
                .iter()
                .map(Daemon::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        },
    );

    // hot's identity index is lost: its next write fails closed.
    let store = redis_store(&redis.url()).await;
    let runtime = tokio::runtime::Handle::current();
    wait_for(
        "hot's first group",
        Duration::from_secs(60),
        || {
            tokio::task::block_in_place(|| {
                runtime.block_on(support::reference::scan_seqs(&store, "hot"))
            })
            .contains(&1)
        },
        || "hot never got its first group".to_owned(),
    );
    assert!(redis.raw("DEL mm:mbseqbucket:{hot}:1").contains(":1"));

    // A rolling update: each replica in turn drains on SIGTERM and is replaced, while records
    // keep arriving.
    for (i, replica) in replicas.iter_mut().enumerate() {
        retire(replica, &mut applied, &mut logs);
        let status = replica.terminate(Duration::from_secs(40));
        assert!(status.success(), "SIGTERM exits 0: {status:?}");
        *replica = start(i);
        if i == 0 {
            offsets.extend(produce(&setup.topic, chunks[1]).await);
        }
        std::thread::sleep(Duration::from_secs(2));
    }

    // A crash.
    retire(&replicas[1], &mut applied, &mut logs);
    replicas[1].kill9();
    offsets.extend(produce(&setup.topic, chunks[2]).await);
    replicas[1] = start(1);

    // A replica frozen past its session, then continued: its partitions moved meanwhile.
    replicas[2].freeze();
    offsets.extend(produce(&setup.topic, chunks[3]).await);
    std::thread::sleep(PAST_THE_SESSION);
    // What `top` shows meanwhile: the frozen replica down (not dropped), the two others serving
    // every partition between them once the group has moved the frozen one's.
    let addresses: Vec<String> = replicas
        .iter()
        .map(|d| format!("127.0.0.1:{}", d.http_port))
        .collect();
    wait_for(
        "top to show the frozen replica down and every partition served by the others",
        Duration::from_secs(30),
        || {
            let last = top_once(&format!("{protocol:?}, replica 3 frozen"), &addresses);
            let states: Vec<&str> = (0..3)
                .map(|i| last["replicas"][i]["state"].as_str().unwrap_or(""))
                .collect();
            let mut served: Vec<i64> = last["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["replica"] != addresses[2].as_str())
                .filter_map(|p| p["partition"].as_i64())
                .collect();
            served.sort_unstable();
            served.dedup();
            states[2] == "down"
                && states[..2].iter().all(|s| *s != "down")
                && served == (0..i64::from(PARTITIONS)).collect::<Vec<_>>()
        },
        || "the last snapshot is printed above".to_owned(),
    );
    replicas[2].thaw();

    // The operator repairs hot while the fleet runs: its partition's owner reads the partition
    // again and applies what it skipped.
    support::cli::repair(
        &setup.config_file(support::redis_server::free_port()),
        0,
        "hot",
    );

    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);
    wait_for(
        "every record committed by the fleet",
        Duration::from_secs(180),
        || committed(&setup.group, &setup.topic, PARTITIONS) == ends,
        || {
            replicas
                .iter()
                .map(Daemon::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        },
    );
    // Converged: `top` shows three replicas ready and nothing behind.
    let addresses: Vec<String> = replicas
        .iter()
        .map(|d| format!("127.0.0.1:{}", d.http_port))
        .collect();
    wait_for(
        "top to show the fleet ready and caught up",
        Duration::from_secs(30),
        || {
            let last = top_once(&format!("{protocol:?}, converged"), &addresses);
            (0..3).all(|i| last["replicas"][i]["state"] == "ready")
                && last["partitions"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().all(|p| p["lag_records"] == 0))
        },
        || "the last snapshot is printed above".to_owned(),
    );
    for replica in &mut replicas {
        retire(replica, &mut applied, &mut logs);
        let status = replica.terminate(Duration::from_secs(40));
        assert!(status.success(), "SIGTERM exits 0: {status:?}");
    }

    assert!(
        logs.iter().any(|l| l
            .lines()
            .any(|line| line.contains("corrupt mailbox: failing closed")
                && line.contains("user=hot"))),
        "{protocol:?}: hot was blocked before its repair"
    );

    // Exactly the expected dead letters (a record dead-lettered twice is allowed).
    let mut dead = BTreeMap::new();
    for letter in read_all(&setup.dlq_topic) {
        let h = &letter.headers;
        let partition: i32 = h["source_partition"].parse().expect("partition header");
        let offset: i64 = h["source_offset"].parse().expect("offset header");
        dead.insert((partition, offset), h["error_outcome"].clone());
    }
    assert_eq!(dead, reference.dead_letters, "{protocol:?}: dead letters");
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;

    let expected_unchanged = reference.groups.get("unchanged").copied().unwrap_or(0) as f64;
    let again = (applied - expected_unchanged).max(0.0);
    let paused: usize = logs.iter().map(|l| assignment_log(l).paused_unmoved).sum();
    let revokes: usize = logs.iter().map(|l| assignment_log(l).revokes).sum();
    eprintln!(
        "fleet churn, {protocol:?}: {} records, at least {again} groups applied more than once, \
         {revokes} revokes, {paused} pauses of partitions that came straight back",
        records.len()
    );
    (again, paused)
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_under_churn_classic_protocol() {
    three_replicas_under_churn(Protocol::Classic, "fleet-classic").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_under_churn_cooperative_sticky() {
    let (_, paused) = three_replicas_under_churn(Protocol::CooperativeSticky, "fleet-coop").await;
    assert_eq!(
        paused, 0,
        "an incremental rebalance never pauses a partition it does not move"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_under_churn_kip_848_consumer_protocol() {
    let (_, paused) = three_replicas_under_churn(Protocol::Kip848, "fleet-kip848").await;
    assert_eq!(
        paused, 0,
        "an incremental rebalance never pauses a partition it does not move"
    );
}
