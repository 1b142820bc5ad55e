//! The host's wall clock in milliseconds since the Unix epoch, for what is not a store decision:
//! log and health timestamps, `--since`, a replay's "in the future" check. (A store decides
//! expiry by its own time authority, `store::Clock`.)

/// Now, in milliseconds since the Unix epoch (0 before it, which no host is).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// [`now_ms`] as the signed milliseconds Kafka's timestamps and `--from-time` use.
pub(crate) fn now_ms_signed() -> i64 {
    i64::try_from(now_ms()).unwrap_or(i64::MAX)
}
