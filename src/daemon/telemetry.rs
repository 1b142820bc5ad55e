//! The outcomes of records and deliveries, each reported in one place: its metric, its log line
//! and its progress count, so the three never disagree (the demo's table, `/metrics` and the logs
//! are one story). Every other event of the daemon is a struct in `events`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::http::Health;
use super::metrics;
use crate::disposition::Disposition;
use crate::ingest::pipeline::{FinalRecord, RecordOutcome};
use crate::locks::lock;
use crate::model::{StoreError, UserId};

/// Outcome counts of a run, for the demo's table and for tests of the library.
#[derive(Debug, Default, Clone)]
pub struct ProgressCounts {
    /// Record outcomes (`applied`, `dead_lettered`, `malformed`).
    pub records: BTreeMap<&'static str, u64>,
    /// Delivery outcome words.
    pub groups: BTreeMap<&'static str, u64>,
    /// Records final (applied or dead-lettered), all partitions.
    pub final_records: u64,
}

/// Live progress counts, shared with whoever started the daemon.
#[derive(Debug, Default)]
pub struct Progress(Mutex<ProgressCounts>);

impl Progress {
    pub fn snapshot(&self) -> ProgressCounts {
        lock(&self.0).clone()
    }
}

/// The daemon's reporter.
#[derive(Clone)]
pub(crate) struct Telemetry {
    backend: &'static str,
    progress: Arc<Progress>,
    health: Arc<Health>,
    /// The store's outage as the log tells it: once per change ([`Telemetry::attempt_failed`]).
    store_link: Arc<StoreLink>,
}

/// The store's outages, told once per change ([`super::outage`]): a store restarting or failing
/// over fails every delivery in flight, each retried several times a second.
#[derive(Default)]
struct StoreLink {
    /// Set while an outage is open: the success path reads only this.
    down: std::sync::atomic::AtomicBool,
    link: Mutex<super::outage::Link>,
}

impl Telemetry {
    pub(crate) fn new(backend: &'static str, progress: Arc<Progress>, health: Arc<Health>) -> Self {
        Self {
            backend,
            progress,
            health,
            store_link: Arc::default(),
        }
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// A delivery reached its final outcome (`word`); a refusal is logged with its reason.
    pub(crate) fn delivery_final(
        &self,
        partition: i32,
        offset: i64,
        index: usize,
        word: &'static str,
        error: Option<&StoreError>,
    ) {
        metrics::group(word);
        *lock(&self.progress.0).groups.entry(word).or_default() += 1;
        // The store answered: an open outage ends here (once quiet), said once.
        if self
            .store_link
            .down
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            if let super::outage::Say::Restored {
                down_for,
                held_back,
            } = lock(&self.store_link.link).working(std::time::Instant::now())
            {
                self.store_link
                    .down
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    backend = self.backend,
                    down_for = ?down_for,
                    held_back,
                    "the store answers again"
                );
            }
        }
        if let Some(e) = error {
            tracing::info!(
                partition,
                offset,
                delivery = index,
                outcome = word,
                kind = e.kind(),
                detail = %e.detail(),
                "delivery refused; the record goes to the dead-letter topic"
            );
        }
    }

    /// A final delivery, offered to `/debug/tap` (built only while a client listens).
    pub(crate) fn tap(
        &self,
        partition: i32,
        offset: i64,
        delivery: &crate::ingest::Delivery,
        word: &'static str,
        error: Option<&StoreError>,
    ) {
        let tap = &self.health.tap;
        if !tap.active() {
            return;
        }
        let mailbox = delivery.mailbox();
        let mailbox_seq = match delivery {
            crate::ingest::Delivery::Append(group) => group.mailbox_seq,
            crate::ingest::Delivery::Truncate { before_seq, .. } => *before_seq,
        };
        tap.publish(super::tap::TapEvent {
            partition,
            offset,
            user_id: mailbox.user_id.as_str().to_owned(),
            epoch: mailbox.epoch,
            mailbox_seq,
            outcome: word,
            error_kind: error.map(StoreError::kind),
        });
    }

    /// A store call failed in a way that is not final (retry, fence, corrupt).
    pub(crate) fn attempt_failed(
        &self,
        partition: i32,
        offset: i64,
        user: &UserId,
        error: &StoreError,
        disposition: Disposition,
        attempt: u32,
    ) {
        metrics::store_error(self.backend, error.kind());
        match disposition {
            Disposition::Retry {
                under_repair: false,
            } => {
                self.health.write_failed(error.out_of_memory());
                if error.is_store_lost() {
                    self.health.store_lost(&error.detail());
                }
                // Every attempt of every delivery in flight fails during an outage, several
                // times a second: the log says it once per change (the first failure after the
                // store answered, an ERROR after a minute, and the answer again), the rest at
                // DEBUG, each counted in `store_errors_total`.
                self.store_link
                    .down
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let say = lock(&self.store_link.link).failure(std::time::Instant::now());
                match say {
                    super::outage::Say::Lost => tracing::warn!(
                        partition,
                        offset,
                        error = %error,
                        attempt,
                        "store unavailable; retrying (said once until the store answers again; the retries are at DEBUG)"
                    ),
                    super::outage::Say::StillLost { down_for } => tracing::error!(
                        partition,
                        offset,
                        error = %error,
                        down_for = ?down_for,
                        "the store has failed writes for a minute with no quiet moment: check it (/readyz says why; the deliveries wait, nothing is dead-lettered)"
                    ),
                    _ => {
                        tracing::debug!(partition, offset, error = %error, attempt, "store unavailable; retrying")
                    }
                }
            }
            Disposition::Retry { under_repair: true } => {
                if attempt == 0 {
                    tracing::info!(partition, offset, user = %user.as_str(), error = %error, "mailbox under repair; its deliveries wait for the swap");
                }
            }
            Disposition::Block | Disposition::AbortRepair => {}
            Disposition::Advance | Disposition::DeadLetter => {}
        }
    }

    /// A user's mailbox started failing closed.
    pub(crate) fn blocked(
        &self,
        partition: i32,
        offset: i64,
        user: &UserId,
        epoch: u32,
        reason: &StoreError,
        now_blocked: usize,
    ) {
        tracing::error!(
            partition,
            offset,
            user = %user.as_str(),
            epoch,
            reason = %reason,
            "corrupt mailbox: failing closed; its later deliveries are skipped (the rest of the partition flows) and the committed offset stays before it until it is repaired (materializer replay --reset-mailboxes); then the partition is read again from there"
        );
        metrics::partition_blocked(partition, now_blocked);
    }

    /// A blocked mailbox accepted its delivery again (it was repaired).
    pub(crate) fn unblocked(&self, partition: i32, user: &UserId, now_blocked: usize) {
        tracing::info!(partition, user = %user.as_str(), "mailbox repaired: flowing again");
        metrics::partition_blocked(partition, now_blocked);
    }

    /// Records left a partition's window final, in source order (one call per batch: the
    /// counters move once per outcome, the timestamp gauge once, whatever the batch size).
    pub(crate) fn records_final<M>(
        &self,
        partition: i32,
        records: &[FinalRecord<M>],
        timestamp_ms: impl Fn(&FinalRecord<M>) -> Option<i64>,
    ) {
        let Some(last) = records.last() else {
            return;
        };
        // A record with a delivery skipped for a blocked mailbox is counted when it is read
        // again after the repair, not now.
        let done = records.iter().filter(|r| !r.skipped);
        let mut counts = [0u64; 3];
        let mut final_records = 0u64;
        for record in done {
            counts[record.outcome as usize] += 1;
            final_records += 1;
        }
        let mut progress = lock(&self.progress.0);
        for (outcome, n) in RecordOutcome::ALL.iter().zip(counts) {
            if n > 0 {
                metrics::record_n(outcome.as_str(), n);
                *progress.records.entry(outcome.as_str()).or_default() += n;
            }
        }
        progress.final_records += final_records;
        drop(progress);
        if let Some(ms) = timestamp_ms(last) {
            metrics::last_record_timestamp(partition, ms);
        }
    }

    /// A dead letter was acknowledged.
    pub(crate) fn dead_lettered(
        &self,
        partition: i32,
        offset: i64,
        reason: &'static str,
        truncated: bool,
    ) {
        metrics::dead_letter(reason);
        if truncated {
            tracing::warn!(partition, offset, reason, "dead letter too large for the producer: sent a bounded excerpt (dlq_truncated=true)");
        }
    }

    /// A dead letter was not acknowledged; it is retried.
    pub(crate) fn dead_letter_failed(
        &self,
        partition: i32,
        offset: i64,
        error: &rdkafka::error::KafkaError,
        attempt: u32,
    ) {
        if attempt.is_multiple_of(10) {
            tracing::warn!(partition, offset, error = %error, attempt, "dead letter not acknowledged; retrying");
        }
    }

    /// One delivery's attempt took `seconds` in the store (its batch's call).
    pub(crate) fn store_call(&self, seconds: f64) {
        metrics::apply_duration(seconds);
    }

    /// The store calls a batch made.
    pub(crate) fn store_calls(&self, calls: &[crate::ingest::runner::StoreCall]) {
        for call in calls {
            metrics::store_call_duration(call.backend, call.op, call.elapsed.as_secs_f64());
        }
    }
}
