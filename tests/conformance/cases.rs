//! The conformance cases. Each is `pub async fn name(harness)`, named for the rule it checks;
//! SPEC section 10's regression list maps onto them one to one (see `conformance_tests!`).

use std::sync::Arc;

use mailbox_materializer::model::error::{ConflictKind, CorruptKind, CursorExpired, RejectKind};
use mailbox_materializer::model::{
    AppendOutcome, Event, MailboxId, Payload, RetentionPolicy, ScanPage, ScanRequest, StoreError,
    DAY_SECS,
};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::MailboxStore;

use super::{at_day, expiry_of, group, mailbox, policy, user, Fixture, Harness, NOW0, TODAY0};

#[allow(unused_imports)]
pub use super::loss::{
    every_lost_piece_answers_the_truth_or_corrupt,
    every_lost_piece_answers_the_truth_or_corrupt_at_a_fixed_clock,
};
#[allow(unused_imports)]
pub use super::repair::*;

type H = Arc<dyn Harness>;

async fn scan(
    store: &dyn MailboxStore,
    mb: &MailboxId,
    after: u64,
    until: Option<u64>,
    limit: u32,
) -> Result<ScanPage, StoreError> {
    store
        .range_scan(
            mb,
            ScanRequest {
                after_seq: after,
                until_seq: until,
                limit_groups: limit,
            },
        )
        .await
}

fn seqs(page: &ScanPage) -> Vec<u64> {
    page.groups.iter().map(|g| g.mailbox_seq).collect()
}

async fn scan_seqs(store: &dyn MailboxStore, mb: &MailboxId, after: u64) -> Vec<u64> {
    seqs(
        &scan(store, mb, after, None, 1000)
            .await
            .expect("scan succeeds"),
    )
}

fn gap(boundary: u64) -> StoreError {
    StoreError::CursorExpired {
        cursor: CursorExpired::ExpiredGap { boundary },
    }
}

fn trimmed(resume_after: u64) -> StoreError {
    StoreError::CursorExpired {
        cursor: CursorExpired::Trimmed { resume_after },
    }
}

fn corrupt_kind(result: &Result<impl std::fmt::Debug, StoreError>) -> &'static str {
    match result {
        Err(StoreError::Corrupt { kind }) => kind.as_str(),
        other => panic!("expected a corrupt error, got {other:?}"),
    }
}

fn reject_kind<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> RejectKind {
    match result {
        Err(StoreError::Rejected { kind, .. }) => *kind,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

async fn fixture(h: &H) -> Box<dyn Fixture> {
    h.fixture(policy(), NOW0).await
}

async fn append_ok(store: &dyn MailboxStore, mb: &MailboxId, seq: u64, day: u64, tag: &str) {
    let outcome = store.append(&group(mb, seq, day, 2, tag)).await;
    assert_eq!(outcome, Ok(AppendOutcome::Inserted), "seq {seq} day {day}");
}

// ---- epoch ----

pub async fn memory_epoch_check_and_reverse_range(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-epoch", 3);

    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    assert_eq!(page, ScanPage::empty(0), "a user never written scans empty");

    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    for wrong in [2, 4] {
        let r = scan(&*s, &mailbox("u-epoch", wrong), 0, None, 10).await;
        assert_eq!(r, Err(StoreError::EpochMismatch { current: Some(3) }));
        // The epoch check comes first, before the reverse-range answer (SPEC 4.4 steps 1, 2).
        for until in [5, 2] {
            let r = scan(&*s, &mailbox("u-epoch", wrong), 5, Some(until), 10).await;
            assert_eq!(r, Err(StoreError::EpochMismatch { current: Some(3) }));
        }
    }

    assert_eq!(scan(&*s, &mb, 5, Some(5), 10).await, Ok(ScanPage::empty(5)));
    assert_eq!(scan(&*s, &mb, 5, Some(3), 10).await, Ok(ScanPage::empty(5)));

    // A reverse range reads no storage: even a mailbox that cannot be read answers empty.
    assert!(f.corrupt(&mb, Corruption::FormatVersion(3)).await);
    assert_eq!(scan(&*s, &mb, 5, Some(2), 10).await, Ok(ScanPage::empty(5)));
    assert_eq!(
        corrupt_kind(&scan(&*s, &mb, 0, Some(9), 10).await),
        "unsupported_format"
    );
}

pub async fn epoch_move_deletes_the_old_epoch(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let old = mailbox("u-move", 1);
    let new = mailbox("u-move", 2);
    for seq in 1..=3 {
        append_ok(&*s, &old, seq, TODAY0 - seq, "old").await;
    }
    append_ok(&*s, &new, 1, TODAY0, "new").await;

    let inspected = s.inspect(&old).await.unwrap();
    assert_eq!(inspected.current_epoch, Some(2));
    assert_eq!(inspected.format_version, None, "old meta deleted");
    assert!(!inspected.identity_index_present, "old index deleted");
    assert_eq!(
        scan(&*s, &old, 0, None, 10).await,
        Err(StoreError::EpochMismatch { current: Some(2) })
    );
    assert_eq!(scan_seqs(&*s, &new, 0).await, vec![1]);
}

pub async fn stale_epoch_writes_nothing(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-stale", 5);
    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    let before = f.fingerprint(&mb.user_id).await;
    let stale = group(&mailbox("u-stale", 4), 2, TODAY0, 1, "b");
    assert_eq!(s.append(&stale).await, Ok(AppendOutcome::StaleEpoch));
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

// ---- natural expiry versus explicit trim ----

pub async fn natural_ttl_kept_apart_from_explicit_trim(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-ttl", 1);
    let old_day = TODAY0 - 10;
    append_ok(&*s, &mb, 1, old_day, "a").await;
    append_ok(&*s, &mb, 2, old_day, "b").await;
    append_ok(&*s, &mb, 3, TODAY0, "c").await;

    f.set_now(expiry_of(&policy(), old_day)).await;
    let promoted = s.promote(&mb).await.unwrap();
    assert_eq!(promoted.expired_days, 1);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.user_trim_seq, 0, "expiry never moves the trim");
    assert_eq!(inspected.expired_gap_boundary, 2);
    assert_eq!(
        inspected.active_days.keys().copied().collect::<Vec<_>>(),
        vec![TODAY0]
    );
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(gap(2)));
    assert_eq!(scan_seqs(&*s, &mb, 2).await, vec![3]);

    let t = s.truncate_before(&mb, 3).await.unwrap();
    assert_eq!(t.user_trim_seq, 3);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(
        inspected.expired_gap_boundary, 2,
        "a trim never moves the gap"
    );
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(trimmed(2)));
    assert_eq!(scan_seqs(&*s, &mb, 2).await, vec![3]);
}

pub async fn expired_cursor_gap(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-gap", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 20, "a").await;
    append_ok(&*s, &mb, 2, TODAY0 - 5, "b").await;
    append_ok(&*s, &mb, 3, TODAY0, "c").await;
    assert_eq!(scan_seqs(&*s, &mb, 0).await, vec![1, 2, 3]);

    f.set_now(expiry_of(&policy(), TODAY0 - 20)).await;
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(gap(1)));
    assert_eq!(scan_seqs(&*s, &mb, 1).await, vec![2, 3]);

    f.set_now(expiry_of(&policy(), TODAY0 - 5)).await;
    assert_eq!(scan(&*s, &mb, 1, None, 10).await, Err(gap(2)));
    assert_eq!(scan_seqs(&*s, &mb, 2).await, vec![3]);
}

// ---- validation ----

pub async fn duplicate_ordinal_rejected(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-dup", 1);
    let mut g = group(&mb, 1, TODAY0, 3, "a");
    g.events[2].event_ordinal = 1;
    assert_eq!(
        reject_kind(&s.append(&g).await),
        RejectKind::DuplicateOrdinal
    );
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(
        inspected.current_epoch, None,
        "a rejected cold user leaves nothing"
    );

    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    let before = f.fingerprint(&mb.user_id).await;
    g.mailbox_seq = 2;
    assert_eq!(
        reject_kind(&s.append(&g).await),
        RejectKind::DuplicateOrdinal
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

pub async fn future_window_rejects_and_leaves_no_key(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-future", 1);
    let untouched = f.fingerprint(&user("u-never-written")).await;

    let r = s.append(&group(&mb, 1, TODAY0 + 31, 1, "a")).await;
    assert_eq!(reject_kind(&r), RejectKind::FutureCreatedAt);
    assert_eq!(
        f.fingerprint(&mb.user_id).await,
        untouched,
        "no key for a rejected cold user"
    );
    assert_eq!(s.inspect(&mb).await.unwrap().current_epoch, None);

    append_ok(&*s, &mb, 1, TODAY0 + 30, "a").await;
}

pub async fn span_exceeded_rejects_and_changes_nothing(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-span", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 5, "a").await;
    let before = f.fingerprint(&mb.user_id).await;
    let r = s.append(&group(&mb, 2, TODAY0 + 26, 1, "b")).await;
    assert_eq!(reject_kind(&r), RejectKind::SpanExceeded);
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
    append_ok(&*s, &mb, 2, TODAY0 + 25, "b").await;
    assert_eq!(s.inspect(&mb).await.unwrap().active_day_count, 2);
}

// ---- replays ----

pub async fn same_day_replacement_of_the_whole_group(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-replace", 1);
    assert_eq!(
        s.append(&group(&mb, 5, TODAY0, 3, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    let replacement = group(&mb, 5, TODAY0, 2, "b");
    assert_eq!(s.append(&replacement).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    assert_eq!(page.groups.len(), 1);
    assert_eq!(
        &*page.groups[0].events,
        &replacement.events[..],
        "no event of the old group survives"
    );

    // Same day, another millisecond: different content, replaced again.
    let mut later = replacement.clone();
    later.created_at += 1000;
    assert_eq!(s.append(&later).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    assert_eq!(page.groups[0].created_at, later.created_at);
    assert_eq!(s.inspect(&mb).await.unwrap().identity_count, 1);
}

/// The largest group validation allows (`MAX_EVENTS_PER_GROUP` events) is inserted, replayed,
/// replaced by another of the same size and then by a small one, and scanned whole, on every
/// backend: no backend may refuse what the shared validation accepts.
pub async fn largest_group_inserts_replaces_and_scans_whole(h: &H) {
    use mailbox_materializer::model::validate::MAX_EVENTS_PER_GROUP;
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-largest", 1);
    let n = MAX_EVENTS_PER_GROUP as u32;
    let first = group(&mb, 7, TODAY0, n, "a");
    assert_eq!(s.append(&first).await, Ok(AppendOutcome::Inserted));
    assert_eq!(s.append(&first).await, Ok(AppendOutcome::Unchanged));
    let second = group(&mb, 7, TODAY0, n, "b");
    assert_eq!(s.append(&second).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 0, None, 1).await.unwrap();
    assert_eq!(seqs(&page), vec![7]);
    assert_eq!(page.groups[0].events.len(), MAX_EVENTS_PER_GROUP);
    assert!(
        *page.groups[0].events == second.events[..],
        "the whole replacement, in ordinal order"
    );
    let small = group(&mb, 7, TODAY0, 3, "c");
    assert_eq!(s.append(&small).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 0, None, 1).await.unwrap();
    assert_eq!(&*page.groups[0].events, &small.events[..]);
    assert_eq!(s.append(&second).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 6, Some(7), 10).await.unwrap();
    assert_eq!(page.groups[0].events.len(), MAX_EVENTS_PER_GROUP);
    assert_eq!(s.inspect(&mb).await.unwrap().identity_count, 1);
}

pub async fn identical_replay_is_unchanged(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-same", 1);
    let g = group(&mb, 1, TODAY0, 3, "a");
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
    let before = f.fingerprint(&mb.user_id).await;
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Unchanged));
    // Events are compared in ordinal order, whatever order the record lists them in.
    let mut shuffled = g.clone();
    shuffled.events.reverse();
    assert_eq!(s.append(&shuffled).await, Ok(AppendOutcome::Unchanged));
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

/// SPEC 10 (added with 7.2): a TTL-less identity index is repaired by an identical replay too,
/// the leanest path that meets it. Seen from outside: once every group has expired, the index
/// is gone like the rest of the mailbox, instead of outliving it forever.
pub async fn identical_replay_repairs_a_ttl_less_identity_index(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-ttl-less", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 2, "a").await;
    let g = group(&mb, 2, TODAY0, 2, "b");
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
    if !f.corrupt(&mb, Corruption::LoseIdentityTtl).await {
        // The backend keeps each identity's expiry with the identity: nothing to lose.
        return;
    }
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Unchanged));
    f.set_now(expiry_of(&policy(), TODAY0) + 1).await;
    let inspected = s.inspect(&mb).await.expect("inspect");
    assert!(
        !inspected.identity_index_present,
        "the repaired index expires with its last group: {inspected:?}"
    );
}

pub async fn cross_day_conflict(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-cross", 1);
    append_ok(&*s, &mb, 5, TODAY0 - 1, "a").await;
    let before = f.fingerprint(&mb.user_id).await;
    let r = s.append(&group(&mb, 5, TODAY0, 2, "a")).await;
    assert_eq!(
        r,
        Err(StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: TODAY0 - 1,
                incoming_day: TODAY0
            }
        })
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    assert_eq!(seqs(&page), vec![5], "no second copy of the group");
    assert_eq!(page.groups[0].created_at, at_day(TODAY0 - 1));
}

pub async fn cross_day_conflict_for_expired_input(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-cross-exp", 1);
    append_ok(&*s, &mb, 5, TODAY0, "a").await;
    let before = f.fingerprint(&mb.user_id).await;
    let r = s.append(&group(&mb, 5, TODAY0 - 40, 2, "a")).await;
    assert_eq!(
        r,
        Err(StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: TODAY0,
                incoming_day: TODAY0 - 40
            }
        })
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
    assert_eq!(s.inspect(&mb).await.unwrap().expired_gap_boundary, 0);
}

pub async fn expired_replay_merges_the_gap(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-expired", 1);
    assert_eq!(
        s.append(&group(&mb, 7, TODAY0 - 40, 2, "a")).await,
        Ok(AppendOutcome::ExpiredMerged)
    );
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.format_version, Some(4));
    assert_eq!(inspected.expired_gap_boundary, 7);
    assert_eq!(inspected.active_day_count, 0);
    assert_eq!(inspected.seqbucket_max_seq, 0);
    assert!(
        !inspected.identity_index_present,
        "no identity for expired input"
    );
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(gap(7)));
    assert_eq!(scan_seqs(&*s, &mb, 7).await, Vec::<u64>::new());

    append_ok(&*s, &mb, 8, TODAY0, "b").await;
    assert_eq!(
        s.append(&group(&mb, 6, TODAY0 - 35, 1, "c")).await,
        Ok(AppendOutcome::ExpiredMerged)
    );
    assert_eq!(
        s.inspect(&mb).await.unwrap().expired_gap_boundary,
        7,
        "never lowers"
    );
    assert_eq!(scan_seqs(&*s, &mb, 7).await, vec![8]);
}

// ---- promote and boundedness ----

pub async fn active_proof_compaction(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-compact", 1);
    for (seq, back) in [(1, 3), (2, 2), (3, 1), (4, 0)] {
        append_ok(&*s, &mb, seq, TODAY0 - back, "a").await;
    }
    f.set_now(expiry_of(&policy(), TODAY0 - 2)).await;
    let promoted = s.promote(&mb).await.unwrap();
    assert_eq!(promoted.expired_days, 2);
    assert_eq!(promoted.expired_gap_boundary, 2);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(
        inspected.active_days.keys().copied().collect::<Vec<_>>(),
        vec![TODAY0 - 1, TODAY0]
    );
    assert_eq!(inspected.min_day, Some(TODAY0 - 1));
    assert_eq!(inspected.max_day, Some(TODAY0));
    assert_eq!(inspected.active_day_count, 2);
    assert_eq!(inspected.identity_count, 2, "expired identities dropped");
    assert_eq!(s.promote(&mb).await.unwrap().expired_days, 0);
}

/// Every write's compaction is counted by the store (what the daemon reports as
/// `promote_expired_buckets_total`, SPEC 9): an append's, a truncate's, a refused append's (its
/// promote is applied) and an explicit promote's; a promote with nothing to compact adds nothing.
pub async fn compacted_days_are_counted_by_the_store(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-counted", 1);
    for (seq, back) in [(1, 4), (2, 3), (3, 2), (4, 1), (5, 0)] {
        append_ok(&*s, &mb, seq, TODAY0 - back, "a").await;
    }
    let base = s.promoted_buckets_total();
    f.set_now(expiry_of(&policy(), TODAY0 - 4)).await;
    append_ok(&*s, &mb, 6, TODAY0, "b").await;
    assert_eq!(
        s.promoted_buckets_total(),
        base + 1,
        "an append's compaction"
    );
    f.set_now(expiry_of(&policy(), TODAY0 - 3)).await;
    s.truncate_before(&mb, 2).await.unwrap();
    assert_eq!(
        s.promoted_buckets_total(),
        base + 2,
        "a truncate's compaction"
    );
    // A refused write still applied its promote (seq 5 is stored under TODAY0).
    f.set_now(expiry_of(&policy(), TODAY0 - 2)).await;
    assert!(matches!(
        s.append(&group(&mb, 5, TODAY0 - 1, 1, "c")).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        s.promoted_buckets_total(),
        base + 3,
        "a refused append's compaction"
    );
    f.set_now(expiry_of(&policy(), TODAY0 - 1)).await;
    assert_eq!(s.promote(&mb).await.unwrap().expired_days, 1);
    assert_eq!(s.promoted_buckets_total(), base + 4, "an explicit promote");
    assert_eq!(s.promote(&mb).await.unwrap().expired_days, 0);
    assert_eq!(s.promoted_buckets_total(), base + 4, "nothing to compact");
}

/// Writes one group a day for `days` days, moving the clock a day each time; returns the last seq.
async fn write_daily(f: &dyn Fixture, mb: &MailboxId, days: u64) -> u64 {
    let s = f.store();
    for i in 0..days {
        f.set_now(NOW0 + i * DAY_SECS).await;
        append_ok(&*s, mb, i + 1, TODAY0 + i, "daily").await;
        let inspected = s.inspect(mb).await.unwrap();
        assert!(
            inspected.active_days.len() <= policy().max_active_days(),
            "day {i}: {} proofs",
            inspected.active_days.len()
        );
    }
    days
}

pub async fn thirty_two_consecutive_day_buckets(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-32", 1);
    write_daily(&*f, &mb, 32).await;
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.active_day_count, 31);
    assert_eq!(inspected.active_days.len(), 31);
    assert_eq!(inspected.min_day, Some(TODAY0 + 1));
    assert_eq!(inspected.max_day, Some(TODAY0 + 31));
    assert_eq!(inspected.expired_gap_boundary, 1);
    assert_eq!(scan(&*s, &mb, 0, None, 100).await, Err(gap(1)));
    assert_eq!(scan_seqs(&*s, &mb, 1).await, (2..=32).collect::<Vec<_>>());
}

pub async fn long_offline_recovery(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-offline", 1);
    let last = write_daily(&*f, &mb, 31).await;
    // A cold mailbox keeps its (bounded) proofs until something promotes it.
    let back = NOW0 + 400 * DAY_SECS;
    f.set_now(back).await;
    assert_eq!(s.inspect(&mb).await.unwrap().active_days.len(), 31);

    let today = back / DAY_SECS;
    append_ok(&*s, &mb, last + 1, today, "back").await;
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.active_day_count, 1);
    assert_eq!(
        inspected.active_days.keys().copied().collect::<Vec<_>>(),
        vec![today]
    );
    assert_eq!(inspected.expired_gap_boundary, last);
    assert_eq!(inspected.identity_count, 1);
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(gap(last)));
    assert_eq!(scan_seqs(&*s, &mb, last).await, vec![last + 1]);
}

pub async fn metadata_stays_bounded_over_a_year(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-year", 1);
    let mut seq = 0;
    for i in 0..365u64 {
        f.set_now(NOW0 + i * DAY_SECS).await;
        for _ in 0..2 {
            seq += 1;
            append_ok(&*s, &mb, seq, TODAY0 + i, "y").await;
        }
        if i % 30 == 29 {
            let inspected = s.inspect(&mb).await.unwrap();
            assert!(inspected.active_days.len() <= 31);
            assert!(inspected.identity_count <= 2 * 31 + 2);
        }
    }
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.active_days.len(), 31);
    assert_eq!(inspected.identity_count, 62);
}

pub async fn expiry_between_check_and_read(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-race", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 30, "a").await;
    append_ok(&*s, &mb, 2, TODAY0, "b").await;
    f.jump_during_next_scan(expiry_of(&policy(), TODAY0 - 30))
        .await;
    assert_eq!(
        scan(&*s, &mb, 0, None, 10).await,
        Err(gap(1)),
        "coverage crossed by expiry during the read is never reported"
    );
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(gap(1)));
    assert_eq!(scan_seqs(&*s, &mb, 1).await, vec![2]);
}

// ---- corruption fails closed ----

pub async fn v3_meta_rejected_with_nothing_modified(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-v3", 1);
    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    append_ok(&*s, &mb, 2, TODAY0, "b").await;
    assert!(f.corrupt(&mb, Corruption::FormatVersion(3)).await);
    let before = f.fingerprint(&mb.user_id).await;

    let r = s.append(&group(&mb, 3, TODAY0, 1, "c")).await;
    assert_eq!(
        r,
        Err(StoreError::Corrupt {
            kind: CorruptKind::UnsupportedFormat { found: "3".into() }
        })
    );
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 1, TODAY0, 2, "a")).await),
        "unsupported_format"
    );
    assert_eq!(
        corrupt_kind(&scan(&*s, &mb, 0, None, 10).await),
        "unsupported_format"
    );
    assert_eq!(
        corrupt_kind(&s.truncate_before(&mb, 2).await),
        "unsupported_format"
    );
    assert_eq!(corrupt_kind(&s.promote(&mb).await), "unsupported_format");
    assert_eq!(f.fingerprint(&mb.user_id).await, before, "nothing modified");
}

pub async fn index_lost_is_corrupt(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-index", 1);
    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    assert!(f.corrupt(&mb, Corruption::LoseIdentityIndex).await);
    let before = f.fingerprint(&mb.user_id).await;
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 2, TODAY0, 1, "b")).await),
        "index_lost"
    );
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 1, TODAY0, 2, "a")).await),
        "index_lost"
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

/// SPEC 4.2 step 8 and 4.4 step 7 (amended): a live day whose events are gone from storage (an
/// evicted or deleted Redis day bucket, lost Scylla rows, a partial restore) is damage. A scan of
/// the mailbox answers `corrupt`, never a short page with an `up_to` over groups it did not
/// read; a same-day replay of one of its seqs, identical or not, answers `corrupt`, never
/// `replaced` over the damage; nothing is written. The memory store keeps a mailbox in one
/// structure and cannot lose a part of it: the case has nothing to damage there.
pub async fn a_live_day_that_lost_its_events_is_corrupt(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-lostday", 1);
    for seq in 1..=2 {
        append_ok(&*s, &mb, seq, TODAY0 - 1, "a").await;
    }
    for seq in 3..=5 {
        append_ok(&*s, &mb, seq, TODAY0, "a").await;
    }
    if !f.corrupt(&mb, Corruption::LoseDayEvents(TODAY0)).await {
        return;
    }
    let before = f.fingerprint(&mb.user_id).await;
    for after_seq in [0, 2, 4] {
        let scanned = s
            .range_scan(
                &mb,
                ScanRequest {
                    after_seq,
                    until_seq: None,
                    limit_groups: 100,
                },
            )
            .await;
        assert_eq!(
            corrupt_kind(&scanned),
            "bad_proof",
            "scan after {after_seq}"
        );
    }
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 4, TODAY0, 2, "a")).await),
        "bad_proof",
        "an identical replay into the lost day"
    );
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 4, TODAY0, 1, "other")).await),
        "bad_proof",
        "a replace into the lost day"
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before, "nothing written");
}

pub async fn meta_lost_is_corrupt(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-meta", 1);
    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    assert!(f.corrupt(&mb, Corruption::LoseMeta).await);
    let before = f.fingerprint(&mb.user_id).await;
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 2, TODAY0, 1, "b")).await),
        "meta_lost"
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

pub async fn identity_missing_below_seqbucket_max_seq_is_corrupt(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-ident", 1);
    for seq in 1..=3 {
        append_ok(&*s, &mb, seq, TODAY0, "a").await;
    }
    assert!(f.corrupt(&mb, Corruption::LoseIdentity(2)).await);
    let before = f.fingerprint(&mb.user_id).await;
    assert_eq!(
        s.append(&group(&mb, 2, TODAY0, 2, "a")).await,
        Err(StoreError::Corrupt {
            kind: CorruptKind::IdentityMissing {
                seq: 2,
                seqbucket_max_seq: 3
            }
        })
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);

    // A seq below the largest ever accepted that this mailbox never saw: out of source order.
    let other = mailbox("u-ident-2", 1);
    append_ok(&*s, &other, 10, TODAY0, "a").await;
    assert_eq!(
        corrupt_kind(&s.append(&group(&other, 5, TODAY0, 1, "b")).await),
        "identity_missing"
    );
}

pub async fn bad_proof_two_phase_promote_changes_nothing(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-proof", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 10, "a").await;
    append_ok(&*s, &mb, 2, TODAY0 - 9, "b").await;
    append_ok(&*s, &mb, 3, TODAY0, "c").await;
    assert!(f.corrupt(&mb, Corruption::BreakProof(TODAY0 - 9)).await);
    // A second past the expiry, so the fingerprint is not taken in the millisecond where the
    // expired bucket still physically exists.
    f.set_now(expiry_of(&policy(), TODAY0 - 9) + 1).await;
    let before = f.fingerprint(&mb.user_id).await;

    assert_eq!(corrupt_kind(&s.promote(&mb).await), "bad_proof");
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.expired_gap_boundary, 0, "earlier day not merged");
    assert!(
        inspected.active_days.contains_key(&(TODAY0 - 10)),
        "earlier proof not deleted"
    );
    assert_eq!(
        corrupt_kind(&s.append(&group(&mb, 4, TODAY0, 1, "d")).await),
        "bad_proof"
    );
    assert_eq!(
        corrupt_kind(&scan(&*s, &mb, 3, None, 10).await),
        "bad_proof"
    );
    assert_eq!(f.fingerprint(&mb.user_id).await, before);
}

// ---- scans ----

pub async fn scan_reads_buckets_older_than_max_day_minus_retention(h: &H) {
    let short = RetentionPolicy {
        retention_days: 3,
        future_window_days: 30,
        max_active_span_days: 30,
    };
    let f = h.fixture(short, NOW0).await;
    let s = f.store();
    let mb = mailbox("u-bound", 1);
    append_ok(&*s, &mb, 1, TODAY0 - 2, "old").await;
    append_ok(&*s, &mb, 2, TODAY0 + 20, "future").await;
    // max_day - retention_days = TODAY0 + 17: the old bound would miss seq 1.
    assert_eq!(scan_seqs(&*s, &mb, 0).await, vec![1, 2]);
}

pub async fn scan_pages_whole_groups_in_seq_order(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-page", 1);
    for seq in 1..=10u64 {
        // Days are not monotonic in seq: the merge is by seq across buckets.
        let day = TODAY0 - (seq % 4);
        let g = group(&mb, seq, day, 2, "p");
        assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
    }
    let mut after = 0;
    let mut pages = Vec::new();
    loop {
        let page = scan(&*s, &mb, after, None, 3).await.unwrap();
        assert!(
            page.groups.iter().all(|g| g.events.len() == 2),
            "whole groups"
        );
        pages.push(seqs(&page));
        after = page.up_to;
        if !page.has_more {
            break;
        }
    }
    assert_eq!(
        pages,
        vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9], vec![10]]
    );
    assert_eq!(after, 10);

    let bounded = scan(&*s, &mb, 2, Some(5), 10).await.unwrap();
    assert_eq!(seqs(&bounded), vec![3, 4, 5]);
    assert_eq!((bounded.up_to, bounded.has_more), (5, false));

    let limited = scan(&*s, &mb, 2, Some(5), 2).await.unwrap();
    assert_eq!(seqs(&limited), vec![3, 4]);
    assert_eq!((limited.up_to, limited.has_more), (4, true));

    assert_eq!(
        reject_kind(&scan(&*s, &mb, 0, None, 0).await),
        RejectKind::InvalidField
    );
}

pub async fn payload_round_trips_as_canonical_json(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-payload", 1);
    let value = serde_json::json!({"b": 1, "a": [1, 2.5, {"z": null, "y": "é\"\n"}], "c": true});
    let mut g = group(&mb, 1, TODAY0, 1, "x");
    g.events[0] = Event {
        event_ordinal: 7,
        payload: Payload::from_value(&value),
    };
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    let event = &page.groups[0].events[0];
    assert_eq!(event.event_ordinal, 7);
    assert_eq!(event.payload.to_value(), value);
    assert_eq!(event.payload.as_str(), value.to_string());
}

// ---- truncate ----

pub async fn trim_outcome_and_trim_never_lowers(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-trim", 1);
    for seq in 1..=5 {
        append_ok(&*s, &mb, seq, TODAY0, "a").await;
    }
    assert_eq!(s.truncate_before(&mb, 3).await.unwrap().user_trim_seq, 3);
    assert_eq!(s.truncate_before(&mb, 2).await.unwrap().user_trim_seq, 3);
    assert_eq!(
        s.append(&group(&mb, 2, TODAY0, 2, "a")).await,
        Ok(AppendOutcome::Trimmed)
    );
    assert_eq!(
        s.append(&group(&mb, 1, TODAY0 - 50, 2, "a")).await,
        Ok(AppendOutcome::Trimmed)
    );
    assert_eq!(scan_seqs(&*s, &mb, 2).await, vec![3, 4, 5]);
    assert_eq!(scan(&*s, &mb, 0, None, 10).await, Err(trimmed(2)));
    assert_eq!(scan(&*s, &mb, 1, None, 10).await, Err(trimmed(2)));
}

pub async fn truncate_removes_whole_groups_and_keeps_empty_day_proofs(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-trunc", 1);
    let old_day = TODAY0 - 10;
    append_ok(&*s, &mb, 1, old_day, "a").await;
    append_ok(&*s, &mb, 2, old_day, "a").await;
    append_ok(&*s, &mb, 3, TODAY0, "b").await;
    let t = s.truncate_before(&mb, 3).await.unwrap();
    assert_eq!((t.user_trim_seq, t.removed_groups), (3, 2));
    let inspected = s.inspect(&mb).await.unwrap();
    assert!(inspected.active_days.contains_key(&old_day), "proof kept");
    assert_eq!(inspected.identity_count, 1);

    f.set_now(expiry_of(&policy(), old_day)).await;
    assert_eq!(s.promote(&mb).await.unwrap().expired_days, 1);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(
        inspected.expired_gap_boundary, 0,
        "a day wholly below the trim merges no gap"
    );
    assert_eq!(scan_seqs(&*s, &mb, 2).await, vec![3]);
}

pub async fn truncate_on_unknown_user_is_durable(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-trunc-cold", 2);
    assert_eq!(s.truncate_before(&mb, 10).await.unwrap().user_trim_seq, 10);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(
        (inspected.current_epoch, inspected.user_trim_seq),
        (Some(2), 10)
    );
    assert_eq!(
        s.append(&group(&mb, 5, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Trimmed)
    );
    for other in [1, 3] {
        assert_eq!(
            s.truncate_before(&mailbox("u-trunc-cold", other), 20).await,
            Err(StoreError::EpochMismatch { current: Some(2) })
        );
    }
}

// ---- atomicity ----

pub async fn concurrent_appends_to_one_mailbox(h: &H) {
    let f = fixture(h).await;
    let mb = mailbox("u-concurrent", 1);
    let writers = 6;
    let seqs_per_writer = 40u64;
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let store = f.store();
        let mb = mb.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for seq in 1..=seqs_per_writer {
                outcomes.push(store.append(&group(&mb, seq, TODAY0, 2, "c")).await);
            }
            outcomes
        }));
    }
    let mut inserted = vec![0u32; seqs_per_writer as usize];
    for task in tasks {
        for (i, outcome) in task.await.unwrap().into_iter().enumerate() {
            match outcome {
                Ok(AppendOutcome::Inserted) => inserted[i] += 1,
                Ok(AppendOutcome::Unchanged) => {}
                other => panic!("seq {}: {other:?}", i + 1),
            }
        }
    }
    assert!(inserted.iter().all(|&n| n == 1), "{inserted:?}");
    let s = f.store();
    assert_eq!(
        scan_seqs(&*s, &mb, 0).await,
        (1..=seqs_per_writer).collect::<Vec<_>>()
    );
}

// ---- randomized ----

pub async fn randomized_histories_keep_the_invariants(h: &H) {
    super::history::check_random_histories(h.clone(), 48).await;
}

// ---- ordinals over the whole u32 range ----

/// Ordinals at and above 2^31 keep their identity and their order: an identical replay is
/// unchanged, a scan returns the events by ordinal (3,000,000,000 after 0), and a change of the
/// event at the high ordinal is a replacement.
pub async fn ordinals_above_two_to_the_31_keep_identity_and_order(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-ordinals", 1);
    let event = |ordinal: u32, tag: &str| Event {
        event_ordinal: ordinal,
        payload: Payload::from_value(&serde_json::json!({"o": ordinal, "tag": tag})),
    };
    let mut g = group(&mb, 1, TODAY0, 1, "x");
    g.events = vec![
        event(3_000_000_000, "a"),
        event(0, "a"),
        event(u32::MAX, "a"),
        event(1 << 31, "a"),
    ];
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Unchanged));
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    let ordinals: Vec<u32> = page.groups[0]
        .events
        .iter()
        .map(|e| e.event_ordinal)
        .collect();
    assert_eq!(ordinals, vec![0, 1 << 31, 3_000_000_000, u32::MAX]);
    assert_eq!(
        page.groups[0].events[2].payload.as_str(),
        r#"{"o":3000000000,"tag":"a"}"#
    );

    let mut changed = g.clone();
    changed.events[0] = event(3_000_000_000, "b");
    assert_eq!(s.append(&changed).await, Ok(AppendOutcome::Replaced));
    let page = scan(&*s, &mb, 0, None, 10).await.unwrap();
    assert_eq!(
        page.groups[0].events.len(),
        4,
        "no event of the old copy survives"
    );
    assert_eq!(
        page.groups[0].events[2].payload.as_str(),
        r#"{"o":3000000000,"tag":"b"}"#
    );
}

// ---- scan order of checks ----

/// SPEC 4.4 puts the epoch check (step 1) before the reverse-range answer (step 2): a cursor of
/// another epoch gets `EpochMismatch` even with `until <= after`, while the current epoch's
/// reverse range stays an empty page.
pub async fn scan_epoch_check_comes_before_the_reverse_range(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let mb = mailbox("u-epoch-first", 3);
    append_ok(&*s, &mb, 1, TODAY0, "a").await;
    for wrong in [2, 4] {
        for (after, until) in [(5, Some(5)), (5, Some(3)), (0, Some(0))] {
            assert_eq!(
                scan(&*s, &mailbox("u-epoch-first", wrong), after, until, 1).await,
                Err(StoreError::EpochMismatch { current: Some(3) }),
                "epoch {wrong}, ({after}, {until:?}]"
            );
        }
    }
    assert_eq!(scan(&*s, &mb, 5, Some(5), 1).await, Ok(ScanPage::empty(5)));
    assert_eq!(scan(&*s, &mb, 5, Some(3), 1).await, Ok(ScanPage::empty(5)));
}

/// SPEC 7.2 "Redis Cluster" and "Batches are invisible": one `append_many` of groups for many
/// users (spread over every slot, and so every master, of a cluster) answers each group exactly
/// as `append` would, whatever else shared its batch. Sizes at the runner's batch limit: one
/// below, exact, one above.
pub async fn append_many_spread_over_many_users_answers_each(h: &H) {
    use mailbox_materializer::ingest::runner::MAX_BATCH;
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    for (round, size) in [MAX_BATCH - 1, MAX_BATCH, MAX_BATCH + 1]
        .into_iter()
        .enumerate()
    {
        let groups: Vec<_> = (0..size)
            .map(|i| {
                group(
                    &mailbox(&format!("spread-{round}-{i}"), 1),
                    7,
                    TODAY0,
                    1,
                    "s",
                )
            })
            .collect();
        let refs: Vec<_> = groups.iter().collect();
        let first = store.append_many(&refs).await;
        assert_eq!(first.len(), size);
        for (i, result) in first.iter().enumerate() {
            assert_eq!(result, &Ok(AppendOutcome::Inserted), "group {i} of {size}");
        }
        // The same batch again is an identical replay of every group; a different content for
        // every second user replaces just those.
        let mixed: Vec<_> = (0..size)
            .map(|i| {
                let tag = if i % 2 == 0 { "s" } else { "t" };
                group(
                    &mailbox(&format!("spread-{round}-{i}"), 1),
                    7,
                    TODAY0,
                    1,
                    tag,
                )
            })
            .collect();
        let refs: Vec<_> = mixed.iter().collect();
        let second = store.append_many(&refs).await;
        for (i, result) in second.iter().enumerate() {
            let want = if i % 2 == 0 {
                AppendOutcome::Unchanged
            } else {
                AppendOutcome::Replaced
            };
            assert_eq!(result, &Ok(want), "group {i} of {size}");
        }
        for i in [0, size / 2, size - 1] {
            let mb = mailbox(&format!("spread-{round}-{i}"), 1);
            assert_eq!(scan_seqs(store.as_ref(), &mb, 0).await, vec![7], "user {i}");
        }
    }
}

/// A source position in the log `log` (SPEC 7.2).
fn position(
    log: &str,
    partition: i32,
    offset: i64,
) -> Option<mailbox_materializer::model::SourcePosition> {
    let log = mailbox_materializer::model::LogId::topic_id(log).expect("log id");
    Some(mailbox_materializer::model::SourcePosition::new(
        log, partition, offset,
    ))
}

/// The first event's payload of each group of a page.
fn first_payloads(page: &ScanPage) -> Vec<String> {
    page.groups
        .iter()
        .map(|g| g.events[0].payload.as_str().to_owned())
        .collect()
}

/// `explain`'s positions (`MailboxStore::seq_positions`): each live seq with the position of
/// its stored version (a replace's new one, none after a write without one), in seq order;
/// another epoch's mailbox has none.
pub async fn seq_positions_name_each_live_seqs_stored_version(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("positions", 1);
    let at = |partition: i32, offset: i64| position("log-a", partition, offset);
    let written = |seq: u64, day: u64, tag: &str, source| {
        let mut g = group(&mb, seq, day, 1, tag);
        g.source = source;
        g
    };
    for g in [
        written(1, TODAY0 - 3, "a", at(2, 10)),
        written(2, TODAY0, "b", at(2, 11)),
        written(3, TODAY0, "c", None),
        written(2, TODAY0, "b2", at(2, 15)),
    ] {
        assert!(store.append(&g).await.is_ok(), "{:?}", g.mailbox_seq);
    }
    let live = |seq: u64, source| mailbox_materializer::store::SeqPosition {
        seq,
        position: source,
    };
    assert_eq!(
        store.seq_positions(&mb).await,
        Ok(vec![live(1, at(2, 10)), live(2, at(2, 15)), live(3, None)])
    );
    assert_eq!(
        store.seq_positions(&mailbox("positions", 2)).await,
        Ok(vec![])
    );
}

/// A seq whose day expired is no longer live, so `explain` shows no position for it.
pub async fn seq_positions_leave_out_expired_seqs(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("positions", 1);
    for (seq, day) in [(1, TODAY0 - 3), (2, TODAY0)] {
        let mut g = group(&mb, seq, day, 1, "a");
        g.source = position("log-a", 0, seq as i64);
        assert!(store.append(&g).await.is_ok(), "{seq}");
    }
    f.set_now(expiry_of(&policy(), TODAY0 - 3)).await;
    let seqs: Vec<u64> = store
        .seq_positions(&mb)
        .await
        .expect("positions")
        .iter()
        .map(|p| p.seq)
        .collect();
    assert_eq!(seqs, vec![2], "seq 1's day expired");
}

/// SPEC 7.2 "Zombies are fenced, and only zombies": a same-day replace of a seq from an older
/// offset of the log and partition that wrote the seq's stored version changes nothing and
/// answers `superseded` (never `unchanged`), alone and in a batch; a position of another
/// partition or another log, and a write without a position (`apply`), replace; a write
/// without a position leaves the seq without one.
pub async fn late_write_of_an_older_position_is_superseded(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("zombie", 1);
    let at = |partition: i32, offset: i64| position("log-a", partition, offset);
    let version = |tag: &str, source| {
        let mut g = group(&mb, 5, TODAY0, 2, tag);
        g.source = source;
        g
    };
    let held = |tag: &str| format!("{{\"i\":0,\"tag\":\"{tag}\"}}");

    // The old owner's write at offset 10, then the new owner's replacement at offset 20.
    assert_eq!(
        store.append(&version("v1", at(0, 10))).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        store.append(&version("v2", at(0, 20))).await,
        Ok(AppendOutcome::Replaced)
    );
    // The old owner's late write of offset 10 (or anything before 20): superseded.
    assert_eq!(
        store.append(&version("v1", at(0, 10))).await,
        Ok(AppendOutcome::Superseded)
    );
    assert_eq!(
        store.append(&version("v0", at(0, 19))).await,
        Ok(AppendOutcome::Superseded)
    );
    let batch = [version("v1", at(0, 10))];
    let refs: Vec<_> = batch.iter().collect();
    assert_eq!(
        store.append_many(&refs).await,
        vec![Ok(AppendOutcome::Superseded)]
    );
    let page = scan(store.as_ref(), &mb, 0, None, 10).await.expect("scan");
    assert_eq!(
        first_payloads(&page),
        vec![held("v2")],
        "the newer owner's version stays"
    );

    // The same record again is an identical replay; a later position replaces.
    assert_eq!(
        store.append(&version("v2", at(0, 20))).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert_eq!(
        store.append(&version("v3", at(0, 30))).await,
        Ok(AppendOutcome::Replaced)
    );
    // Another partition's position is not comparable, nor another log's: both replace.
    assert_eq!(
        store.append(&version("v4", at(1, 1))).await,
        Ok(AppendOutcome::Replaced)
    );
    assert_eq!(
        store.append(&version("v5", position("log-b", 1, 0))).await,
        Ok(AppendOutcome::Replaced)
    );
    // `apply` has no position: it replaces, and leaves the seq without one, so the old log's
    // offsets fence nothing any more.
    assert_eq!(
        store.append(&version("v6", None)).await,
        Ok(AppendOutcome::Replaced)
    );
    assert_eq!(
        store.append(&version("v7", position("log-b", 1, 0))).await,
        Ok(AppendOutcome::Replaced)
    );
    let page = scan(store.as_ref(), &mb, 0, None, 10).await.expect("scan");
    assert_eq!(first_payloads(&page), vec![held("v7")]);

    // A new seq from an older position is an insert, never fenced.
    let mut fresh = group(&mb, 6, TODAY0, 1, "new");
    fresh.source = at(1, 0);
    assert_eq!(store.append(&fresh).await, Ok(AppendOutcome::Inserted));
}

/// A write whose answer was lost keeps its outcome (docs/decisions.md, `model::written`): the
/// retry of the very delivery that wrote a version (its write token) finds the version
/// identical and answers what the lost attempt answered, `inserted` or `replaced`, alone and in
/// a run; another reading of the same record (a new token: another replica, a re-read, a
/// replay), a write without a token, and a version an older release wrote (no mark) are
/// `unchanged`. The mark never changes the position compared: a zombie is still fenced.
pub async fn a_retry_whose_answer_was_lost_answers_as_the_lost_attempt_did(h: &H) {
    use mailbox_materializer::model::WriteToken;
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("lost-answer", 1);
    let version = |tag: &str, offset: i64, token: Option<u64>| {
        let mut g = group(&mb, 5, TODAY0, 2, tag);
        g.source = position("log-a", 0, offset);
        g.token = token.map(WriteToken::from_raw);
        g
    };

    // Offset 10 inserts seq 5 (its answer lost): the retry brings the same token.
    assert_eq!(
        store.append(&version("v1", 10, Some(1))).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        store.append(&version("v1", 10, Some(1))).await,
        Ok(AppendOutcome::Inserted),
        "the retry of the write that inserted the version"
    );
    assert_eq!(
        store.append(&version("v1", 10, Some(2))).await,
        Ok(AppendOutcome::Unchanged),
        "another reading of the same record"
    );
    assert_eq!(
        store.append(&version("v1", 10, None)).await,
        Ok(AppendOutcome::Unchanged),
        "a write without a token"
    );

    // Offset 20 replaces it; its retry, alone and in a run, answers replaced.
    assert_eq!(
        store.append(&version("v2", 20, Some(3))).await,
        Ok(AppendOutcome::Replaced)
    );
    let retry = version("v2", 20, Some(3));
    let other_seq = {
        let mut g = group(&mb, 6, TODAY0, 1, "w");
        g.source = position("log-a", 0, 21);
        g.token = Some(WriteToken::from_raw(4));
        g
    };
    assert_eq!(
        store.append_run(&[&retry, &other_seq]).await,
        vec![Ok(AppendOutcome::Replaced), Ok(AppendOutcome::Inserted)]
    );
    assert_eq!(
        store.append_run(&[&retry, &other_seq]).await,
        vec![Ok(AppendOutcome::Replaced), Ok(AppendOutcome::Inserted)],
        "a whole run sent again after its answer was lost"
    );
    // The stored mark is not part of the position: the late write of offset 10 is still fenced.
    assert_eq!(
        store.append(&version("v1", 10, Some(1))).await,
        Ok(AppendOutcome::Superseded)
    );
    assert_eq!(
        store.seq_positions(&mb).await.map(|seqs| seqs
            .into_iter()
            .map(|s| (s.seq, s.position))
            .collect::<Vec<_>>()),
        Ok(vec![
            (5, position("log-a", 0, 20)),
            (6, position("log-a", 0, 21))
        ])
    );

    // In one run, as one by one: the same delivery twice answers its own insert twice; another
    // reading of it after the insert is unchanged.
    let fresh = |seq: u64, token: u64| {
        let mut g = group(&mb, seq, TODAY0, 1, "r");
        g.source = position("log-a", 0, 40 + seq as i64);
        g.token = Some(WriteToken::from_raw(token));
        g
    };
    assert_eq!(
        store.append_run(&[&fresh(7, 9), &fresh(7, 9)]).await,
        vec![Ok(AppendOutcome::Inserted), Ok(AppendOutcome::Inserted)]
    );
    assert_eq!(
        store.append_run(&[&fresh(8, 10), &fresh(8, 11)]).await,
        vec![Ok(AppendOutcome::Inserted), Ok(AppendOutcome::Unchanged)]
    );

    // A version written without a mark (a delivery without a token, as an older release wrote
    // every version): a retry can never claim it.
    assert_eq!(
        store.append(&version("v3", 30, None)).await,
        Ok(AppendOutcome::Replaced)
    );
    assert_eq!(
        store.append(&version("v3", 30, Some(5))).await,
        Ok(AppendOutcome::Unchanged)
    );
    // And a later version's retry token never answers for an earlier one.
    assert_eq!(
        store.append(&version("v2", 20, Some(3))).await,
        Ok(AppendOutcome::Superseded)
    );
}

/// SPEC 7.2: positions are kept per seq. A replay of a replace that was refused (dead-lettered)
/// after later records wrote other seqs of the mailbox applies: a write of another seq never
/// fences this one. Alone and in a batch.
pub async fn a_later_write_of_another_seq_never_fences_a_replace(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let at = |offset: i64| position("log-a", 0, offset);
    let held = |tag: &str| format!("{{\"i\":0,\"tag\":\"{tag}\"}}");
    for (round, batched) in [(0, false), (1, true)] {
        let mb = mailbox(&format!("other-seq-{round}"), 1);
        let at_seq = |seq: u64, tag: &str, offset: i64| {
            let mut g = group(&mb, seq, TODAY0, 1, tag);
            g.source = at(offset);
            g
        };
        // Offset 0 writes seq 1 "a"; offset 1 (its replace "b") was dead-lettered; offset 2
        // writes seq 2.
        assert_eq!(
            store.append(&at_seq(1, "a", 0)).await,
            Ok(AppendOutcome::Inserted)
        );
        assert_eq!(
            store.append(&at_seq(2, "c", 2)).await,
            Ok(AppendOutcome::Inserted)
        );
        // The operator's replay of offset 1.
        let replay = at_seq(1, "b", 1);
        let outcome = if batched {
            store.append_many(&[&replay]).await.remove(0)
        } else {
            store.append(&replay).await
        };
        assert_eq!(outcome, Ok(AppendOutcome::Replaced), "batched: {batched}");
        let page = scan(store.as_ref(), &mb, 0, None, 10).await.expect("scan");
        assert_eq!(first_payloads(&page), vec![held("b"), held("c")]);
    }
}

/// SPEC 7.2: a cut-over to a new topic (a recreated topic, a mirror) is another log, whose
/// offsets start again. Its first records replace seqs of the same day with new content: the new
/// content wins on every seq, and the new log's later records order against each other again.
pub async fn a_cut_over_to_a_new_log_replaces_same_day_content(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let held = |tag: &str| format!("{{\"i\":0,\"tag\":\"{tag}\"}}");
    let users: Vec<_> = (0..6)
        .map(|i| mailbox(&format!("cutover-{i}"), 1))
        .collect();
    // Log A: seqs 1..=3 of every user, at offsets up to 100.
    let mut offset = 80;
    for mb in &users {
        for seq in 1..=3 {
            let mut g = group(mb, seq, TODAY0, 1, "old");
            g.source = position("log-a", 0, offset);
            offset += 1;
            assert_eq!(store.append(&g).await, Ok(AppendOutcome::Inserted));
        }
    }
    // Log B from offset 0: replace seq 1 of every user (half alone, half in one batch), then
    // add seq 4.
    let replaces: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(i, mb)| {
            let mut g = group(mb, 1, TODAY0, 1, "new");
            g.source = position("log-b", 0, i as i64);
            g
        })
        .collect();
    for g in &replaces[..3] {
        assert_eq!(store.append(g).await, Ok(AppendOutcome::Replaced));
    }
    let refs: Vec<_> = replaces[3..].iter().collect();
    assert_eq!(
        store.append_many(&refs).await,
        vec![Ok(AppendOutcome::Replaced); 3]
    );
    for (i, mb) in users.iter().enumerate() {
        let mut g = group(mb, 4, TODAY0, 1, "new");
        g.source = position("log-b", 0, 10 + i as i64);
        assert_eq!(store.append(&g).await, Ok(AppendOutcome::Inserted));
        let page = scan(store.as_ref(), mb, 0, None, 10).await.expect("scan");
        assert_eq!(
            first_payloads(&page),
            vec![held("new"), held("old"), held("old"), held("new")],
            "user {i}"
        );
    }
    // Within log B, offsets order again: a late write of B's offset 0 after B's offset 50
    // rewrote seq 1 is superseded.
    let mb = &users[0];
    let mut newer = group(mb, 1, TODAY0, 1, "newer");
    newer.source = position("log-b", 0, 50);
    assert_eq!(store.append(&newer).await, Ok(AppendOutcome::Replaced));
    assert_eq!(
        store.append(&replaces[0]).await,
        Ok(AppendOutcome::Superseded)
    );
}

/// SPEC 7.2 "Readers never see a torn step": scans running beside a stream of same-day replaces
/// of one group answer, every time, every group their `up_to` covers, each whole in its old or
/// its new content. (Scylla's deterministic version holds a scan between its identity and event
/// reads: `a_scan_beside_a_same_day_replace_never_skips_the_group`.)
pub async fn scans_beside_same_day_replaces_never_skip_a_group(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let mb = mailbox("torn-any", 1);
    for seq in 1..=3 {
        assert_eq!(
            store.append(&group(&mb, seq, TODAY0, 3, "a")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    let writer = {
        let store = store.clone();
        let mb = mb.clone();
        tokio::spawn(async move {
            for round in 0..60 {
                let tag = if round % 2 == 0 { "b" } else { "a" };
                let outcome = store.append(&group(&mb, 2, TODAY0, 3, tag)).await;
                assert_eq!(outcome, Ok(AppendOutcome::Replaced), "round {round}");
            }
        })
    };
    let mut scans = 0;
    while !writer.is_finished() || scans < 10 {
        let page = scan(store.as_ref(), &mb, 0, None, 10).await.expect("scan");
        assert_eq!(page.up_to, 3);
        assert_eq!(seqs(&page), vec![1, 2, 3], "scan {scans} skipped a group");
        let middle = &page.groups[1].events;
        assert_eq!(middle.len(), 3, "a whole group");
        let tags: Vec<bool> = middle
            .iter()
            .map(|e| e.payload.as_str().contains("\"b\""))
            .collect();
        assert!(
            tags.iter().all(|t| *t == tags[0]),
            "one content, never a mix"
        );
        scans += 1;
    }
    writer.await.expect("writer");
}

// ---- runs ----

/// A run (consecutive groups of one mailbox, `append_run`) answers each group exactly as one
/// append after another would, a final refusal in the middle included, and leaves the same
/// mailbox; a group that is not final (a corrupt mailbox) ends the run there, nothing after it
/// applied.
pub async fn append_run_answers_each_group_like_append(h: &H) {
    let f = fixture(h).await;
    let s = f.store();
    let script = |mb: &MailboxId| {
        vec![
            group(mb, 1, TODAY0, 1, "below the trim"),
            group(mb, 6, TODAY0, 2, "a"),
            group(mb, 7, TODAY0 - 1, 1, "b"),
            group(mb, 6, TODAY0, 2, "a"),
            group(mb, 7, TODAY0 - 1, 3, "b2"),
            group(mb, 6, TODAY0 - 1, 2, "a"),
            group(mb, 8, TODAY0 + 40, 1, "future"),
            group(mb, 9, TODAY0, 1, "d"),
        ]
    };
    let one = mailbox("u-run-one", 1);
    let many = mailbox("u-run-many", 1);
    for mb in [&one, &many] {
        append_ok(&*s, mb, 5, TODAY0, "set-up").await;
        s.truncate_before(mb, 3).await.expect("truncate");
    }
    let mut one_by_one = Vec::new();
    for g in &script(&one) {
        one_by_one.push(s.append(g).await);
    }
    let groups = script(&many);
    let run: Vec<&mailbox_materializer::model::EventGroup> = groups.iter().collect();
    let in_a_run = s.append_run(&run).await;
    let words = |answers: &[Result<AppendOutcome, StoreError>]| -> Vec<String> {
        answers
            .iter()
            .map(|a| match a {
                Ok(o) => o.as_str().to_owned(),
                Err(e) => format!("{} {}", e.outcome(), e.kind()),
            })
            .collect()
    };
    assert_eq!(
        words(&one_by_one),
        [
            "trimmed",
            "inserted",
            "inserted",
            "unchanged",
            "replaced",
            "conflict cross_day",
            "rejected future_created_at",
            "inserted"
        ]
    );
    assert_eq!(words(&in_a_run), words(&one_by_one));
    assert_eq!(
        s.inspect(&many).await.expect("inspect"),
        s.inspect(&one).await.expect("inspect")
    );
    let content = |page: ScanPage| -> Vec<(u64, Vec<String>)> {
        page.groups
            .iter()
            .map(|g| {
                let events = g.events.iter().map(|e| e.payload.as_str().to_owned());
                (g.mailbox_seq, events.collect())
            })
            .collect()
    };
    assert_eq!(
        content(scan(&*s, &many, 2, None, 100).await.expect("scan")),
        content(scan(&*s, &one, 2, None, 100).await.expect("scan"))
    );

    // A corrupt mailbox: the first group answers corrupt and the run ends there.
    let broken = mailbox("u-run-corrupt", 1);
    append_ok(&*s, &broken, 1, TODAY0, "a").await;
    assert!(f.corrupt(&broken, Corruption::LoseIdentityIndex).await);
    let before = f.fingerprint(&broken.user_id).await;
    let groups = [
        group(&broken, 2, TODAY0, 1, "b"),
        group(&broken, 3, TODAY0, 1, "c"),
    ];
    let answers = s.append_run(&groups.iter().collect::<Vec<_>>()).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(corrupt_kind(&answers[0]), "index_lost");
    assert_eq!(f.fingerprint(&broken.user_id).await, before);
    assert!(s.append_run(&[]).await.is_empty());
}

/// SPEC 4 both ways on random histories: one group at a time and in runs, the same answers,
/// the same inspection and the same pages.
pub async fn randomized_histories_agree_in_runs_and_one_by_one(h: &H) {
    super::history::compare_runs_with_one_by_one(h.clone(), 24).await;
}

/// One `append_runs` of runs for many users (spread over every master of a cluster), runs of
/// 1, 2 and 3 groups mixed with a corrupt user's run: each run answers exactly as its groups
/// appended one by one would, the corrupt one stopping at its first group, whatever else shared
/// the batch.
pub async fn append_runs_spread_over_many_users_answer_each(h: &H) {
    let f = h.fixture(policy(), NOW0).await;
    let store = f.store();
    let broken = mailbox("runs-broken", 1);
    append_ok(&*store, &broken, 1, TODAY0, "a").await;
    assert!(f.corrupt(&broken, Corruption::LoseIdentityIndex).await);
    let users = 60;
    let runs: Vec<Vec<_>> = (0..users)
        .map(|i| {
            let mb = mailbox(&format!("runs-{i}"), 1);
            let mut run = vec![group(&mb, 1, TODAY0, 1, "a")];
            if i % 3 >= 1 {
                run.push(group(&mb, 2, TODAY0 - 1, 2, "b"));
            }
            if i % 3 == 2 {
                run.push(group(&mb, 1, TODAY0, 1, "a"));
            }
            run
        })
        .chain(std::iter::once(vec![
            group(&broken, 2, TODAY0, 1, "b"),
            group(&broken, 3, TODAY0, 1, "c"),
        ]))
        .collect();
    let refs: Vec<Vec<_>> = runs.iter().map(|run| run.iter().collect()).collect();
    let slices: Vec<&[&mailbox_materializer::model::EventGroup]> =
        refs.iter().map(Vec::as_slice).collect();
    let answers = store.append_runs(&slices).await;
    assert_eq!(answers.len(), users + 1);
    for (i, answer) in answers.iter().take(users).enumerate() {
        let want: Vec<_> = [
            AppendOutcome::Inserted,
            AppendOutcome::Inserted,
            AppendOutcome::Unchanged,
        ]
        .into_iter()
        .take(1 + i % 3)
        .map(Ok)
        .collect();
        assert_eq!(answer, &want, "user {i}");
    }
    let last = &answers[users];
    assert_eq!(last.len(), 1, "{last:?}");
    assert_eq!(corrupt_kind(&last[0]), "index_lost");
    // The same batch again: every group an identical replay.
    let again = store.append_runs(&slices).await;
    for (i, answer) in again.iter().take(users).enumerate() {
        assert!(
            answer.len() == 1 + i % 3 && answer.iter().all(|a| a == &Ok(AppendOutcome::Unchanged)),
            "user {i}: {answer:?}"
        );
    }
    for i in [0, 1, 2, users - 1] {
        let mb = mailbox(&format!("runs-{i}"), 1);
        let want: Vec<u64> = if i % 3 == 0 { vec![1] } else { vec![1, 2] };
        assert_eq!(scan_seqs(store.as_ref(), &mb, 0).await, want, "user {i}");
    }
}
