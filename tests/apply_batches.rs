//! SPEC 7.2 "Batches are invisible" for `apply`, on every backend and topology: inputs of
//! MAX_BATCH − 1, MAX_BATCH, MAX_BATCH + 1 and 10 × MAX_BATCH + 3 lines each print exactly one
//! outcome per delivery, and the store holds every group: applying the same input again answers
//! `unchanged` for every line (a group that never landed would be inserted again, or met as
//! `identity_missing`).
//!
//! Regression: `apply` took one line past each batch of 256 off its input and never admitted it
//! (lines 257, 514, ... printed nothing, wrote nothing, and the exit status was 0).

mod conformance;
mod support;

use std::path::Path;
use std::process::Output;
use std::time::{SystemTime, UNIX_EPOCH};

use conformance::redis::ClusterHarness;
use mailbox_materializer::ingest::runner::MAX_BATCH;
use support::cli::{assert_one_outcome_per_line, numbered_dispatches, run_materializer};
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

/// Applies each size twice through `run` (the store's arguments are its business): first every
/// line `inserted`, then every line `unchanged`.
fn check_every_size(tag: &str, created_ms: u64, run: impl Fn(&str) -> Output) {
    for n in sizes() {
        let input = numbered_dispatches(&format!("{tag}{n}"), n, created_ms);
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
