//! Redis backend figures, against baselines measured in the same run on the same server.
//!
//! (a) Appends/s through the Rust store (concurrent appends to distinct fresh mailboxes, groups of
//!     3 events) versus `redis-benchmark` calling the very same append script with EVALSHA,
//!     pipelined, on the same server: the ratio is the cost of the Rust client path.
//! (b) Bytes of meta + day set + identity index of one mailbox after 31 and after 365 simulated
//!     days of daily writes (libfaketime moves the server's clock), which must stay flat.
//!
//! Run: `cargo bench --bench redis_store` (needs redis-server, redis-benchmark, libfaketime, gcc:
//! `scripts/install-services`). Prints a Markdown report.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use mailbox_materializer::model::{
    Event, EventGroup, MailboxId, Payload, RetentionPolicy, UserId, DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::redis::keys::{event_member, tag, MailboxKeys};
use mailbox_materializer::store::redis::scripts::Scripts;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;
use redis_server::{Clock, Listen, RedisServer};

const APPENDS: u64 = 100_000;
const IN_FLIGHT: u64 = 256;
const ROUNDS: usize = 3;

fn events() -> Vec<Event> {
    (0..3)
        .map(|i| Event {
            event_ordinal: i,
            payload: Payload::from_value(
                &serde_json::json!({"kind": "message", "body": "hello there", "i": i}),
            ),
        })
        .collect()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn rust_appends(store: Arc<RedisStore>, round: usize) -> f64 {
    let today = now_secs() / DAY_SECS;
    let events = Arc::new(events());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..IN_FLIGHT {
        let store = store.clone();
        let events = events.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < APPENDS {
                let user = UserId::parse(&format!("r{round}-u{i}")).expect("valid user id");
                let group = EventGroup {
                    mailbox: MailboxId::new(user, 1),
                    mailbox_seq: 1,
                    created_at: today * DAY_MS + 1,
                    events: events.to_vec(),
                };
                store.append(&group).await.expect("append");
                i += IN_FLIGHT;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    APPENDS as f64 / started.elapsed().as_secs_f64()
}

/// The same script, the same argument shapes, fresh random mailboxes, through redis-benchmark.
fn redis_benchmark_appends(server: &RedisServer, policy: &RetentionPolicy) -> f64 {
    let sha = Scripts::new().append.get_hash().to_owned();
    // Make sure the script is loaded (redis-benchmark only sends EVALSHA).
    let mut load = Command::new("redis-cli");
    load.arg("-s")
        .arg(server.socket())
        .arg("SCRIPT")
        .arg("LOAD");
    load.arg(full_append_source());
    let out = load.output().expect("redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        sha,
        "script hash"
    );

    let today = now_secs() / DAY_SECS;
    let placeholder = MailboxId::new(UserId::parse("u__rand_int__").expect("id"), 1);
    let keys = MailboxKeys::new("mm", &placeholder);
    let mut args: Vec<String> = vec![
        "EVALSHA".into(),
        sha,
        "5".into(),
        keys.epoch.clone(),
        keys.meta.clone(),
        keys.seqbucket.clone(),
        keys.days.clone(),
        keys.day_prefix.clone(),
        "mm".into(),
        tag(&placeholder.user_id),
        "1".into(),
        "1".into(),
        today.to_string(),
        policy.expires_at(today).to_string(),
        policy.future_window_days.to_string(),
        policy.max_active_span_days.to_string(),
        policy.retention_days.to_string(),
    ];
    for e in events() {
        args.push(event_member(
            1,
            e.event_ordinal,
            today * DAY_MS + 1,
            e.payload.as_str(),
        ));
    }
    let out = Command::new("redis-benchmark")
        .arg("-s")
        .arg(server.socket())
        .args([
            "-n",
            &APPENDS.to_string(),
            "-c",
            "16",
            "-P",
            "16",
            "-r",
            "1000000000",
            "--csv",
        ])
        .args(&args)
        .output()
        .expect("redis-benchmark (scripts/install-services installs redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // CSV: "test","rps", then six latency columns; the test name itself holds commas, so count
    // the columns from the end of the second line.
    let line = text.lines().nth(1).unwrap_or_default();
    let fields: Vec<&str> = line.split(',').collect();
    fields
        .len()
        .checked_sub(7)
        .and_then(|i| fields[i].trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

fn full_append_source() -> String {
    format!(
        "{}\n{}\n{}",
        include_str!("../lua/includes/common.lua"),
        include_str!("../lua/includes/promote.lua"),
        include_str!("../lua/append.lua")
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn metadata_bytes(policy: RetentionPolicy) -> Vec<(u64, i64, i64, i64, i64)> {
    let start = 1_805_112_000u64;
    let server = RedisServer::start(Clock::Fake(start), Listen::Unix, &[]);
    let store = RedisStore::connect(RedisSettings::new(server.url(), "mm"), policy)
        .await
        .expect("connect");
    let mailbox = MailboxId::new(UserId::parse("u-bytes").expect("id"), 1);
    let keys = MailboxKeys::new("mm", &mailbox);
    let mut conn = store.conn();
    let mut rows = Vec::new();
    let mut seq = 0;
    for day in 0..365u64 {
        server.set_now(start + day * DAY_SECS);
        for _ in 0..3 {
            seq += 1;
            let group = EventGroup {
                mailbox: mailbox.clone(),
                mailbox_seq: seq,
                created_at: (start / DAY_SECS + day) * DAY_MS + 1,
                events: events(),
            };
            store.append(&group).await.expect("append");
        }
        if [30u64, 364].contains(&day) {
            let mut sizes = Vec::new();
            for key in [&keys.meta, &keys.days, &keys.seqbucket] {
                let bytes: Option<i64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .expect("memory usage");
                sizes.push(bytes.unwrap_or(0));
            }
            rows.push((day + 1, sizes[0], sizes[1], sizes[2], sizes.iter().sum()));
        }
    }
    rows
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and `cargo bench -- --list` must not run the benchmark.
        return;
    }
    let policy = RetentionPolicy::default();
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let store = Arc::new(
        RedisStore::connect(RedisSettings::new(server.url(), "mm"), policy)
            .await
            .expect("connect"),
    );
    let mut rust = Vec::new();
    let mut baseline = Vec::new();
    for round in 0..ROUNDS {
        server.raw("FLUSHALL");
        rust.push(rust_appends(store.clone(), round).await);
        server.raw("FLUSHALL");
        baseline.push(redis_benchmark_appends(&server, &policy));
    }
    let (r, b) = (median(rust.clone()), median(baseline.clone()));
    println!("## Redis appends (fresh mailboxes, groups of 3 events, {APPENDS} per round, {ROUNDS} rounds)\n");
    println!("| path | appends/s (median) | all rounds |");
    println!("|---|---|---|");
    println!("| Rust store, {IN_FLIGHT} appends in flight | {r:.0} | {rust:.0?} |");
    println!("| redis-benchmark EVALSHA, -c 16 -P 16 | {b:.0} | {baseline:.0?} |");
    println!("\nratio Rust / redis-benchmark: **{:.2}**\n", r / b);

    println!("## Metadata bytes of one mailbox, 3 groups a day (MEMORY USAGE)\n");
    println!("| days written | meta | day set | identity index | total |");
    println!("|---|---|---|---|---|");
    for (days, meta, day_set, index, total) in metadata_bytes(policy).await {
        println!("| {days} | {meta} | {day_set} | {index} | {total} |");
    }
}
