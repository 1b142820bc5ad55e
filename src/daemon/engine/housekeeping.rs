//! Every second: the partitions' gauges, the expired days reported by the store, and the
//! detection of partitions librdkafka cannot read (readiness).

use super::*;

impl Engine {
    /// Every second: refresh each assigned partition's gauges (a revoked partition's gauges are
    /// no longer refreshed and disappear) and detect partitions that cannot be read.
    pub(super) fn housekeeping(&mut self) {
        // Expired days the store compacted inside appends (and any other promote) since the
        // last tick.
        let promoted = self.driver.store().promoted_buckets_total();
        if promoted > self.promoted_reported {
            ExpiredBucketsPromoted(promoted - self.promoted_reported).emit();
            self.promoted_reported = promoted;
        }
        let PartitionOffsets {
            highs,
            starts,
            committed,
        } = self.consumer.context().offsets();
        let mut any_stalled = false;
        for (partition, window) in self.driver.windows_mut() {
            let idle = window.pipeline.is_empty() && !window.state.paused;
            let position = window.pipeline.watermark();
            let state = &mut window.state;
            let position = position
                .or(state.start)
                .or_else(|| starts.get(partition).copied());
            state.start = state.start.or_else(|| starts.get(partition).copied());
            let lag = match (highs.get(partition), position) {
                (Some(high), Some(position)) => Some(high - position),
                _ => None,
            };
            PartitionGauges {
                partition: *partition,
                blocked_mailboxes: state.blocked.len(),
                skipped_deliveries: window.pipeline.skipped().map(|(_, n, _)| n).sum(),
                committed: committed.get(partition).copied(),
                lag,
            }
            .emit();
            // Stalled: the consumer reports errors, the partition has records to read, nothing in
            // flight, not paused, and nothing arrived for a while — a record librdkafka cannot
            // read (an unsupported codec). Without consumer errors an idle partition whose last
            // offsets are transaction markers (never delivered) is not stalled.
            let stalled = is_stalled(&Stall {
                last_consumer_error: self
                    .last_consumer_error
                    .as_ref()
                    .map(|(at, _)| at.elapsed()),
                lag,
                idle,
                since_last_record: state.last_record.elapsed(),
                threshold: self.settings.stalled_after,
            });
            PartitionReadable {
                partition: *partition,
                stalled,
                was_stalled: state.stalled,
                lag,
                last_consumer_error: self.last_consumer_error.as_ref().map(|(_, e)| e.as_str()),
                stalled_after: self.settings.stalled_after,
            }
            .emit();
            state.stalled = stalled;
            any_stalled |= stalled;
        }
        self.telemetry.health().set_consumer(!any_stalled);
        let blocked: usize = self
            .driver
            .windows()
            .map(|(_, w)| w.state.blocked.len())
            .sum();
        let limit = self.settings.max_blocked_mailboxes;
        BlockedMailboxes {
            blocked,
            limit,
            was_over: self.over_blocked_limit,
        }
        .emit();
        self.telemetry.health().set_blocked_list(
            blocked,
            self.driver
                .windows()
                .flat_map(|(_, w)| w.state.blocked.values())
                .take(crate::daemon::http::BLOCKED_SHOWN)
                .cloned()
                .collect(),
        );
        let over = blocked > limit;
        self.over_blocked_limit = over;
        self.telemetry.health().set_blocked(
            over,
            over.then(|| {
                format!(
                    "{blocked} mailboxes fail closed, more than kafka.max_blocked_mailboxes = {limit}: repair them with replay --reset-mailboxes"
                )
            }),
        );
        self.telemetry.health().refresh();
        self.rereads_due();
    }
}

/// What the stall check of one partition looks at.
struct Stall {
    /// How long ago the consumer last reported an error, if ever.
    last_consumer_error: Option<Duration>,
    /// High watermark minus the partition's position, when known.
    lag: Option<i64>,
    /// Nothing in the window and not paused (so nothing is waiting on the store or on us).
    idle: bool,
    since_last_record: Duration,
    threshold: Duration,
}

/// A partition is stalled when the consumer reports errors, records wait (lag), the engine
/// holds none of them, and none arrived for the threshold: librdkafka cannot hand them over
/// (an unreadable record). An idle partition whose last offsets are transaction markers has lag
/// too, but no consumer error: not stalled.
fn is_stalled(s: &Stall) -> bool {
    s.last_consumer_error.is_some_and(|ago| ago < s.threshold)
        && s.lag.is_some_and(|l| l > 0)
        && s.idle
        && s.since_last_record >= s.threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_stalled_only_with_errors_waiting_records_and_no_progress() {
        let threshold = Duration::from_secs(30);
        let unreadable = Stall {
            last_consumer_error: Some(Duration::from_secs(1)),
            lag: Some(3),
            idle: true,
            since_last_record: Duration::from_secs(31),
            threshold,
        };
        assert!(is_stalled(&unreadable));
        for (name, stall) in [
            (
                "no consumer error (transaction markers)",
                Stall {
                    last_consumer_error: None,
                    ..unreadable
                },
            ),
            (
                "an old error",
                Stall {
                    last_consumer_error: Some(Duration::from_secs(60)),
                    ..unreadable
                },
            ),
            (
                "nothing waiting",
                Stall {
                    lag: Some(0),
                    ..unreadable
                },
            ),
            (
                "lag unknown",
                Stall {
                    lag: None,
                    ..unreadable
                },
            ),
            (
                "busy (window or pause)",
                Stall {
                    idle: false,
                    ..unreadable
                },
            ),
            (
                "a record arrived recently",
                Stall {
                    since_last_record: Duration::from_secs(5),
                    ..unreadable
                },
            ),
        ] {
            assert!(!is_stalled(&stall), "{name}");
        }
    }
}
