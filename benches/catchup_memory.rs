//! Peak memory of the daemon catching up on a backlog, per record size: the `materializer run`
//! binary (as a pod runs it) started cold on a topic that already holds at least five times its
//! in-flight byte budget, until every record is final. The peak is the kernel's own high-water
//! mark of the process's resident set (`VmHWM`), so nothing between two samples is missed.
//!
//! Each row also gives the bound docs/operations.md ("Memory") documents — fixed overhead + 1.25 ×
//! (budget + prefetch) — the records/s of the catch-up, the CPU of each process, and the store
//! calls per record: Redis's script calls (`INFO commandstats`), or the Paxos rounds a Cassandra
//! started by `scripts/cassandra` coordinated (its JMX `CASWrite` count, `CASSANDRA_JMX_PORT`).
//!
//! Workload: 3 partitions, one delivery per record, its event padded so the whole record has
//! about the given size (its padding text compresses like real text, see `text`). Into Redis and Scylla every record is a new group of its mailbox (about
//! 10 per mailbox); into memory, whose store lives in the daemon's own heap, the records are
//! identical replays of a few mailboxes (a few MiB of state), so the peak is the in-flight work's
//! and not the store's.
//!
//! Run: `KAFKA_BOOTSTRAP=$(scripts/kafka start) cargo bench --bench catchup_memory`
//! Options: `BENCH_SIZES` (bytes, comma-separated; default `100,1024,4096,65536,921600`),
//! `BENCH_BACKENDS` (`redis,memory,scylla`; default `redis`; scylla needs `SCYLLA_NODES`),
//! `BENCH_BUDGET_MIB` (`kafka.max_in_flight_bytes`, default the configuration's default),
//! `BENCH_BACKLOG_FACTOR` (backlog ÷ budget, default 5), `BENCH_PER_MAILBOX` (records per
//! mailbox into Redis and Scylla, default 10), `BENCH_EXTRA` (lines added to the
//! `[kafka]` section), `BENCH_DAEMON` (the command that runs the daemon instead of this build's
//! binary, e.g. `heaptrack -o target/heap target/profiling/materializer`). Prints a Markdown table.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mailbox_materializer::config::Config;
use mailbox_materializer::daemon::kafka::prefetch_sizes;
use mailbox_materializer::daemon::memory_limit;
use mailbox_materializer::model::DAY_MS;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use redis_server::{Clock, Listen, RedisServer};

const PARTITIONS: i32 = 3;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A record of about `size` bytes: record `i`, for mailbox `user`, group `seq`.
fn record(size: usize, user: u64, seq: u64, tag: &str, today_ms: u64) -> String {
    let head = serde_json::json!({
        "dispatch_id": format!("{tag}/{user}/{seq}"), "group_id": "g", "committed_at": today_ms,
        "deliveries": [{"user_id": format!("{tag}-user-{user}"), "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": ""}}]}]
    })
    .to_string();
    let pad = size.saturating_sub(head.len());
    head.replacen(
        "\"body\":\"\"",
        &format!("\"body\":\"{}\"", text(pad, user ^ seq)),
        1,
    )
}

/// `len` bytes of text that compresses about as well as real messages do (lz4 about 1.5×):
/// words of random letters. `BENCH_PADDING=repeat` pads with one repeated letter instead, the
/// worst case for the consumer's prefetch (a 1 MiB fetch decompresses to hundreds of MiB).
fn text(len: usize, seed: u64) -> String {
    if std::env::var("BENCH_PADDING").is_ok_and(|p| p == "repeat") {
        return "x".repeat(len);
    }
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) % 32;
            if r < 5 {
                ' '
            } else {
                char::from(b'a' + (r as u8 - 5) % 26)
            }
        })
        .collect()
}

struct Backlog {
    topic: String,
    records: u64,
    bytes: u64,
}

/// Fills a fresh topic with `records` records of about `size` bytes over `users` mailboxes;
/// `replays` makes every record of a mailbox the same group (identical replays).
async fn fill(bootstrap: &str, size: usize, records: u64, users: u64, replays: bool) -> Backlog {
    let topic = format!("catchup-{size}-{}", now_ms());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    for result in admin
        .create_topics(
            &[
                NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
                NewTopic::new(&format!("{topic}.dlq"), 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics")
    {
        result.expect("topic");
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .expect("producer");
    let today = now_ms() - now_ms() % DAY_MS;
    let mut bytes = 0u64;
    let mut acks = Vec::new();
    for i in 0..records {
        let user = i % users;
        let seq = if replays { 1 } else { i / users + 1 };
        let payload = record(size, user, seq, &topic, today);
        bytes += payload.len() as u64;
        acks.push(
            producer
                .send_result(
                    FutureRecord::<str, str>::to(&topic)
                        .partition((user % PARTITIONS as u64) as i32)
                        .payload(&payload),
                )
                .map_err(|(e, _)| e)
                .expect("enqueue"),
        );
        if acks.len() >= 20_000 || bytes_in(&acks, size) >= 256 << 20 {
            for ack in acks.drain(..) {
                ack.await.expect("ack").expect("delivered");
            }
        }
    }
    producer.flush(Duration::from_secs(300)).expect("flush");
    for ack in acks {
        ack.await.expect("ack").expect("delivered");
    }
    Backlog {
        topic,
        records,
        bytes,
    }
}

fn bytes_in<T>(acks: &[T], size: usize) -> usize {
    acks.len() * size
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text.split_once("\r\n\r\n")?.1.to_owned())
}

/// The sum of every sample of the metric `name` (all label sets).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `VmHWM` / `VmRSS` of a process, in bytes.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Run {
    peak_rss: u64,
    peak_charged: u64,
    rate: f64,
    cpu: String,
}

fn run_daemon(
    backlog: &Backlog,
    store_section: &str,
    budget: u64,
    extra: &str,
    pids: &[(&'static str, String)],
) -> Run {
    let http_port = redis_server::free_port();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&backlog.topic);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("materializer.toml");
    std::fs::write(
        &config,
        format!(
            "{store_section}
[kafka]
brokers = \"{brokers}\"
topic = \"{topic}\"
group_id = \"{topic}-group\"
dlq_topic = \"{topic}.dlq\"
max_in_flight_bytes = {budget}
{extra}
[http]
listen = \"127.0.0.1:{http_port}\"
",
            brokers = std::env::var("KAFKA_BOOTSTRAP").expect("KAFKA_BOOTSTRAP"),
            topic = backlog.topic,
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.join("daemon.log")).expect("log");
    // `BENCH_DAEMON`: another command line to run the daemon (a heap profiler around a
    // profiling build); its peak is then the wrapper's, not a figure to report.
    let daemon = std::env::var("BENCH_DAEMON")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_materializer").to_owned());
    let mut words = daemon.split_whitespace();
    let mut child: Child = Command::new(words.next().expect("BENCH_DAEMON"))
        .args(words)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start materializer");
    let pid = child.id();
    let mut all_pids = pids.to_vec();
    all_pids.push(("daemon", pid.to_string()));
    let cpu_start: Vec<f64> = all_pids
        .iter()
        .map(|(_, p)| proc::cpu_seconds(p).unwrap_or(0.0))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(1800);
    // The most the engine charged against the budget (sampled with the completion check).
    let mut peak_charged = 0u64;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "daemon exited ({status}); log: {}",
                std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
            );
        }
        let metrics = http_get(http_port, "/metrics").unwrap_or_default();
        let done = metric_sum(&metrics, "materializer_records_total");
        peak_charged =
            peak_charged.max(metric_sum(&metrics, "materializer_in_flight_bytes") as u64);
        if done >= backlog.records as f64 {
            break;
        }
        assert!(Instant::now() < deadline, "catch-up took over 30 min");
        std::thread::sleep(Duration::from_millis(200));
    }
    let wall = started.elapsed().as_secs_f64();
    let peak_rss = status_kib(pid, "VmHWM:").expect("VmHWM");
    let cpu = all_pids
        .iter()
        .zip(&cpu_start)
        .map(|((name, p), start)| {
            format!(
                "{name} {:.2}",
                (proc::cpu_seconds(p).unwrap_or(0.0) - start) / wall
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let metrics = http_get(http_port, "/metrics").unwrap_or_default();
    let applied = metric_sum(&metrics, "materializer_records_total{outcome=\"applied\"}")
        + metric_sum(
            &metrics,
            "materializer_records_total{outcome=\"unchanged\"}",
        );
    assert_eq!(
        applied as u64, backlog.records,
        "every record applied or unchanged"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    Run {
        peak_rss,
        peak_charged,
        rate: backlog.records as f64 / wall,
        cpu,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0}", bytes as f64 / (1 << 20) as f64)
}

#[tokio::main]
async fn main() {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP (start a broker with scripts/kafka start)");
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .unwrap_or_else(|_| "100,1024,4096,65536,921600".to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let backends = std::env::var("BENCH_BACKENDS").unwrap_or_else(|_| "redis".to_owned());
    let default_budget = Config::default().kafka.max_in_flight_bytes as u64;
    let budget = env_or("BENCH_BUDGET_MIB", default_budget >> 20) << 20;
    let per_mailbox: u64 = env_or("BENCH_PER_MAILBOX", 10u64).max(1);
    let factor: u64 = env_or("BENCH_BACKLOG_FACTOR", 5);
    let extra = std::env::var("BENCH_EXTRA").unwrap_or_default();
    // The formula of docs/operations.md ("Memory"), as the daemon computes it for its cgroup
    // check.
    let mut kafka = Config::default().kafka;
    kafka.max_in_flight_bytes = budget as usize;
    let bound = memory_limit::required_bytes(&kafka);
    let prefetch = prefetch_sizes(&kafka).total() as u64;

    println!(
        "budget {} MiB, prefetch {} MiB, bound {} MiB (64 + 1.25 × (budget + prefetch)), backlog ≥ {factor}× budget\n",
        mib(budget),
        mib(prefetch),
        mib(bound)
    );
    println!("| backend | record size | records | backlog MiB | peak RSS MiB | within bound | peak charged MiB | records/s | EVALSHA or Paxos rounds / record | CPU (cores) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for backend in backends.split(',').map(str::trim) {
        for &size in &sizes {
            let records = ((factor * budget) / size as u64).max(1_000);
            let replays = backend == "memory";
            let users = if replays {
                ((4u64 << 20) / size as u64).clamp(3, 2_000).min(records)
            } else {
                (records / per_mailbox).max(3)
            };
            let backlog = fill(&bootstrap, size, records, users, replays).await;
            // A fresh server per run: the previous run's data would slow this one.
            let redis = (backend == "redis").then(|| {
                RedisServer::start(Clock::Real, Listen::Tcp(redis_server::free_port()), &[])
            });
            let (store_section, pids) = store(backend, redis.as_ref());
            let cas_before = (backend == "scylla").then(cas_writes).flatten();
            let run = run_daemon(&backlog, &store_section, budget, &extra, &pids);
            // Script calls the server ran (a run of one mailbox's groups is one call), or the
            // Paxos rounds the CQL server coordinated (one per run).
            let evalsha = redis.as_ref().map_or_else(
                || match (cas_before, cas_writes()) {
                    (Some(before), Some(after)) if backend == "scylla" => format!(
                        "{:.2} Paxos",
                        after.saturating_sub(before) as f64 / backlog.records as f64
                    ),
                    _ => "-".to_owned(),
                },
                |server| {
                    let stats = server.raw("INFO commandstats");
                    let calls: f64 = stats
                        .lines()
                        .filter(|l| {
                            l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:")
                        })
                        .filter_map(|l| {
                            l.split("calls=")
                                .nth(1)?
                                .split(',')
                                .next()?
                                .parse::<f64>()
                                .ok()
                        })
                        .sum();
                    format!("{:.2}", calls / backlog.records as f64)
                },
            );
            println!(
                "| {backend} | {size} B | {} | {} | {} | {} | {} | {:.0} | {evalsha} | {} |",
                backlog.records,
                mib(backlog.bytes),
                mib(run.peak_rss),
                if run.peak_rss <= bound {
                    "yes"
                } else {
                    "**no**"
                },
                mib(run.peak_charged),
                run.rate,
                run.cpu
            );
        }
    }
}

/// The conditional writes (Paxos rounds) the Cassandra of `scripts/cassandra` has coordinated
/// since it started, read over its local JMX port (`CASSANDRA_JMX_PORT`, 17199 by default) with
/// the JMX client its own libraries carry; `None` when that is not reachable (ScyllaDB, another
/// server), and the column then shows "-".
fn cas_writes() -> Option<u64> {
    let port = std::env::var("CASSANDRA_JMX_PORT").unwrap_or_else(|_| "17199".to_owned());
    let out = Command::new("java")
        .args([
            "-cp",
            "target/lib-cassandra/*",
            "org.gridkit.jvmtool.SJK",
            "mx",
            "-s",
            &format!("127.0.0.1:{port}"),
            "-b",
            "org.apache.cassandra.metrics:type=ClientRequest,scope=CASWrite,name=Latency",
            "-mg",
            "-f",
            "Count",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()?
        .trim()
        .parse()
        .ok()
}

/// The `[store]` section for `backend` and the store's processes (for their CPU).
fn store(backend: &str, redis: Option<&RedisServer>) -> (String, Vec<(&'static str, String)>) {
    match (backend, redis) {
        ("redis", Some(server)) => (
            format!(
                "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\n",
                server.url()
            ),
            vec![("redis", server.pid().to_string())],
        ),
        ("scylla", _) => {
            let nodes = std::env::var("SCYLLA_NODES").expect("SCYLLA_NODES for scylla");
            let port: u16 = nodes
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(9042);
            let section = format!(
                "[store]\nbackend = \"scylla\"\n[store.scylla]\nnodes = [\"{nodes}\"]\nkeyspace = \"catchup_{}\"\nreplication = \"{{'class': 'SimpleStrategy', 'replication_factor': 1}}\"\n",
                now_ms()
            );
            let pids = proc::listener_pid(port)
                .map(|p| vec![("cql", p)])
                .unwrap_or_default();
            (section, pids)
        }
        _ => ("[store]\nbackend = \"memory\"\n".to_owned(), Vec::new()),
    }
}
