//! The rules of SPEC 4 that do not depend on where a mailbox is kept: pure functions of its meta
//! (as plain values), the input and the clock. The memory store and the Scylla backend both call
//! them, so a rule and its error text exist once in Rust; the Lua scripts of the Redis backend are
//! the one other copy, held to these by the randomized comparison of backends.
//!
//! No I/O, no allocation on the common paths: the memory store's append calls these on every
//! operation.

use super::error::{ConflictKind, CorruptKind, CursorExpired, RejectKind, StoreError};
use super::group::SourcePosition;
use super::retention::{today, RetentionPolicy};

/// The retention format every backend reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 4;

/// One day's proof in the meta (`bucket_max_seq:<day>`, `bucket_expires_at:<day>`); either field
/// may be missing in a damaged meta.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Proof {
    pub max_seq: Option<u64>,
    pub expires_at: Option<u64>,
}

/// SPEC 4.2.4: a meta of another format (`found`, as stored) is never read or written.
#[inline]
pub(crate) fn check_format(found: Option<i64>) -> Result<(), StoreError> {
    match found {
        Some(version) if version != i64::from(FORMAT_VERSION) => {
            Err(StoreError::corrupt(CorruptKind::UnsupportedFormat {
                found: version.to_string(),
            }))
        }
        _ => Ok(()),
    }
}

/// SPEC 4.2 step 2: a `created_at` day beyond `today + future_window_days` is rejected before
/// anything is touched.
#[inline]
pub(crate) fn check_future_window(
    policy: &RetentionPolicy,
    day: u64,
    now: u64,
) -> Result<(), StoreError> {
    if !policy.is_beyond_future_window(day, now) {
        return Ok(());
    }
    Err(future_created_at(policy, day, now))
}

/// The refusal of SPEC 4.2 step 2, as every backend words it (Redis decides in its script and
/// reports the day and the server's clock).
pub fn future_created_at(policy: &RetentionPolicy, day: u64, now: u64) -> StoreError {
    StoreError::rejected(
        RejectKind::FutureCreatedAt,
        format!(
            "created_at day {day} is beyond today ({}) + future_window_days ({})",
            today(now),
            policy.future_window_days
        ),
    )
}

/// The refusal of SPEC 4.2 step 8 when adding `day` would make the active days span
/// `low..=high`, as every backend words it.
pub(crate) fn span_exceeded(policy: &RetentionPolicy, day: u64, low: u64, high: u64) -> StoreError {
    StoreError::rejected(
        RejectKind::SpanExceeded,
        format!(
            "adding day {day} makes the active days span {low}..={high}, more than max_active_span_days ({})",
            policy.max_active_span_days
        ),
    )
}

/// What SPEC 4.2 step 3 does with an append of `incoming` for a user whose current epoch is
/// `current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EpochStep {
    /// Older than the current epoch: `StaleEpoch`, nothing written.
    Stale,
    /// The current epoch.
    Current,
    /// A newer epoch, or a user never written: the user moves to a fresh mailbox of `incoming`
    /// (the old epoch's state is deleted) once something is written.
    Move,
}

#[inline]
pub(crate) fn epoch_step(current: Option<u64>, incoming: u64) -> EpochStep {
    match current {
        Some(c) if incoming < c => EpochStep::Stale,
        Some(c) if incoming == c => EpochStep::Current,
        _ => EpochStep::Move,
    }
}

/// SPEC 4.3 and 4.4 step 1: an operation on the mailbox of `requested` when the user's epoch is
/// `current`. `Ok(false)`: a user never written.
#[inline]
pub(crate) fn check_epoch(current: Option<u64>, requested: u64) -> Result<bool, StoreError> {
    match current {
        None => Ok(false),
        Some(c) if c == requested => Ok(true),
        Some(c) => Err(StoreError::EpochMismatch {
            current: u32::try_from(c).ok(),
        }),
    }
}

/// Promote phase 1's result: what phase 2 applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PromotePlan {
    /// Days whose expiry has passed, in ascending order: their proofs and day-set members go.
    pub expired_days: Vec<u64>,
    /// The gap boundary after merging them.
    pub new_boundary: u64,
}

/// SPEC 4.5 phase 1: validates every expired day of `day_set` (day -> score) against its proof and
/// computes the new gap boundary; changes nothing. A bad proof is `Corrupt(BadProof)`, and then
/// nothing of the promote may be applied.
///
/// A day wholly below the trim proves no gap: its seqs were removed explicitly.
pub(crate) fn plan_promote(
    day_set: impl IntoIterator<Item = (u64, u64)>,
    proof_of: impl Fn(u64) -> Proof,
    boundary: u64,
    trim: u64,
    now: u64,
) -> Result<PromotePlan, StoreError> {
    let mut plan = PromotePlan {
        expired_days: Vec::new(),
        new_boundary: boundary,
    };
    for (day, score) in day_set {
        if score > now {
            continue;
        }
        let proof = proof_of(day);
        let bad = |what: &str| {
            StoreError::corrupt(CorruptKind::BadProof {
                detail: format!("expired day {day}: {what}"),
            })
        };
        let max_seq = proof
            .max_seq
            .ok_or_else(|| bad("bucket_max_seq is missing"))?;
        let expires_at = proof
            .expires_at
            .ok_or_else(|| bad("bucket_expires_at is missing"))?;
        if expires_at != score {
            return Err(bad(&format!(
                "bucket_expires_at {expires_at} disagrees with the day set score {score}"
            )));
        }
        if max_seq >= trim {
            plan.new_boundary = plan.new_boundary.max(max_seq);
        }
        plan.expired_days.push(day);
    }
    Ok(plan)
}

/// True when a proof that has not expired covers a seq at or above the trim: the meta proves that
/// live groups exist (SPEC 4.2.6).
#[inline]
pub(crate) fn proves_live_groups(
    proofs: impl IntoIterator<Item = Proof>,
    trim: u64,
    now: u64,
) -> bool {
    proofs
        .into_iter()
        .any(|p| p.expires_at.is_some_and(|e| e > now) && p.max_seq.is_some_and(|m| m >= trim))
}

/// SPEC 4.2.6: a meta proving live groups with the identity index wholly missing is
/// `Corrupt(IndexLost)`; an identity index without meta is `Corrupt(MetaLost)`.
#[inline]
pub(crate) fn check_integrity(
    meta_exists: bool,
    proves_live_groups: bool,
    index_present: bool,
) -> Result<(), StoreError> {
    match (meta_exists, index_present) {
        (true, false) if proves_live_groups => Err(StoreError::corrupt(CorruptKind::IndexLost)),
        (false, true) => Err(StoreError::corrupt(CorruptKind::MetaLost)),
        _ => Ok(()),
    }
}

/// SPEC 4.4 steps 4 and 5.
#[inline]
pub(crate) fn check_cursor(after_seq: u64, trim: u64, boundary: u64) -> Result<(), StoreError> {
    if after_seq.saturating_add(1) < trim {
        return Err(StoreError::CursorExpired {
            cursor: CursorExpired::Trimmed {
                resume_after: trim - 1,
            },
        });
    }
    if after_seq < boundary {
        return Err(StoreError::CursorExpired {
            cursor: CursorExpired::ExpiredGap { boundary },
        });
    }
    Ok(())
}

/// The facts SPEC 4.2 steps 7 and 8 decide on, read from the mailbox after its promote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendFacts {
    pub seq: u64,
    pub day: u64,
    /// `user_trim_seq`.
    pub trim: u64,
    /// The expiry of the seq's live identity, if it has one.
    pub identity_expires_at: Option<u64>,
    pub seqbucket_max_seq: u64,
    /// The first and last day of the active day set, if any.
    pub active_days: Option<(u64, u64)>,
    pub now: u64,
}

/// What an append does (SPEC 4.2 steps 7 and 8), when it is not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppendStep {
    /// `seq < user_trim_seq`: `Trimmed`, nothing written but promote's changes.
    Trimmed,
    /// A live identity with the same expiry: `Unchanged` if the stored group is identical,
    /// otherwise the whole group is replaced (`Replaced`).
    SameDayReplay,
    /// No identity and the input's day has expired: only the gap boundary moves.
    ExpiredMerge,
    /// A new seq on a live day: events, identity, day, proofs, `seqbucket_max_seq`.
    Insert,
}

/// SPEC 4.2 steps 7 and 8. Errors: `Conflict(CrossDay)` for a live identity of another day (also
/// for expired input), `Corrupt(IdentityMissing)` for a live-day seq at or below
/// `seqbucket_max_seq` without identity, `Rejected(SpanExceeded)` when the day would stretch the
/// active days beyond `max_active_span_days`.
#[inline]
pub(crate) fn append_step(
    policy: &RetentionPolicy,
    facts: &AppendFacts,
) -> Result<AppendStep, StoreError> {
    let AppendFacts {
        seq,
        day,
        trim,
        identity_expires_at,
        seqbucket_max_seq,
        active_days,
        now,
    } = *facts;
    if seq < trim {
        return Ok(AppendStep::Trimmed);
    }
    let incoming_expires_at = policy.expires_at(day);
    if let Some(existing) = identity_expires_at {
        if existing != incoming_expires_at {
            return Err(StoreError::Conflict {
                kind: ConflictKind::CrossDay {
                    existing_day: policy.day_of_expiry(existing),
                    incoming_day: day,
                },
            });
        }
        return Ok(AppendStep::SameDayReplay);
    }
    if incoming_expires_at <= now {
        return Ok(AppendStep::ExpiredMerge);
    }
    if seq <= seqbucket_max_seq {
        return Err(StoreError::corrupt(CorruptKind::IdentityMissing {
            seq,
            seqbucket_max_seq,
        }));
    }
    let (low, high) = active_days.map_or((day, day), |(min, max)| (min.min(day), max.max(day)));
    if high - low > u64::from(policy.max_active_span_days) {
        return Err(span_exceeded(policy, day, low, high));
    }
    Ok(AppendStep::Insert)
}

/// How close to its day's expiry a missing stored group is not taken as damage: a store whose
/// rows expire by the server's clock (Scylla's TTL) while the caller decides with its own may
/// see the rows of a day gone a little before the identity, by the clocks' skew.
pub(crate) const STORED_GROUP_GRACE_SECS: u64 = 300;

/// SPEC 4.2 step 8 (amended): a live identity with the same `expires_at(day)` whose stored group
/// is missing — its events gone from a live day (an evicted or deleted key, lost rows, a partial
/// restore) — is `Corrupt(BadProof)`, never `Replaced` over the damage. `present`: whether the
/// store found the group's events.
#[inline]
pub(crate) fn check_stored_group(
    present: bool,
    seq: u64,
    day: u64,
    expires_at: u64,
    now: u64,
) -> Result<(), StoreError> {
    if present || expires_at <= now.saturating_add(STORED_GROUP_GRACE_SECS) {
        return Ok(());
    }
    Err(StoreError::corrupt(CorruptKind::BadProof {
        detail: format!(
            "day {day}: the events of seq {seq} are missing although its identity is live (deleted, lost or not restored)"
        ),
    }))
}

/// Zombie fencing (SPEC 7.2, "Zombies are fenced, and only zombies"): a same-day replace of a
/// seq with different content is **superseded** when that seq's stored version was written from
/// the same log and partition at a higher offset. Writes to one mailbox reach the store in
/// source order (lanes), and a new owner reads a partition from its committed offset, which
/// never passes a record that is not final; so such a write comes from a replica whose
/// assignment moved (frozen, cut off from Kafka, or a call that landed after its revoke) or
/// from a replay of the past, and the seq already holds what the log says after it.
///
/// Nothing else is fenced: a write of another seq (positions are kept per seq), a write from
/// another log (a new or recreated topic, a mirror: its offsets cannot be ordered against the
/// old log's, and the operator who cut over meant the new one), from another partition, or
/// without a position (`apply`) applies as SPEC 4 says.
#[inline]
pub(crate) fn superseded(held: Option<&SourcePosition>, incoming: Option<&SourcePosition>) -> bool {
    matches!((held, incoming), (Some(h), Some(i))
        if h.log == i.log && h.partition == i.partition && i.offset < h.offset)
}

/// The answer to a same-day write identical to the stored version (SPEC 4.2 step 8):
/// `unchanged`, unless the stored version was written by an earlier attempt of this very
/// delivery (the same [`WriteToken`](super::WriteToken)), whose answer was lost on the way (a
/// failover, a client time-out, a Paxos round with an unknown outcome): then what that attempt
/// answered, `inserted` or `replaced` (`model::written`). A token is new at each reading of a
/// record, so another replica, a re-read after a rebalance or a crash, and `replay` are
/// `unchanged`, as a replay of the log always is.
#[inline]
pub(crate) fn identical_answer(
    held: Option<super::WriteMark>,
    incoming: Option<super::WriteToken>,
) -> super::AppendOutcome {
    match (held, incoming) {
        (Some(held), Some(token)) if held.token == token => {
            if held.replaced {
                super::AppendOutcome::Replaced
            } else {
                super::AppendOutcome::Inserted
            }
        }
        _ => super::AppendOutcome::Unchanged,
    }
}

/// The one log line of a superseded write (SPEC 7.2), with both positions: what the write came
/// from and what wrote the stored version. Every backend calls it where it decided `superseded`.
pub(crate) fn note_superseded(group: &super::EventGroup, held: Option<&SourcePosition>) {
    tracing::info!(
        user = group.mailbox.user_id.as_str(),
        epoch = group.mailbox.epoch,
        seq = group.mailbox_seq,
        incoming = group.source.as_ref().map(SourcePosition::encode).unwrap_or_default(),
        held = held.map(SourcePosition::encode).unwrap_or_default(),
        "superseded: the seq holds a version written from a later offset of the same log and partition; this write changes nothing"
    );
}

/// SPEC 4.4 step 8: the `up_to` of a page. With more groups than the limit, the last group read;
/// otherwise everything up to `until_seq` (or up to `seqbucket_max_seq`, beyond which nothing was
/// ever accepted) is covered.
#[inline]
pub(crate) fn page_up_to(
    after_seq: u64,
    until_seq: Option<u64>,
    seqbucket_max_seq: u64,
    last_seq: Option<u64>,
    has_more: bool,
) -> u64 {
    if has_more {
        return last_seq.unwrap_or(after_seq);
    }
    let covered = until_seq.map_or(seqbucket_max_seq, |u| u.min(seqbucket_max_seq));
    covered.max(after_seq).max(last_seq.unwrap_or(0))
}

/// SPEC 4.4 step 7 on a mailbox whose meta was there before the read and is gone after it.
pub(crate) fn meta_vanished_during_scan() -> StoreError {
    StoreError::corrupt(CorruptKind::BadProof {
        detail: "meta disappeared between the scan's read and its check".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_older_offset_of_the_same_log_and_partition_is_superseded() {
        use crate::model::LogId;
        let at = |log: &str, partition: i32, offset: i64| {
            SourcePosition::new(LogId::topic_id(log).expect("log"), partition, offset)
        };
        let held = at("a", 0, 20);
        assert!(superseded(Some(&held), Some(&at("a", 0, 19))));
        assert!(superseded(Some(&held), Some(&at("a", 0, 0))));
        assert!(
            !superseded(Some(&held), Some(&at("a", 0, 20))),
            "the same record"
        );
        assert!(!superseded(Some(&held), Some(&at("a", 0, 21))));
        assert!(
            !superseded(Some(&held), Some(&at("a", 1, 0))),
            "another partition"
        );
        assert!(
            !superseded(Some(&held), Some(&at("b", 0, 0))),
            "another log"
        );
        assert!(!superseded(Some(&held), None), "apply");
        assert!(
            !superseded(None, Some(&at("a", 0, 0))),
            "a version without a position"
        );
    }

    fn facts(seq: u64, day: u64) -> AppendFacts {
        AppendFacts {
            seq,
            day,
            trim: 0,
            identity_expires_at: None,
            seqbucket_max_seq: 0,
            active_days: None,
            now: 100 * crate::model::DAY_SECS,
        }
    }

    #[test]
    fn append_steps_in_spec_order() {
        let p = RetentionPolicy::default();
        assert_eq!(append_step(&p, &facts(5, 100)), Ok(AppendStep::Insert));
        let trimmed = AppendFacts {
            trim: 6,
            ..facts(5, 100)
        };
        assert_eq!(append_step(&p, &trimmed), Ok(AppendStep::Trimmed));
        let replay = AppendFacts {
            identity_expires_at: Some(p.expires_at(100)),
            ..facts(5, 100)
        };
        assert_eq!(append_step(&p, &replay), Ok(AppendStep::SameDayReplay));
        let cross = AppendFacts {
            identity_expires_at: Some(p.expires_at(99)),
            ..facts(5, 50)
        };
        assert_eq!(
            append_step(&p, &cross),
            Err(StoreError::Conflict {
                kind: ConflictKind::CrossDay {
                    existing_day: 99,
                    incoming_day: 50
                }
            })
        );
        assert_eq!(append_step(&p, &facts(5, 50)), Ok(AppendStep::ExpiredMerge));
        let missing = AppendFacts {
            seqbucket_max_seq: 5,
            ..facts(5, 100)
        };
        assert!(matches!(
            append_step(&p, &missing),
            Err(StoreError::Corrupt {
                kind: CorruptKind::IdentityMissing { .. }
            })
        ));
        let wide = AppendFacts {
            active_days: Some((90, 100)),
            ..facts(5, 121)
        };
        assert!(matches!(
            append_step(&p, &wide),
            Err(StoreError::Rejected {
                kind: RejectKind::SpanExceeded,
                ..
            })
        ));
    }

    #[test]
    fn promote_plan_validates_before_anything_changes() {
        let now = 1_000;
        let plan = plan_promote(
            [(1, 900), (2, 950), (3, 2_000)],
            |day| Proof {
                max_seq: Some(day * 10),
                expires_at: Some(if day == 3 {
                    2_000
                } else {
                    900 + (day - 1) * 50
                }),
            },
            5,
            15,
            now,
        )
        .unwrap();
        assert_eq!(plan.expired_days, vec![1, 2]);
        assert_eq!(plan.new_boundary, 20, "day 1 lies wholly below the trim");
        let bad = plan_promote([(1, 900)], |_| Proof::default(), 0, 0, now);
        assert!(matches!(
            bad,
            Err(StoreError::Corrupt {
                kind: CorruptKind::BadProof { .. }
            })
        ));
    }

    #[test]
    fn cursor_and_integrity_verdicts() {
        assert!(check_cursor(3, 5, 0).is_err());
        assert_eq!(check_cursor(4, 5, 0), Ok(()));
        assert!(check_cursor(4, 5, 7).is_err());
        assert_eq!(check_integrity(true, true, true), Ok(()));
        assert_eq!(check_integrity(true, false, false), Ok(()));
        assert!(check_integrity(true, true, false).is_err());
        assert!(check_integrity(false, false, true).is_err());
        assert_eq!(check_format(None), Ok(()));
        assert_eq!(check_format(Some(4)), Ok(()));
        assert!(check_format(Some(3)).is_err());
        assert_eq!(page_up_to(0, None, 9, Some(3), false), 9);
        assert_eq!(page_up_to(0, Some(5), 9, Some(3), false), 5);
        assert_eq!(page_up_to(0, Some(5), 9, Some(3), true), 3);
    }
}
