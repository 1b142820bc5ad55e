//! The daemon's failure paths on real servers (a Kafka broker, redis-server): inputs and events
//! that must never hold a partition forever, or commit what was not final.

use crate::support;

use std::time::Duration;

use support::kafka::{committed, create_topic, produce, read_all, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{group_record, now_ms};

/// A record of `n` deliveries to distinct users, all dated a year ahead: every delivery is
/// refused (future_created_at), so the whole record goes to the dead-letter topic.
fn all_refused_record(n: usize) -> Vec<u8> {
    let future = now_ms() + 400 * 86_400_000;
    let deliveries: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"user_id": format!("f-{i}"), "epoch": 1, "mailbox_seq": 1,
                "events": [{"event_ordinal": 0, "payload": {"n": i}}]})
        })
        .collect();
    serde_json::json!({"dispatch_id": "big", "group_id": "g", "committed_at": future,
        "deliveries": deliveries})
    .to_string()
    .into_bytes()
}

/// A record of 5,000 refused deliveries (~450 KB): its dead letter's `failed_deliveries` header
/// would list every one (over 1 MB, beyond the producer's limit) and was retried forever. Now the
/// header is bounded, the dead letter is sent and the committed offset passes the record; and a
/// record larger than the dead-letter limit goes out as a marked excerpt.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_always_fit_and_the_offset_passes_them() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("dlqfit", Some(redis.url()));
    setup
        .kafka_extra
        .push("dlq_max_message_bytes = 600000".to_owned());
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let big = all_refused_record(5000);
    assert!(
        (400_000..600_000).contains(&big.len()),
        "the record is ~450 KB: {}",
        big.len()
    );
    // Malformed (wrong type at the top) and larger than the dead-letter limit.
    let huge = format!("[\"{}\"]", "z".repeat(800_000)).into_bytes();
    produce(
        &setup.topic,
        &[
            (0, big.clone()),
            (0, huge.clone()),
            (0, group_record("after", 1, "ok")),
        ],
    )
    .await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "the committed offset to pass both records",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, 1) == [3],
        || daemon.log(),
    );
    let letters = read_all(&setup.dlq_topic);
    assert_eq!(letters.len(), 2, "one dead letter per bad record");
    // Dead letters are sent as records settle, not in source order: find each by its offset.
    let of = |offset: &str| {
        letters
            .iter()
            .find(|l| l.headers.get("source_offset").map(String::as_str) == Some(offset))
            .expect("a dead letter for the offset")
    };
    let first = of("0");
    assert!(
        first.payload == big,
        "the whole record fits: it is kept ({} bytes)",
        first.payload.len()
    );
    assert_eq!(first.headers["failed_deliveries_total"], "5000");
    assert_eq!(first.headers["error_kind"], "future_created_at");
    let listed: serde_json::Value =
        serde_json::from_str(&first.headers["failed_deliveries"]).expect("JSON list");
    assert!(!listed.as_array().expect("array").is_empty());
    assert!(!first.headers.contains_key("dlq_truncated"));

    let second = of("1");
    assert_eq!(second.headers["dlq_truncated"], "true");
    assert_eq!(second.headers["dlq_original_bytes"], huge.len().to_string());
    assert_eq!(second.headers["source_offset"], "1");
    assert_eq!(second.headers["error_outcome"], "malformed");
    assert!(second.payload.len() < 600_000);
    assert_eq!(
        &second.payload[..],
        &huge[..second.payload.len()],
        "an excerpt of the record"
    );
}

/// A partition paused by a full window, revoked by a rebalance and assigned back, fetches again
/// (librdkafka keeps a partition's pause flag across assignments; the old daemon started the new
/// assignment as "not paused" and never resumed it, so the partition stopped for good).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_partition_fetches_again_after_a_rebalance() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("repause", Some(redis.url()));
    setup.max_in_flight = 2;
    setup
        .properties_extra
        .push("\"partition.assignment.strategy\" = \"range\"".to_owned());
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let first = Daemon::start(&setup);
    produce(&setup.topic, &[(0, group_record("victim", 1, "a"))]).await;
    wait_for(
        "the first record",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [1],
        || first.log(),
    );
    // Break the victim's identity index: its next delivery fails closed and blocks the window.
    let renamed = redis.raw("RENAME mm:mbseqbucket:{victim}:1 saved-index");
    assert!(renamed.starts_with("+OK"), "index moved aside: {renamed:?}");
    let mut records = vec![(0, group_record("victim", 2, "b"))];
    for seq in 1..=20 {
        records.push((0, group_record("other", seq, "c")));
    }
    produce(&setup.topic, &records).await;
    wait_for(
        "the window to fill behind the blocked mailbox",
        Duration::from_secs(60),
        || {
            first
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 1.0
        },
        || first.log(),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(committed(&setup.group, &setup.topic, 1), [1]);

    // A second instance joins (the partition is revoked and reassigned) and leaves again.
    let mut second = Daemon::start(&setup);
    wait_for(
        "the rebalance",
        Duration::from_secs(60),
        || first.log().matches("partitions assigned").count() >= 2,
        || first.log(),
    );
    std::thread::sleep(Duration::from_secs(2));
    second.terminate(Duration::from_secs(30));
    wait_for(
        "the partition to come back to the first instance",
        Duration::from_secs(60),
        || first.log().matches("partitions assigned").count() >= 3,
        || first.log(),
    );
    // Heal the mailbox: the partition must now be read to its end.
    redis.raw("RENAME saved-index mm:mbseqbucket:{victim}:1");
    wait_for(
        "the partition to be consumed to its end",
        Duration::from_secs(90),
        || committed(&setup.group, &setup.topic, 1) == [22],
        || first.log(),
    );
}

/// SPEC 7.2 "No silent stall": a fatal error of the dead-letter producer (librdkafka raises one
/// on request for tests) fails every later send. The daemon no longer resends forever with the
/// partition pinned and readiness true: readiness turns false, it drains and the run ends in an
/// error (the process exits non-zero and the orchestrator restarts it).
#[tokio::test(flavor = "multi_thread")]
#[allow(unsafe_code)] // the unsafe block below says why it is sound
async fn a_fatal_dead_letter_producer_error_ends_the_run() {
    use mailbox_materializer::daemon::http::Health;
    use mailbox_materializer::daemon::{DaemonError, ProducerHook};
    use mailbox_materializer::model::RetentionPolicy;
    use mailbox_materializer::store::memory::MemoryStore;
    use mailbox_materializer::store::SystemClock;
    use rdkafka::producer::Producer;
    use std::sync::Arc;
    use support::in_process::InProcessDaemon;

    let mut setup = DaemonSetup::new("dlqfatal", None);
    setup.max_in_flight = 64;
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut config = setup.config();
    config.kafka.shutdown_deadline_ms = 2_000;
    let store = Arc::new(MemoryStore::new(
        RetentionPolicy::default(),
        Arc::new(SystemClock),
    ));
    let hook: ProducerHook = Arc::new(|producer| {
        // SAFETY: the pointer is the live producer's handle, and the reason a C string.
        let raised = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                producer.client().native_ptr(),
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                c"test: a fatal producer error".as_ptr(),
            )
        };
        assert_eq!(
            raised,
            rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        );
    });
    let health = Arc::new(Health::default());
    let daemon = InProcessDaemon::spawn_with(&config, store, health.clone(), Some(hook));
    produce(
        &setup.topic,
        &[
            (0, group_record("ok", 1, "fine")),
            (0, b"not json".to_vec()),
        ],
    )
    .await;
    let result = daemon.wait_end(Duration::from_secs(120)).await;
    match result {
        Err(DaemonError::Stopped(reason)) => assert!(
            reason.contains("dead-letter producer failed fatally"),
            "{reason}"
        ),
        other => panic!("the run must end in the producer's fatal error: {other:?}"),
    }
    assert!(
        !health.ready(),
        "readiness is false after a fatal producer error"
    );
}
