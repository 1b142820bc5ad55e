//! SPEC 7.2 "More partitions keep each user's order": the dispatch topic grows from 1 to 2
//! partitions while partition 0 holds a backlog ending with user X's seq 1 = "old"; X's next
//! record, a same-day replace of seq 1 = "new", lands on partition 1. Partition 1's one record
//! must wait until partition 0 is consumed past the records written before it, so X reads
//! "new". Without the wait partition 1's record is applied first and the backlog's older
//! record over it: X reads "old" for ever, every outcome a success.

use crate::support;

use std::time::Duration;

use mailbox_materializer::model::{MailboxId, ScanRequest, UserId};
use mailbox_materializer::store::MailboxStore;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use support::kafka::{
    bootstrap, committed, create_topic, http_get, produce, wait_for, Daemon, DaemonSetup,
};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{group_record, redis_store};

const X: &str = "grown-x";

/// Records of the backlog before X's "old" (other users, so partition 0 takes a while).
const BACKLOG: usize = 20_000;

async fn body_of_x(store: &dyn MailboxStore) -> Vec<String> {
    body_of(store, X).await
}

async fn body_of(store: &dyn MailboxStore, user: &str) -> Vec<String> {
    let page = store
        .range_scan(
            &MailboxId::new(UserId::parse(user).expect("user"), 1),
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .expect("scan");
    page.groups
        .iter()
        .flat_map(|g| g.events.iter().map(|e| e.payload.as_str().to_owned()))
        .collect()
}

pub(crate) async fn grow(topic: &str, partitions: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let results = admin
        .create_partitions(
            &[NewPartitions::new(topic, partitions)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("CreatePartitions");
    for result in results {
        result.expect("partitions added");
    }
}

/// Partition 0's backlog: `BACKLOG` records of other users, then X's seq 1 = "old".
fn backlog() -> Vec<(i32, Vec<u8>)> {
    let mut records: Vec<(i32, Vec<u8>)> = (0..BACKLOG)
        .map(|i| {
            (
                0,
                group_record(&format!("other-{}", i % 500), 1 + (i / 500) as u64, "b"),
            )
        })
        .collect();
    records.push((0, group_record(X, 1, "old")));
    records
}

fn assert_wait_named(daemon: &Daemon) {
    let log = daemon.log();
    assert!(
        log.contains("partition 1 is new to the group (the topic grew)"),
        "the wait is logged when it begins:\n{log}"
    );
    assert!(log.contains("its records flow"), "and when it ends:\n{log}");
}

/// The growth found at start: a group's first run over a topic that grew under its backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_found_at_start_applies_the_backlog_before_the_new_partition() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-start", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    produce(&setup.topic, &backlog()).await;
    grow(&setup.topic, 2).await;
    produce(&setup.topic, &[(1, group_record(X, 1, "new"))]).await;

    let mut daemon = Daemon::start(&setup);
    // While partition 0's backlog is consumed, partition 1 waits, ready, and says so.
    wait_for(
        "/readyz names the waiting partition",
        Duration::from_secs(120),
        || {
            http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                status == 200 && body.contains("partition growth: ok, partition 1 waits")
            })
        },
        || daemon.log(),
    );
    assert_eq!(
        daemon
            .metrics()
            .get("materializer_partition_growth_waiting{partition=\"1\"}"),
        1.0
    );
    let end = BACKLOG as i64 + 1;
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(240),
        || committed(&setup.group, &setup.topic, 2) == vec![end, 1],
        || daemon.log(),
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        body_of_x(&store).await,
        vec!["{\"body\":\"new\"}".to_owned()],
        "the replace on the new partition is the last write of seq 1"
    );
    assert_wait_named(&daemon);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// The growth seen while running: the daemon consumed and committed partition 0, is frozen
/// while the backlog, the growth and the replace arrive, and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_seen_while_running_keeps_the_users_order_and_is_visible_while_it_waits() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-live", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    produce(&setup.topic, &[(0, group_record("early", 1, "e"))]).await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the first record committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![1],
        || daemon.log(),
    );
    daemon.freeze();
    produce(&setup.topic, &backlog()).await;
    grow(&setup.topic, 2).await;
    produce(&setup.topic, &[(1, group_record(X, 1, "new"))]).await;
    daemon.thaw();

    let end = BACKLOG as i64 + 2;
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(240),
        || committed(&setup.group, &setup.topic, 2) == vec![end, 1],
        || daemon.log(),
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        body_of_x(&store).await,
        vec!["{\"body\":\"new\"}".to_owned()]
    );
    assert_wait_named(&daemon);
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_partition_growth_waiting{partition=\"1\"}"),
        0.0,
        "the gauge is back at 0 once the wait ended"
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// Three replicas: the new partition's owner is not the old partition's, and waits for the
/// group's committed offsets (or the old owner's `passed=` metadata) to reach the backlog's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_three_replicas_the_new_partitions_owner_waits_for_the_old_partitions_owner() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-fleet", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    produce(&setup.topic, &backlog()).await;
    grow(&setup.topic, 2).await;
    produce(&setup.topic, &[(1, group_record(X, 1, "new"))]).await;

    let mut fleet: Vec<Daemon> = (0..3).map(|_| Daemon::start(&setup)).collect();
    let end = BACKLOG as i64 + 1;
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(240),
        || committed(&setup.group, &setup.topic, 2) == vec![end, 1],
        || {
            fleet
                .iter()
                .map(Daemon::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        },
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(
        body_of_x(&store).await,
        vec!["{\"body\":\"new\"}".to_owned()]
    );
    assert!(
        fleet.iter().any(|d| d
            .log()
            .contains("partition 1 is new to the group (the topic grew)")),
        "one replica waited for partition 1"
    );
    for daemon in &mut fleet {
        assert!(daemon.terminate(Duration::from_secs(30)).success());
    }
}

/// A corrupt mailbox on the old partition holds that partition's committed offset at its
/// record; the records past it are applied again by the partition's next owner, so the new
/// partition waits until the repair (a new partition's record applied before them would be
/// reverted by that re-read). The wait is named meanwhile, and ends with the repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_mailbox_on_the_old_partition_holds_the_new_one_until_its_repair() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-corrupt", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let first: Vec<(i32, Vec<u8>)> = (1..=3).map(|s| (0, group_record("hot", s, "h"))).collect();
    produce(&setup.topic, &first).await;
    let mut fleet: Vec<Daemon> = (0..2).map(|_| Daemon::start(&setup)).collect();
    let logs = |fleet: &[Daemon]| {
        fleet
            .iter()
            .map(Daemon::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    wait_for(
        "hot's first records committed",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == vec![3],
        || logs(&fleet),
    );
    let deleted = redis.raw("DEL mm:mbseqbucket:{hot}:1");
    assert!(deleted.contains(":1"), "deleted: {deleted}");
    // hot's next record fails closed at offset 3 and holds partition 0's commit there.
    let mut later = vec![(0, group_record("hot", 4, "h"))];
    later.extend((0..2_000).map(|i| (0, group_record(&format!("o{}", i % 50), 1 + i / 50, "b"))));
    later.push((0, group_record(X, 1, "old")));
    produce(&setup.topic, &later).await;
    grow(&setup.topic, 2).await;
    produce(&setup.topic, &[(1, group_record(X, 1, "new"))]).await;

    wait_for(
        "partition 1 waiting, named",
        Duration::from_secs(120),
        || {
            fleet.iter().any(|d| {
                http_get(d.http_port, "/readyz")
                    .is_some_and(|(_, body)| body.contains("partition 1 waits"))
            })
        },
        || logs(&fleet),
    );
    let store = redis_store(&redis.url()).await;
    assert_eq!(committed(&setup.group, &setup.topic, 2), vec![3, -1]);
    support::cli::repair(
        &setup.config_file(support::redis_server::free_port()),
        0,
        "hot",
    );
    wait_for(
        "both partitions committed to their ends after the repair",
        Duration::from_secs(240),
        || committed(&setup.group, &setup.topic, 2) == vec![2_005, 1],
        || logs(&fleet),
    );
    assert_eq!(
        body_of_x(&store).await,
        vec!["{\"body\":\"new\"}".to_owned()]
    );
    assert!(logs(&fleet).contains("partition 1's older partitions are consumed past"));
    for daemon in &mut fleet {
        assert!(daemon.terminate(Duration::from_secs(30)).success());
    }
}

/// The same on Scylla: a growth found at start, partition 1's replace applied last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_scylla_a_growth_found_at_start_applies_the_backlog_first() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmd_growth_{}", std::process::id());
    let mut setup = DaemonSetup::new("growth-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records: Vec<(i32, Vec<u8>)> = (0..2_000)
        .map(|i| {
            (
                0,
                group_record(&format!("s{}", i % 100), 1 + (i / 100) as u64, "b"),
            )
        })
        .collect();
    records.push((0, group_record(X, 1, "old")));
    produce(&setup.topic, &records).await;
    grow(&setup.topic, 2).await;
    produce(&setup.topic, &[(1, group_record(X, 1, "new"))]).await;

    let mut daemon = Daemon::start(&setup);
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(240),
        || committed(&setup.group, &setup.topic, 2) == vec![2_001, 1],
        || daemon.log(),
    );
    let store = support::reference::scylla_store(&nodes, &keyspace).await;
    assert_eq!(
        body_of_x(&store).await,
        vec!["{\"body\":\"new\"}".to_owned()]
    );
    assert_wait_named(&daemon);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    support::reference::drop_scylla_keyspace(&store).await;
}

/// A growth from 4 to 8 partitions under load, seen by two running replicas, under each
/// rebalance protocol the product supports: each of eight users' replace on a new partition is
/// applied after the user's older record on its old partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_from_4_to_8_under_every_rebalance_protocol_keeps_each_users_order() {
    for protocol in ["range", "cooperative-sticky", "consumer"] {
        let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
        let mut setup = DaemonSetup::new(&format!("growth-8-{protocol}"), Some(redis.url()));
        if protocol == "consumer" {
            setup.group_properties.clear();
            setup
                .properties_extra
                .push("\"group.protocol\" = \"consumer\"".to_owned());
        } else {
            setup.properties_extra.push(format!(
                "\"partition.assignment.strategy\" = \"{protocol}\""
            ));
        }
        create_topic(&setup.topic, 4).await;
        create_topic(&setup.dlq_topic, 1).await;
        let mut fleet: Vec<Daemon> = (0..2).map(|_| Daemon::start(&setup)).collect();
        let logs = |fleet: &[Daemon]| {
            fleet
                .iter()
                .map(Daemon::log)
                .collect::<Vec<_>>()
                .join("\n---\n")
        };
        // A backlog on every old partition, each ending with two users' "old".
        let mut backlog: Vec<(i32, Vec<u8>)> = Vec::new();
        for i in 0..8_000u64 {
            let p = (i % 4) as i32;
            backlog.push((
                p,
                group_record(&format!("l{p}-{}", i % 40), 1 + i / 160, "b"),
            ));
        }
        for u in 0..8 {
            backlog.push((u % 4, group_record(&format!("mover{u}"), 1, "old")));
        }
        produce(&setup.topic, &backlog).await;
        grow(&setup.topic, 8).await;
        let moved: Vec<(i32, Vec<u8>)> = (0..8)
            .map(|u| (4 + u % 4, group_record(&format!("mover{u}"), 1, "new")))
            .collect();
        produce(&setup.topic, &moved).await;

        wait_for(
            &format!("{protocol}: all eight partitions committed to their ends"),
            Duration::from_secs(240),
            || {
                committed(&setup.group, &setup.topic, 8)
                    == vec![2_002, 2_002, 2_002, 2_002, 2, 2, 2, 2]
            },
            || logs(&fleet),
        );
        let store = redis_store(&redis.url()).await;
        for u in 0..8 {
            let page = store
                .range_scan(
                    &MailboxId::new(UserId::parse(&format!("mover{u}")).expect("user"), 1),
                    ScanRequest {
                        after_seq: 0,
                        until_seq: None,
                        limit_groups: 10,
                    },
                )
                .await
                .expect("scan");
            let bodies: Vec<&str> = page
                .groups
                .iter()
                .flat_map(|g| g.events.iter().map(|e| e.payload.as_str()))
                .collect();
            assert_eq!(bodies, vec!["{\"body\":\"new\"}"], "{protocol}: mover{u}");
        }
        for daemon in &mut fleet {
            assert!(daemon.terminate(Duration::from_secs(30)).success());
        }
    }
}

/// SPEC 7.2, "the same holds for `replay` over a range that spans a growth": partition 0 holds
/// X's seq 1 = "old" and partition 1, after the growth, X's replace "new" and seq 2. A replay of
/// partition 0 alone would put "old" over "new" (a write from another partition applies), and a
/// rebuild of either partition alone would drop the other's share of X's history: each is
/// refused before anything is touched, naming the partitions and the order. The order it names
/// ends as the log says. A user whose seqs merely spread over both partitions replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_over_a_growth_refuses_and_the_order_it_names_ends_with_the_replace() {
    use support::cli::replay;
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-replay", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    produce(
        &setup.topic,
        &[
            (0, group_record("stays", 1, "s")),
            (0, group_record(X, 1, "old")),
            (0, group_record("stays", 2, "s")),
            (0, group_record("spread", 1, "p")),
        ],
    )
    .await;
    grow(&setup.topic, 2).await;
    produce(
        &setup.topic,
        &[
            (1, group_record(X, 1, "new")),
            (1, group_record(X, 2, "two")),
            (1, group_record("spread", 2, "q")),
        ],
    )
    .await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 2) == vec![4, 3],
        || daemon.log(),
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    let store = redis_store(&redis.url()).await;
    let as_the_log_says = vec![
        "{\"body\":\"new\"}".to_owned(),
        "{\"body\":\"two\"}".to_owned(),
    ];
    assert_eq!(body_of_x(&store).await, as_the_log_says);

    let config = setup.config_file(support::redis_server::free_port());
    // `replay --partition P --from-offset 0`, for `user` alone when given, with `flags`.
    let args = |partition: &'static str, user: Option<&'static str>, flags: &[&'static str]| {
        let mut all = vec!["--partition", partition, "--from-offset", "0"];
        if let Some(user) = user {
            all.extend(["--user", user]);
        }
        all.extend_from_slice(flags);
        all.extend(["--progress", "off"]);
        all
    };
    let refused = |args: &[&str], names: &[&str]| {
        let (out, summary) = replay(&config, args);
        assert_eq!(out.status.code(), Some(1), "{args:?} is refused: {summary}");
        assert_eq!(
            summary["refused"]["reason"], "user_on_other_partition",
            "{args:?}: {summary}"
        );
        let detail = summary["refused"]["detail"].as_str().unwrap_or_default();
        for name in names {
            assert!(
                detail.contains(name),
                "{args:?}: the refusal names {name}: {detail}"
            );
        }
        summary
    };
    // Every delivery of partition 0 again: X's "old" would win over partition 1's "new".
    refused(
        &args("0", None, &[]),
        &[X, "partition 1 (offset 0)", "--allow-other-partitions"],
    );
    // A rebuild of X from either partition alone.
    refused(
        &args("0", Some(X), &["--reset-mailboxes"]),
        &["partition 1 (offset 0)", "partitions 0, 1 in this order"],
    );
    refused(
        &args("1", Some(X), &["--reset-mailboxes"]),
        &["partition 0 (offset 1)", "partitions 0, 1 in this order"],
    );
    assert_eq!(
        body_of_x(&store).await,
        as_the_log_says,
        "refused: nothing touched"
    );

    // The newest partition replays alone: its records are the newest of their users.
    let (out, summary) = replay(&config, &args("1", None, &[]));
    assert!(out.status.success(), "{summary}");
    // A user of partition 0 only is not held by X, nor one whose seqs merely spread over both
    // partitions (nothing partition 0 writes is written again on partition 1).
    for user in ["stays", "spread"] {
        let (out, summary) = replay(&config, &args("0", Some(user), &[]));
        assert!(out.status.success(), "{user}: {summary}");
    }
    assert_eq!(body_of_x(&store).await, as_the_log_says);

    // The order the refusal names: the rebuild from the lowest partition, then the next one.
    let (out, summary) = replay(
        &config,
        &args(
            "0",
            Some(X),
            &["--reset-mailboxes", "--allow-other-partitions"],
        ),
    );
    assert!(out.status.success(), "{summary}");
    assert_eq!(summary["swapped_users"][0], X);
    let (out, summary) = replay(&config, &args("1", Some(X), &[]));
    assert!(out.status.success(), "{summary}");
    assert_eq!(body_of_x(&store).await, as_the_log_says);
}

/// A growth under steady load with no backlog (SPEC 7.2: "bounded by the old partitions'
/// backlog"): 40 users, each record a same-day replace of the user's seq 1, 100 records a
/// second; after 3 s the topic grows to 2 partitions and half the users move to partition 1.
/// Every user ends with its last record's content, and the old partition never stops. The
/// pause is measured, not asserted: how long after it was produced partition 1's first record
/// and partition 0's record produced beside it were committed, and the wait the daemon logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_under_steady_load_keeps_each_users_order_and_the_old_partition_flowing() {
    use std::collections::BTreeMap;
    use std::time::Instant;
    const USERS: usize = 40;
    const TICKS: usize = 60;
    const GROW_AT: usize = 30;
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("growth-steady", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut daemon = Daemon::start(&setup);
    produce(&setup.topic, &[(0, group_record("steady-start", 1, "s"))]).await;
    wait_for(
        "the daemon consumes",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![1],
        || daemon.log(),
    );

    // One producer for the whole load, as a service's would be (one per batch would spend
    // the run in producer start-ups).
    let new_producer = || -> rdkafka::producer::FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("linger.ms", "5")
            .create()
            .expect("producer")
    };
    let mut producer = new_producer();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut ends = [1_i64, 0];
    let mut watch: Option<tokio::task::JoinHandle<(Duration, Duration)>> = None;
    for tick in 0..TICKS {
        if tick == GROW_AT {
            grow(&setup.topic, 2).await;
            // A producer that knows the new partition (librdkafka refuses a partition its
            // metadata does not have yet).
            producer = new_producer();
        }
        let grown = tick >= GROW_AT;
        let batch: Vec<(i32, Vec<u8>)> = (0..10)
            .map(|i| {
                let u = (tick * 10 + i) % USERS;
                let user = format!("steady-{u}");
                let body = format!("t{tick}");
                last.insert(user.clone(), format!("{{\"body\":\"{body}\"}}"));
                let partition = i32::from(grown && u % 2 == 1);
                (partition, group_record(&user, 1, &body))
            })
            .collect();
        let produced_at = Instant::now();
        let mut offsets = Vec::with_capacity(batch.len());
        for (partition, payload) in &batch {
            let sent = producer
                .send(
                    rdkafka::producer::FutureRecord::<(), [u8]>::to(&setup.topic)
                        .partition(*partition)
                        .payload(&payload[..]),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("delivered");
            offsets.push(sent.offset);
        }
        let mut first = [None, None];
        for ((partition, _), offset) in batch.iter().zip(&offsets) {
            let p = usize::try_from(*partition).expect("partition");
            first[p].get_or_insert(*offset);
            ends[p] = ends[p].max(offset + 1);
        }
        if let (None, [Some(o0), Some(o1)]) = (&watch, first) {
            // When each partition's record of this batch is committed.
            let (group, topic) = (setup.group.clone(), setup.topic.clone());
            watch = Some(tokio::task::spawn_blocking(move || {
                let mut seen: [Option<Duration>; 2] = [None, None];
                while seen.iter().any(Option::is_none)
                    && produced_at.elapsed() < Duration::from_secs(120)
                {
                    let now = committed(&group, &topic, 2);
                    for (p, offset) in [o0, o1].into_iter().enumerate() {
                        if seen[p].is_none() && now[p] > offset {
                            seen[p] = Some(produced_at.elapsed());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                (
                    seen[0].expect("partition 0 committed"),
                    seen[1].expect("partition 1 committed"),
                )
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(
        "both partitions committed to their ends",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 2) == ends.to_vec(),
        || daemon.log(),
    );
    let store = redis_store(&redis.url()).await;
    for (user, body) in &last {
        assert_eq!(
            &body_of(&store, user).await,
            &vec![body.clone()],
            "{user} reads its last record"
        );
    }
    let (old, new) = watch
        .expect("a batch on both partitions")
        .await
        .expect("watch");
    let log = daemon.log();
    let waited = log.lines().find(|l| l.contains("its records flow")).map_or(
        "no wait logged (the first check found the older partition committed)",
        |l| l,
    );
    eprintln!(
        "growth under steady load: produced to committed, partition 0 {old:?}, partition 1 (new) {new:?}; {waited}"
    );
    assert_eq!(
        daemon
            .metrics()
            .get("materializer_partition_growth_waiting{partition=\"1\"}"),
        0.0
    );
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}
