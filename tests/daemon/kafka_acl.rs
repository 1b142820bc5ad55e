//! Least privilege on Kafka, tested live on the broker's SASL_SSL listener (SCRAM-SHA-512, the
//! test CA, StandardAuthorizer refusing whatever no ACL grants): the user `materializer` with
//! exactly the daemon's ACLs (docs/grants.md; `daemon::kafka_grants`) — Read and
//! DescribeConfigs on the dispatch topic, Read on the group, Write on the dead-letter topic, all
//! LITERAL — runs the daemon end to end (every record materialized, a malformed one
//! dead-lettered) and passes `check-config --connect`; a configuration missing any one of them
//! makes `check-config --connect` print a FAIL line naming exactly that ACL and the command that
//! grants it; a configuration trusting another CA fails naming the certificate verification.
//!
//! The records are produced through the PLAINTEXT listener (its anonymous user is a super user),
//! as every other daemon test does. A missing broker or SASL listener fails the test.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::SystemClock;
use support::kafka::{
    bootstrap, create_topic, produce, read_all, unique, wait_for, Daemon, DaemonSetup,
};
use support::reference::{group_record, scan_seqs};

/// The SCRAM user the daemon runs as (no ACLs until this test grants them).
const USER: &str = "materializer";
const PASSWORD: &str = "materializer-secret";

/// `scripts/kafka VERB ARGS...` against the broker at `KAFKA_BOOTSTRAP`: its stdout, or a
/// panic with what it said.
fn kafka_script(args: &[&str]) -> String {
    let port = bootstrap()
        .rsplit(':')
        .next()
        .expect("KAFKA_BOOTSTRAP is host:port")
        .to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka");
    let out = Command::new(&script)
        .args(args)
        .env("KAFKA_PORT", port)
        .output()
        .expect("scripts/kafka runs");
    assert!(
        out.status.success(),
        "scripts/kafka {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The SASL_SSL listener and the test CA: both must be there (never a skip).
fn sasl_listener() -> (String, PathBuf, PathBuf) {
    let address = kafka_script(&["sasl-port"]);
    std::net::TcpStream::connect_timeout(
        &address.parse().expect("sasl-port prints host:port"),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| {
        panic!("the broker's SASL_SSL listener {address} does not answer ({e}): restart Kafka with scripts/kafka stop && scripts/kafka start")
    });
    let ca = PathBuf::from(kafka_script(&["ca"]));
    let wrong_ca = PathBuf::from(kafka_script(&["wrong-ca"]));
    for file in [&ca, &wrong_ca] {
        assert!(
            file.is_file(),
            "{} is missing: the broker was started without its SASL_SSL listener",
            file.display()
        );
    }
    (address, ca, wrong_ca)
}

/// `scripts/kafka acl --add` for `USER`: every operation on every resource named.
fn grant(operations: &[&str], resources: &[(&str, &str)]) {
    let principal = format!("User:{USER}");
    let mut args = vec!["acl", "--add", "--allow-principal", &principal];
    for operation in operations {
        args.extend(["--operation", operation]);
    }
    let flags: Vec<String> = resources
        .iter()
        .map(|(kind, _)| format!("--{kind}"))
        .collect();
    for ((_, name), flag) in resources.iter().zip(&flags) {
        args.extend([flag.as_str(), name]);
    }
    kafka_script(&args);
}

/// [`grant`] on resources whose names start with each name given (`PREFIXED`).
fn grant_prefixed(operations: &[&str], kind: &str, prefix: &str) {
    let principal = format!("User:{USER}");
    let mut args = vec!["acl", "--add", "--allow-principal", &principal];
    for operation in operations {
        args.extend(["--operation", operation]);
    }
    let flag = format!("--{kind}");
    args.extend([flag.as_str(), prefix, "--resource-pattern-type", "prefixed"]);
    kafka_script(&args);
}

/// `materializer --config <setup's> ARGS` as `USER` over SASL_SSL: the output.
fn materializer(setup: &DaemonSetup, sasl: &str, args: &[&str]) -> Output {
    let config = setup.config_file(support::redis_server::free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .arg("--config")
        .arg(&config)
        .args(args)
        .env("MATERIALIZER_KAFKA_BROKERS", sasl)
        .output()
        .expect("materializer runs");
    eprintln!(
        "materializer {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The resources one configuration names.
#[derive(Clone)]
struct Names {
    topic: String,
    dlq: String,
    group: String,
}

/// A daemon setup for `names`, logging in as `USER` with `ca` over SASL_SSL.
fn setup(names: &Names, ca: &Path) -> DaemonSetup {
    let mut setup = DaemonSetup::new("kacl", None);
    setup.topic = names.topic.clone();
    setup.dlq_topic = names.dlq.clone();
    setup.group = names.group.clone();
    setup.properties_extra = vec![
        "\"security.protocol\" = \"SASL_SSL\"".to_owned(),
        "\"sasl.mechanism\" = \"SCRAM-SHA-512\"".to_owned(),
        format!("\"sasl.username\" = \"{USER}\""),
        format!("\"sasl.password\" = \"{PASSWORD}\""),
        format!("\"ssl.ca.location\" = \"{}\"", ca.display()),
    ];
    setup
}

/// `check-config --connect` of `setup`'s configuration against the SASL_SSL listener: exit code
/// and stdout lines.
fn check_config(setup: &DaemonSetup, sasl: &str) -> (i32, Vec<String>) {
    let config = setup.config_file(support::redis_server::free_port());
    let out: Output = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["check-config", "--connect", "--output", "text", "--config"])
        .arg(&config)
        .env("MATERIALIZER_KAFKA_BROKERS", sasl)
        .output()
        .expect("check-config runs");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    eprintln!(
        "check-config ({} / {} / {}):\n{}{}",
        setup.topic,
        setup.dlq_topic,
        setup.group,
        lines.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), lines)
}

fn fails(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("FAIL")).collect()
}

/// The `kafka ACL` lines of a run.
fn acl_lines(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| {
            l.get(6..)
                .is_some_and(|rest| rest.starts_with("kafka ACL: "))
        })
        .collect()
}

/// Exactly one ACL FAIL line, naming `operation` on `kind` `name` and the command granting it;
/// every other FAIL line is about the same resource (its topic line, its policy).
fn assert_names_exactly(lines: &[String], code: i32, operation: &str, kind: &str, name: &str) {
    assert_eq!(code, 1, "a missing ACL fails check-config: {lines:#?}");
    let acl_fails: Vec<&String> = acl_lines(lines)
        .into_iter()
        .filter(|l| l.starts_with("FAIL"))
        .collect();
    assert_eq!(
        acl_fails.len(),
        1,
        "exactly one missing ACL, {operation} on {kind} {name}: {lines:#?}"
    );
    let line = acl_fails[0];
    assert!(
        line.starts_with(&format!(
            "FAIL  kafka ACL: {operation} on {kind} {name} is missing (kafka-acls --add --allow-principal User:<you> --operation {operation} --{kind} {name})"
        )),
        "{line}"
    );
    for other in fails(lines) {
        assert!(
            other.contains(name),
            "a FAIL line about something else: {other}\n{lines:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_the_documented_acls_run_the_daemon_and_check_config_names_each_missing_one() {
    let (sasl, ca, wrong_ca) = sasl_listener();
    let full = Names {
        topic: unique("kacl-dispatch"),
        dlq: unique("kacl-dlq"),
        group: unique("kacl-group"),
    };
    // Topics for the cases that lack one ACL: one without Read, one without DescribeConfigs,
    // a dead-letter topic and a group with no ACL at all.
    let no_read = unique("kacl-noread");
    let no_configs = unique("kacl-noconfigs");
    let no_write = unique("kacl-nowrite");
    let no_group = unique("kacl-nogroup");
    for topic in [&full.topic, &no_read, &no_configs] {
        create_topic(topic, 2).await;
    }
    for topic in [&full.dlq, &no_write] {
        create_topic(topic, 1).await;
    }
    // The documented ACLs, three calls of the ACL tool.
    grant(
        &["Read"],
        &[
            ("topic", &full.topic),
            ("topic", &no_configs),
            ("group", &full.group),
        ],
    );
    grant(
        &["DescribeConfigs"],
        &[("topic", &full.topic), ("topic", &no_read)],
    );
    grant(&["Write"], &[("topic", &full.dlq)]);

    // (a) The daemon as `materializer` with exactly these: every record materialized, the
    // malformed one dead-lettered.
    let users: Vec<String> = (0..6).map(|i| format!("kacl-u{i}")).collect();
    let mut records: Vec<(i32, Vec<u8>)> = users
        .iter()
        .enumerate()
        .map(|(i, user)| ((i % 2) as i32, group_record(user, 1, "hello")))
        .collect();
    records.push((1, b"not json at all".to_vec()));
    produce(&full.topic, &records).await;
    let daemon_setup = setup(&full, &ca);
    let mut daemon = Daemon::start_with_env(
        &daemon_setup,
        &[("MATERIALIZER_KAFKA_BROKERS", sasl.as_str())],
    );
    let applied = users.len() as f64;
    wait_for(
        "every record applied and the malformed one dead-lettered, ready",
        Duration::from_secs(45),
        || {
            let metrics = daemon.metrics();
            metrics.get("materializer_records_total{outcome=\"applied\"}") >= applied
                && metrics.get("materializer_dlq_total{reason=\"malformed\"}") >= 1.0
                && daemon.ready_status() == Some(200)
        },
        || {
            format!(
                "/readyz: {:?}\n{}\n{}",
                support::kafka::http_get(daemon.http_port, "/readyz"),
                daemon.metrics().text,
                daemon.log()
            )
        },
    );
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_records_total{outcome=\"applied\"}"),
        applied
    );
    assert_eq!(metrics.sum("materializer_dlq_total"), 1.0);
    // The compaction watch could read the policy: DescribeConfigs is enough.
    assert_eq!(metrics.get("materializer_topic_compacted"), 0.0);
    let log = daemon.log();
    assert!(
        !log.contains("AuthorizationFailed") && !log.contains("authorization failed"),
        "an ACL was missing:\n{log}"
    );
    let status = daemon.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM exits 0: {status:?}\n{}",
        daemon.log()
    );
    let store = MemoryStore::new(
        mailbox_materializer::model::RetentionPolicy::default(),
        Arc::new(SystemClock),
    );
    store
        .load_snapshot(&daemon_setup.snapshot())
        .expect("the daemon saved its memory store on exit");
    for user in &users {
        assert_eq!(scan_seqs(&store, user).await, vec![1], "{user}");
    }
    let letters = read_all(&full.dlq);
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].payload, b"not json at all");
    assert_eq!(
        letters[0].headers.get("error_outcome").map(String::as_str),
        Some("malformed")
    );

    // (f) The operator commands as `materializer`, with exactly docs/grants.md's rows for them.
    // replay: Read on the topic and Describe on the group (the daemon's Read covers it); with
    // --reset-mailboxes, DescribeConfigs on the topic (granted for the daemon).
    let out = materializer(
        &daemon_setup,
        &sasl,
        &[
            "replay",
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--progress",
            "off",
        ],
    );
    assert!(out.status.success(), "replay as {USER}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("replay summary");
    assert_eq!(summary["outcomes"]["applied"], 3, "{summary}");
    let out = materializer(
        &daemon_setup,
        &sasl,
        &[
            "replay",
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--user",
            &users[0],
            "--reset-mailboxes",
            "--progress",
            "off",
        ],
    );
    assert!(out.status.success(), "replay --reset-mailboxes as {USER}");
    // dlq list/show: Read on the dead-letter topic, Describe on `G-dlq-inspect`.
    grant(&["Read"], &[("topic", &full.dlq)]);
    grant(
        &["Describe"],
        &[("group", &format!("{}-dlq-inspect", full.group))],
    );
    let out = materializer(&daemon_setup, &sasl, &["dlq", "list"]);
    assert!(out.status.success(), "dlq list as {USER}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("malformed"));
    // dlq redrive: Read on the PREFIXED group `G-dlq-redrive-`, where its progress is committed.
    grant_prefixed(&["Read"], "group", &format!("{}-dlq-redrive-", full.group));
    let out = materializer(&daemon_setup, &sasl, &["dlq", "redrive"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("AuthorizationFailed"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"result\":\"malformed\""));
    // A letter that re-drives (its record is valid now) moves the group's progress: the commit
    // needs the group's Read. A second re-drive finds nothing new.
    let letters = unique("kacl-redrive");
    create_topic(&letters, 1).await;
    produce(&letters, &[(0, group_record("kacl-r", 1, "r"))]).await;
    grant(&["Read"], &[("topic", &letters)]);
    let redrive_setup = setup(
        &Names {
            dlq: letters.clone(),
            ..full.clone()
        },
        &ca,
    );
    let out = materializer(&redrive_setup, &sasl, &["dlq", "redrive"]);
    assert!(out.status.success(), "dlq redrive as {USER}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"result\":\"applied\""));
    let out = materializer(&redrive_setup, &sasl, &["dlq", "redrive"]);
    assert!(out.status.success(), "a second dlq redrive");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("\"result\""),
        "the first re-drive's progress was committed"
    );

    // (b) check-config --connect with the same configuration: no FAIL line, one ok line per ACL.
    let (code, lines) = check_config(&daemon_setup, &sasl);
    assert_eq!(code, 0, "{lines:#?}");
    assert!(fails(&lines).is_empty(), "{lines:#?}");
    let acls = acl_lines(&lines);
    for wanted in [
        format!("Read on topic {}", full.topic),
        format!("DescribeConfigs on topic {}", full.topic),
        format!("Read on group {}", full.group),
        format!("Write on topic {}", full.dlq),
    ] {
        assert!(
            acls.iter()
                .any(|l| l.starts_with(&format!("ok    kafka ACL: {wanted} is granted"))),
            "no ok line for {wanted}: {lines:#?}"
        );
    }
    assert_eq!(acls.len(), 4, "{lines:#?}");

    // (c) Each ACL missing alone: a FAIL line naming exactly it.
    let cases = [
        (
            Names {
                topic: no_read.clone(),
                ..full.clone()
            },
            "Read",
            "topic",
            no_read.clone(),
        ),
        (
            Names {
                topic: no_configs.clone(),
                ..full.clone()
            },
            "DescribeConfigs",
            "topic",
            no_configs.clone(),
        ),
        (
            Names {
                group: no_group.clone(),
                ..full.clone()
            },
            "Read",
            "group",
            no_group.clone(),
        ),
        (
            Names {
                dlq: no_write.clone(),
                ..full.clone()
            },
            "Write",
            "topic",
            no_write.clone(),
        ),
    ];
    for (names, operation, kind, name) in &cases {
        let (code, lines) = check_config(&setup(names, &ca), &sasl);
        assert_names_exactly(&lines, code, operation, kind, name);
    }

    // (e) The daemon without Read on its group, or without Write on its dead-letter topic:
    // not ready, the missing ACL named on /readyz and in its log.
    for (names, wanted) in [
        (&cases[2].0, format!("Read on group {no_group} is missing")),
        (&cases[3].0, format!("Write on topic {no_write} is missing")),
    ] {
        let daemon = Daemon::start_with_env(
            &setup(names, &ca),
            &[("MATERIALIZER_KAFKA_BROKERS", sasl.as_str())],
        );
        wait_for(
            "readyz names the missing ACL",
            Duration::from_secs(30),
            || {
                support::kafka::http_get(daemon.http_port, "/readyz").is_some_and(|(code, body)| {
                    code == 503
                        && body
                            .lines()
                            .any(|l| l.starts_with("kafka grants: ") && l.contains(&wanted))
                })
            },
            || {
                format!(
                    "/readyz: {:?}\n{}",
                    support::kafka::http_get(daemon.http_port, "/readyz"),
                    daemon.log()
                )
            },
        );
        assert!(daemon.log().contains(&wanted), "{}", daemon.log());
        println!("daemon without it: kafka grants: {wanted}");
    }

    // (d) A configuration trusting another CA: the broker's certificate fails verification,
    // and the brokers line says so.
    let (code, lines) = check_config(&setup(&full, &wrong_ca), &sasl);
    assert_eq!(code, 1, "{lines:#?}");
    let brokers = lines
        .iter()
        .find(|l| l.starts_with("FAIL  kafka brokers "))
        .unwrap_or_else(|| panic!("no failing brokers line: {lines:#?}"));
    assert!(
        brokers.contains("certificate verify failed") && brokers.contains("ssl.ca.location"),
        "{brokers}"
    );
}
