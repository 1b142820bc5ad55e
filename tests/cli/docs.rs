//! The shell blocks of the documentation, held to the binary (SPEC 8.2's one contract, as a
//! newcomer meets it on paper).
//!
//! - Every `sh` block of `README.md`, `docs/*.md` and `deploy/README.md` is read, and every
//!   invocation of the binary in it (`materializer ...` or `$M ...`) must parse by today's
//!   command-line definition: a renamed or removed flag fails here, not in a reader's terminal.
//!   A synopsis with `[optional]` parts is a `text` block, not an `sh` one.
//! - The blocks that run on one machine are executed as written, each output line shown as
//!   `# {...}` printed for real: the README's walk (`readme.rs`), `docs/commands.md`'s store
//!   blocks on memory, on a redis-server of the test's own and on the test CQL server
//!   (`SCYLLA_NODES`) (here); with the test broker, `docs/operations.md`'s daemon block and the
//!   replay lines of both documents (`tests/daemon/docs.rs`), the store-loss steps and the
//!   records-lost `curl` inside their scenarios (`tests/daemon/store_lost.rs`,
//!   `records_lost.rs`).
//! - The `kubectl` and `helm` blocks need a Kubernetes cluster: their `helm install` commands are
//!   rendered and validated by `scripts/check-deploy`, and `top --daemon` on the release's
//!   headless Service name is parsed here.

use crate::conformance;
use crate::support;

use std::path::{Path, PathBuf};

use support::redis_server::{free_port, Clock, Listen, RedisServer};

use support::docs::{sh_blocks, ROOT};

/// The documents whose shell blocks a reader pastes.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        Path::new(ROOT).join("README.md"),
        Path::new(ROOT).join("deploy/README.md"),
    ];
    let mut more: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// Splits one shell line into words the way the shell would for these blocks: quotes, and a
/// word starting with `#` ends the line. Operators (`|`, `;`, `&&`, `>`) are words of their own
/// when written apart, as they are in the docs.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '#') if !in_word => break,
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Every invocation of the binary in `block`: the arguments after `materializer` or `$M` up to
/// the end of the command.
fn invocations(block: &str) -> Vec<Vec<String>> {
    let joined = block.replace("\\\n", " ");
    let mut found = Vec::new();
    for line in joined.lines() {
        let words = words(line);
        let mut rest = words.iter();
        while let Some(word) = rest.next() {
            let is_binary = !word.contains('=')
                && (word == "materializer" || word == "$M" || word.ends_with("/materializer"));
            if is_binary {
                let args: Vec<String> = rest
                    .by_ref()
                    .take_while(|w| !matches!(w.as_str(), "|" | ";" | "&&" | "||" | ">" | "2>"))
                    .cloned()
                    .collect();
                found.push(args);
            }
        }
    }
    found
}

#[test]
fn every_documented_invocation_parses_with_todays_flags() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("document");
        for (line, block) in sh_blocks(&text) {
            for args in invocations(&block) {
                checked += 1;
                let mut argv = vec!["materializer".to_owned()];
                argv.extend(args.iter().cloned());
                if let Err(e) = mailbox_materializer::cli::check_arguments(&argv) {
                    let first = e.lines().next().unwrap_or_default().to_owned();
                    failures.push(format!(
                        "{}:{line}: materializer {}\n    {first}",
                        doc.strip_prefix(ROOT).unwrap_or(&doc).display(),
                        args.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 20,
        "the docs show the binary's commands: only {checked} found"
    );
    assert!(
        failures.is_empty(),
        "documented invocations that no longer parse:\n{}",
        failures.join("\n")
    );
}

/// The words tokenizer and the invocation finder, on the shapes the docs use.
#[test]
fn invocations_are_found_as_the_shell_would_read_them() {
    let block = "M=target/release/materializer\n\
                 $M --store redis patrol --rate 200      # compact cold mailboxes\n\
                 kubectl create secret generic x \\\n  --from-literal=a='b c'\n\
                 curl -s 127.0.0.1:9898/metrics | grep materializer_\n\
                 materializer replay --config F --partition 3 | jq .";
    assert_eq!(
        invocations(block),
        vec![
            vec!["--store", "redis", "patrol", "--rate", "200"],
            vec!["replay", "--config", "F", "--partition", "3"],
        ]
    );
    assert_eq!(words("a 'b c' \"d\" # e"), vec!["a", "b c", "d"]);
}

/// The first `sh` block after `heading` in `text`.
fn block_after(text: &str, heading: &str) -> String {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} section"));
    sh_blocks(&text[start..])
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no sh block after {heading:?}"))
        .1
}

/// `docs/commands.md`'s store blocks, pasted in order into one shell as a newcomer would: on
/// memory, then on Redis, then on Scylla, each shown output line printed. The build and the
/// servers are the test's; the addresses are the test servers'; the keyspace is the test's own.
#[test]
fn the_store_blocks_of_the_commands_reference_run_as_written() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/commands.md")).expect("doc");
    let blocks = [
        block_after(&text, "### On memory"),
        block_after(&text, "### On Redis"),
        block_after(&text, "### On Scylla"),
    ];
    let server = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    let nodes = conformance::scylla::nodes().join(",");
    let keyspace = format!("mm_docs_{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("mm-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (url, keyspace_flag) = (server.url(), format!("--scylla-keyspace {keyspace}"));
    let (records, snapshot) = (dir.join("records.jsonl"), dir.join("mm.json"));
    let walk = support::docs::Walk::new(
        &blocks,
        |line| {
            line.starts_with("cargo build")
                || line.starts_with("M=")
                || line.contains("PASSWORD=...")
        },
        &[
            ("redis://127.0.0.1:6379", &url),
            ("10.0.0.5:9042,10.0.0.6:9042", &nodes),
            ("--scylla-keyspace mailbox", &keyspace_flag),
            ("/tmp/records.jsonl", &records.to_string_lossy()),
            ("/tmp/mm.json", &snapshot.to_string_lossy()),
        ],
    );
    assert!(!walk.shown.is_empty(), "the blocks show outputs");
    let stdout = walk.run("docs/commands.md");
    // Each store holds what the blocks wrote: each one's scan page printed the group.
    let pages = stdout
        .lines()
        .filter(|l| l.starts_with("{\"groups\":") && l.contains("\"mailbox_seq\":1042"))
        .count();
    assert_eq!(
        pages, 3,
        "memory, Redis and Scylla each scanned seq 1042:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
