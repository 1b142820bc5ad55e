//! SPEC 7.2 as amended, "The log decides what is newest", end to end on a real broker and
//! redis-server: positions name their log and are kept per seq, so
//!
//! - a cut-over to a new topic whose first records replace seqs of the same day: the new content
//!   wins for every user (`replaced`, never a silent `unchanged`);
//! - a replay of a replace that was dead-lettered after later records wrote other seqs of the
//!   mailbox applies it (`replaced`), and a replay of the record it replaced is `superseded`;
//! - a re-drive of a two-delivery letter after a later record rewrote the delivery that had
//!   succeeded applies only the failed delivery: the rewritten one stays rewritten.

use crate::support;

use std::time::Duration;

use crate::dlq::{dlq, said};
use serde_json::Value;
use support::cli::{replay, run_materializer};
use support::kafka::{
    committed, create_topic, produce, read_all, unique, wait_for, Daemon, DaemonSetup,
};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{now_ms, redis_store, scan_from_start};

const DAY_MS: u64 = 86_400_000;

/// One record: each delivery `(user, seq, created_at, body)` holds one event whose payload is
/// `{"body": body}`.
fn record(id: &str, deliveries: &[(&str, u64, u64, &str)]) -> Vec<u8> {
    let deliveries: Vec<Value> = deliveries
        .iter()
        .map(|(user, seq, _, body)| {
            serde_json::json!({"user_id": user, "epoch": 1, "mailbox_seq": seq,
                "events": [{"event_ordinal": 0, "payload": {"body": body}}]})
        })
        .collect();
    serde_json::json!({"dispatch_id": id, "group_id": "g",
        "committed_at": created_at_of(id), "deliveries": deliveries})
    .to_string()
    .into_bytes()
}

/// Every record of these tests is created now, except those whose id says `old` (ten days ago).
fn created_at_of(id: &str) -> u64 {
    if id.starts_with("old") {
        now_ms() - 10 * DAY_MS
    } else {
        now_ms()
    }
}

/// The `body` of each group of `user`'s mailbox, by seq.
async fn bodies(url: &str, user: &str) -> Vec<(u64, String)> {
    let store = redis_store(url).await;
    let page = scan_from_start(&store, user).await.expect("scan");
    page.groups
        .iter()
        .map(|g| {
            let body = g.events[0].payload.to_value()["body"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (g.mailbox_seq, body)
        })
        .collect()
}

/// Runs the daemon on `setup` until the group committed `end` on every partition.
fn run_until_committed(setup: &DaemonSetup, partitions: i32, end: &[i64]) -> Daemon {
    let daemon = Daemon::start(setup);
    wait_for(
        "every record committed",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, partitions) == end,
        || daemon.log(),
    );
    daemon
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_over_to_a_new_topic_replaces_same_day_content_for_every_user() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("cutover", Some(redis.url()));
    let tag = unique("co");
    let users: Vec<String> = (0..10).map(|i| format!("{tag}-u{i}")).collect();

    // Topic A: seqs 1..=4 of every user.
    create_topic(&setup.topic, 1).await;
    let old: Vec<(i32, Vec<u8>)> = (1..=4u64)
        .flat_map(|seq| {
            users
                .iter()
                .map(move |u| (0, record(&format!("a/{u}/{seq}"), &[(u, seq, 0, "from-a")])))
        })
        .collect();
    let offsets = produce(&setup.topic, &old).await;
    let mut daemon = run_until_committed(&setup, 1, &[offsets[offsets.len() - 1] + 1]);
    daemon.terminate(Duration::from_secs(20));

    // The deployment moves to topic B (offsets start at 0): its first records replace seq 1 of
    // every user with new content of the same day, then add seq 5.
    setup.topic = unique("cutover-b");
    create_topic(&setup.topic, 1).await;
    let mut new: Vec<(i32, Vec<u8>)> = users
        .iter()
        .map(|u| (0, record(&format!("b/{u}/1"), &[(u, 1, 0, "from-b")])))
        .collect();
    new.extend(
        users
            .iter()
            .map(|u| (0, record(&format!("b/{u}/5"), &[(u, 5, 0, "from-b")]))),
    );
    let offsets = produce(&setup.topic, &new).await;
    let mut daemon = run_until_committed(&setup, 1, &[offsets[offsets.len() - 1] + 1]);
    let metrics = daemon.metrics();
    daemon.terminate(Duration::from_secs(20));

    for user in &users {
        let held = bodies(&redis.url(), user).await;
        assert_eq!(
            held,
            vec![
                (1, "from-b".to_owned()),
                (2, "from-a".to_owned()),
                (3, "from-a".to_owned()),
                (4, "from-a".to_owned()),
                (5, "from-b".to_owned()),
            ],
            "{user}: the new topic's content wins"
        );
    }
    let count = |outcome: &str| {
        metrics.get(&format!(
            "materializer_groups_total{{outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(count("replaced"), users.len() as f64);
    assert_eq!(count("inserted"), users.len() as f64);
    assert_eq!(count("unchanged"), 0.0);
    assert_eq!(count("superseded"), 0.0);
    assert!(
        read_all(&setup.dlq_topic).is_empty(),
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_a_dead_lettered_replace_applies_and_the_replaced_record_is_superseded() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("replaydl", Some(redis.url()));
    setup.kafka_extra.push("max_record_bytes = 4096".to_owned());
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let user = unique("rd");
    let big = "b".repeat(6 * 1024);
    let records = vec![
        (0, record("r0", &[(&user, 1, 0, "a")])),
        (0, record("r1", &[(&user, 1, 0, &big)])),
        (0, record("r2", &[(&user, 2, 0, "c")])),
    ];
    let offsets = produce(&setup.topic, &records).await;
    assert_eq!(offsets, vec![0, 1, 2]);
    let mut daemon = run_until_committed(&setup, 1, &[3]);
    daemon.terminate(Duration::from_secs(20));
    assert_eq!(read_all(&setup.dlq_topic).len(), 1, "the large replace");
    assert_eq!(
        bodies(&redis.url(), &user).await,
        vec![(1, "a".to_owned()), (2, "c".to_owned())]
    );

    // The operator raises the limit and replays the dead-lettered record.
    setup.kafka_extra = vec!["max_record_bytes = 65536".to_owned()];
    let config = setup.config_file(free_port());
    let (out, summary) = replay(
        &config,
        &["--partition", "0", "--from-offset", "1", "--to-offset", "1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(summary["groups"]["replaced"], 1, "{summary}");
    assert_eq!(
        bodies(&redis.url(), &user).await,
        vec![(1, big.clone()), (2, "c".to_owned())],
        "the log says seq 1 is the large version"
    );

    // A replay of the record it replaced (offset 0) is superseded: the seq's version came from
    // offset 1 of the same log and partition.
    let (out, summary) = replay(
        &config,
        &["--partition", "0", "--from-offset", "0", "--to-offset", "0"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(summary["groups"]["superseded"], 1, "{summary}");
    // The whole partition again: every record is unchanged or superseded, nothing reverts.
    let (out, summary) = replay(&config, &["--partition", "0", "--from-offset", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(summary["groups"]["superseded"], 1, "{summary}");
    assert_eq!(summary["groups"]["unchanged"], 2, "{summary}");
    assert_eq!(
        bodies(&redis.url(), &user).await,
        vec![(1, big), (2, "c".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redrive_applies_only_the_failed_delivery_and_never_reverts_a_later_rewrite() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("redrive2", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let tag = unique("r2");
    let (u1, u2) = (format!("{tag}-u1"), format!("{tag}-u2"));
    // A span of 5 days: u2's group of ten days ago makes a group of today span 10 days.
    setup.sections_extra = vec!["[retention]\nmax_active_span_days = 5".to_owned()];
    let narrow = setup.config_file(free_port());
    let seeded = run_materializer(
        &["--config", narrow.to_str().expect("path"), "apply"],
        Some(&format!(
            "{}\n",
            String::from_utf8(record("old-seed", &[(&u2, 1, 0, "seed")])).expect("utf-8")
        )),
    );
    assert!(seeded.status.success(), "{}", said(&seeded));

    // Offset 0: u1 seq 1 "a" (applied) and u2 seq 2 (refused: span). Offset 1 rewrites u1 seq 1.
    let records = vec![
        (0, record("d0", &[(&u1, 1, 0, "a"), (&u2, 2, 0, "late")])),
        (0, record("d1", &[(&u1, 1, 0, "b")])),
    ];
    let offsets = produce(&setup.topic, &records).await;
    let mut daemon = run_until_committed(&setup, 1, &[offsets[1] + 1]);
    daemon.terminate(Duration::from_secs(20));
    let letters = read_all(&setup.dlq_topic);
    assert_eq!(letters.len(), 1, "the record with u2's refused delivery");
    assert_eq!(
        bodies(&redis.url(), &u1).await,
        vec![(1, "b".to_owned())],
        "the later record rewrote u1 seq 1"
    );

    // The cause is fixed (a wider span) and the letter re-driven: only u2's delivery applies.
    setup.sections_extra.clear();
    let wide = setup.config_file(free_port());
    let (out, lines) = dlq(&wide, &["redrive"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["result"], "applied", "{}", lines[0]);
    let deliveries = lines[0]["deliveries"].as_array().expect("deliveries");
    assert_eq!(
        deliveries.len(),
        1,
        "only the failed delivery: {deliveries:?}"
    );
    assert_eq!(deliveries[0]["user_id"], u2.as_str());
    assert_eq!(deliveries[0]["outcome"], "inserted");
    assert_eq!(
        bodies(&redis.url(), &u1).await,
        vec![(1, "b".to_owned())],
        "u1 seq 1 stays rewritten"
    );
    assert_eq!(
        bodies(&redis.url(), &u2).await,
        vec![(1, "seed".to_owned()), (2, "late".to_owned())]
    );
    // The letter names its log, so the re-drive applied with the record's own position.
    let letter = &letters[0];
    assert!(
        letter
            .headers
            .get("source_log")
            .is_some_and(|log| log.starts_with("id:")),
        "the letter names its log: {:?}",
        letter.headers
    );
}
