//! The documentation's shell blocks, as the tests that run them read them: the `sh` fences of a
//! document, the block holding a given line, the outputs a block shows (`# {...}` or `# text`
//! after a command), and running a block's lines with the test's own addresses put in.

use std::path::Path;
use std::process::{Command, Output};

/// The project's root (where the documents are).
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The `sh` blocks of `text`, each with the line it starts on.
pub fn sh_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        if line.trim() == "```sh" {
            let block: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| l.trim() != "```")
                .collect();
            blocks.push((number + 1, block.join("\n")));
        }
    }
    blocks
}

/// The one `sh` block of `doc` (a path from the root) that contains `needle`.
pub fn block_with(doc: &str, needle: &str) -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join(doc)).expect("document");
    let mut found: Vec<String> = sh_blocks(&text)
        .into_iter()
        .map(|(_, b)| b)
        .filter(|b| b.contains(needle))
        .collect();
    assert_eq!(found.len(), 1, "{doc}: one sh block holds {needle:?}");
    found.remove(0)
}

/// The commands of a block, without its comment lines and shown outputs, each trailing comment
/// kept (the shell ignores it), `substitutions` applied in order.
pub fn commands(block: &str, substitutions: &[(&str, &str)]) -> Vec<String> {
    block
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            substitutions
                .iter()
                .fold(l.to_owned(), |line, (from, to)| line.replace(from, to))
        })
        .collect()
}

/// The outputs a block shows: the text of each comment line that follows a command directly
/// (`# {"backend":...}`, `# accepted: ...`), without `#`.
pub fn shown(block: &str) -> Vec<String> {
    let mut shown = Vec::new();
    let mut after_command = false;
    for line in block.lines() {
        let trimmed = line.trim_start();
        if let Some(text) = trimmed.strip_prefix("# ") {
            if after_command {
                shown.push(text.to_owned());
            }
        } else {
            after_command = !trimmed.is_empty();
        }
    }
    shown
}

/// Runs one command line with bash, `materializer` being the binary under test.
pub fn run_line(line: &str) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_materializer"))
        .parent()
        .expect("the binary's folder")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", line])
        .current_dir(ROOT)
        .env("PATH", path)
        .output()
        .expect("bash")
}

/// Blocks pasted in order into one shell, as a newcomer would, with `$M` the binary under test:
/// the lines `skip` names left out (what the test does itself: the build, its own servers),
/// `substitutions` applied, and the JSON outputs the blocks show (`# {...}` without `...`) kept
/// to check against what was printed.
pub struct Walk {
    pub script: String,
    pub shown: Vec<serde_json::Value>,
}

impl Walk {
    pub fn new(
        blocks: &[String],
        skip: impl Fn(&str) -> bool,
        substitutions: &[(&str, &str)],
    ) -> Self {
        let mut script = String::from("set -euo pipefail\n");
        let mut shown = Vec::new();
        for line in blocks.join("\n").lines() {
            let trimmed = line.trim();
            if skip(trimmed) {
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix("# {") {
                if !rest.contains("...") {
                    shown.push(
                        serde_json::from_str(&format!("{{{rest}")).expect("a shown output is JSON"),
                    );
                }
                continue;
            }
            let line = substitutions
                .iter()
                .fold(line.to_owned(), |line, (from, to)| line.replace(from, to));
            script.push_str(&line);
            script.push('\n');
        }
        Self { script, shown }
    }

    /// Runs the script from the project's root; it must succeed and print every shown output.
    /// Answers its stdout.
    pub fn run(&self, what: &str) -> String {
        let out = Command::new("bash")
            .arg("-c")
            .arg(&self.script)
            .current_dir(ROOT)
            .env("M", env!("CARGO_BIN_EXE_materializer"))
            .env_remove("MATERIALIZER_CONFIG")
            .output()
            .expect("bash");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}\n{stdout}\n{}",
            self.script,
            String::from_utf8_lossy(&out.stderr)
        );
        for shown in &self.shown {
            assert!(
                stdout
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .any(|printed| &printed == shown),
                "{what} shows {shown}, the commands printed:\n{stdout}"
            );
        }
        stdout
    }
}
