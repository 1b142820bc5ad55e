//! The one backoff of the product: capped exponential with jitter.
//!
//! Every retry — a delivery on a transient store error or a fenced mailbox, a corrupt mailbox
//! waiting for its repair, a dead letter the broker did not acknowledge, a store that is not up
//! yet at startup, a repair fence renewal — waits [`Backoff::delay`]. Jitter spreads the retries of
//! many lanes that failed together (a store restart) so they do not return in one burst.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Capped exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The first delay (before jitter).
    pub initial: Duration,
    /// No delay exceeds this.
    pub max: Duration,
}

impl Backoff {
    pub(crate) const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The capped exponential delay of `attempt` (0-based) before jitter: `initial * 2^attempt`,
    /// at most `max`.
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay before retry `attempt`: uniformly random in `[ceiling / 2, ceiling]` ("equal
    /// jitter": never shorter than half the exponential step, so a retry storm still backs off).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let spread = ceiling.saturating_sub(half).as_nanos() as u64;
        if spread == 0 {
            return ceiling;
        }
        half + Duration::from_nanos(next_random() % (spread + 1))
    }
}

/// A process-wide splitmix64 sequence seeded from the clock: cheap, lock-free, and good enough
/// to decorrelate retries (this is not cryptography).
fn next_random() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut seed = STATE.load(Ordering::Relaxed);
    if seed == 0 {
        seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            | 1;
    }
    let next = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    STATE.store(next, Ordering::Relaxed);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_and_is_capped() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(5), Duration::from_millis(3200));
        assert_eq!(b.ceiling(6), Duration::from_secs(5));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn jittered_delays_stay_between_half_and_the_ceiling_and_vary() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut seen = std::collections::HashSet::new();
        for attempt in 0..40 {
            let d = b.delay(attempt % 8);
            let ceiling = b.ceiling(attempt % 8);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            seen.insert(d);
        }
        assert!(seen.len() > 10, "jitter spreads the delays: {seen:?}");
    }
}
