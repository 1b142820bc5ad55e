//! Running the `materializer` binary as a user does: arguments, standard input, JSON lines out.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Runs the binary with `args`, feeding `stdin` when given, and waits for it.
pub fn run_materializer(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("the binary finishes")
}

/// Every stdout line of a run, parsed as JSON (a line that is not JSON fails the test).
pub fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// `materializer replay --config <config> <args>`, not started yet.
pub fn replay_command(config: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_materializer"));
    command.args(["replay", "--config"]).arg(config).args(args);
    command
}

/// Runs `replay` to its end: its output and the one JSON summary it prints on stdout (anything
/// else there fails the test).
pub fn replay(config: &Path, args: &[&str]) -> (Output, Value) {
    let out = replay_command(config, args).output().expect("run replay");
    let summary = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "replay prints one JSON summary ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, summary)
}

/// `replay --reset-mailboxes` of `user` from the start of `partition`, as an operator repairs
/// one mailbox while the daemon runs: it must succeed; its JSON summary.
pub fn repair(config: &Path, partition: i32, user: &str) -> Value {
    let partition = partition.to_string();
    let (out, summary) = replay(
        config,
        &[
            "--partition",
            &partition,
            "--from-offset",
            "0",
            "--user",
            user,
            "--reset-mailboxes",
            "--progress",
            "off",
        ],
    );
    assert!(
        out.status.success(),
        "replay: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    summary
}

/// `n` dispatch records, one a line, for `apply` at a batch boundary: each record delivers one
/// group of mailbox seq = its line number to one of 37 users (so lanes hold several deliveries
/// in order), all created at `created_ms`. Users are named after `tag` to keep runs apart.
pub fn numbered_dispatches(tag: &str, n: usize, created_ms: u64) -> String {
    numbered_dispatches_for(tag, n, created_ms, 37)
}

/// [`numbered_dispatches`] over `users` users (line `i` to user `i % users`): with one user,
/// every line waits in the same lane and the store sees runs as long as the runs allow.
pub fn numbered_dispatches_for(tag: &str, n: usize, created_ms: u64, users: usize) -> String {
    let users = users.max(1);
    let mut input = String::new();
    for line in 1..=n {
        let record = serde_json::json!({
            "dispatch_id": format!("{tag}-{line}"),
            "group_id": "g",
            "committed_at": created_ms,
            "deliveries": [{"user_id": format!("{tag}-u{}", line % users), "epoch": 1,
                "mailbox_seq": line, "events": [{"event_ordinal": 0, "payload": {"line": line}}]}],
        });
        input.push_str(&record.to_string());
        input.push('\n');
    }
    input
}

/// Asserts that an `apply` of [`numbered_dispatches`] printed exactly one outcome per input
/// line, `outcome` each time, every line number once (SPEC 7.2 "Batches are invisible").
pub fn assert_one_outcome_per_line(out: &Output, n: usize, outcome: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(out);
    let mut seen = vec![false; n + 1];
    for line in &lines {
        let number = line["line"].as_u64().expect("a line number") as usize;
        assert!(number >= 1 && number <= n, "line {number} out of 1..={n}");
        assert!(!seen[number], "line {number} printed twice");
        seen[number] = true;
        assert_eq!(line["outcome"], outcome, "line {number}: {line}");
        assert_eq!(line["mailbox_seq"].as_u64(), Some(number as u64));
    }
    let missing: Vec<usize> = (1..=n).filter(|i| !seen[*i]).collect();
    assert!(
        missing.is_empty(),
        "{} of {n} lines got no outcome, first {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// One `materializer top --once --json` snapshot of `addresses`, and its plain-text twin (what a
/// person would read), printed to stderr under `label` so a test's output shows it.
pub fn top_once(label: &str, addresses: &[String]) -> Value {
    let mut args = vec!["top", "--once", "--interval-ms", "500", "--output", "text"];
    for address in addresses {
        args.extend(["--daemon", address.as_str()]);
    }
    let text = run_materializer(&args, None);
    eprintln!("top, {label}:\n{}", String::from_utf8_lossy(&text.stdout));
    args[5] = "json";
    let out = run_materializer(&args, None);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "top --once --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
