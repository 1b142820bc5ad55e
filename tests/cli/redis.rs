//! The store commands of SPEC 8.1 against a real redis-server (`--store redis`).

use crate::support;

use std::process::Output;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::cli::{json_lines, run_materializer};
use support::redis_server::{Clock, Listen, RedisServer};

fn run(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = vec!["--store", "redis", "--redis-url", url];
    all.extend_from_slice(args);
    run_materializer(&all, stdin)
}

fn lines(out: &Output) -> Vec<Value> {
    json_lines(out)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn dispatch(seq: u64, committed_at: u64) -> String {
    json!({"dispatch_id": format!("d-{seq}"), "group_id": "g", "committed_at": committed_at,
        "deliveries": [{"user_id": "u-17", "epoch": 3, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]})
    .to_string()
}

#[test]
fn apply_scan_inspect_truncate_patrol_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let now = now_ms();
    let input = [
        dispatch(1, now),
        dispatch(1, now),
        dispatch(2, now - 86_400_000),
        dispatch(3, now - 40 * 86_400_000),
        r#"{"type": "truncate_before", "user_id": "u-17", "epoch": 3, "before_seq": 2}"#.to_owned(),
    ]
    .join("\n");
    let out = run(&url, &["apply", "-"], Some(&input));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcomes: Vec<_> = lines(&out)
        .iter()
        .map(|l| l["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        [
            "inserted",
            "unchanged",
            "inserted",
            "expired_merged",
            "truncated"
        ]
    );

    let out = run(
        &url,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "3"],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        lines(&out)[0],
        json!({"groups": [], "up_to": 3, "has_more": false})
    );
    let out = run(
        &url,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        lines(&out)[0],
        json!({"error": {"kind": "cursor_expired", "reason": "expired_gap", "boundary": 3}})
    );

    let out = run(&url, &["inspect", "--user", "u-17", "--epoch", "3"], None);
    let i = &lines(&out)[0];
    assert_eq!(i["format_version"], 4);
    assert_eq!(i["current_epoch"], 3);
    assert_eq!(i["user_trim_seq"], 2);
    assert_eq!(i["expired_gap_boundary"], 3);
    assert_eq!(i["seqbucket_max_seq"], 2);
    assert_eq!(i["active_day_count"], 2);

    let out = run(
        &url,
        &[
            "truncate", "--user", "u-17", "--epoch", "3", "--before", "3",
        ],
        None,
    );
    assert_eq!(lines(&out)[0], json!({"user_trim_seq": 3}));

    let out = run(&url, &["patrol", "--rate", "1000"], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lines(&out)[0]["visited"], 1);
}

/// `patrol` removes the staging copy a crashed `replay --reset-mailboxes` left behind once its
/// fence lapsed, says so in its JSON (`staging_collected`), and leaves the live mailbox as it was.
#[test]
fn patrol_collects_the_staging_copy_of_a_crashed_repair() {
    use mailbox_materializer::model::{Event, EventGroup, MailboxId, Payload, RetentionPolicy};
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use mailbox_materializer::store::MailboxStore;

    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let out = run(&url, &["apply", "-"], Some(&dispatch(1, now_ms())));
    assert_eq!(lines(&out)[0]["outcome"], "inserted");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = RedisStore::connect(
            RedisSettings::new(url.clone(), "mm"),
            RetentionPolicy::default(),
        )
        .await
        .expect("connect");
        let user = mailbox_materializer::model::UserId::parse("u-17").expect("user");
        let token = store
            .repair_begin(&user, std::time::Duration::from_millis(200))
            .await
            .expect("fence");
        let staged = EventGroup {
            mailbox: MailboxId::new(user, 3),
            mailbox_seq: 9,
            created_at: now_ms(),
            events: vec![Event {
                event_ordinal: 0,
                payload: Payload::from_value(&json!({"staged": true})),
            }],
            source: None,
            token: None,
        };
        store.repair_append(&token, &staged).await.expect("staged");
        // The process dies here: no swap, no abort; the lease lapses by itself.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    });
    let staged_keys = server.raw("EXISTS mm:stgepoch:{u-17}");
    assert_eq!(
        staged_keys.trim(),
        ":1",
        "the crashed repair left its staging copy"
    );

    // A dry run counts it by the script's own rule and leaves it.
    let out = run(&url, &["patrol", "--rate", "1000", "--dry-run"], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lines(&out)[0]["staging_collected"], 1);
    assert_eq!(lines(&out)[0]["dry_run"], true);
    assert_eq!(server.raw("EXISTS mm:stgepoch:{u-17}").trim(), ":1");

    let out = run(&url, &["patrol", "--rate", "1000"], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lines(&out)[0]["staging_collected"], 1);
    assert!(lines(&out)[0].get("dry_run").is_none());
    assert_eq!(server.raw("EXISTS mm:stgepoch:{u-17}").trim(), ":0");
    let out = run(
        &url,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "0"],
        None,
    );
    let seqs: Vec<u64> = lines(&out)[0]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["mailbox_seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, vec![1], "the live mailbox is as it was");
}

/// SPEC 8.2: what deletes has `--dry-run`. `promote --dry-run` and `patrol --dry-run` print what
/// the pass would compact (the same fields), change nothing, and the real pass then does exactly
/// that. The days expire on the server's clock, moved from 32 days ago to now.
#[test]
fn promote_and_patrol_dry_runs_print_what_the_pass_then_does() {
    let now = now_ms() / 1000;
    let then = now - 32 * 86_400;
    let server = RedisServer::start(Clock::Fake(then), Listen::Unix, &[]);
    let url = server.url();
    let input = [dispatch(1, then * 1000), dispatch(2, then * 1000 + 60_000)].join("\n");
    let out = run(&url, &["apply", "-"], Some(&input));
    let outcomes: Vec<_> = lines(&out).iter().map(|l| l["outcome"].clone()).collect();
    assert_eq!(outcomes, [json!("inserted"), json!("inserted")], "{out:?}");
    server.set_now(now);
    let mailbox = ["--user", "u-17", "--epoch", "3"];
    let inspect = || lines(&run(&url, &[&["inspect"][..], &mailbox].concat(), None))[0].clone();
    let before = inspect();
    assert_eq!(before["active_day_count"], 1, "{before}");

    let out = run(
        &url,
        &[&["promote", "--dry-run"][..], &mailbox].concat(),
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        lines(&out)[0],
        json!({"expired_days": 1, "expired_gap_boundary": 2, "dry_run": true})
    );
    let out = run(&url, &["patrol", "--rate", "1000", "--dry-run"], None);
    let report = &lines(&out)[0];
    assert_eq!(
        (
            report["visited"].clone(),
            report["expired_days"].clone(),
            report["dry_run"].clone()
        ),
        (json!(1), json!(1), json!(true)),
        "{report}"
    );
    assert_eq!(inspect(), before, "the dry runs changed nothing");

    let out = run(&url, &[&["promote"][..], &mailbox].concat(), None);
    assert_eq!(
        lines(&out)[0],
        json!({"expired_days": 1, "expired_gap_boundary": 2}),
        "the pass does what the dry run said"
    );
    assert_eq!(inspect()["active_day_count"], 0);
}

#[test]
fn unreachable_redis_exits_2() {
    let out = run(
        "redis://127.0.0.1:1",
        &["scan", "--user", "u", "--epoch", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    // Off a terminal the error is SPEC 8.2's JSON object on stdout.
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(error["error"]["kind"], "unavailable", "{error}");
    assert!(
        error["error"]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("redis"),
        "{error}"
    );
}

/// `rediss://` end to end: a redis-server serving TLS with a certificate from a test CA; the
/// client verifies it against that CA (`SSL_CERT_FILE`, honoured by the platform TLS library) and
/// refuses it without.
#[test]
fn rediss_verifies_the_server_certificate() {
    let dir = std::env::temp_dir().join(format!("mm-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl is required (scripts/install-services installs it)");
        assert!(status.success(), "openssl {args:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=materializer-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);

    let port = support::redis_server::free_port().to_string();
    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let _server = RedisServer::start(
        Clock::Real,
        Listen::Unix,
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ],
    );
    let url = format!("rediss://127.0.0.1:{port}");
    let now = now_ms();

    let mut args = vec![
        "--store",
        "redis",
        "--redis-url",
        url.as_str(),
        "apply",
        "-",
    ];
    let trusted = std::process::Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(&args)
        .env("SSL_CERT_FILE", &ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut trusted = trusted;
    {
        use std::io::Write;
        trusted
            .stdin
            .take()
            .unwrap()
            .write_all(dispatch(1, now).as_bytes())
            .unwrap();
    }
    let out = trusted.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&out)[0]["outcome"], "inserted");

    args.truncate(4);
    args.extend(["inspect", "--user", "u-17", "--epoch", "3"]);
    let untrusted = std::process::Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(&args)
        .env_remove("SSL_CERT_FILE")
        .output()
        .unwrap();
    assert_eq!(
        untrusted.status.code(),
        Some(2),
        "an unknown CA must be refused"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SPEC 7.3 / issue of `explain`: a Redis mailbox whose identity index was deleted still scans
/// (a scan reads the day buckets), so `explain` judged it by the scan alone and said "nothing to
/// do", exit 0. It now names the lost piece from the store's own metadata, prints the repair and
/// exits 3; the day set deleted, the scan itself answers corrupt and `explain` says so too.
#[test]
fn explain_names_a_mailbox_with_a_lost_piece_as_damaged_with_the_repair() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let now = now_ms();
    let input = [
        dispatch(1, now),
        dispatch(2, now),
        dispatch(3, now - 86_400_000),
    ]
    .join("\n");
    let out = run(&url, &["apply", "-"], Some(&input));
    assert_eq!(out.status.code(), Some(0));

    let healthy = run(
        &url,
        &["explain", "--user", "u-17", "--output", "text"],
        None,
    );
    assert_eq!(healthy.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&healthy.stdout).contains("nothing to do"));

    assert!(server.raw("DEL mm:mbseqbucket:{u-17}:3").contains(":1"));
    let damaged = run(
        &url,
        &["explain", "--user", "u-17", "--output", "text"],
        None,
    );
    let text = String::from_utf8_lossy(&damaged.stdout);
    assert_eq!(damaged.status.code(), Some(3), "{text}");
    assert!(
        text.contains("the identity index is missing although the meta proves live groups"),
        "{text}"
    );
    assert!(
        text.contains("fix: ") && text.contains("--reset-mailboxes"),
        "{text}"
    );
    assert!(!text.contains("nothing to do"), "{text}");

    assert!(server.raw("DEL mm:mbdays:{u-17}:3").contains(":1"));
    let damaged = run(&url, &["explain", "--user", "u-17", "--json"], None);
    let report: Value = serde_json::from_slice(&damaged.stdout).expect("one JSON object");
    assert_eq!(damaged.status.code(), Some(3));
    assert_eq!(report["verdict"], "corrupt", "{report}");
    assert_eq!(report["readable"]["readable"], false, "{report}");
}
