//! `/healthz` means something (`daemon::liveness`): a replica whose engine loop or Kafka poll
//! thread is wedged (the `MATERIALIZER_WEDGE` fault point blocks it for good on its first
//! records) answers 503 within `http.liveness_timeout_ms`, naming the loop, so the orchestrator
//! restarts it; before that, and on a healthy replica, it answers 200. A slow store alone never
//! fails it (`faults::a_slow_store_makes_the_daemon_not_ready_and_dead_letters_nothing`).

use crate::support;

use std::time::Duration;

use support::kafka::{create_topic, http_get, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::group_record;

async fn a_wedged_loop_fails_liveness(wedge: &str, named: &str) {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new(&format!("wedge-{wedge}"), Some(redis.url()));
    setup.http_extra = vec!["liveness_timeout_ms = 3000".to_owned()];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start_with_env(&setup, &[("MATERIALIZER_WEDGE", wedge)]);
    wait_for(
        "the daemon to be ready and live",
        Duration::from_secs(60),
        || {
            daemon.ready_status() == Some(200)
                && http_get(daemon.http_port, "/healthz").map(|(s, _)| s) == Some(200)
        },
        || daemon.log(),
    );
    // Idle for longer than the bound: the loops still turn, liveness holds.
    std::thread::sleep(Duration::from_secs(4));
    let idle = http_get(daemon.http_port, "/healthz");
    assert_eq!(
        idle.as_ref().map(|(s, _)| *s),
        Some(200),
        "an idle replica is live: {idle:?}"
    );
    produce(&setup.topic, &[(0, group_record("u", 1, "1"))]).await;
    wait_for(
        &format!("/healthz to fail naming the {named}"),
        Duration::from_secs(60),
        || {
            http_get(daemon.http_port, "/healthz")
                .is_some_and(|(status, body)| status == 503 && body.starts_with(named))
        },
        || daemon.log(),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wedged_engine_loop_fails_liveness() {
    a_wedged_loop_fails_liveness("engine", "engine loop: no progress").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wedged_poll_thread_fails_liveness() {
    a_wedged_loop_fails_liveness("poll", "poll thread: no progress").await;
}
