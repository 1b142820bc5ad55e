//! Scylla backend figures on the CQL server at `SCYLLA_NODES` (start one with
//! `scripts/cassandra start`), against baselines measured in the same run on the same server:
//!
//! - appends/s (groups of 3 events, 64 in flight, one writer per mailbox as the daemon orders them,
//!   over 64 mailboxes) versus plain
//!   unconditional `INSERT`s of the same three event rows at the same concurrency: the floor a
//!   write path without a commit point pays;
//! - 50-group scans/s of those mailboxes versus one plain `SELECT` of a 150-row events partition.
//!
//! Run: `SCYLLA_NODES=127.0.0.1:19042 cargo bench --bench scylla_store`. Prints a Markdown report.

use std::sync::Arc;
use std::time::Instant;

use mailbox_materializer::model::{
    Event, EventGroup, MailboxId, Payload, RetentionPolicy, ScanRequest, UserId, DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};

const MAILBOXES: u64 = 64;
const GROUPS_PER_MAILBOX: u64 = 60;
const IN_FLIGHT: u64 = 64;
const SCANS: u64 = 2_000;

fn events() -> Vec<Event> {
    (0..3)
        .map(|i| Event {
            event_ordinal: i,
            payload: Payload::from_value(
                &serde_json::json!({"kind": "message", "body": "hello there", "i": i}),
            ),
        })
        .collect()
}

fn mailbox(i: u64) -> MailboxId {
    MailboxId::new(UserId::parse(&format!("bench-{i}")).expect("id"), 1)
}

/// Runs `total` jobs with `IN_FLIGHT` workers; returns jobs per second.
async fn throughput<F, Fut>(total: u64, job: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let job = Arc::new(job);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..IN_FLIGHT {
        let job = job.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < total {
                job(i).await;
                i += IN_FLIGHT;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let nodes: Vec<String> = std::env::var("SCYLLA_NODES")
        .expect("set SCYLLA_NODES (scripts/cassandra start prints one)")
        .split(',')
        .map(str::to_owned)
        .collect();
    let keyspace = format!("mm_bench_{}", std::process::id());
    let store = Arc::new(
        ScyllaStore::connect(
            ScyllaSettings::new(nodes, keyspace.clone()),
            RetentionPolicy::default(),
            Arc::new(SystemClock),
        )
        .await
        .expect("connect"),
    );
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        / DAY_SECS;
    let events = Arc::new(events());

    // Appends: worker w owns mailbox w and sends its seqs in order, as the daemon does.
    assert_eq!(MAILBOXES, IN_FLIGHT, "one worker per mailbox");
    let total = MAILBOXES * GROUPS_PER_MAILBOX;
    let s = store.clone();
    let ev = events.clone();
    let appends = throughput(total, move |i| {
        let store = s.clone();
        let events = ev.clone();
        async move {
            // Worker w gets i = w, w + 64, w + 128, ...: mailbox w, seqs 1, 2, 3, ...
            let seq = i / MAILBOXES + 1;
            let day = today - 29 + (seq * 30 / GROUPS_PER_MAILBOX) % 30;
            let group = EventGroup {
                mailbox: mailbox(i % MAILBOXES),
                mailbox_seq: seq,
                created_at: day * DAY_MS + 1,
                events: events.to_vec(),
            };
            store.append(&group).await.expect("append");
        }
    })
    .await;

    // Baseline: the same three rows per group, plain INSERTs, no reads, no commit point.
    let plain = store
        .session()
        .prepare(format!(
            "INSERT INTO {keyspace}.mailbox_events (user_id, generation, day, seq, digest, ordinal, created_at, payload) \
             VALUES (?, 1, ?, ?, 0, ?, ?, ?)"
        ))
        .await
        .expect("prepare");
    let plain = Arc::new(plain);
    let s = store.clone();
    let ev = events.clone();
    let inserts = throughput(total, move |i| {
        let store = s.clone();
        let plain = plain.clone();
        let events = ev.clone();
        async move {
            for e in events.iter() {
                store
                    .session()
                    .execute_unpaged(
                        &plain,
                        (
                            format!("plain-{}", i % MAILBOXES),
                            today as i64,
                            i as i64,
                            i64::from(e.event_ordinal),
                            0i64,
                            e.payload.as_str(),
                        ),
                    )
                    .await
                    .expect("insert");
            }
        }
    })
    .await;

    let s = store.clone();
    let scans = throughput(SCANS, move |i| {
        let store = s.clone();
        async move {
            let page = store
                .range_scan(
                    &mailbox(i % MAILBOXES),
                    ScanRequest {
                        after_seq: 0,
                        until_seq: None,
                        limit_groups: 50,
                    },
                )
                .await
                .expect("scan");
            assert_eq!(page.groups.len(), 50);
        }
    })
    .await;

    let select = store
        .session()
        .prepare(format!(
            "SELECT seq, ordinal, payload FROM {keyspace}.mailbox_events WHERE user_id = ? AND generation = 1 AND day = ? LIMIT 150"
        ))
        .await
        .expect("prepare");
    let select = Arc::new(select);
    let s = store.clone();
    let reads = throughput(SCANS, move |i| {
        let store = s.clone();
        let select = select.clone();
        async move {
            store
                .session()
                .execute_unpaged(&select, (format!("plain-{}", i % MAILBOXES), today as i64))
                .await
                .expect("select");
        }
    })
    .await;

    let _ = store
        .session()
        .query_unpaged(format!("DROP KEYSPACE {keyspace}"), ())
        .await;

    println!("## Scylla store ({total} appends over {MAILBOXES} mailboxes, {SCANS} scans, {IN_FLIGHT} in flight)\n");
    println!("| operation | store ops/s | baseline | baseline ops/s | store / baseline |");
    println!("|---|---|---|---|---|");
    println!(
        "| append (3 events) | {appends:.0} | 3 plain INSERTs | {inserts:.0} | {:.2} |",
        appends / inserts
    );
    println!(
        "| scan, 50 groups | {scans:.0} | 1 plain SELECT of 150 rows | {reads:.0} | {:.2} |",
        scans / reads
    );
}
