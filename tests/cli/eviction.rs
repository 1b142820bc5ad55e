//! SPEC 5 and 4.4 as amended, against real redis-servers: a Redis that evicts keys is refused by
//! `check-config --connect` (the FAIL line names the policy), by every command that writes
//! (nothing written) and by the daemon at start, on a standalone server and on a cluster where
//! one master of three evicts; `store.redis.allow_eviction = true` runs anyway with a warning; a
//! policy changed under a running daemon turns it not ready; and with eviction allowed under
//! memory pressure, every scan answers what the memory reference holds up to the coverage it
//! claims, or an error — never a page that claims coverage it did not read.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::cli::run_materializer;
use support::kafka::{create_topic, http_get, unique, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisCluster, RedisServer};
use support::reference::{now_ms, redis_store, scan_from_start};

/// A config file for a Redis store at `url` (one seed of a cluster when `cluster` names more).
fn config(name: &str, url: &str, cluster: &[String], allow_eviction: bool) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique(name));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("materializer.toml");
    let nodes = cluster
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        &path,
        format!(
            "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{url}\"\ncluster = {}\ncluster_nodes = [{nodes}]\n\
             allow_eviction = {allow_eviction}\nconnect_timeout_ms = 2000\ncommand_timeout_ms = 2000\n\
             [kafka]\nbrokers = \"{}\"\ntopic = \"t\"\ndlq_topic = \"t.dlq\"\n",
            !cluster.is_empty(),
            support::kafka::bootstrap(),
        ),
    )
    .expect("write config");
    path
}

fn arg(path: &std::path::Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// check-config's `store eviction (redis)` line.
fn eviction_line(config: &std::path::Path) -> (Option<i32>, String) {
    let out = run_materializer(
        &[
            "check-config",
            "--connect",
            "--output",
            "text",
            "--config",
            arg(config),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("store eviction (redis)"))
        .unwrap_or_else(|| panic!("no eviction line: {text}"))
        .to_owned();
    (out.status.code(), line)
}

fn one_record(user: &str, seq: u64) -> String {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": "x".repeat(100)}}]}]
    })
    .to_string()
}

fn apply(config: &std::path::Path, input: &str) -> Output {
    run_materializer(&["apply", "--config", arg(config)], Some(input))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evicting_redis_is_refused_by_check_config_writers_and_the_daemon() {
    let port = free_port();
    let redis = RedisServer::start(
        Clock::Real,
        Listen::Tcp(port),
        &["--maxmemory-policy", "allkeys-lru"],
    );
    let url = format!("redis://127.0.0.1:{port}");
    let refused = config("evict-refused", &url, &[], false);

    let (code, line) = eviction_line(&refused);
    assert_eq!(code, Some(1), "{line}");
    assert!(line.starts_with("FAIL"), "{line}");
    assert!(
        line.contains("maxmemory-policy allkeys-lru on redis://127.0.0.1"),
        "{line}"
    );

    let out = apply(&refused, &one_record("u", 1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    // No outcome printed: the one line is the refusal (SPEC 8.2's error object).
    let error: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(error["error"]["kind"], "refused", "{error}");
    assert!(
        error["error"]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("allkeys-lru"),
        "{error}"
    );
    assert_eq!(redis.raw("DBSIZE").trim(), ":0", "nothing written");

    // The daemon refuses to start (exit 1) and says why; it never reaches Kafka.
    let log = refused.with_extension("log");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["run", "--config", arg(&refused)])
        .env(
            "MATERIALIZER_HTTP_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the daemon");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = daemon.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon did not refuse");
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("refused to start") && text.contains("maxmemory-policy allkeys-lru"),
        "{text}"
    );
    assert_eq!(redis.raw("DBSIZE").trim(), ":0", "nothing written");

    // allow_eviction = true: a warning, and the writes go through.
    let allowed = config("evict-allowed", &url, &[], true);
    // (The other checks' verdicts do not matter here: the config names no real topic.)
    let (_, line) = eviction_line(&allowed);
    assert!(
        line.starts_with("ok ") && line.contains("WARNING") && line.contains("allkeys-lru"),
        "{line}"
    );
    let out = apply(&allowed, &one_record("u", 1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("warning:") && stderr.contains("allkeys-lru"),
        "{stderr}"
    );

    // Fixed at run time: no warning, no refusal.
    redis.raw("CONFIG SET maxmemory-policy noeviction");
    let (_, line) = eviction_line(&refused);
    assert!(
        line.starts_with("ok ") && line.contains("noeviction on 1 master(s)"),
        "{line}"
    );
}

/// One master of three evicting is enough: the FAIL line names that master.
#[tokio::test(flavor = "multi_thread")]
async fn one_evicting_master_of_a_cluster_is_refused() {
    let cluster = RedisCluster::start(Clock::Real);
    let urls = cluster.seed_urls();
    let config = config("evict-cluster", &urls[0], &urls[1..], false);
    let (_, line) = eviction_line(&config);
    assert!(
        line.starts_with("ok ") && line.contains("noeviction on 3 master(s)"),
        "{line}"
    );

    let evicting = &cluster.nodes[1];
    evicting.raw("CONFIG SET maxmemory-policy volatile-lru");
    let address = format!("127.0.0.1:{}", evicting.port().expect("tcp"));
    let (code, line) = eviction_line(&config);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.contains(&format!("maxmemory-policy volatile-lru on {address}")),
        "{line}"
    );
    let out = apply(&config, &one_record("u", 1));
    assert_eq!(out.status.code(), Some(1));
}

/// A policy changed under a running daemon turns it not ready, naming the policy; set back, the
/// daemon is ready again by itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_changed_at_run_time_turns_the_daemon_not_ready() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("evict-runtime", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start(&setup);
    let readyz = || http_get(daemon.http_port, "/readyz").unwrap_or((0, String::new()));
    wait_for(
        "ready",
        Duration::from_secs(60),
        || readyz().0 == 200,
        || format!("{:?}\n{}", readyz(), daemon.log()),
    );
    assert_eq!(daemon.metrics().get("materializer_store_evicting"), 0.0);
    redis.raw("CONFIG SET maxmemory-policy allkeys-lfu");
    wait_for(
        "not ready, naming the policy",
        Duration::from_secs(40),
        || {
            let (status, body) = readyz();
            status == 503
                && body.contains("store policy: Redis evicts keys (maxmemory-policy allkeys-lfu")
        },
        || format!("{:?}\n{}", readyz(), daemon.log()),
    );
    assert_eq!(daemon.metrics().get("materializer_store_evicting"), 1.0);
    assert!(
        daemon.log().contains("not ready: Redis evicts keys"),
        "{}",
        daemon.log()
    );
    redis.raw("CONFIG SET maxmemory-policy noeviction");
    wait_for(
        "ready again",
        Duration::from_secs(40),
        || readyz().0 == 200,
        || format!("{:?}\n{}", readyz(), daemon.log()),
    );
    assert_eq!(daemon.metrics().get("materializer_store_evicting"), 0.0);
}

/// An evicting run: 300 users x 40 seqs into a Redis of 3 MB that evicts (allowed), under
/// `volatile-lru` (only keys with an expiry go: day buckets and identity indexes, never the
/// epoch, meta or day set) and under `allkeys-lru` (any key).
///
/// Under `volatile-lru` every loss is detectable, so every scan either fails closed or answers
/// exactly the reference's groups up to the coverage it claims (`up_to`). Under `allkeys-lru` a
/// user can lose every key, the epoch key included, which no store can tell from a user never
/// written: its later seqs start a new mailbox. There every page is still whole within what it
/// claims — no hole, no empty page with an `up_to` over groups it did not read.
#[tokio::test(flavor = "multi_thread")]
async fn with_eviction_allowed_no_scan_claims_coverage_it_did_not_read() {
    for policy in ["volatile-lru", "allkeys-lru"] {
        eviction_run(policy).await;
    }
}

async fn eviction_run(policy: &str) {
    let port = free_port();
    let redis = RedisServer::start(
        Clock::Real,
        Listen::Tcp(port),
        &["--maxmemory", "3mb", "--maxmemory-policy", policy],
    );
    let url = format!("redis://127.0.0.1:{port}");
    let config = config("evict-run", &url, &[], true);
    let (users, seqs) = (300, 40);
    let mut input = String::new();
    for seq in 1..=seqs {
        for user in 0..users {
            input.push_str(&one_record(&format!("ev-{user}"), seq));
            input.push('\n');
        }
    }
    // 12,000 lines answer more than a pipe holds: the input comes from a file.
    let file = config.with_extension("jsonl");
    std::fs::write(&file, &input).expect("write input");
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["apply", "--config", arg(&config)])
        .stdin(std::fs::File::open(&file).expect("input"))
        .output()
        .expect("run apply");
    assert!(
        matches!(out.status.code(), Some(0) | Some(3)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for line in support::cli::json_lines(&out) {
        let outcome = line["outcome"].as_str().unwrap_or("error").to_owned();
        *outcomes.entry(outcome).or_default() += 1;
    }
    let evicted = redis
        .raw("INFO stats")
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:").map(|n| n.trim().to_owned()))
        .unwrap_or_default();
    assert_ne!(
        evicted, "0",
        "{policy}: the run must evict to test anything"
    );

    let store = redis_store(&url).await;
    let (mut failed, mut whole, mut reborn) = (0, 0, 0);
    for user in 0..users {
        let Ok(page) = scan_from_start(&store, &format!("ev-{user}")).await else {
            failed += 1;
            continue;
        };
        let read: Vec<u64> = page.groups.iter().map(|g| g.mailbox_seq).collect();
        let first = read.first().copied().unwrap_or(1);
        let claimed: Vec<u64> = (first..=page.up_to.min(seqs)).collect();
        assert_eq!(
            read, claimed,
            "{policy}, ev-{user}: a page claiming up_to {} must hold every group up to it",
            page.up_to
        );
        if first > 1 {
            assert_eq!(
                policy, "allkeys-lru",
                "ev-{user}: only a user that lost every key may start over"
            );
            reborn += 1;
        } else {
            whole += 1;
        }
        for group in &page.groups {
            assert_eq!(group.events.len(), 1, "ev-{user} seq {}", group.mailbox_seq);
            assert_eq!(
                group.events[0].payload.to_value(),
                serde_json::json!({"body": "x".repeat(100)})
            );
        }
    }
    eprintln!(
        "{policy}: apply outcomes {outcomes:?}, evicted keys {evicted}; scans: {whole} whole from seq 1, {reborn} started over after losing every key, {failed} failed closed"
    );
}
