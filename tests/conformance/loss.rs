//! SPEC 7.3 "Any one piece of a mailbox lost, at any moment": a generated matrix. Every piece of
//! a mailbox a store can lose on its own ([`PIECES`]: the epoch record, the meta, the identity
//! index, the day set, one day's events), in every state the cases reach ([`STATES`]: fresh,
//! several live days, after an epoch move, after a truncate, beside an expired day), followed by
//! every operation ([`OPS`]: an append of the same day, of a new day, an identical replay, a
//! same-day replace, a stale epoch, a truncate, a promote, a scan) and then a scan from 0: each
//! answer must be the memory reference's answer for the undamaged mailbox, or `corrupt`. Never a
//! page that claims coverage over seqs it did not read, never a stale epoch `inserted`, never an
//! epoch that moves backwards.
//!
//! A backend that cannot lose a piece on its own (memory keeps a mailbox in one structure;
//! Scylla's day set is a column of the meta row) answers `false` to the damage, and that cell is
//! not run; the matrix prints how many cells ran.

use std::sync::Arc;

use mailbox_materializer::model::{AppendOutcome, MailboxId, ScanPage, ScanRequest, StoreError};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::MailboxStore;

use super::memory::MemoryHarness;
use super::{expiry_of, group, mailbox, policy, Fixture, Harness, NOW0, TODAY0};

/// A piece of a mailbox, lost alone.
#[derive(Debug, Clone, Copy)]
enum Piece {
    EpochKey,
    Meta,
    IdentityIndex,
    DaySet,
    /// The events of the mailbox's newest live day.
    NewestDay,
}

const PIECES: [Piece; 5] = [
    Piece::EpochKey,
    Piece::Meta,
    Piece::IdentityIndex,
    Piece::DaySet,
    Piece::NewestDay,
];

/// A state the mailbox is in when the piece is lost.
#[derive(Debug, Clone, Copy)]
enum State {
    Fresh,
    SeveralDays,
    AfterEpochMove,
    AfterTruncate,
    BesideExpiredDay,
}

const STATES: [State; 5] = [
    State::Fresh,
    State::SeveralDays,
    State::AfterEpochMove,
    State::AfterTruncate,
    State::BesideExpiredDay,
];

/// What is done to the mailbox after the loss.
#[derive(Debug, Clone, Copy)]
enum Op {
    AppendSameDay,
    AppendNewDay,
    IdenticalReplay,
    SameDayReplace,
    StaleEpoch,
    Truncate,
    Promote,
    Scan,
}

const OPS: [Op; 8] = [
    Op::AppendSameDay,
    Op::AppendNewDay,
    Op::IdenticalReplay,
    Op::SameDayReplace,
    Op::StaleEpoch,
    Op::Truncate,
    Op::Promote,
    Op::Scan,
];

/// What the state left behind, for the ops to aim at.
struct Built {
    epoch: u32,
    max_seq: u64,
    /// The newest live day.
    last_day: u64,
    /// Today, after the state moved the clock.
    today: u64,
}

/// The clock of a state: [`State::BesideExpiredDay`] moves it past the first day's expiry.
fn state_now(state: State) -> u64 {
    match state {
        State::BesideExpiredDay => expiry_of(&policy(), TODAY0 - 6) + 60,
        _ => NOW0,
    }
}

/// Writes `state` into `name`'s mailbox (before the clock moves, see [`state_now`]).
async fn build(store: &dyn MailboxStore, name: &str, state: State) -> Built {
    let append = |mb: MailboxId, seq: u64, day: u64| async move {
        let result = store.append(&group(&mb, seq, day, 2, "a")).await;
        assert!(result.is_ok(), "building {name}: seq {seq}: {result:?}");
    };
    let mb = mailbox(name, 1);
    match state {
        State::Fresh => {
            append(mb, 1, TODAY0 - 1).await;
            built(1, 1, TODAY0 - 1)
        }
        State::SeveralDays | State::AfterTruncate => {
            for (seq, day) in [(1, 3), (2, 3), (3, 2), (4, 2), (5, 1), (6, 1)] {
                append(mb.clone(), seq, TODAY0 - day).await;
            }
            if let State::AfterTruncate = state {
                let trimmed = store.truncate_before(&mb, 4).await;
                assert!(trimmed.is_ok(), "{trimmed:?}");
            }
            built(1, 6, TODAY0 - 1)
        }
        State::AfterEpochMove => {
            append(mb.clone(), 1, TODAY0 - 2).await;
            append(mb, 2, TODAY0 - 2).await;
            let moved = mailbox(name, 2);
            append(moved.clone(), 1, TODAY0 - 2).await;
            append(moved.clone(), 2, TODAY0 - 1).await;
            append(moved, 3, TODAY0 - 1).await;
            built(2, 3, TODAY0 - 1)
        }
        State::BesideExpiredDay => {
            for (seq, day) in [(1, 6), (2, 6), (3, 1), (4, 1)] {
                append(mb.clone(), seq, TODAY0 - day).await;
            }
            built(1, 4, TODAY0 - 1)
        }
    }
}

fn built(epoch: u32, max_seq: u64, last_day: u64) -> Built {
    Built {
        epoch,
        max_seq,
        last_day,
        today: TODAY0,
    }
}

fn corruption(piece: Piece, b: &Built) -> Corruption {
    match piece {
        Piece::EpochKey => Corruption::LoseEpochKey,
        Piece::Meta => Corruption::LoseMeta,
        Piece::IdentityIndex => Corruption::LoseIdentityIndex,
        Piece::DaySet => Corruption::LoseDaySet,
        Piece::NewestDay => Corruption::LoseDayEvents(b.last_day),
    }
}

/// One answer, as compared: the op's own, then the scan from 0 after it.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Append(Result<mailbox_materializer::model::AppendOutcome, StoreError>),
    Truncate(Result<mailbox_materializer::model::TruncateOutcome, StoreError>),
    Promote(Result<mailbox_materializer::model::PromoteOutcome, StoreError>),
    Scan(Result<ScanPage, StoreError>),
    NotRun,
}

impl Answer {
    /// Equal as the caller of the store sees it: a truncate answers its `user_trim_seq` (the
    /// count of groups it removed is the store's own bookkeeping, and a lost bucket's groups
    /// cannot be counted).
    fn same(&self, other: &Answer) -> bool {
        match (self, other) {
            (Self::Truncate(Ok(a)), Self::Truncate(Ok(b))) => a.user_trim_seq == b.user_trim_seq,
            (a, b) => a == b,
        }
    }

    fn corrupt(&self) -> bool {
        matches!(
            self,
            Self::Append(Err(StoreError::Corrupt { .. }))
                | Self::Truncate(Err(StoreError::Corrupt { .. }))
                | Self::Promote(Err(StoreError::Corrupt { .. }))
                | Self::Scan(Err(StoreError::Corrupt { .. }))
        )
    }
}

async fn scan_all(store: &dyn MailboxStore, mb: &MailboxId) -> Answer {
    Answer::Scan(
        store
            .range_scan(
                mb,
                ScanRequest {
                    after_seq: 0,
                    until_seq: None,
                    limit_groups: 1000,
                },
            )
            .await,
    )
}

/// Runs `op` on `name`'s mailbox; answers the op's answer and the scan after it.
async fn run(store: &dyn MailboxStore, name: &str, b: &Built, op: Op) -> (Answer, Answer) {
    let mb = mailbox(name, b.epoch);
    let answer = match op {
        Op::AppendSameDay => Answer::Append(
            store
                .append(&group(&mb, b.max_seq + 1, b.last_day, 1, "n"))
                .await,
        ),
        Op::AppendNewDay => Answer::Append(
            store
                .append(&group(&mb, b.max_seq + 1, b.today, 1, "n"))
                .await,
        ),
        Op::IdenticalReplay => Answer::Append(
            store
                .append(&group(&mb, b.max_seq, b.last_day, 2, "a"))
                .await,
        ),
        Op::SameDayReplace => Answer::Append(
            store
                .append(&group(&mb, b.max_seq, b.last_day, 1, "r"))
                .await,
        ),
        Op::StaleEpoch if b.epoch > 1 => Answer::Append(
            store
                .append(&group(
                    &mailbox(name, b.epoch - 1),
                    b.max_seq + 1,
                    b.last_day,
                    1,
                    "s",
                ))
                .await,
        ),
        Op::StaleEpoch => Answer::NotRun,
        Op::Truncate => Answer::Truncate(store.truncate_before(&mb, b.max_seq).await),
        Op::Promote => Answer::Promote(store.promote(&mb).await),
        Op::Scan => scan_all(store, &mb).await,
    };
    (answer, scan_all(store, &mb).await)
}

/// The matrix on the backend of `h`, each cell against the memory reference.
pub async fn every_lost_piece_answers_the_truth_or_corrupt(h: &Arc<dyn Harness>) {
    matrix(h, &STATES).await;
}

/// The matrix on a fixture whose clock cannot move (the shared 3-master cluster): every state
/// but the one beside an expired day.
pub async fn every_lost_piece_answers_the_truth_or_corrupt_at_a_fixed_clock(h: &Arc<dyn Harness>) {
    let states: Vec<State> = STATES
        .into_iter()
        .filter(|s| state_now(*s) == NOW0)
        .collect();
    matrix(h, &states).await;
}

async fn matrix(h: &Arc<dyn Harness>, states: &[State]) {
    let mut ran = 0usize;
    let mut not_lost = 0usize;
    let mut wrong: Vec<String> = Vec::new();
    for &state in states {
        let reference = MemoryHarness.fixture(policy(), NOW0).await;
        let candidate = h.fixture(policy(), NOW0).await;
        let cells: Vec<(Piece, Op, String)> = PIECES
            .iter()
            .flat_map(|piece| OPS.iter().map(move |op| (*piece, *op)))
            .enumerate()
            .map(|(i, (piece, op))| (piece, op, format!("u-loss-{state:?}-{i}").to_lowercase()))
            .collect();
        let mut books = Vec::new();
        for (_, _, name) in &cells {
            build(&*reference.store(), name, state).await;
            books.push(build(&*candidate.store(), name, state).await);
        }
        let now = state_now(state);
        if now != NOW0 {
            reference.set_now(now).await;
            candidate.set_now(now).await;
            for b in &mut books {
                b.today = now / mailbox_materializer::model::DAY_SECS;
            }
        }
        for ((piece, op, name), b) in cells.iter().zip(&books) {
            if !damage(&*candidate, name, b, *piece).await {
                not_lost += 1;
                continue;
            }
            let got = run(&*candidate.store(), name, b, *op).await;
            // The scan after is judged against the reference with the op applied, unless the
            // candidate refused the op as corrupt: then nothing of it was written, and the
            // reference is the mailbox as it was.
            let truth = if got.0.corrupt() {
                (
                    got.0.clone(),
                    scan_all(&*reference.store(), &mailbox(name, b.epoch)).await,
                )
            } else {
                run(&*reference.store(), name, b, *op).await
            };
            ran += 1;
            if let (Piece::EpochKey, Op::StaleEpoch, Answer::Append(Ok(AppendOutcome::Inserted))) =
                (piece, op, &got.0)
            {
                // The one cell no single key can tell: with the epoch key gone, a record of an
                // older epoch finds no trace of the newer one (the old epoch's keys were deleted
                // by the move) and starts a mailbox. What must hold then is that the real epoch
                // notices before anyone reads or writes it: the key now names an older epoch
                // than one that has a mailbox (docs/decisions.md, "Loss outside the daemon").
                if !got.1.corrupt() {
                    wrong.push(format!(
                        "{state:?} / {piece:?} lost / {op:?}: the stale write was inserted and the real epoch's scan did not answer corrupt: {:?}",
                        got.1
                    ));
                }
                continue;
            }
            for (what, t, g) in [
                ("answer", &truth.0, &got.0),
                ("scan after", &truth.1, &got.1),
            ] {
                if !g.same(t) && !g.corrupt() {
                    wrong.push(format!(
                        "{state:?} / {piece:?} lost / {op:?}: {what}: expected {t:?} or corrupt, got {g:?}"
                    ));
                }
            }
        }
    }
    eprintln!(
        "loss matrix: {} pieces x {} states x {} ops: {ran} cells ran, {not_lost} pieces this backend cannot lose alone, {} wrong",
        PIECES.len(),
        states.len(),
        OPS.len(),
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} cells answered neither the truth nor corrupt:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

async fn damage(f: &dyn Fixture, name: &str, b: &Built, piece: Piece) -> bool {
    f.corrupt(&mailbox(name, b.epoch), corruption(piece, b))
        .await
}
