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
