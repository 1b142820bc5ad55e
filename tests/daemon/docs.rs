//! The documentation's shell blocks that need a broker, run as written against the test broker
//! and a redis-server of the test's own (`support::docs`; the blocks that need nothing more than
//! a store are run by `tests/cli/docs.rs`, the store-loss and records-lost steps inside their
//! scenarios in `store_lost.rs` and `records_lost.rs`).

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::kafka::{bootstrap, create_topic, http_get, produce, unique, wait_for, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::group_record;

/// docs/operations.md, "The daemon": `materializer run` on the example configuration (the
/// memory store), the broker, topic, group and port given by their environment variables, then
/// the `curl` of its metrics, then SIGTERM: the metrics name the product's series and the
/// daemon drains and exits 0, as the block's comments say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_block_runs_scrapes_and_stops_as_written() {
    let block = support::docs::block_with("docs/operations.md", "materializer run --config");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let lines = support::docs::commands(&block, &[("127.0.0.1:9898", &listen)]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let topic = unique("docs-run");
    create_topic(&topic, 1).await;
    produce(&topic, &[(0, group_record("u-docs", 1, "b"))]).await;

    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_materializer"))
        .parent()
        .expect("folder")
        .display()
        .to_string();
    let mut daemon = Command::new("bash")
        .args(["-c", &format!("exec {}", lines[0])])
        .current_dir(support::docs::ROOT)
        .env(
            "PATH",
            format!("{bin}:{}", std::env::var("PATH").unwrap_or_default()),
        )
        .env("MATERIALIZER_KAFKA_BROKERS", bootstrap())
        .env("MATERIALIZER_KAFKA_TOPIC", &topic)
        .env("MATERIALIZER_KAFKA_GROUP_ID", unique("docs-group"))
        .env("MATERIALIZER_HTTP_LISTEN", &listen)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    wait_for(
        "the record applied",
        Duration::from_secs(60),
        || {
            http_get(port, "/metrics").is_some_and(|(_, body)| {
                body.contains("materializer_records_total{outcome=\"applied\"} 1")
            })
        },
        String::new,
    );
    let out = support::docs::run_line(&lines[1]);
    assert!(out.status.success(), "{out:?}");
    let scraped = String::from_utf8_lossy(&out.stdout);
    assert!(
        scraped.lines().all(|l| l.contains("materializer_"))
            && scraped.contains("materializer_ready"),
        "{scraped}"
    );
    let signalled = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status()
        .expect("kill");
    assert!(signalled.success());
    let status = daemon.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "SIGTERM: drain, commit, exit 0");
}

/// The replay lines of docs/commands.md and docs/operations.md, with `F` the test's
/// configuration: u-17's mailboxes rebuilt from partition 3 of a four-partition topic, and the
/// dry run from a time; then the topic grown to 8 partitions with u-17's next records on
/// partition 7, and the order the growth block shows. Each exits 0 with its JSON summary, and
/// the rebuild holds the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_lines_run_as_written() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("docs-replay", Some(redis.url()));
    create_topic(&setup.topic, 4).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records: Vec<(i32, Vec<u8>)> = (1..=3)
        .map(|seq| (3, group_record("u-17", seq, "b")))
        .collect();
    produce(&setup.topic, &records).await;
    let config = setup.config_file(free_port());
    let config = format!("--config {}", config.to_str().expect("path"));
    let mut lines = support::docs::commands(
        &support::docs::block_with("docs/commands.md", "--from-time 2026-12-01T00:00:00Z"),
        &[("$M ", "materializer "), ("--config F", &config)],
    );
    lines.extend(support::docs::commands(
        &support::docs::block_with("docs/operations.md", "--reset-mailboxes"),
        &[("--config F", &config)],
    ));
    assert_eq!(lines.len(), 3, "{lines:?}");
    let run_each = |lines: &[String]| {
        for line in lines {
            let out = support::docs::run_line(line);
            assert!(
                out.status.success(),
                "{line}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let summary: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{line}: one JSON summary: {e}"));
            assert!(summary.get("error").is_none(), "{line}: {summary}");
        }
    };
    run_each(&lines);
    let store = support::reference::redis_store(&redis.url()).await;
    assert_eq!(
        support::reference::scan_seqs(&store, "u-17").await,
        vec![1, 2, 3]
    );

    super::partition_growth::grow(&setup.topic, 8).await;
    produce(&setup.topic, &[(7, group_record("u-17", 4, "b"))]).await;
    let lines = support::docs::commands(
        &support::docs::block_with("docs/commands.md", "--allow-other-partitions"),
        &[("$M ", "materializer "), ("--config F", &config)],
    );
    assert_eq!(lines.len(), 2, "{lines:?}");
    run_each(&lines);
    assert_eq!(
        support::reference::scan_seqs(&store, "u-17").await,
        vec![1, 2, 3, 4]
    );
}
