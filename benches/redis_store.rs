//! Redis backend figures, each against a baseline measured in the same run on the same server.
//!
//! (a) **Server time per script call** (`INFO commandstats`, `usec_per_call` of `EVALSHA`) for
//!     each path of the store — fresh mailbox, warm append, warm append into a mailbox with 30
//!     active days, identical replay, one 50-group scan page (its two script calls together) —
//!     next to a raw script of comparable reach (TIME, 2 HGET, 4 HSET, ZSCORE + ZADD, 2 ZADD,
//!     2 EXPIREAT GT) run the same way in its own phase at the start and at the end of every
//!     round. On a shared machine `usec_per_call` (wall time inside the call) also counts the
//!     moments the server was preempted, so the table adds the server's CPU time per call
//!     (`/proc/<pid>/stat`), which preemption does not inflate. With it, the commands each path
//!     runs inside its scripts per call (the profile the scripts are cut by).
//! (b) **Appends/s** through the Rust store versus `redis-benchmark` calling the very same append
//!     script with EVALSHA, pipelined: the ratio is the cost of the Rust client path.
//! (c) **Bytes** of meta + day set + identity index of one mailbox after 31 and after 365
//!     simulated days of daily writes (libfaketime moves the server's clock): must stay flat.
//!
//! Run: `cargo bench --bench redis_store` (needs redis-server, redis-benchmark, libfaketime, gcc:
//! `scripts/install-services`). Prints a Markdown report. `BENCH_ONLY=calls` measures (a)
//! alone; `BENCH_MARKERS=off` runs the store without its data markers (SPEC 7.3; as under
//! `allow_eviction`), so two runs in one session price the markers' check.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "support/workers.rs"]
mod workers;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use mailbox_materializer::model::{
    AppendOutcome, Event, EventGroup, MailboxId, Payload, RetentionPolicy, ScanRequest,
    SourcePosition, UserId, DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::redis::keys::{event_member, tag, MailboxKeys};
use mailbox_materializer::store::redis::scripts::Scripts;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;
use redis_server::{Clock, Listen, RedisServer};

/// Users × groups of the per-call workload (the shape of `apply --store redis` on a dispatch log).
const USERS: u64 = 5_000;
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
/// Rounds of the per-call measurement (each on a fresh server).
const CALL_ROUNDS: usize = 5;

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

/// The identical replay's five commands with the same keys and arguments as `lua/append.lua`,
/// without any of its decisions: the floor the replay path cannot go below.
const REPLAY_FLOOR_LUA: &str = r"
local gate = redis.call('MGET', KEYS[6], KEYS[1])
local t = redis.call('TIME')
local m = redis.call('HMGET', KEYS[2], 'retention_format_version', 'user_trim_seq',
  'seqbucket_max_seq', 'next_expires_at', 'bucket_max_seq:' .. ARGV[6], 'source_position')
local s = redis.call('ZSCORE', KEYS[3], ARGV[5])
local g = redis.call('ZRANGE', KEYS[5] .. ARGV[6], ARGV[4], ARGV[4], 'BYSCORE', 'LIMIT', '0',
  ARGV[13])
return {2}";

/// A phase of `USERS * GROUPS` calls of the replay floor on the mailboxes `u*`.
async fn replay_floor_phase(
    server: &RedisServer,
    store: &Arc<RedisStore>,
    policy: RetentionPolicy,
) -> Phase {
    let floor = redis::Script::new(REPLAY_FLOOR_LUA);
    let _: String = floor
        .prepare_invoke()
        .load_async(&mut store.conn())
        .await
        .expect("load the floor");
    let conn = store.conn();
    measure(
        server,
        "replay floor: its 5 commands, no decisions",
        USERS * GROUPS,
        || {
            for_users(USERS, move |u| {
                let floor = floor.clone();
                let mut conn = conn.clone();
                async move {
                    for seq in 1..=GROUPS {
                        let g = group(user("u", u), seq, today(), 2);
                        let keys = MailboxKeys::new("mm", &g.mailbox);
                        let mut invocation = floor.prepare_invoke();
                        keys.bind(&mut invocation);
                        for arg in append_argv(&keys, &g, &policy) {
                            invocation.arg(arg);
                        }
                        let reply: Vec<i64> =
                            invocation.invoke_async(&mut conn).await.expect("floor");
                        assert_eq!(reply, vec![2]);
                    }
                }
            })
        },
    )
    .await
}

/// A phase of `USERS * GROUPS` anchor calls, the store's access pattern without its decisions.
async fn anchor_phase(server: &RedisServer, store: &Arc<RedisStore>, name: &'static str) -> Phase {
    let anchor = redis::Script::new(ANCHOR_LUA);
    let _: String = anchor
        .prepare_invoke()
        .load_async(&mut store.conn())
        .await
        .expect("load the anchor");
    let conn = store.conn();
    let prefix: &'static str = if name.contains("start") {
        "anchor-a"
    } else {
        "anchor-b"
    };
    measure(server, name, USERS * GROUPS, || {
        for_users(USERS, move |u| {
            let anchor = anchor.clone();
            let mut conn = conn.clone();
            async move {
                let mb = MailboxId::new(user(prefix, u), 1);
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
    })
    .await
}

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
        source: None,
        token: None,
    }
}
/// CPU seconds (user + system) a process has used so far.
fn cpu_secs_of(pid: u32) -> f64 {
    proc::cpu_seconds(&pid.to_string()).unwrap_or(0.0)
}

/// One measured phase: calls and server microseconds per command, from `INFO commandstats`.
struct Phase {
    name: &'static str,
    /// Operations of the phase (appends, scans, anchor calls).
    ops: u64,
    /// command -> (calls, usec), inner commands of scripts included.
    stats: BTreeMap<String, (u64, u64)>,
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

    /// Server CPU µs per operation (user + system time of the redis-server process).
    fn cpu_usec_per_op(&self) -> f64 {
        self.server_cpu * 1e6 / self.ops as f64
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
    let (server_cpu, client_cpu) = (cpu_secs_of(server.pid()), cpu_secs_of(std::process::id()));
    work().await;
    Phase {
        name,
        ops,
        server_cpu: cpu_secs_of(server.pid()) - server_cpu,
        client_cpu: cpu_secs_of(std::process::id()) - client_cpu,
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
    workers::striped(users, IN_FLIGHT, per_user).await;
}

/// Appends `seqs` to each of `users` mailboxes, in order per mailbox.
async fn append_range(
    store: &Arc<RedisStore>,
    prefix: &'static str,
    users: u64,
    seqs: std::ops::RangeInclusive<u64>,
    day_of: fn(u64) -> u64,
    expect: AppendOutcome,
) {
    append_range_as(store, prefix, users, seqs, day_of, expect, 2, None).await;
}

/// [`append_range`] with groups of `events` events, and, with `offset_base`, each group marked
/// with a log position (partition 0, offset `offset_base + seq`), as the daemon sends them: the
/// zombie fencing's path.
#[allow(clippy::too_many_arguments)]
async fn append_range_as(
    store: &Arc<RedisStore>,
    prefix: &'static str,
    users: u64,
    seqs: std::ops::RangeInclusive<u64>,
    day_of: fn(u64) -> u64,
    expect: AppendOutcome,
    events: u32,
    offset_base: Option<i64>,
) {
    let store = store.clone();
    for_users(users, move |u| {
        let store = store.clone();
        let seqs = seqs.clone();
        async move {
            for seq in seqs {
                let mut g = group(user(prefix, u), seq, day_of(seq), events);
                g.source =
                    offset_base.map(|base| SourcePosition::new(bench_log(), 0, base + seq as i64));
                let outcome = store.append(&g).await.expect("append");
                assert_eq!(outcome, expect, "{prefix}{u} seq {seq}");
            }
        }
    })
    .await;
}

fn today() -> u64 {
    now_secs() / DAY_SECS
}

/// (a): the anchor, every path of the store, and the anchor again, one phase each, on a fresh
/// server.
async fn per_call(policy: RetentionPolicy) -> Vec<Phase> {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut settings = RedisSettings::new(server.url(), "mm");
    settings.markers = std::env::var("BENCH_MARKERS").as_deref() != Ok("off");
    let store = Arc::new(
        RedisStore::connect(settings, policy)
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
    let mut phases = vec![anchor_phase(&server, &store, "anchor (start of round)").await];

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

    phases.push(replay_floor_phase(&server, &store, policy).await);

    // The daemon's path: the same appends and replaces, each group with its log position (the
    // zombie fencing keeps it in the meta and checks it on a replace).
    append_range_as(
        &store,
        "p",
        USERS,
        1..=1,
        day_now,
        AppendOutcome::Inserted,
        2,
        Some(0),
    )
    .await;
    phases.push(
        measure(
            &server,
            "warm append with a log position (the daemon's)",
            USERS * (GROUPS - 1),
            || {
                append_range_as(
                    &store,
                    "p",
                    USERS,
                    2..=GROUPS,
                    day_now,
                    AppendOutcome::Inserted,
                    2,
                    Some(0),
                )
            },
        )
        .await,
    );
    phases.push(
        measure(&server, "same-day replace", USERS * GROUPS, || {
            append_range_as(
                &store,
                "u",
                USERS,
                1..=GROUPS,
                day_now,
                AppendOutcome::Replaced,
                3,
                None,
            )
        })
        .await,
    );
    phases.push(
        measure(
            &server,
            "same-day replace with a log position (the daemon's)",
            USERS * GROUPS,
            || {
                append_range_as(
                    &store,
                    "p",
                    USERS,
                    1..=GROUPS,
                    day_now,
                    AppendOutcome::Replaced,
                    3,
                    Some(1_000),
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
    phases.push(anchor_phase(&server, &store, "anchor (end of round)").await);
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
        .arg(Scripts::append_source())
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
    let fresh = EventGroup {
        mailbox: placeholder.clone(),
        mailbox_seq: 1,
        created_at: day * DAY_MS + 1,
        events: events(3),
        source: None,
        token: None,
    };
    args.extend(append_argv(&keys, &fresh, policy));
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
/// ARGV of `lua/append.lua` for `group` (see its header), as the store sends it.
fn append_argv(keys: &MailboxKeys, group: &EventGroup, policy: &RetentionPolicy) -> Vec<String> {
    let day = group.day();
    let mut args = vec![
        keys.stem.clone(),
        tag(&group.mailbox.user_id),
        group.mailbox.epoch.to_string(),
        group.mailbox_seq.to_string(),
        format!("{:016}", group.mailbox_seq),
        day.to_string(),
        policy.expires_at(day).to_string(),
        (day.saturating_sub(u64::from(policy.future_window_days)) * DAY_SECS).to_string(),
        policy.max_active_span_days.to_string(),
        policy.retention_days.to_string(),
        String::new(),
        "0".into(),
        (group.events.len() + 1).to_string(),
        String::new(),
    ];
    for e in group.events.iter() {
        args.push(event_member(
            group.mailbox_seq,
            e.event_ordinal,
            group.created_at,
            e.payload.as_str(),
        ));
    }
    args
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The metadata of one mailbox written 3 groups a day for a year; `positioned`: each group with
/// a log position, as the daemon writes them (SPEC 7.2: one `pos:<seq>` field per live seq).
async fn metadata_bytes(
    policy: RetentionPolicy,
    positioned: bool,
) -> Vec<(u64, i64, i64, i64, i64)> {
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
            let mut g = group(mailbox.user_id.clone(), seq, start / DAY_SECS + day, 3);
            if positioned {
                g.source = Some(SourcePosition::new(
                    bench_log(),
                    7,
                    1_000_000_000 + seq as i64,
                ));
            }
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

    // Rounds on fresh servers. Per round, each path is compared with the mean of that round's two
    // anchor phases.
    let mut rounds = Vec::new();
    for _ in 0..CALL_ROUNDS {
        rounds.push(per_call(policy).await);
    }
    let last = rounds[0].len() - 1;
    let phases = &rounds[CALL_ROUNDS / 2];
    let anchor_of = |r: &Vec<Phase>, cpu: bool| {
        let v = |p: &Phase| {
            if cpu {
                p.cpu_usec_per_op()
            } else {
                p.usec_per_op()
            }
        };
        (v(&r[0]) + v(&r[last])) / 2.0
    };
    println!("## Server time per script call ({CALL_ROUNDS} rounds on fresh servers)\n");
    println!(
        "| path | goal (µs) | commandstats µs (median) | min | / anchor (median of rounds) | rounds (µs) | server CPU µs per call (median) | CPU / anchor CPU | bench CPU µs per call |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, p) in phases.iter().enumerate() {
        let all: Vec<f64> = rounds.iter().map(|r| r[i].usec_per_op()).collect();
        let ratio = median(
            rounds
                .iter()
                .map(|r| r[i].usec_per_op() / anchor_of(r, false))
                .collect(),
        );
        let cpu = median(rounds.iter().map(|r| r[i].cpu_usec_per_op()).collect());
        let client = median(
            rounds
                .iter()
                .map(|r| r[i].client_cpu * 1e6 / r[i].ops as f64)
                .collect(),
        );
        let cpu_ratio = median(
            rounds
                .iter()
                .map(|r| r[i].cpu_usec_per_op() / anchor_of(r, true))
                .collect(),
        );
        let min = all.iter().copied().fold(f64::INFINITY, f64::min);
        let listed: Vec<String> = all.iter().map(|v| format!("{v:.1}")).collect();
        let goal = match p.name {
            "fresh mailbox (first append)" => "≤ 35",
            "warm append (same day)" => "≤ 25",
            "identical replay (unchanged)" => "≤ 15",
            name if name.starts_with("scan") => "≤ 40",
            _ => "-",
        };
        println!(
            "| {} | {goal} | {:.1} | {:.1} | {:.2} | {} | {cpu:.1} | {cpu_ratio:.2} | {client:.1} |",
            p.name,
            median(all.clone()),
            min,
            ratio,
            listed.join(" / "),
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
    if std::env::var("BENCH_ONLY").as_deref() == Ok("calls") {
        return;
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
    println!("| groups | days written | meta | day set | identity index | total |");
    println!("|---|---|---|---|---|---|");
    for (label, positioned) in [
        ("without a position (apply)", false),
        ("with a log position (the daemon)", true),
    ] {
        for (days, meta, day_set, index, total) in metadata_bytes(policy, positioned).await {
            println!("| {label} | {days} | {meta} | {day_set} | {index} | {total} |");
        }
    }
}

/// The log every benchmark position names (a topic ID as a broker reports one).
fn bench_log() -> mailbox_materializer::model::LogId {
    mailbox_materializer::model::LogId::topic_id("3kZpM0bHQ0-5b2S0CkL8nA").expect("log id")
}
