//! Faults while the daemon runs, on real servers: each ends in the memory reference's state,
//! with nothing lost, no group twice, and nothing dead-lettered that the reference does not.

use crate::support;

use std::time::Duration;

use support::kafka::{create_topic, produce, read_all, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{
    assert_same_state, end_offsets, redis_store, reference, stream, wait_committed, PARTITIONS,
};

/// A store that answers slowly (the server blocked by `DEBUG SLEEP`): the daemon turns not
/// ready, lag grows, nothing is dead-lettered, and once the store answers again everything
/// flows to the reference's state.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_store_makes_the_daemon_not_ready_and_dead_letters_nothing() {
    let redis = RedisServer::start(
        Clock::Real,
        Listen::Unix,
        &["--enable-debug-command", "yes"],
    );
    let setup = DaemonSetup::new("slowstore", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 4, 11);
    let half = records.len() / 2;
    let mut offsets = produce(&setup.topic, &records[..half]).await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "the daemon to be ready",
        Duration::from_secs(60),
        || daemon.ready_status() == Some(200),
        || daemon.log(),
    );

    // Block the server for 8 s, then produce the rest while it sleeps.
    let mut sleeper = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(redis.socket())
        .args(["DEBUG", "SLEEP", "8"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-cli");
    std::thread::sleep(Duration::from_millis(300));
    offsets.extend(produce(&setup.topic, &records[half..]).await);
    wait_for(
        "readiness to turn false while the store does not answer",
        Duration::from_secs(7),
        || daemon.ready_status() == Some(503),
        || daemon.log(),
    );
    wait_for(
        "lag to show the records waiting",
        Duration::from_secs(7),
        || daemon.metrics().sum("materializer_consumer_lag") > 0.0,
        || daemon.metrics().text,
    );
    let _ = sleeper.wait();

    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(120));
    wait_for(
        "readiness to come back",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || daemon.log(),
    );
    let expected = reference(&records, &offsets).await;
    let store = redis_store(&redis.url()).await;
    assert_same_state(&expected, &store).await;
    let letters = read_all(&setup.dlq_topic);
    assert_eq!(
        letters.len(),
        expected.dead_letters.len(),
        "exactly the reference's dead letters: nothing dead-lettered for a slow store"
    );
    assert!(
        daemon.metrics().sum("materializer_store_errors_total") > 0.0,
        "the timeouts were counted"
    );
}
