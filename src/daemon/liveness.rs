//! Liveness (`/healthz`): the engine loop and the poll thread each stamp a heartbeat, and
//! `/healthz` fails when one of them made no progress for `http.liveness_timeout_ms` while it
//! was running, so the orchestrator restarts a wedged replica (a select loop stuck in a call that
//! never returns, a poll thread blocked for good).
//!
//! What counts as progress, so that a slow dependency never fails liveness (readiness says
//! that):
//! - the engine loop turns at least once a second on its housekeeping tick, whatever the store
//!   or the broker do (every store call is awaited, never blocked on);
//! - the poll thread stamps every poll (100 ms at most), and while it waits on the engine (a
//!   batch handed over to an engine that is busy with a slow store, a revoke waiting for its
//!   hand-over) it counts as alive: the engine's own heartbeat covers that wait.
//!
//! Before the engine starts (the store still being reached) and after it stops, nothing is
//! stamped and `/healthz` answers ok: those phases are bounded by their own timeouts and logs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The default of `http.liveness_timeout_ms`: far above the longest legitimate wait of either
/// loop (a revoke's hand-over waits `kafka.shutdown_deadline_ms` + 2 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The two heartbeats.
#[derive(Debug, Default)]
pub struct Liveness {
    /// When the engine loop last turned (ms since the Unix epoch; 0: not running).
    engine: AtomicU64,
    /// When the poll thread last polled (0: not running).
    poll: AtomicU64,
    /// The poll thread is waiting on the engine.
    poll_waiting: AtomicBool,
    /// `http.liveness_timeout_ms` (0: [`DEFAULT_TIMEOUT`]).
    timeout_ms: AtomicU64,
}

pub(crate) use crate::wall_clock::now_ms;

impl Liveness {
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms.store(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn engine_beat(&self) {
        self.engine.store(now_ms().max(1), Ordering::Relaxed);
    }

    /// The engine loop ended (the process is about to exit).
    pub(crate) fn engine_stopped(&self) {
        self.engine.store(0, Ordering::Relaxed);
    }

    pub(crate) fn poll_beat(&self) {
        self.poll.store(now_ms().max(1), Ordering::Relaxed);
    }

    /// The poll thread starts (`true`) or stops (`false`) waiting on the engine.
    pub(crate) fn poll_waiting(&self, waiting: bool) {
        self.poll_waiting.store(waiting, Ordering::Relaxed);
        self.poll_beat();
    }

    /// The poll thread ended.
    pub(crate) fn poll_stopped(&self) {
        self.poll.store(0, Ordering::Relaxed);
    }

    /// `Err` with the `/healthz` line when a running loop made no progress within the timeout.
    pub fn check(&self, now_ms: u64) -> Result<(), String> {
        let timeout = match self.timeout_ms.load(Ordering::Relaxed) {
            0 => u64::try_from(DEFAULT_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
            ms => ms,
        };
        let stale = |beat: u64| beat != 0 && now_ms.saturating_sub(beat) > timeout;
        let engine = self.engine.load(Ordering::Relaxed);
        if stale(engine) {
            return Err(format!(
                "engine loop: no progress for {} s (http.liveness_timeout_ms = {timeout})",
                now_ms.saturating_sub(engine) / 1000
            ));
        }
        let poll = self.poll.load(Ordering::Relaxed);
        if !self.poll_waiting.load(Ordering::Relaxed) && stale(poll) {
            return Err(format!(
                "poll thread: no progress for {} s (http.liveness_timeout_ms = {timeout})",
                now_ms.saturating_sub(poll) / 1000
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_loop_fails_and_a_waiting_poll_thread_does_not() {
        let l = Liveness::default();
        l.set_timeout(Duration::from_secs(5));
        assert!(l.check(1_000_000).is_ok(), "nothing running yet");
        l.engine.store(1_000_000, Ordering::Relaxed);
        l.poll.store(1_000_000, Ordering::Relaxed);
        assert!(l.check(1_004_000).is_ok());
        let engine = l.check(1_006_000).expect_err("the engine is stale");
        assert!(
            engine.starts_with("engine loop: no progress for 6 s"),
            "{engine}"
        );
        l.engine.store(1_006_000, Ordering::Relaxed);
        assert!(l.check(1_006_000).unwrap_err().starts_with("poll thread"));
        l.poll_waiting.store(true, Ordering::Relaxed);
        assert!(
            l.check(1_006_000).is_ok(),
            "waiting on the engine is progress"
        );
        l.engine_stopped();
        l.poll_stopped();
        assert!(l.check(9_000_000).is_ok(), "stopped loops are not checked");
    }
}
