//! The dispatch log as production runs it: three KRaft brokers (`scripts/kafka-cluster`), every
//! topic with replication factor 3 and `min.insync.replicas` 2, the group's offsets too. Under
//! load, the brokers a daemon depends on fail one after another: the group coordinator's, a
//! dispatch partition's leader and the dead-letter partition's leader are each killed -9 and
//! started again, then both followers of the dead-letter partition are down for 20 s right after
//! 300 malformed records (no dead letter can be acknowledged by two replicas meanwhile, and the
//! controller quorum is lost with them). The store ends as the log says, the dead letters are
//! exactly the reference's, and every reported outcome is the true one.
//!
//! The cluster is this test's own (its own ports and data), so it is the only test of this
//! binary: it points the helpers at that cluster.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use support::kafka::{bootstrap, create_topic, produce, Daemon, DaemonSetup};
use support::own_servers::OwnServers;
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{
    assert_counters_match, assert_dead_letters_are_the_references, assert_same_state, end_offsets,
    redis_store, reference, stream, wait_committed, wait_first_commit, PARTITIONS,
};

/// Three brokers started by `scripts/kafka-cluster` on private ports, stopped (and their data
/// deleted) on drop.
struct OwnCluster(OwnServers);

impl OwnCluster {
    fn start() -> (Self, String) {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kafka-cluster-{}", std::process::id()));
        // The script's fixed ports (19192-19197), below the kernel's ephemeral range: a broker
        // killed and started again binds its ports anew, and a port picked by `free_port` (an
        // ephemeral one) could meanwhile have gone to another test's server. Only this test
        // runs the cluster.
        let cluster = OwnServers::new(
            "kafka-cluster",
            vec![("KAFKA_CLUSTER_DIR", dir.display().to_string())],
        );
        let bootstrap = cluster.run(&["start"]);
        (Self(cluster), bootstrap)
    }

    fn kill(&self, node: i32) {
        eprintln!("kill -9 broker {node}");
        self.0.run(&["kill", &node.to_string()]);
    }

    fn start_node(&self, node: i32) {
        eprintln!("start broker {node}");
        self.0.run(&["start-node", &node.to_string()]);
    }
}

/// The leader and the replicas of `topic`'s `partition` as the cluster reports them now.
fn placement(topic: &str, partition: i32) -> (i32, Vec<i32>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("metadata client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(20))
        .expect("metadata");
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .expect("the topic in the metadata");
    let partition = topic
        .partitions()
        .iter()
        .find(|p| p.id() == partition)
        .expect("the partition in the metadata");
    (partition.leader(), partition.replicas().to_vec())
}

/// The broker coordinating `group`: the leader of its `__consumer_offsets` partition, which is
/// Java's `String.hashCode` of the group id, made positive, modulo the partition count
/// (`offsets.topic.num.partitions = 4` in scripts/kafka-cluster).
fn coordinator(group: &str) -> i32 {
    let hash = group.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    placement("__consumer_offsets", (hash & 0x7fff_ffff) % 4).0
}

#[tokio::test(flavor = "multi_thread")]
async fn three_brokers_fail_one_after_another_and_the_store_ends_as_the_log_says() {
    let (cluster, bootstrap) = OwnCluster::start();
    // The only test of this binary: every helper now talks to the private cluster.
    std::env::set_var("KAFKA_BOOTSTRAP", &bootstrap);
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("brokers3", Some(redis.url()));
    // librdkafka's default session (45 s), as in production: a coordinator that moves, or
    // brokers down for 20 s, never cost the one replica its assignment, so no record is read
    // twice and each outcome is reported once.
    setup.group_properties.clear();
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let (_, replicas) = placement(&setup.topic, 0);
    assert_eq!(replicas.len(), 3, "the dispatch topic has 3 replicas");

    let records = stream(120, 6, 53);
    let part = records.len() / 4;
    let mut offsets = produce(&setup.topic, &records[..part]).await;
    let daemon = Daemon::start(&setup);
    wait_first_commit(&setup, &daemon, Duration::from_secs(60));

    // The group coordinator's broker.
    let node = coordinator(&setup.group);
    cluster.kill(node);
    offsets.extend(produce(&setup.topic, &records[part..2 * part]).await);
    cluster.start_node(node);

    // A dispatch partition's leader.
    let (node, _) = placement(&setup.topic, 0);
    cluster.kill(node);
    offsets.extend(produce(&setup.topic, &records[2 * part..3 * part]).await);
    cluster.start_node(node);

    // The dead-letter partition's leader.
    let (node, _) = placement(&setup.dlq_topic, 0);
    cluster.kill(node);
    offsets.extend(produce(&setup.topic, &records[3 * part..]).await);
    cluster.start_node(node);

    // 300 malformed records, then both followers of the dead-letter partition down for 20 s:
    // none of those letters can be acknowledged by two replicas until they are back.
    let malformed: Vec<(i32, Vec<u8>)> = (0..300)
        .map(|i| {
            (
                i % PARTITIONS,
                format!("{{\"not a dispatch\": {i}").into_bytes(),
            )
        })
        .collect();
    let mut all = records.clone();
    all.extend(malformed.iter().cloned());
    offsets.extend(produce(&setup.topic, &malformed).await);
    let (leader, replicas) = placement(&setup.dlq_topic, 0);
    let followers: Vec<i32> = replicas.into_iter().filter(|r| *r != leader).collect();
    for node in &followers {
        cluster.kill(*node);
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    for node in &followers {
        cluster.start_node(*node);
    }

    let ends = end_offsets(&all, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(240));
    let metrics = daemon.metrics();
    let reference = reference(&all, &offsets).await;
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
    assert_dead_letters_are_the_references(&reference, &setup.dlq_topic);
    assert_counters_match(&reference, &metrics);
    let mut daemon = daemon;
    assert!(daemon.terminate(Duration::from_secs(30)).success());

    // Brokers restarting are routine: a WARN when a connection or the commits break, an INFO
    // when they work again, and no ERROR (an ERROR is for a person).
    let log = daemon.log();
    let said = |level: &str| log.lines().filter(|l| l.contains(level)).count();
    eprintln!(
        "the daemon's log over 5 broker failures: {} ERROR, {} WARN, {} INFO lines saying a connection works again",
        said(" ERROR "),
        said(" WARN "),
        log.lines()
            .filter(|l| l.contains(" INFO ")
                && (l.contains("works again") || l.contains("succeed again")))
            .count()
    );
    assert_eq!(said(" ERROR "), 0, "{log}");
}
