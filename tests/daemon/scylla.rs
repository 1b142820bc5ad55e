//! The daemon on the Scylla backend (Apache Cassandra in the tests) with a real Kafka broker: a
//! CQL server stopped and started mid-stream loses nothing, and a repair heals a corrupt mailbox
//! while the daemon runs.

use crate::support;

use std::time::Duration;

use mailbox_materializer::model::UserId;
use support::cassandra::PrivateCassandra;
use support::kafka::{committed, create_topic, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::free_port;
use support::reference::{
    assert_dead_letters_are_the_references, assert_same_state, drop_scylla_keyspace, end_offsets,
    group_record, lose_scylla_identity_rows, now_ms, reference, scan_seqs, scylla_store, stream,
    wait_committed, wait_first_commit, PARTITIONS,
};

fn shared_nodes() -> String {
    std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    })
}

fn keyspace(name: &str) -> String {
    format!("mmd_{name}_{}", std::process::id())
}

/// The CQL server is stopped and started again (on its data) while records arrive: the daemon
/// turns not ready, retries, and ends in the memory reference's state with exactly its dead
/// letters.
#[tokio::test(flavor = "multi_thread")]
async fn a_cql_server_restart_mid_stream_loses_nothing() {
    let cassandra = tokio::task::spawn_blocking(|| {
        PrivateCassandra::start_durable("daemon-restart", (free_port(), free_port(), free_port()))
    })
    .await
    .expect("start cassandra");
    let nodes = cassandra.contact_point();
    let keyspace = keyspace("restart");
    let mut setup = DaemonSetup::new("cqlrestart", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(30, 3, 31);
    let half = records.len() / 2;
    let mut offsets = produce(&setup.topic, &records[..half]).await;
    let daemon = Daemon::start(&setup);
    wait_first_commit(&setup, &daemon, Duration::from_secs(120));

    let restarting = tokio::task::spawn_blocking(move || {
        cassandra.restart();
        cassandra
    });
    offsets.extend(produce(&setup.topic, &records[half..]).await);
    wait_for(
        "readiness to turn false while the CQL server is away",
        Duration::from_secs(60),
        || daemon.ready_status() == Some(503),
        || daemon.log(),
    );
    let cassandra = restarting.await.expect("restart cassandra");
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(180));

    let expected = reference(&records, &offsets).await;
    let store = scylla_store(&cassandra.contact_point(), &keyspace).await;
    assert_same_state(&expected, &store).await;
    assert_dead_letters_are_the_references(&expected, &setup.dlq_topic);
    drop(daemon);
    drop(cassandra);
}

/// A corrupt mailbox on Scylla blocks only itself; `replay --reset-mailboxes` heals it while
/// the daemon runs, and the daemon's waiting deliveries apply after the swap.
#[tokio::test(flavor = "multi_thread")]
async fn a_scylla_repair_heals_a_corrupt_mailbox_while_the_daemon_runs() {
    let nodes = shared_nodes();
    let keyspace = keyspace("repair");
    let mut setup = DaemonSetup::new("cqlrepair", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start(&setup);
    produce(
        &setup.topic,
        &[
            (0, group_record("victim", 1, "a")),
            (0, group_record("bystander", 1, "a")),
            (0, group_record("victim", 2, "b")),
        ],
    )
    .await;
    wait_for(
        "the first records committed",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == [3],
        || daemon.log(),
    );
    let store = scylla_store(&nodes, &keyspace).await;
    // Refusals read the rows back unchanged (nothing touched before anything is decided).
    let today = now_ms() / 86_400_000;
    let victim = UserId::parse("victim").expect("user");
    let rows_before = store.dump_user(&victim, &[today]).await.expect("dump");
    let config = setup.config_file(free_port());
    for (args, reason) in [
        (vec!["--from-offset", "999999"], "empty_range"),
        (
            vec!["--from-offset", "0", "--to-offset", "0"],
            "end_below_committed",
        ),
    ] {
        let fixed = [
            "--partition",
            "0",
            "--user",
            "victim",
            "--reset-mailboxes",
            "--progress",
            "off",
        ];
        let (out, summary) = support::cli::replay(&config, &[&fixed[..], &args].concat());
        assert_eq!(out.status.code(), Some(1), "{summary}");
        assert_eq!(summary["refused"]["reason"], reason, "{summary}");
        assert_eq!(
            store.dump_user(&victim, &[today]).await.expect("dump"),
            rows_before,
            "{args:?} left every row as it was"
        );
    }
    // Lose the victim's identity rows in its live slot: its next append fails closed.
    lose_scylla_identity_rows(&store, "victim").await;
    produce(
        &setup.topic,
        &[
            (0, group_record("victim", 3, "c")),
            (0, group_record("bystander", 2, "b")),
        ],
    )
    .await;
    wait_for(
        "the victim to fail closed",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 1.0
        },
        || daemon.log(),
    );

    let summary = support::cli::repair(&config, 0, "victim");
    assert_eq!(summary["swapped_users"], serde_json::json!(["victim"]));
    wait_for(
        "the daemon to resume past the repaired mailbox",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == [5],
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "victim").await, vec![1, 2, 3]);
    assert_eq!(scan_seqs(&store, "bystander").await, vec![1, 2]);
    drop(daemon);
    drop_scylla_keyspace(&store).await;
}
