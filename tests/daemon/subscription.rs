//! A replica that consumes nothing is never green, and one that is done never looks stuck,
//! against the real broker: a missing topic turns `/readyz` 503 with the topic named and it turns
//! 200 again once the topic exists and records flow; four replicas on a three-partition topic
//! leave one idle, ready and saying so; an idle partition of a transactional topic (aborted and
//! committed transactions) ends with its committed offset at the log end and lag 0, and a
//! restart re-reads nothing.

use crate::support;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use support::kafka::{committed, create_topic, http_get, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{now_ms, redis_store, scan_seqs};

fn group_record(user: &str, seq: u64) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]
    })
    .to_string()
    .into_bytes()
}

fn readyz(daemon: &Daemon) -> (u16, String) {
    http_get(daemon.http_port, "/readyz").unwrap_or((0, String::new()))
}

/// A typo'd topic: not ready within seconds, the reason names the topic and the metrics say
/// it; once the topic is created and records flow, ready again by itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_is_not_ready_until_it_exists_and_records_flow() {
    let setup = DaemonSetup::new("missing-topic", None);
    create_topic(&setup.dlq_topic, 1).await;
    let daemon = Daemon::start(&setup);
    let expected = format!("subscription: topic {} does not exist", setup.topic);
    wait_for(
        "/readyz 503 naming the missing topic",
        Duration::from_secs(30),
        || {
            let (status, body) = readyz(&daemon);
            status == 503 && body.contains(&expected)
        },
        || format!("{:?}\n{}", readyz(&daemon), daemon.log()),
    );
    let metrics = daemon.metrics();
    assert_eq!(metrics.get("materializer_subscription_available"), 0.0);
    assert_eq!(metrics.get("materializer_topic_partitions"), 0.0);
    assert_eq!(metrics.get("materializer_assigned_partitions"), 0.0);
    assert_eq!(metrics.get("materializer_ready"), 0.0);
    assert!(
        daemon.log().contains(&format!(
            "subscription unavailable: topic {} does not exist: nothing is consumed",
            setup.topic
        )),
        "{}",
        daemon.log()
    );

    create_topic(&setup.topic, 2).await;
    let records: Vec<(i32, Vec<u8>)> = (0..10)
        .map(|i| (i % 2, group_record(&format!("u{i}"), 1)))
        .collect();
    produce(&setup.topic, &records).await;
    wait_for(
        "every record materialized",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_groups_total{outcome=\"inserted\"}")
                == 10.0
        },
        || daemon.log(),
    );
    wait_for(
        "/readyz 200 with the subscription ok",
        Duration::from_secs(30),
        || {
            let (status, body) = readyz(&daemon);
            status == 200 && body.contains("subscription: ok")
        },
        || format!("{:?}\n{}", readyz(&daemon), daemon.log()),
    );
    let metrics = daemon.metrics();
    assert_eq!(metrics.get("materializer_subscription_available"), 1.0);
    assert_eq!(metrics.get("materializer_topic_partitions"), 2.0);
    assert_eq!(metrics.get("materializer_assigned_partitions"), 2.0);
}

/// More replicas than partitions: the one left without a partition is idle, which is normal —
/// ready, and `/readyz` says why it does nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_beyond_the_partition_count_is_idle_and_ready() {
    let setup = DaemonSetup::new("idle-replica", None);
    create_topic(&setup.topic, 3).await;
    create_topic(&setup.dlq_topic, 1).await;
    let daemons: Vec<Daemon> = (0..4).map(|_| Daemon::start(&setup)).collect();
    let logs = || {
        daemons
            .iter()
            .map(|d| format!("{:?}\n{}", readyz(d), d.log()))
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    wait_for(
        "three replicas holding one partition each and one idle, all ready",
        Duration::from_secs(90),
        || {
            let states: Vec<(u16, String)> = daemons.iter().map(readyz).collect();
            let assigned: f64 = daemons
                .iter()
                .map(|d| d.metrics().get("materializer_assigned_partitions"))
                .sum();
            let idle = states
                .iter()
                .filter(|(_, body)| body.contains("subscription: idle: none of topic"))
                .count();
            states.iter().all(|(status, _)| *status == 200) && idle == 1 && assigned == 3.0
        },
        logs,
    );
}

/// Commit and abort markers count as consumed: after 10 aborted and 10 committed records the
/// committed offset is the log end (22, past the last commit marker), the lag 0, only the
/// committed records are materialized, and a restarted replica re-reads nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_transactional_partition_commits_to_the_log_end_with_no_lag() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("transactional", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut daemon = Daemon::start(&setup);

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", support::kafka::bootstrap())
        .set(
            "transactional.id",
            support::kafka::unique("materializer-test-tx"),
        )
        .create()
        .expect("transactional producer");
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).expect("init");
    for (user, commit) in [("aborted", false), ("committed", true)] {
        producer.begin_transaction().expect("begin");
        for seq in 1..=10 {
            let payload = group_record(user, seq);
            producer
                .send(
                    FutureRecord::<(), _>::to(&setup.topic)
                        .partition(0)
                        .payload(&payload),
                    timeout,
                )
                .await
                .map_err(|(e, _)| e)
                .expect("sent");
        }
        if commit {
            producer.commit_transaction(timeout).expect("commit");
        } else {
            producer.abort_transaction(timeout).expect("abort");
        }
    }
    // 10 aborted records, the abort marker, 10 committed records, the commit marker.
    let log_end = 22;
    wait_for(
        "the committed offset at the log end",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [log_end],
        || {
            format!(
                "committed {:?}\n{}",
                committed(&setup.group, &setup.topic, 1),
                daemon.log()
            )
        },
    );
    wait_for(
        "lag 0",
        Duration::from_secs(30),
        || {
            let metrics = daemon.metrics();
            metrics
                .samples
                .contains_key("materializer_consumer_lag{partition=\"0\"}")
                && metrics.get("materializer_consumer_lag{partition=\"0\"}") == 0.0
        },
        || daemon.metrics().text,
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        scan_seqs(&store, "committed").await,
        (1..=10).collect::<Vec<_>>()
    );
    assert!(scan_seqs(&store, "aborted").await.is_empty());

    daemon.terminate(Duration::from_secs(30));
    let restarted = Daemon::start(&setup);
    wait_for(
        "the restarted replica assigned and ready",
        Duration::from_secs(60),
        || {
            restarted.ready_status() == Some(200)
                && restarted.metrics().get("materializer_assigned_partitions") == 1.0
        },
        || restarted.log(),
    );
    // Give it time to read anything it would read.
    std::thread::sleep(Duration::from_secs(3));
    let metrics = restarted.metrics();
    assert_eq!(
        metrics.sum("materializer_records_total"),
        0.0,
        "the restart re-read records: {}",
        metrics.text
    );
    assert_eq!(
        metrics.get("materializer_consumer_lag{partition=\"0\"}"),
        0.0
    );
    assert_eq!(committed(&setup.group, &setup.topic, 1), [log_end]);
}
