//! SPEC 8.2: one operator contract for every command. Each subcommand run in its failure modes
//! (a bad flag, an unreachable store or broker, a corrupt mailbox, a signal) ends with the one
//! exit table (0 done, 1 a finding, 2 retry, 3 corrupt, 4 interrupted, 64 usage) and, off a
//! terminal (JSON, the default there), with one `{"error": {"kind", "detail"}}` object on stdout.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::cli::run_materializer;
use support::redis_server::{free_port, Clock, Listen, RedisServer};

/// Every command path of the binary, each with the arguments it needs to get past parsing.
const COMMANDS: [&[&str]; 22] = [
    &["check-config"],
    &["apply"],
    &["scan", "--user", "u", "--epoch", "1"],
    &["inspect", "--user", "u", "--epoch", "1"],
    &["truncate", "--user", "u", "--epoch", "1", "--before", "2"],
    &["promote", "--user", "u", "--epoch", "1"],
    &["patrol"],
    &["demo"],
    &["run"],
    &["replay", "--partition", "0", "--from-offset", "0"],
    &["dlq", "list"],
    &["dlq", "show", "--dlq-partition", "0", "--offset", "0"],
    &["dlq", "redrive"],
    &["schema", "check"],
    &["schema", "apply"],
    &["explain", "--user", "u"],
    &["tap"],
    &["top"],
    &["verify", "--partition", "0", "--from-offset", "0"],
    &["accept-store-loss"],
    &["completions", "bash"],
    &["man", "--dir", "target/man-contract"],
];

/// The one JSON object a failed command printed on stdout, with its kind checked.
fn error_object(out: &Output, kind: &str, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("{what}: nothing on stdout"));
    let value: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{what}: {last}: {e}"));
    assert_eq!(value["error"]["kind"], kind, "{what}: {value}");
    // SPEC 8.1 fixes two shapes to the field, without a detail: they say everything in theirs.
    if !["cursor_expired", "epoch_mismatch"].contains(&kind) {
        assert!(
            value["error"]["detail"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{what}: a detail: {value}"
        );
    }
    value
}

#[test]
fn every_command_is_listed_here() {
    let out = run_materializer(&["--help"], None);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    for command in &listed {
        assert!(
            COMMANDS.iter().any(|c| c[0] == *command),
            "`{command}` is not in this test's COMMANDS: add its failure modes"
        );
    }
}

#[test]
fn a_bad_flag_is_a_usage_error_64_with_one_json_object_for_every_command() {
    for command in COMMANDS {
        let mut args = command.to_vec();
        args.push("--no-such-flag");
        let out = run_materializer(&args, None);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let error = error_object(&out, "usage", &format!("{args:?}"));
        assert!(
            error["error"]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("--no-such-flag"),
            "{args:?}: {error}"
        );
        // clap's explanation for the human, on stderr.
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Usage:"),
            "{args:?}"
        );
    }
    // A missing required argument, a value out of range, no command at all: 64 too, and a
    // text form on request.
    for args in [
        &["scan", "--epoch", "1"][..],
        &["scan", "--user", "u", "--epoch", "1", "--limit", "0"],
        &[],
        &["truncate", "--user", "u", "--epoch", "1", "--before", "0"],
    ] {
        let out = run_materializer(args, None);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        error_object(&out, "usage", &format!("{args:?}"));
    }
    let out = run_materializer(&["scan", "--bogus", "--output", "text"], None);
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty(), "text: nothing on stdout");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: unexpected argument"));
}

#[test]
fn a_bad_argument_or_configuration_value_is_64_and_names_it() {
    let out = run_materializer(&["scan", "--user", "a b", "--epoch", "1"], None);
    assert_eq!(out.status.code(), Some(64));
    let error = error_object(&out, "usage", "--user");
    assert_eq!(error["error"]["field"], "--user", "{error}");

    let dir = std::env::temp_dir().join(format!("mm-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[retention]\ndays = 0\n").expect("write");
    for command in [
        &["check-config"][..],
        &["scan", "--user", "u", "--epoch", "1"],
        &["run"],
    ] {
        let mut args = vec!["--config", bad.to_str().expect("path")];
        args.extend_from_slice(command);
        let out = run_materializer(&args, None);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let error = error_object(&out, "invalid_config", &format!("{args:?}"));
        assert!(
            error["error"]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("retention.days"),
            "{error}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_and_version_exit_0_and_the_version_names_the_revision() {
    let out = run_materializer(&["--version"], None);
    assert_eq!(out.status.code(), Some(0));
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.starts_with(&format!(
            "materializer {} (revision ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );
    for command in COMMANDS {
        let out = run_materializer(&[command[0], "--help"], None);
        assert_eq!(out.status.code(), Some(0), "{command:?}");
    }
}

/// Every command that opens the store, against a Redis that is not there: 2 (retry later) and
/// the error object; in text, `error:` on stderr and nothing on stdout.
#[test]
fn an_unreachable_store_is_2_for_every_command_that_opens_one() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let opens_the_store: [&[&str]; 12] = [
        &["apply"],
        &["scan", "--user", "u", "--epoch", "1"],
        &["inspect", "--user", "u", "--epoch", "1"],
        &["truncate", "--user", "u", "--epoch", "1", "--before", "2"],
        &["promote", "--user", "u", "--epoch", "1"],
        &["patrol"],
        &["replay", "--partition", "0", "--from-offset", "0"],
        &["dlq", "redrive"],
        &["explain", "--user", "u"],
        &["verify", "--partition", "0", "--from-offset", "0"],
        &["accept-store-loss"],
        &["check-config", "--connect"],
    ];
    let config = std::env::temp_dir().join(format!("mm-contract-kafka-{}.toml", free_port()));
    // A broker that is not there either, named so check-config does not wait on a real one.
    std::fs::write(
        &config,
        format!(
            "[kafka]\nbrokers = \"127.0.0.1:{}\"\n[store.redis]\nconnect_timeout_ms = 1000\n",
            free_port()
        ),
    )
    .expect("config");
    for command in opens_the_store {
        let mut args = vec![
            "--config",
            config.to_str().expect("path"),
            "--store",
            "redis",
            "--redis-url",
            &url,
        ];
        args.extend_from_slice(command);
        let out = run_materializer(&args, Some(""));
        assert_eq!(out.status.code(), Some(2), "{command:?}");
        error_object(&out, "unavailable", &format!("{command:?}"));

        args.extend_from_slice(&["--output", "text"]);
        let out = run_materializer(&args, Some(""));
        assert_eq!(out.status.code(), Some(2), "{command:?} text");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.lines().any(|l| l.starts_with("error: ")),
            "{command:?}: {stderr}"
        );
        if command[0] != "check-config" {
            assert!(out.stdout.is_empty(), "{command:?} text: nothing on stdout");
        }
    }
    let _ = std::fs::remove_file(&config);
}

/// The commands that reach a broker or a replica rather than the store: 2 when it is not there.
#[test]
fn an_unreachable_broker_or_replica_is_2() {
    let config = std::env::temp_dir().join(format!("mm-contract-broker-{}.toml", free_port()));
    std::fs::write(
        &config,
        format!("[kafka]\nbrokers = \"127.0.0.1:{}\"\n", free_port()),
    )
    .expect("config");
    let nobody = format!("127.0.0.1:{}", free_port());
    for command in [
        &["dlq", "list"][..],
        &["dlq", "show", "--dlq-partition", "0", "--offset", "0"],
        &["tap", "--daemon", &nobody],
        &["top", "--once", "--interval-ms", "100", &nobody],
    ] {
        let mut args = vec!["--config", config.to_str().expect("path")];
        args.extend_from_slice(command);
        let out = run_materializer(&args, None);
        assert_eq!(out.status.code(), Some(2), "{command:?}");
        error_object(&out, "unavailable", &format!("{command:?}"));
    }
    let _ = std::fs::remove_file(&config);
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

fn dispatch(user: &str, seq: u64, at: u64) -> String {
    json!({"dispatch_id": format!("{user}-{seq}"), "group_id": "g", "committed_at": at,
        "deliveries": [{"user_id": user, "epoch": 3, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]})
    .to_string()
}

/// A corrupt mailbox met by any command: 3, whatever the command (SPEC 8.2; `scan` answered 1
/// before, `verify` 1 too).
#[test]
fn a_corrupt_mailbox_is_3_for_every_command_that_meets_it() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let redis = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--store", "redis", "--redis-url", &url];
        all.extend_from_slice(args);
        run_materializer(&all, stdin)
    };
    let now = now_ms();
    let input: Vec<String> = (1..=3).map(|seq| dispatch("u-17", seq, now)).collect();
    let out = redis(&["apply"], Some(&input.join("\n")));
    assert_eq!(out.status.code(), Some(0));

    // The identity index lost: writes and explain fail closed.
    assert!(server.raw("DEL mm:mbseqbucket:{u-17}:3").contains(":1"));
    let out = redis(&["apply"], Some(&dispatch("u-17", 4, now)));
    assert_eq!(out.status.code(), Some(3), "apply");
    let out = redis(
        &[
            "truncate", "--user", "u-17", "--epoch", "3", "--before", "2",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(3), "truncate");
    error_object(&out, "corrupt", "truncate");
    let out = redis(&["explain", "--user", "u-17"], None);
    assert_eq!(out.status.code(), Some(3), "explain");

    // A day lost: the reader's scan fails closed.
    assert!(server.raw("DEL mm:mbdays:{u-17}:3").contains(":1"));
    let out = redis(&["scan", "--user", "u-17", "--epoch", "3"], None);
    assert_eq!(out.status.code(), Some(3), "scan");
    error_object(&out, "corrupt", "scan");
    let out = redis(
        &["scan", "--user", "u-17", "--epoch", "3", "--output", "text"],
        None,
    );
    assert_eq!(out.status.code(), Some(3), "scan text");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: corrupt"));

    // A finding that is not corruption stays 1: a cursor below the trim.
    let out = redis(&["apply"], Some(&dispatch("u-18", 5, now)));
    assert_eq!(out.status.code(), Some(0));
    let out = redis(
        &[
            "truncate", "--user", "u-18", "--epoch", "3", "--before", "5",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let out = redis(
        &["scan", "--user", "u-18", "--epoch", "3", "--after", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(1), "cursor expired");
    error_object(&out, "cursor_expired", "scan");
}

/// Waits for a child's first stdout line (so the signal comes mid-run), then signals it.
fn signal_mid_run(mut child: std::process::Child, signal: &str) -> (Option<i32>, String) {
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("first line");
    assert!(
        !first.is_empty(),
        "the command printed nothing before the signal"
    );
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        assert!(Instant::now() < deadline, "still running after {signal}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("rest");
    (code, first + &rest)
}

/// SIGINT or SIGTERM before the end: 4, what was done so far still printed, then the error.
#[test]
fn a_signal_before_the_end_is_4() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    for signal in ["INT", "TERM"] {
        // `apply -` on an input that stays open: the first record applied, then the signal.
        let mut child = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .args(["--store", "redis", "--redis-url", &url, "apply", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("apply runs");
        let mut stdin = child.stdin.take().expect("piped");
        std::io::Write::write_all(
            &mut stdin,
            format!("{}\n", dispatch(&format!("u-{signal}"), 1, now_ms())).as_bytes(),
        )
        .expect("write");
        let (code, stdout) = signal_mid_run(child, signal);
        drop(stdin);
        assert_eq!(code, Some(4), "apply, SIG{signal}: {stdout}");
        let lines: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        assert_eq!(lines[0]["outcome"], "inserted", "{stdout}");
        assert_eq!(
            lines.last().map(|l| l["error"]["kind"].clone()),
            Some(json!("interrupted")),
            "{stdout}"
        );
    }

    // `tap` on a replica that accepted the connection and says nothing yet.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = silent.local_addr().expect("addr").to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["tap", "--daemon", &address])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tap runs");
    let (_conn, _) = silent.accept().expect("tap connects");
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("tap ends");
    assert_eq!(out.status.code(), Some(4), "tap");
    error_object(&out, "interrupted", "tap");
}

/// Flags renamed so one name means one thing (SPEC 8.2) still parse for one release, and warn.
#[test]
fn old_spellings_still_parse_and_say_what_replaced_them() {
    let config = std::env::temp_dir().join(format!("mm-contract-old-{}.toml", free_port()));
    std::fs::write(
        &config,
        format!("[kafka]\nbrokers = \"127.0.0.1:{}\"\n", free_port()),
    )
    .expect("config");
    let path = config.to_str().expect("path");
    for (args, replacement) in [
        (
            &["dlq", "show", "--partition", "0", "--offset", "0"][..],
            "--dlq-partition",
        ),
        (&["dlq", "list", "--source-partition", "0"], "`--partition`"),
    ] {
        let mut all = vec!["--config", path];
        all.extend_from_slice(args);
        let out = run_materializer(&all, None);
        // Parsed: what follows is the unreachable broker's 2, not a usage error.
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("warning: ") && stderr.contains(replacement),
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_file(&config);
}

/// `truncate --dry-run` changes nothing and says what a truncate would do.
#[test]
fn truncate_dry_run_changes_nothing() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let redis = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--store", "redis", "--redis-url", &url];
        all.extend_from_slice(args);
        run_materializer(&all, stdin)
    };
    let now = now_ms();
    let input: Vec<String> = (1..=4).map(|seq| dispatch("u-dry", seq, now)).collect();
    assert_eq!(
        redis(&["apply"], Some(&input.join("\n"))).status.code(),
        Some(0)
    );
    let scan = |after: &str| {
        let out = redis(
            &["scan", "--user", "u-dry", "--epoch", "3", "--after", after],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = scan("0");
    let truncate = [
        "truncate", "--user", "u-dry", "--epoch", "3", "--before", "3",
    ];
    let out = redis(&[&truncate[..], &["--dry-run"]].concat(), None);
    assert_eq!(out.status.code(), Some(0));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(
        plan,
        json!({"dry_run": true, "user_trim_seq": 3, "current_user_trim_seq": 0, "groups_deleted": 2})
    );
    assert_eq!(scan("0"), before, "nothing changed");
    let out = redis(&truncate, None);
    let done: Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(done["user_trim_seq"], plan["user_trim_seq"]);
    assert!(scan("2").contains("\"mailbox_seq\":3"), "{}", scan("2"));
}

/// The daemon's own failures end the same way as every command's: a port it cannot bind is 2
/// with the error object on stdout (its log says it too, on stderr).
#[test]
fn the_daemon_failing_to_start_is_2_with_the_error_object() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("addr").port();
    let config = std::env::temp_dir().join(format!("mm-contract-run-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!("[http]\nlisten = \"127.0.0.1:{port}\"\n[kafka]\nbrokers = \"127.0.0.1:1\"\n"),
    )
    .expect("config");
    let out = run_materializer(&["run", "--config", &config.to_string_lossy()], None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let value = error_object(&out, "unavailable", "run");
    assert!(
        value["error"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&port.to_string())),
        "{value}"
    );
    let _ = std::fs::remove_file(&config);
}
