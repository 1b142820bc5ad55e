//! The runner's bounds on what is in flight, at the store's limit − 1, exact, + 1 and many
//! times over: every delivery reaches the store exactly once, never more at once than allowed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::*;
use crate::model::{AppendOutcome, Event, EventGroup, MailboxId, Payload, RetentionPolicy, UserId};
use crate::store::memory::MemoryStore;
use crate::store::wrapper::Wrapper;
use crate::store::SystemClock;

/// The memory store with a limit of its own, counting the appends it holds at once.
struct Limited {
    inner: MemoryStore,
    limit: Option<usize>,
    now: AtomicUsize,
    most: AtomicUsize,
    seen: Mutex<Vec<u64>>,
}

#[async_trait]
impl Wrapper for Limited {
    fn inner(&self) -> &dyn MailboxStore {
        &self.inner
    }

    fn max_appends_in_flight(&self) -> Option<usize> {
        self.limit
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        // Long enough for every batch the runner is willing to send to be out at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let outcome = self.inner.append(group).await;
        self.seen.lock().expect("lock").push(group.mailbox_seq);
        self.now.fetch_sub(1, Ordering::SeqCst);
        outcome
    }
}

/// The memory store behind `limit`, counting what it holds.
fn limited(limit: Option<usize>) -> Arc<Limited> {
    Arc::new(Limited {
        inner: MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock)),
        limit,
        now: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
    })
}

fn delivery(i: usize) -> Arc<Delivery> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    Arc::new(Delivery::Append(EventGroup {
        mailbox: MailboxId::new(UserId::parse(&format!("user-{i}")).expect("id"), 1),
        mailbox_seq: i as u64 + 1,
        created_at: now,
        events: vec![Event {
            event_ordinal: 0,
            payload: Payload::from_value(&serde_json::json!({"i": i})),
        }],
        source: None,
        token: None,
    }))
}

/// The next finished attempt, which must be an insert: its key (its store calls go to `calls`).
async fn next_inserted(runner: &mut Runner<usize>, calls: &mut Vec<StoreCall>) -> usize {
    let mut attempt = runner.next().await;
    calls.append(&mut attempt.calls);
    assert_eq!(
        attempt.result,
        Some(Ok(DeliveryOutcome::Append(AppendOutcome::Inserted))),
        "delivery {}",
        attempt.key
    );
    attempt.key
}

/// Starts `count` deliveries of distinct users at once and collects every attempt; answers the
/// most appends the store held at once.
async fn run(limit: Option<usize>, count: usize) -> usize {
    let store = limited(limit);
    let target: Arc<dyn MailboxStore> = store.clone();
    let mut runner = Runner::default();
    for i in 0..count {
        runner.start_run(
            target.clone(),
            vec![(i, delivery(i))],
            0,
            Duration::ZERO,
            Cancel::default(),
        );
    }
    let mut keys = Vec::new();
    let mut calls = Vec::new();
    for _ in 0..count {
        keys.push(next_inserted(&mut runner, &mut calls).await);
    }
    keys.sort_unstable();
    assert_eq!(keys, (0..count).collect::<Vec<_>>(), "each delivery once");
    // Each batch's call is reported once, whatever the number of its deliveries.
    assert!(calls
        .iter()
        .all(|c| c.op == "append" && c.backend == "memory"));
    assert!(calls
        .iter()
        .all(|c| (1..=MAX_BATCH).contains(&c.deliveries)));
    assert_eq!(calls.iter().map(|c| c.deliveries).sum::<usize>(), count);
    let mut seen = store.seen.lock().expect("lock").clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=count as u64).collect::<Vec<_>>(),
        "each append once"
    );
    store.most.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_stores_limit_bounds_the_appends_in_flight_at_every_boundary() {
    // Above one batch, so the limit cuts a batch short (256 + 44).
    const LIMIT: usize = MAX_BATCH + 44;
    for count in [LIMIT - 1, LIMIT, LIMIT + 1, 3 * LIMIT + 7] {
        let most = run(Some(LIMIT), count).await;
        assert_eq!(most, count.min(LIMIT), "{count} deliveries, limit {LIMIT}");
    }
    for (limit, count) in [(1, 5), (7, 50)] {
        assert_eq!(run(Some(limit), count).await, limit, "limit {limit}");
    }
}

#[tokio::test]
async fn without_a_limit_of_its_own_the_runners_bound_applies() {
    let bound = MAX_BATCH * MAX_BATCHES_IN_FLIGHT;
    assert_eq!(run(None, bound + 1).await, bound);
}

fn run_of(user: usize, len: usize) -> Vec<(usize, Arc<Delivery>)> {
    (0..len)
        .map(|j| {
            let Delivery::Append(mut group) = (*delivery(user)).clone() else {
                unreachable!("delivery() makes appends")
            };
            group.mailbox_seq = j as u64 + 1;
            (user * 1_000 + j, Arc::new(Delivery::Append(group)))
        })
        .collect()
}

/// Runs are never split across batches: with runs of `RUN_MAX_GROUPS`, a batch holds whole
/// runs only (one below MAX_BATCH, exactly, and one run over), and every run's groups reach
/// the store in their order.
#[tokio::test]
async fn runs_go_whole_in_batches_and_in_order() {
    use crate::ingest::RUN_MAX_GROUPS;
    for runs in [
        MAX_BATCH / RUN_MAX_GROUPS - 1,
        MAX_BATCH / RUN_MAX_GROUPS,
        MAX_BATCH / RUN_MAX_GROUPS + 1,
    ] {
        let store = limited(None);
        let target: Arc<dyn MailboxStore> = store.clone();
        let mut runner = Runner::default();
        for user in 0..runs {
            runner.start_run(
                target.clone(),
                run_of(user, RUN_MAX_GROUPS),
                0,
                Duration::ZERO,
                Cancel::default(),
            );
        }
        let mut calls = Vec::new();
        let mut order: Vec<Vec<usize>> = vec![Vec::new(); runs];
        for _ in 0..runs * RUN_MAX_GROUPS {
            let key = next_inserted(&mut runner, &mut calls).await;
            order[key / 1_000].push(key % 1_000);
        }
        for (user, seen) in order.iter().enumerate() {
            assert_eq!(
                *seen,
                (0..RUN_MAX_GROUPS).collect::<Vec<_>>(),
                "user {user}"
            );
        }
        assert!(
            calls
                .iter()
                .all(|c| c.deliveries % RUN_MAX_GROUPS == 0 && c.deliveries <= MAX_BATCH),
            "{runs} runs: {calls:?}"
        );
    }
}

/// A store's own limit counts runs (a run holds one call at a time): a run longer than the
/// limit goes, and the next run waits for it.
#[tokio::test]
async fn a_stores_limit_counts_runs() {
    let store = limited(Some(1));
    let target: Arc<dyn MailboxStore> = store.clone();
    let mut runner = Runner::default();
    runner.start_run(
        target.clone(),
        run_of(0, 5),
        0,
        Duration::ZERO,
        Cancel::default(),
    );
    runner.start_run(
        target.clone(),
        run_of(1, 2),
        0,
        Duration::ZERO,
        Cancel::default(),
    );
    let mut keys = Vec::new();
    for _ in 0..7 {
        let attempt = runner.next().await;
        assert!(
            matches!(attempt.result, Some(Ok(_))),
            "{:?}",
            attempt.result
        );
        keys.push(attempt.key);
    }
    assert_eq!(keys, vec![0, 1, 2, 3, 4, 1_000, 1_001]);
    assert_eq!(
        store.seen.lock().expect("lock").clone(),
        vec![1, 2, 3, 4, 5, 1, 2]
    );
}
