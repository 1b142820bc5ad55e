//! Randomized histories: a proptest generator of operation sequences, a runner that plays one on
//! any fixture while checking the store's invariants, and a comparison of two backends on the
//! same history.
//!
//! Ops are generated as *intents* (fresh append, identical replay of an earlier append, ...) and
//! resolved to concrete groups by the runner from its own bookkeeping of what it sent, never from
//! store results. The same history therefore produces the same concrete calls on every backend,
//! which is what makes [`compare_backends`] meaningful.
//!
//! Besides the common paths, histories reach the edges where backends have disagreed before:
//! scans with a stale or future epoch (the epoch check comes first, SPEC 4.4 step 1), reverse and
//! empty ranges (`until <= after`), limits of 1, cursors and seqs around 2^53 (where a Redis
//! score stops being exact) and at `MAX_MAILBOX_SEQ` and `u64::MAX`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use mailbox_materializer::model::{
    AppendOutcome, CursorExpired, EventGroup, MailboxId, RetentionPolicy, ScanRequest, StoreError,
    DAY_SECS, MAX_MAILBOX_SEQ,
};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

use super::{group, mailbox, Fixture, Harness, NOW0};

/// Users a history touches; few, so ops collide on mailboxes.
const USERS: u8 = 3;

/// One step of a history.
#[derive(Debug, Clone)]
pub enum Op {
    /// A new seq (a gap of `seq_gap - 1` skipped seqs), dated `day_offset` days from today.
    Fresh {
        user: u8,
        seq_gap: u8,
        day_offset: i16,
        events: u8,
        at: At,
    },
    /// An already-expired input with a new seq.
    FreshExpired { user: u8, days_back: u16 },
    /// The earlier append number `pick` (mod count) sent again as it was.
    IdenticalReplay { user: u8, pick: u16 },
    /// The earlier append `pick` again, same day, other content, from the position `at`.
    DifferentReplay {
        user: u8,
        pick: u16,
        events: u8,
        at: At,
    },
    /// The earlier append `pick` again, moved by `shift` days (possibly into an expired day).
    CrossDayReplay { user: u8, pick: u16, shift: i16 },
    /// An append with the previous epoch of the user.
    StaleAppend { user: u8 },
    /// The user moves to the next epoch with a fresh append.
    EpochBump { user: u8 },
    /// Trim everything below `seq_back` under the user's highest seq sent.
    Truncate { user: u8, seq_back: u8 },
    /// Move the clock forward.
    Advance { secs: u64 },
    /// A reader scans, paging until the page says there is no more.
    Scan {
        user: u8,
        from: ScanFrom,
        until: ScanUntil,
        limit: u8,
        epoch: EpochPick,
    },
    /// The user's next seqs continue from just below an edge (see [`SEQ_EDGES`]).
    SeqJump { user: u8, edge: u8 },
    /// Background compaction of one mailbox.
    Promote { user: u8 },
}

/// A write's source position (SPEC 7.2): none (`apply`), or (log, partition, offset) from two
/// logs and two partitions, offsets close enough that older and newer ones meet on one seq.
pub type At = Option<(u8, u8, u8)>;

fn at_strategy() -> impl Strategy<Value = At> {
    prop_oneof![
        1 => Just(None),
        4 => (0..2u8, 0..2u8, 0..24u8).prop_map(Some),
    ]
}

/// The position `at` names.
fn source_of(at: At) -> Option<mailbox_materializer::model::SourcePosition> {
    let (log, partition, offset) = at?;
    let log = mailbox_materializer::model::LogId::topic_id(&format!("log-{log}"))?;
    Some(mailbox_materializer::model::SourcePosition::new(
        log,
        i32::from(partition),
        i64::from(offset),
    ))
}

/// A new write token for a group read from a log (a delivery with a position has one, as the
/// daemon's and `replay`'s do; `model::written`).
fn token_of(g: &EventGroup) -> Option<mailbox_materializer::model::WriteToken> {
    g.source
        .as_ref()
        .map(|_| mailbox_materializer::model::WriteToken::next())
}

/// Seqs and cursors where arithmetic or a backend's number type changes: around 2^53 (the last
/// integer a double holds exactly), the largest valid seq, and the largest cursor a caller can
/// send.
pub const SEQ_EDGES: [u64; 9] = [
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    MAX_MAILBOX_SEQ - 1,
    MAX_MAILBOX_SEQ,
    MAX_MAILBOX_SEQ + 1,
    u64::MAX - 1,
    u64::MAX,
    0,
];

/// Where a scan starts.
#[derive(Debug, Clone, Copy)]
pub enum ScanFrom {
    Zero,
    /// The reader's cursor (where its last page ended).
    Cursor,
    /// One of [`SEQ_EDGES`].
    Edge(u8),
}

/// Where a scan ends.
#[derive(Debug, Clone, Copy)]
pub enum ScanUntil {
    Open,
    /// `until == after`: an empty range.
    Empty,
    /// `until = after - k` (saturating): a reverse range.
    Below(u8),
    /// `until = after + k` (saturating).
    Above(u8),
    /// One of [`SEQ_EDGES`].
    Edge(u8),
}

/// Which epoch a scan names, relative to the user's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochPick {
    Current,
    Previous,
    Next,
}

fn scan_strategy() -> impl Strategy<Value = Op> {
    let from = prop_oneof![
        2 => Just(ScanFrom::Zero),
        3 => Just(ScanFrom::Cursor),
        1 => any::<u8>().prop_map(ScanFrom::Edge),
    ];
    let until = prop_oneof![
        5 => Just(ScanUntil::Open),
        1 => Just(ScanUntil::Empty),
        1 => (1..4u8).prop_map(ScanUntil::Below),
        1 => (1..6u8).prop_map(ScanUntil::Above),
        1 => any::<u8>().prop_map(ScanUntil::Edge),
    ];
    let epoch = prop_oneof![
        6 => Just(EpochPick::Current),
        1 => Just(EpochPick::Previous),
        1 => Just(EpochPick::Next),
    ];
    let limit = prop_oneof![2 => Just(1u8), 3 => 2..6u8];
    (0..USERS, from, until, limit, epoch).prop_map(|(user, from, until, limit, epoch)| Op::Scan {
        user,
        from,
        until,
        limit,
        epoch,
    })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let user = 0..USERS;
    prop_oneof![
        6 => (user.clone(), 1..4u8, prop_oneof![5 => -2..=0i16, 2 => -35..31i16], 1..4u8, at_strategy()).prop_map(|(user, seq_gap, day_offset, events, at)| Op::Fresh { user, seq_gap, day_offset, events, at }),
        1 => (user.clone(), 31..90u16).prop_map(|(user, days_back)| Op::FreshExpired { user, days_back }),
        2 => (user.clone(), any::<u16>()).prop_map(|(user, pick)| Op::IdenticalReplay { user, pick }),
        3 => (user.clone(), any::<u16>(), 1..4u8, at_strategy()).prop_map(|(user, pick, events, at)| Op::DifferentReplay { user, pick, events, at }),
        2 => (user.clone(), any::<u16>(), -50..10i16).prop_map(|(user, pick, shift)| Op::CrossDayReplay { user, pick, shift }),
        1 => user.clone().prop_map(|user| Op::StaleAppend { user }),
        1 => user.clone().prop_map(|user| Op::EpochBump { user }),
        1 => (user.clone(), 0..6u8).prop_map(|(user, seq_back)| Op::Truncate { user, seq_back }),
        3 => prop_oneof![
            3 => 3_600..86_400u64,
            2 => DAY_SECS..10 * DAY_SECS,
            1 => 30 * DAY_SECS..120 * DAY_SECS,
        ].prop_map(|secs| Op::Advance { secs }),
        5 => scan_strategy(),
        1 => (user.clone(), 0..2u8).prop_map(|(user, edge)| Op::SeqJump { user, edge }),
        1 => user.prop_map(|user| Op::Promote { user }),
    ]
}

/// A history: a policy (the default, or a tight one that makes span and future limits bite) and
/// its operations.
pub fn history_strategy() -> impl Strategy<Value = (RetentionPolicy, Vec<Op>)> {
    let policies = prop_oneof![
        Just(RetentionPolicy::default()),
        Just(RetentionPolicy {
            retention_days: 3,
            future_window_days: 5,
            max_active_span_days: 6,
        }),
    ];
    (policies, prop::collection::vec(op_strategy(), 1..60))
}

/// What the runner remembers of one user.
#[derive(Debug, Default, Clone)]
struct UserBook {
    epoch: u32,
    /// Highest seq ever sent in the current epoch.
    last_seq: u64,
    /// Appends sent in the current epoch, in order.
    sent: Vec<EventGroup>,
    /// Seqs the store reported as live (Inserted/Replaced/Unchanged), with their content.
    live: BTreeMap<u64, EventGroup>,
    /// Seqs whose coverage expiry has crossed or that were merged as expired: seq -> expires_at
    /// (0 for merged ones, which are gone at once).
    gone_at: BTreeMap<u64, u64>,
    /// Largest trim the store confirmed.
    trim: u64,
    /// The reader's cursor.
    cursor: u64,
    /// The user's current epoch in the store: the epoch of the last accepted write (an append
    /// outcome other than `StaleEpoch`, or a truncate). `None`: never written. A scan of any
    /// other epoch must answer `EpochMismatch`; a user never written scans empty.
    store_epoch: Option<u32>,
}

/// Plays one history on a fixture, asserting the invariants, and returns one observation line per
/// op (free-text details left out) for cross-backend comparison.
pub async fn run_history(
    fixture: &dyn Fixture,
    policy: &RetentionPolicy,
    ops: &[Op],
) -> Result<Vec<String>, TestCaseError> {
    let store = fixture.store();
    let mut now = NOW0;
    let mut books = fresh_books();
    let mut observed = Vec::with_capacity(ops.len() + 1);
    let name = |u: u8| format!("u-hist-{u}");
    let compacted_before = store.promoted_buckets_total();

    for op in ops {
        let today = now / DAY_SECS;
        let line = match op {
            Op::Advance { secs } => {
                now += secs;
                fixture.set_now(now).await;
                format!("advance {secs}")
            }
            Op::Promote { user } => {
                let book = &books[*user as usize];
                let mb = mailbox(&name(*user), book.epoch);
                format!(
                    "promote {:?}",
                    store.promote(&mb).await.map(|p| p.expired_days)
                )
            }
            Op::Truncate { user, seq_back } => {
                let book = &mut books[*user as usize];
                let mb = mailbox(&name(*user), book.epoch);
                let before = book.last_seq.saturating_sub(u64::from(*seq_back)).max(1);
                let result = store.truncate_before(&mb, before).await;
                if let Ok(t) = &result {
                    prop_assert_eq!(t.user_trim_seq, book.trim.max(before));
                    book.store_epoch = Some(mb.epoch);
                    book.trim = t.user_trim_seq;
                    book.live.retain(|&seq, _| seq >= t.user_trim_seq);
                }
                format!(
                    "truncate {before} {}",
                    observe(&result.map(|t| t.user_trim_seq))
                )
            }
            Op::SeqJump { user, edge } => {
                let book = &mut books[*user as usize];
                // Just below 2^53 or below MAX_MAILBOX_SEQ, so the next fresh seqs cross it.
                let target = [(1u64 << 53) - 2, MAX_MAILBOX_SEQ - 3][usize::from(*edge % 2)];
                book.last_seq = book.last_seq.max(target);
                format!("jump {}", book.last_seq)
            }
            Op::Scan {
                user,
                from,
                until,
                limit,
                epoch,
            } => {
                let book = &mut books[*user as usize];
                let edge = |i: u8| SEQ_EDGES[usize::from(i) % SEQ_EDGES.len()];
                let after = match from {
                    ScanFrom::Zero => 0,
                    ScanFrom::Cursor => book.cursor,
                    ScanFrom::Edge(i) => edge(*i),
                };
                let until = match until {
                    ScanUntil::Open => None,
                    ScanUntil::Empty => Some(after),
                    ScanUntil::Below(k) => Some(after.saturating_sub(u64::from(*k))),
                    ScanUntil::Above(k) => Some(after.saturating_add(u64::from(*k))),
                    ScanUntil::Edge(i) => Some(edge(*i)),
                };
                let scan_epoch = match epoch {
                    EpochPick::Current => book.epoch,
                    EpochPick::Previous => book.epoch.saturating_sub(1),
                    EpochPick::Next => book.epoch + 1,
                };
                let plan = ScanPlan {
                    mailbox: mailbox(&name(*user), scan_epoch),
                    after,
                    until,
                    limit: u32::from(*limit),
                    // Only a reader's ordinary scan moves its cursor.
                    moves_cursor: matches!(from, ScanFrom::Zero | ScanFrom::Cursor)
                        && until.is_none()
                        && scan_epoch == book.epoch,
                };
                scan_and_check(&*store, &plan, book, now).await?
            }
            _ => {
                let Some((g, user)) = resolve(op, &mut books, today, policy, &name) else {
                    observed.push("skip".to_owned());
                    continue;
                };
                let result = store.append(&g).await;
                let book = &mut books[user as usize];
                record_append(book, &g, &result, policy, now);
                let inspected = store
                    .inspect(&g.mailbox)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("inspect: {e}")))?;
                prop_assert!(
                    inspected.active_days.len() <= policy.max_active_days(),
                    "{} active-day proofs",
                    inspected.active_days.len()
                );
                // The metadata as stored, so backends are compared on it too (its range and
                // count are kept incrementally on Redis, recomputed on memory).
                let meta = format!(
                    "v{:?} e{:?} days {:?}..{:?} n{} {:?} gap {} max {} trim {}",
                    inspected.format_version,
                    inspected.current_epoch,
                    inspected.min_day,
                    inspected.max_day,
                    inspected.active_day_count,
                    inspected.active_days,
                    inspected.expired_gap_boundary,
                    inspected.seqbucket_max_seq,
                    inspected.user_trim_seq
                );
                format!(
                    "append {} {} {} | {meta}",
                    g.mailbox,
                    g.mailbox_seq,
                    observe(&result)
                )
            }
        };
        observed.push(line);
    }
    // The days the store counted as compacted (what the daemon reports), over the history.
    observed.push(format!(
        "compacted {}",
        store.promoted_buckets_total() - compacted_before
    ));
    Ok(observed)
}

/// Every user's bookkeeping before a history: epoch 1, nothing sent.
fn fresh_books() -> Vec<UserBook> {
    (0..USERS)
        .map(|_| UserBook {
            epoch: 1,
            ..Default::default()
        })
        .collect()
}

/// Turns an intent into a concrete group, updating the bookkeeping of what was sent.
fn resolve(
    op: &Op,
    books: &mut [UserBook],
    today: u64,
    policy: &RetentionPolicy,
    name: &dyn Fn(u8) -> String,
) -> Option<(EventGroup, u8)> {
    let shifted = |offset: i64| (today as i64 + offset).max(0) as u64;
    let (user, g) = match *op {
        Op::Fresh {
            user,
            seq_gap,
            day_offset,
            events,
            at,
        } => {
            let book = &mut books[user as usize];
            book.last_seq += u64::from(seq_gap);
            let mb = mailbox(&name(user), book.epoch);
            let tag = format!("f{}", book.last_seq);
            let mut g = group(
                &mb,
                book.last_seq,
                shifted(day_offset.into()),
                events.into(),
                &tag,
            );
            g.source = source_of(at);
            g.token = token_of(&g);
            (user, g)
        }
        Op::FreshExpired { user, days_back } => {
            let book = &mut books[user as usize];
            book.last_seq += 1;
            let mb = mailbox(&name(user), book.epoch);
            let day = shifted(-i64::from(days_back))
                .min((today + 1).saturating_sub(u64::from(policy.retention_days) + 2));
            (user, group(&mb, book.last_seq, day, 1, "expired"))
        }
        Op::IdenticalReplay { user, pick } => {
            // Even picks: the same delivery sent again (a retry after a lost answer, its
            // token kept); odd: the record read anew (a new token).
            let book = &books[user as usize];
            let earlier = pick_sent(book, pick)?;
            let mut g = earlier.clone();
            if pick % 2 == 1 {
                g.token = token_of(&g);
            }
            (user, g)
        }
        Op::DifferentReplay {
            user,
            pick,
            events,
            at,
        } => {
            let book = &books[user as usize];
            let earlier = pick_sent(book, pick)?;
            let mut g = group(
                &earlier.mailbox,
                earlier.mailbox_seq,
                earlier.day(),
                events.into(),
                &format!("d{pick}"),
            );
            g.created_at = earlier.created_at;
            g.source = source_of(at);
            g.token = token_of(&g);
            (user, g)
        }
        Op::CrossDayReplay { user, pick, shift } => {
            let book = &books[user as usize];
            let earlier = pick_sent(book, pick)?;
            let shift = if shift == 0 { -1 } else { shift };
            let day = (earlier.day() as i64 + i64::from(shift)).max(0) as u64;
            let mut g = earlier.clone();
            g.created_at = day * mailbox_materializer::model::DAY_MS + 7;
            (user, g)
        }
        Op::StaleAppend { user } => {
            let book = &books[user as usize];
            if book.epoch == 0 {
                return None;
            }
            let mb = mailbox(&name(user), book.epoch - 1);
            (user, group(&mb, book.last_seq + 1, today, 1, "stale"))
        }
        Op::EpochBump { user } => {
            let book = &mut books[user as usize];
            *book = UserBook {
                epoch: book.epoch + 1,
                store_epoch: book.store_epoch,
                ..Default::default()
            };
            book.last_seq = 1;
            let mb = mailbox(&name(user), book.epoch);
            (user, group(&mb, 1, today, 1, "bump"))
        }
        _ => return None,
    };
    let book = &mut books[user as usize];
    if g.mailbox.epoch == book.epoch {
        book.sent.push(g.clone());
    }
    Some((g, user))
}

fn pick_sent(book: &UserBook, pick: u16) -> Option<&EventGroup> {
    if book.sent.is_empty() {
        None
    } else {
        book.sent.get(pick as usize % book.sent.len())
    }
}

/// Updates what the runner knows is live or gone after an append.
fn record_append(
    book: &mut UserBook,
    g: &EventGroup,
    result: &Result<AppendOutcome, StoreError>,
    policy: &RetentionPolicy,
    now: u64,
) {
    if matches!(
        result,
        Ok(AppendOutcome::Inserted
            | AppendOutcome::Replaced
            | AppendOutcome::Unchanged
            | AppendOutcome::Superseded
            | AppendOutcome::ExpiredMerged
            | AppendOutcome::Trimmed)
    ) {
        // Accepted, so its epoch is (now) the user's current one.
        book.store_epoch = Some(g.mailbox.epoch);
    }
    if g.mailbox.epoch != book.epoch {
        // An append with an older epoch: whatever it did belongs to another mailbox.
        return;
    }
    match result {
        Ok(AppendOutcome::Inserted | AppendOutcome::Replaced | AppendOutcome::Unchanged) => {
            let mut stored = g.clone();
            stored.events.sort_by_key(|e| e.event_ordinal);
            book.live.insert(g.mailbox_seq, stored);
            book.gone_at
                .insert(g.mailbox_seq, policy.expires_at(g.day()));
        }
        Ok(AppendOutcome::ExpiredMerged) => {
            book.gone_at.entry(g.mailbox_seq).or_insert(now);
        }
        // The seq keeps the version a later offset of the same log and partition wrote.
        Ok(AppendOutcome::Superseded) => {}
        _ => {}
    }
}

/// One scan of a history: the request and whether it is the reader's ordinary scan (its cursor
/// follows the pages).
struct ScanPlan {
    mailbox: MailboxId,
    after: u64,
    until: Option<u64>,
    limit: u32,
    moves_cursor: bool,
}

/// Scans as `plan` says, paging until a page says there is no more, and checks every invariant
/// of a page.
async fn scan_and_check(
    store: &dyn mailbox_materializer::store::MailboxStore,
    plan: &ScanPlan,
    book: &mut UserBook,
    now: u64,
) -> Result<String, TestCaseError> {
    let mb = &plan.mailbox;
    // The book knows the content of the user's current epoch only.
    let other_epoch = mb.epoch != book.epoch;
    let mismatch_expected = book.store_epoch.is_some_and(|current| current != mb.epoch);
    let mut after = plan.after;
    let mut seen = BTreeSet::new();
    let mut lines = Vec::new();
    for _page in 0..1000 {
        let result = store
            .range_scan(
                mb,
                ScanRequest {
                    after_seq: after,
                    until_seq: plan.until,
                    limit_groups: plan.limit,
                },
            )
            .await;
        // SPEC 4.4 step 1 comes before everything, the reverse-range answer included.
        if mismatch_expected {
            prop_assert_eq!(
                &result,
                &Err(StoreError::EpochMismatch {
                    current: book.store_epoch
                }),
                "scan of epoch {} while the user is at {:?}",
                mb.epoch,
                book.store_epoch
            );
        } else if book.store_epoch.is_none() {
            prop_assert_eq!(
                &result,
                &Ok(mailbox_materializer::model::ScanPage::empty(after)),
                "a user never written scans empty"
            );
        }
        let reverse = plan.until.is_some_and(|u| u <= after);
        // A seq the reader could have missed: it lived above the cursor, at or above the trim,
        // and its coverage has expired (or it was merged as expired input).
        let crossed = book
            .gone_at
            .iter()
            .any(|(&seq, &gone)| seq > after && seq >= book.trim && gone <= now);
        match &result {
            Ok(page) => {
                prop_assert!(
                    !crossed || reverse || other_epoch,
                    "expiry crossed cursor {} but the scan succeeded",
                    after
                );
                if reverse {
                    prop_assert!(page.groups.is_empty() && !page.has_more);
                    prop_assert_eq!(page.up_to, after);
                }
                let mut previous = after;
                for g in &page.groups {
                    prop_assert!(g.mailbox_seq > previous, "seqs increase past the cursor");
                    prop_assert!(
                        plan.until.is_none_or(|u| g.mailbox_seq <= u),
                        "seq {} beyond until",
                        g.mailbox_seq
                    );
                    prop_assert!(g.mailbox_seq >= book.trim, "nothing below the trim");
                    prop_assert!(
                        seen.insert(g.mailbox_seq),
                        "group {} seen twice",
                        g.mailbox_seq
                    );
                    previous = g.mailbox_seq;
                }
                prop_assert!(page.groups.len() <= plan.limit as usize);
                prop_assert!(page.up_to >= after);
                prop_assert!(plan.until.is_none_or(|u| page.up_to <= u.max(after)));
                // Completeness: every group the store accepted and that is still live appears.
                if !other_epoch {
                    let low = after.saturating_add(1);
                    for (seq, g) in book.live.range(low..=page.up_to.max(low)) {
                        if *seq > page.up_to {
                            break;
                        }
                        if book.gone_at.get(seq).is_some_and(|&gone| gone <= now) {
                            continue;
                        }
                        let found = page.groups.iter().find(|p| p.mailbox_seq == *seq);
                        prop_assert!(found.is_some(), "live seq {} missing from the page", seq);
                        let found = found.unwrap();
                        prop_assert_eq!(found.created_at, g.created_at);
                        prop_assert_eq!(&*found.events, &g.events[..]);
                    }
                }
                lines.push(format!(
                    "{:?} up_to={} more={}",
                    page.groups
                        .iter()
                        .map(|g| g.mailbox_seq)
                        .collect::<Vec<_>>(),
                    page.up_to,
                    page.has_more
                ));
                prop_assert!(
                    !page.has_more || page.up_to > after || !page.groups.is_empty(),
                    "a page with more to come must make progress"
                );
                after = page.up_to;
                if plan.moves_cursor {
                    book.cursor = page.up_to;
                }
                if !page.has_more {
                    break;
                }
            }
            Err(StoreError::CursorExpired { cursor }) => {
                lines.push(observe(&result.clone().map(|_| ())));
                prop_assert!(
                    !reverse,
                    "a reverse range reads nothing, so nothing expires"
                );
                match *cursor {
                    CursorExpired::Trimmed { resume_after } => {
                        prop_assert_eq!(resume_after + 1, book.trim);
                        if plan.moves_cursor {
                            book.cursor = resume_after;
                        }
                    }
                    CursorExpired::ExpiredGap { boundary } => {
                        prop_assert!(boundary > after);
                        if plan.moves_cursor {
                            book.cursor = boundary;
                        }
                    }
                }
                break;
            }
            Err(StoreError::EpochMismatch { .. }) => {
                prop_assert!(
                    mismatch_expected,
                    "epoch mismatch for the user's own epoch {}",
                    mb.epoch
                );
                lines.push(observe(&result.clone().map(|_| ())));
                break;
            }
            Err(other) => {
                return Err(TestCaseError::fail(format!("scan of {mb} failed: {other}")));
            }
        }
    }
    Ok(format!(
        "scan {mb} after={} until={:?} limit={} {}",
        plan.after,
        plan.until,
        plan.limit,
        lines.join(" | ")
    ))
}

/// An outcome without free-text details, comparable across backends.
pub fn observe<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> String {
    match result {
        Ok(v) => format!("ok {v:?}"),
        Err(StoreError::Rejected { kind, .. }) => format!("rejected {}", kind.as_str()),
        Err(StoreError::Corrupt { kind }) => format!("corrupt {}", kind.as_str()),
        Err(StoreError::Unavailable { .. }) => "unavailable".to_owned(),
        Err(e) => format!("{e:?}"),
    }
}

/// Runs `body` on `cases` generated histories, shrinking a failure to a minimal history.
///
/// Proptest's runner is synchronous; it runs on a blocking thread and drives each async body on
/// the test's runtime, where the stores' connections live.
async fn run_histories<F, Fut>(cases: u32, body: F)
where
    F: Fn(RetentionPolicy, Vec<Op>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner
            .run(&history_strategy(), |(policy, ops)| {
                handle.block_on(body(policy, ops))
            })
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await
    .expect("history runner panicked");
}

/// Runs `cases` random histories on fresh fixtures of `harness`, checking the invariants.
pub async fn check_random_histories(harness: Arc<dyn Harness>, cases: u32) {
    run_histories(cases, move |policy, ops| {
        let harness = harness.clone();
        async move {
            let fixture = harness.fixture(policy, NOW0).await;
            run_history(&*fixture, &policy, &ops).await.map(|_| ())
        }
    })
    .await;
}

/// Runs `cases` random histories on a fixture of each harness and requires identical
/// observations: same outcomes, same pages.
pub async fn compare_backends(
    reference: Arc<dyn Harness>,
    candidate: Arc<dyn Harness>,
    cases: u32,
) {
    run_histories(cases, move |policy, ops| {
        let (reference, candidate) = (reference.clone(), candidate.clone());
        async move {
            let a = reference.fixture(policy, NOW0).await;
            let b = candidate.fixture(policy, NOW0).await;
            let expected = run_history(&*a, &policy, &ops).await?;
            let actual = run_history(&*b, &policy, &ops).await?;
            for (i, (x, y)) in expected.iter().zip(&actual).enumerate() {
                prop_assert_eq!(x, y, "op {} ({:?}) differs", i, ops.get(i));
            }
            prop_assert_eq!(expected.len(), actual.len());
            Ok(())
        }
    })
    .await;
}

/// One state-changing call of a history, concrete: what both ways of applying it replay.
#[derive(Debug, Clone)]
pub enum Step {
    Append(EventGroup),
    Truncate(MailboxId, u64),
    /// Move the clock to this second.
    Advance(u64),
    Promote(MailboxId),
}

/// The state-changing calls a history makes, resolved from its own bookkeeping (never from
/// store results, see the module docs); scans are left out.
pub fn concrete_steps(policy: &RetentionPolicy, ops: &[Op]) -> Vec<Step> {
    let mut now = NOW0;
    let mut books = fresh_books();
    let name = |u: u8| format!("u-hist-{u}");
    let mut steps = Vec::new();
    for op in ops {
        match op {
            Op::Advance { secs } => {
                now += secs;
                steps.push(Step::Advance(now));
            }
            Op::Promote { user } => {
                steps.push(Step::Promote(mailbox(
                    &name(*user),
                    books[*user as usize].epoch,
                )));
            }
            Op::Truncate { user, seq_back } => {
                let book = &books[*user as usize];
                let before = book.last_seq.saturating_sub(u64::from(*seq_back)).max(1);
                steps.push(Step::Truncate(mailbox(&name(*user), book.epoch), before));
            }
            Op::SeqJump { user, edge } => {
                let book = &mut books[*user as usize];
                let target = [(1u64 << 53) - 2, MAX_MAILBOX_SEQ - 3][usize::from(*edge % 2)];
                book.last_seq = book.last_seq.max(target);
            }
            Op::Scan { .. } => {}
            _ => {
                if let Some((g, _)) = resolve(op, &mut books, now / DAY_SECS, policy, &name) {
                    steps.push(Step::Append(g));
                }
            }
        }
    }
    steps
}

/// Replays `steps` on a fixture: appends one by one, or (`runs`) each stretch of consecutive
/// appends as runs ([`MailboxStore::append_run`]): per user in order of first appearance, that
/// user's appends in source order, cut where the mailbox (the epoch) changes. Answers one
/// observation per step, in step order.
async fn replay_steps(
    fixture: &dyn Fixture,
    steps: &[Step],
    runs: bool,
) -> Result<Vec<String>, TestCaseError> {
    let store = fixture.store();
    let mut observed = vec![String::new(); steps.len()];
    let mut i = 0;
    while i < steps.len() {
        match &steps[i] {
            Step::Advance(now) => {
                fixture.set_now(*now).await;
                observed[i] = format!("advance {now}");
                i += 1;
            }
            Step::Promote(mb) => {
                observed[i] = format!("promote {}", observe(&store.promote(mb).await));
                i += 1;
            }
            Step::Truncate(mb, before) => {
                let result = store.truncate_before(mb, *before).await;
                observed[i] = format!("truncate {}", observe(&result.map(|t| t.user_trim_seq)));
                i += 1;
            }
            Step::Append(g) if !runs => {
                observed[i] = format!("append {}", observe(&store.append(g).await));
                i += 1;
            }
            Step::Append(_) => {
                let (end, runs) = append_runs_from(steps, i);
                for run in &runs {
                    // A run stops after an answer that is not final (a history can reach a
                    // corrupt mailbox); the caller sends the rest again, as a run.
                    let mut rest = &run[..];
                    while !rest.is_empty() {
                        let groups: Vec<&EventGroup> = rest.iter().map(|(_, g)| *g).collect();
                        let answers = store.append_run(&groups).await;
                        prop_assert!(!answers.is_empty(), "a run answered nothing");
                        if answers.len() < rest.len() {
                            let last = answers.last().and_then(|a| a.as_ref().err());
                            prop_assert!(
                                last.is_some_and(|e| !e.is_final()),
                                "a run stopped after a final answer: {:?}",
                                answers.last()
                            );
                        }
                        for ((j, _), answer) in rest.iter().zip(&answers) {
                            observed[*j] = format!("append {}", observe(answer));
                        }
                        rest = &rest[answers.len()..];
                    }
                }
                i = end;
            }
        }
    }
    Ok(observed)
}

/// The stretch of consecutive appends starting at step `from`, as runs: per user in order of
/// first appearance, that user's appends in source order, cut where the mailbox (the epoch)
/// changes; each group with its step's index. Answers the index after the stretch, and the runs.
fn append_runs_from(steps: &[Step], from: usize) -> (usize, Vec<Vec<(usize, &EventGroup)>>) {
    let end = (from..steps.len())
        .find(|&j| !matches!(steps[j], Step::Append(_)))
        .unwrap_or(steps.len());
    let stretch: Vec<(usize, &EventGroup)> = (from..end)
        .filter_map(|j| match &steps[j] {
            Step::Append(g) => Some((j, g)),
            _ => None,
        })
        .collect();
    let mut users: Vec<&str> = Vec::new();
    for (_, g) in &stretch {
        if !users.contains(&g.mailbox.user_id.as_str()) {
            users.push(g.mailbox.user_id.as_str());
        }
    }
    let mut runs = Vec::new();
    for user in users {
        let mine: Vec<(usize, &EventGroup)> = stretch
            .iter()
            .filter(|(_, g)| g.mailbox.user_id.as_str() == user)
            .copied()
            .collect();
        runs.extend(
            mine.chunk_by(|a, b| a.1.mailbox == b.1.mailbox)
                .map(<[_]>::to_vec),
        );
    }
    (end, runs)
}

/// What a mailbox holds, as the contract shows it: its inspection and every page of a scan
/// from the start (write timestamps and other storage details left out, so two fixtures of
/// one backend compare).
async fn stored_state(fixture: &dyn Fixture, mb: &MailboxId) -> String {
    let store = fixture.store();
    let mut state = format!("{:?}\n", observe(&store.inspect(mb).await));
    let mut after = 0;
    loop {
        let request = ScanRequest {
            after_seq: after,
            until_seq: None,
            limit_groups: 1_000,
        };
        let page = store.range_scan(mb, request).await;
        state.push_str(&observe(&page));
        state.push('\n');
        match page {
            Ok(page) if page.has_more && page.up_to > after => after = page.up_to,
            _ => return state,
        }
    }
}

/// SPEC 4 both ways: `cases` random histories, each applied to two fresh fixtures of
/// `harness`, one group at a time and in runs. Every call must answer the same, and every
/// mailbox must end with the same inspection and the same pages.
pub async fn compare_runs_with_one_by_one(harness: Arc<dyn Harness>, cases: u32) {
    compare_both_ways(harness, cases, Way::Live).await;
}

/// SPEC 7.1 both ways: `cases` random histories staged by a repair into two fresh fixtures of
/// `harness`, one group at a time and in runs (a repair rebuilds a mailbox from its log as
/// runs). Every call must answer the same, and every swapped-in mailbox must end with the same
/// inspection and the same pages.
pub async fn compare_staged_runs_with_one_by_one(harness: Arc<dyn Harness>, cases: u32) {
    compare_both_ways(harness, cases, Way::Staged).await;
}

/// Where a both-ways comparison writes: the live mailboxes, or a repair's staging copies.
#[derive(Clone, Copy)]
enum Way {
    Live,
    Staged,
}

async fn compare_both_ways(harness: Arc<dyn Harness>, cases: u32, way: Way) {
    run_histories(cases, move |policy, ops| {
        let harness = harness.clone();
        async move {
            let steps = concrete_steps(&policy, &ops);
            let one = harness.fixture(policy, NOW0).await;
            let runs = harness.fixture(policy, NOW0).await;
            let (expected, actual) = match way {
                Way::Live => (
                    replay_steps(&*one, &steps, false).await?,
                    replay_steps(&*runs, &steps, true).await?,
                ),
                Way::Staged => (
                    replay_staged(&*one, &steps, false).await?,
                    replay_staged(&*runs, &steps, true).await?,
                ),
            };
            for (i, (x, y)) in expected.iter().zip(&actual).enumerate() {
                prop_assert_eq!(x, y, "step {} ({:?}) differs", i, steps.get(i));
            }
            let epochs = steps
                .iter()
                .filter_map(|s| match s {
                    Step::Append(g) => Some(g.mailbox.epoch),
                    _ => None,
                })
                .max()
                .unwrap_or(1);
            for u in 0..USERS {
                for epoch in 0..=epochs {
                    let mb = mailbox(&format!("u-hist-{u}"), epoch);
                    prop_assert_eq!(
                        stored_state(&*one, &mb).await,
                        stored_state(&*runs, &mb).await,
                        "the stored state of {} differs",
                        mb
                    );
                }
            }
            Ok(())
        }
    })
    .await;
}

/// How long a staged comparison holds its fences: far longer than a history takes.
const STAGING_LEASE: std::time::Duration = std::time::Duration::from_secs(600);

/// Replays the appends and truncates of `steps` into a repair's staging copy of each user (SPEC
/// 7.1): every user's fence is taken first, each append is staged one by one
/// ([`MailboxStore::repair_append`]) or (`runs`) each stretch per user and mailbox as runs
/// ([`MailboxStore::repair_append_run`]), each truncate with `repair_truncate`; then every copy
/// is swapped in. The clock does not move (a staging copy has no promote, and a fence must not
/// lapse), so expiry comes only from the groups' own days. Answers one observation per step.
async fn replay_staged(
    fixture: &dyn Fixture,
    steps: &[Step],
    runs: bool,
) -> Result<Vec<String>, TestCaseError> {
    let store = fixture.store();
    let mut tokens: BTreeMap<String, mailbox_materializer::store::RepairToken> = BTreeMap::new();
    for step in steps {
        let user = match step {
            Step::Append(g) => &g.mailbox.user_id,
            Step::Truncate(mb, _) => &mb.user_id,
            _ => continue,
        };
        if !tokens.contains_key(user.as_str()) {
            let token = store.repair_begin(user, STAGING_LEASE).await;
            prop_assert!(token.is_ok(), "fence of {}: {:?}", user, token.err());
            if let Ok(token) = token {
                tokens.insert(user.as_str().to_owned(), token);
            }
        }
    }
    let token_of = |user: &str| tokens.get(user).cloned();
    let mut observed = vec![String::new(); steps.len()];
    let mut i = 0;
    while i < steps.len() {
        match &steps[i] {
            Step::Advance(_) | Step::Promote(_) => i += 1,
            Step::Truncate(mb, before) => {
                let token = token_of(mb.user_id.as_str())
                    .ok_or_else(|| TestCaseError::fail(format!("no fence for {}", mb.user_id)))?;
                let result = store.repair_truncate(&token, mb, *before).await;
                observed[i] = format!("truncate {}", observe(&result.map(|t| t.user_trim_seq)));
                i += 1;
            }
            Step::Append(g) if !runs => {
                let token = token_of(g.mailbox.user_id.as_str()).ok_or_else(|| {
                    TestCaseError::fail(format!("no fence for {}", g.mailbox.user_id))
                })?;
                observed[i] = format!("append {}", observe(&store.repair_append(&token, g).await));
                i += 1;
            }
            Step::Append(_) => {
                let (end, runs) = append_runs_from(steps, i);
                for run in &runs {
                    let user = run[0].1.mailbox.user_id.as_str();
                    let token = token_of(user)
                        .ok_or_else(|| TestCaseError::fail(format!("no fence for {user}")))?;
                    let mut rest = &run[..];
                    while !rest.is_empty() {
                        let groups: Vec<&EventGroup> = rest.iter().map(|(_, g)| *g).collect();
                        let answers = store.repair_append_run(&token, &groups).await;
                        prop_assert!(!answers.is_empty(), "a staged run answered nothing");
                        for ((j, _), answer) in rest.iter().zip(&answers) {
                            observed[*j] = format!("append {}", observe(answer));
                        }
                        rest = &rest[answers.len()..];
                    }
                }
                i = end;
            }
        }
    }
    for (user, token) in &tokens {
        let swapped = store.repair_swap(token).await;
        prop_assert!(swapped.is_ok(), "swap of {}: {:?}", user, swapped.err());
    }
    Ok(observed)
}
