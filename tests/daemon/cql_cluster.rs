//! The Scylla backend as production runs it: three CQL nodes (`scripts/cassandra-cluster`,
//! Apache Cassandra 5.0), the keyspace with NetworkTopologyStrategy and three replicas, created
//! by `materializer schema apply` and followed at once by the daemon's first writes (the daemon
//! itself may not create schema). Under load one node is killed -9 and started again, one is
//! paused for 8 s (the requests it coordinates time out), and two are killed together (no
//! quorum: every write fails until they are back). The store ends as the log says with exactly
//! the reference's dead letters and outcome counts, writes whose answer was lost included.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::support::kafka::{create_topic, produce, unique, Daemon, DaemonSetup};
use super::support::own_servers::OwnServers;
use super::support::redis_server::free_port;
use super::support::reference::{
    assert_dead_letters_are_the_references, assert_same_state, end_offsets, reference,
    scylla_store, stream, wait_committed, wait_first_commit, PARTITIONS,
};

/// Three Cassandra nodes of this test's own, stopped (and their data deleted) on drop.
struct CqlCluster {
    servers: OwnServers,
    contact_points: String,
}

impl CqlCluster {
    fn start() -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cql-cluster-{}", std::process::id()));
        // The script's fixed ports (19142, 17100, 17301-17303), below the kernel's ephemeral
        // range: a node killed and started again binds its ports anew, and a port picked by
        // `free_port` (an ephemeral one) could meanwhile have gone to another test's server,
        // which then failed to start (seen once on a clean clone: a private Cassandra exited
        // at start-up while this test restarted its nodes). Only this test runs the cluster.
        let servers = OwnServers::new(
            "cassandra-cluster",
            vec![("CASSANDRA_CLUSTER_DIR", dir.display().to_string())],
        );
        let contact_points = servers.run(&["start"]);
        Self {
            servers,
            contact_points,
        }
    }

    /// The first node's contact point (the driver finds the others).
    fn contact_point(&self) -> String {
        self.contact_points
            .split(',')
            .next()
            .expect("a contact point")
            .to_owned()
    }

    fn node(&self, verb: &str, node: u8) {
        eprintln!("cassandra node {node}: {verb}");
        self.servers.run(&[verb, &node.to_string()]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_cql_nodes_crash_pause_and_lose_quorum_and_the_store_ends_as_the_log_says() {
    let cluster = tokio::task::spawn_blocking(CqlCluster::start)
        .await
        .expect("start three cassandra nodes");
    let keyspace = unique("mm_cql3").replace('-', "_");
    let mut setup = DaemonSetup::new("cql3", None);
    setup.scylla = Some((cluster.contact_point(), keyspace.clone()));
    setup.scylla_replication =
        Some("{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}".to_owned());
    setup.store_extra = vec!["create_schema = false".to_owned()];
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;

    // The schema as a step of its own, then the daemon's first writes at once.
    let config = setup.config_file(free_port());
    let applied = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["schema", "apply", "--config"])
        .arg(&config)
        .output()
        .expect("schema apply");
    assert!(
        applied.status.success(),
        "schema apply: {}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );

    let records = stream(60, 4, 59);
    let part = records.len() / 4;
    let mut offsets = produce(&setup.topic, &records[..part]).await;
    let daemon = Daemon::start(&setup);
    wait_first_commit(&setup, &daemon, Duration::from_secs(120));

    // One node crashes and comes back.
    cluster.node("kill", 2);
    offsets.extend(produce(&setup.topic, &records[part..2 * part]).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.node("start-node", 2);
        cluster
    })
    .await
    .expect("start node 2");

    // One node stops answering for 8 s: what it coordinates times out.
    cluster.node("pause", 3);
    offsets.extend(produce(&setup.topic, &records[2 * part..3 * part]).await);
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.node("resume", 3);

    // Two nodes at once: no quorum until they are back.
    cluster.node("kill", 2);
    cluster.node("kill", 3);
    offsets.extend(produce(&setup.topic, &records[3 * part..]).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.node("start-node", 2);
        cluster.node("start-node", 3);
        cluster
    })
    .await
    .expect("start nodes 2 and 3");

    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(240));
    let metrics = daemon.metrics();
    let expected = reference(&records, &offsets).await;
    let store = scylla_store(&cluster.contact_point(), &keyspace).await;
    assert_same_state(&expected, &store).await;
    assert_dead_letters_are_the_references(&expected, &setup.dlq_topic);
    // Outcomes: every count is the reference's. A write whose Paxos round timed out with an
    // unknown outcome (a node paused or killed under it) is retried, and when the first round
    // did apply, the retry brings the same write token and is answered as the round was
    // (`model::written`), never `unchanged`.
    let count =
        |word: &str| metrics.get(&format!("materializer_groups_total{{outcome=\"{word}\"}}"));
    let want = |word: &str| expected.groups.get(word).copied().unwrap_or(0) as f64;
    for word in [
        "inserted",
        "replaced",
        "unchanged",
        "superseded",
        "conflict",
        "rejected",
        "expired_merged",
        "trimmed",
        "stale_epoch",
    ] {
        assert_eq!(count(word), want(word), "{word}");
    }
    let log = daemon.log();
    eprintln!(
        "the daemon's log over four node failures: {} ERROR, {} WARN lines",
        log.lines().filter(|l| l.contains(" ERROR ")).count(),
        log.lines().filter(|l| l.contains(" WARN ")).count()
    );
    drop(daemon);
    drop(cluster);
}
