//! The Grafana dashboard and the alerting rules speak only of metrics a live daemon exports: a
//! `materializer run` on a real redis-server consumes a generated stream from the real broker,
//! and every `materializer_*` name in `deploy/grafana/*.json` and `deploy/prometheus/rules.yaml`
//! must be in its scrape (which promtool must accept).

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use mailbox_materializer::daemon::metrics;
use mailbox_materializer::demo::{demo_shard, synthetic_workload, DEMO_SHARDS};
use support::kafka::{create_topic, produce, promtool_check, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Every `materializer_*` identifier in a text (PromQL, a rule file).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(found) = text[i..].find("materializer_") {
        let start = i + found;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// Every PromQL string of a dashboard: panel targets and template variable queries.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                        out.push(s.clone())
                    }
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

/// The metric names of a scrape: every sample's name, plus each histogram's family name (whose
/// samples are `_bucket`, `_sum` and `_count`).
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(family) = rest.strip_suffix(" histogram") {
                names.insert(family.to_owned());
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_rules_use_only_metrics_a_live_daemon_exports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard_path = root.join("deploy/grafana/mailbox-materializer.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard_path).expect("dashboard"))
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 20, "{queries:#?}");
    let dashboard_names: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/rules.yaml")).expect("rules");
    let rule_names = metric_names(&rules);

    // A live daemon on Redis (so offsets are committed) after a stream with replays,
    // conflicts and malformed records.
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("dashboard", Some(redis.url()));
    create_topic(&setup.topic, DEMO_SHARDS as i32).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records: Vec<(i32, Vec<u8>)> = synthetic_workload(20, 3, now_ms(), 5)
        .records
        .into_iter()
        .map(|r| (demo_shard(&r), r))
        .collect();
    // An upstream field the decoder does not know: ignored and counted.
    records.push((
        0,
        serde_json::json!({"dispatch_id": "extra", "group_id": "g", "committed_at": now_ms(),
            "trace_id": "abc",
            "deliveries": [{"user_id": "extra-user", "epoch": 1, "mailbox_seq": 1,
                "events": [{"event_ordinal": 0, "payload": {"k": 1}}]}]})
        .to_string()
        .into_bytes(),
    ));
    produce(&setup.topic, &records).await;
    let daemon = Daemon::start(&setup);
    let total = records.len() as f64;
    wait_for(
        "every record final and committed",
        Duration::from_secs(90),
        || {
            let m = daemon.metrics();
            m.sum(metrics::RECORDS_TOTAL) >= total
                && m.text.contains(metrics::COMMITTED_OFFSET)
                && m.text.contains(metrics::CONSUMER_LAG)
        },
        || daemon.log(),
    );
    let scrape = daemon.metrics().text;
    promtool_check(&scrape);
    let live = exported(&scrape);

    let mut missing = Vec::new();
    for (source, names) in [("dashboard", &dashboard_names), ("rules", &rule_names)] {
        for name in names {
            if !live.contains(name) {
                missing.push(format!("{source}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "names no live daemon exports: {missing:#?}\n--- scrape ---\n{scrape}"
    );
    // The dashboard covers every metric of SPEC 9 that the daemon exports.
    for name in [
        metrics::RECORDS_TOTAL,
        metrics::GROUPS_TOTAL,
        metrics::DLQ_TOTAL,
        metrics::PARTITION_BLOCKED,
        metrics::CONSUMER_LAG,
        metrics::STORE_ERRORS_TOTAL,
        metrics::PROMOTE_EXPIRED_BUCKETS_TOTAL,
        metrics::REPLAY_RECORDS_TOTAL,
        metrics::BUILD_INFO,
        metrics::LAST_RECORD_TIMESTAMP,
        metrics::UNKNOWN_FIELDS_TOTAL,
        metrics::READY,
    ] {
        assert!(dashboard_names.contains(name), "the dashboard lacks {name}");
    }
    assert!(dashboard_names.contains("materializer_apply_duration_seconds_bucket"));
    assert!(dashboard_names.contains("materializer_store_call_duration_seconds_bucket"));
    // One sample per store call, labelled with the backend and the operation.
    assert!(
        scrape.contains(
            "materializer_store_call_duration_seconds_count{backend=\"redis\",op=\"append\"}"
        ),
        "{scrape}"
    );
}

#[test]
fn the_name_scanner_reads_promql_and_prose() {
    let names = metric_names(
        "sum(rate(materializer_dlq_total{job=~\"$job\"}[5m])) / x_materializer_no \
         (materializer_apply_duration_seconds_bucket)",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "materializer_apply_duration_seconds_bucket",
            "materializer_dlq_total"
        ]
    );
}

/// `replay --listen` serves its metrics while it runs (a replay Job can be scraped; the
/// dashboard's replay panel reads `materializer_replay_records_total`): a replay held by a
/// frozen Redis is scraped, promtool accepts the scrape, and once Redis goes on the replay ends
/// with its summary.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_replay_serves_its_metrics_when_asked_to_listen() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("replay-listen", Some(server.url()));
    create_topic(&setup.topic, 1).await;
    let records: Vec<(i32, Vec<u8>)> = (1..=20)
        .map(|seq| (0, support::reference::group_record("gina", seq, "g")))
        .collect();
    produce(&setup.topic, &records).await;
    let config = setup.config_file(support::redis_server::free_port());
    let port = support::redis_server::free_port();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &server.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    signal("-STOP");
    let replay = support::cli::replay_command(
        &config,
        &[
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--progress",
            "off",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start replay");
    let scrape = std::cell::RefCell::new(String::new());
    wait_for(
        "the replay's /metrics",
        Duration::from_secs(20),
        || {
            let text = support::kafka::http_get(port, "/metrics").map_or(String::new(), |r| r.1);
            let found = text.contains("materializer_replay_records_total{outcome=\"applied\"}");
            *scrape.borrow_mut() = text;
            found
        },
        || scrape.borrow().clone(),
    );
    promtool_check(&scrape.into_inner());
    signal("-CONT");
    let out = replay.wait_with_output().expect("replay ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    assert_eq!(summary["outcomes"]["applied"], 20, "{summary}");
}
