//! `check-config --connect` against the real servers: a redis-server of the test's own, the
//! shared Kafka broker and the CQL server at `SCYLLA_NODES`. One line per check (`--output
//! text`; JSON off a terminal is `contract.rs`'s), exit 1 when a setting fails, 2 when a server
//! does not answer, and each failure says what is wrong.

use crate::support;

use std::path::PathBuf;
use std::process::Output;

use support::cli::run_materializer;
use support::kafka::{bootstrap, create_topic, unique};
use support::redis_server::{free_port, Clock, Listen, RedisServer};

fn scylla_nodes() -> String {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_default();
    assert!(
        !nodes.trim().is_empty(),
        "SCYLLA_NODES is not set: run the tests through scripts/test (which starts a Cassandra)"
    );
    nodes
}

/// A config file naming the broker, `topic` and `dlq` (memory store unless flags say otherwise).
fn config(name: &str, brokers: &str, topic: &str, dlq: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique(name));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("materializer.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\ndlq_topic = \"{dlq}\"\n\
             [store.redis]\nconnect_timeout_ms = 2000\ncommand_timeout_ms = 2000\n\
             [store.scylla]\nconnect_timeout_ms = 5000\n"
        ),
    )
    .expect("write config");
    path
}

fn check(config: &std::path::Path, flags: &[&str]) -> (i32, Vec<String>) {
    let mut args = vec![
        "check-config",
        "--connect",
        "--output",
        "text",
        "--config",
        config.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let out: Output = run_materializer(&args, None);
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (out.status.code().unwrap_or(-1), lines)
}

/// The line of the check whose name starts with `name`.
fn line<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l[6..].starts_with(name))
        .unwrap_or_else(|| panic!("no `{name}` check in {lines:#?}"))
}

async fn topics(name: &str) -> (String, String) {
    let topic = unique(&format!("{name}-dispatch"));
    let dlq = unique(&format!("{name}-dlq"));
    create_topic(&topic, 3).await;
    create_topic(&dlq, 1).await;
    (topic, dlq)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_check_passes_on_the_memory_store_and_a_live_broker() {
    let (topic, dlq) = topics("cc-ok").await;
    let config = config("cc-ok", &bootstrap(), &topic, &dlq);
    let (code, lines) = check(&config, &[]);
    assert_eq!(code, 0, "{lines:#?}");
    assert_eq!(lines.len(), 12, "eleven checks and a summary: {lines:#?}");
    assert!(line(&lines, "config").starts_with("ok "));
    // No cgroup memory limit here: the check says what a catch-up may take (docs/operations.md
    // "Memory").
    assert!(line(&lines, "memory").starts_with("ok "));
    assert!(line(&lines, "memory").contains("164 MiB"), "{lines:#?}");
    assert!(line(&lines, "store (memory)").starts_with("ok "));
    assert!(line(&lines, "kafka brokers").contains("1 broker(s)"));
    assert!(line(&lines, &format!("kafka topic {topic}")).ends_with("3 partition(s)"));
    assert!(line(&lines, &format!("kafka dead-letter topic {dlq}")).ends_with("1 partition(s)"));
    // The broker's default policy: records leave only by retention, a repair can rebuild.
    let policy = line(&lines, &format!("kafka topic cleanup.policy {topic}"));
    assert!(
        policy.starts_with("ok    ") && policy.contains("delete"),
        "{policy}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("11 of 11 checks passed")
    );
    // The anonymous user of the plaintext listener is a super user: every ACL is granted.
    for acl in [
        format!("Read on topic {topic}"),
        format!("DescribeConfigs on topic {topic}"),
        "Read on group mailbox-materializer".to_owned(),
        format!("Write on topic {dlq}"),
    ] {
        assert!(
            line(&lines, &format!("kafka ACL: {acl}")).starts_with("ok    "),
            "{lines:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_fails_its_check_and_is_not_created() {
    let (topic, _) = topics("cc-missing").await;
    let absent = unique("cc-absent-dlq");
    let config = config("cc-missing", &bootstrap(), &topic, &absent);
    let (code, lines) = check(&config, &[]);
    assert_eq!(code, 1, "{lines:#?}");
    let dlq = line(&lines, &format!("kafka dead-letter topic {absent}"));
    assert!(dlq.starts_with("FAIL"), "{dlq}");
    assert!(dlq.contains("create it"), "{dlq}");
    assert!(line(&lines, &format!("kafka topic {topic}")).starts_with("ok "));
    // Asking about it did not create it: a second check fails the same way.
    let (code, lines) = check(&config, &[]);
    assert_eq!(code, 1);
    assert!(line(&lines, &format!("kafka dead-letter topic {absent}")).starts_with("FAIL"));
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_brokers_fail_with_what_to_check() {
    let port = free_port();
    let config = config("cc-nobroker", &format!("127.0.0.1:{port}"), "t", "t.dlq");
    let (code, lines) = check(&config, &[]);
    // Not a setting to fix but a server that does not answer: retry (SPEC 8.2).
    assert_eq!(code, 2, "{lines:#?}");
    let brokers = line(&lines, "kafka brokers");
    assert!(brokers.starts_with("FAIL"), "{brokers}");
    assert!(brokers.contains("kafka.brokers"), "{brokers}");
    assert!(lines.last().unwrap().contains("fix the FAIL lines"));
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_is_pinged_and_every_script_loaded_then_a_dead_server_fails() {
    let (topic, dlq) = topics("cc-redis").await;
    let port = free_port();
    let mut redis = RedisServer::start(Clock::Real, Listen::Tcp(port), &[]);
    let url = format!("redis://127.0.0.1:{port}");
    let config = config("cc-redis", &bootstrap(), &topic, &dlq);
    redis.raw("SCRIPT FLUSH");
    let (code, lines) = check(&config, &["--store", "redis", "--redis-url", &url]);
    assert_eq!(code, 0, "{lines:#?}");
    let store = line(&lines, "store (redis)");
    assert!(store.contains("PING answered"), "{store}");
    assert!(store.contains("6 scripts loaded"), "{store}");
    // The scripts really are in the server's cache now (it was flushed before the check).
    let memory = redis.raw("INFO memory");
    let scripts_line = memory
        .lines()
        .find(|l| l.starts_with("number_of_cached_scripts:"))
        .expect("number_of_cached_scripts in INFO memory");
    let cached: u32 = scripts_line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(cached >= 6, "{scripts_line}");

    redis.stop();
    let (code, lines) = check(&config, &["--store", "redis", "--redis-url", &url]);
    // A server that does not answer: retry (SPEC 8.2).
    assert_eq!(code, 2, "{lines:#?}");
    let store = line(&lines, "store (redis)");
    assert!(store.starts_with("FAIL"), "{store}");
    assert!(store.contains("127.0.0.1"), "{store}");
    // The brokers are still checked and reported.
    assert!(line(&lines, &format!("kafka topic {topic}")).starts_with("ok "));
}

#[tokio::test(flavor = "multi_thread")]
async fn scylla_keyspace_is_checked_and_a_mismatched_schema_fails() {
    let (topic, dlq) = topics("cc-scylla").await;
    let nodes = scylla_nodes();
    let config = config("cc-scylla", &bootstrap(), &topic, &dlq);
    let good = format!("mm_cc_ok_{}", std::process::id());
    let bad = format!("mm_cc_bad_{}", std::process::id());

    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_nodes(nodes.split(','))
        .build()
        .await
        .expect("CQL session");
    for ks in [&good, &bad] {
        session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {ks}"), ())
            .await
            .expect("drop");
    }
    // A keyspace whose repair_registry table has the wrong column type.
    session
        .query_unpaged(
            format!("CREATE KEYSPACE {bad} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"),
            (),
        )
        .await
        .expect("create keyspace");
    session
        .query_unpaged(
            format!(
                "CREATE TABLE {bad}.repair_registry (shard int, user_id text, holder bigint, PRIMARY KEY ((shard), user_id, holder))"
            ),
            (),
        )
        .await
        .expect("create table");
    session.await_schema_agreement().await.expect("agreement");

    let flags = |ks: &str| {
        vec![
            "--store".to_owned(),
            "scylla".to_owned(),
            "--scylla-nodes".to_owned(),
            nodes.clone(),
            "--scylla-keyspace".to_owned(),
            ks.to_owned(),
        ]
    };
    let good_flags = flags(&good);
    let good_flags: Vec<&str> = good_flags.iter().map(String::as_str).collect();
    let (code, lines) = check(&config, &good_flags);
    assert_eq!(code, 0, "{lines:#?}");
    assert!(line(&lines, "store (scylla)").contains(&format!("keyspace {good}")));

    let bad_flags = flags(&bad);
    let bad_flags: Vec<&str> = bad_flags.iter().map(String::as_str).collect();
    let (code, lines) = check(&config, &bad_flags);
    assert_eq!(code, 1, "{lines:#?}");
    let store = line(&lines, "store (scylla)");
    assert!(store.starts_with("FAIL"), "{store}");
    assert!(
        store.contains("schema mismatch") && store.contains("repair_registry.holder"),
        "{store}"
    );

    for ks in [&good, &bad] {
        let _ = session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {ks}"), ())
            .await;
    }
}
