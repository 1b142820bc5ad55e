//! The Kafka broker crashes (kill -9) and comes back while the daemon runs: nothing is lost, no
//! group is written twice, nothing extra is dead-lettered. The broker is this test's own (its own
//! ports and data), so it is the only test of this binary: it points the helpers at that broker.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::kafka::{create_topic, produce, Daemon, DaemonSetup};
use support::own_servers::OwnServers;
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{
    assert_dead_letters_are_the_references, assert_same_state, end_offsets, redis_store, reference,
    stream, wait_committed, wait_first_commit, PARTITIONS,
};

/// A broker started by `scripts/kafka` on private ports, stopped (and its data deleted) on drop.
fn own_broker() -> (OwnServers, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kafka-restart-{}", std::process::id()));
    let broker = OwnServers::new(
        "kafka",
        vec![
            ("KAFKA_PORT", free_port().to_string()),
            ("KAFKA_CONTROLLER_PORT", free_port().to_string()),
            // Its authenticated listener too: the shared broker holds the default port.
            ("KAFKA_SASL_PORT", free_port().to_string()),
            ("KAFKA_DIR", dir.display().to_string()),
        ],
    );
    let bootstrap = broker.run(&["start"]);
    (broker, bootstrap)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_crash_mid_stream_loses_nothing() {
    let (broker, bootstrap) = own_broker();
    // The only test of this binary: every helper now talks to the private broker.
    std::env::set_var("KAFKA_BOOTSTRAP", &bootstrap);
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("brokercrash", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 4, 23);
    let half = records.len() / 2;
    let mut offsets = produce(&setup.topic, &records[..half]).await;
    let daemon = Daemon::start(&setup);
    wait_first_commit(&setup, &daemon, Duration::from_secs(60));

    broker.run(&["restart"]);
    offsets.extend(produce(&setup.topic, &records[half..]).await);
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(180));

    let expected = reference(&records, &offsets).await;
    let store = redis_store(&redis.url()).await;
    assert_same_state(&expected, &store).await;
    assert_dead_letters_are_the_references(&expected, &setup.dlq_topic);
}
