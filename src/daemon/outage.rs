//! An outage told once per change: the state behind the log of a connection that breaks and
//! comes back (the brokers, `broker_link`; the store, `telemetry`). The first failure after a
//! working connection is said, the rest are counted; the first success after [`QUIET`] without
//! a failure is said with how long the outage took and how many failures were held back;
//! failures that go on for [`NEEDS_A_PERSON`] are said once more, for a person. Bound: one
//! `Link` per kind of connection, a few fields.

use std::time::{Duration, Instant};

/// How long a connection may stay broken before it is for a person.
pub(crate) const NEEDS_A_PERSON: Duration = Duration::from_secs(60);

/// How long without a failure before a success ends an outage: while one of several servers is
/// down (a Redis Cluster master, one broker), successes and failures alternate many times a
/// second, and each would otherwise be a change to tell.
pub(crate) const QUIET: Duration = Duration::from_secs(5);

/// What the log says about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Say {
    /// The connection broke after working.
    Lost,
    /// It has stayed broken for [`NEEDS_A_PERSON`].
    StillLost { down_for: Duration },
    /// It works again.
    Restored { down_for: Duration, held_back: u64 },
    /// Nothing above DEBUG.
    Nothing,
}

/// The state of the process's connection to the brokers, as the log tells it.
#[derive(Debug)]
pub(crate) struct Link {
    /// Since when failures have come with no working connection between them.
    down_since: Option<Instant>,
    /// The ERROR was said for this outage.
    escalated: bool,
    /// Failures logged at DEBUG in this outage.
    held_back: u64,
    /// The last failure of this outage.
    last_failure: Option<Instant>,
    /// How long without a failure before a success ends the outage ([`QUIET`] by default).
    quiet: Duration,
}

impl Default for Link {
    fn default() -> Self {
        Self::new()
    }
}

impl Link {
    pub(crate) const fn new() -> Self {
        Self::with_quiet(QUIET)
    }

    /// A link whose outage ends at the first success `quiet` after the last failure: zero where
    /// one server answers (the group coordinator), so its first success says the outage ended.
    pub(crate) const fn with_quiet(quiet: Duration) -> Self {
        Self {
            down_since: None,
            escalated: false,
            held_back: 0,
            last_failure: None,
            quiet,
        }
    }

    /// A transport failure of any client at `now`.
    pub(crate) fn failure(&mut self, now: Instant) -> Say {
        self.last_failure = Some(now);
        let Some(since) = self.down_since else {
            self.down_since = Some(now);
            self.escalated = false;
            self.held_back = 0;
            return Say::Lost;
        };
        let down_for = now.saturating_duration_since(since);
        if !self.escalated && down_for >= NEEDS_A_PERSON {
            self.escalated = true;
            return Say::StillLost { down_for };
        }
        self.held_back += 1;
        Say::Nothing
    }

    /// A success seen at `now` (a broker `UP` in the statistics, a store's answer): the outage
    /// ends once no failure came for [`QUIET`].
    pub(crate) fn working(&mut self, now: Instant) -> Say {
        let quiet = self
            .last_failure
            .is_none_or(|last| now.saturating_duration_since(last) >= self.quiet);
        match self.down_since {
            Some(since) if quiet => {
                self.down_since = None;
                Say::Restored {
                    down_for: now.saturating_duration_since(since),
                    held_back: self.held_back,
                }
            }
            _ => Say::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_one_warning_then_one_info_however_many_retries() {
        let mut link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        for ms in (100..10_000).step_by(100) {
            assert_eq!(link.failure(t0 + Duration::from_millis(ms)), Say::Nothing);
        }
        assert_eq!(
            link.working(t0 + Duration::from_secs(12)),
            Say::Nothing,
            "a success right after failures does not end the outage"
        );
        assert_eq!(
            link.working(t0 + Duration::from_secs(16)),
            Say::Restored {
                down_for: Duration::from_secs(16),
                held_back: 99
            }
        );
        assert_eq!(link.working(t0 + Duration::from_secs(17)), Say::Nothing);
        // The next outage is a change again.
        assert_eq!(link.failure(t0 + Duration::from_secs(20)), Say::Lost);
    }

    #[test]
    fn one_server_of_several_down_is_one_outage_not_a_flip_per_answer() {
        let mut link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        for ms in (10..3_000).step_by(10) {
            let now = t0 + Duration::from_millis(ms);
            assert_eq!(link.working(now), Say::Nothing);
            assert_eq!(link.failure(now), Say::Nothing);
        }
    }

    #[test]
    fn a_link_without_quiet_ends_its_outage_at_the_first_success() {
        let mut link = Link::with_quiet(Duration::ZERO);
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        assert_eq!(link.failure(t0 + Duration::from_secs(1)), Say::Nothing);
        assert_eq!(
            link.working(t0 + Duration::from_secs(2)),
            Say::Restored {
                down_for: Duration::from_secs(2),
                held_back: 1
            }
        );
        assert_eq!(link.working(t0 + Duration::from_secs(3)), Say::Nothing);
    }

    #[test]
    fn an_outage_of_a_minute_is_said_once_as_an_error() {
        let mut link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.failure(t0), Say::Lost);
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON - Duration::from_millis(1)),
            Say::Nothing
        );
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON),
            Say::StillLost {
                down_for: NEEDS_A_PERSON
            }
        );
        assert_eq!(
            link.failure(t0 + NEEDS_A_PERSON * 2),
            Say::Nothing,
            "once per outage"
        );
    }
}
