//! The daemon end to end against a real Kafka broker (a KRaft node from Maven Central, started by
//! scripts/test) and a real redis-server: `materializer run` processes, real topics, real
//! consumer groups. The expected state is always the memory reference fed the same records in
//! the same per-partition order.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::model::RetentionPolicy;
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::SystemClock;
use support::kafka::{
    committed, create_topic, produce, promtool_check, read_all, wait_for, Daemon, DaemonSetup,
};
use support::redis_server::{free_port, Clock, Listen, RedisCluster, RedisServer};
use support::reference::{
    assert_counters_match, assert_same_state, end_offsets, now_ms, redis_store, reference,
    scan_from_start, scan_seqs, stream, wait_committed, PARTITIONS,
};

/// (a) on both stores: the final state, the dead-letter topic and the counters all match the
/// reference.
async fn generated_stream_matches_reference(redis: Option<&RedisServer>, name: &str) {
    let setup = DaemonSetup::new(name, redis.map(RedisServer::url));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(30, 6, 7);
    let offsets = produce(&setup.topic, &records).await;
    let reference = reference(&records, &offsets).await;
    assert!(reference.groups.get("conflict").copied().unwrap_or(0) > 0);
    assert!(reference.records.get("malformed").copied().unwrap_or(0) > 0);

    let mut daemon = Daemon::start(&setup);
    let total = records.len() as f64;
    wait_for(
        "every record final",
        Duration::from_secs(90),
        || daemon.metrics().sum("materializer_records_total") >= total,
        || daemon.log(),
    );
    let metrics = daemon.metrics();
    promtool_check(&metrics.text);
    assert_counters_match(&reference, &metrics);
    for reason in ["malformed", "conflict"] {
        let want = reference
            .dead_letters
            .values()
            .filter(|r| r.as_str() == reason)
            .count() as f64;
        assert_eq!(
            metrics.get(&format!("materializer_dlq_total{{reason=\"{reason}\"}}")),
            want,
            "dlq_total{{reason={reason}}}"
        );
    }
    for partition in 0..PARTITIONS {
        let key = format!("materializer_consumer_lag{{partition=\"{partition}\"}}");
        wait_for(
            "consumer_lag of every partition at 0",
            Duration::from_secs(30),
            || {
                let m = daemon.metrics();
                m.samples.contains_key(&key) && m.get(&key) == 0.0
            },
            || daemon.metrics().text,
        );
    }

    // The dead-letter topic holds exactly the bad records, each with its headers.
    let dead = read_all(&setup.dlq_topic);
    let mut got = BTreeMap::new();
    for letter in &dead {
        let h = &letter.headers;
        let partition: i32 = h["source_partition"].parse().expect("partition header");
        let offset: i64 = h["source_offset"].parse().expect("offset header");
        assert_eq!(h["source_topic"], setup.topic);
        assert!(!h["error_kind"].is_empty() && !h["error_detail"].is_empty());
        let index = offsets
            .iter()
            .zip(&records)
            .position(|(o, (p, _))| *o == offset && *p == partition)
            .expect("dead letter points at a produced record");
        assert_eq!(letter.payload, records[index].1, "the original record");
        assert!(
            got.insert((partition, offset), h["error_outcome"].clone())
                .is_none(),
            "one dead letter per bad record"
        );
    }
    assert_eq!(got, reference.dead_letters);

    let status = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "SIGTERM exits 0: {status:?}");
    match redis {
        Some(server) => assert_same_state(&reference, &redis_store(&server.url()).await).await,
        None => {
            let store = MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock));
            store
                .load_snapshot(&setup.snapshot())
                .expect("the daemon saved its memory store on exit");
            assert_same_state(&reference, &store).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_stream_on_memory_matches_the_reference_dlq_and_counters() {
    generated_stream_matches_reference(None, "gen-mem").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_stream_on_redis_matches_the_reference_dlq_and_counters() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    generated_stream_matches_reference(Some(&redis), "gen-redis").await;
}

/// (b) kill -9 at several random points, then restart: same state, nothing lost, no group twice.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_points_then_restart_converges() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("kill9", Some(redis.url()));
    kill_9_rounds_converge(setup, &redis_store(&redis.url()).await).await;
}

/// (b) on a 3-master Redis Cluster (SPEC 7.2): a clean run's batches spread over every master
/// and kill -9 rounds; every mailbox ends equal to the memory reference. Before batches were
/// split by slot, every batched append was refused (CROSSSLOT) and dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_rounds_on_a_redis_cluster_converge() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster start");
    let mut setup = DaemonSetup::new("kill9cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    kill_9_rounds_converge(setup, &cluster.store().await).await;
}

/// Produces a generated stream, runs the daemon of `setup` through three kill -9 rounds at random
/// points and one run to the end, and requires `store` to equal the memory reference.
async fn kill_9_rounds_converge(
    mut setup: DaemonSetup,
    store: &dyn mailbox_materializer::store::MailboxStore,
) {
    setup.max_in_flight = 8;
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 8, 11);
    let offsets = produce(&setup.topic, &records).await;
    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);

    let seed = now_ms();
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    eprintln!("kill -9 points seeded with {seed}");
    let total = records.len() as f64;
    for round in 0..3 {
        let mut daemon = Daemon::start(&setup);
        let target = total * (0.1 + (next() % 60) as f64 / 100.0) / 3.0 * f64::from(round + 1);
        wait_for(
            "some progress before the kill",
            Duration::from_secs(60),
            || {
                daemon.metrics().sum("materializer_records_total") >= target.min(total * 0.9)
                    || committed(&setup.group, &setup.topic, PARTITIONS) == ends
            },
            || daemon.log(),
        );
        std::thread::sleep(Duration::from_millis(next() % 300));
        daemon.kill9();
    }
    let mut daemon = Daemon::start(&setup);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(120));
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    // Exactly the expected dead letters: duplicates of one record are allowed after a kill -9,
    // nothing extra (a record the store refused) and nothing missing.
    let mut got = BTreeMap::new();
    for letter in read_all(&setup.dlq_topic) {
        let h = &letter.headers;
        let partition: i32 = h["source_partition"].parse().expect("partition header");
        let offset: i64 = h["source_offset"].parse().expect("offset header");
        got.insert((partition, offset), h["error_outcome"].clone());
    }
    assert_eq!(got, reference.dead_letters);
    assert_same_state(&reference, store).await;
}

/// (c) two instances in one group, the second joining mid-stream (a rebalance): same state.
#[tokio::test(flavor = "multi_thread")]
async fn two_instances_and_a_rebalance_converge() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("rebalance", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 8, 13);
    let half = records.len() / 2;
    let mut first = Daemon::start(&setup);
    let mut offsets = produce(&setup.topic, &records[..half]).await;
    wait_for(
        "the first instance to make progress",
        Duration::from_secs(60),
        || first.metrics().sum("materializer_records_total") > 10.0,
        || first.log(),
    );
    let mut second = Daemon::start(&setup);
    offsets.extend(produce(&setup.topic, &records[half..]).await);
    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&first, &second], Duration::from_secs(120));
    let applied_by_both = first.metrics().sum("materializer_records_total")
        + second.metrics().sum("materializer_records_total");
    assert!(applied_by_both >= records.len() as f64);
    assert!(first.terminate(Duration::from_secs(30)).success());
    assert!(second.terminate(Duration::from_secs(30)).success());
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
}

fn group_record(user: &str, seq: u64, body: &str) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("d-{user}-{seq}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": body}}]}]
    })
    .to_string()
    .into_bytes()
}

/// (d) a corrupt mailbox blocks only itself; the committed offset stays before it; a replay with
/// --reset-mailboxes heals it while the daemon runs.
#[tokio::test(flavor = "multi_thread")]
async fn corrupt_mailbox_blocks_only_itself_and_replay_heals_it_live() {
    // Lose the victim's identity index: its next append must fail closed (index_lost).
    // Its groups stay readable: the buckets are whole.
    corrupt_victim_blocks_only_itself("corrupt", "mm:mbseqbucket:{victim}:1", Some(vec![1, 2]))
        .await;
}

/// SPEC 4.2 step 8 (amended): a day bucket deleted under a live proof (an evicting Redis, a
/// stray DEL) is damage too: the victim's next write into that day fails closed (bad_proof)
/// instead of making the bucket look whole again, only the victim waits, and a repair heals it.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_day_bucket_blocks_only_its_mailbox_and_replay_heals_it_live() {
    let today = support::reference::now_ms() / 86_400_000;
    // A scan of it fails closed too: its page would miss groups it claims.
    corrupt_victim_blocks_only_itself("lost-day", &format!("mm:mbday:{{victim}}:1:{today}"), None)
        .await;
}

/// The victim gets seqs 1 and 2, `damage` (a key of it) is deleted, then its seq 3 must block it
/// alone until `replay --reset-mailboxes` rebuilds it while the daemon runs. `readable`: what a
/// scan of the blocked victim answers (`None`: corrupt).
async fn corrupt_victim_blocks_only_itself(name: &str, damage: &str, readable: Option<Vec<u64>>) {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new(name, Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let store = redis_store(&redis.url()).await;
    let daemon = Daemon::start(&setup);

    let first: Vec<(i32, Vec<u8>)> = vec![
        (0, group_record("victim", 1, "a")),
        (0, group_record("bystander", 1, "a")),
        (0, group_record("victim", 2, "b")),
        (0, group_record("bystander", 2, "b")),
    ];
    produce(&setup.topic, &first).await;
    wait_for(
        "the first records committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [4],
        || daemon.log(),
    );
    let deleted = redis.raw(&format!("DEL {damage}"));
    assert!(deleted.contains(":1"), "{damage} deleted: {deleted}");

    let second: Vec<(i32, Vec<u8>)> = vec![
        (0, group_record("victim", 3, "c")),
        (0, group_record("bystander", 3, "c")),
        (0, group_record("bystander", 4, "d")),
    ];
    produce(&setup.topic, &second).await;
    let runtime = tokio::runtime::Handle::current();
    wait_for(
        "the bystander to flow past the blocked victim",
        Duration::from_secs(60),
        || {
            tokio::task::block_in_place(|| runtime.block_on(scan_seqs(&store, "bystander")))
                == vec![1, 2, 3, 4]
        },
        || daemon.log(),
    );
    wait_for(
        "the blocked gauge",
        Duration::from_secs(30),
        || {
            daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 1.0
        },
        || daemon.metrics().text,
    );
    let scanned = scan_from_start(&store, "victim").await;
    match &readable {
        Some(seqs) => assert_eq!(
            scanned
                .map(|page| page
                    .groups
                    .iter()
                    .map(|g| g.mailbox_seq)
                    .collect::<Vec<_>>())
                .ok(),
            Some(seqs.clone())
        ),
        None => assert!(
            matches!(
                scanned,
                Err(mailbox_materializer::model::StoreError::Corrupt { .. })
            ),
            "{scanned:?}"
        ),
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        committed(&setup.group, &setup.topic, 1),
        vec![4],
        "the committed offset stays before the blocked record"
    );
    assert!(
        daemon.log().contains("corrupt mailbox"),
        "an error log names it"
    );

    // Heal it while the daemon runs.
    let config = setup.config_file(free_port());
    let (out, summary) = support::cli::replay(
        &config,
        &[
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--user",
            "victim",
            "--reset-mailboxes",
        ],
    );
    assert!(
        out.status.success(),
        "replay: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["swapped_users"], serde_json::json!(["victim"]));
    assert_eq!(summary["records"], 7);
    assert_eq!(summary["outcomes"]["skipped"], 4);

    wait_for(
        "the daemon to resume past the repaired mailbox",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [7],
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, "victim").await, vec![1, 2, 3]);
    assert_eq!(scan_seqs(&store, "bystander").await, vec![1, 2, 3, 4]);
    wait_for(
        "the blocked gauge to clear",
        Duration::from_secs(30),
        || {
            daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 0.0
        },
        || daemon.metrics().text,
    );
    assert_eq!(redis.raw("EXISTS mm:repair:{victim}").trim(), ":0");
}

/// (e) Redis stopped and restarted mid-stream: nothing lost, not ready meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn redis_restart_mid_stream_loses_nothing_and_readiness_follows() {
    let port = free_port();
    let mut redis = RedisServer::start(
        Clock::Real,
        Listen::Tcp(port),
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let setup = DaemonSetup::new("redis-restart", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(30, 8, 17);
    let half = records.len() / 2;
    let daemon = Daemon::start(&setup);
    let mut offsets = produce(&setup.topic, &records[..half]).await;
    wait_for(
        "ready",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || daemon.log(),
    );
    wait_for(
        "progress before the stop",
        Duration::from_secs(60),
        || daemon.metrics().sum("materializer_records_total") > 20.0,
        || daemon.log(),
    );
    redis.stop();
    offsets.extend(produce(&setup.topic, &records[half..]).await);
    wait_for(
        "readiness to turn false",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(503),
        || daemon.log(),
    );
    std::thread::sleep(Duration::from_secs(1));
    redis.restart();
    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(120));
    wait_for(
        "readiness back",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || daemon.log(),
    );
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
}

/// (f) SIGTERM stops fetching, drains, commits and exits 0; a restart finishes the rest.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_commits_and_exits_0() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("sigterm", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 8, 19);
    let offsets = produce(&setup.topic, &records).await;
    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);

    let mut daemon = Daemon::start(&setup);
    wait_for(
        "some progress",
        Duration::from_secs(60),
        || daemon.metrics().sum("materializer_records_total") > 30.0,
        || daemon.log(),
    );
    let status = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "exit status {status:?}\n{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("draining"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    let after_stop = committed(&setup.group, &setup.topic, PARTITIONS);
    assert!(after_stop.iter().zip(&ends).all(|(c, e)| *c <= *e));
    assert!(
        after_stop.iter().any(|c| *c > 0),
        "the drain committed: {after_stop:?}"
    );

    let mut daemon = Daemon::start(&setup);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(120));
    assert!(daemon.terminate(Duration::from_secs(20)).success());
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
}

/// The peak resident memory (`VmHWM`, the kernel's own high-water mark) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// docs/operations.md "Memory": a catch-up of large records (a backlog six times the in-flight
/// budget, 256 KiB each, already in the topic when the daemon starts) stays within 64 MiB + 1.25 ×
/// (budget + prefetch), and ends equal to the memory reference.
#[tokio::test(flavor = "multi_thread")]
async fn large_record_catch_up_stays_within_the_memory_formula() {
    const BUDGET: usize = 32 << 20;
    const RECORD_BYTES: usize = 256 << 10;
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("catchup-memory", Some(redis.url()));
    setup.max_in_flight = 10_000;
    setup
        .kafka_extra
        .push(format!("max_in_flight_bytes = {BUDGET}"));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    // Text that compresses like real text, not a repeated letter.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut body = |len: usize| -> String {
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                char::from(b'a' + ((state >> 33) % 26) as u8)
            })
            .collect()
    };
    let users = 20;
    let records: Vec<(i32, Vec<u8>)> = (0..6 * BUDGET / RECORD_BYTES)
        .map(|i| {
            let user = i % users;
            let record = group_record(
                &format!("big-{user}"),
                (i / users + 1) as u64,
                &body(RECORD_BYTES),
            );
            ((user % PARTITIONS as usize) as i32, record)
        })
        .collect();
    let offsets = produce(&setup.topic, &records).await;
    let reference = reference(&records, &offsets).await;
    let ends = end_offsets(&records, &offsets);

    let mut daemon = Daemon::start(&setup);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(180));
    let peak = peak_rss(daemon.child.id());
    let mut kafka = setup.config().kafka;
    kafka.max_in_flight_bytes = BUDGET;
    let bound = mailbox_materializer::daemon::memory_limit::required_bytes(&kafka);
    eprintln!("peak RSS {} KiB, formula {} KiB", peak >> 10, bound >> 10);
    assert!(
        peak <= bound,
        "peak RSS {} MiB over the formula's {} MiB\n{}",
        peak >> 20,
        bound >> 20,
        daemon.log()
    );
    assert!(daemon.terminate(Duration::from_secs(20)).success());
    assert_same_state(&reference, &redis_store(&redis.url()).await).await;
}
