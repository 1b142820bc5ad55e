//! SPEC 7.3 "Memory": Redis at a small `maxmemory` with `noeviction` (the policy the product
//! requires) under the daemon's writes. Every script that adds data is refused whole by Redis's
//! own memory check once the server is full (before, the append's first write was an
//! `EXPIREAT`, which Redis does not check, and the daemon took a 3 MiB server to 6.4 MiB).
//! `OOM` is transient: readiness says "store full" naming the master, nothing is dead-lettered,
//! and once the limit is raised everything applies and the store equals the memory reference.

use crate::support;

use std::time::Duration;

use support::kafka::{
    committed, create_topic, http_get, produce, read_all, wait_for, Daemon, DaemonSetup,
};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{assert_same_state, now_ms, redis_store, reference};

const LIMIT: u64 = 4 << 20;

fn info_number(redis: &RedisServer, field: &str) -> u64 {
    let info = redis.raw("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO memory: {info}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_at_maxmemory_never_grows_past_it_and_everything_applies_once_raised() {
    let redis = RedisServer::start(
        Clock::Real,
        Listen::Unix,
        &[
            "--maxmemory",
            &LIMIT.to_string(),
            "--maxmemory-policy",
            "noeviction",
        ],
    );
    let setup = DaemonSetup::new("redis-full", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    // About 9 MB of groups for a 4 MiB server: 300 users, 12 seqs each, 2 KB payloads.
    let now = now_ms();
    let body = "m".repeat(2_000);
    let records: Vec<(i32, Vec<u8>)> = (1..=12u64)
        .flat_map(|seq| (0..300u64).map(move |u| (u, seq)))
        .map(|(u, seq)| {
            let record = serde_json::json!({
                "dispatch_id": format!("full-{u}-{seq}"), "group_id": "g", "committed_at": now,
                "deliveries": [{"user_id": format!("full-u{u}"), "epoch": 1, "mailbox_seq": seq,
                    "events": [{"event_ordinal": 0, "payload": {"body": body}}]}]
            });
            (0, record.to_string().into_bytes())
        })
        .collect();
    let offsets = produce(&setup.topic, &records).await;
    let end = offsets.last().copied().unwrap_or(0) + 1;

    let mut daemon = Daemon::start(&setup);
    wait_for(
        "readiness to say the store is full",
        Duration::from_secs(90),
        || {
            http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                status == 503 && body.contains("store memory: store full: ")
            })
        },
        || {
            format!(
                "{}\n{}",
                http_get(daemon.http_port, "/readyz")
                    .map(|r| r.1)
                    .unwrap_or_default(),
                daemon.log()
            )
        },
    );
    // The periodic read of every master (10 s) names the master and its use.
    wait_for(
        "readiness to name the full master",
        Duration::from_secs(30),
        || {
            http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                status == 503 && body.contains("uses") && body.contains("of maxmemory 4.0 MiB")
            })
        },
        || {
            http_get(daemon.http_port, "/readyz")
                .map(|r| r.1)
                .unwrap_or_default()
        },
    );
    assert_eq!(daemon.metrics().get("materializer_store_full"), 1.0);
    // Full for a while: the writes wait, and the server stays at its limit.
    std::thread::sleep(Duration::from_secs(3));
    let peak = info_number(&redis, "used_memory_peak");
    assert!(
        peak <= LIMIT + LIMIT / 10,
        "used_memory_peak {peak} is past maxmemory {LIMIT} by more than a script's writes"
    );
    assert!(
        read_all(&setup.dlq_topic).is_empty(),
        "a write refused for memory was dead-lettered"
    );
    assert!(
        committed(&setup.group, &setup.topic, 1)[0] < end,
        "everything fit under the limit: the test proves nothing"
    );

    // The limit raised: everything applies, exactly as the reference says.
    assert!(redis.raw("CONFIG SET maxmemory 0").contains("OK"));
    wait_for(
        "every record committed once memory is free",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == vec![end],
        || daemon.log(),
    );
    wait_for(
        "ready again",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || {
            http_get(daemon.http_port, "/readyz")
                .map(|r| r.1)
                .unwrap_or_default()
        },
    );
    assert!(read_all(&setup.dlq_topic).is_empty());
    let expected = reference(&records, &offsets).await;
    assert_same_state(&expected, &redis_store(&redis.url()).await).await;
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}
