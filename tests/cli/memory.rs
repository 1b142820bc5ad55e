//! The store commands of SPEC 8.1, run as a user runs them: the built binary, JSON on stdout,
//! exit statuses. The memory store is shared between invocations through a snapshot file and
//! pinned to a fixed clock so the days are reproducible.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use support::cli::{json_lines, run_materializer};

const NOW: u64 = 1_805_112_000;
const DAY_MS: u64 = 86_400_000;

struct Env {
    dir: PathBuf,
    config: PathBuf,
}

impl Env {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mm-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[store.memory]\nsnapshot = {:?}\nfixed_now = {NOW}\n",
                dir.join("snapshot.json")
            ),
        )
        .unwrap();
        Self { dir, config }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let config = self.config.to_string_lossy().into_owned();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        run_materializer(&all, stdin)
    }

    fn json_lines(&self, args: &[&str], stdin: Option<&str>) -> (Vec<Value>, i32) {
        let out = self.run(args, stdin);
        (json_lines(&out), out.status.code().unwrap_or(-1))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn dispatch(seq: u64, day_offset: i64, body: &str) -> String {
    let committed_at = (NOW * 1000) as i64 + day_offset * DAY_MS as i64;
    json!({"type": "group_dispatch", "dispatch_id": format!("d-{seq}"), "group_id": "grp-42",
        "committed_at": committed_at,
        "deliveries": [{"user_id": "u-17", "epoch": 3, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": body}},
                       {"event_ordinal": 1, "payload": {"n": seq}}]}]})
    .to_string()
}

fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn apply_prints_one_line_per_delivery_and_scan_returns_the_groups() {
    let env = Env::new("apply");
    let records = [
        dispatch(7, 0, "hi"),
        dispatch(7, 0, "hi"),
        dispatch(7, -1, "hi"),
        "{not json".to_owned(),
        dispatch(8, -45, "old"),
        dispatch(9, 0, "there"),
        r#"{"type": "truncate_before", "user_id": "u-17", "epoch": 3, "before_seq": 2}"#.to_owned(),
    ];
    let file = write(&env.dir, "in.jsonl", &records);
    let (lines, code) = env.json_lines(&["apply", file.to_str().unwrap()], None);
    assert_eq!(code, 0);
    let outcomes: Vec<_> = lines
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap(),
                l["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (1, "inserted".into()),
            (2, "unchanged".into()),
            (3, "conflict".into()),
            (4, "malformed".into()),
            (5, "expired_merged".into()),
            (6, "inserted".into()),
            (7, "truncated".into()),
        ]
    );
    assert_eq!(
        lines[0],
        json!({"line": 1, "user_id": "u-17", "epoch": 3, "mailbox_seq": 7, "outcome": "inserted"})
    );
    assert_eq!(lines[2]["error"]["kind"], "cross_day");
    assert!(lines[2]["error"]["detail"]
        .as_str()
        .unwrap()
        .contains("day"));
    assert_eq!(lines[3]["error"]["kind"], "invalid_json");
    assert_eq!(
        lines[6],
        json!({"line": 7, "user_id": "u-17", "epoch": 3, "outcome": "truncated", "user_trim_seq": 2})
    );

    // Seq 8 was merged as expired input, so a cursor below it lost coverage.
    let (scan, code) = env.json_lines(
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "1"],
        None,
    );
    assert_eq!(code, 1);
    assert_eq!(
        scan[0],
        json!({"error": {"kind": "cursor_expired", "reason": "expired_gap", "boundary": 8}})
    );
    let (scan, code) = env.json_lines(
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "8"],
        None,
    );
    assert_eq!(code, 0);
    let expected_created_at = NOW * 1000;
    assert_eq!(
        scan[0],
        json!({"groups": [{"mailbox_seq": 9, "created_at": expected_created_at,
            "events": [{"event_ordinal": 0, "payload": {"body": "there"}},
                       {"event_ordinal": 1, "payload": {"n": 9}}]}],
            "up_to": 9, "has_more": false})
    );
}

#[test]
fn apply_reads_standard_input() {
    let env = Env::new("stdin");
    let (lines, code) = env.json_lines(&["apply", "-"], Some(&dispatch(1, 0, "x")));
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["outcome"], "inserted");
}

#[test]
fn apply_rejections_name_the_kind() {
    let env = Env::new("rejected");
    let mut dup: Value = serde_json::from_str(&dispatch(1, 0, "x")).unwrap();
    dup["deliveries"][0]["events"][1]["event_ordinal"] = json!(0);
    let future = dispatch(2, 31, "later");
    let (lines, code) = env.json_lines(&["apply"], Some(&format!("{dup}\n{future}\n")));
    assert_eq!(code, 0);
    assert_eq!(lines[0]["outcome"], "rejected");
    assert_eq!(lines[0]["error"]["kind"], "duplicate_ordinal");
    assert_eq!(lines[1]["error"]["kind"], "future_created_at");
    let (inspect, _) = env.json_lines(&["inspect", "--user", "u-17", "--epoch", "3"], None);
    assert_eq!(
        inspect[0]["current_epoch"],
        Value::Null,
        "nothing left behind"
    );
}

#[test]
fn scan_epoch_mismatch_inspect_and_truncate() {
    let env = Env::new("inspect");
    let (_, code) = env.json_lines(
        &["apply"],
        Some(&format!(
            "{}\n{}\n",
            dispatch(1, -2, "a"),
            dispatch(2, 0, "b")
        )),
    );
    assert_eq!(code, 0);

    let (scan, code) = env.json_lines(
        &["scan", "--user", "u-17", "--epoch", "4", "--after", "0"],
        None,
    );
    assert_eq!(
        (scan[0].clone(), code),
        (
            json!({"error": {"kind": "epoch_mismatch", "current": 3}}),
            1
        )
    );

    let (inspect, code) = env.json_lines(&["inspect", "--user", "u-17", "--epoch", "3"], None);
    assert_eq!(code, 0);
    let i = &inspect[0];
    let today = NOW / 86_400;
    assert_eq!(i["format_version"], 4);
    assert_eq!(i["current_epoch"], 3);
    assert_eq!(i["min_day"], today - 2);
    assert_eq!(i["max_day"], today);
    assert_eq!(i["active_day_count"], 2);
    assert_eq!(i["active_days"][today.to_string()]["max_seq"], 2);
    assert_eq!(
        i["active_days"][today.to_string()]["expires_at"],
        (today + 31) * 86_400
    );
    assert_eq!(i["expired_gap_boundary"], 0);
    assert_eq!(i["seqbucket_max_seq"], 2);
    assert_eq!(i["user_trim_seq"], 0);

    let (t, code) = env.json_lines(
        &[
            "truncate", "--user", "u-17", "--epoch", "3", "--before", "2",
        ],
        None,
    );
    assert_eq!((t[0].clone(), code), (json!({"user_trim_seq": 2}), 0));
    let (scan, code) = env.json_lines(
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "0"],
        None,
    );
    assert_eq!(code, 1);
    assert_eq!(
        scan[0],
        json!({"error": {"kind": "cursor_expired", "reason": "trimmed", "resume_after": 1}})
    );
    let (scan, _) = env.json_lines(
        &[
            "scan", "--user", "u-17", "--epoch", "3", "--after", "1", "--limit", "1",
        ],
        None,
    );
    assert_eq!(scan[0]["groups"][0]["mailbox_seq"], 2);
}

#[test]
fn corrupt_mailbox_makes_apply_exit_3() {
    let env = Env::new("corrupt");
    // Seq 5 then seq 3: a live seq below seqbucket_max_seq without identity fails closed.
    let input = format!("{}\n{}\n", dispatch(5, 0, "a"), dispatch(3, 0, "b"));
    let (lines, code) = env.json_lines(&["apply"], Some(&input));
    assert_eq!(code, 3);
    assert_eq!(lines[1]["outcome"], "corrupt");
    assert_eq!(lines[1]["error"]["kind"], "identity_missing");
}

/// SPEC 7.3 / 8.1 `held`: once a mailbox answered `corrupt`, `apply` writes nothing more to it in
/// that run, as the daemon holds it; its later lines are reported `held` and the run exits 3.
/// Before, line 3 was applied (`inserted`) over the mailbox that had just failed closed.
#[test]
fn apply_holds_a_mailbox_that_answered_corrupt_for_the_rest_of_the_run() {
    let env = Env::new("held");
    let input = format!(
        "{}\n{}\n{}\n",
        dispatch(5, 0, "a"),
        dispatch(3, 0, "b"),
        dispatch(6, 0, "c")
    );
    let (lines, code) = env.json_lines(&["apply"], Some(&input));
    assert_eq!(code, 3);
    let outcomes: Vec<(u64, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap_or(0),
                l["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(outcomes, vec![(1, "inserted"), (2, "corrupt"), (3, "held")]);
    assert_eq!(lines[2]["error"]["kind"], "held");
    assert_eq!(lines[2]["mailbox_seq"], 6);
    let (scan, _) = env.json_lines(
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "0"],
        None,
    );
    let seqs: Vec<u64> = scan[0]["groups"]
        .as_array()
        .map(|g| g.iter().filter_map(|g| g["mailbox_seq"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(seqs, vec![5], "the held line wrote nothing");
}

#[test]
fn unavailable_backend_exits_2_and_bad_config_exits_64() {
    let env = Env::new("unavailable");
    let out = env.run(
        &[
            "--store",
            "scylla",
            "--scylla-nodes",
            "127.0.0.1:1",
            "scan",
            "--user",
            "u",
            "--epoch",
            "1",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let bad = env.dir.join("bad.toml");
    std::fs::write(&bad, "[retention]\ndays = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--config", bad.to_str().unwrap(), "check-config"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "a bad configuration value is a usage error"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("retention.days"));
}

#[test]
fn every_command_has_help() {
    for cmd in [
        "check-config",
        "apply",
        "scan",
        "inspect",
        "truncate",
        "promote",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd} --help");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
}

/// Commands that never open the store leave the store flags out of their help; the others, and
/// the top level, list them; and the flags still parse anywhere on the line.
#[test]
fn store_flags_are_listed_only_where_a_store_is_opened() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .args(args)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for storeless in [
        &["top", "--help"][..],
        &["tap", "--help"],
        &["dlq", "list", "--help"],
        &["dlq", "show", "-h"],
        &["help", "top"],
        &["--config", "/nowhere.toml", "top", "--help"],
    ] {
        let text = help(storeless);
        assert!(
            text.contains("Usage: materializer"),
            "{storeless:?}: {text}"
        );
        assert!(text.contains("--config"), "{storeless:?}: {text}");
        for flag in [
            "--store ",
            "--redis-url",
            "--scylla-nodes",
            "--memory-snapshot",
        ] {
            assert!(!text.contains(flag), "{storeless:?} lists {flag}: {text}");
        }
    }
    for with_store in [
        &["--help"][..],
        &["apply", "--help"],
        &["explain", "--help"],
        &["dlq", "redrive", "--help"],
        &["replay", "--help"],
    ] {
        let text = help(with_store);
        for flag in ["--store ", "--redis-url", "--scylla-nodes"] {
            assert!(text.contains(flag), "{with_store:?} lacks {flag}: {text}");
        }
    }
    // Hidden from help, still accepted where given.
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args([
            "top",
            "--store",
            "memory",
            "--once",
            "--interval-ms",
            "100",
            "127.0.0.1:1",
        ])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "parsed, and the unreachable replica fails --once: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[kafka]` is validated by `check-config`: librdkafka must know every pass-through property,
/// the daemon's own properties cannot be overridden, and secrets from the environment are masked.
#[test]
fn check_config_validates_kafka_properties_and_masks_env_secrets() {
    let dir = std::env::temp_dir().join(format!("mm-kafka-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let check = |toml: &str, env: &[(&str, &str)]| {
        let path = dir.join("c.toml");
        std::fs::write(&path, toml).expect("write");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_materializer"));
        command.args(["check-config", "--config"]).arg(&path);
        for (k, v) in env {
            command.env(k, v);
        }
        command.output().expect("runs")
    };

    let unknown = check("[kafka.properties]\n\"no.such.property\" = \"1\"\n", &[]);
    assert_eq!(unknown.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&unknown.stdout).contains("no.such.property"));

    let owned = check(
        "[kafka.properties]\n\"enable.auto.commit\" = \"true\"\n",
        &[],
    );
    assert_eq!(owned.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&owned.stdout).contains("enable.auto.commit"));

    let window = check("[kafka]\nmax_in_flight_records = 0\n", &[]);
    assert_eq!(window.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&window.stdout).contains("kafka.max_in_flight_records"));

    let ok = check(
        "[kafka.properties]\n\"security.protocol\" = \"sasl_plaintext\"\n\"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"svc\"\n",
        &[("MATERIALIZER_KAFKA_PROPERTY_SASL_PASSWORD", "hunter2")],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(out.contains("sasl.password"), "{out}");
    assert!(!out.contains("hunter2"), "the secret is masked: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `check-config` masks every librdkafka property that carries a secret, whatever its name's
/// shape (`*.password`, `*.secret`, OAuth bearer configuration, tokens), from the file or the
/// environment.
#[test]
fn check_config_masks_every_secret_property() {
    let dir = std::env::temp_dir().join(format!("mm-secret-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "[kafka.properties]\n\"sasl.oauthbearer.config\" = \"principal=svc secret-s1\"\n\"ssl.key.password\" = \"secret-s2\"\n\"ssl.keystore.password\" = \"secret-s3\"\n",
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env(
            "MATERIALIZER_KAFKA_PROPERTY_SASL_OAUTHBEARER_CLIENT_SECRET",
            "secret-s4",
        )
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for key in [
        "sasl.oauthbearer.config",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
    ] {
        assert!(stdout.contains(key), "{key} listed: {stdout}");
    }
    for secret in ["secret-s1", "secret-s2", "secret-s3", "secret-s4"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} must never be printed: {stdout} {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SPEC 8.2: `--version` names the version and the source revision the binary was built from
/// (the same revision `materializer_build_info{revision}` carries).
#[test]
fn version_names_the_version_and_the_source_revision() {
    let out = support::cli::run_materializer(&["--version"], None);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        text,
        format!(
            "materializer {} (revision {})",
            env!("CARGO_PKG_VERSION"),
            env!("MATERIALIZER_REVISION")
        )
    );
    assert_ne!(env!("MATERIALIZER_REVISION"), "", "{text}");
}
