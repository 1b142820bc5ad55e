//! More partitions keep each user's order (SPEC 7.2): the records of a partition that appeared
//! with a growth of the dispatch topic wait until every older partition has been consumed past
//! the records written before them.
//!
//! Growing the topic moves keys: a keyed producer sends a user's next records to a new
//! partition while the user's older records may still wait, unread, on the old one. Positions of
//! two partitions are never compared (SPEC 7.2), so only the order in which the partitions are
//! consumed keeps the older record from being applied last.
//!
//! **Which partitions wait.** Every partition the group has no committed offset for, except
//! partition 0: a partition new to the group (the topic grew, or this is the group's first run)
//! waits for every partition with a lower number (partitions are only ever added at the end, so
//! the older partitions are the lower ones). Nothing is stored beyond the group's committed
//! offsets, the fleet's shared truth: a growth found at start, one seen while running and a
//! group's first run over a grown topic are handled alike, and a replica that owns only the new
//! partition waits for partitions other replicas own. A partition with a commit waited when it
//! was new, and never waits again.
//!
//! **How far.** When the waiting partition's first record is polled, each older partition's
//! offset for that record's timestamp is read (ListOffsets by time: the first offset at or after
//! it; the end offset when there is none): the records written to the older partitions before
//! that first record are below it. Each is capped by the older partition's end offset
//! `kafka.growth_allowance_ms` after the waiting partition was assigned: the topic had the
//! partition then and its producers had had the allowance to learn of it, so what was written to
//! the older ones after that is not from before a growth (a partition that stayed empty while a
//! running group consumed the others does not wait for them). The partition flows once each older partition's committed
//! offset reaches it, and only the committed offset counts: records between a partition's
//! committed offset and how far its owner read are read and applied again by the partition's
//! next owner (a rebalance, a restart), and applied after the new partition's records they would
//! revert them. So a mailbox failing closed on an older partition, which holds that partition's
//! committed offset at its record, holds the new partitions too until it is repaired: the wait
//! is named (`/readyz`, the gauge), beside the blocked mailbox's own alert. On a group's first
//! run over a topic whose partitions all existed from the start, the older partitions' records
//! before a partition's first record are few, and the wait is about one commit interval; after a
//! growth, it is the older partitions' backlog at the growth, which is the point.
//!
//! **The producers' allowance.** A producer that keeps the old partition count until its
//! metadata refreshes writes a user's records to the old partition until then and to the new
//! one after. Every old-partition record it wrote carries a timestamp no later than its first
//! new-partition record, so the offsets at that timestamp cover them; the cap above bounds how
//! long after the group saw the partition such records are still waited for:
//! `kafka.growth_allowance_ms`, 0 by default (the moment the group saw it, when the common
//! deployments, one producer path that learns of the partitions as the group does, are exact),
//! raised to the producers' metadata age (300 s by default in librdkafka and Java) where many
//! producers lag. With `message.timestamp.type = LogAppendTime` the timestamps are the broker's;
//! with `CreateTime` (the default) they are the producers' clocks.
//!
//! **What it cannot see.** Two producers writing the same user at once (one still on the old
//! partition count, one on the new) have no order the log could keep, and producers' clocks that
//! disagree by more than the gap between two records of one user can order them wrongly under
//! `CreateTime`. Records a producer wrote to an old partition *after* its first record to the new
//! one (it went back to the old count) apply in whatever order the partitions are read. The
//! memory store commits nothing, so every start is a group's first run (the wait is short).
//!
//! Bound: one [`Gate`] per assigned partition, each naming at most every partition of the topic.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How often a waiting partition's older partitions' progress is read from the group.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// One partition that waits for older ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gate {
    /// The older partitions it waits for.
    pub older: Vec<i32>,
    /// Their end offsets `kafka.growth_allowance_ms` after this partition was assigned: the
    /// topic had this partition then, and every producer had had time to learn of it, so records
    /// written to the older ones after that are not older than a growth. `None` until read.
    pub seen: Option<BTreeMap<i32, i64>>,
    /// When `seen` is to be read.
    pub seen_at: Instant,
    /// What the older partitions must be committed past: their offsets at this partition's
    /// first record's timestamp, each capped by `seen`; `None` until that record is polled.
    pub ends: Option<BTreeMap<i32, i64>>,
    /// When the wait began (the first record polled).
    pub since: Option<Instant>,
    /// When the older partitions' progress was last read.
    pub checked: Option<Instant>,
    /// The wait was named (log, gauge, `/readyz`): a first check that finds the older partitions
    /// already there lets the partition flow without a word.
    pub announced: bool,
}

/// The waiting partitions of this replica.
#[derive(Debug, Default)]
pub(crate) struct Gates {
    gates: BTreeMap<i32, Gate>,
}

impl Gates {
    /// Partitions were assigned, with the group's committed offset of each (or none). Answers
    /// the assigned partitions that wait, with the older ones each waits for; `allowance` is
    /// `kafka.growth_allowance_ms` (see [`Gate::seen`]).
    pub(crate) fn assigned(
        &mut self,
        assigned: &[(i32, Option<i64>)],
        allowance: Duration,
    ) -> Vec<(i32, Vec<i32>)> {
        let seen_at = Instant::now() + allowance;
        let mut waiting = Vec::new();
        for &(partition, committed) in assigned {
            if committed.is_some() || partition <= 0 {
                continue;
            }
            let older: Vec<i32> = (0..partition).collect();
            self.gates.insert(
                partition,
                Gate {
                    older: older.clone(),
                    seen: None,
                    seen_at,
                    ends: None,
                    since: None,
                    checked: None,
                    announced: false,
                },
            );
            waiting.push((partition, older));
        }
        waiting
    }

    /// Whether `partition`'s records wait.
    pub(crate) fn waits(&self, partition: i32) -> bool {
        self.gates.contains_key(&partition)
    }

    pub(crate) fn gate(&self, partition: i32) -> Option<&Gate> {
        self.gates.get(&partition)
    }

    /// The partitions whose [`Gate::seen`] is due to be read, with their older partitions.
    pub(crate) fn seen_due(&self) -> Vec<(i32, Vec<i32>)> {
        let now = Instant::now();
        self.gates
            .iter()
            .filter(|(_, gate)| gate.seen.is_none() && gate.seen_at <= now)
            .map(|(partition, gate)| (*partition, gate.older.clone()))
            .collect()
    }

    /// The older partitions' end offsets, read once the allowance after `partition`'s
    /// assignment passed (see [`Gate::seen`]): a wait already begun is capped by them.
    pub(crate) fn seen(&mut self, partition: i32, seen: BTreeMap<i32, i64>) {
        if let Some(gate) = self.gates.get_mut(&partition) {
            if let Some(ends) = &mut gate.ends {
                cap(ends, &seen);
            }
            gate.seen = Some(seen);
        }
    }

    /// The first record of `partition` was polled and the older partitions' offsets at its
    /// timestamp read: the wait begins, for those offsets capped by what was seen at the
    /// assignment. A wait already begun keeps its ends.
    pub(crate) fn begin(&mut self, partition: i32, mut ends: BTreeMap<i32, i64>) -> bool {
        match self.gates.get_mut(&partition) {
            Some(gate) if gate.ends.is_none() => {
                if let Some(seen) = &gate.seen {
                    cap(&mut ends, seen);
                }
                gate.ends = Some(ends);
                gate.since = Some(Instant::now());
                true
            }
            _ => false,
        }
    }

    /// The waiting partitions whose older partitions' progress is due to be read.
    pub(crate) fn due(&mut self) -> Vec<(i32, BTreeMap<i32, i64>)> {
        let now = Instant::now();
        let mut due = Vec::new();
        for (partition, gate) in &mut self.gates {
            let Some(ends) = &gate.ends else { continue };
            if gate.checked.is_some_and(|at| now - at < CHECK_EVERY) {
                continue;
            }
            gate.checked = Some(now);
            due.push((*partition, ends.clone()));
        }
        due
    }

    /// True the first time a wait of `partition` is found short: the wait is named then.
    pub(crate) fn announce(&mut self, partition: i32) -> bool {
        match self.gates.get_mut(&partition) {
            Some(gate) if !gate.announced => {
                gate.announced = true;
                true
            }
            _ => false,
        }
    }

    /// Ends the wait of `partition`: how long it waited, and whether the wait was named.
    pub(crate) fn release(&mut self, partition: i32) -> Option<(Duration, bool)> {
        self.gates.remove(&partition).map(|gate| {
            (
                gate.since.map_or(Duration::ZERO, |at| at.elapsed()),
                gate.announced,
            )
        })
    }

    pub(crate) fn forget(&mut self, partitions: &[i32]) {
        for partition in partitions {
            self.gates.remove(partition);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.gates.clear();
    }
}

/// Caps each older partition's offset to wait for by what was seen (see [`Gate::seen`]).
fn cap(ends: &mut BTreeMap<i32, i64>, seen: &BTreeMap<i32, i64>) {
    for (q, end) in ends.iter_mut() {
        if let Some(seen) = seen.get(q) {
            *end = (*end).min(*seen);
        }
    }
}

/// The older partitions still short of their ends, given each one's committed offset:
/// `(partition, committed, end)`. Empty: the waiting partition flows. An older partition without progress counts as at
/// 0 (an empty partition's end is its start).
pub(crate) fn short_of(
    ends: &BTreeMap<i32, i64>,
    progress: &BTreeMap<i32, i64>,
) -> Vec<(i32, i64, i64)> {
    ends.iter()
        .filter_map(|(p, end)| {
            let at = progress.get(p).copied().unwrap_or(0);
            (at < *end).then_some((*p, at, *end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_new_to_the_group_waits_for_every_older_one() {
        let mut gates = Gates::default();
        let waiting = gates.assigned(&[(0, Some(150_000)), (1, None)], Duration::ZERO);
        assert_eq!(waiting, vec![(1, vec![0])]);
        assert!(!gates.waits(0));
        assert!(gates.waits(1));
    }

    #[test]
    fn partition_0_and_partitions_with_a_commit_never_wait() {
        let mut gates = Gates::default();
        assert!(gates
            .assigned(&[(0, None), (2, Some(7))], Duration::ZERO)
            .is_empty());
    }

    #[test]
    fn a_growth_from_4_to_8_makes_each_new_partition_wait_for_the_lower_ones() {
        let mut gates = Gates::default();
        let assigned: Vec<(i32, Option<i64>)> = [1, 5, 7]
            .into_iter()
            .map(|p| (p, if p < 4 { Some(10) } else { None }))
            .collect();
        let waiting = gates.assigned(&assigned, Duration::ZERO);
        assert_eq!(
            waiting,
            vec![(5, vec![0, 1, 2, 3, 4]), (7, vec![0, 1, 2, 3, 4, 5, 6])]
        );
    }

    #[test]
    fn under_an_allowance_the_cap_comes_later_and_caps_a_wait_already_begun() {
        let mut gates = Gates::default();
        gates.assigned(&[(1, None)], Duration::from_secs(300));
        assert!(
            gates.seen_due().is_empty(),
            "not before the allowance passed"
        );
        assert!(gates.begin(1, [(0, 90)].into_iter().collect()));
        gates.seen(1, [(0, 60)].into_iter().collect());
        assert_eq!(gates.due(), vec![(1, [(0, 60)].into_iter().collect())]);
    }

    #[test]
    fn the_wait_ends_when_every_older_partition_reached_its_end() {
        let ends: BTreeMap<i32, i64> = [(0, 100), (1, 50)].into_iter().collect();
        let mut progress: BTreeMap<i32, i64> = [(0, 99), (1, 50)].into_iter().collect();
        assert_eq!(short_of(&ends, &progress), vec![(0, 99, 100)]);
        progress.insert(0, 100);
        assert!(short_of(&ends, &progress).is_empty());
        // No progress known: counted from 0, so an empty partition (end 0) does not hold.
        let empty: BTreeMap<i32, i64> = [(2, 0)].into_iter().collect();
        assert!(short_of(&empty, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_wait_begins_once_and_keeps_its_first_ends() {
        let mut gates = Gates::default();
        gates.assigned(&[(1, None)], Duration::ZERO);
        assert!(gates.due().is_empty(), "no record yet: nothing to read");
        assert_eq!(gates.seen_due(), vec![(1, vec![0])]);
        gates.seen(1, [(0, 5)].into_iter().collect());
        assert!(gates.seen_due().is_empty());
        assert!(gates.begin(1, [(0, 7)].into_iter().collect()));
        assert!(!gates.begin(1, [(0, 9)].into_iter().collect()));
        let due = gates.due();
        assert_eq!(
            due,
            vec![(1, [(0, 5)].into_iter().collect())],
            "capped by the end seen at the assignment"
        );
        assert!(gates.due().is_empty(), "read again only after CHECK_EVERY");
        assert!(gates.announce(1));
        assert!(!gates.announce(1), "named once");
        assert_eq!(gates.release(1).map(|(_, named)| named), Some(true));
        assert!(!gates.waits(1));
    }
}
