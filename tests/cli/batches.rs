//! SPEC 7.2 "Batches are invisible": however records are grouped into batches, every record gets
//! exactly its own outcome.
//!
//! - `apply`, on every backend and topology: inputs of MAX_BATCH − 1, MAX_BATCH, MAX_BATCH + 1
//!   and 10 × MAX_BATCH + 3 lines, and of RUN_MAX_GROUPS − 1, exactly, + 1 and 10 × + 3 lines
//!   for one mailbox (the longest run), each print exactly one outcome per delivery, and the store holds
//!   every group: applying the same input again answers `unchanged` for every line (a group that
//!   never landed would be inserted again, or met as `identity_missing`). Regression: `apply`
//!   took one line past each batch of 256 off its input and never admitted it (lines 257, 514,
//!   ... printed nothing, wrote nothing, and the exit status was 0).
//! - `replay` of ranges of the same sizes around the store batch, and the daemon with record
//!   counts around the intake batch (512 records): every record counted once, every group stored.

use crate::conformance;
use crate::support;

use std::path::Path;
use std::process::Output;
use std::time::{SystemTime, UNIX_EPOCH};

use conformance::redis::ClusterHarness;
use mailbox_materializer::ingest::runner::MAX_BATCH;
use mailbox_materializer::ingest::RUN_MAX_GROUPS;
use support::cli::{
    assert_one_outcome_per_line, numbered_dispatches, numbered_dispatches_for, run_materializer,
};
use support::redis_server::{Clock, Listen, RedisServer};

/// The sizes around the runner's batch limit.
fn sizes() -> [usize; 4] {
    [MAX_BATCH - 1, MAX_BATCH, MAX_BATCH + 1, 10 * MAX_BATCH + 3]
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// The sizes around the longest run, all for one mailbox.
fn run_sizes() -> [usize; 4] {
    [
        RUN_MAX_GROUPS - 1,
        RUN_MAX_GROUPS,
        RUN_MAX_GROUPS + 1,
        10 * RUN_MAX_GROUPS + 3,
    ]
}

/// Applies each size twice through `run` (the store's arguments are its business): first every
/// line `inserted`, then every line `unchanged`; over 37 users at the batch sizes, and over one
/// user at the run sizes.
fn check_every_size(tag: &str, created_ms: u64, run: impl Fn(&str) -> Output) {
    for n in sizes() {
        let input = numbered_dispatches(&format!("{tag}{n}"), n, created_ms);
        assert_one_outcome_per_line(&run(&input), n, "inserted");
        assert_one_outcome_per_line(&run(&input), n, "unchanged");
    }
    for n in run_sizes() {
        let input = numbered_dispatches_for(&format!("{tag}r{n}"), n, created_ms, 1);
        assert_one_outcome_per_line(&run(&input), n, "inserted");
        assert_one_outcome_per_line(&run(&input), n, "unchanged");
    }
}

#[test]
fn apply_prints_one_outcome_per_line_on_memory() {
    let dir = std::env::temp_dir().join(format!("mm-apply-batches-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let snapshot = dir.join("memory.json");
    let snapshot = snapshot.to_str().expect("utf-8 path");
    check_every_size("m", now_ms(), |input| {
        run_materializer(&["--memory-snapshot", snapshot, "apply", "-"], Some(input))
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn apply_prints_one_outcome_per_line_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    check_every_size("r", now_ms(), |input| {
        run_materializer(
            &["--store", "redis", "--redis-url", &url, "apply", "-"],
            Some(input),
        )
    });
}

/// The same on a 3-master Redis Cluster: each batch holds users of many slots on every master,
/// so it must be split by slot before it is sent (SPEC 7.2 "Redis Cluster").
#[test]
fn apply_prints_one_outcome_per_line_on_a_redis_cluster() {
    let start = now_ms() / 1000;
    let cluster = ClusterHarness::start(start);
    let urls = cluster.seed_urls();
    let dir = std::env::temp_dir().join(format!("mm-apply-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("cluster.toml");
    write_cluster_config(&config, &urls);
    let config = config.to_str().expect("utf-8 path").to_owned();
    check_every_size("c", start * 1000, |input| {
        run_materializer(&["--config", &config, "apply", "-"], Some(input))
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn write_cluster_config(path: &Path, urls: &[String]) {
    let nodes: Vec<String> = urls[1..].iter().map(|u| format!("\"{u}\"")).collect();
    let text = format!(
        "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\ncluster = true\ncluster_nodes = [{}]\n",
        urls[0],
        nodes.join(", ")
    );
    std::fs::write(path, text).expect("write config");
}

#[test]
fn apply_prints_one_outcome_per_line_on_scylla() {
    let nodes = conformance::scylla::nodes().join(",");
    let keyspace = format!("mm_batches_{}", std::process::id());
    check_every_size("s", now_ms(), |input| {
        run_materializer(
            &[
                "--store",
                "scylla",
                "--scylla-nodes",
                &nodes,
                "--scylla-keyspace",
                &keyspace,
                "apply",
            ],
            Some(input),
        )
    });
}

/// `replay` of a partition holding MAX_BATCH − 1, MAX_BATCH, MAX_BATCH + 1 and 10 × MAX_BATCH + 3
/// records into Redis: every record read once, every group inserted, and a second replay finds
/// every group stored (`unchanged`).
#[tokio::test(flavor = "multi_thread")]
async fn replay_counts_every_record_at_the_batch_boundaries() {
    use support::kafka::{create_topic, produce, DaemonSetup};
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    for n in sizes() {
        let setup = DaemonSetup::new(&format!("replaybatch{n}"), Some(server.url()));
        create_topic(&setup.topic, 1).await;
        let records: Vec<(i32, Vec<u8>)> = numbered_dispatches(&format!("rb{n}"), n, now_ms())
            .lines()
            .map(|l| (0, l.as_bytes().to_vec()))
            .collect();
        produce(&setup.topic, &records).await;
        let config = setup.config_file(support::redis_server::free_port());
        for outcome in ["inserted", "unchanged"] {
            let (out, summary) = support::cli::replay(
                &config,
                &[
                    "--partition",
                    "0",
                    "--from-offset",
                    "0",
                    "--progress",
                    "off",
                ],
            );
            assert_eq!(out.status.code(), Some(0), "{summary}");
            assert_eq!(summary["records"], n as u64, "{n}: {summary}");
            assert_eq!(summary["groups"][outcome], n as u64, "{n}: {summary}");
        }
    }
}

/// The daemon with record counts around its intake batch (512 records) and the store batch:
/// every record final once, every group stored (the memory store, scanned at the end).
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_applies_every_record_at_the_batch_boundaries() {
    use mailbox_materializer::daemon::intake::MAX_BATCH_RECORDS;
    use mailbox_materializer::model::{MailboxId, RetentionPolicy, ScanRequest, UserId};
    use mailbox_materializer::store::memory::MemoryStore;
    use mailbox_materializer::store::{MailboxStore, SystemClock};
    use std::sync::Arc;
    use support::in_process::InProcessDaemon;
    use support::kafka::{create_topic, produce, DaemonSetup};

    let setup = DaemonSetup::new("daemonbatch", None);
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let store = Arc::new(MemoryStore::new(
        RetentionPolicy::default(),
        Arc::new(SystemClock),
    ));
    let daemon = InProcessDaemon::spawn(&setup.config(), store.clone());
    let mut total = 0u64;
    let mut produced = Vec::new();
    for n in [
        MAX_BATCH_RECORDS - 1,
        MAX_BATCH_RECORDS,
        MAX_BATCH_RECORDS + 1,
        MAX_BATCH + 1,
        3 * MAX_BATCH_RECORDS + 3,
    ] {
        let tag = format!("db{n}");
        let records: Vec<(i32, Vec<u8>)> = numbered_dispatches(&tag, n, now_ms())
            .lines()
            .map(|l| (0, l.as_bytes().to_vec()))
            .collect();
        produce(&setup.topic, &records).await;
        total += n as u64;
        daemon
            .wait_final(total, std::time::Duration::from_secs(120))
            .await;
        produced.push((tag, n));
    }
    assert_eq!(daemon.progress.snapshot().final_records, total);
    for (tag, n) in produced {
        let mut stored = 0;
        for u in 0..37 {
            let mailbox = MailboxId::new(UserId::parse(&format!("{tag}-u{u}")).expect("user"), 1);
            let page = store
                .range_scan(
                    &mailbox,
                    ScanRequest {
                        after_seq: 0,
                        until_seq: None,
                        limit_groups: 10_000,
                    },
                )
                .await
                .expect("scan");
            stored += page.groups.len();
        }
        assert_eq!(stored, n, "{tag}: every group stored");
    }
    daemon.stop().await;
}
