//! The figures of the capacity model (docs/capacity.md), each measured on `materializer run`
//! processes (the release binary) into Redis on a unix socket, as an operator runs them:
//!
//! - **produce-to-visible latency** at steady loads: a producer sends records at a fixed rate
//!   while every 50 ms a probe record (a user of its own, seq 1, round-robin over the
//!   partitions) is sent and its mailbox scanned every 2 ms until the group is there; the
//!   latency is from the probe's send to the first scan that sees it (the scan itself included,
//!   about 0.1 ms). Reported: the rate reached, p50/p99/max of the probes, and each process's CPU.
//! - **replicas**: a backlog of `BENCH_RECORDS` records (default 150,000) over 6 partitions read
//!   by 1, 2 and 3 replicas of one group, from the start of the first to the group's commit of
//!   every record: records/s and the CPU of the replicas and of redis-server (the bottleneck).
//!
//! Run: `KAFKA_BOOTSTRAP=$(scripts/kafka start) cargo bench --bench capacity` (redis-server from
//! scripts/install-services). `BENCH_RATES` (comma-separated records/s, default 1000,5000,15000)
//! and `BENCH_SECONDS` (each level's length, default 15) change the latency runs. Prints Markdown.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mailbox_materializer::model::{MailboxId, RetentionPolicy, ScanRequest, UserId, DAY_MS};
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::TopicPartitionList;
use redis_server::{Clock, Listen, RedisServer};

const PARTITIONS: i32 = 6;

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

/// One record of one delivery of 2 events for `user`'s `seq`, dated today.
fn record(user: &str, seq: u64, today_ms: u64) -> String {
    serde_json::json!({
        "dispatch_id": format!("cap/{user}/{seq}"), "group_id": "g", "committed_at": today_ms,
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hello there"}},
                       {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]}]
    })
    .to_string()
}

async fn create_topics(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    for result in admin
        .create_topics(
            &[
                NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(-1)),
                NewTopic::new(&format!("{topic}.dlq"), 1, TopicReplication::Fixed(-1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics")
    {
        result.expect("topic");
    }
}

fn producer(bootstrap: &str, linger_ms: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", linger_ms)
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer")
}

/// A `materializer run` process of `group` on `topic` into `redis_url`.
struct Replica {
    child: Child,
}

impl Replica {
    fn start(
        dir: &Path,
        n: usize,
        bootstrap: &str,
        topic: &str,
        group: &str,
        redis_url: &str,
    ) -> Self {
        let config = dir.join(format!("replica-{n}.toml"));
        std::fs::write(
            &config,
            format!(
                "[kafka]\nbrokers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndlq_topic = \"{topic}.dlq\"\ngroup_id = \"{group}\"\n\
                 [store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{redis_url}\"\n\
                 [http]\nlisten = \"127.0.0.1:{}\"\n",
                redis_server::free_port()
            ),
        )
        .expect("config");
        let log = std::fs::File::create(dir.join(format!("replica-{n}.log"))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("materializer run");
        Self { child }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// CPU cores each named process used since `start` (seconds of CPU over seconds of wall).
fn cores(pids: &[(String, String)], start: &[f64], wall: f64) -> String {
    pids.iter()
        .zip(start)
        .map(|((name, pid), s)| {
            format!(
                "{name} {:.2}",
                (proc::cpu_seconds(pid).unwrap_or(*s) - s) / wall
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU microseconds per record of each named process since `start` (seconds of CPU over the
/// records): a figure that does not depend on how long the processes idled.
fn per_record(pids: &[(String, String)], start: &[f64], records: u64) -> String {
    pids.iter()
        .zip(start)
        .map(|((name, pid), s)| {
            format!(
                "{name} {:.1}",
                (proc::cpu_seconds(pid).unwrap_or(*s) - s) / records as f64 * 1e6
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The broker's pid, when it is the one `scripts/kafka start` runs.
fn kafka_pid() -> Option<(String, String)> {
    let path = std::env::var("KAFKA_PID_FILE").unwrap_or_else(|_| "target/kafka-run/pid".into());
    std::fs::read_to_string(path)
        .ok()
        .map(|p| ("kafka".to_owned(), p.trim().to_owned()))
}

fn cpu_now(pids: &[(String, String)]) -> Vec<f64> {
    pids.iter()
        .map(|(_, p)| proc::cpu_seconds(p).unwrap_or(0.0))
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Scans `user`'s mailbox every 2 ms until seq 1 is there; the time since `sent`.
async fn visible(store: Arc<RedisStore>, user: String, sent: Instant) -> f64 {
    let mailbox = MailboxId::new(UserId::parse(&user).expect("user"), 1);
    loop {
        let page = store
            .range_scan(
                &mailbox,
                ScanRequest {
                    after_seq: 0,
                    until_seq: None,
                    limit_groups: 10,
                },
            )
            .await;
        if page.is_ok_and(|p| !p.groups.is_empty()) {
            return sent.elapsed().as_secs_f64() * 1000.0;
        }
        if sent.elapsed() > Duration::from_secs(60) {
            return f64::INFINITY;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One steady load of `rate` records/s for `seconds`, with probes: a Markdown row.
async fn latency_row(bootstrap: &str, dir: &Path, rate: u64, seconds: u64) -> String {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let topic = format!("cap-latency-{rate}-{}", now_ms());
    create_topics(bootstrap, &topic).await;
    let replica = Replica::start(
        dir,
        0,
        bootstrap,
        &topic,
        &format!("{topic}-g"),
        &server.url(),
    );
    let store = Arc::new(
        RedisStore::connect(
            RedisSettings::new(server.url(), "mm"),
            RetentionPolicy::default(),
        )
        .await
        .expect("redis"),
    );
    let today = now_ms() - now_ms() % DAY_MS;
    let load = producer(bootstrap, "5");
    let probes = producer(bootstrap, "0");
    // Before the clock starts: the replica's first assignment and each partition's first record
    // (a partition's first records wait for the group's commits to be read once, SPEC 7.2's
    // growth check), one probe per partition, waited for.
    for partition in 0..PARTITIONS {
        let warm = format!("cap-warm-{partition}");
        probes
            .send(
                FutureRecord::<str, str>::to(&topic)
                    .partition(partition)
                    .payload(&record(&warm, 1, today)),
                Duration::from_secs(10),
            )
            .await
            .expect("warm-up record");
        visible(store.clone(), warm, Instant::now()).await;
    }

    let redis_pid = server
        .raw("INFO server")
        .lines()
        .find_map(|l| l.strip_prefix("process_id:").map(|p| p.trim().to_owned()))
        .unwrap_or_default();
    let mut pids = vec![
        ("daemon".to_owned(), replica.pid()),
        ("redis-server".to_owned(), redis_pid),
        (
            "bench (producer, probes)".to_owned(),
            std::process::id().to_string(),
        ),
    ];
    pids.extend(kafka_pid());
    let cpu_start = cpu_now(&pids);
    let started = Instant::now();
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let mut sent = 0u64;
    let mut probe_n = 0u64;
    let mut last_probe = Instant::now() - Duration::from_secs(1);
    let mut waits = Vec::new();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while started.elapsed() < Duration::from_secs(seconds) {
        interval.tick().await;
        for _ in 0..per_tick {
            let user = format!("cap-user-{}", sent % 20_000);
            let seq = sent / 20_000 + 1;
            let partition = ((sent % 20_000) % PARTITIONS as u64) as i32;
            let payload = record(&user, seq, today);
            // Enqueue only: the producer's queue holds 1,000,000, far beyond a level's records.
            let _ = load.send_result(
                FutureRecord::<str, str>::to(&topic)
                    .partition(partition)
                    .payload(&payload),
            );
            sent += 1;
        }
        if last_probe.elapsed() >= Duration::from_millis(50) {
            last_probe = Instant::now();
            let user = format!("cap-probe-{probe_n}");
            let partition = (probe_n % PARTITIONS as u64) as i32;
            probe_n += 1;
            let payload = record(&user, 1, today);
            let at = Instant::now();
            let _ = probes.send_result(
                FutureRecord::<str, str>::to(&topic)
                    .partition(partition)
                    .payload(&payload),
            );
            waits.push(tokio::spawn(visible(store.clone(), user, at)));
        }
    }
    let mut latencies = Vec::new();
    for wait in waits {
        latencies.push(wait.await.expect("probe"));
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cores(&pids, &cpu_start, wall);
    load.flush(Duration::from_secs(30)).expect("flush");
    latencies.sort_by(f64::total_cmp);
    drop(replica);
    format!(
        "| {rate} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {cpu} |",
        sent as f64 / wall,
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
    )
}

/// How many records of `topic` the group has committed (each partition's committed offset,
/// capped at its end), `None` when the broker did not answer.
fn committed(consumer: &BaseConsumer, topic: &str, ends: &[i64]) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .ok()?;
    Some(
        (0..PARTITIONS)
            .map(|p| {
                got.find_partition(topic, p)
                    .and_then(|e| e.offset().to_raw())
                    .unwrap_or(0)
                    .clamp(0, ends[p as usize])
            })
            .sum(),
    )
}

/// `replicas` processes of one group over a backlog of `records`: a Markdown row.
async fn replicas_row(bootstrap: &str, dir: &Path, replicas: usize, records: u64) -> String {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let topic = format!("cap-replicas-{replicas}-{}", now_ms());
    create_topics(bootstrap, &topic).await;
    let today = now_ms() - now_ms() % DAY_MS;
    let load = producer(bootstrap, "20");
    let mut ends = vec![0i64; PARTITIONS as usize];
    let mut acks = Vec::new();
    for i in 0..records {
        let user = format!("cap-user-{}", i % 20_000);
        let partition = ((i % 20_000) % PARTITIONS as u64) as i32;
        let payload = record(&user, i / 20_000 + 1, today);
        acks.push((
            partition,
            load.send_result(
                FutureRecord::<str, str>::to(&topic)
                    .partition(partition)
                    .payload(&payload),
            )
            .map_err(|(e, _)| e)
            .expect("enqueue"),
        ));
        if acks.len() >= 50_000 {
            for (p, ack) in acks.drain(..) {
                let offset = ack.await.expect("ack").expect("delivered").offset;
                ends[p as usize] = ends[p as usize].max(offset + 1);
            }
        }
    }
    for (p, ack) in acks {
        let offset = ack.await.expect("ack").expect("delivered").offset;
        ends[p as usize] = ends[p as usize].max(offset + 1);
    }
    let group = format!("{topic}-g");
    let watcher: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("watcher");
    let redis_pid = server
        .raw("INFO server")
        .lines()
        .find_map(|l| l.strip_prefix("process_id:").map(|p| p.trim().to_owned()))
        .unwrap_or_default();
    let started = Instant::now();
    let running: Vec<Replica> = (0..replicas)
        .map(|n| Replica::start(dir, n, bootstrap, &topic, &group, &server.url()))
        .collect();
    let mut pids: Vec<(String, String)> = running
        .iter()
        .enumerate()
        .map(|(n, r)| (format!("replica {}", n + 1), r.pid()))
        .collect();
    pids.push(("redis-server".to_owned(), redis_pid));
    pids.extend(kafka_pid());
    let cpu_start = cpu_now(&pids);
    // The steady rate: from the commit of 10 % of the backlog to that of 90 % (the start-up, the
    // group's first assignment and the last commit interval left out).
    let total: i64 = ends.iter().sum();
    let (mut t10, mut t90) = (None, None);
    loop {
        let done = committed(&watcher, &topic, &ends).unwrap_or(0);
        if t10.is_none() && done * 10 >= total {
            t10 = Some((Instant::now(), done));
        }
        if t90.is_none() && done * 10 >= total * 9 {
            t90 = Some((Instant::now(), done));
        }
        if done >= total {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the backlog was not committed within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let steady = match (t10, t90) {
        (Some((a, da)), Some((b, db))) if b > a => (db - da) as f64 / (b - a).as_secs_f64(),
        _ => f64::NAN,
    };
    let wall = started.elapsed().as_secs_f64();
    let cpu = cores(&pids, &cpu_start, wall);
    let micros = per_record(&pids, &cpu_start, records);
    drop(running);
    format!(
        "| {replicas} | {records} | {:.0} | {steady:.0} | {cpu} | {micros} |",
        records as f64 / wall
    )
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP must point at a broker (scripts/kafka start)");
    let dir: PathBuf =
        std::env::temp_dir().join(format!("mm-bench-capacity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rates: Vec<u64> = std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "1000,5000,15000".to_owned())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let seconds: u64 = env_or("BENCH_SECONDS", 15);
    let records: u64 = env_or("BENCH_RECORDS", 150_000);

    println!("## Produce-to-visible latency, one replica into Redis ({PARTITIONS} partitions)\n");
    println!("| load asked (records/s) | sent (records/s) | probes | p50 (ms) | p99 (ms) | max (ms) | CPU (cores) |");
    println!("|---|---|---|---|---|---|---|");
    for rate in &rates {
        println!("{}", latency_row(&bootstrap, &dir, *rate, seconds).await);
    }
    println!("\n## Replicas of one group over a backlog, into one Redis\n");
    println!("| replicas | records | records/s, start to every commit | records/s, 10 % to 90 % committed | CPU (cores, start to end) | CPU per record (µs) |");
    println!("|---|---|---|---|---|---|");
    for replicas in 1..=3 {
        println!(
            "{}",
            replicas_row(&bootstrap, &dir, replicas, records).await
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
