//! Records/s through the whole daemon (real Kafka broker, consumer group, lanes, watermark
//! commits) and through `apply` and `replay`, each against baselines measured in the same run
//! on the same data, with the CPU each process used (so the bottleneck is named).
//!
//! Workloads (3 partitions, one delivery of 2 events per record, every record dated today):
//! - **warm**: 200,000 records over 20,000 users (10 groups each, so most appends meet a mailbox
//!   that exists);
//! - **fresh**: 200,000 records over 200,000 users (every append creates a mailbox).
//!
//! Baselines:
//! - **bare consumer**: a librdkafka consumer group reading every record, no decode, no store;
//! - **sequential loop**: the same consumer, then `decode_record` and `MemoryStore::append` for
//!   each record in one task — the daemon's work without the daemon;
//! - **redis pipe**: the exact EVALSHA calls the Redis store makes for the workload, sent by
//!   `redis-cli --pipe` (raw, maximally pipelined) to an empty server.
//!
//! Run: `KAFKA_BOOTSTRAP=$(scripts/kafka start) cargo bench --bench daemon_throughput`
//! (redis-server and redis-cli from `scripts/install-services`; `BENCH_RECORDS` overrides the
//! record count; set `SCYLLA_NODES` to add the Scylla rows; `BENCH_ONLY=reshard` runs only the
//! rows of a Redis Cluster resharded under load, `BENCH_ONLY=blocked` those of a corrupt hot
//! mailbox beside healthy ones, `BENCH_ONLY=tap` those with a `/debug/tap` client attached, `BENCH_ONLY=verify` those of
//! `verify` alone and beside the daemon, `BENCH_ONLY=applied` the daemon on Redis with and
//! without the applied record). Prints a Markdown report.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mailbox_materializer::config::{Backend, Config};
use mailbox_materializer::daemon::http::Health;
use mailbox_materializer::daemon::{self, DaemonOptions, Progress};
use mailbox_materializer::ingest::{apply_delivery, decode_record};

use mailbox_materializer::model::{RetentionPolicy, DAY_MS};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use redis_server::{Clock, Listen, RedisServer};
use tokio::sync::watch;

const PARTITIONS: i32 = 3;

/// The allocator of the `materializer` binary, so the in-process daemon runs as `run` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn records_wanted() -> u64 {
    std::env::var("BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CPU of the named processes over a measured run.
struct CpuMeter {
    pids: Vec<(&'static str, String)>,
    start: Vec<f64>,
    started: Instant,
}

impl CpuMeter {
    fn start(pids: &[(&'static str, String)]) -> Self {
        Self {
            pids: pids.to_vec(),
            start: pids
                .iter()
                .map(|(_, p)| proc::cpu_seconds(p).unwrap_or(0.0))
                .collect(),
            started: Instant::now(),
        }
    }

    /// "name 1.23 cores, ..." over the elapsed wall time.
    fn stop(&self) -> String {
        let wall = self.started.elapsed().as_secs_f64();
        self.pids
            .iter()
            .zip(&self.start)
            .map(|((name, pid), start)| {
                format!(
                    "{name} {:.2}",
                    (proc::cpu_seconds(pid).unwrap_or(0.0) - start) / wall
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One workload: its topic and the records in partition order (for the file-based tools).
struct Workload {
    name: &'static str,
    topic: String,
    users: u64,
    records: u64,
    /// The records a daemon run waits for (all of them, unless some belong to a mailbox that
    /// fails closed: those are skipped and not counted).
    expect: u64,
    /// Every record, per partition, in offset order.
    by_partition: HashMap<i32, Vec<String>>,
}

/// The hot mailbox of the `blocked` rows: every [`HOT_EVERY`]th record of their workload.
const HOT_USER: &str = "bench-hot";
const HOT_EVERY: u64 = 10;

fn record_json(i: u64, users: u64, today_ms: u64) -> (i32, String) {
    let user = i % users;
    let seq = i / users + 1;
    let record = serde_json::json!({
        "dispatch_id": format!("bench/{i}"), "group_id": "g", "committed_at": today_ms + (i % 1000),
        "deliveries": [{"user_id": format!("bench-user-{user}"), "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hello there"}},
                       {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]}]
    })
    .to_string();
    ((user % PARTITIONS as u64) as i32, record)
}

async fn prepare(bootstrap: &str, name: &'static str, records: u64, users: u64) -> Workload {
    let topic = format!("bench-{name}-{}", now_ms());
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
        .create()
        .expect("producer");
    let today = now_ms() - now_ms() % DAY_MS;
    let mut by_partition: HashMap<i32, Vec<String>> = HashMap::new();
    let mut acks = Vec::new();
    for i in 0..records {
        let (partition, record) = if name == "hot" && i % HOT_EVERY == 0 {
            (0, hot_record_json(i / HOT_EVERY + 1, today))
        } else {
            record_json(i, users, today)
        };
        acks.push(
            producer
                .send_result(
                    FutureRecord::<str, str>::to(&topic)
                        .partition(partition)
                        .payload(&record),
                )
                .map_err(|(e, _)| e)
                .expect("enqueue"),
        );
        by_partition.entry(partition).or_default().push(record);
        if acks.len() >= 50_000 {
            for ack in acks.drain(..) {
                ack.await.expect("ack").expect("delivered");
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    for ack in acks {
        ack.await.expect("ack").expect("delivered");
    }
    Workload {
        name,
        topic,
        users,
        records,
        expect: records,
        by_partition,
    }
}

fn consumer(bootstrap: &str, topic: &str, group: &str) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

/// A measured rate with the CPU of each process.
struct Rate {
    per_sec: f64,
    cpu: String,
    /// Groups answered `unchanged` (daemon rows): every group of these workloads is new, so
    /// each is the answer of a second execution of a script that had already run.
    unchanged: u64,
}

/// The hot mailbox's record of `seq` (partition 0).
fn hot_record_json(seq: u64, today_ms: u64) -> String {
    serde_json::json!({
        "dispatch_id": format!("bench/hot/{seq}"), "group_id": "g", "committed_at": today_ms,
        "deliveries": [{"user_id": HOT_USER, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hot"}}]}]
    })
    .to_string()
}

/// The baseline: a bare consumer reading every record.
async fn bare_consumer(bootstrap: &str, w: &Workload, pids: &[(&'static str, String)]) -> Rate {
    let consumer = consumer(bootstrap, &w.topic, &format!("{}-bare", w.topic));
    let mut meter = None;
    let mut seen = 0u64;
    while seen < w.records {
        let message = consumer.recv().await.expect("message");
        meter.get_or_insert_with(|| CpuMeter::start(pids));
        std::hint::black_box(message.payload());
        seen += 1;
    }
    let meter = meter.expect("records");
    Rate {
        per_sec: w.records as f64 / meter.started.elapsed().as_secs_f64(),
        cpu: meter.stop(),
        unchanged: 0,
    }
}

/// The baseline: consume, decode and append in one sequential loop, no daemon.
async fn sequential_loop(bootstrap: &str, w: &Workload, pids: &[(&'static str, String)]) -> Rate {
    let consumer = consumer(bootstrap, &w.topic, &format!("{}-loop", w.topic));
    let store = MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock));
    let mut meter = None;
    let mut seen = 0u64;
    while seen < w.records {
        let message = consumer.recv().await.expect("message");
        meter.get_or_insert_with(|| CpuMeter::start(pids));
        let record =
            decode_record(message.payload().unwrap_or_default(), 1 << 20).expect("valid record");
        for delivery in record.deliveries() {
            apply_delivery(&store, &delivery).await.expect("applied");
        }
        seen += 1;
    }
    let meter = meter.expect("records");
    Rate {
        per_sec: w.records as f64 / meter.started.elapsed().as_secs_f64(),
        cpu: meter.stop(),
        unchanged: 0,
    }
}

/// The daemon in this process, from its first final record to the last.
async fn daemon_run(
    bootstrap: &str,
    w: &Workload,
    group: &str,
    store: Arc<dyn MailboxStore>,
    pids: &[(&'static str, String)],
) -> Rate {
    daemon_run_tapped(bootstrap, w, group, store, pids, false)
        .await
        .0
}

/// [`daemon_run`], with a `/debug/tap` client reading every decision as fast as it can when
/// `tap`: the rate, and the lines and drops the client saw.
async fn daemon_run_tapped(
    bootstrap: &str,
    w: &Workload,
    group: &str,
    store: Arc<dyn MailboxStore>,
    pids: &[(&'static str, String)],
    tap: bool,
) -> (Rate, Option<TapReader>) {
    let mut config = Config::default();
    config.store.backend = Backend::Memory;
    config.kafka.brokers = bootstrap.to_owned();
    config.kafka.topic = w.topic.clone();
    config.kafka.dlq_topic = format!("{}.dlq", w.topic);
    config.kafka.group_id = group.to_owned();
    if let Some(window) = std::env::var("BENCH_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.kafka.max_in_flight_records = window;
    }
    let progress = Arc::new(Progress::default());
    let (tx, rx) = watch::channel(false);
    let health = Arc::new(Health::default());
    let mut reader = None;
    if tap {
        health.serve_debug_endpoints(true);
        let addr = mailbox_materializer::daemon::http::serve("127.0.0.1:0", health.clone())
            .await
            .expect("serve /debug/tap");
        let mut socket = std::net::TcpStream::connect(addr).expect("connect to the tap");
        socket
            // HTTP/1.0: the stream comes as plain lines (HTTP/1.1 would chunk it).
            .write_all(b"GET /debug/tap HTTP/1.0\r\nHost: bench\r\n\r\n")
            .expect("ask for the tap");
        // Listening before the first record: wait for the response head.
        let mut head = [0u8; 256];
        let _ = std::io::Read::read(&mut socket, &mut head).expect("the tap's head");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut lines, mut dropped) = (0u64, 0u64);
            let mut reader = std::io::BufReader::new(socket);
            let mut line = String::new();
            loop {
                match std::io::BufRead::read_line(&mut reader, &mut line) {
                    Ok(0) => break,
                    Ok(_) if line.ends_with('\n') => {
                        if let Some(n) = line
                            .trim_end()
                            .strip_prefix("{\"dropped\":")
                            .and_then(|rest| rest.trim_end_matches('}').parse::<u64>().ok())
                        {
                            dropped += n;
                        } else {
                            lines += 1;
                        }
                        line.clear();
                    }
                    Ok(_) => {}
                    Err(_) if !stopped.load(std::sync::atomic::Ordering::Relaxed) => {}
                    Err(_) => break,
                }
            }
            (lines, dropped)
        });
        reader = Some(TapReader { thread, stop });
    }
    let options = DaemonOptions {
        shutdown: rx,
        progress: progress.clone(),
        health,
        commit_offsets: true,
        mock_log: None,
        #[cfg(feature = "failpoints")]
        on_producer: None,
    };
    let task = tokio::spawn(async move { daemon::run(&config, store, options).await });
    while progress.snapshot().final_records == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let meter = CpuMeter::start(pids);
    let first = progress.snapshot().final_records;
    while progress.snapshot().final_records < w.expect {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = (w.expect - first) as f64 / meter.started.elapsed().as_secs_f64();
    let cpu = meter.stop();
    let counts = progress.snapshot();
    assert_eq!(
        counts.records.get("applied").copied(),
        Some(w.expect),
        "every record applied: {counts:?}"
    );
    let _ = tx.send(true);
    task.await.expect("daemon task").expect("daemon");
    (
        Rate {
            per_sec: rate,
            cpu,
            unchanged: counts.groups.get("unchanged").copied().unwrap_or(0),
        },
        reader,
    )
}

/// A `/debug/tap` client reading on its own thread until told to stop.
struct TapReader {
    thread: std::thread::JoinHandle<(u64, u64)>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// The daemon on the memory store with and without a `/debug/tap` client reading every
/// decision, alternated twice over the same records (`BENCH_ONLY=tap`).
async fn tap_rows(bootstrap: &str, w: &Workload, pids: &[(&'static str, String)]) -> Vec<String> {
    let mut lines = vec![
        "| run | records/s | ratio to the untapped mean | CPU (cores: process) |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut runs: Vec<(bool, Rate, String)> = Vec::new();
    for round in 0..2 {
        for tap in [false, true] {
            let store: Arc<dyn MailboxStore> = Arc::new(MemoryStore::new(
                RetentionPolicy::default(),
                Arc::new(SystemClock),
            ));
            let group = format!("{}-tap{round}{tap}", w.topic);
            let (rate, reader) = daemon_run_tapped(bootstrap, w, &group, store, pids, tap).await;
            // The HTTP server lives on with the process: the client reads what is left, then
            // stops at its next idle read.
            let seen = reader.map(|r| {
                r.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let (seen, dropped) = r.thread.join().expect("tap reader");
                format!(" (tap saw {seen} decisions, {dropped} dropped)")
            });
            runs.push((tap, rate, seen.unwrap_or_default()));
        }
    }
    let untapped: Vec<f64> = runs.iter().filter(|r| !r.0).map(|r| r.1.per_sec).collect();
    let base = untapped.iter().sum::<f64>() / untapped.len() as f64;
    for (tap, rate, seen) in &runs {
        lines.push(row(
            &format!(
                "daemon, memory store, {}{seen}",
                if *tap { "tap attached" } else { "no tap" }
            ),
            rate,
            base,
        ));
    }
    lines
}

/// The daemon on Redis with and without the record of how far the store holds each partition
/// (SPEC 7.3, `store::redis::applied`: 64 script calls at most every 200 ms), alternated four
/// times over the same records (`BENCH_ONLY=applied`).
async fn applied_rows(
    bootstrap: &str,
    w: &Workload,
    pids: &[(&'static str, String)],
) -> Vec<String> {
    let mut lines = vec![
        "| run | records/s | ratio to the mean without the record | CPU (cores: process) |"
            .to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut runs: Vec<(bool, Rate)> = Vec::new();
    // Four rounds, the order swapped each round, so a drift of the machine falls on both.
    for round in 0..4 {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for applied in order {
            let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
            let mut redis_pids = pids.to_vec();
            if let Some(pid) = redis_pid(&server) {
                redis_pids.push(("redis-server", pid));
            }
            let mut settings = RedisSettings::new(server.url(), "mm");
            settings.applied = applied;
            let store = Arc::new(
                RedisStore::connect(settings, RetentionPolicy::default())
                    .await
                    .expect("redis"),
            );
            let group = format!("{}-applied{round}{applied}", w.topic);
            let rate = daemon_run(bootstrap, w, &group, store, &redis_pids).await;
            runs.push((applied, rate));
        }
    }
    let without: Vec<f64> = runs.iter().filter(|r| !r.0).map(|r| r.1.per_sec).collect();
    let base = without.iter().sum::<f64>() / without.len() as f64;
    for (applied, rate) in &runs {
        lines.push(row(
            &format!(
                "daemon, Redis on a unix socket, {}",
                if *applied {
                    "the applied record kept (the product)"
                } else {
                    "no applied record"
                }
            ),
            rate,
            base,
        ));
    }
    lines
}

/// `verify`'s arguments for one partition's whole range, as every bench run passes them.
fn verify_args(partition: i32) -> [String; 7] {
    [
        "verify",
        "--partition",
        &partition.to_string(),
        "--from-offset",
        "0",
        "--progress",
        "off",
    ]
    .map(str::to_owned)
}

/// `materializer verify` of every partition of `w` (applied to the store of `config` by the
/// daemon group `config` names): the rate over the workload's records, the CPU, and the peak RSS
/// of the largest run (`/usr/bin/time`).
fn verify_run(config: &Path, w: &Workload, pids: &[(&'static str, String)]) -> (Rate, u64) {
    let binary = env!("CARGO_BIN_EXE_materializer");
    let rss = std::env::temp_dir().join(format!("mm-bench-verify-rss-{}", w.topic));
    let meter = CpuMeter::start(pids);
    let mut peak_kb = 0u64;
    let mut cpu_seconds = 0.0;
    for partition in 0..PARTITIONS {
        let out = Command::new("/usr/bin/time")
            .arg("-o")
            .arg(&rss)
            .args(["-f", "%M %U %S", binary, "--config"])
            .arg(config)
            .args(verify_args(partition))
            .output()
            .expect("run materializer verify");
        let summary = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "verify: {summary}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let measured = std::fs::read_to_string(&rss).expect("time -o");
        let fields: Vec<f64> = measured
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        peak_kb = peak_kb.max(fields.first().copied().unwrap_or(0.0) as u64);
        cpu_seconds += fields.iter().skip(1).sum::<f64>();
    }
    let wall = meter.started.elapsed().as_secs_f64();
    let others = meter.stop();
    (
        Rate {
            per_sec: w.records as f64 / wall,
            cpu: format!("materializer verify {:.2}, {others}", cpu_seconds / wall),
            unchanged: 0,
        },
        peak_kb,
    )
}

/// `BENCH_ONLY=verify`: the workload applied to Redis by the daemon, then `verify` of every
/// partition alone (records/s, peak RSS), then the daemon into a fresh prefix alternately alone
/// and with a verify loop running beside it, twice each.
async fn verify_rows(
    bootstrap: &str,
    w: &Workload,
    pids: &[(&'static str, String)],
) -> Vec<String> {
    let server = RedisServer::start(Clock::Real, Listen::Tcp(redis_server::free_port()), &[]);
    let mut redis_pids = pids.to_vec();
    if let Some(pid) = redis_pid(&server) {
        redis_pids.push(("redis-server", pid));
    }
    let store = |prefix: &'static str| {
        let url = server.url();
        async move {
            let store: Arc<dyn MailboxStore> = Arc::new(
                RedisStore::connect(RedisSettings::new(url, prefix), RetentionPolicy::default())
                    .await
                    .expect("redis"),
            );
            store
        }
    };
    let group = format!("{}-verified", w.topic);
    let applied = daemon_run(bootstrap, w, &group, store("mm").await, &redis_pids).await;
    let dir = tempdir(&format!("verify-{}", w.topic));
    let config = dir.join("verify.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\n[kafka]\nbrokers = \"{bootstrap}\"\ntopic = \"{}\"\ndlq_topic = \"{}.dlq\"\ngroup_id = \"{group}\"\n",
            server.url(),
            w.topic,
            w.topic
        ),
    )
    .expect("config");
    let mut lines = vec![
        format!(
            "applied first by the daemon into Redis: {:.0} records/s",
            applied.per_sec
        ),
        String::new(),
        "| run | records/s | ratio | CPU (cores: process) |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let (alone, peak_kb) = verify_run(&config, w, &redis_pids);
    lines.push(row(
        &format!(
            "verify of every partition alone (peak RSS {} MiB; ratio to the daemon's apply)",
            peak_kb / 1024
        ),
        &alone,
        applied.per_sec,
    ));
    let mut runs = Vec::new();
    for round in 0..2 {
        for beside in [false, true] {
            let prefixes = ["r0a", "r0b", "r1a", "r1b"];
            let prefix = prefixes[round * 2 + usize::from(beside)];
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scrub = beside.then(|| {
                let stop = stop.clone();
                let config = config.clone();
                std::thread::spawn(move || {
                    let mut passes = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for partition in 0..PARTITIONS {
                            let status = Command::new(env!("CARGO_BIN_EXE_materializer"))
                                .arg("--config")
                                .arg(&config)
                                .args(verify_args(partition))
                                .stdout(std::process::Stdio::null())
                                .status()
                                .expect("verify");
                            assert!(status.success(), "verify beside the daemon: {status}");
                        }
                        passes += 1;
                    }
                    passes
                })
            });
            let rate = daemon_run(
                bootstrap,
                w,
                &format!("{}-{prefix}", w.topic),
                store(prefix).await,
                &redis_pids,
            )
            .await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let passes = scrub.map(|t| t.join().expect("scrub thread"));
            runs.push((beside, rate, passes));
        }
    }
    let base: f64 = runs
        .iter()
        .filter(|r| !r.0)
        .map(|r| r.1.per_sec)
        .sum::<f64>()
        / 2.0;
    for (_, rate, passes) in &runs {
        lines.push(row(
            &match passes {
                Some(n) => format!("daemon into Redis, a verify loop beside it ({n} whole passes)"),
                None => "daemon into Redis alone".to_owned(),
            },
            rate,
            base,
        ));
    }
    lines
}

/// `materializer` run once per entry of `runs` (each a string of arguments), one after the
/// other, as child processes: the rate over `records` and their CPU (from bash's `times`, which
/// reports the children's user and system seconds).
fn cli_run(runs: &[String], records: u64, pids: &[(&'static str, String)]) -> Rate {
    let binary = env!("CARGO_BIN_EXE_materializer");
    let script: String = runs
        .iter()
        .map(|args| format!("{binary} {args} >/dev/null || exit $?\n"))
        .collect::<String>()
        + "times\n";
    let meter = CpuMeter::start(pids);
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run materializer");
    let wall = meter.started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let others = meter.stop();
    // `times` prints the shell's line, then the children's: "0m1.234s 0m0.456s".
    let stdout = String::from_utf8_lossy(&out.stdout);
    let children = stdout.lines().nth(1).unwrap_or_default();
    let seconds: f64 = children
        .split_whitespace()
        .filter_map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m')?;
            Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
        })
        .sum();
    Rate {
        per_sec: records as f64 / wall,
        cpu: format!("materializer {:.2}, {others}", seconds / wall),
        unchanged: 0,
    }
}

/// The baseline of the Redis rows: the exact EVALSHA calls the Redis store makes for the whole
/// workload (each partition's records in order), packed once and piped raw by `redis-cli --pipe`
/// into an empty server, which answers them as fast as it can run the script.
fn redis_pipe(
    server: &RedisServer,
    store: &RedisStore,
    w: &Workload,
    pids: &[(&'static str, String)],
) -> Rate {
    use mailbox_materializer::store::redis::keys::KeySet;
    use mailbox_materializer::store::redis::scripts::Scripts;
    let load = Command::new("redis-cli")
        .arg("-s")
        .arg(server.socket())
        .args(["SCRIPT", "LOAD"])
        .arg(Scripts::append_source())
        .output()
        .expect("redis-cli");
    assert!(load.status.success(), "SCRIPT LOAD");
    let path = std::env::temp_dir().join(format!("mm-bench-pipe-{}.resp", w.topic));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("file"));
    let mut calls = 0u64;
    for partition in 0..PARTITIONS {
        let mut pipe = redis::pipe();
        for line in w.by_partition.get(&partition).into_iter().flatten() {
            let record = decode_record(line.as_bytes(), 1 << 20).expect("valid record");
            for delivery in record.deliveries() {
                if let mailbox_materializer::ingest::Delivery::Append(group) = delivery {
                    pipe.invoke_script(&store.append_invocation(KeySet::Live, "", &group));
                    calls += 1;
                }
            }
            if calls.is_multiple_of(1000) {
                file.write_all(&pipe.get_packed_pipeline()).expect("write");
                pipe = redis::pipe();
            }
        }
        file.write_all(&pipe.get_packed_pipeline()).expect("write");
    }
    file.flush().expect("flush");
    drop(file);
    server.raw("FLUSHALL");
    let meter = CpuMeter::start(pids);
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "redis-cli -s {} --pipe < {}",
            server.socket().display(),
            path.display()
        ))
        .output()
        .expect("redis-cli --pipe");
    let wall = meter.started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("errors: 0, replies: {calls}")),
        "every call answered without error: {text}"
    );
    let _ = std::fs::remove_file(&path);
    Rate {
        per_sec: w.records as f64 / wall,
        cpu: meter.stop(),
        unchanged: 0,
    }
}

/// The pid of a Redis server, from `INFO server`.
/// The daemon into one Redis master, then into a 3-master Redis Cluster, both over TCP on
/// loopback, each with its servers' CPU.
async fn cluster_rows(
    bootstrap: &str,
    w: &Workload,
    pids: &[(&'static str, String)],
) -> (Rate, Rate) {
    let server = RedisServer::start(Clock::Real, Listen::Tcp(redis_server::free_port()), &[]);
    let mut single_pids = pids.to_vec();
    if let Some(pid) = redis_pid(&server) {
        single_pids.push(("redis-server", pid));
    }
    let single_store = Arc::new(
        RedisStore::connect(
            RedisSettings::new(server.url(), "mm"),
            RetentionPolicy::default(),
        )
        .await
        .expect("redis"),
    );
    let single = daemon_run(
        bootstrap,
        w,
        &format!("{}-redis-tcp", w.topic),
        single_store,
        &single_pids,
    )
    .await;
    drop(server);

    let cluster = tokio::task::spawn_blocking(|| redis_server::RedisCluster::start(Clock::Real))
        .await
        .expect("cluster start");
    let names = ["redis-server 1", "redis-server 2", "redis-server 3"];
    let mut cluster_pids = pids.to_vec();
    for (name, node) in names.iter().zip(&cluster.nodes) {
        if let Some(pid) = redis_pid(node) {
            cluster_pids.push((name, pid));
        }
    }
    let cluster_store = Arc::new(cluster.store().await);
    let clustered = daemon_run(
        bootstrap,
        w,
        &format!("{}-redis-cluster", w.topic),
        cluster_store,
        &cluster_pids,
    )
    .await;
    (single, clustered)
}

/// SPEC 7.2 "The cluster may change under load": the daemon into a Redis Cluster of 3 masters
/// plus an empty fourth, first as it is (the steady baseline), then while `redis-cli --cluster
/// rebalance --cluster-use-empty-masters` moves a quarter of the slots onto the fourth, started
/// with the daemon. Each row names the redirections the store met, the groups answered twice
/// (`unchanged`: every group of the workload is new) and every redis-server's CPU.
async fn reshard_rows(
    bootstrap: &str,
    w: &Workload,
    pids: &[(&'static str, String)],
) -> Vec<String> {
    const NAMES: [&str; 4] = [
        "redis-server 1",
        "redis-server 2",
        "redis-server 3",
        "redis-server 4 (new)",
    ];
    let mut rows = vec![
        format!(
            "\n### A Redis Cluster resharded under load ({} records, {} users, {PARTITIONS} partitions)\n",
            w.records, w.users
        ),
        "| path | records/s | ratio | answered twice | redirections (moved/ask/tryagain) | rebalance | CPU (cores: process) |".to_owned(),
        "|---|---|---|---|---|---|---|".to_owned(),
    ];
    let mut steady = None;
    for moving in [false, true] {
        let cluster = tokio::task::spawn_blocking(|| {
            let mut cluster = redis_server::RedisCluster::start(Clock::Real);
            cluster.add_master(Clock::Real);
            Arc::new(cluster)
        })
        .await
        .expect("cluster start");
        let mut cluster_pids = pids.to_vec();
        for (name, node) in NAMES.iter().zip(&cluster.nodes) {
            if let Some(pid) = redis_pid(node) {
                cluster_pids.push((name, pid));
            }
        }
        let store = Arc::new(cluster.store().await);
        let rebalance = moving.then(|| {
            let cluster = cluster.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                cluster.rebalance_onto_empty_masters();
                started.elapsed()
            })
        });
        let started = Instant::now();
        let rate = daemon_run(
            bootstrap,
            w,
            &format!("{}-reshard-{moving}", w.topic),
            store.clone(),
            &cluster_pids,
        )
        .await;
        let run = started.elapsed();
        let took = rebalance.map(|h| h.join().expect("rebalance"));
        let r = store.cluster_redirects().unwrap_or_default();
        let baseline = *steady.get_or_insert(rate.per_sec);
        let name = if moving {
            "daemon while 4,096 slots move onto the fourth master (ratio to steady)"
        } else {
            "daemon, 3 masters + an empty fourth, nothing moves (steady baseline)"
        };
        rows.push(format!(
            "| {name} | {:.0} | {:.2} | {} | {}/{}/{} | {} | {} |",
            rate.per_sec,
            rate.per_sec / baseline,
            rate.unchanged,
            r[0],
            r[1],
            r[2],
            took.map_or("none".to_owned(), |t| format!(
                "{:.1} s of the run's {:.1} s",
                t.as_secs_f64(),
                run.as_secs_f64()
            )),
            rate.cpu
        ));
    }
    rows
}

/// SPEC 7 "a corrupt mailbox holds only itself": the daemon into Redis with a workload where
/// one mailbox (on partition 0) gets every 10th record, first healthy (the baseline), then with
/// that mailbox damaged before the run (its epoch key overwritten: every write of it fails
/// closed). The rate is the healthy mailboxes' records/s in both runs.
async fn blocked_rows(bootstrap: &str, pids: &[(&'static str, String)]) -> Vec<String> {
    let records = records_wanted();
    let w = prepare(bootstrap, "hot", records, records / 10).await;
    let hot = records.div_ceil(HOT_EVERY);
    let mut rows = vec![
        format!(
            "\n### One corrupt hot mailbox ({} records, every {HOT_EVERY}th for one mailbox on partition 0, {} other users, {PARTITIONS} partitions)\n",
            w.records, w.users
        ),
        "| path | healthy records/s | ratio | CPU (cores: process) |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut baseline = None;
    for damaged in [false, true] {
        let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
        let mut redis_pids = pids.to_vec();
        if let Some(pid) = redis_pid(&server) {
            redis_pids.push(("redis-server", pid));
        }
        if damaged {
            server.raw(&format!("SET mm:epoch:{{{HOT_USER}}} damaged"));
        }
        let store = Arc::new(
            RedisStore::connect(
                RedisSettings::new(server.url(), "mm"),
                RetentionPolicy::default(),
            )
            .await
            .expect("redis"),
        );
        let run = Workload {
            name: w.name,
            topic: w.topic.clone(),
            users: w.users,
            records: w.records,
            expect: if damaged { w.records - hot } else { w.records },
            by_partition: HashMap::new(),
        };
        let rate = daemon_run(
            bootstrap,
            &run,
            &format!("{}-blocked-{damaged}", w.topic),
            store,
            &redis_pids,
        )
        .await;
        // The healthy share of the baseline's records/s.
        let healthy = if damaged {
            rate.per_sec
        } else {
            rate.per_sec * (w.records - hot) as f64 / w.records as f64
        };
        let base = *baseline.get_or_insert(healthy);
        let name = if damaged {
            "daemon, the hot mailbox corrupt: its records skipped (ratio to healthy)"
        } else {
            "daemon, every mailbox healthy (baseline)"
        };
        rows.push(format!(
            "| {name} | {healthy:.0} | {:.2} | {} |",
            healthy / base,
            rate.cpu
        ));
    }
    rows
}

fn redis_pid(server: &RedisServer) -> Option<String> {
    server
        .raw("INFO server")
        .lines()
        .find_map(|l| l.strip_prefix("process_id:").map(|p| p.trim().to_owned()))
}

fn kafka_pid() -> Option<String> {
    let path = std::env::var("KAFKA_PID_FILE").unwrap_or_else(|_| "target/kafka-run/pid".into());
    std::fs::read_to_string(path)
        .ok()
        .map(|p| p.trim().to_owned())
}

fn row(name: &str, rate: &Rate, baseline: f64) -> String {
    format!(
        "| {name} | {:.0} | {:.2} | {} |",
        rate.per_sec,
        rate.per_sec / baseline,
        rate.cpu
    )
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    // As the `materializer` binary does first thing (`BENCH_ALLOCATOR_DEFAULTS` skips it, to
    // measure what it costs).
    if std::env::var_os("BENCH_ALLOCATOR_DEFAULTS").is_none() {
        mailbox_materializer::allocator::return_memory_promptly();
    }
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP must point at a broker (scripts/kafka start)");
    // As in `materializer run`: every metric is recorded, so its cost is measured too.
    daemon::metrics::install().expect("metrics recorder");
    let records = records_wanted();
    let me = std::process::id().to_string();
    let mut pids = vec![("bench", me)];
    if let Some(kafka) = kafka_pid() {
        pids.push(("kafka", kafka));
    }

    if std::env::var("BENCH_ONLY").as_deref() == Ok("blocked") {
        println!("## Daemon throughput beside a corrupt hot mailbox");
        for line in blocked_rows(&bootstrap, &pids).await {
            println!("{line}");
        }
        return;
    }
    let warm = prepare(&bootstrap, "warm", records, records / 10).await;
    if std::env::var("BENCH_ONLY").as_deref() == Ok("tap") {
        println!("## Daemon throughput with a tap attached");
        for line in tap_rows(&bootstrap, &warm, &pids).await {
            println!("{line}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("applied") {
        println!("## Daemon throughput with and without the applied record");
        for line in applied_rows(&bootstrap, &warm, &pids).await {
            println!("{line}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("verify") {
        println!("## verify (the scrub) alone, and the daemon with a scrub beside it");
        for line in verify_rows(&bootstrap, &warm, &pids).await {
            println!("{line}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("reshard") {
        println!("## Daemon throughput while a Redis Cluster is resharded");
        for line in reshard_rows(&bootstrap, &warm, &pids).await {
            println!("{line}");
        }
        return;
    }
    let fresh = prepare(&bootstrap, "fresh", records, records).await;
    let mut report = Vec::new();
    for w in [&warm, &fresh] {
        report.push(format!(
            "\n### {} ({} records, {} users, {PARTITIONS} partitions)\n",
            w.name, w.records, w.users
        ));
        report.push("| path | records/s | ratio | CPU (cores: process) |".to_owned());
        report.push("|---|---|---|---|".to_owned());
        let bare = bare_consumer(&bootstrap, w, &pids).await;
        report.push(row("bare consumer (baseline A)", &bare, bare.per_sec));
        let sequential = sequential_loop(&bootstrap, w, &pids).await;
        report.push(row(
            "sequential loop: consume, decode, MemoryStore::append (baseline B; ratio to A)",
            &sequential,
            bare.per_sec,
        ));
        let memory = daemon_run(
            &bootstrap,
            w,
            &format!("{}-memory", w.topic),
            Arc::new(MemoryStore::new(
                RetentionPolicy::default(),
                Arc::new(SystemClock),
            )),
            &pids,
        )
        .await;
        report.push(row(
            "daemon, memory store (ratio to B)",
            &memory,
            sequential.per_sec,
        ));
        report.push(format!(
            "| daemon, memory store (ratio to A) | {:.0} | {:.2} | |",
            memory.per_sec,
            memory.per_sec / bare.per_sec
        ));

        let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
        let mut redis_pids = pids.clone();
        if let Some(pid) = redis_pid(&server) {
            redis_pids.push(("redis-server", pid));
        }
        let redis = Arc::new(
            RedisStore::connect(
                RedisSettings::new(server.url(), "mm"),
                RetentionPolicy::default(),
            )
            .await
            .expect("redis"),
        );
        let pipe = redis_pipe(&server, &redis, w, &redis_pids);
        report.push(row(
            "redis-cli --pipe of the store's exact EVALSHA calls (baseline C; ratio to A)",
            &pipe,
            bare.per_sec,
        ));
        server.raw("FLUSHALL");
        let redis_rate = daemon_run(
            &bootstrap,
            w,
            &format!("{}-redis", w.topic),
            redis.clone(),
            &redis_pids,
        )
        .await;
        report.push(row(
            "daemon, Redis on a unix socket (ratio to C)",
            &redis_rate,
            pipe.per_sec,
        ));
        // The same records from files through apply (partition by partition, like a backfill).
        let dir = tempdir(&w.topic);
        let mut files = Vec::new();
        for partition in 0..PARTITIONS {
            let path = dir.join(format!("p{partition}.jsonl"));
            let mut file = std::fs::File::create(&path).expect("file");
            for line in w.by_partition.get(&partition).into_iter().flatten() {
                writeln!(file, "{line}").expect("write");
            }
            files.push(path);
        }
        server.raw("FLUSHALL");
        let apply_args: Vec<String> = files
            .iter()
            .map(|f| {
                format!(
                    "--store redis --redis-url {} apply {}",
                    server.url(),
                    f.display()
                )
            })
            .collect();
        let apply = cli_run(&apply_args, w.records, &redis_pids);
        report.push(row(
            "apply (files of the same records), Redis (ratio to the daemon into Redis)",
            &apply,
            redis_rate.per_sec,
        ));
        server.raw("FLUSHALL");
        let replay_args: Vec<String> = (0..PARTITIONS)
            .map(|p| {
                format!(
                    "--store redis --redis-url {} replay --config {} --partition {p} --from-offset 0 --progress off",
                    server.url(),
                    config_file(&dir, &bootstrap, &w.topic).display()
                )
            })
            .collect();
        let replay = cli_run(&replay_args, w.records, &redis_pids);
        report.push(row(
            "replay (every partition), Redis (ratio to the daemon into Redis)",
            &replay,
            redis_rate.per_sec,
        ));
        let _ = std::fs::remove_dir_all(&dir);

        // Redis Cluster (SPEC 7.2): the daemon into 3 masters against one master, both over TCP,
        // with every redis-server's CPU.
        if w.name == "warm" {
            let (single, cluster) = cluster_rows(&bootstrap, w, &pids).await;
            report.push(row(
                "daemon, one Redis master over TCP (baseline D)",
                &single,
                single.per_sec,
            ));
            report.push(row(
                "daemon, 3-master Redis Cluster over TCP (ratio to D)",
                &cluster,
                single.per_sec,
            ));
        }
    }

    if let Ok(nodes) = std::env::var("SCYLLA_NODES") {
        report.extend(scylla_rows(&bootstrap, &nodes, &pids).await);
    }

    println!(
        "## Daemon throughput ({records} records a workload, {PARTITIONS} partitions, groups of 2 events)"
    );
    for line in report {
        println!("{line}");
    }
}

/// The daemon into Scylla (Cassandra in the tests): a smaller warm workload, since a CQL append
/// costs a Paxos round; the CPU of the CQL server's JVM is named when `CASSANDRA_PID_FILE` (or
/// `target/cassandra-run/pid`) gives it.
async fn scylla_rows(bootstrap: &str, nodes: &str, pids: &[(&'static str, String)]) -> Vec<String> {
    use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
    let records: u64 = std::env::var("BENCH_SCYLLA_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let w = prepare(bootstrap, "scylla", records, records / 10).await;
    let keyspace = format!("mm_bench_{}", now_ms());
    let store = Arc::new(
        ScyllaStore::connect(
            ScyllaSettings::new(vec![nodes.to_owned()], keyspace.clone()),
            RetentionPolicy::default(),
            Arc::new(SystemClock),
        )
        .await
        .expect("scylla"),
    );
    let mut scylla_pids = pids.to_vec();
    let pid_file =
        std::env::var("CASSANDRA_PID_FILE").unwrap_or_else(|_| "target/cassandra-run/pid".into());
    if let Ok(pid) = std::fs::read_to_string(pid_file) {
        scylla_pids.push(("cassandra", pid.trim().to_owned()));
    }
    let rate = daemon_run(
        bootstrap,
        &w,
        &format!("{}-scylla", w.topic),
        store.clone(),
        &scylla_pids,
    )
    .await;
    let _ = store
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
        .await;
    vec![
        format!(
            "\n### Scylla, warm ({} records, {} users, {PARTITIONS} partitions)\n",
            w.records, w.users
        ),
        "| path | records/s | CPU (cores: process) |".to_owned(),
        "|---|---|---|".to_owned(),
        format!(
            "| daemon into Cassandra 5.0 (LWT commit per append) | {:.0} | {} |",
            rate.per_sec, rate.cpu
        ),
    ]
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mm-bench-{name}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn config_file(dir: &Path, bootstrap: &str, topic: &str) -> std::path::PathBuf {
    let path = dir.join("replay.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbrokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndlq_topic = \"{topic}.dlq\"\ngroup_id = \"{topic}-replay-bench\"\n"
        ),
    )
    .expect("config");
    path
}
