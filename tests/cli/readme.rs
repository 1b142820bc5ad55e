//! The README's "Five minutes on Redis" walk, run as a newcomer pastes it: every `sh` block of
//! the section in order, against a redis-server of the test's own and the binary under test,
//! and each output line the README shows (a `# {...}` comment without `...`) printed for real.
//! The build and the server start are the test's (`cargo build`, a throwaway server); the
//! daemon's block needs a broker and is run by the daemon tests, not here.

use crate::support;

use std::process::Command;

use support::redis_server::{free_port, Clock, Listen, RedisServer};

/// The `sh` blocks of the README section that starts with `heading`.
fn section_blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?} section"));
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sh" {
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

#[test]
fn the_readmes_five_minutes_on_redis_run_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let blocks = section_blocks(&readme, "## Five minutes on Redis");
    assert!(blocks.len() >= 4, "{blocks:#?}");
    let server = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("mm-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut script = String::from("set -euo pipefail\n");
    let mut expected = Vec::new();
    for block in &blocks {
        for line in block.lines() {
            let trimmed = line.trim();
            // The test builds the binary and runs its own server; the daemon needs a broker.
            if trimmed.starts_with("cargo build")
                || trimmed.starts_with("M=")
                || trimmed.starts_with("redis-server ")
                || trimmed.contains(" run --config ")
            {
                continue;
            }
            if let Some(shown) = trimmed.strip_prefix("# {") {
                if !shown.contains("...") {
                    expected.push(format!("{{{shown}"));
                }
                continue;
            }
            script.push_str(&line.replace("redis://127.0.0.1:6379", &url).replace(
                "/tmp/records.jsonl",
                &dir.join("records.jsonl").to_string_lossy(),
            ));
            script.push('\n');
        }
    }
    assert!(
        expected.len() >= 2,
        "the README shows outputs: {expected:?}"
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("M", env!("CARGO_BIN_EXE_materializer"))
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in &expected {
        let shown: serde_json::Value = serde_json::from_str(line).expect("the README's JSON");
        assert!(
            stdout
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|printed| printed == shown),
            "the README shows {line}, the command printed:\n{stdout}"
        );
    }
    // The walk's claim: the same file again answers `unchanged`.
    let again = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--store", "redis", "--redis-url", &url, "apply"])
        .arg(dir.join("records.jsonl"))
        .output()
        .expect("apply again");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("\"outcome\":\"unchanged\""),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
