//! SPEC 7.3 "A wiped store or master": a store that lost everything is detected before a write
//! lands on it. Each slot that holds a mailbox carries a marker (`P:store:{T}`); a script whose
//! slot's marker is gone answers `store_lost`, the write waits (retried, never dead-lettered),
//! `/readyz` fails with `store data: lost`, `materializer_store_lost` is 1, and nothing is written
//! until the operator accepts the loss (`materializer accept-store-loss`) or rebuilds from the
//! log (the daemon stopped, `replay` of each partition from the log's start, the daemon
//! started).

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::kafka::{committed, create_topic, http_get, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{group_record, redis_store, scan_seqs};

fn records(user: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<(i32, Vec<u8>)> {
    seqs.map(|s| (0, group_record(user, s, "b"))).collect()
}

/// Creates the setup's topics (one partition), produces `records`, starts a daemon and waits
/// until its group committed `committed_to`.
async fn running(setup: &DaemonSetup, records: &[(i32, Vec<u8>)], committed_to: i64) -> Daemon {
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    produce(&setup.topic, records).await;
    let daemon = Daemon::start(setup);
    wait_for(
        &format!("offset {committed_to} committed"),
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == vec![committed_to],
        || daemon.log(),
    );
    daemon
}

/// The store went back to u's seq 5 while 6..10 stay committed: 11 and 12 are produced and a
/// daemon started. It finds the store's record below the committed offset, reads the lost
/// 6..10 again, and the mailbox ends as the log says; the loss is a WARN, not a lost store.
async fn heals_at_start(
    setup: &DaemonSetup,
    store: &dyn mailbox_materializer::store::MailboxStore,
) {
    produce(&setup.topic, &records("u", 11..=12)).await;
    let mut daemon = Daemon::start(setup);
    wait_for(
        "seqs 11, 12 committed",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, 1) == vec![12],
        || daemon.log(),
    );
    assert_eq!(scan_seqs(store, "u").await, (1..=12).collect::<Vec<_>>());
    assert!(
        daemon.log().contains("the store went back in time"),
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.metrics().get("materializer_store_lost"), 0.0);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

fn accept_store_loss(setup: &DaemonSetup) -> serde_json::Value {
    let out = support::cli::run_materializer(
        &[
            "accept-store-loss",
            "--config",
            setup
                .config_file(free_port())
                .to_str()
                .expect("config path"),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "accept-store-loss: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// Runs the line of docs/operations.md's store-loss block that holds `step` (`replay` or
/// `accept-store-loss`), as written, with `C` the test's configuration.
fn documented_step(setup: &DaemonSetup, step: &str) -> (std::process::Output, Vec<String>) {
    let block = support::docs::block_with("docs/operations.md", "accept-store-loss --config C");
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("config path");
    let line = support::docs::commands(&block, &[("--config C", &format!("--config {config}"))])
        .into_iter()
        .find(|l| l.contains(&format!("materializer {step} ")))
        .unwrap_or_else(|| panic!("the block runs {step}"));
    (support::docs::run_line(&line), support::docs::shown(&block))
}

fn readyz(daemon: &Daemon) -> (u16, String) {
    http_get(daemon.http_port, "/readyz").unwrap_or_default()
}

/// Waits until the daemon says the store lost its data, and checks that nothing was written.
fn assert_held(daemon: &Daemon, redis: &RedisServer) {
    wait_for(
        "readiness false with store data: lost",
        Duration::from_secs(60),
        || {
            let (status, body) = readyz(daemon);
            status == 503 && body.contains("store data: lost")
        },
        || daemon.log(),
    );
    assert_eq!(daemon.metrics().get("materializer_store_lost"), 1.0);
    assert!(
        daemon.log().contains("store lost"),
        "an ERROR names the loss:\n{}",
        daemon.log()
    );
    // Writes keep being tried; still nothing lands.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        redis.raw("DBSIZE").trim(),
        ":0",
        "nothing written on the wiped store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_under_a_running_daemon_holds_every_write_until_the_loss_is_accepted() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("wiped", Some(redis.url()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    let store = redis_store(&redis.url()).await;
    assert_eq!(scan_seqs(&store, "u").await, vec![1, 2, 3, 4, 5]);

    redis.raw("FLUSHALL");
    produce(&setup.topic, &records("u", 6..=8)).await;
    assert_held(&daemon, &redis);
    assert_eq!(committed(&setup.group, &setup.topic, 1), vec![5]);
    assert!(
        support::kafka::read_all(&setup.dlq_topic).is_empty(),
        "nothing dead-lettered"
    );

    // The operator accepts the loss (docs/operations.md's line, run as written, printing what
    // the doc shows): the waiting writes go on from what the store holds now.
    let (out, shown) = documented_step(&setup, "accept-store-loss");
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    let shown: serde_json::Value = serde_json::from_str(&shown[0]).expect("the doc shows JSON");
    assert_eq!(printed, shown);
    wait_for(
        "the waiting writes applied, ready again",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![8] && readyz(&daemon).0 == 200,
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "u").await, vec![6, 7, 8]);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// A Redis restarted without persistence under a running daemon is the same loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_under_a_running_daemon_is_found_before_a_write_lands() {
    let mut redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("restarted-empty", Some(redis.url()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    redis.restart();
    produce(&setup.topic, &records("u", 6..=8)).await;
    assert_held(&daemon, &redis);

    // The operator rebuilds from the log instead: the daemon stopped, each partition replayed
    // from the log's start (its writes put the markers back), the daemon started again.
    // docs/operations.md's rebuild, run as written.
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    let (out, _) = documented_step(&setup, "replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(scan_seqs(&store, "u").await, (1..=8).collect::<Vec<_>>());
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the rest committed, ready",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![8] && readyz(&daemon).0 == 200,
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "u").await, (1..=8).collect::<Vec<_>>());
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// A store wiped while no daemon ran: found at start, from the group's committed offsets,
/// before the first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_wiped_while_the_daemon_was_stopped_is_found_at_start() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("wiped-stopped", Some(redis.url()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    redis.raw("FLUSHALL");
    produce(&setup.topic, &records("u", 6..=8)).await;
    let mut daemon = Daemon::start(&setup);
    assert_held(&daemon, &redis);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// A new store under a new group is not a wipe, and one under a group that committed nothing
/// either: the daemon writes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_empty_store_is_not_a_wipe() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("new-store", Some(redis.url()));
    let mut daemon = running(&setup, &records("u", 1..=3), 3).await;
    let store = redis_store(&redis.url()).await;
    assert_eq!(scan_seqs(&store, "u").await, vec![1, 2, 3]);
    assert_eq!(daemon.metrics().get("materializer_store_lost"), 0.0);
    assert!(
        redis.raw("KEYS mm:store:*").contains("mm:store:{"),
        "the slot's marker is written with its first mailbox"
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// A master with a replica and `wait_replicas = 0` (the default): seqs 1..5 reach both, the
/// replica is cut off, 6..10 are applied and committed on the master alone, the master dies and
/// the replica is promoted. The daemon, pointed at it, finds that the store holds partition 0
/// only below where the group committed, reads it again from there, and the mailbox ends as the
/// log says: 1..12 (without it: 1..5, 11, 12, and 6..10 never come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_behind_applies_the_lost_writes_again() {
    let (mut master, replica) = tokio::task::spawn_blocking(|| {
        let master = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
        let port = master.port().expect("tcp").to_string();
        let replica = RedisServer::start(
            Clock::Real,
            Listen::Tcp(free_port()),
            &[
                "--replicaof",
                "127.0.0.1",
                &port,
                "--enable-debug-command",
                "yes",
            ],
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !replica
            .raw("INFO replication")
            .contains("master_link_status:up")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica never synced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (master, replica)
    })
    .await
    .expect("servers");
    let setup = DaemonSetup::new("went-back", Some(master.url()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    wait_for(
        "the replica caught up",
        Duration::from_secs(20),
        || {
            let offset = |info: String| {
                info.lines()
                    .find_map(|l| l.strip_prefix("master_repl_offset:"))
                    .map(|v| v.trim().to_owned())
            };
            offset(master.raw("INFO replication")) == offset(replica.raw("INFO replication"))
        },
        || daemon.log(),
    );

    // The replica is cut off: it sleeps and its link is dropped.
    let replica_port = replica.port().expect("tcp");
    let cut_at = std::time::Instant::now();
    std::thread::spawn(move || {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", replica_port)) {
            use std::io::Write;
            let _ = s.write_all(b"DEBUG SLEEP 8\r\n");
            std::thread::sleep(Duration::from_secs(9));
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(master.raw("CLIENT KILL TYPE replica").starts_with(':'));
    produce(&setup.topic, &records("u", 6..=10)).await;
    wait_for(
        "seqs 6..10 committed on the master alone",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    master.stop();
    // The replica answers again once its sleep is over (a PING before would time out).
    std::thread::sleep(Duration::from_secs(9).saturating_sub(cut_at.elapsed()));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !replica.raw("PING").starts_with("+PONG") {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never woke"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(replica.raw("REPLICAOF NO ONE").starts_with("+OK"));
    let promoted = redis_store(&replica.url()).await;
    assert_eq!(
        scan_seqs(&promoted, "u").await,
        vec![1, 2, 3, 4, 5],
        "the replica missed 6..10"
    );

    let mut failed_over = DaemonSetup::new("went-back-2", Some(replica.url()));
    failed_over.topic = setup.topic.clone();
    failed_over.dlq_topic = setup.dlq_topic.clone();
    failed_over.group = setup.group.clone();
    produce(&setup.topic, &records("u", 11..=12)).await;
    let mut daemon = Daemon::start(&failed_over);
    wait_for(
        "seqs 11, 12 committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![12],
        || daemon.log(),
    );
    assert_eq!(
        scan_seqs(&promoted, "u").await,
        (1..=12).collect::<Vec<_>>()
    );
    assert!(
        daemon.log().contains("the store went back in time"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        daemon
            .metrics()
            .get("materializer_store_went_back_total{partition=\"0\"}"),
        1.0
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// One master of a 3-master Redis Cluster loses its data while it keeps its slots (restarted
/// empty, or replaced by an empty node): the writes of its slots' users wait, named, while the
/// other masters' users go on; accepted, they go on too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_of_a_cluster_wiped_holds_only_its_slots_until_accepted() {
    use support::redis_server::RedisCluster;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster");
    let mut setup = DaemonSetup::new("wiped-master", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    let users: Vec<String> = (0..30).map(|u| format!("c{u}")).collect();
    let first: Vec<(i32, Vec<u8>)> = users.iter().map(|u| (0, group_record(u, 1, "b"))).collect();
    let mut daemon = running(&setup, &first, 30).await;
    let wiped = cluster.masters(None)[0];
    let node = &cluster.nodes[wiped];
    assert!(node.raw("FLUSHALL").starts_with("+OK"));
    let store = cluster.store().await;
    only_the_lost_slots_wait_until_accepted(&setup, &daemon, &store, &users, node).await;
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// After one master lost its data: seq 2 of every user is produced; the lost master's users
/// wait (readiness names the loss, nothing is written there) while the other masters' users get
/// theirs; accepted, every seq 2 is committed.
async fn only_the_lost_slots_wait_until_accepted(
    setup: &DaemonSetup,
    daemon: &Daemon,
    store: &dyn mailbox_materializer::store::MailboxStore,
    users: &[String],
    emptied: &RedisServer,
) {
    let second: Vec<(i32, Vec<u8>)> = users.iter().map(|u| (0, group_record(u, 2, "b"))).collect();
    produce(&setup.topic, &second).await;
    wait_for(
        "readiness false with store data: lost",
        Duration::from_secs(60),
        || {
            let (status, body) = readyz(daemon);
            status == 503 && body.contains("store data: lost")
        },
        || daemon.log(),
    );
    // The other masters' users got seq 2; the wiped master's got nothing.
    let wait_until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut others_done = true;
        for user in users {
            let seqs = scan_seqs(store, user).await;
            if !seqs.is_empty() && seqs != vec![1, 2] {
                others_done = false;
            }
        }
        if others_done {
            break;
        }
        assert!(std::time::Instant::now() < wait_until, "{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut lost = 0;
    for user in users {
        if scan_seqs(store, user).await.is_empty() {
            lost += 1;
        }
    }
    assert!(lost > 0, "some users live on the wiped master");
    assert_eq!(
        emptied.raw("DBSIZE").trim(),
        ":0",
        "nothing written on the wiped master"
    );

    let accepted = accept_store_loss(setup);
    assert_eq!(accepted["accepted"], true, "{accepted}");
    wait_for(
        "every seq 2 committed, ready again",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![60] && readyz(daemon).0 == 200,
        || daemon.log(),
    );
    for user in users {
        let seqs = scan_seqs(store, user).await;
        assert!(seqs == vec![1, 2] || seqs == vec![2], "{user}: {seqs:?}");
    }
}

/// The same loss on Scylla: the keyspace dropped under a running daemon (its writes wait, the
/// tables are gone) and created again empty by `schema apply` (or by `check-config --connect`,
/// or a connect with `create_schema`), then, later, also with the daemon stopped and restarted.
/// Every write waits (`store data: lost`, nothing written in the new keyspace) until the loss is
/// accepted; then the waiting records apply. Without the marker the daemon wrote 6..8 into the
/// empty keyspace, ready all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scylla_keyspace_dropped_and_created_again_holds_every_write_until_accepted() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmd_lost_{}", std::process::id());
    let mut setup = DaemonSetup::new("wiped-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    let store = support::reference::scylla_store(&nodes, &keyspace).await;
    assert_eq!(scan_seqs(&store, "u").await, vec![1, 2, 3, 4, 5]);

    support::reference::drop_scylla_keyspace(&store).await;
    let config = setup.config_file(free_port());
    let schema = support::cli::run_materializer(
        &[
            "schema",
            "apply",
            "--config",
            config.to_str().expect("path"),
        ],
        None,
    );
    assert!(schema.status.success(), "{schema:?}");
    produce(&setup.topic, &records("u", 6..=8)).await;
    let lost = |daemon: &Daemon| {
        let (status, body) = readyz(daemon);
        status == 503 && body.contains("store data: lost")
    };
    wait_for(
        "readiness false with store data: lost",
        Duration::from_secs(60),
        || lost(&daemon),
        || daemon.log(),
    );
    assert_eq!(daemon.metrics().get("materializer_store_lost"), 1.0);
    std::thread::sleep(Duration::from_secs(2));
    let store = support::reference::scylla_store(&nodes, &keyspace).await;
    assert_eq!(
        scan_seqs(&store, "u").await,
        Vec::<u64>::new(),
        "nothing written"
    );
    assert_eq!(committed(&setup.group, &setup.topic, 1), vec![5]);

    // Stopped and started again on the empty keyspace: found at start, still waiting.
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "found at start: store data: lost",
        Duration::from_secs(60),
        || lost(&daemon),
        || daemon.log(),
    );
    assert_eq!(
        scan_seqs(&store, "u").await,
        Vec::<u64>::new(),
        "nothing written"
    );

    let accepted = accept_store_loss(&setup);
    assert_eq!(accepted["accepted"], true, "{accepted}");
    wait_for(
        "the waiting writes applied, ready again",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![8] && readyz(&daemon).0 == 200,
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "u").await, vec![6, 7, 8]);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    support::reference::drop_scylla_keyspace(&store).await;
}

/// An older snapshot restored under a stopped daemon (SPEC 7.3, back in time): the store is
/// saved at seq 5, the daemon applies and commits 6..10, stops, and the server is restarted
/// from the old `dump.rdb`. At start the daemon finds the store's record of partition 0 (5)
/// below the committed offset (10), reads the partition again from there, and the mailbox ends
/// as the log says. The snapshot holds the markers, so it is not a wipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_restored_under_a_stopped_daemon_heals_at_start() {
    let mut redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("snapshot", Some(redis.url()));
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    assert!(redis.raw("SAVE").starts_with("+OK"));
    let snapshot = redis.dir().join("at-seq-5.rdb");
    std::fs::copy(redis.dir().join("dump.rdb"), &snapshot).expect("keep the snapshot");
    produce(&setup.topic, &records("u", 6..=10)).await;
    wait_for(
        "seqs 6..10 committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());

    std::fs::copy(&snapshot, redis.dir().join("dump.rdb")).expect("restore the snapshot");
    redis.restart();
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        scan_seqs(&store, "u").await,
        vec![1, 2, 3, 4, 5],
        "the restore lost 6..10"
    );
    heals_at_start(&setup, &store).await;
}

/// Back in time on a 3-master Redis Cluster with replicas: every master's replica is cut off
/// (SIGSTOP, its link dropped), 6..10 are applied and committed on the masters alone, the
/// masters die and the stale replicas take over (`CLUSTER FAILOVER TAKEOVER`). The daemon,
/// started again, finds the store's record of partition 0 below the committed offset (the
/// record's copy on that master went back with it), reads the partition again, and the mailbox
/// ends as the log says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_replica_promoted_behind_heals_at_start() {
    use support::redis_server::RedisCluster;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(Clock::Real))
        .await
        .expect("cluster");
    let mut setup = DaemonSetup::new("went-back-cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    let mut daemon = running(&setup, &records("u", 1..=5), 5).await;
    let pairs = cut_off_every_replica(&cluster, &daemon);
    produce(&setup.topic, &records("u", 6..=10)).await;
    wait_for(
        "seqs 6..10 committed on the masters alone",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    let cluster = fail_over_to_the_stale_replicas(cluster, &pairs).await;
    let store = cluster.store().await;
    assert_eq!(
        scan_seqs(&store, "u").await,
        vec![1, 2, 3, 4, 5],
        "the promoted replica missed 6..10"
    );

    heals_at_start(&setup, &store).await;
}

/// One master of a 3-master cluster dies and is replaced by a new, empty node that takes over
/// its slots (`CLUSTER FORGET` on the others, `CLUSTER ADDSLOTSRANGE` and `BUMPEPOCH` on the new
/// one: the manual replacement of a master without replica). The slots' markers are not on the
/// new node: its users' writes wait, named, and the other masters' users go on; accepted, every
/// write goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_replaced_by_an_empty_node_holds_only_its_slots_until_accepted() {
    use support::redis_server::RedisCluster;
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster");
    let mut setup = DaemonSetup::new("replaced-master", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    let users: Vec<String> = (0..30).map(|u| format!("c{u}")).collect();
    let first: Vec<(i32, Vec<u8>)> = users.iter().map(|u| (0, group_record(u, 1, "b"))).collect();
    let mut daemon = running(&setup, &first, 30).await;

    let replaced = cluster.masters(None)[0];
    let id = resp_id(&cluster.nodes[replaced].raw("CLUSTER MYID"));
    // Its slot ranges, from its own line of CLUSTER NODES (`myself,master ... 0-5460`).
    let nodes = cluster.nodes[replaced].raw("CLUSTER NODES");
    let mine = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("its own line")
        .to_owned();
    let ranges: Vec<(String, String)> = mine
        .split_whitespace()
        .skip(8)
        .map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            (a.to_owned(), b.to_owned())
        })
        .collect();
    assert!(!ranges.is_empty(), "{mine}");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.add_master(Clock::Real);
        std::sync::Arc::get_mut(&mut cluster.nodes[replaced])
            .expect("the node is not shared")
            .stop();
        let fresh = cluster.nodes.len() - 1;
        for (i, node) in cluster.nodes.iter().enumerate() {
            if i != replaced {
                let _ = node.raw(&format!("CLUSTER FORGET {id}"));
            }
        }
        let mut add = String::from("CLUSTER ADDSLOTSRANGE");
        for (a, b) in &ranges {
            add.push_str(&format!(" {a} {b}"));
        }
        let added = cluster.nodes[fresh].raw(&add);
        assert!(added.starts_with("+OK"), "{add}: {added}");
        let _ = cluster.nodes[fresh].raw("CLUSTER BUMPEPOCH");
        cluster.wait_ok(Some(replaced));
        (cluster, fresh)
    })
    .await
    .expect("replacement");
    let (cluster, fresh) = cluster;
    let store = cluster.store().await;
    only_the_lost_slots_wait_until_accepted(&setup, &daemon, &store, &users, &cluster.nodes[fresh])
        .await;
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// The node id in a `CLUSTER MYID` reply, however the reply is framed.
fn resp_id(reply: &str) -> String {
    reply
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|part| part.len() == 40)
        .unwrap_or_default()
        .to_owned()
}

/// The same failover under a daemon that keeps running (its assignment never changes). Users u
/// and w lose 6..10 with the master; after the failover only u gets a record (11). The daemon
/// applies it, and its next record write finds the store's record of partition 0 (5, on the
/// promoted replica) below what it recorded itself (10): a WARN, the metric, the record left as
/// evidence, and the partition read again from 5. w heals by itself (`[1..10]`); u already
/// holds 11 above its lost seqs, so the re-read of its 6 finds seq 6 below the mailbox's
/// largest seq without an identity and fails closed (`corrupt`, blocked, loud) until
/// `replay --reset-mailboxes` rebuilds it: `[1..11]`. Before, both mailboxes kept their gap
/// silently (`w` = `[1..5]`, `u` = `[1..5, 11]`) until the next rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_replica_promoted_behind_under_a_running_daemon_is_found_at_its_next_record()
{
    use support::redis_server::RedisCluster;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(Clock::Real))
        .await
        .expect("cluster");
    let mut setup = DaemonSetup::new("went-back-running", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    // u and w in the same slot (one hash tag each, chosen to share a master is not needed:
    // both are checked on whichever masters hold them).
    let both = |seqs: std::ops::RangeInclusive<u64>| -> Vec<(i32, Vec<u8>)> {
        seqs.flat_map(|s| {
            [
                (0, group_record("u", s, "b")),
                (0, group_record("w", s, "b")),
            ]
        })
        .collect()
    };
    produce(&setup.topic, &both(1..=5)).await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "seqs 1..5 committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    // Every master's replica is cut off: whichever masters hold u, w and the records, they lose
    // 6..10 with them.
    let pairs = cut_off_every_replica(&cluster, &daemon);
    produce(&setup.topic, &both(6..=10)).await;
    wait_for(
        "seqs 6..10 committed on the masters alone",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![20],
        || daemon.log(),
    );
    // Every master dies; every stale replica takes over.
    let cluster = fail_over_to_the_stale_replicas(cluster, &pairs).await;
    let store = cluster.store().await;

    produce(&setup.topic, &records("u", 11..=11)).await;
    let store_ref = &store;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while scan_seqs(store_ref, "w").await != (1..=10).collect::<Vec<_>>() {
        assert!(
            std::time::Instant::now() < deadline,
            "w never healed: {:?}\n{}",
            scan_seqs(store_ref, "w").await,
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        daemon.log().contains("the store went back in time"),
        "{}",
        daemon.log()
    );
    assert!(
        daemon
            .metrics()
            .get("materializer_store_went_back_total{partition=\"0\"}")
            >= 1.0
    );
    wait_for(
        "u fails closed",
        Duration::from_secs(60),
        || daemon.log().contains("corrupt mailbox") && daemon.log().contains("user=u"),
        || daemon.log(),
    );
    assert!(
        committed(&setup.group, &setup.topic, 1)[0] < 21,
        "nothing committed past u's gap"
    );

    // The operator rebuilds u from the log while the daemon runs: it then reads on.
    let (out, summary) = support::cli::replay(
        &setup.config_file(free_port()),
        &[
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--user",
            "u",
            "--reset-mailboxes",
        ],
    );
    assert!(out.status.success(), "{summary}");
    wait_for(
        "everything committed",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, 1) == vec![21],
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "u").await, (1..=11).collect::<Vec<_>>());
    assert_eq!(scan_seqs(&store, "w").await, (1..=10).collect::<Vec<_>>());
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// Sends `sig` (`-STOP`, `-CONT`) to a process.
fn signal(sig: &str, pid: u32) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success());
}

/// Cuts every master's replica off once it caught up: the replica stopped (SIGSTOP) and its link
/// dropped by the master, so nothing written from now on reaches it, not even through its
/// socket's buffer when it wakes. Answers `(master, replica)` pairs by node index.
fn cut_off_every_replica(
    cluster: &support::redis_server::RedisCluster,
    daemon: &Daemon,
) -> Vec<(usize, usize)> {
    let offset = |i: usize| {
        cluster.nodes[i]
            .raw("INFO replication")
            .lines()
            .find_map(|l| {
                l.strip_prefix("master_repl_offset:")
                    .map(|v| v.trim().to_owned())
            })
    };
    let mut pairs = Vec::new();
    for master in cluster.masters(None) {
        let port = cluster.nodes[master].port().expect("tcp").to_string();
        let replica = (0..cluster.nodes.len())
            .find(|i| {
                let role = cluster.nodes[*i].raw("ROLE");
                role.contains("slave") && role.contains(&port)
            })
            .expect("each master's replica");
        wait_for(
            "the replica caught up",
            Duration::from_secs(20),
            || offset(master) == offset(replica),
            || daemon.log(),
        );
        pairs.push((master, replica));
    }
    for (master, replica) in &pairs {
        signal("-STOP", cluster.nodes[*replica].pid());
        assert!(cluster.nodes[*master]
            .raw("CLIENT KILL TYPE replica")
            .starts_with(':'));
    }
    pairs
}

/// Every master of `pairs` dies and its stale replica takes over (`CLUSTER FAILOVER TAKEOVER`);
/// answers once every node left serves every slot.
async fn fail_over_to_the_stale_replicas(
    mut cluster: support::redis_server::RedisCluster,
    pairs: &[(usize, usize)],
) -> support::redis_server::RedisCluster {
    for (master, _) in pairs {
        std::sync::Arc::get_mut(&mut cluster.nodes[*master])
            .expect("the node is not shared")
            .stop();
    }
    for (_, replica) in pairs {
        signal("-CONT", cluster.nodes[*replica].pid());
    }
    let started = std::time::Instant::now();
    for (_, replica) in pairs {
        while !cluster.nodes[*replica].raw("ROLE").contains("master") {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "a replica never took over"
            );
            let _ = cluster.nodes[*replica].raw("CLUSTER FAILOVER TAKEOVER");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let killed: Vec<usize> = pairs.iter().map(|(m, _)| *m).collect();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !(0..cluster.nodes.len())
            .filter(|i| !killed.contains(i))
            .all(|i| {
                let info = cluster.nodes[i].raw("CLUSTER INFO");
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            })
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    })
    .await
    .expect("failover")
}
