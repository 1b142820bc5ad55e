//! What happens to a record: from a delivery's result to an action (SPEC 7). Errors are
//! classified once, by [`StoreError::class`]'s exhaustive match; this module maps each class to
//! what a front end does.
//!
//! Every front end — the daemon, `replay`, `apply`, the demo — asks this module what to do with a
//! delivery's result, so a record means the same thing whichever door it came through. Together
//! with `ingest::pipeline` (which turns per-delivery actions into per-record finality and the
//! committable offset) it answers "what happens to a replayed record?":
//!
//! | result of the store call                                        | disposition  | the record's offset                    |
//! |-----------------------------------------------------------------|--------------|----------------------------------------|
//! | `inserted` `unchanged` `replaced` `expired_merged` `trimmed` `stale_epoch` `truncated` | [`Advance`]   | may pass once every delivery is final |
//! | `rejected` (incl. `store_refused`), `conflict`, `epoch_mismatch`, `cursor_expired`, unsupported | [`DeadLetter`] | passes once the dead letter is acknowledged |
//! | a malformed record (no store call)                              | [`DeadLetter`] | passes once the dead letter is acknowledged |
//! | `corrupt`                                                       | [`Block`]     | never passes: retried with backoff until an operator repairs the mailbox; the user's later deliveries wait |
//! | `unavailable` (transient: unreachable, timeout, failover, too few replica acks) | [`Retry`]    | held; retried with backoff                |
//! | `under_repair` (the user is fenced by `replay --reset-mailboxes`) | [`Retry`]    | held; retried until the repair swaps    |
//! | `fence_lost` (only a repair's own staged write)                 | [`AbortRepair`] | — the repair stops without swapping   |
//!
//! A replayed record (the log read again, after a crash or by `replay`) meets a mailbox that may
//! already hold it: the store answers `unchanged` for identical content and the record advances;
//! `stale_epoch`/`trimmed`/`expired_merged` advance the same way. Nothing about a replay is special
//! here — idempotence is the store's contract (SPEC 4), and this table is why it is enough.
//!
//! [`Advance`]: Disposition::Advance
//! [`DeadLetter`]: Disposition::DeadLetter
//! [`Block`]: Disposition::Block
//! [`Retry`]: Disposition::Retry
//! [`AbortRepair`]: Disposition::AbortRepair

use crate::model::{DeliveryOutcome, ErrorClass, StoreError};

/// What a front end does with one delivery's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Final and written (or a no-op): count it; the delivery is done.
    Advance,
    /// Final and refused: the record goes to the dead-letter topic (the daemon) or is reported as
    /// refused (`apply`, `replay`); the delivery is done.
    DeadLetter,
    /// Not final: the mailbox fails closed. Retry with backoff until a repair heals it; its later
    /// deliveries wait behind it and the committed offset never passes it. Never skipped.
    Block,
    /// Not final: retry with backoff. `under_repair` tells a fence (expected, quiet) from an
    /// unreachable store (readiness turns false).
    Retry { under_repair: bool },
    /// A repair's staged write found its fence gone: the repair aborts without swapping.
    AbortRepair,
}

impl Disposition {
    /// The disposition of one delivery's result.
    pub(crate) fn of(result: &Result<DeliveryOutcome, StoreError>) -> Self {
        match result {
            // Every outcome is a write done or a no-op: final.
            Ok(_) => Self::Advance,
            Err(error) => Self::of_error(error),
        }
    }

    /// The disposition of a store error: its class ([`StoreError::class`]), decided once.
    pub(crate) fn of_error(error: &StoreError) -> Self {
        Self::of_class(error.class())
    }

    /// The disposition of an error class.
    pub(crate) fn of_class(class: ErrorClass) -> Self {
        match class {
            ErrorClass::Refused => Self::DeadLetter,
            ErrorClass::Corrupt => Self::Block,
            ErrorClass::Unavailable => Self::Retry {
                under_repair: false,
            },
            ErrorClass::UnderRepair => Self::Retry { under_repair: true },
            ErrorClass::FenceLost => Self::AbortRepair,
        }
    }

    /// The disposition of a record that does not decode: dead-lettered, as a refusal.
    pub(crate) fn of_malformed() -> Self {
        Self::DeadLetter
    }

    /// Whether the delivery has reached its final outcome.
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Self::Advance | Self::DeadLetter)
    }

    /// What the daemon does, in words (the demo's table, the docs).
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Advance => "final; the offset advances",
            Self::DeadLetter => "dead-letter topic; the offset advances once it is acknowledged",
            Self::Block => "mailbox fails closed, retried until repaired; the offset waits",
            Self::Retry {
                under_repair: false,
            } => "retried with backoff; the offset waits",
            Self::Retry { under_repair: true } => "waits for the repair to swap; the offset waits",
            Self::AbortRepair => "the repair aborts without swapping",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::error::{ConflictKind, CorruptKind, RejectKind};
    use crate::model::AppendOutcome;

    #[test]
    fn the_table() {
        let ok = |o| Ok(DeliveryOutcome::Append(o));
        for outcome in AppendOutcome::ALL {
            assert_eq!(Disposition::of(&ok(outcome)), Disposition::Advance);
        }
        let cases = [
            (
                StoreError::rejected(RejectKind::SpanExceeded, "x"),
                Disposition::DeadLetter,
            ),
            (
                StoreError::Conflict {
                    kind: ConflictKind::CrossDay {
                        existing_day: 1,
                        incoming_day: 2,
                    },
                },
                Disposition::DeadLetter,
            ),
            (
                StoreError::Refused {
                    backend: "redis",
                    detail: "x".into(),
                },
                Disposition::DeadLetter,
            ),
            (
                StoreError::corrupt(CorruptKind::IndexLost),
                Disposition::Block,
            ),
            (
                StoreError::Unavailable {
                    backend: "redis",
                    detail: "x".into(),
                },
                Disposition::Retry {
                    under_repair: false,
                },
            ),
            (
                StoreError::UnderRepair { holder: "h".into() },
                Disposition::Retry { under_repair: true },
            ),
            (
                StoreError::FenceLost { detail: "x".into() },
                Disposition::AbortRepair,
            ),
        ];
        for (error, expected) in &cases {
            assert_eq!(Disposition::of_error(error), *expected, "{error:?}");
        }
        // A run of deliveries stops where the error's class says (`StoreError::is_final`): the
        // same class this module reads.
        let more = [
            StoreError::EpochMismatch { current: Some(1) },
            StoreError::CursorExpired {
                cursor: crate::model::CursorExpired::Trimmed { resume_after: 1 },
            },
            StoreError::Unsupported {
                backend: "memory",
                operation: "x",
            },
        ];
        for error in cases.iter().map(|(e, _)| e).chain(&more) {
            assert_eq!(
                error.is_final(),
                Disposition::of_error(error).is_final(),
                "{error:?}"
            );
        }
        assert!(Disposition::Advance.is_final() && Disposition::DeadLetter.is_final());
        assert!(!Disposition::Block.is_final());
        assert_eq!(Disposition::of_malformed(), Disposition::DeadLetter);
    }
}
