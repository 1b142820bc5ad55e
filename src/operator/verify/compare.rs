//! One mailbox, as the range says it should be and as the store holds it: which seqs differ,
//! and which the range cannot decide.
//!
//! What the range can know (docs/decisions.md, "Scrub"):
//! - a seq whose stored version was written **after the range end** (its source position, same
//!   log and partition, at or past the end) is the running daemon's newer write: not a
//!   difference;
//! - a seq written **before the range start** is history the range never read: not compared,
//!   and `unknown` only where the range touches it (the range delivers the seq, or a version from
//!   another day the range cannot see conflicting);
//! - a seq without a position (`apply`, a letter without its source headers) or from another
//!   log (before a cut-over) cannot be placed: `unknown` inside the range's seq span;
//! - a seq the store trimmed without a truncate in the range was trimmed by one outside it:
//!   `unknown`;
//! - a group whose day expires within [`CLOCK_MARGIN_SECS`] of now is `unknown`: the reference
//!   and the store need not agree to the second on the clock.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{LogId, RetentionPolicy, ScannedGroup, SourcePosition, DAY_MS};

/// How far apart the reference's clock and the store's may be: a group expiring this close to
/// now is not compared.
pub(crate) const CLOCK_MARGIN_SECS: u64 = 120;

/// The range verified: its log, partition and offsets `from..end`.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub(crate) log: LogId,
    pub(crate) partition: i32,
    pub(crate) from: i64,
    pub(crate) end: i64,
}

/// Where a stored version was written from, relative to the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Before,
    Inside,
    After,
    /// Another log or partition, or no position at all.
    Unplaced,
}

impl Bounds {
    fn place(&self, position: Option<&SourcePosition>) -> Place {
        match position {
            Some(at) if at.log == self.log && at.partition == self.partition => {
                if at.offset < self.from {
                    Place::Before
                } else if at.offset < self.end {
                    Place::Inside
                } else {
                    Place::After
                }
            }
            _ => Place::Unplaced,
        }
    }
}

/// What the range says of one mailbox: the reference's groups after the whole range, and the
/// seqs the range delivered (each with the offset of its last delivery).
#[derive(Debug, Default, Clone)]
pub(crate) struct Expected {
    pub(crate) groups: BTreeMap<u64, ScannedGroup>,
    pub(crate) delivered: BTreeMap<u64, i64>,
    /// A `truncate_before` of this mailbox is in the range.
    pub(crate) truncated: bool,
    /// Seqs the reference could not apply for lack of the history before the range (it found
    /// them below its newest seq without an identity: SPEC 4.2 step 8's corrupt verdict).
    pub(crate) undecidable: std::collections::BTreeSet<u64>,
}

/// What the store holds of the mailbox.
#[derive(Debug, Default, Clone)]
pub(crate) struct Held {
    pub(crate) groups: BTreeMap<u64, ScannedGroup>,
    /// One entry per live identity.
    pub(crate) positions: BTreeMap<u64, Option<SourcePosition>>,
    pub(crate) user_trim_seq: u64,
    /// Each active day's proof: the largest seq the meta says it holds.
    pub(crate) proofs: BTreeMap<u64, u64>,
    /// The meta's newest seq (`seqbucket_max_seq`).
    pub(crate) newest_seq: u64,
}

/// The seqs of one mailbox that are not a match.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// In the range's result, not in the store.
    pub missing: Vec<u64>,
    /// In both, with other content (events or `created_at`).
    pub other_content: Vec<u64>,
    /// In the store, written from inside the range, not in the range's result.
    pub extra: Vec<u64>,
    /// The store's metadata disagrees with its own events, whatever the range says: an event
    /// without its identity, a day whose proof is below the seqs it holds. Reads may still
    /// answer; the next write to the mailbox fails closed.
    pub metadata: Vec<String>,
    /// What the range cannot decide, and why.
    pub unknown: Vec<Unknown>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unknown {
    pub seq: u64,
    pub why: &'static str,
}

impl Findings {
    pub fn differs(&self) -> bool {
        !(self.missing.is_empty()
            && self.other_content.is_empty()
            && self.extra.is_empty()
            && self.metadata.is_empty())
    }

    fn unknown(&mut self, seq: u64, why: &'static str) {
        self.unknown.push(Unknown { seq, why });
    }
}

/// Compares one mailbox at `now_secs`.
pub(crate) fn compare(
    expected: &Expected,
    held: &Held,
    bounds: &Bounds,
    policy: &RetentionPolicy,
    now_secs: u64,
) -> Findings {
    let mut findings = Findings::default();
    let near_expiry = |group: &ScannedGroup| {
        policy
            .expires_at(group.created_at / DAY_MS)
            .abs_diff(now_secs)
            < CLOCK_MARGIN_SECS
    };
    let place = |seq: u64| bounds.place(held.positions.get(&seq).and_then(Option::as_ref));
    for seq in &expected.undecidable {
        findings.unknown(
            *seq,
            "the range starts inside this mailbox's history: the reference cannot apply it without what came before",
        );
    }
    for (seq, want) in &expected.groups {
        if expected.undecidable.contains(seq) {
            continue;
        }
        let have = held.groups.get(seq);
        if have.is_some_and(|have| same(have, want)) {
            continue;
        }
        let at = place(*seq);
        if at == Place::After {
            continue;
        }
        if near_expiry(want) {
            findings.unknown(*seq, "its day expires within the clock margin");
            continue;
        }
        match have {
            None if held.user_trim_seq > *seq && !expected.truncated => {
                findings.unknown(*seq, "trimmed by a truncate outside the range")
            }
            None => findings.missing.push(*seq),
            Some(have)
                if have.created_at / DAY_MS != want.created_at / DAY_MS && at != Place::Inside =>
            {
                findings.unknown(
                    *seq,
                    "stored from another day outside the range (a conflict the range cannot see)",
                )
            }
            Some(_) => findings.other_content.push(*seq),
        }
    }
    let first = expected.delivered.keys().next().copied();
    let last = expected.delivered.keys().next_back().copied();
    for (seq, have) in &held.groups {
        if expected.groups.contains_key(seq) || expected.undecidable.contains(seq) {
            continue;
        }
        let in_span = first.is_some_and(|f| *seq >= f) && last.is_some_and(|l| *seq <= l);
        match place(*seq) {
            Place::After => {}
            Place::Inside if near_expiry(have) => {
                findings.unknown(*seq, "its day expires within the clock margin")
            }
            Place::Inside => findings.extra.push(*seq),
            Place::Before if expected.delivered.contains_key(seq) => findings.unknown(
                *seq,
                "stored from before the range, which the range delivers again without keeping it",
            ),
            Place::Before => {}
            Place::Unplaced if in_span => findings.unknown(
                *seq,
                "stored without a position or from another log: the range cannot place it",
            ),
            Place::Unplaced => {}
        }
    }
    findings.metadata = self_consistency(held);
    findings
}

/// What the store's metadata says against its own events (history-independent).
fn self_consistency(held: &Held) -> Vec<String> {
    let mut out = Vec::new();
    for seq in held.groups.keys() {
        if !held.positions.contains_key(seq) {
            out.push(format!("seq {seq}: events without an identity"));
        }
    }
    if let Some(newest) = held.positions.keys().next_back() {
        if *newest > held.newest_seq {
            out.push(format!(
                "the meta's newest seq is {}, below the identity of seq {newest}",
                held.newest_seq
            ));
        }
    }
    let mut newest_by_day: BTreeMap<u64, u64> = BTreeMap::new();
    for (seq, group) in &held.groups {
        let newest = newest_by_day.entry(group.created_at / DAY_MS).or_default();
        *newest = (*newest).max(*seq);
    }
    for (day, newest) in newest_by_day {
        match held.proofs.get(&day) {
            Some(proof) if *proof < newest => out.push(format!(
                "day {day}: the proof says up to seq {proof}, the day holds seq {newest}"
            )),
            None => out.push(format!("day {day}: events without a proof")),
            Some(_) => {}
        }
    }
    out
}

/// Same content: the day-exact `created_at` and every event.
fn same(a: &ScannedGroup, b: &ScannedGroup) -> bool {
    a.created_at == b.created_at && a.events == b.events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, Payload};
    use std::sync::Arc;

    const NOW: u64 = 1_805_112_000;
    const TODAY_MS: u64 = NOW / 86_400 * DAY_MS + 3_600_000;

    fn bounds() -> Bounds {
        Bounds {
            log: LogId::topic_id("log-a").expect("log"),
            partition: 0,
            from: 100,
            end: 200,
        }
    }

    fn group(seq: u64, created_at: u64, text: &str) -> ScannedGroup {
        ScannedGroup {
            mailbox_seq: seq,
            created_at,
            events: Arc::from(vec![Event {
                event_ordinal: 0,
                payload: Payload::from_value(&serde_json::json!({ "t": text })),
            }]),
        }
    }

    fn at(offset: i64) -> Option<SourcePosition> {
        Some(SourcePosition::new(
            LogId::topic_id("log-a").expect("log"),
            0,
            offset,
        ))
    }

    fn case(
        expected: &[(u64, &str, i64)],
        held: &[(u64, u64, &str, Option<SourcePosition>)],
    ) -> Findings {
        let mut e = Expected::default();
        for (seq, text, offset) in expected {
            e.groups.insert(*seq, group(*seq, TODAY_MS, text));
            e.delivered.insert(*seq, *offset);
        }
        let mut h = Held::default();
        for (seq, created_at, text, position) in held {
            h.groups.insert(*seq, group(*seq, *created_at, text));
            h.positions.insert(*seq, position.clone());
            let proof = h.proofs.entry(created_at / DAY_MS).or_default();
            *proof = (*proof).max(*seq);
            h.newest_seq = h.newest_seq.max(*seq);
        }
        compare(&e, &h, &bounds(), &RetentionPolicy::default(), NOW)
    }

    #[test]
    fn equal_content_matches_and_history_outside_the_range_is_not_compared() {
        let f = case(
            &[(5, "a", 150)],
            &[
                (3, TODAY_MS, "old", at(50)),
                (5, TODAY_MS, "a", at(150)),
                (9, TODAY_MS, "new", at(250)),
            ],
        );
        assert_eq!(f, Findings::default());
    }

    #[test]
    fn missing_other_content_and_extra_differ() {
        let f = case(
            &[(5, "a", 150), (6, "b", 160)],
            &[
                (6, TODAY_MS, "changed", at(160)),
                (7, TODAY_MS, "x", at(170)),
            ],
        );
        assert_eq!(f.missing, vec![5]);
        assert_eq!(f.other_content, vec![6]);
        assert_eq!(f.extra, vec![7]);
        assert!(f.differs());
    }

    #[test]
    fn a_newer_write_after_the_end_is_not_a_difference() {
        let f = case(&[(5, "a", 150)], &[(5, TODAY_MS, "rewritten", at(230))]);
        assert_eq!(f, Findings::default());
    }

    #[test]
    fn what_the_range_cannot_place_is_unknown_never_a_difference() {
        let yesterday = TODAY_MS - DAY_MS;
        let f = case(
            &[(5, "a", 150), (8, "c", 180)],
            &[
                (5, yesterday, "conflict", at(40)),
                (6, TODAY_MS, "applied", None),
                (8, TODAY_MS, "c", at(180)),
            ],
        );
        assert!(!f.differs(), "{f:?}");
        assert_eq!(
            f.unknown.iter().map(|u| u.seq).collect::<Vec<_>>(),
            vec![5, 6]
        );
    }

    #[test]
    fn metadata_that_disagrees_with_the_events_differs_whatever_the_range() {
        let mut h = Held::default();
        for seq in [3, 4] {
            h.groups.insert(seq, group(seq, TODAY_MS, "a"));
        }
        h.positions.insert(4, at(150));
        h.proofs.insert(TODAY_MS / DAY_MS, 3);
        h.newest_seq = 4;
        let f = compare(
            &Expected::default(),
            &h,
            &bounds(),
            &RetentionPolicy::default(),
            NOW,
        );
        assert_eq!(f.metadata.len(), 2, "{f:?}");
        assert!(f.metadata[0].starts_with("seq 3: events without an identity"));
        assert!(f.metadata[1].contains("the proof says up to seq 3"));
        assert!(f.differs());
    }
}
