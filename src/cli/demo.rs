//! `materializer demo`: the embedded default, needing no service at all.
//!
//! It starts librdkafka's in-process mock cluster (a Kafka-protocol broker inside this process),
//! produces a synthetic dispatch log to it (fresh groups, identical and different replays,
//! cross-day conflicts, already-expired input, a stale epoch, a truncate, malformed records),
//! runs the real daemon — consumer group, per-mailbox ordering, dead-letter producer, offset
//! commits, metrics — into a memory store, and prints a table of outcomes. `--serve` keeps it
//! running with `/metrics` served until Ctrl-C.
//!
//! Mock-cluster traps handled here: it keeps at most 5 MiB / 100,000 messages per partition and
//! drops older data silently (the workload is small and lz4-compressed), and it delays the first
//! group assignment by 3 s unless told otherwise (set to 0 below).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::watch;

use super::fail_with;
use crate::config::Config;
use crate::daemon::events::{Event as _, StoreOpening};
use crate::daemon::http::Health;
use crate::daemon::{self, metrics, DaemonOptions, Progress};
use crate::demo::{demo_shard, synthetic_workload, DEMO_SHARDS};
use crate::model::{Exit, MailboxId, ScanRequest, StoreError, UserId};
use crate::store::memory::MemoryStore;
use crate::store::{Clock, MailboxStore, SystemClock};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Mailboxes in the workload.
    #[arg(long, default_value_t = 200)]
    pub users: u64,
    /// Rounds of one fresh group per mailbox (plus replays and bad input).
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    /// Seed of the workload generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Keep running after the workload, serving /metrics, until Ctrl-C.
    #[arg(long)]
    pub serve: bool,
}

/// What happens to a delivery with this outcome in the daemon.
fn route(outcome: &str) -> &'static str {
    use crate::disposition::Disposition;
    use crate::model::{AppendOutcome, ErrorClass};
    // The demo's table lists outcome words; each maps to the class its results have.
    let class = match outcome {
        "malformed" => return Disposition::of_malformed().describe(),
        "corrupt" => ErrorClass::Corrupt,
        "rejected" | "conflict" | "cursor_expired" => ErrorClass::Refused,
        "unavailable" => ErrorClass::Unavailable,
        "under_repair" => ErrorClass::UnderRepair,
        "fence_lost" => ErrorClass::FenceLost,
        word if word == "truncated" || AppendOutcome::ALL.iter().any(|o| o.as_str() == word) => {
            return Disposition::Advance.describe()
        }
        _ => return "not an outcome",
    };
    Disposition::of_class(class).describe()
}

/// Starts the mock cluster with the two topics; returns the producer owning it and its
/// bootstrap servers.
#[allow(unsafe_code)] // each unsafe block below says why it is sound
fn start_mock_cluster(config: &Config) -> Result<(FutureProducer, String), String> {
    let producer: FutureProducer = ClientConfig::new()
        .set("test.mock.num.brokers", "1")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| format!("cannot start the mock cluster: {e}"))?;
    let brokers = {
        let mock = producer
            .client()
            .mock_cluster()
            .ok_or("librdkafka did not create a mock cluster")?;
        // SAFETY: the mock cluster handle belongs to `producer`'s client, which is alive for this
        // call; the function only stores an integer setting in the cluster.
        unsafe {
            let handle =
                rdkafka::bindings::rd_kafka_handle_mock_cluster(producer.client().native_ptr());
            if !handle.is_null() {
                rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(handle, 0);
            }
        }
        mock.create_topic(&config.kafka.topic, DEMO_SHARDS as i32, 1)
            .map_err(|e| format!("mock topic: {e}"))?;
        mock.create_topic(&config.kafka.dlq_topic, 1, 1)
            .map_err(|e| format!("mock topic: {e}"))?;
        mock.bootstrap_servers()
    };
    Ok((producer, brokers))
}

pub(super) async fn run(config: &Config, args: &DemoArgs) -> ExitCode {
    // Quiet by default (the table is the output): the log filter is the CLI's
    // (`super::logging_filter`).
    if let Err(e) = metrics::install() {
        return fail_with(Exit::Retry, "metrics", e);
    }
    StoreOpening(crate::config::Backend::Memory.as_str()).emit();
    let mut config = config.clone();
    let (producer, brokers) = match start_mock_cluster(&config) {
        Ok(started) => started,
        Err(e) => return fail_with(Exit::Retry, "mock_cluster", e),
    };
    config.kafka.brokers = brokers.clone();
    config.kafka.group_id = "materializer-demo".to_owned();
    config.kafka.commit_interval_ms = 200;
    config.kafka.properties.clear();

    let clock = Arc::new(SystemClock);
    let now_ms = clock.now_secs() * 1000;
    let users = args.users.max(DEMO_SHARDS + 1);
    let workload = synthetic_workload(users, args.rounds.max(1), now_ms, args.seed);

    let started = Instant::now();
    // Enqueue everything, then wait for every acknowledgement (one round trip per batch, not
    // per record).
    let mut acks = Vec::with_capacity(workload.records.len());
    for record in &workload.records {
        let partition = demo_shard(record);
        let key = format!("shard-{partition}");
        let queued = producer.send_result(
            FutureRecord::to(&config.kafka.topic)
                .partition(partition)
                .key(&key)
                .payload(&record[..]),
        );
        match queued {
            Ok(ack) => acks.push(ack),
            Err((e, _)) => {
                return fail_with(
                    Exit::Retry,
                    "mock_cluster",
                    format!("producing the demo workload: {e}"),
                );
            }
        }
    }
    let _ = producer.flush(Duration::from_secs(10));
    for ack in acks {
        if !matches!(ack.await, Ok(Ok(_))) {
            return fail_with(
                Exit::Retry,
                "mock_cluster",
                "the mock cluster did not acknowledge the demo workload",
            );
        }
    }

    let health = Arc::new(Health::default());
    // HTTP only with --serve: without it the demo exits after the table, so an address printed
    // then would already be dead.
    let listen = if args.serve {
        match crate::daemon::http::serve(&config.http.listen, health.clone()).await {
            Ok(addr) => Some(addr),
            // The default port may be taken (a daemon on this host): any free port will do.
            Err(_) => match crate::daemon::http::serve("127.0.0.1:0", health.clone()).await {
                Ok(addr) => Some(addr),
                Err(e) => {
                    return fail_with(
                        Exit::Retry,
                        "unavailable",
                        format!("cannot serve http: {e}"),
                    );
                }
            },
        }
    } else {
        None
    };

    // The mock cluster answers no DescribeTopics (a read would wait out its timeout): the demo
    // names its log by the mock cluster's ID and the topic, as for a broker without topic IDs.
    let cluster = producer
        .client()
        .fetch_cluster_id(Duration::from_secs(5))
        .unwrap_or_else(|| "demo-mock-cluster".to_owned());
    let Some(identity) = crate::model::LogId::cluster_topic(&cluster, &config.kafka.topic) else {
        return fail_with(
            Exit::Retry,
            "mock_cluster",
            format!("the mock cluster's ID {cluster:?} cannot name a log"),
        );
    };
    let store = Arc::new(MemoryStore::new(config.retention.policy(), clock));
    let progress = Arc::new(Progress::default());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let daemon = {
        let config = config.clone();
        let store: Arc<dyn MailboxStore> = store.clone();
        let options = DaemonOptions {
            shutdown: shutdown_rx,
            progress: progress.clone(),
            health,
            commit_offsets: true,
            mock_log: Some(identity.clone()),
            #[cfg(feature = "failpoints")]
            on_producer: None,
        };
        tokio::spawn(async move { daemon::run(&config, store, options).await })
    };

    let total = workload.records.len() as u64;
    let give_up = Instant::now() + Duration::from_secs(120);
    while progress.snapshot().final_records < total && Instant::now() < give_up {
        if daemon.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    let counts = progress.snapshot();

    let json = super::report::json();
    if let (Some(listen), false) = (listen, json) {
        print_table(&counts, total, users, elapsed, &brokers, &*store).await;
        println!();
        println!(
            "serving http://{listen}/metrics (health: /healthz, readiness: /readyz) until Ctrl-C"
        );
    }
    if let Some(listen) = listen {
        if json {
            eprintln!("serving http://{listen}/metrics (health: /healthz, readiness: /readyz) until Ctrl-C");
        }
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = shutdown_tx.send(true);
    let report = match daemon.await {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => return fail_with(Exit::Retry, "daemon", format!("daemon: {e}")),
        Err(e) => return fail_with(Exit::Retry, "daemon", format!("daemon task: {e}")),
    };
    if json {
        print_json_report(&counts, total, users, elapsed, &report.committed, &*store).await;
    } else {
        if listen.is_none() {
            print_table(&counts, total, users, elapsed, &brokers, &*store).await;
        }
        println!(
            "committed offsets: {}",
            report
                .committed
                .iter()
                .map(|(p, o)| format!("partition {p} -> {o}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if listen.is_none() {
            println!("(--serve keeps the demo running with /metrics, /healthz and /readyz served)");
        }
    }
    if counts.final_records < total {
        return fail_with(
            Exit::Finding,
            "incomplete",
            format!(
                "only {} of {total} records reached a final outcome",
                counts.final_records
            ),
        );
    }
    ExitCode::SUCCESS
}

/// The demo's outcome as one JSON object (`--output json`, the default off a terminal): the
/// table's numbers under the same words.
async fn print_json_report(
    counts: &daemon::ProgressCounts,
    total: u64,
    users: u64,
    elapsed: Duration,
    committed: &BTreeMap<i32, i64>,
    store: &dyn MailboxStore,
) {
    let groups: BTreeMap<&str, u64> = crate::daemon::metrics::GROUP_OUTCOMES
        .iter()
        .map(|&word| (word, counts.groups.get(word).copied().unwrap_or(0)))
        .collect();
    let records: BTreeMap<&str, u64> = [
        metrics::RECORD_APPLIED,
        metrics::RECORD_DEAD_LETTERED,
        metrics::RECORD_MALFORMED,
    ]
    .into_iter()
    .map(|word| (word, counts.records.get(word).copied().unwrap_or(0)))
    .collect();
    let scan = match UserId::parse("demo-user-1") {
        Ok(user) => {
            let request = ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 5,
            };
            match store.range_scan(&MailboxId::new(user, 1), request).await {
                Ok(page) => serde_json::json!({
                    "user_id": "demo-user-1",
                    "epoch": 1,
                    "seqs": page.groups.iter().map(|g| g.mailbox_seq).collect::<Vec<_>>(),
                    "up_to": page.up_to,
                    "has_more": page.has_more,
                }),
                Err(e) => {
                    serde_json::json!({"user_id": "demo-user-1", "epoch": 1, "error": e.to_string()})
                }
            }
        }
        Err(_) => serde_json::Value::Null,
    };
    super::print_json(&serde_json::json!({
        "records": total,
        "final": counts.final_records,
        "mailboxes": users,
        "partitions": DEMO_SHARDS,
        "elapsed_ms": (elapsed.as_secs_f64() * 1000.0).round(),
        "delivery_outcomes": groups,
        "record_outcomes": records,
        "committed_offsets": committed,
        "scan": scan,
    }));
}

async fn print_table(
    counts: &daemon::ProgressCounts,
    total: u64,
    users: u64,
    elapsed: Duration,
    brokers: &str,
    store: &dyn MailboxStore,
) {
    println!(
        "materializer demo: a synthetic dispatch log through librdkafka's mock cluster ({brokers}),"
    );
    println!("consumed by the daemon's consumer group into the memory store");
    println!(
        "records: {total}   final: {}   mailboxes: {users}   partitions: {DEMO_SHARDS}   elapsed: {:.1} ms",
        counts.final_records,
        elapsed.as_secs_f64() * 1000.0
    );
    println!();
    println!("{:<16} {:>8}   in the daemon", "delivery outcome", "count");
    for &word in crate::daemon::metrics::GROUP_OUTCOMES {
        let count = counts.groups.get(word).copied().unwrap_or(0);
        println!("{word:<16} {count:>8}   {}", route(word));
    }
    println!();
    println!("{:<16} {:>8}", "record outcome", "count");
    let mut records: BTreeMap<&str, u64> = BTreeMap::new();
    for word in [
        metrics::RECORD_APPLIED,
        metrics::RECORD_DEAD_LETTERED,
        metrics::RECORD_MALFORMED,
    ] {
        records.insert(word, counts.records.get(word).copied().unwrap_or(0));
    }
    for (word, count) in records {
        println!("{word:<16} {count:>8}");
    }

    // One mailbox read back through a scan, as a client would.
    if let Ok(user) = UserId::parse("demo-user-1") {
        let mailbox = MailboxId::new(user, 1);
        let request = ScanRequest {
            after_seq: 0,
            until_seq: None,
            limit_groups: 5,
        };
        println!();
        match store.range_scan(&mailbox, request).await {
            Ok(page) => println!(
                "scan demo-user-1 epoch 1 after 0: {} groups (seqs {:?}), up_to {}, has_more {}",
                page.groups.len(),
                page.groups
                    .iter()
                    .map(|g| g.mailbox_seq)
                    .collect::<Vec<_>>(),
                page.up_to,
                page.has_more
            ),
            Err(StoreError::CursorExpired { cursor }) => println!(
                "scan demo-user-1 epoch 1 after 0: cursor expired ({}); a client resumes past it",
                cursor.reason()
            ),
            Err(e) => println!("scan demo-user-1 epoch 1 after 0: {e}"),
        }
    }
}
