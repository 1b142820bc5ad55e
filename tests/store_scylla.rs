//! The conformance suite, the crash-convergence and concurrency tests, and the memory-vs-Scylla
//! randomized comparison, on a real CQL server (`SCYLLA_NODES`; `scripts/test` starts Apache
//! Cassandra when no ScyllaDB is given).

mod conformance;
mod support;

use std::sync::Arc;

use conformance::memory::MemoryHarness;
use conformance::scylla::{ScyllaFixture, ScyllaHarness};

conformance_tests!(ScyllaHarness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_histories_match_the_memory_reference() {
    conformance::history::compare_backends(Arc::new(MemoryHarness), Arc::new(ScyllaHarness), 16)
        .await;
    let _ = std::mem::size_of::<ScyllaFixture>();
}

// ---- crash convergence ----

use conformance::{group, mailbox, policy, NOW0, TODAY0};
use mailbox_materializer::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, ScanPage, ScanRequest, StoreError,
};
use mailbox_materializer::store::MailboxStore;

/// One step of a crash scenario.
#[derive(Debug, Clone)]
enum Step {
    Append(EventGroup),
    Truncate(u64),
}

async fn run(store: &dyn MailboxStore, mb: &MailboxId, step: &Step) -> Result<String, StoreError> {
    match step {
        Step::Append(g) => {
            let mut g = g.clone();
            g.mailbox = MailboxId::new(mb.user_id.clone(), g.mailbox.epoch);
            store.append(&g).await.map(|o| format!("{o:?}"))
        }
        Step::Truncate(before) => store
            .truncate_before(mb, *before)
            .await
            .map(|t| format!("trim {}", t.user_trim_seq)),
    }
}

/// What a reader can observe of a mailbox: every page from 0 (or the cursor error) and the meta,
/// without the commit version.
async fn observe(
    store: &dyn MailboxStore,
    mb: &MailboxId,
) -> (Result<ScanPage, StoreError>, MailboxInspection) {
    let request = ScanRequest {
        after_seq: 0,
        until_seq: None,
        limit_groups: 1000,
    };
    let mut page = store.range_scan(mb, request).await;
    if let Err(StoreError::CursorExpired { .. }) = page {
        let inspected = store.inspect(mb).await.unwrap();
        let after = inspected
            .expired_gap_boundary
            .max(inspected.user_trim_seq.saturating_sub(1));
        page = store
            .range_scan(
                mb,
                ScanRequest {
                    after_seq: after,
                    ..request
                },
            )
            .await;
    }
    (page, store.inspect(mb).await.unwrap())
}

fn scenarios() -> Vec<(&'static str, Vec<Step>, Step)> {
    let mb = mailbox("x", 1);
    let g = |seq, day, tag: &str| group(&mb, seq, day, 3, tag);
    let next_epoch = |seq, day, tag: &str| group(&mailbox("x", 2), seq, day, 2, tag);
    vec![
        ("cold insert", vec![], Step::Append(g(1, TODAY0, "a"))),
        (
            "warm insert on a new day",
            vec![Step::Append(g(1, TODAY0 - 3, "a"))],
            Step::Append(g(2, TODAY0, "b")),
        ),
        (
            "replacement",
            vec![
                Step::Append(g(1, TODAY0, "a")),
                Step::Append(g(2, TODAY0, "b")),
            ],
            Step::Append(group(&mb, 2, TODAY0, 2, "changed")),
        ),
        (
            "epoch move",
            vec![
                Step::Append(g(1, TODAY0 - 1, "a")),
                Step::Append(g(2, TODAY0, "b")),
            ],
            Step::Append(next_epoch(1, TODAY0, "new")),
        ),
        (
            "expired merge",
            vec![Step::Append(g(5, TODAY0, "a"))],
            Step::Append(g(6, TODAY0 - 40, "old")),
        ),
        (
            "truncate",
            vec![
                Step::Append(g(1, TODAY0 - 2, "a")),
                Step::Append(g(2, TODAY0 - 1, "b")),
                Step::Append(g(3, TODAY0, "c")),
            ],
            Step::Truncate(3),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_operation_replayed_converges_at_every_failpoint() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let store = f.store.clone();
    for (index, (name, setup, target)) in scenarios().into_iter().enumerate() {
        let epoch_of = |step: &Step| match step {
            Step::Append(g) => g.mailbox.epoch,
            Step::Truncate(_) => 1,
        };
        // The uninterrupted run.
        let reference = mailbox(&format!("ref-{index}"), epoch_of(&target));
        for step in &setup {
            run(&*store, &reference, step).await.unwrap();
        }
        run(&*store, &reference, &target).await.unwrap();
        let expected = observe(&*store, &reference).await;

        let mut failpoint = 1;
        loop {
            let user = mailbox(&format!("crash-{index}-{failpoint}"), epoch_of(&target));
            for step in &setup {
                run(&*store, &user, step).await.unwrap();
            }
            store.arm_failpoint(Some(failpoint));
            let interrupted = run(&*store, &user, &target).await;
            store.arm_failpoint(None);
            match interrupted {
                Ok(_) => {
                    // Fewer writes than the failpoint: every failpoint has been exercised.
                    eprintln!("{name}: {} failpoints exercised", failpoint - 1);
                    assert!(failpoint > 1, "{name}: the operation wrote nothing");
                    break;
                }
                Err(StoreError::Unavailable { detail, .. }) => {
                    assert!(detail.contains("failpoint"), "{name}: {detail}");
                }
                Err(other) => panic!("{name}, failpoint {failpoint}: {other}"),
            }
            // Whatever a reader sees meanwhile is a whole state: no duplicate, no partial group.
            if let (Ok(page), _) = observe(&*store, &user).await {
                let mut seqs: Vec<u64> = page.groups.iter().map(|g| g.mailbox_seq).collect();
                seqs.dedup();
                assert_eq!(seqs.len(), page.groups.len(), "{name}: a group shows twice");
                for g in &page.groups {
                    assert!(
                        g.events.len() == 2 || g.events.len() == 3,
                        "{name}: a partial group of {} events",
                        g.events.len()
                    );
                }
            }
            run(&*store, &user, &target)
                .await
                .unwrap_or_else(|e| panic!("{name}, failpoint {failpoint}: replay failed: {e}"));
            let converged = observe(&*store, &user).await;
            assert_eq!(
                converged, expected,
                "{name}: the replay after failpoint {failpoint} did not converge"
            );
            failpoint += 1;
            assert!(failpoint < 50, "{name}: runaway failpoints");
        }
    }
}

// ---- concurrency ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_on_one_mailbox_never_both_win_a_seq() {
    let a = ScyllaFixture::start(policy(), NOW0).await;
    let b = ScyllaFixture::start_in(a.store.keyspace().to_owned(), policy(), NOW0).await;
    let mb = mailbox("race", 1);
    let seqs = 24u64;
    let writer = |store: Arc<mailbox_materializer::store::scylla::ScyllaStore>, day_back: u64| {
        let mb = mb.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for seq in 1..=seqs {
                // Even seqs: both write the same group. Odd seqs: each dates it its own day.
                let day = if seq % 2 == 0 {
                    TODAY0
                } else {
                    TODAY0 - day_back
                };
                outcomes.push(store.append(&group(&mb, seq, day, 2, "same")).await);
            }
            outcomes
        })
    };
    let (ra, rb) = tokio::join!(writer(a.store.clone(), 1), writer(b.store.clone(), 2));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    for i in 0..seqs as usize {
        let pair = [&ra[i], &rb[i]];
        let inserted = pair
            .iter()
            .filter(|r| matches!(r, Ok(AppendOutcome::Inserted)))
            .count();
        assert_eq!(inserted, 1, "seq {}: {pair:?}", i + 1);
        for r in pair {
            assert!(
                matches!(
                    r,
                    Ok(AppendOutcome::Inserted | AppendOutcome::Unchanged)
                        | Err(StoreError::Conflict { .. })
                ),
                "seq {}: {r:?}",
                i + 1
            );
        }
    }
    let page = a
        .store
        .range_scan(
            &mb,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 100,
            },
        )
        .await
        .unwrap();
    let got: Vec<u64> = page.groups.iter().map(|g| g.mailbox_seq).collect();
    assert_eq!(got, (1..=seqs).collect::<Vec<_>>(), "each seq exactly once");
}

/// A cold mailbox written by two instances at once: one reads "no meta", the other commits, the
/// first then sees an identity. That must be re-decided, never reported as a lost meta or index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_writes_are_never_mistaken_for_corruption() {
    let a = ScyllaFixture::start(policy(), NOW0).await;
    let b = ScyllaFixture::start_in(a.store.keyspace().to_owned(), policy(), NOW0).await;
    for i in 0..30 {
        let mb = mailbox(&format!("cold-race-{i}"), 1);
        let (sa, sb) = (a.store.clone(), b.store.clone());
        let (ga, gb) = (group(&mb, 1, TODAY0, 1, "a"), group(&mb, 2, TODAY0, 1, "b"));
        let (ra, rb) = tokio::join!(
            tokio::spawn(async move { sa.append(&ga).await }),
            tokio::spawn(async move { sb.append(&gb).await })
        );
        for r in [ra.unwrap(), rb.unwrap()] {
            match r {
                Ok(AppendOutcome::Inserted) => {}
                // Seq 1 committed after seq 2: out of source order, refused by design.
                Err(StoreError::Corrupt {
                    kind: mailbox_materializer::model::CorruptKind::IdentityMissing { .. },
                }) => {}
                other => panic!("mailbox {i}: {other:?}"),
            }
        }
    }
}
