//! What a repair costs for one large mailbox: `replay --reset-mailboxes` of a user holding
//! 10,000 groups, on Redis and on Scylla, with the daemon running beside it.
//!
//! For each backend, in one run:
//! - **baseline**: the daemon writing the same 10,000 records into an empty store (one user, so
//!   one lane: the same serial order a repair of that user has);
//! - **repair**: `replay --partition 0 --from-offset 0 --user big --reset-mailboxes` of the
//!   whole log, timed, with the CPU of the replay process and of the store's server;
//! - **extra keys / rows**: what the rebuild holds aside at its peak, counted while the replay
//!   waits just before its swap (`MATERIALIZER_PAUSE_AT=replay.before_swap:<ms>`), and what is
//!   left once it has swapped (nothing, or the repair leaked).
//!
//! Run: `KAFKA_BOOTSTRAP=$(scripts/kafka start) SCYLLA_NODES=$(scripts/cassandra start) cargo
//! bench --bench repair_cost` (without `SCYLLA_NODES` only the Redis rows; `BENCH_GROUPS`
//! overrides the 10,000; `BENCH_MATERIALIZER` runs the repair with another build's binary, one
//! built with `--features failpoints`). Prints a Markdown report.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proc::listener_pid;
use support::kafka::{committed, create_topic, produce, unique, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::now_ms;

/// CPU seconds a process has used so far (0 once it is gone: the figure is then not shown as
/// more than it was).
/// The binary the repair runs: this build's, or `BENCH_MATERIALIZER` (another build's, to
/// compare two builds on the same server in one session).
fn materializer() -> String {
    std::env::var("BENCH_MATERIALIZER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_materializer").to_owned())
}

fn cpu_seconds_or_0(pid: &str) -> f64 {
    proc::cpu_seconds(pid).unwrap_or(0.0)
}

/// The user whose mailbox is repaired.
const USER: &str = "big";

fn groups_wanted() -> u64 {
    std::env::var("BENCH_GROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// One group of two events for `USER` at `seq`, dated now.
fn record(seq: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("repair-bench/{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": USER, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hello there"}},
                       {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]}]
    })
    .to_string()
    .into_bytes()
}

/// How a backend's store is seen from outside: its server's pid and a count of what it holds.
enum Backend {
    Redis(RedisServer),
    Scylla {
        session: Box<scylla::client::session::Session>,
        keyspace: String,
        pid: Option<String>,
    },
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "Redis (unix socket)",
            Backend::Scylla { .. } => "Scylla (Cassandra 5)",
        }
    }

    fn unit(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "keys",
            Backend::Scylla { .. } => "rows",
        }
    }

    fn server_pid(&self) -> Option<String> {
        match self {
            Backend::Redis(server) => Some(server.pid().to_string()),
            Backend::Scylla { pid, .. } => pid.clone(),
        }
    }

    /// Bytes the server holds for data (Redis `used_memory`); Scylla's on-disk size is not
    /// comparable at this scale (memtables, compaction), so it is not reported.
    fn bytes(&self) -> Option<u64> {
        match self {
            Backend::Redis(server) => server.raw("INFO memory").lines().find_map(|l| {
                l.strip_prefix("used_memory:")
                    .and_then(|v| v.trim().parse().ok())
            }),
            Backend::Scylla { .. } => None,
        }
    }

    /// Every key (Redis) or every row of every table of the keyspace (Scylla).
    async fn count(&self) -> u64 {
        match self {
            Backend::Redis(server) => server
                .raw("DBSIZE")
                .trim()
                .trim_start_matches(':')
                .parse()
                .expect("DBSIZE answers a number"),
            Backend::Scylla {
                session, keyspace, ..
            } => {
                let tables = session
                    .query_unpaged(
                        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
                        (keyspace.as_str(),),
                    )
                    .await
                    .expect("list tables")
                    .into_rows_result()
                    .expect("rows");
                let names: Vec<String> = tables
                    .rows::<(String,)>()
                    .expect("typed rows")
                    .map(|r| r.expect("row").0)
                    .collect();
                let mut total = 0u64;
                for table in names {
                    let result = session
                        .query_unpaged(format!("SELECT COUNT(*) FROM {keyspace}.{table}"), ())
                        .await
                        .expect("count rows")
                        .into_rows_result()
                        .expect("rows");
                    let (n,) = result.single_row::<(i64,)>().expect("one count");
                    total += n as u64;
                }
                total
            }
        }
    }
}

/// The figures of one backend.
struct Figures {
    backend: &'static str,
    unit: &'static str,
    groups: u64,
    baseline_secs: f64,
    baseline_cpu: String,
    repair_secs: f64,
    repair_cpu: String,
    live: u64,
    extra_at_peak: u64,
    /// Extra server memory at the swap over the live mailbox's, in bytes (Redis).
    extra_bytes: Option<(u64, u64)>,
    left_after: i64,
}

/// Seconds `replay` took, and the CPU (cores) of the replay process (bash's `times` reports its
/// children) and of the store's server over that time.
fn timed_replay(setup: &DaemonSetup, server_pid: Option<&str>) -> (f64, String) {
    let config = setup.config_file(free_port());
    let script = format!(
        "{} replay --config {} --partition 0 --from-offset 0 --user {USER} --reset-mailboxes --progress off >/dev/null || exit $?\ntimes\n",
        materializer(),
        config.display()
    );
    let server_start = server_pid.map(cpu_seconds_or_0);
    let started = Instant::now();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run replay");
    let wall = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `times` prints the shell's line, then the children's: "0m1.234s 0m0.456s".
    let stdout = String::from_utf8_lossy(&out.stdout);
    let children: f64 = stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m')?;
            Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
        })
        .sum();
    let mut cpu = format!("replay {:.2}", children / wall);
    if let (Some(pid), Some(start)) = (server_pid, server_start) {
        cpu += &format!(", server {:.2}", (cpu_seconds_or_0(pid) - start) / wall);
    }
    (wall, cpu)
}

/// The extra keys or rows a repair holds aside just before its swap: the replay is held there
/// for `hold_ms` while they are counted, then swaps and exits 0.
async fn extra_at_peak(
    setup: &DaemonSetup,
    backend: &Backend,
    live: u64,
    live_bytes: Option<u64>,
) -> (u64, Option<(u64, u64)>) {
    let hold_ms = 20_000;
    let config = setup.config_file(free_port());
    let log = setup.dir.join(format!("repair-peak-{}.err", now_ms()));
    let mut child = Command::new(materializer())
        .args(["replay", "--config"])
        .arg(&config)
        .args(["--partition", "0", "--from-offset", "0", "--user", USER])
        .args(["--reset-mailboxes", "--progress", "off"])
        .env(
            "MATERIALIZER_PAUSE_AT",
            format!("replay.before_swap:{hold_ms}"),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start replay");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("paused at replay.before_swap") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("replay exited ({status}) before its swap: {text}");
        }
        assert!(Instant::now() < deadline, "replay never reached its swap");
        std::thread::sleep(Duration::from_millis(20));
    }
    let during = backend.count().await;
    let during_bytes = backend.bytes();
    let status = child.wait().expect("replay exits");
    assert!(
        status.success(),
        "the held replay swaps and exits 0: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let bytes = live_bytes
        .zip(during_bytes)
        .map(|(live, during)| (live, during.saturating_sub(live)));
    (during.saturating_sub(live), bytes)
}

async fn measure(backend: Backend, mut setup: DaemonSetup, groups: u64) -> Figures {
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    setup.max_in_flight = 10_000;
    let records: Vec<(i32, Vec<u8>)> = (1..=groups).map(|seq| (0, record(seq))).collect();
    produce(&setup.topic, &records).await;

    // Baseline: the daemon writes the whole log of the one user.
    let server_pid = backend.server_pid();
    let server_start = server_pid.as_deref().map(cpu_seconds_or_0);
    let started = Instant::now();
    let daemon = Daemon::start(&setup);
    let daemon_start = cpu_seconds_or_0(&daemon.child.id().to_string());
    wait_for(
        "the daemon commits every record",
        Duration::from_secs(1800),
        || committed(&setup.group, &setup.topic, 1) == [groups as i64],
        || daemon.log(),
    );
    let baseline_secs = started.elapsed().as_secs_f64();
    let mut baseline_cpu = format!(
        "daemon {:.2}",
        (cpu_seconds_or_0(&daemon.child.id().to_string()) - daemon_start) / baseline_secs
    );
    if let (Some(pid), Some(start)) = (server_pid.as_deref(), server_start) {
        baseline_cpu += &format!(
            ", server {:.2}",
            (cpu_seconds_or_0(pid) - start) / baseline_secs
        );
    }
    let live = backend.count().await;
    let live_bytes = backend.bytes();

    let (repair_secs, repair_cpu) = timed_replay(&setup, server_pid.as_deref());
    let (extra_at_peak, extra_bytes) = extra_at_peak(&setup, &backend, live, live_bytes).await;
    let left_after = backend.count().await as i64 - live as i64;
    drop(daemon);
    Figures {
        backend: backend.name(),
        unit: backend.unit(),
        groups,
        baseline_secs,
        baseline_cpu,
        repair_secs,
        repair_cpu,
        live,
        extra_at_peak,
        extra_bytes,
        left_after,
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let groups = groups_wanted();
    let mut figures = Vec::new();

    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("repair-cost", Some(redis.url()));
    figures.push(measure(Backend::Redis(redis), setup, groups).await);

    if let Some(nodes) = std::env::var("SCYLLA_NODES").ok().filter(|n| !n.is_empty()) {
        let keyspace = unique("repair_cost").replace('-', "_");
        let mut setup = DaemonSetup::new("repair-cost-scylla", None);
        setup.scylla = Some((nodes.clone(), keyspace.clone()));
        let session = scylla::client::session_builder::SessionBuilder::new()
            .known_node(&nodes)
            .build()
            .await
            .expect("connect to Cassandra");
        let port = nodes
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(9042);
        let backend = Backend::Scylla {
            session: Box::new(session),
            keyspace,
            pid: listener_pid(port),
        };
        figures.push(measure(backend, setup, groups).await);
    }

    println!("| backend | groups | daemon writes them (baseline) | repair | repair / baseline | CPU (cores) during the repair | live | extra at the swap | left after |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in &figures {
        println!(
            "| {} | {} | {:.1} s ({:.0}/s; {}) | {:.1} s ({:.0}/s) | {:.2} | {} | {} {unit} | {} {unit}{} | {} {unit} |",
            f.backend,
            f.groups,
            f.baseline_secs,
            f.groups as f64 / f.baseline_secs,
            f.baseline_cpu,
            f.repair_secs,
            f.groups as f64 / f.repair_secs,
            f.repair_secs / f.baseline_secs,
            f.repair_cpu,
            f.live,
            f.extra_at_peak,
            f.extra_bytes.map_or(String::new(), |(live, extra)| format!(
                " (server memory {:.1} MB over {:.1} MB)",
                extra as f64 / 1e6,
                live as f64 / 1e6
            )),
            f.left_after,
            unit = f.unit,
        );
    }
}
