//! SPEC 7.3 "The log deleted records before this group read them": a deployment stopped (or
//! lagging) while retention, here `DeleteRecords`, removed records it never read. On restart the
//! loss is named in an ERROR with the partition and the offsets, counted in
//! `materializer_records_lost_total{partition,reason}`, and the partition either carries on from
//! the log's start (`kafka.on_records_lost = "continue"`, the default) or waits, not ready, until
//! an operator accepts the loss (`"hold"`, then `POST /records-lost/accept?partition=0`).

use crate::support;

use std::io::{Read, Write};
use std::time::Duration;

use mailbox_materializer::model::{MailboxId, ScanRequest, UserId};
use mailbox_materializer::store::MailboxStore;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::{Offset, TopicPartitionList};
use support::kafka::{
    bootstrap, committed, create_topic, http_get, produce, wait_for, Daemon, DaemonSetup,
};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{now_ms, redis_store};

const USER: &str = "lost-u";

fn record(seq: u64, now: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{USER}/{seq}"), "group_id": "g", "committed_at": now,
        "deliveries": [{"user_id": USER, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"seq": seq}}]}]
    })
    .to_string()
    .into_bytes()
}

async fn seqs(store: &dyn MailboxStore) -> Vec<u64> {
    let page = store
        .range_scan(
            &MailboxId::new(UserId::parse(USER).expect("user"), 1),
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 100,
            },
        )
        .await
        .expect("scan");
    page.groups.iter().map(|g| g.mailbox_seq).collect()
}

/// `DeleteRecords`: every offset of partition 0 before `before` is deleted (what retention does
/// to a lagging group).
async fn delete_records_before(topic: &str, before: i64) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(before))
        .expect("offset");
    let result = admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("DeleteRecords");
    for element in result.elements() {
        assert!(
            element.error().is_ok(),
            "DeleteRecords: {:?}",
            element.error()
        );
    }
}

fn post(port: u16, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(
            format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Seqs 1..5 applied and committed (offset 5), the daemon stopped, seqs 6..10 produced at offsets
/// 5..9, and offsets before 8 deleted: seqs 6, 7, 8 were never read. Answers the store, the
/// setup and the Redis server (kept alive).
async fn a_group_overtaken_by_retention(
    name: &str,
    policy: &str,
) -> (impl MailboxStore, DaemonSetup, RedisServer) {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new(name, Some(redis.url()));
    setup
        .kafka_extra
        .push(format!("on_records_lost = \"{policy}\""));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let store = redis_store(&redis.url()).await;
    let now = now_ms();
    let first: Vec<(i32, Vec<u8>)> = (1..=5).map(|s| (0, record(s, now))).collect();
    produce(&setup.topic, &first).await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "seqs 1..5 committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![5],
        || daemon.log(),
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    let rest: Vec<(i32, Vec<u8>)> = (6..=10).map(|s| (0, record(s, now))).collect();
    produce(&setup.topic, &rest).await;
    delete_records_before(&setup.topic, 8).await;
    assert_eq!(seqs(&store).await, vec![1, 2, 3, 4, 5]);
    (store, setup, redis)
}

fn assert_loss_named(daemon: &Daemon) {
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("records lost: the log deleted offsets"))
        .unwrap_or_else(|| panic!("no records-lost ERROR in:\n{log}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("offsets 5..8 of partition 0"), "{line}");
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get(
            "materializer_records_lost_total{partition=\"0\",reason=\"committed_below_log_start\"}"
        ),
        3.0,
        "{}",
        metrics.text
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn records_deleted_before_they_were_read_are_named_counted_and_carried_past() {
    let (store, setup, _redis) = a_group_overtaken_by_retention("lost-continue", "continue").await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "seqs 9 and 10 committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    assert_loss_named(&daemon);
    assert_eq!(seqs(&store).await, vec![1, 2, 3, 4, 5, 9, 10]);
    let (status, body) = http_get(daemon.http_port, "/readyz").expect("readyz");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("records lost: ok (the last loss: partition 0 offsets 5..8, carried on)"),
        "{body}"
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread")]
async fn under_hold_a_partition_that_lost_records_waits_until_an_operator_accepts() {
    let (store, setup, _redis) = a_group_overtaken_by_retention("lost-hold", "hold").await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the loss named",
        Duration::from_secs(60),
        || {
            daemon
                .log()
                .contains("records lost: the log deleted offsets")
        },
        || daemon.log(),
    );
    assert_loss_named(&daemon);
    wait_for(
        "readiness false while held",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(503),
        || daemon.log(),
    );
    let (_, body) = http_get(daemon.http_port, "/readyz").expect("readyz");
    assert!(
        body.contains("records lost: held: partition 0 offsets 5..8"),
        "{body}"
    );
    assert_eq!(
        daemon
            .metrics()
            .get("materializer_partition_held_records_lost{partition=\"0\"}"),
        1.0
    );
    // Held: nothing past the loss applied, nothing committed past it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(seqs(&store).await, vec![1, 2, 3, 4, 5]);
    assert_eq!(committed(&setup.group, &setup.topic, 1), vec![5]);

    // Wrong requests change nothing.
    assert_eq!(post(daemon.http_port, "/records-lost/accept").0, 400);
    assert_eq!(
        post(daemon.http_port, "/records-lost/accept?partition=7").0,
        409
    );
    assert_eq!(
        http_get(daemon.http_port, "/records-lost/accept?partition=0").map(|r| r.0),
        Some(405)
    );
    assert_eq!(seqs(&store).await, vec![1, 2, 3, 4, 5]);

    // The operator's step, as docs/operations.md writes it, run as written against this replica:
    // it answers what the doc shows.
    let block = support::docs::block_with("docs/operations.md", "records-lost/accept");
    let replica = format!("127.0.0.1:{}", daemon.http_port);
    for line in support::docs::commands(&block, &[("REPLICA:9898", &replica)]) {
        let out =
            support::docs::run_line(&format!("{line} --fail-with-body --silent --show-error"));
        assert!(out.status.success(), "{line}: {out:?}");
        let answer = String::from_utf8_lossy(&out.stdout);
        for shown in support::docs::shown(&block) {
            assert!(
                answer.contains(&shown),
                "the doc shows {shown:?}; the replica answered {answer:?}"
            );
        }
    }
    wait_for(
        "seqs 9 and 10 committed once accepted",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![10],
        || daemon.log(),
    );
    assert_eq!(seqs(&store).await, vec![1, 2, 3, 4, 5, 9, 10]);
    wait_for(
        "ready again",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || {
            http_get(daemon.http_port, "/readyz")
                .map(|r| r.1)
                .unwrap_or_default()
        },
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}
