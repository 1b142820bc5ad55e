//! Retention arithmetic: days, absolute expiries, the future window and the active span.
//!
//! Expiry is absolute and fixed per day (`expires_at(day)`), never "now + N": a replay of an old
//! record must not extend the life of anything.

/// Milliseconds in one day.
pub const DAY_MS: u64 = 86_400_000;
/// Seconds in one day.
pub const DAY_SECS: u64 = 86_400;

/// Hard ceiling on `retention_days`, `future_window_days` and `max_active_span_days`.
///
/// Proofs in the meta are bounded by `max_active_span_days + 1` (SPEC 4.6 names 31 for the
/// defaults); this ceiling keeps a misconfiguration from making per-mailbox metadata unbounded.
pub(crate) const MAX_POLICY_DAYS: u32 = 3_650;

/// Longest time to live a backend can hold, in seconds: Cassandra and ScyllaDB refuse `USING TTL`
/// above 20 years. Redis has no such limit, but the same input must get the same outcome on every
/// backend, so a policy whose rows could need more is refused for all of them.
pub(crate) const MAX_TTL_SECS: u64 = 630_720_000;

/// Why a retention policy is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetentionPolicyError {
    #[error("retention.{field} = {value} is out of range (1..={MAX_POLICY_DAYS})")]
    OutOfRange { field: &'static str, value: u32 },
    #[error(
        "retention.days ({retention_days}) + retention.future_window_days ({future_window_days}) + 1 \
         days is {ttl_secs} s, the time to live of the latest day the window admits; no backend may \
         need more than {MAX_TTL_SECS} s (Cassandra's and ScyllaDB's 20-year TTL limit), so the sum \
         must be at most {} days",
        MAX_TTL_SECS / DAY_SECS
    )]
    TtlBeyondLimit {
        retention_days: u32,
        future_window_days: u32,
        ttl_secs: u64,
    },
}

/// The three numbers that decide what a mailbox keeps (SPEC section 2 defaults: 30/30/30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Days a bucket lives after its own day ends.
    pub retention_days: u32,
    /// How far into the future a `created_at` day may lie (relative to today).
    pub future_window_days: u32,
    /// Largest allowed `max_day - min_day` over the active days of one mailbox.
    pub max_active_span_days: u32,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            retention_days: 30,
            future_window_days: 30,
            max_active_span_days: 30,
        }
    }
}

impl RetentionPolicy {
    /// Checks every field is within `1..=MAX_POLICY_DAYS`.
    pub fn validate(&self) -> Result<(), RetentionPolicyError> {
        for (field, value) in [
            ("days", self.retention_days),
            ("future_window_days", self.future_window_days),
            ("max_active_span_days", self.max_active_span_days),
        ] {
            if value == 0 || value > MAX_POLICY_DAYS {
                return Err(RetentionPolicyError::OutOfRange { field, value });
            }
        }
        let ttl_secs = self.longest_ttl_secs();
        if ttl_secs > MAX_TTL_SECS {
            return Err(RetentionPolicyError::TtlBeyondLimit {
                retention_days: self.retention_days,
                future_window_days: self.future_window_days,
                ttl_secs,
            });
        }
        Ok(())
    }

    /// The longest time to live any row may need: a group dated on the last day the future window
    /// admits, written at the first second of today, lives until that day's expiry,
    /// `(future_window_days + 1 + retention_days)` days later.
    pub(crate) fn longest_ttl_secs(&self) -> u64 {
        (u64::from(self.future_window_days) + 1 + u64::from(self.retention_days)) * DAY_SECS
    }

    /// `(day + 1 + retention_days) * 86_400`: the absolute second at which `day` expires.
    pub fn expires_at(&self, day: u64) -> u64 {
        (day + 1 + u64::from(self.retention_days)) * DAY_SECS
    }

    /// The day whose expiry is `expires_at` (the inverse of [`expires_at`](Self::expires_at)).
    pub(crate) fn day_of_expiry(&self, expires_at: u64) -> u64 {
        (expires_at / DAY_SECS).saturating_sub(1 + u64::from(self.retention_days))
    }

    /// `day > today + future_window_days`.
    pub(crate) fn is_beyond_future_window(&self, day: u64, now_secs: u64) -> bool {
        day > today(now_secs) + u64::from(self.future_window_days)
    }

    /// Upper bound on active days of one mailbox: `max_active_span_days + 1`.
    pub fn max_active_days(&self) -> usize {
        self.max_active_span_days as usize + 1
    }
}

/// The Unix day of a millisecond timestamp.
pub(crate) fn day_of_ms(created_at_ms: u64) -> u64 {
    created_at_ms / DAY_MS
}

/// The Unix day of a second timestamp.
pub fn today(now_secs: u64) -> u64 {
    now_secs / DAY_SECS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_absolute_per_day() {
        let p = RetentionPolicy::default();
        // 2025-12-02T00:00:00.123Z is day 20424.
        let day = day_of_ms(1_764_633_600_123);
        assert_eq!(day, 20_424);
        assert_eq!(p.expires_at(day), (20_424 + 31) * 86_400);
    }

    #[test]
    fn future_window_counts_from_today() {
        let p = RetentionPolicy::default();
        let now = 20_000 * DAY_SECS + 5;
        assert!(!p.is_beyond_future_window(20_030, now));
        assert!(p.is_beyond_future_window(20_031, now));
    }

    #[test]
    fn the_longest_ttl_must_fit_every_backend() {
        let at_limit = RetentionPolicy {
            retention_days: 3_650,
            future_window_days: 3_649,
            max_active_span_days: 30,
        };
        assert_eq!(at_limit.longest_ttl_secs(), MAX_TTL_SECS);
        assert_eq!(at_limit.validate(), Ok(()));
        let beyond = RetentionPolicy {
            future_window_days: 3_650,
            ..at_limit
        };
        let e = beyond.validate().unwrap_err();
        assert_eq!(
            e,
            RetentionPolicyError::TtlBeyondLimit {
                retention_days: 3_650,
                future_window_days: 3_650,
                ttl_secs: MAX_TTL_SECS + DAY_SECS,
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("retention.days") && text.contains("retention.future_window_days"),
            "{text}"
        );
    }

    #[test]
    fn policy_validation_names_the_field() {
        let p = RetentionPolicy {
            future_window_days: 0,
            ..Default::default()
        };
        assert_eq!(
            p.validate(),
            Err(RetentionPolicyError::OutOfRange {
                field: "future_window_days",
                value: 0
            })
        );
    }
}
