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
    let records = dir.join("records.jsonl");
    let walk = support::docs::Walk::new(
        &blocks,
        // The test builds the binary and runs its own server; the daemon needs a broker.
        |line| {
            line.starts_with("cargo build")
                || line.starts_with("M=")
                || line.starts_with("redis-server ")
                || line.contains(" run --config ")
        },
        &[
            ("redis://127.0.0.1:6379", &url),
            ("/tmp/records.jsonl", &records.to_string_lossy()),
        ],
    );
    assert!(
        walk.shown.len() >= 2,
        "the README shows outputs: {:?}",
        walk.shown
    );
    walk.run("the README");
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
