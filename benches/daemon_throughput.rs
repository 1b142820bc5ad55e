//! Records/s through the whole daemon (real Kafka broker, consumer group, per-mailbox lanes,
//! watermark commits) into the memory store and into Redis, against a baseline measured in the
//! same run: a bare librdkafka consumer reading the same topic without decoding or applying.
//!
//! Run: `KAFKA_BOOTSTRAP=$(scripts/kafka start) cargo bench --bench daemon_throughput` (needs
//! redis-server too: `scripts/install-services`). Prints a Markdown report.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mailbox_materializer::config::{Backend, Config};
use mailbox_materializer::daemon::http::Health;
use mailbox_materializer::daemon::{self, DaemonOptions, Progress};
use mailbox_materializer::model::{RetentionPolicy, DAY_MS};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use redis_server::{Clock, Listen, RedisServer};
use tokio::sync::watch;

const RECORDS: u64 = 30_000;
const USERS: u64 = 3_000;
const PARTITIONS: i32 = 3;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn prepare(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    for result in admin
        .create_topics(
            &[
                NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1)),
                NewTopic::new(&format!("{topic}.dlq"), 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics")
    {
        result.expect("topic");
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .expect("producer");
    let today = now_ms() - now_ms() % DAY_MS;
    let mut acks = Vec::new();
    for i in 0..RECORDS {
        let user = i % USERS;
        let seq = i / USERS + 1;
        let record = serde_json::json!({
            "dispatch_id": format!("bench/{i}"), "group_id": "g", "committed_at": today + i,
            "deliveries": [{"user_id": format!("bench-user-{user}"), "epoch": 1, "mailbox_seq": seq,
                "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hello there"}},
                           {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]}]
        })
        .to_string();
        let partition = (user % PARTITIONS as u64) as i32;
        acks.push(
            producer
                .send_result(
                    FutureRecord::<str, str>::to(topic)
                        .partition(partition)
                        .payload(&record),
                )
                .map_err(|(e, _)| e)
                .expect("enqueue"),
        );
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    for ack in acks {
        ack.await.expect("ack").expect("delivered");
    }
}

/// A bare consumer group reading every record (no decode, no store): the baseline.
async fn bare_consumer(bootstrap: &str, topic: &str, group: &str) -> f64 {
    use rdkafka::message::Message;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut started = None;
    let mut seen = 0u64;
    while seen < RECORDS {
        let message = consumer.recv().await.expect("message");
        started.get_or_insert_with(Instant::now);
        std::hint::black_box(message.payload());
        seen += 1;
    }
    let elapsed = started.map_or(Duration::ZERO, |s| s.elapsed());
    RECORDS as f64 / elapsed.as_secs_f64()
}

/// The daemon, from its first final record to the last.
async fn daemon_run(
    bootstrap: &str,
    topic: &str,
    group: &str,
    store: Arc<dyn MailboxStore>,
) -> f64 {
    let mut config = Config::default();
    config.store.backend = Backend::Memory;
    config.kafka.brokers = bootstrap.to_owned();
    config.kafka.topic = topic.to_owned();
    config.kafka.dlq_topic = format!("{topic}.dlq");
    config.kafka.group_id = group.to_owned();
    let progress = Arc::new(Progress::default());
    let (tx, rx) = watch::channel(false);
    let options = DaemonOptions {
        shutdown: rx,
        progress: progress.clone(),
        health: Arc::new(Health::default()),
        commit_offsets: true,
    };
    let task = tokio::spawn(async move { daemon::run(&config, store, options).await });
    while progress.snapshot().final_records == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    while progress.snapshot().final_records < RECORDS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = RECORDS as f64 / started.elapsed().as_secs_f64();
    let _ = tx.send(true);
    task.await.expect("daemon task").expect("daemon");
    rate
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP must point at a broker (scripts/kafka start)");
    let topic = format!("bench-{}", now_ms());
    prepare(&bootstrap, &topic).await;

    let baseline = bare_consumer(&bootstrap, &topic, &format!("{topic}-bare")).await;
    let memory = daemon_run(
        &bootstrap,
        &topic,
        &format!("{topic}-memory"),
        Arc::new(MemoryStore::new(
            RetentionPolicy::default(),
            Arc::new(SystemClock),
        )),
    )
    .await;
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let redis = Arc::new(
        RedisStore::connect(
            RedisSettings::new(server.url(), "mm"),
            RetentionPolicy::default(),
        )
        .await
        .expect("redis"),
    );
    let redis_rate = daemon_run(&bootstrap, &topic, &format!("{topic}-redis"), redis).await;

    println!("## Daemon throughput ({RECORDS} records, {USERS} mailboxes, {PARTITIONS} partitions, groups of 2 events)\n");
    println!("| path | records/s | ratio to the bare consumer |");
    println!("|---|---|---|");
    println!("| bare librdkafka consumer (baseline, no decode, no store) | {baseline:.0} | 1.00 |");
    println!(
        "| daemon into the memory store | {memory:.0} | {:.2} |",
        memory / baseline
    );
    println!(
        "| daemon into Redis (unix socket) | {redis_rate:.0} | {:.2} |",
        redis_rate / baseline
    );
}
