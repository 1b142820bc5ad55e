//! Memory store throughput: appends and 50-group scans through the `MailboxStore` trait, on one
//! core (a current-thread runtime), with 10,000 mailboxes of 30 active days and groups of 3
//! events. Each figure has a baseline measured in the same run: the same work done on a bare
//! `Mutex<BTreeMap>` (the floor any in-memory store pays), so results are read as ratios.
//!
//! Run: `cargo bench --bench memory_store`.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mailbox_materializer::model::{
    Event, EventGroup, MailboxId, Payload, RetentionPolicy, ScanRequest, UserId, DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::{MailboxStore, ManualClock};

const MAILBOXES: usize = 10_000;
const ACTIVE_DAYS: u64 = 30;
const GROUPS_PER_MAILBOX: u64 = 60;
const NOW: u64 = 1_805_112_000;

fn events() -> Arc<Vec<Event>> {
    Arc::new(
        (0..3)
            .map(|i| Event {
                event_ordinal: i,
                payload: Payload::from_value(
                    &serde_json::json!({"kind": "message", "body": "hello there", "i": i}),
                ),
            })
            .collect(),
    )
}

fn mailboxes() -> Vec<MailboxId> {
    (0..MAILBOXES)
        .map(|i| MailboxId::new(UserId::parse(&format!("user-{i}")).unwrap(), 1))
        .collect()
}

fn group(mb: &MailboxId, seq: u64, events: &[Event]) -> EventGroup {
    let today = NOW / DAY_SECS;
    let day =
        today - (ACTIVE_DAYS - 1) + (seq * ACTIVE_DAYS / GROUPS_PER_MAILBOX.max(1)) % ACTIVE_DAYS;
    EventGroup {
        mailbox: mb.clone(),
        mailbox_seq: seq,
        created_at: day * DAY_MS + 1,
        events: events.to_vec(),
        source: None,
        token: None,
    }
}

/// A store with every mailbox holding `GROUPS_PER_MAILBOX` groups over `ACTIVE_DAYS` days.
fn populated(
    rt: &tokio::runtime::Runtime,
    mbs: &[MailboxId],
    events: &[Event],
) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new(
        RetentionPolicy::default(),
        Arc::new(ManualClock::new(NOW)),
    ));
    rt.block_on(async {
        for seq in 1..=GROUPS_PER_MAILBOX {
            for mb in mbs {
                store.append(&group(mb, seq, events)).await.unwrap();
            }
        }
    });
    store
}

type Baseline = Mutex<HashMap<UserId, BTreeMap<u64, Arc<[Event]>>>>;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mbs = mailboxes();
    let events = events();
    let store = populated(&rt, &mbs, &events);
    // Filled in the store's order (seq by seq across all mailboxes), so both have the same
    // memory layout and the ratio measures the store's own work.
    let baseline: Baseline = Mutex::new(HashMap::new());
    for seq in 1..=GROUPS_PER_MAILBOX {
        let mut map = baseline.lock().unwrap();
        for mb in &mbs {
            let entry = map.entry(mb.user_id.clone()).or_default();
            entry.insert(seq, Arc::from(events.to_vec()));
        }
    }

    let mut appends = c.benchmark_group("append");
    appends.throughput(Throughput::Elements(1));
    let mut next = (0usize, GROUPS_PER_MAILBOX);
    appends.bench_function("memory_store", |b| {
        b.to_async(&rt).iter_batched(
            || {
                next.0 += 1;
                if next.0 == MAILBOXES {
                    next = (0, next.1 + 1);
                }
                group(&mbs[next.0], next.1 + 1, &events)
            },
            |g| {
                let store = &store;
                async move { store.append(&g).await.unwrap() }
            },
            BatchSize::SmallInput,
        )
    });
    let mut next = (0usize, GROUPS_PER_MAILBOX);
    appends.bench_function("baseline_btreemap", |b| {
        b.iter_batched(
            || {
                next.0 += 1;
                if next.0 == MAILBOXES {
                    next = (0, next.1 + 1);
                }
                group(&mbs[next.0], next.1 + 1, &events)
            },
            |g| {
                let mut map = baseline.lock().unwrap();
                let entry = map.entry(g.mailbox.user_id.clone()).or_default();
                entry.insert(g.mailbox_seq, Arc::from(g.events))
            },
            BatchSize::SmallInput,
        )
    });
    appends.finish();

    let mut scans = c.benchmark_group("scan_50_groups");
    scans.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    scans.bench_function("memory_store", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 7919) % MAILBOXES;
            let mb = &mbs[i];
            let store = &store;
            async move {
                let page = store
                    .range_scan(
                        mb,
                        ScanRequest {
                            after_seq: 0,
                            until_seq: None,
                            limit_groups: 50,
                        },
                    )
                    .await
                    .unwrap();
                assert_eq!(page.groups.len(), 50);
                page
            }
        })
    });
    let mut i = 0usize;
    scans.bench_function("baseline_btreemap", |b| {
        b.iter(|| {
            i = (i + 7919) % MAILBOXES;
            let map = baseline.lock().unwrap();
            let groups: Vec<(u64, Arc<[Event]>)> = map[&mbs[i].user_id]
                .range(1..)
                .take(50)
                .map(|(&s, e)| (s, e.clone()))
                .collect();
            groups
        })
    });
    scans.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
