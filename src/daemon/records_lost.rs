//! Records the log deleted before this group read them (SPEC 7.3): retention or `DeleteRecords`
//! overtook a stopped or lagging deployment, and librdkafka reset the consumer's position to the
//! log's start with at most a WARN line. The poll thread keeps, per assigned partition, the
//! offset its next record must be at ([`Continuity`]): the committed offset at assignment, then
//! one past each record handed over (or the position the consumer reported). A record or a
//! position beyond it is a gap, and most gaps are harmless (transaction markers, aborted
//! transactions); a gap is a loss only where the log's start is now past the offset expected:
//! those offsets were deleted unread. The log start comes from the fetch that brought the record
//! (librdkafka caches it per partition), or from the broker when none is cached.
//!
//! What it cannot see: records deleted while a replica that owned the partition was between
//! its last commit and a crash are re-read by the next owner from the committed offset, so they
//! are lost only if the log start passed that offset, which is seen; a loss is counted in
//! offsets, so transaction markers inside the deleted range count too.

use std::collections::HashMap;

/// Why the log start passed the expected offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// Found at assignment: the group's committed offset is below the log's start (the
    /// deployment was stopped, or lagged, past retention).
    CommittedBelowLogStart,
    /// Found while consuming: the position was reset past records never read.
    OffsetOutOfRange,
}

impl LossReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::CommittedBelowLogStart => "committed_below_log_start",
            Self::OffsetOutOfRange => "offset_out_of_range",
        }
    }
}

/// Offsets `from..to` of `partition` were deleted before this group read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
    pub reason: LossReason,
}

/// Where each assigned partition's next record must be. Bound: one entry per assigned
/// partition.
#[derive(Debug, Default)]
pub(crate) struct Continuity {
    next: HashMap<i32, (i64, bool)>,
}

impl Continuity {
    /// The partition was assigned with `committed` as the group's offset (`None`: no offset
    /// committed yet, so nothing was read that a gap could follow).
    pub(crate) fn assigned(&mut self, partition: i32, committed: Option<i64>) {
        match committed {
            Some(offset) => {
                self.next.insert(partition, (offset, true));
            }
            None => {
                self.next.remove(&partition);
            }
        }
    }

    /// The partition is read again from `offset` (a re-read's seek).
    pub(crate) fn reread(&mut self, partition: i32, offset: i64) {
        self.next.insert(partition, (offset, false));
    }

    pub(crate) fn forget(&mut self, partitions: &[i32]) {
        for partition in partitions {
            self.next.remove(partition);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.next.clear();
    }

    /// The consumer reached `at` on `partition` (a record at `at`, or a position `at`);
    /// `log_start` answers the log's start when asked (only on a gap). Answers the loss, if
    /// the offsets skipped were deleted unread. The next offset expected moves to `next`.
    pub(crate) fn reached(
        &mut self,
        partition: i32,
        at: i64,
        next: i64,
        log_start: impl FnOnce() -> Option<i64>,
    ) -> Option<Loss> {
        let Some((expected, at_assignment)) = self.next.get(&partition).copied() else {
            self.next.insert(partition, (next, false));
            return None;
        };
        if at <= expected {
            if next > expected {
                self.next.insert(partition, (next, false));
            }
            return None;
        }
        self.next.insert(partition, (next, false));
        let start = log_start()?;
        (start > expected).then(|| Loss {
            partition,
            from: expected,
            to: start.min(at),
            reason: if at_assignment {
                LossReason::CommittedBelowLogStart
            } else {
                LossReason::OffsetOutOfRange
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_a_loss_only_where_the_log_start_passed_the_offset_expected() {
        let mut c = Continuity::default();
        c.assigned(0, Some(5));
        assert_eq!(c.reached(0, 5, 6, || panic!("no gap, no question")), None);
        // A transaction marker at 6: the log start is far behind.
        assert_eq!(c.reached(0, 7, 8, || Some(0)), None);
        // Retention deleted 8..12 while the consumer lagged.
        assert_eq!(
            c.reached(0, 12, 13, || Some(12)),
            Some(Loss {
                partition: 0,
                from: 8,
                to: 12,
                reason: LossReason::OffsetOutOfRange
            })
        );
        // A position that moved past deleted records with no record after them.
        assert_eq!(
            c.reached(0, 20, 20, || Some(20)).map(|l| (l.from, l.to)),
            Some((13, 20))
        );
        // The log start unknown: nothing can be said (and nothing is invented).
        assert_eq!(c.reached(0, 30, 31, || None), None);
        assert_eq!(c.reached(0, 31, 32, || panic!("contiguous")), None);
    }

    #[test]
    fn a_committed_offset_below_the_log_start_is_found_at_the_first_record() {
        let mut c = Continuity::default();
        c.assigned(3, Some(5));
        assert_eq!(
            c.reached(3, 8, 9, || Some(8)),
            Some(Loss {
                partition: 3,
                from: 5,
                to: 8,
                reason: LossReason::CommittedBelowLogStart
            })
        );
        // A new group (no committed offset) lost nothing it ever read.
        c.assigned(4, None);
        assert_eq!(c.reached(4, 100, 101, || Some(100)), None);
        assert_eq!(c.reached(4, 101, 102, || panic!("contiguous")), None);
        // A re-read moves the expectation back without a loss.
        c.reread(3, 0);
        assert_eq!(c.reached(3, 0, 1, || panic!("contiguous")), None);
        c.forget(&[3]);
        assert_eq!(
            c.reached(3, 50, 51, || Some(50)),
            None,
            "forgotten: new start"
        );
    }
}
