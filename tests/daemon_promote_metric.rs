//! `promote_expired_buckets_total` counts the expired days an append compacts on its way (SPEC 9),
//! not only explicit promotes: a daemon on a memory store whose clock moves past a day's expiry
//! between two records of one user reports that day.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mailbox_materializer::daemon::metrics;
use mailbox_materializer::model::{RetentionPolicy, DAY_SECS};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::ManualClock;
use support::in_process::InProcessDaemon;
use support::kafka::{create_topic, produce, DaemonSetup};

fn record(user: &str, seq: u64, at_secs: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": at_secs * 1000,
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]
    })
    .to_string()
    .into_bytes()
}

fn counter(text: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("materializer_promote_expired_buckets_total ")
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_days_compacted_by_appends_are_counted() {
    let handle = metrics::install().expect("recorder");
    let setup = DaemonSetup::new("promotemetric", None);
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .expect("clock");
    let clock = ManualClock::new(now);
    let store = Arc::new(MemoryStore::new(
        RetentionPolicy::default(),
        Arc::new(clock.clone()),
    ));
    let daemon = InProcessDaemon::spawn(&setup.config(), store.clone());
    produce(&setup.topic, &[(0, record("u", 1, now))]).await;
    daemon.wait_final(1, Duration::from_secs(60)).await;
    let before = counter(&handle.render());
    assert!(before >= 0.0, "exported from the start");

    // 32 days later the first day has expired; the next append promotes it.
    let later = now + 32 * DAY_SECS;
    clock.set(later);
    produce(&setup.topic, &[(0, record("u", 2, later))]).await;
    daemon.wait_final(2, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&handle.render()) < before + 1.0 {
        assert!(
            Instant::now() < deadline,
            "the append's promote is counted: {}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.stop().await;
}
