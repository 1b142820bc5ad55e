//! SPEC 7.1 as amended: a repair never trusts a compacted log. On a real broker whose log cleaner
//! really ran, `replay --reset-mailboxes` is refused before anything is touched (the live mailbox
//! byte-identical), `check-config --connect` FAILs and the daemon exports
//! `materializer_topic_compacted 1`; `compact,delete` is refused too; the same topic with
//! `cleanup.policy=delete` repairs as before; and a replay without reset re-applies what is left,
//! saying how many offsets of the range held no record.

use crate::support;

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use mailbox_materializer::model::UserId;
use support::cli::run_materializer;
use support::kafka::{bootstrap, committed, create_topic, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{now_ms, redis_store, scan_seqs};

/// The user whose history compaction removes.
const USER: &str = "cx";
/// Its records: seqs 1..=HISTORY.
const HISTORY: u64 = 100;

fn group_record(user: &str, seq: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": format!("{user}-{seq}")}}]}]
    })
    .to_string()
    .into_bytes()
}

/// A one-partition topic with `cleanup.policy` = `policy` and segments that roll after 100 ms,
/// cleaned as soon as anything is dirty (the broker looks for work every second).
async fn create_topic_with_policy(name: &str, policy: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let topic = NewTopic::new(name, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", policy)
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.001");
    for result in admin
        .create_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create topic")
    {
        result.expect("topic created");
    }
}

/// Produces `(key, payload)` records to partition 0, in order, keyed by user as upstream
/// producers key dispatch records.
async fn produce_keyed(topic: &str, records: &[(String, Vec<u8>)]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut acks = Vec::new();
    for (key, payload) in records {
        let record = FutureRecord::to(topic)
            .partition(0)
            .key(key)
            .payload(&payload[..]);
        acks.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("enqueue"),
        );
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    for ack in acks {
        ack.await.expect("ack").expect("delivered");
    }
}

/// `USER`'s history, then records of other users produced over a few seconds so the segments
/// holding the history roll and become cleanable. Returns the partition's end.
async fn write_history(topic: &str) -> i64 {
    let history: Vec<(String, Vec<u8>)> = (1..=HISTORY)
        .map(|seq| (USER.to_owned(), group_record(USER, seq)))
        .collect();
    produce_keyed(topic, &history).await;
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let others: Vec<(String, Vec<u8>)> = (0..10)
            .map(|i| {
                let user = format!("other-{round}-{i}");
                (user.clone(), group_record(&user, 1))
            })
            .collect();
        produce_keyed(topic, &others).await;
    }
    HISTORY as i64 + 60
}

/// How many records keyed `key` partition 0 of `topic` holds now, read from its start to `end`.
fn records_of(topic: &str, key: &str, end: i64) -> usize {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", support::kafka::unique("compaction-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("tpl");
    consumer.assign(&tpl).expect("assign");
    let mut found = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                if message.key() == Some(key.as_bytes()) {
                    found += 1;
                }
                if message.offset() + 1 >= end {
                    return found;
                }
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    panic!("{topic} was not read to {end} within 30 s")
}

/// Waits until the log cleaner removed all but the newest of `USER`'s records.
fn wait_for_compaction(topic: &str, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = records_of(topic, USER, end);
        if left == 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the log cleaner did not compact {topic} within 120 s ({left} of {USER}'s {HISTORY} records left)"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A config file of a Redis-backed replay or daemon of `setup`.
fn replay(setup: &DaemonSetup, args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let config = setup.config_file(free_port());
    support::cli::replay(
        &config,
        &[&["--partition", "0", "--progress", "off"], args].concat(),
    )
}

/// `replay --reset-mailboxes` of `USER` from offset 0, then `extra`.
fn repair(setup: &DaemonSetup, extra: &[&str]) -> (std::process::Output, serde_json::Value) {
    replay(
        setup,
        &[
            &["--from-offset", "0", "--user", USER, "--reset-mailboxes"],
            extra,
        ]
        .concat(),
    )
}

async fn fingerprint(url: &str) -> Vec<(String, Vec<u8>, i64)> {
    redis_store(url)
        .await
        .dump_user(&UserId::parse(USER).expect("user"), &[1])
        .await
        .expect("dump")
}

/// An operator's compacted topic: 100 records of `cx` applied by the daemon, 99 compacted away;
/// the repair is refused with the policy named, nothing touched, check-config FAILs, the daemon
/// says so, and a replay without reset still works and counts the offsets left empty.
#[tokio::test(flavor = "multi_thread")]
async fn a_repair_on_a_compacted_topic_whose_cleaner_ran_is_refused_and_touches_nothing() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("compacted", Some(redis.url()));
    create_topic_with_policy(&setup.topic, "compact").await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start(&setup);

    let end = write_history(&setup.topic).await;
    wait_for(
        "every record committed",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, 1) == [end],
        || daemon.log(),
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        scan_seqs(&store, USER).await,
        (1..=HISTORY).collect::<Vec<_>>()
    );
    wait_for_compaction(&setup.topic, end);

    // The daemon read the policy at start (and on its assignment) and says it.
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_topic_compacted"),
        1.0,
        "{}",
        metrics.text
    );
    assert!(
        daemon.log().contains("cleanup.policy=compact"),
        "no warning in the daemon's log: {}",
        daemon.log()
    );

    let before = fingerprint(&redis.url()).await;
    let (out, summary) = repair(&setup, &[]);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["refused"]["reason"], "compacted_topic", "{summary}");
    let detail = summary["refused"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("cleanup.policy=compact") && detail.contains(&setup.topic),
        "{detail}"
    );
    assert_eq!(summary["swapped_users"], serde_json::json!([]), "{summary}");
    assert_eq!(
        fingerprint(&redis.url()).await,
        before,
        "the live mailbox changed"
    );
    assert_eq!(scan_seqs(&store, USER).await.len(), HISTORY as usize);
    // Nothing to override it with: --allow-partial-history and --allow-empty do not apply.
    let (out, summary) = repair(&setup, &["--allow-partial-history", "--allow-empty"]);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["refused"]["reason"], "compacted_topic", "{summary}");
    assert_eq!(fingerprint(&redis.url()).await, before);

    // check-config --connect FAILs on the policy line, and names it.
    let config = setup.config_file(free_port());
    let out = run_materializer(
        &[
            "check-config",
            "--connect",
            "--output",
            "text",
            "--config",
            config.to_str().expect("path"),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("kafka topic cleanup.policy {}", setup.topic)))
        .unwrap_or_else(|| panic!("no cleanup.policy line: {text}"));
    assert!(line.starts_with("FAIL"), "{line}");
    assert!(line.contains("cleanup.policy=compact"), "{line}");

    // A replay without reset re-applies what is left (it changes nothing here) and says how
    // many offsets of the range held no record.
    let (out, summary) = replay(&setup, &["--from-offset", "0"]);
    assert_eq!(out.status.code(), Some(0), "{summary}");
    let records = summary["records"].as_u64().expect("records");
    assert!(records < end as u64, "{summary}");
    assert_eq!(
        summary["offsets_without_record"].as_u64(),
        Some(end as u64 - records),
        "{summary}"
    );
    assert_eq!(scan_seqs(&store, USER).await.len(), HISTORY as usize);
}

/// `compact,delete` compacts too: refused. Checked by policy alone, before the cleaner ran.
#[tokio::test(flavor = "multi_thread")]
async fn compact_and_delete_is_refused_like_compact() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("compact-delete", Some(redis.url()));
    create_topic_with_policy(&setup.topic, "compact,delete").await;
    let history: Vec<(String, Vec<u8>)> = (1..=10)
        .map(|seq| (USER.to_owned(), group_record(USER, seq)))
        .collect();
    produce_keyed(&setup.topic, &history).await;
    // Written live by a replay without reset: the rebuild below must leave it as it is.
    let (out, summary) = replay(&setup, &["--from-offset", "0"]);
    assert_eq!(out.status.code(), Some(0), "{summary}");
    assert_eq!(summary["groups"]["inserted"], 10, "{summary}");
    assert_eq!(summary["offsets_without_record"], 0, "{summary}");
    let before = fingerprint(&redis.url()).await;

    let (out, summary) = repair(&setup, &[]);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["refused"]["reason"], "compacted_topic", "{summary}");
    assert!(
        summary["refused"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cleanup.policy=compact,delete")),
        "{summary}"
    );
    assert_eq!(fingerprint(&redis.url()).await, before);
    // A dry run of the repair is refused the same way.
    let (out, summary) = repair(&setup, &["--dry-run"]);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["refused"]["reason"], "compacted_topic", "{summary}");
}

/// The same topic settings with `cleanup.policy=delete`: the repair runs as before.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_topic_with_delete_repairs_as_before() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("delete-policy", Some(redis.url()));
    create_topic_with_policy(&setup.topic, "delete").await;
    write_history(&setup.topic).await;
    let (out, summary) = repair(&setup, &[]);
    assert_eq!(out.status.code(), Some(0), "{summary}");
    assert_eq!(summary["refused"], serde_json::Value::Null, "{summary}");
    assert_eq!(
        summary["swapped_users"],
        serde_json::json!([USER]),
        "{summary}"
    );
    assert_eq!(summary["staged_groups"], HISTORY, "{summary}");
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        scan_seqs(&store, USER).await,
        (1..=HISTORY).collect::<Vec<_>>()
    );
}
