//! SPEC 3: unknown fields of a known record type are ignored by default (an upstream producer
//! adding `trace_id` must not send the stream to the dead-letter topic); `ingest.strict_fields =
//! true` makes them malformed (`unknown_field`).

use crate::support;

use std::time::Duration;

use support::cli::{json_lines, run_materializer};
use support::kafka::{create_topic, produce, read_all, wait_for, Daemon, DaemonSetup};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A valid record with an unknown field at the top level, in the delivery and in an event.
fn traced_record(user: &str, seq: u64) -> String {
    format!(
        r#"{{"trace_id":"t-{seq}","dispatch_id":"d-{seq}","group_id":"g","committed_at":{},"deliveries":[{{"user_id":"{user}","region":"eu","epoch":1,"mailbox_seq":{seq},"events":[{{"event_ordinal":0,"source":"app","payload":{{"n":{seq}}}}}]}}]}}"#,
        now_ms()
    )
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(support::kafka::unique(name));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[test]
fn apply_ignores_unknown_fields_by_default() {
    let input = format!(
        "{}\n{}\n",
        traced_record("u-1", 1),
        r#"{"type":"truncate_before","user_id":"u-1","epoch":1,"before_seq":1,"reason":"gdpr"}"#
    );
    let out = run_materializer(&["apply"], Some(&input));
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&out);
    assert_eq!(lines[0]["outcome"], "inserted", "{lines:?}");
    assert_eq!(lines[1]["outcome"], "truncated", "{lines:?}");
}

#[test]
fn strict_fields_make_apply_report_the_unknown_field() {
    let dir = scratch("strict-apply");
    let config = dir.join("strict.toml");
    std::fs::write(&config, "[ingest]\nstrict_fields = true\n").expect("config");
    let out = run_materializer(
        &["apply", "--config", config.to_str().unwrap()],
        Some(&traced_record("u-1", 1)),
    );
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&out);
    assert_eq!(lines[0]["outcome"], "malformed");
    assert_eq!(lines[0]["error"]["kind"], "unknown_field");
    assert_eq!(lines[0]["error"]["field"], "trace_id", "{lines:?}");
    // The environment turns it on as well (a Helm value, a Kubernetes env var).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_materializer"))
        .arg("check-config")
        .env("MATERIALIZER_INGEST_STRICT_FIELDS", "true")
        .output()
        .expect("check-config");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown["ingest"]["strict_fields"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_applies_records_carrying_unknown_fields() {
    let setup = DaemonSetup::new("unknown-fields", None);
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records: Vec<(i32, Vec<u8>)> = (1..=5)
        .map(|seq| (0, traced_record("traced-user", seq).into_bytes()))
        .collect();
    produce(&setup.topic, &records).await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "every traced record applied",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_records_total{outcome=\"applied\"}")
                >= 5.0
        },
        || format!("{}\n{}", daemon.metrics().text, daemon.log()),
    );
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_groups_total{outcome=\"inserted\"}"),
        5.0
    );
    assert_eq!(metrics.sum("materializer_dlq_total"), 0.0);
    assert!(read_all(&setup.dlq_topic).is_empty());
}
