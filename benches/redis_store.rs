//! Redis backend figures, each against a baseline measured in the same run on the same server.
//!
//! (a) **Server time per script call** (`INFO commandstats`, `usec_per_call` of `EVALSHA`) for
//!     each path of the store — fresh mailbox, warm append, warm append into a mailbox with 30
//!     active days, identical replay, one 50-group scan page (its two script calls together) —
//!     next to a raw script of comparable reach (TIME, 2 HGET, 4 HSET, ZSCORE + ZADD, 2 ZADD,
//!     2 EXPIREAT GT) run the same way. With it, the commands each path runs inside its script
//!     per call (the profile the scripts are cut by), and the CPU seconds of both processes.
//! (b) **Appends/s** through the Rust store versus `redis-benchmark` calling the very same append
//!     script with EVALSHA, pipelined: the ratio is the cost of the Rust client path.
//! (c) **Bytes** of meta + day set + identity index of one mailbox after 31 and after 365
//!     simulated days of daily writes (libfaketime moves the server's clock): must stay flat.
//!
//! Run: `cargo bench --bench redis_store` (needs redis-server, redis-benchmark, libfaketime, gcc:
//! `scripts/install-services`). Prints a Markdown report.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use mailbox_materializer::model::{
    AppendOutcome, Event, EventGroup, MailboxId, Payload, RetentionPolicy, ScanRequest, UserId,
    DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::redis::keys::{event_member, tag, MailboxKeys};
use mailbox_materializer::store::redis::scripts::Scripts;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;
use redis_server::{Clock, Listen, RedisServer};

/// Users × groups of the per-call workload (the shape of `apply --store redis` on a dispatch log).
const USERS: u64 = 2_000;
const GROUPS: u64 = 10;
/// Mailboxes with 30 active days (60 groups, two a day) for the 30-day appends and the scans.
const WIDE_USERS: u64 = 200;
const WIDE_GROUPS: u64 = 60;
const SCANS_PER_MAILBOX: u64 = 5;
/// Appends in flight on the one multiplexed connection.
const IN_FLIGHT: u64 = 64;

const THROUGHPUT_APPENDS: u64 = 100_000;
const THROUGHPUT_IN_FLIGHT: u64 = 256;
const ROUNDS: usize = 3;

/// The baseline script: the reach of an append (TIME, 2 HGET, 4 HSET, ZSCORE + ZADD, 2 ZADD,
/// 2 EXPIREAT GT) without any of its decisions.
/// KEYS: meta, identity index, day set, day bucket. ARGV: seq16, expires_at, day, member.
const ANCHOR_LUA: &str = r"
local t = redis.call('TIME')
local a = redis.call('HGET', KEYS[1], 'seqbucket_max_seq')
local b = redis.call('HGET', KEYS[1], 'user_trim_seq')
redis.call('HSET', KEYS[1], 'bucket_max_seq:' .. ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'bucket_expires_at:' .. ARGV[3], ARGV[2])
redis.call('HSET', KEYS[1], 'seqbucket_max_seq', ARGV[1])
redis.call('HSET', KEYS[1], 'active_day_count', '1')
local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[4])
redis.call('EXPIREAT', KEYS[4], ARGV[2], 'GT')
redis.call('EXPIREAT', KEYS[2], ARGV[2], 'GT')
return 1";

fn events(n: u32) -> Vec<Event> {
    (0..n)
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

fn user(prefix: &str, i: u64) -> UserId {
    UserId::parse(&format!("{prefix}{i}")).expect("valid user id")
}

fn group(user: UserId, seq: u64, day: u64, n: u32) -> EventGroup {
    EventGroup {
        mailbox: MailboxId::new(user, 1),
        mailbox_seq: seq,
        created_at: day * DAY_MS + 1,
        events: events(n),
    }
}

/// CPU seconds (user + system) a process has used so far, from `/proc/<pid>/stat`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// One measured phase: calls and server microseconds per command, from `INFO commandstats`.
struct Phase {
    name: &'static str,
    /// Operations of the phase (appends, scans, anchor calls).
    ops: u64,
    /// command -> (calls, usec), inner commands of scripts included.
    stats: BTreeMap<String, (u64, u64)>,
    wall: f64,
    server_cpu: f64,
    client_cpu: f64,
}

impl Phase {
    fn evalsha(&self) -> (u64, u64) {
        self.stats.get("evalsha").copied().unwrap_or((0, 0))
    }

    /// Server µs of script execution per operation.
    fn usec_per_op(&self) -> f64 {
        self.evalsha().1 as f64 / self.ops as f64
    }

    /// Commands run inside the scripts, per operation.
    fn inner_per_op(&self) -> Vec<(String, f64)> {
        self.stats
            .iter()
            .filter(|(name, _)| {
                !matches!(
                    name.as_str(),
                    "evalsha" | "script|load" | "info" | "config|resetstat" | "ping"
                )
            })
            .map(|(name, (calls, _))| (name.clone(), *calls as f64 / self.ops as f64))
            .filter(|(_, n)| *n > 0.0)
            .collect()
    }
}

fn commandstats(server: &RedisServer) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in server.raw("INFO commandstats").lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_owned(), (field("calls="), field("usec=")));
    }
    out
}

async fn measure<F, Fut>(server: &RedisServer, name: &'static str, ops: u64, work: F) -> Phase
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    assert!(server.raw("CONFIG RESETSTAT").starts_with("+OK"));
    let (server_cpu, client_cpu) = (cpu_secs(server.pid()), cpu_secs(std::process::id()));
    let started = Instant::now();
    work().await;
    Phase {
        name,
        ops,
        wall: started.elapsed().as_secs_f64(),
        server_cpu: cpu_secs(server.pid()) - server_cpu,
        client_cpu: cpu_secs(std::process::id()) - client_cpu,
        stats: commandstats(server),
    }
}

/// Runs `per_user(user index)` for `users` users, `IN_FLIGHT` at a time; each user's calls stay
/// in order inside its closure.
async fn for_users<F, Fut>(users: u64, per_user: F)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let per_user = Arc::new(per_user);
    let mut tasks = Vec::new();
    for worker in 0..IN_FLIGHT.min(users) {
        let per_user = per_user.clone();
        tasks.push(tokio::spawn(async move {
            let mut u = worker;
            while u < users {
                per_user(u).await;
                u += IN_FLIGHT;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
}

async fn append_range(
    store: &Arc<RedisStore>,
    prefix: &'static str,
    users: u64,
    seqs: std::ops::RangeInclusive<u64>,
    day_of: fn(u64) -> u64,
    expect: AppendOutcome,
) {
    let store = store.clone();
    for_users(users, move |u| {
        let store = store.clone();
        let seqs = seqs.clone();
        async move {
            for seq in seqs {
                let outcome = store
                    .append(&group(user(prefix, u), seq, day_of(seq), 2))
                    .await
                    .expect("append");
                assert_eq!(outcome, expect, "{prefix}{u} seq {seq}");
            }
        }
    })
    .await;
}

fn today() -> u64 {
    now_secs() / DAY_SECS
}

/// (a): every path of the store and the anchor, one phase each, on a fresh server.
async fn per_call(policy: RetentionPolicy) -> Vec<Phase> {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let store = Arc::new(
        RedisStore::connect(RedisSettings::new(server.url(), "mm"), policy)
            .await
            .expect("connect"),
    );
    // Load every script once, outside the measured phases.
    let warmup = group(user("warmup-", 0), 1, today(), 2);
    store.append(&warmup).await.expect("warm-up append");
    store
        .range_scan(
            &warmup.mailbox,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 1,
            },
        )
        .await
        .expect("warm-up scan");
    let mut phases = Vec::new();

    let anchor = redis::Script::new(ANCHOR_LUA);
    let _: String = anchor
        .prepare_invoke()
        .load_async(&mut store.conn())
        .await
        .expect("load");
    let conn = store.conn();
    phases.push(
        measure(
            &server,
            "anchor: raw script of comparable reach",
            USERS * GROUPS,
            || {
                let anchor = anchor.clone();
                for_users(USERS, move |u| {
                    let anchor = anchor.clone();
                    let mut conn = conn.clone();
                    async move {
                        let mb = MailboxId::new(user("anchor-", u), 1);
                        let keys = MailboxKeys::new("mm", &mb);
                        let day = today();
                        for seq in 1..=GROUPS {
                            let _: i64 = anchor
                                .key(&keys.meta)
                                .key(&keys.seqbucket)
                                .key(&keys.days)
                                .key(keys.day(day))
                                .arg(format!("{seq:016}"))
                                .arg(RetentionPolicy::default().expires_at(day))
                                .arg(day)
                                .arg(event_member(seq, 0, day * DAY_MS, "{}"))
                                .invoke_async(&mut conn)
                                .await
                                .expect("anchor");
                        }
                    }
                })
            },
        )
        .await,
    );

    let day_now: fn(u64) -> u64 = |_| today();
    phases.push(
        measure(&server, "fresh mailbox (first append)", USERS, || {
            append_range(&store, "u", USERS, 1..=1, day_now, AppendOutcome::Inserted)
        })
        .await,
    );
    phases.push(
        measure(
            &server,
            "warm append (same day)",
            USERS * (GROUPS - 1),
            || {
                append_range(
                    &store,
                    "u",
                    USERS,
                    2..=GROUPS,
                    day_now,
                    AppendOutcome::Inserted,
                )
            },
        )
        .await,
    );
    phases.push(
        measure(
            &server,
            "identical replay (unchanged)",
            USERS * GROUPS,
            || {
                append_range(
                    &store,
                    "u",
                    USERS,
                    1..=GROUPS,
                    day_now,
                    AppendOutcome::Unchanged,
                )
            },
        )
        .await,
    );

    // Mailboxes with 30 active days: seqs 1..=30 one a day (not measured), then 31..=60 one
    // more a day into days that already exist.
    let wide_day: fn(u64) -> u64 = |seq| today() - 29 + (seq - 1) % 30;
    append_range(
        &store,
        "w",
        WIDE_USERS,
        1..=30,
        wide_day,
        AppendOutcome::Inserted,
    )
    .await;
    phases.push(
        measure(
            &server,
            "warm append, 30 active days",
            WIDE_USERS * 30,
            || {
                append_range(
                    &store,
                    "w",
                    WIDE_USERS,
                    31..=WIDE_GROUPS,
                    wide_day,
                    AppendOutcome::Inserted,
                )
            },
        )
        .await,
    );
    let scan_store = store.clone();
    phases.push(
        measure(
            &server,
            "scan, one 50-group page (scan_begin + scan_end)",
            WIDE_USERS * SCANS_PER_MAILBOX,
            || {
                for_users(WIDE_USERS, move |u| {
                    let store = scan_store.clone();
                    async move {
                        let mb = MailboxId::new(user("w", u), 1);
                        for _ in 0..SCANS_PER_MAILBOX {
                            let page = store
                                .range_scan(
                                    &mb,
                                    ScanRequest {
                                        after_seq: 0,
                                        until_seq: None,
                                        limit_groups: 50,
                                    },
                                )
                                .await
                                .expect("scan");
                            assert_eq!(page.groups.len(), 50);
                            assert!(page.has_more);
                        }
                    }
                })
            },
        )
        .await,
    );
    phases
}

async fn rust_appends(store: Arc<RedisStore>, round: usize) -> f64 {
    let day = today();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..THROUGHPUT_IN_FLIGHT {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < THROUGHPUT_APPENDS {
                let g = group(user(&format!("r{round}-u"), i), 1, day, 3);
                store.append(&g).await.expect("append");
                i += THROUGHPUT_IN_FLIGHT;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    THROUGHPUT_APPENDS as f64 / started.elapsed().as_secs_f64()
}

/// The same script, the same argument shapes, fresh random mailboxes, through redis-benchmark.
fn redis_benchmark_appends(server: &RedisServer, policy: &RetentionPolicy) -> f64 {
    let sha = Scripts::new().append.get_hash().to_owned();
    // Make sure the script is loaded (redis-benchmark only sends EVALSHA).
    let out = Command::new("redis-cli")
        .arg("-s")
        .arg(server.socket())
        .arg("SCRIPT")
        .arg("LOAD")
        .arg(full_append_source())
        .output()
        .expect("redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        sha,
        "script hash"
    );

    let day = today();
    let placeholder = MailboxId::new(UserId::parse("u__rand_int__").expect("id"), 1);
    let keys = MailboxKeys::new("mm", &placeholder);
    let mut args: Vec<String> = vec![
        "EVALSHA".into(),
        sha,
        "6".into(),
        keys.epoch.clone(),
        keys.meta.clone(),
        keys.seqbucket.clone(),
        keys.days.clone(),
        keys.day_prefix.clone(),
        keys.repair.clone(),
    ];
    args.extend(append_argv(&keys, &placeholder, policy, day));
    let out = Command::new("redis-benchmark")
        .arg("-s")
        .arg(server.socket())
        .args([
            "-n",
            &THROUGHPUT_APPENDS.to_string(),
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

/// ARGV of `lua/append.lua` for one fresh 3-event group at seq 1 (see its header).
fn append_argv(
    keys: &MailboxKeys,
    mailbox: &MailboxId,
    policy: &RetentionPolicy,
    day: u64,
) -> Vec<String> {
    let mut args = vec![
        keys.stem.clone(),
        tag(&mailbox.user_id),
        "1".into(),
        "1".into(),
        day.to_string(),
        policy.expires_at(day).to_string(),
        policy.future_window_days.to_string(),
        policy.max_active_span_days.to_string(),
        policy.retention_days.to_string(),
        String::new(),
        "0".into(),
    ];
    for e in events(3) {
        args.push(event_member(
            1,
            e.event_ordinal,
            day * DAY_MS + 1,
            e.payload.as_str(),
        ));
    }
    args
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
            let g = group(mailbox.user_id.clone(), seq, start / DAY_SECS + day, 3);
            store.append(&g).await.expect("append");
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

    // Each round on a fresh server; medians per path, so a noisy neighbour in one round does not
    // decide the figure.
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push(per_call(policy).await);
    }
    let phases = &rounds[ROUNDS / 2];
    let median_of = |i: usize| median(rounds.iter().map(|r| r[i].usec_per_op()).collect());
    let anchor = median_of(0);
    println!("## Server time per script call (INFO commandstats, median of {ROUNDS} rounds)\n");
    println!(
        "| path | ops per round | server µs per call (median) | / anchor | rounds (µs) | wall s | redis-server CPU s | bench CPU s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, p) in phases.iter().enumerate() {
        let all: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.1}", r[i].usec_per_op()))
            .collect();
        println!(
            "| {} | {} | {:.1} | {:.2} | {} | {:.2} | {:.2} | {:.2} |",
            p.name,
            p.ops,
            median_of(i),
            median_of(i) / anchor,
            all.join(" / "),
            p.wall,
            p.server_cpu,
            p.client_cpu
        );
    }
    println!("\n### Commands each path runs inside its scripts, per call\n");
    println!(
        "| path | EVALSHA per op | other commands per op (inside the scripts; for the scan also its ZRANGE page reads) |"
    );
    println!("|---|---|---|");
    for p in phases {
        let inner: Vec<String> = p
            .inner_per_op()
            .iter()
            .map(|(name, n)| format!("{} {n:.2}", name.to_uppercase()))
            .collect();
        let total: f64 = p.inner_per_op().iter().map(|(_, n)| n).sum();
        println!(
            "| {} | {:.2} | {total:.1}: {} |",
            p.name,
            p.evalsha().0 as f64 / p.ops as f64,
            inner.join(", ")
        );
    }

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
    println!("\n## Redis appends (fresh mailboxes, groups of 3 events, {THROUGHPUT_APPENDS} per round, {ROUNDS} rounds)\n");
    println!("| path | appends/s (median) | all rounds |");
    println!("|---|---|---|");
    println!("| Rust store, {THROUGHPUT_IN_FLIGHT} appends in flight | {r:.0} | {rust:.0?} |");
    println!("| redis-benchmark EVALSHA, -c 16 -P 16 | {b:.0} | {baseline:.0?} |");
    println!("\nratio Rust / redis-benchmark: **{:.2}**\n", r / b);

    println!("## Metadata bytes of one mailbox, 3 groups a day (MEMORY USAGE)\n");
    println!("| days written | meta | day set | identity index | total |");
    println!("|---|---|---|---|---|");
    for (days, meta, day_set, index, total) in metadata_bytes(policy).await {
        println!("| {days} | {meta} | {day_set} | {index} | {total} |");
    }
}
