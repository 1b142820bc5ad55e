//! Repair (SPEC 7.1), written once against the store trait: the fence, the staging copy, the
//! atomic swap, and what an aborted or crashed repair leaves behind (nothing live changes).

use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::model::error::ConflictKind;
use mailbox_materializer::model::{AppendOutcome, StoreError};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::{MailboxStore, RepairToken};

use super::{group, mailbox, policy, user, Harness, NOW0, TODAY0};

type H = Arc<dyn Harness>;

const LEASE: Duration = Duration::from_secs(60);

async fn seqs_of(
    store: &dyn MailboxStore,
    mb: &mailbox_materializer::model::MailboxId,
) -> Vec<u64> {
    let page = store
        .range_scan(
            mb,
            mailbox_materializer::model::ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 1000,
            },
        )
        .await
        .expect("scan succeeds");
    page.groups.iter().map(|g| g.mailbox_seq).collect()
}

async fn stage(
    store: &dyn MailboxStore,
    token: &RepairToken,
    g: &mailbox_materializer::model::EventGroup,
) -> AppendOutcome {
    store
        .repair_append(token, g)
        .await
        .expect("staged append succeeds")
}

fn under_repair<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::UnderRepair { .. }))
}

fn fence_lost<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::FenceLost { .. }))
}

/// While the fence is held, live writes to the user wait (nothing written), other users flow,
/// the live mailbox is untouched by the rebuild, and the swap replaces it in one step.
pub async fn repair_fence_holds_live_writes_and_swap_replaces(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-victim", 1);
    let other = mailbox("r-bystander", 1);
    for seq in 1..=3 {
        assert_eq!(
            store.append(&group(&mb, seq, TODAY0, 2, "live")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    let token = store
        .repair_begin(&mb.user_id, LEASE)
        .await
        .expect("fence taken");
    let before = f.fingerprint(&mb.user_id).await;

    assert!(under_repair(
        &store.append(&group(&mb, 4, TODAY0, 1, "x")).await
    ));
    assert!(under_repair(&store.truncate_before(&mb, 2).await));
    assert_eq!(
        f.fingerprint(&mb.user_id).await,
        before,
        "a refused live write leaves nothing behind"
    );
    assert_eq!(
        store.append(&group(&other, 1, TODAY0, 1, "o")).await,
        Ok(AppendOutcome::Inserted)
    );

    // The rebuild: seq 1 and 2 as in the log, seq 2 with the log's (different) content.
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 1, TODAY0, 2, "live")).await,
        AppendOutcome::Inserted
    );
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 2, TODAY0, 2, "log")).await,
        AppendOutcome::Inserted
    );
    assert_eq!(
        seqs_of(store.as_ref(), &mb).await,
        vec![1, 2, 3],
        "live untouched until the swap"
    );

    let report = store.repair_swap(&token).await.expect("swap");
    assert_eq!(report.staged_groups, 2);
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1, 2]);
    let page = store
        .range_scan(
            &mb,
            mailbox_materializer::model::ScanRequest {
                after_seq: 1,
                until_seq: Some(2),
                limit_groups: 10,
            },
        )
        .await
        .expect("scan");
    assert_eq!(
        page.groups[0].events[0].payload.as_str(),
        r#"{"i":0,"tag":"log"}"#
    );

    // The fence is lifted by the swap: live writes flow again, in the rebuilt mailbox.
    assert_eq!(
        store.append(&group(&mb, 3, TODAY0, 1, "after")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1, 2, 3]);
    assert!(
        fence_lost(&store.repair_swap(&token).await),
        "a token swaps once"
    );
}

/// An aborted repair leaves every byte of the user as it was before the repair began, and the
/// next repair starts from an empty staging copy.
pub async fn repair_abort_leaves_the_live_mailbox_untouched(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-abort", 1);
    for seq in 1..=2 {
        store
            .append(&group(&mb, seq, TODAY0, 1, "live"))
            .await
            .expect("append");
    }
    let before = f.fingerprint(&mb.user_id).await;
    let token = store.repair_begin(&mb.user_id, LEASE).await.expect("fence");
    stage(store.as_ref(), &token, &group(&mb, 7, TODAY0, 1, "staged")).await;
    store.repair_abort(&token).await.expect("abort");
    assert_eq!(
        f.fingerprint(&mb.user_id).await,
        before,
        "abort restores every byte"
    );
    assert!(fence_lost(
        &store
            .repair_append(&token, &group(&mb, 8, TODAY0, 1, "late"))
            .await
    ));
    assert_eq!(
        store.append(&group(&mb, 3, TODAY0, 1, "live")).await,
        Ok(AppendOutcome::Inserted)
    );

    let token = store
        .repair_begin(&mb.user_id, LEASE)
        .await
        .expect("fence again");
    stage(store.as_ref(), &token, &group(&mb, 5, TODAY0, 1, "fresh")).await;
    store.repair_swap(&token).await.expect("swap");
    assert_eq!(
        seqs_of(store.as_ref(), &mb).await,
        vec![5],
        "nothing of the aborted staging copy survived"
    );
}

/// One repair per user at a time; renewing is only for the holder.
pub async fn repair_second_repair_is_refused(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let u = user("r-twice");
    let first = store.repair_begin(&u, LEASE).await.expect("fence");
    assert!(under_repair(&store.repair_begin(&u, LEASE).await));
    store
        .repair_renew(&first, LEASE)
        .await
        .expect("holder renews");
    let stranger = RepairToken::new(u.clone());
    assert!(fence_lost(&store.repair_renew(&stranger, LEASE).await));
    assert!(fence_lost(&store.repair_swap(&stranger).await));
    store
        .repair_abort(&stranger)
        .await
        .expect("abort of a stranger is a no-op");
    assert!(
        under_repair(&store.repair_begin(&u, LEASE).await),
        "the stranger lifted nothing"
    );
    store.repair_abort(&first).await.expect("abort");
    let again = store.repair_begin(&u, LEASE).await.expect("free again");
    store.repair_abort(&again).await.expect("abort");
}

/// A repair writes only its own user: another user's group or truncate is refused with nothing
/// staged and nothing live touched, and the swap brings in only the fenced user's groups.
pub async fn repair_writes_only_its_own_user(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mine = mailbox("r-mine", 1);
    let other = mailbox("r-other", 1);
    store
        .append(&group(&other, 1, TODAY0, 1, "other's"))
        .await
        .expect("append");
    let other_before = f.fingerprint(&other.user_id).await;
    let token = store
        .repair_begin(&mine.user_id, LEASE)
        .await
        .expect("fence");
    stage(store.as_ref(), &token, &group(&mine, 1, TODAY0, 1, "mine")).await;
    assert!(matches!(
        store
            .repair_append(&token, &group(&other, 2, TODAY0, 1, "stray"))
            .await,
        Err(StoreError::Unsupported { .. })
    ));
    assert!(matches!(
        store.repair_truncate(&token, &other, 2).await,
        Err(StoreError::Unsupported { .. })
    ));
    store.repair_swap(&token).await.expect("swap");
    assert_eq!(
        seqs_of(store.as_ref(), &mine).await,
        vec![1],
        "only the fenced user's own group went live"
    );
    assert_eq!(
        f.fingerprint(&other.user_id).await,
        other_before,
        "the other user is untouched"
    );
}

/// A lapsed lease is lost for good: renewal does not take it back, the staged copy cannot be
/// written or swapped, the live mailbox is as it was, and live writes flow again.
pub async fn repair_lost_lease_aborts_without_swap(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-lapse", 1);
    store
        .append(&group(&mb, 1, TODAY0, 1, "live"))
        .await
        .expect("append");
    let token = store.repair_begin(&mb.user_id, LEASE).await.expect("fence");
    stage(store.as_ref(), &token, &group(&mb, 9, TODAY0, 1, "staged")).await;
    f.set_now(NOW0 + LEASE.as_secs() + 5).await;
    assert!(
        fence_lost(&store.repair_renew(&token, LEASE).await),
        "a lapsed fence is not re-taken"
    );
    assert!(fence_lost(
        &store
            .repair_append(&token, &group(&mb, 10, TODAY0, 1, "x"))
            .await
    ));
    assert!(fence_lost(&store.repair_swap(&token).await));
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1]);
    assert_eq!(
        store.append(&group(&mb, 2, TODAY0, 1, "live")).await,
        Ok(AppendOutcome::Inserted)
    );
    store.repair_abort(&token).await.expect("abort after loss");
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1, 2]);
}

/// The recovery path for `Corrupt`: the live mailbox keeps failing closed while the rebuild runs,
/// and the swap heals it.
pub async fn repair_heals_a_corrupt_mailbox(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-corrupt", 1);
    for seq in 1..=3 {
        store
            .append(&group(&mb, seq, TODAY0, 2, "log"))
            .await
            .expect("append");
    }
    assert!(f.corrupt(&mb, Corruption::LoseIdentityIndex).await);
    assert!(matches!(
        store.append(&group(&mb, 4, TODAY0, 1, "log")).await,
        Err(StoreError::Corrupt { .. })
    ));
    let token = store.repair_begin(&mb.user_id, LEASE).await.expect("fence");
    for seq in 1..=3 {
        stage(store.as_ref(), &token, &group(&mb, seq, TODAY0, 2, "log")).await;
    }
    let still = store.inspect(&mb).await.expect("inspect");
    assert!(
        !still.identity_index_present,
        "the live mailbox is untouched (still corrupt) before the swap"
    );
    store.repair_swap(&token).await.expect("swap");
    assert_eq!(
        store.append(&group(&mb, 4, TODAY0, 1, "log")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        store.append(&group(&mb, 2, TODAY0, 2, "log")).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1, 2, 3, 4]);
}

/// The rebuild follows the log through an epoch move; the swap replaces every live epoch.
pub async fn repair_rebuilds_epoch_moves_and_replaces_every_epoch(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let e1 = mailbox("r-epochs", 1);
    let e2 = mailbox("r-epochs", 2);
    let e3 = mailbox("r-epochs", 3);
    store
        .append(&group(&e1, 1, TODAY0, 1, "a"))
        .await
        .expect("append");
    store
        .append(&group(&e3, 1, TODAY0, 1, "wrong"))
        .await
        .expect("append");
    let token = store.repair_begin(&e1.user_id, LEASE).await.expect("fence");
    stage(store.as_ref(), &token, &group(&e1, 1, TODAY0, 1, "a")).await;
    assert_eq!(
        stage(store.as_ref(), &token, &group(&e2, 1, TODAY0, 1, "b")).await,
        AppendOutcome::Inserted
    );
    assert_eq!(
        stage(store.as_ref(), &token, &group(&e1, 2, TODAY0, 1, "late")).await,
        AppendOutcome::StaleEpoch
    );
    store.repair_swap(&token).await.expect("swap");
    assert_eq!(seqs_of(store.as_ref(), &e2).await, vec![1]);
    assert_eq!(
        store.inspect(&e2).await.expect("inspect").current_epoch,
        Some(2)
    );
    assert!(matches!(
        store
            .range_scan(
                &e3,
                mailbox_materializer::model::ScanRequest {
                    after_seq: 0,
                    until_seq: None,
                    limit_groups: 10
                }
            )
            .await,
        Err(StoreError::EpochMismatch { current: Some(2) })
    ));
}

/// Staged writes follow the append rules exactly (conflicts, trims, replacements).
pub async fn repair_staging_follows_the_append_rules(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-rules", 1);
    let token = store.repair_begin(&mb.user_id, LEASE).await.expect("fence");
    stage(store.as_ref(), &token, &group(&mb, 1, TODAY0, 1, "a")).await;
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 1, TODAY0, 1, "a")).await,
        AppendOutcome::Unchanged
    );
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 1, TODAY0, 1, "b")).await,
        AppendOutcome::Replaced
    );
    assert_eq!(
        store
            .repair_append(&token, &group(&mb, 1, TODAY0 - 1, 1, "b"))
            .await,
        Err(StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: TODAY0,
                incoming_day: TODAY0 - 1
            }
        })
    );
    let trimmed = store
        .repair_truncate(&token, &mb, 3)
        .await
        .expect("staged truncate");
    assert_eq!(trimmed.user_trim_seq, 3);
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 2, TODAY0, 1, "c")).await,
        AppendOutcome::Trimmed
    );
    assert_eq!(
        stage(store.as_ref(), &token, &group(&mb, 3, TODAY0, 1, "c")).await,
        AppendOutcome::Inserted
    );
    let report = store.repair_swap(&token).await.expect("swap");
    assert_eq!(report.staged_groups, 1);
    assert_eq!(store.inspect(&mb).await.expect("inspect").user_trim_seq, 3);
    let page = store
        .range_scan(
            &mb,
            mailbox_materializer::model::ScanRequest {
                after_seq: 2,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .expect("scan after the trim");
    assert_eq!(
        page.groups
            .iter()
            .map(|g| g.mailbox_seq)
            .collect::<Vec<_>>(),
        vec![3]
    );
}

/// A repair that crashed (no abort) leaves a staging copy that garbage collection removes once
/// its lease lapsed, restoring the user's stored state byte for byte.
pub async fn repair_garbage_of_a_crashed_repair_is_collected(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("r-crash", 1);
    store
        .append(&group(&mb, 1, TODAY0, 1, "live"))
        .await
        .expect("append");
    let before = f.fingerprint(&mb.user_id).await;
    let token = store.repair_begin(&mb.user_id, LEASE).await.expect("fence");
    for seq in 1..=3 {
        stage(
            store.as_ref(),
            &token,
            &group(&mb, seq, TODAY0, 1, "staged"),
        )
        .await;
    }
    drop(token); // the process died here
    assert_eq!(
        store.repair_collect_garbage(true).await,
        Ok(0),
        "a dry run: a live fence's staging copy is not garbage"
    );
    assert_eq!(
        store.repair_collect_garbage(false).await,
        Ok(0),
        "a live fence's staging copy is not garbage"
    );
    f.set_now(NOW0 + LEASE.as_secs() + 5).await;
    let staged = f.fingerprint(&mb.user_id).await;
    let would = store.repair_collect_garbage(true).await.expect("dry run");
    assert!(would >= 1, "the dry run counts the crashed repair's copy");
    assert_eq!(
        f.fingerprint(&mb.user_id).await,
        staged,
        "a dry run changes nothing"
    );
    assert_eq!(
        store.repair_collect_garbage(false).await,
        Ok(would),
        "the pass removes what the dry run counted"
    );
    assert_eq!(
        f.fingerprint(&mb.user_id).await,
        before,
        "nothing of the crashed repair is left"
    );
    assert_eq!(seqs_of(store.as_ref(), &mb).await, vec![1]);
}

/// `append_many` answers each group exactly as `append` would, in the order given, whatever the
/// others' outcomes (the daemon sends the heads of many lanes together).
pub async fn append_many_answers_each_group_like_append(h: &H) {
    use mailbox_materializer::model::error::RejectKind;
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let a = mailbox("many-a", 1);
    let b = mailbox("many-b", 1);
    let c = mailbox("many-c", 1);
    let d = mailbox("many-d", 1);
    store
        .append(&group(&c, 1, TODAY0, 2, "c"))
        .await
        .expect("append");
    store
        .append(&group(&d, 1, TODAY0, 1, "d"))
        .await
        .expect("append");
    let mut duplicate = group(&b, 1, TODAY0, 2, "b");
    duplicate.events[1].event_ordinal = 0;
    let fresh = group(&a, 1, TODAY0, 2, "a");
    let replay = group(&c, 1, TODAY0, 2, "c");
    let cross_day = group(&d, 1, TODAY0 - 1, 1, "d");
    let results = store
        .append_many(&[&fresh, &duplicate, &replay, &cross_day])
        .await;
    assert_eq!(results.len(), 4);
    assert_eq!(results[0], Ok(AppendOutcome::Inserted));
    assert!(matches!(
        results[1],
        Err(StoreError::Rejected {
            kind: RejectKind::DuplicateOrdinal,
            ..
        })
    ));
    assert_eq!(results[2], Ok(AppendOutcome::Unchanged));
    assert_eq!(
        results[3],
        Err(StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: TODAY0,
                incoming_day: TODAY0 - 1
            }
        })
    );
    assert_eq!(seqs_of(store.as_ref(), &a).await, vec![1]);
    assert!(
        f.fingerprint(&b.user_id).await.is_empty() || seqs_of(store.as_ref(), &b).await.is_empty()
    );
    assert!(store.append_many(&[]).await.is_empty());
}

/// SPEC 7.1 both ways on random histories: a repair stages each group alone or in runs (its
/// groups come as runs), the same answers, and after the swap the same inspection and pages.
pub async fn repair_randomized_staged_histories_agree_in_runs_and_one_by_one(h: &H) {
    super::history::compare_staged_runs_with_one_by_one(h.clone(), 12).await;
}

/// A repair rebuilds one mailbox from its whole log, so its groups reach the staging copy as
/// runs (`StagingView::append_run`, one script call on Redis). Each group is answered exactly
/// as `repair_append` alone answers it, and the swapped-in mailbox is the one one-by-one
/// staging builds; a run whose fence was lost stops at its first group, nothing staged.
pub async fn repair_runs_answer_each_group_like_repair_append(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let in_runs = mailbox("r-runs", 1);
    let one_by_one = mailbox("r-one-by-one", 1);
    // insert, identical replay, replace, cross-day conflict (final: the run goes on), a second
    // day, a later seq, and its identical replay.
    let shapes: [(u64, u64, u32, &str); 7] = [
        (1, TODAY0, 2, "a"),
        (1, TODAY0, 2, "a"),
        (1, TODAY0, 2, "b"),
        (1, TODAY0 - 1, 2, "b"),
        (2, TODAY0 - 1, 1, "c"),
        (3, TODAY0, 3, "d"),
        (2, TODAY0 - 1, 1, "c"),
    ];
    let run_token = store
        .repair_begin(&in_runs.user_id, LEASE)
        .await
        .expect("fence");
    let single_token = store
        .repair_begin(&one_by_one.user_id, LEASE)
        .await
        .expect("fence");
    let run: Vec<_> = shapes
        .iter()
        .map(|&(seq, day, events, text)| group(&in_runs, seq, day, events, text))
        .collect();
    let view = mailbox_materializer::store::StagingView::new(store.clone(), run_token.clone());
    let answers = view.append_run(&run.iter().collect::<Vec<_>>()).await;
    let mut expected = Vec::new();
    for &(seq, day, events, text) in &shapes {
        expected.push(
            store
                .repair_append(&single_token, &group(&one_by_one, seq, day, events, text))
                .await,
        );
    }
    assert_eq!(answers, expected, "a staged run answers as one by one");
    assert_eq!(
        answers.iter().filter(|a| a.is_err()).count(),
        1,
        "{answers:?}"
    );
    store
        .repair_swap(&run_token)
        .await
        .expect("swap the run's copy");
    store
        .repair_swap(&single_token)
        .await
        .expect("swap the one-by-one copy");
    let runs_seqs = seqs_of(store.as_ref(), &in_runs).await;
    assert_eq!(runs_seqs, seqs_of(store.as_ref(), &one_by_one).await);
    assert_eq!(runs_seqs, vec![1, 2, 3]);

    // A lost fence: the run stops at its first group and stages nothing.
    let token = store
        .repair_begin(&in_runs.user_id, LEASE)
        .await
        .expect("fence");
    store.repair_abort(&token).await.expect("abort");
    let view = mailbox_materializer::store::StagingView::new(store.clone(), token);
    let late: Vec<_> = (4..=6)
        .map(|seq| group(&in_runs, seq, TODAY0, 1, "late"))
        .collect();
    let answers = view.append_run(&late.iter().collect::<Vec<_>>()).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(fence_lost(&answers[0]), "{answers:?}");
    assert_eq!(seqs_of(store.as_ref(), &in_runs).await, vec![1, 2, 3]);
}
