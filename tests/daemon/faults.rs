//! Faults while the daemon runs, on real servers: each ends in the memory reference's state,
//! with nothing lost, no group twice, and nothing dead-lettered that the reference does not.

use crate::support;

use std::time::Duration;

use support::kafka::{create_topic, produce, read_all, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{
    assert_counters_match, assert_same_state, end_offsets, redis_store, reference, stream,
    wait_committed, PARTITIONS,
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
    let mut setup = DaemonSetup::new("slowstore", Some(redis.url()));
    // A slow store is readiness's business, never liveness's: `/healthz` stays ok even with a
    // liveness bound well below the store's 8 s of silence.
    setup.http_extra = vec!["liveness_timeout_ms = 3000".to_owned()];
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
    while sleeper.try_wait().ok().flatten().is_none() {
        assert_eq!(
            support::kafka::http_get(daemon.http_port, "/healthz").map(|(s, _)| s),
            Some(200),
            "a slow store never fails liveness"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

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

/// SPEC 7, error classes: a server that keeps losing its scripts (`SCRIPT FLUSH` in a loop,
/// as a restart or an operator's flush would, between a batch's NOSCRIPT and its resend) during
/// a catch-up costs retries, never a dead letter: a valid record is never refused for the
/// server's state, whether it came alone or in a batch. Every outcome, every dead letter and
/// the final state equal the reference's.
#[tokio::test(flavor = "multi_thread")]
async fn scripts_flushed_in_a_loop_during_a_catch_up_dead_letter_nothing_extra() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("noscript", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(60, 10, 23);
    let offsets = produce(&setup.topic, &records).await;
    let reference = reference(&records, &offsets).await;

    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicU64::new(0));
    let flusher = {
        let (stop, flushes) = (stop.clone(), flushes.clone());
        let socket = redis.socket();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&socket) {
                    let mut reply = [0u8; 64];
                    if s.write_all(b"SCRIPT FLUSH\r\n").is_ok() && s.read(&mut reply).is_ok() {
                        flushes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let daemon = Daemon::start(&setup);
    let total = records.len() as f64;
    wait_for(
        "every record final",
        Duration::from_secs(120),
        || daemon.metrics().sum("materializer_records_total") >= total,
        || daemon.log(),
    );
    stop.store(true, Ordering::Relaxed);
    flusher.join().expect("flusher");
    assert!(
        flushes.load(Ordering::Relaxed) > 10,
        "the scripts were flushed"
    );

    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_store_errors_total{backend=\"redis\",kind=\"store_refused\"}"),
        0.0,
        "nothing refused for the server's state"
    );
    assert_counters_match(&reference, &metrics);
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(60));
    assert_eq!(
        read_all(&setup.dlq_topic).len(),
        reference.dead_letters.len(),
        "only the reference's dead letters"
    );
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
}
