//! The conformance suite, the crash-convergence and concurrency tests, and the memory-vs-Scylla
//! randomized comparison, on a real CQL server (`SCYLLA_NODES`; `scripts/test` starts Apache
//! Cassandra when no ScyllaDB is given).

use crate::conformance;
use crate::conformance_tests;
use crate::support;

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

// ---- repair racing live writers (SPEC 7.1) ----

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mailbox_materializer::store::scylla::ScyllaStore;

const LEASE: Duration = Duration::from_secs(60);

async fn seqs(store: &dyn MailboxStore, mb: &MailboxId) -> Vec<u64> {
    store
        .range_scan(
            mb,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 1000,
            },
        )
        .await
        .expect("scan")
        .groups
        .iter()
        .map(|g| g.mailbox_seq)
        .collect()
}

/// A hook that, the first time a commit is about to run, reports "decided" and holds the commit
/// until `go` is notified; later commits pass.
fn hold_first_commit(
    decided: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
) -> mailbox_materializer::store::PhaseHook {
    let first = Arc::new(AtomicBool::new(true));
    Arc::new(move || {
        let (decided, go, first) = (decided.clone(), go.clone(), first.clone());
        Box::pin(async move {
            if first.swap(false, Ordering::SeqCst) {
                decided.notify_one();
                go.notified().await;
            }
        })
    })
}

/// A live append that read the mailbox before a repair took the fence but commits after it:
/// its commit is refused (the fence moved the commit point), and on its fresh attempt it either
/// waits (`UnderRepair`, fence still held) or lands in the rebuilt mailbox (swap done). It never
/// commits into the copy the swap replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_write_decided_before_the_fence_never_lands_in_the_replaced_copy() {
    let a = ScyllaFixture::start(policy(), NOW0).await;
    let b = ScyllaFixture::start_in(a.store.keyspace().to_owned(), policy(), NOW0).await;
    let live = |name: &str, seq| group(&mailbox(name, 1), seq, TODAY0, 2, "log");

    for (name, swap_before_release) in [("held-past-swap", true), ("held-past-fence", false)] {
        let mb = mailbox(name, 1);
        for seq in 1..=3 {
            assert_eq!(
                a.store.append(&live(name, seq)).await,
                Ok(AppendOutcome::Inserted)
            );
        }
        let (decided, go) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        a.store
            .set_before_commit_hook(Some(hold_first_commit(decided.clone(), go.clone())));
        let writer = {
            let store = a.store.clone();
            let g = live(name, 4);
            tokio::spawn(async move { store.append(&g).await })
        };
        decided.notified().await;

        // The repair: fence, rebuild of the log up to seq 3, and (first round) the swap.
        let token = b
            .store
            .repair_begin(&mb.user_id, LEASE)
            .await
            .expect("fence");
        for seq in 1..=3 {
            b.store
                .repair_append(&token, &live(name, seq))
                .await
                .expect("staged");
        }
        if swap_before_release {
            b.store.repair_swap(&token).await.expect("swap");
        }
        go.notify_one();
        let outcome = writer.await.expect("writer task");
        a.store.set_before_commit_hook(None);
        if swap_before_release {
            assert_eq!(
                outcome,
                Ok(AppendOutcome::Inserted),
                "{name}: the write lands in the rebuilt copy"
            );
        } else {
            assert!(
                matches!(outcome, Err(StoreError::UnderRepair { .. })),
                "{name}: {outcome:?}"
            );
            b.store.repair_swap(&token).await.expect("swap");
            assert_eq!(
                a.store.append(&live(name, 4)).await,
                Ok(AppendOutcome::Inserted),
                "{name}: the waiting delivery resumes after the swap"
            );
        }
        assert_eq!(seqs(&*a.store, &mb).await, vec![1, 2, 3, 4], "{name}");
    }
}

/// A live writer streams a mailbox's log while repairs fence, rebuild (up to the end of the log
/// at the moment their fence was taken) and swap, again and again: every write the writer saw
/// acknowledged is in the final mailbox, exactly once, and its deliveries only ever waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_writer_racing_repairs_loses_no_acknowledged_write() {
    let a = ScyllaFixture::start(policy(), NOW0).await;
    let b = ScyllaFixture::start_in(a.store.keyspace().to_owned(), policy(), NOW0).await;
    let mb = mailbox("raced", 1);
    const SEQS: u64 = 60;
    let record = |seq: u64| group(&mailbox("raced", 1), seq, TODAY0 - seq % 3, 2, "log");
    // The highest seq whose record exists in the log (the writer is applying or has applied it).
    let log_end = Arc::new(AtomicU64::new(0));
    // Swaps done so far: the writer waits for the first and the second at a third and two
    // thirds of its log, so the repairs race it mid-stream however fast either side runs.
    let swapped = Arc::new(AtomicU64::new(0));

    let writer = {
        let store: Arc<ScyllaStore> = a.store.clone();
        let log_end = log_end.clone();
        let swapped = swapped.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut waits = 0;
            for seq in 1..=SEQS {
                if seq % (SEQS / 3) == 0 && seq < SEQS {
                    let want = seq / (SEQS / 3);
                    let deadline = std::time::Instant::now() + Duration::from_secs(60);
                    while swapped.load(Ordering::SeqCst) < want {
                        assert!(std::time::Instant::now() < deadline, "no swap came");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                log_end.store(seq, Ordering::SeqCst);
                loop {
                    match store.append(&record(seq)).await {
                        Ok(outcome) => {
                            outcomes.push((seq, outcome));
                            break;
                        }
                        Err(StoreError::UnderRepair { .. }) => {
                            waits += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("seq {seq}: {e}"),
                    }
                }
            }
            (outcomes, waits)
        })
    };
    let repairer = {
        let store: Arc<ScyllaStore> = b.store.clone();
        let log_end = log_end.clone();
        let swapped = swapped.clone();
        let user = mb.user_id.clone();
        tokio::spawn(async move {
            let mut swaps = 0;
            while log_end.load(Ordering::SeqCst) < SEQS {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let token = store.repair_begin(&user, LEASE).await.expect("fence");
                let end = log_end.load(Ordering::SeqCst);
                for seq in 1..=end {
                    store
                        .repair_append(&token, &record(seq))
                        .await
                        .expect("staged");
                }
                store.repair_swap(&token).await.expect("swap");
                swaps += 1;
                swapped.store(swaps, Ordering::SeqCst);
            }
            swaps
        })
    };
    let (outcomes, waits) = writer.await.expect("writer");
    let swaps = repairer.await.expect("repairer");
    eprintln!("{swaps} swaps, {waits} waits");
    assert!(swaps >= 2, "the repairs raced the writer ({swaps} swaps)");
    for (seq, outcome) in &outcomes {
        assert!(
            matches!(outcome, AppendOutcome::Inserted | AppendOutcome::Unchanged),
            "seq {seq}: {outcome:?}"
        );
    }
    assert_eq!(
        seqs(&*a.store, &mb).await,
        (1..=SEQS).collect::<Vec<_>>(),
        "every acknowledged write is in the rebuilt mailbox, once"
    );
}

// ---- error classes (SPEC 7) ----

/// A value the server cannot hold (here a TTL beyond Cassandra's 20-year limit, reachable only
/// by a policy that skipped the shared validation) is a deterministic refusal: the delivery ends
/// `rejected`/`store_refused` instead of being retried forever, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_server_cannot_hold_is_refused_not_retried() {
    let unchecked = mailbox_materializer::model::RetentionPolicy {
        retention_days: 3_650,
        future_window_days: 3_650,
        max_active_span_days: 30,
    };
    assert!(
        unchecked.validate().is_err(),
        "the shared validation refuses this policy for every backend"
    );
    let f = ScyllaFixture::start(unchecked, NOW0).await;
    let mb = mailbox("too-long", 1);
    let result = f
        .store
        .append(&group(&mb, 1, TODAY0 + 3_650, 1, "far"))
        .await;
    match &result {
        Err(e @ StoreError::Refused { .. }) => {
            assert_eq!((e.outcome(), e.kind()), ("rejected", "store_refused"));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        f.store.inspect(&mb).await.unwrap().current_epoch,
        None,
        "nothing written"
    );
}

/// Real server and driver errors, classified from the driver's error kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_errors_are_classified_by_kind() {
    use mailbox_materializer::store::classify::cql;

    let f = ScyllaFixture::start(policy(), NOW0).await;
    let ks = f.store.keyspace().to_owned();
    let session = f.store.session();

    // Invalid request: a TTL above the server's maximum.
    let invalid = session
        .query_unpaged(
            format!(
                "INSERT INTO {ks}.repair_registry (shard, user_id, holder) VALUES (0, 'u', 'h') \
                 USING TTL 700000000"
            ),
            (),
        )
        .await
        .expect_err("the server refuses the TTL");
    assert!(
        matches!(cql::classify(&invalid), StoreError::Refused { .. }),
        "{invalid}"
    );

    // Unavailable: LOCAL_QUORUM of three replicas on a one-node cluster.
    let wide = format!("{ks}_rf3");
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE {wide} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 3}}"
            ),
            (),
        )
        .await
        .expect("create keyspace");
    session
        .query_unpaged(format!("CREATE TABLE {wide}.t (k int PRIMARY KEY)"), ())
        .await
        .expect("create table");
    let mut insert =
        scylla::statement::Statement::new(format!("INSERT INTO {wide}.t (k) VALUES (1)"));
    insert.set_consistency(scylla::statement::Consistency::LocalQuorum);
    let unavailable = session
        .query_unpaged(insert, ())
        .await
        .expect_err("two of three replicas are missing");
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {wide}"), ())
        .await;
    assert!(
        matches!(cql::classify(&unavailable), StoreError::Unavailable { .. }),
        "{unavailable}"
    );

    // No server at all.
    let nobody = scylla::client::session_builder::SessionBuilder::new()
        .known_node("127.0.0.1:1")
        .connection_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        matches!(cql::classify(&nobody), StoreError::Unavailable { .. }),
        "{nobody}"
    );
}

// ---- cost (issue: one Paxos round per append) ----

/// An append costs the cluster one Paxos round (its commit), a replay that changes nothing and a
/// scan cost none: their reads are plain quorum reads of one partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_costs_one_paxos_round_and_a_no_op_replay_none() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let store = f.store.clone();
    let mb = mailbox("paxos", 1);
    let rounds = |before: u64| store.paxos_rounds() - before;

    let before = store.paxos_rounds();
    assert_eq!(
        store.append(&group(&mb, 1, TODAY0, 3, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(rounds(before), 1, "a cold append");
    for seq in 2..=5 {
        let before = store.paxos_rounds();
        assert_eq!(
            store
                .append(&group(&mb, seq, TODAY0 - seq % 2, 3, "a"))
                .await,
            Ok(AppendOutcome::Inserted)
        );
        assert_eq!(rounds(before), 1, "a warm append of seq {seq}");
    }
    let before = store.paxos_rounds();
    assert_eq!(
        store.append(&group(&mb, 3, TODAY0 - 1, 3, "a")).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert!(matches!(
        store.append(&group(&mb, 3, TODAY0, 3, "a")).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        store
            .append(&group(&mailbox("paxos", 0), 9, TODAY0, 1, "old"))
            .await,
        Ok(AppendOutcome::StaleEpoch)
    );
    let page = store
        .range_scan(
            &mb,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 3,
            },
        )
        .await
        .unwrap();
    assert_eq!(page.groups.len(), 3);
    store.inspect(&mb).await.unwrap();
    assert_eq!(
        rounds(before),
        0,
        "replays that change nothing, refusals, scans and inspections"
    );
    let before = store.paxos_rounds();
    assert_eq!(
        store.append(&group(&mb, 3, TODAY0 - 1, 2, "b")).await,
        Ok(AppendOutcome::Replaced)
    );
    store.truncate_before(&mb, 2).await.unwrap();
    assert_eq!(rounds(before), 2, "a replacement and a truncate");
}

/// A run of one mailbox's groups commits once: a cold mailbox's 40 inserts, identical replays
/// and a cross-day conflict among them cost ONE Paxos round; a run with a replace in the middle
/// commits before it, the replace alone, and the rest (three); a run that moves the epoch moves
/// with its first write, in the same commit as the rest (one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_costs_one_paxos_round() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let store = f.store.clone();
    let rounds = |before: u64| store.paxos_rounds() - before;
    let mb = mailbox("paxos-run", 1);
    let mut groups: Vec<EventGroup> = (1..=40)
        .map(|seq| group(&mb, seq, TODAY0 - seq % 3, 2, "a"))
        .collect();
    groups.push(group(&mb, 7, TODAY0 - 7 % 3, 2, "a"));
    groups.push(group(&mb, 8, TODAY0 - 5, 2, "a"));
    let run: Vec<&EventGroup> = groups.iter().collect();
    let before = store.paxos_rounds();
    let answers = store.append_run(&run).await;
    assert_eq!(rounds(before), 1, "{answers:?}");
    assert_eq!(answers.len(), 42);
    assert!(answers[..40]
        .iter()
        .all(|a| a == &Ok(AppendOutcome::Inserted)));
    assert_eq!(answers[40], Ok(AppendOutcome::Unchanged));
    assert!(matches!(answers[41], Err(StoreError::Conflict { .. })));

    let more = [
        group(&mb, 41, TODAY0, 1, "a"),
        group(&mb, 5, TODAY0 - 5 % 3, 1, "other"),
        group(&mb, 42, TODAY0, 1, "a"),
    ];
    let before = store.paxos_rounds();
    let answers = store.append_run(&more.iter().collect::<Vec<_>>()).await;
    assert_eq!(
        answers,
        vec![
            Ok(AppendOutcome::Inserted),
            Ok(AppendOutcome::Replaced),
            Ok(AppendOutcome::Inserted)
        ]
    );
    assert_eq!(
        rounds(before),
        3,
        "before the replace, the replace, after it"
    );

    let next = mailbox("paxos-run", 2);
    let moved = [
        group(&next, 1, TODAY0, 1, "n"),
        group(&next, 2, TODAY0, 1, "n"),
    ];
    let before = store.paxos_rounds();
    let answers = store.append_run(&moved.iter().collect::<Vec<_>>()).await;
    assert_eq!(answers, vec![Ok(AppendOutcome::Inserted); 2]);
    assert_eq!(rounds(before), 1, "the move and the rest");
    let inspected = store.inspect(&next).await.expect("inspect");
    assert_eq!(inspected.current_epoch, Some(2));
    assert_eq!(
        inspected.identity_count, 2,
        "only the new epoch's identities"
    );
}

// ---- readiness ----

/// `ping` is a real round trip: it fails while the server is down and succeeds again once it is
/// back, on a Cassandra this test starts and stops itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_follows_the_server_down_and_up() {
    let server = support::cassandra::PrivateCassandra::start("ping", (29442, 27400, 27499), "");
    let store = ScyllaStore::connect(
        mailbox_materializer::store::scylla::ScyllaSettings::new(
            vec![server.contact_point()],
            "mm_ping",
        ),
        policy(),
        Arc::new(mailbox_materializer::store::ManualClock::new(NOW0)),
    )
    .await
    .expect("connect to the private server");
    store.ping().await.expect("ping while the server runs");

    server.stop();
    let down = tokio::time::timeout(Duration::from_secs(30), store.ping())
        .await
        .expect("a ping answers within its own timeout, not later");
    assert!(
        matches!(down, Err(StoreError::Unavailable { .. })),
        "ping of a stopped server: {down:?}"
    );

    server.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match store.ping().await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("ping never recovered after the restart: {e}"),
        }
    }
}

// ---- TLS and datacenter-aware routing ----

/// Runs a command of the certificate tooling; a failure is loud.
fn tool(dir: &std::path::Path, program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA, a node certificate for 127.0.0.1 signed by it (in a PKCS12 keystore for
/// Cassandra), a client certificate signed by it, the CA in a truststore, and an unrelated CA.
fn make_certificates(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let days = ["-days", "2"];
    for (key, cert, cn) in [
        ("ca.key", "ca.crt", "/CN=mm-test-ca"),
        ("other.key", "other.crt", "/CN=mm-other-ca"),
    ] {
        tool(
            dir,
            "openssl",
            &[
                &[
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-subj", cn,
                ][..],
                &days[..],
            ]
            .concat(),
        );
    }
    std::fs::write(dir.join("node.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    for (name, cn, ext) in [
        ("node", "/CN=127.0.0.1", true),
        ("client", "/CN=materializer", false),
    ] {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        tool(
            dir,
            "openssl",
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", cn,
            ],
        );
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
        ];
        if ext {
            sign.extend(["-extfile", "node.ext"]);
        }
        tool(dir, "openssl", &sign);
    }
    tool(
        dir,
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-in",
            "node.crt",
            "-inkey",
            "node.key",
            "-certfile",
            "ca.crt",
            "-out",
            "node.p12",
            "-passout",
            "pass:changeit",
            "-name",
            "node",
        ],
    );
    tool(
        dir,
        "keytool",
        &[
            "-importcert",
            "-noprompt",
            "-alias",
            "ca",
            "-file",
            "ca.crt",
            "-keystore",
            "trust.p12",
            "-storetype",
            "PKCS12",
            "-storepass",
            "changeit",
        ],
    );
}

/// A Cassandra that only speaks TLS and requires a client certificate, both from a private CA:
/// refused without that CA (or with another one, or without the client certificate), accepted
/// with it, through the library and through the command line's `[store.scylla.tls]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_against_the_configured_ca() {
    use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaTls};

    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("tls-test-{}", std::process::id()));
    make_certificates(&dir);
    let path = |f: &str| dir.join(f);
    let yaml = format!(
        "client_encryption_options:\n  enabled: true\n  optional: false\n  keystore: {}\n  \
         keystore_password: changeit\n  store_type: PKCS12\n  require_client_auth: true\n  \
         truststore: {}\n  truststore_password: changeit",
        path("node.p12").display(),
        path("trust.p12").display()
    );
    let server = support::cassandra::PrivateCassandra::start("tls", (29542, 27500, 27599), &yaml);
    let client = Some((path("client.crt"), path("client.key")));
    let connect = |tls: Option<ScyllaTls>| {
        let mut settings = ScyllaSettings::new(vec![server.contact_point()], "mm_tls");
        settings.connect_timeout = Duration::from_secs(5);
        settings.tls = tls;
        ScyllaStore::connect(
            settings,
            policy(),
            Arc::new(mailbox_materializer::store::ManualClock::new(NOW0)),
        )
    };
    let refusals = [
        ("plain connection", None),
        (
            "system roots only",
            Some(ScyllaTls {
                ca_file: None,
                client_cert: client.clone(),
                verify: true,
            }),
        ),
        (
            "another CA",
            Some(ScyllaTls {
                ca_file: Some(path("other.crt")),
                client_cert: client.clone(),
                verify: true,
            }),
        ),
        (
            "no client certificate",
            Some(ScyllaTls {
                ca_file: Some(path("ca.crt")),
                client_cert: None,
                verify: true,
            }),
        ),
    ];
    for (case, tls) in refusals {
        match connect(tls).await {
            Err(StoreError::Unavailable { detail, .. }) => eprintln!("{case}: refused: {detail}"),
            Err(other) => panic!("{case}: {other:?}"),
            Ok(_) => panic!("{case}: connected"),
        }
    }

    let store = connect(Some(ScyllaTls {
        ca_file: Some(path("ca.crt")),
        client_cert: client.clone(),
        verify: true,
    }))
    .await
    .expect("TLS with the private CA and the client certificate");
    let mb = mailbox("over-tls", 1);
    assert_eq!(
        store.append(&group(&mb, 1, TODAY0, 2, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(seqs(&store, &mb).await, vec![1]);
    store.ping().await.expect("ping over TLS");

    // The same through the configuration file the daemon and the commands read.
    let config = |ca: Option<&str>| {
        let ca = ca.map_or(String::new(), |f| {
            format!("ca_file = {:?}\n", path(f).display().to_string())
        });
        let text = format!(
            "[store]\nbackend = \"scylla\"\n[store.scylla]\nnodes = [\"{}\"]\nkeyspace = \"mm_tls\"\n\
             [store.scylla.tls]\n{ca}cert_file = {:?}\nkey_file = {:?}\n",
            server.contact_point(),
            path("client.crt").display().to_string(),
            path("client.key").display().to_string()
        );
        let file = path(&format!("config-{}.toml", ca.len()));
        std::fs::write(&file, text).unwrap();
        file
    };
    let with_ca = config(Some("ca.crt"));
    let inspect = |file: &std::path::Path| {
        support::cli::run_materializer(
            &[
                "--config",
                file.to_str().unwrap(),
                "inspect",
                "--user",
                "over-tls",
                "--epoch",
                "1",
            ],
            None,
        )
    };
    let out = inspect(&with_ca);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(support::cli::json_lines(&out)[0]["seqbucket_max_seq"], 1);
    let out = inspect(&config(None));
    assert_eq!(
        out.status.code(),
        Some(2),
        "without the CA the store is unreachable: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(store);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `local_dc` routes to the named datacenter; a name no node carries is refused at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_dc_routes_to_a_datacenter_of_the_cluster() {
    use mailbox_materializer::store::scylla::ScyllaSettings;
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let connect = |dc: &str| {
        let mut settings = ScyllaSettings::new(conformance::scylla::nodes(), f.store.keyspace());
        settings.local_dc = Some(dc.to_owned());
        ScyllaStore::connect(
            settings,
            policy(),
            Arc::new(mailbox_materializer::store::ManualClock::new(NOW0)),
        )
    };
    let local = connect("datacenter1")
        .await
        .expect("the cluster's datacenter");
    let mb = mailbox("routed", 1);
    assert_eq!(
        local.append(&group(&mb, 1, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    match connect("dc-nowhere").await {
        Err(StoreError::Unavailable { detail, .. }) => assert!(
            detail.contains("local_dc") && detail.contains("datacenter1"),
            "{detail}"
        ),
        other => panic!("{other:?}"),
    }
}

/// SPEC 7.2 "Readers never see a torn step": a scan reads the identity of a group, then a
/// same-day replace commits and deletes the old copy's rows, then the scan reads the events.
/// Before, the scan found no rows for the identity it held and silently left the group out of a
/// page whose `up_to` covered it; now it reads again and answers the new copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_beside_a_same_day_replace_never_skips_the_group() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let mb = mailbox("torn", 1);
    for seq in 1..=3 {
        assert_eq!(
            f.store.append(&group(&mb, seq, TODAY0, 2, "old")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    let replaced = Arc::new(AtomicBool::new(false));
    f.store.set_between_scan_reads_hook(Some({
        let (store, replaced) = (f.store.clone(), replaced.clone());
        Arc::new(move || {
            let (store, replaced) = (store.clone(), replaced.clone());
            Box::pin(async move {
                let outcome = store
                    .append(&group(&mailbox("torn", 1), 2, TODAY0, 2, "new"))
                    .await;
                assert_eq!(outcome, Ok(AppendOutcome::Replaced));
                replaced.store(true, Ordering::SeqCst);
            })
        })
    }));
    let page = f
        .store
        .range_scan(
            &mb,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .expect("scan");
    assert!(
        replaced.load(Ordering::SeqCst),
        "the replace ran inside the scan"
    );
    assert_eq!(page.up_to, 3);
    assert_eq!(
        page.groups
            .iter()
            .map(|g| g.mailbox_seq)
            .collect::<Vec<_>>(),
        vec![1, 2, 3],
        "no group the page covers is skipped"
    );
    assert!(page.groups[1].events[0].payload.as_str().contains("new"));
}

/// A swap that committed succeeds even when the clean-up after its commit fails (the replaced
/// copy's rows and the repair's registration are left for the patrol): before, the repair was
/// reported failed (exit 2) though the rebuilt copy was already live and the fence lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_swap_succeeds_even_when_its_clean_up_fails() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let mb = mailbox("swap-clean-up", 1);
    for seq in 1..=2 {
        assert_eq!(
            f.store.append(&group(&mb, seq, TODAY0, 2, "live")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    let token = f
        .store
        .repair_begin(&mb.user_id, LEASE)
        .await
        .expect("fence");
    f.store
        .repair_append(&token, &group(&mb, 1, TODAY0, 2, "log"))
        .await
        .expect("staged");
    // Write 1 is the swap's commit; write 2, the first of its clean-up, fails.
    f.store.arm_failpoint(Some(2));
    let swapped = f.store.repair_swap(&token).await;
    f.store.arm_failpoint(None);
    assert!(swapped.is_ok(), "{swapped:?}");
    assert_eq!(
        seqs(f.store.as_ref(), &mb).await,
        vec![1],
        "the rebuilt copy is live"
    );
    assert_eq!(
        f.store.append(&group(&mb, 3, TODAY0, 1, "after")).await,
        Ok(AppendOutcome::Inserted),
        "the fence is lifted"
    );
}

/// A Paxos round that applied and whose answer was lost (a CAS write timeout with an unknown
/// outcome): for every write of an insert and of a replace, the operation fails right after
/// it as if its answer were lost there (before the commit: nothing applied; at the commit: it
/// applied). The retry of that delivery (its write token) answers the true outcome, `inserted`
/// or `replaced`, whichever it was; another reading of the record answers `unchanged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_is_answered_with_its_true_outcome() {
    use conformance::from_log;
    let f = ScyllaFixture::start(policy(), NOW0).await;
    for (name, replace) in [("insert", false), ("replace", true)] {
        let mut failpoint = 1;
        let mut applied_before_answer = 0;
        loop {
            let mb = mailbox(&format!("lost-{name}-{failpoint}"), 1);
            if replace {
                let first = from_log(group(&mb, 1, TODAY0, 2, "v1"), 10, 1);
                assert_eq!(f.store.append(&first).await, Ok(AppendOutcome::Inserted));
            }
            let write = from_log(group(&mb, 1, TODAY0, 3, "v2"), 20, 2);
            let truth = if replace {
                AppendOutcome::Replaced
            } else {
                AppendOutcome::Inserted
            };
            f.store.arm_failpoint(Some(failpoint));
            let first = f.store.append(&write).await;
            f.store.arm_failpoint(None);
            match first {
                Ok(outcome) => {
                    assert_eq!(outcome, truth, "{name}: without a failure");
                    assert!(failpoint > 1, "{name}: the operation wrote nothing");
                    break;
                }
                Err(StoreError::Unavailable { detail, .. }) => {
                    assert!(detail.contains("failpoint"), "{name}: {detail}");
                }
                Err(other) => panic!("{name}, failpoint {failpoint}: {other}"),
            }
            // Whether the lost attempt applied, as a reader sees it.
            let page = observe(f.store.as_ref(), &mb).await.0.expect("scan");
            if page.groups.iter().any(|g| g.events.len() == 3) {
                applied_before_answer += 1;
            }
            assert_eq!(
                f.store.append(&write).await,
                Ok(truth),
                "{name}, failpoint {failpoint}: the retry of the delivery whose answer was lost"
            );
            let other_reading = from_log(group(&mb, 1, TODAY0, 3, "v2"), 20, 3);
            assert_eq!(
                f.store.append(&other_reading).await,
                Ok(AppendOutcome::Unchanged),
                "{name}, failpoint {failpoint}: another reading of the record"
            );
            failpoint += 1;
        }
        eprintln!("{name}: {applied_before_answer} failpoint(s) after the commit");
        assert!(
            applied_before_answer >= 1,
            "{name}: no failpoint fell after the commit"
        );
    }
}

/// `store.scylla.max_in_flight_appends` reaches the store the runner asks (the runner's own
/// tests hold it to the limit at every boundary); Redis and memory keep the runner's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_appends_in_flight_reach_the_store() {
    use mailbox_materializer::config::{Backend, Config, DEFAULT_SCYLLA_APPENDS_IN_FLIGHT};
    async fn limit_of(config: &Config) -> Option<usize> {
        mailbox_materializer::cli::open_store::open(config)
            .await
            .expect("open")
            .store
            .max_appends_in_flight()
    }
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let mut config = Config::default();
    config.store.backend = Backend::Scylla;
    config.store.scylla.nodes = conformance::scylla::nodes();
    config.store.scylla.keyspace = f.store.keyspace().to_owned();
    assert_eq!(
        limit_of(&config).await,
        Some(DEFAULT_SCYLLA_APPENDS_IN_FLIGHT)
    );
    config.store.scylla.max_in_flight_appends = 3;
    config.validate().expect("valid");
    assert_eq!(limit_of(&config).await, Some(3));
    config.store.backend = Backend::Memory;
    assert_eq!(limit_of(&config).await, None);
}

/// SPEC 7.2: a replace's clean-up of the old version's rows never deletes what a newer owner
/// wrote. The old owner replaces A with B and freezes between its commit and its clean-up; the
/// new owner, from a later offset, writes A again; the old owner wakes and runs its clean-up.
/// Before, the new owner's A rows had the very key of the rows the clean-up deleted, and every
/// later scan and replay of the mailbox answered `corrupt`; now the mailbox holds A, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_waking_between_its_commit_and_its_clean_up_deletes_nothing_live() {
    use mailbox_materializer::model::{LogId, SourcePosition};
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let mb = mailbox("aba", 1);
    let log = LogId::topic_id("aba-log").expect("log id");
    let version = |tag: &str, offset: i64| {
        let mut g = group(&mb, 1, TODAY0, 3, tag);
        g.source = Some(SourcePosition::new(log.clone(), 0, offset));
        g
    };
    assert_eq!(
        f.store.append(&version("A", 10)).await,
        Ok(AppendOutcome::Inserted)
    );
    let rewritten = Arc::new(AtomicBool::new(false));
    f.store.set_after_replace_commit_hook(Some({
        let (store, rewritten, again) = (f.store.clone(), rewritten.clone(), version("A", 30));
        Arc::new(move || {
            let (store, rewritten, again) = (store.clone(), rewritten.clone(), again.clone());
            Box::pin(async move {
                // The newer owner, while the old one is frozen: A again, from a later offset.
                assert_eq!(store.append(&again).await, Ok(AppendOutcome::Replaced));
                rewritten.store(true, Ordering::SeqCst);
            })
        })
    }));
    // The old owner's A -> B (offset 20): committed, then frozen, then its clean-up.
    assert_eq!(
        f.store.append(&version("B", 20)).await,
        Ok(AppendOutcome::Replaced)
    );
    assert!(
        rewritten.load(Ordering::SeqCst),
        "the newer owner wrote inside the window"
    );
    let page = f
        .store
        .range_scan(
            &mb,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .expect("the mailbox is whole");
    assert_eq!(page.groups.len(), 1);
    assert_eq!(page.groups[0].events.len(), 3, "every event of A is there");
    assert!(page.groups[0].events[0].payload.as_str().contains("\"A\""));
    // The old owner's write of B again is superseded; the log's A again is unchanged.
    assert_eq!(
        f.store.append(&version("B", 20)).await,
        Ok(AppendOutcome::Superseded)
    );
    assert_eq!(
        f.store.append(&version("A", 30)).await,
        Ok(AppendOutcome::Unchanged)
    );
}

/// SPEC 7.3 on Scylla: the keyspace's marker. A new keyspace is not a wipe; the first write that
/// lands writes the marker; once the keyspace is truncated (every table, the marker with it) a
/// process that wrote there answers `store_lost` before its next write lands, nothing is
/// written, and a process started on the empty keyspace finds it empty (`(0, false)`), so the
/// daemon can tell it from a new one by its group's offsets. Accepting the loss writes the
/// marker again and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_keyspace_is_a_lost_store_until_the_loss_is_accepted() {
    let f = ScyllaFixture::start(policy(), NOW0).await;
    let store = f.store.clone();
    let mb = mailbox("marker", 1);
    assert_eq!(store.load_data_markers().await, Ok(Some((0, false))), "new");
    assert_eq!(
        store.append(&group(&mb, 1, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(store.load_data_markers().await, Ok(Some((1, true))));

    let ks = store.keyspace().to_owned();
    for table in ["user_mailbox", "mailbox_events", "store_marker"] {
        store
            .session()
            .query_unpaged(format!("TRUNCATE {ks}.{table}"), ())
            .await
            .expect("truncate");
    }
    // The last read of the marker vouches for a second.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let answer = store.append(&group(&mb, 2, TODAY0, 1, "b")).await;
    assert!(
        answer.as_ref().is_err_and(StoreError::is_store_lost),
        "{answer:?}"
    );
    assert!(
        matches!(
            store.truncate_before(&mb, 2).await,
            Err(ref e) if e.is_store_lost()
        ),
        "a truncate waits too"
    );
    assert_eq!(
        seqs(store.as_ref(), &mb).await,
        Vec::<u64>::new(),
        "nothing written"
    );

    // Another process on the empty keyspace: empty, and told it was wiped it waits as well.
    let other = ScyllaFixture::start_in(ks.clone(), policy(), NOW0).await;
    assert_eq!(other.store.load_data_markers().await, Ok(Some((0, false))));
    other.store.expect_data_everywhere();
    assert!(other
        .store
        .append(&group(&mb, 2, TODAY0, 1, "b"))
        .await
        .is_err_and(|e| e.is_store_lost()));

    assert_eq!(store.accept_data_loss().await, Ok(Some(1)));
    assert_eq!(
        store.append(&group(&mb, 2, TODAY0, 1, "b")).await,
        Ok(AppendOutcome::Inserted)
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(
        other.store.append(&group(&mb, 3, TODAY0, 1, "c")).await,
        Ok(AppendOutcome::Inserted),
        "the accepted marker is every process's"
    );
    assert_eq!(seqs(store.as_ref(), &mb).await, vec![2, 3]);
}
