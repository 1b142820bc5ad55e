//! The replay's read-and-apply loop: the partition's range through the daemon's ordering core,
//! into the staging copies of fenced users (or the live store), with the same dispositions.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::progress::Progress;
use super::range::{next_in_range, position_lost, Next, Range, ReadRecord};
use super::{pause_point, ReplayRequest, ReplaySummary, MAX_TRANSIENT_ATTEMPTS, STALL};
use crate::config::Config;
use crate::daemon::events::{Event, ReplayRecord};
use crate::disposition::Disposition;
use crate::ingest::drive::{Driver, Policy, Step, Verdict};
use crate::ingest::pipeline::FinalRecord;
use crate::ingest::{decode, Delivery, DeliveryOutcome};
use crate::model::LogId;
use crate::model::{StoreError, UserId};
use crate::store::repair::Renewal;
use crate::store::MailboxStore;

/// The replay's read-and-apply loop.
pub(super) struct Rebuild<'a> {
    pub(super) config: &'a Config,
    pub(super) request: &'a ReplayRequest,
    /// The log's identity: each record applies with its own source position.
    pub(super) log: LogId,
    /// Staging views of the fenced users; other deliveries go to the live store.
    pub(super) targets: HashMap<UserId, Arc<dyn MailboxStore>>,
    /// One window: the partition's range.
    pub(super) driver: Driver<(), (), (), ()>,
    pub(super) summary: &'a mut ReplaySummary,
    pub(super) corrupt_users: BTreeSet<UserId>,
    pub(super) seen_users: BTreeSet<UserId>,
    pub(super) wanted: BTreeSet<UserId>,
    pub(super) progress: Progress,
    /// The first staged delivery has landed (the `replay.rebuilding` pause point is due).
    pub(super) staged_any: bool,
    pub(super) pause_rebuilding: bool,
}

impl Rebuild<'_> {
    /// Reads `range` and applies it. `Err((reason, retryable))` aborts the replay.
    pub(super) async fn read(
        &mut self,
        reader: &StreamConsumer,
        range: &Range,
        interrupt: &mut watch::Receiver<bool>,
        mut renewal: Option<&mut Renewal>,
    ) -> Result<(), (String, bool)> {
        let topic = self.config.kafka.topic.as_str();
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, self.request.partition, Offset::Offset(range.from))
            .map_err(|e| (format!("kafka: {e}"), true))?;
        reader
            .assign(&assignment)
            .map_err(|e| (format!("kafka: {e}"), true))?;
        let mut next_offset = range.from;
        let mut source_done = false;
        let mut give_up = Instant::now() + STALL;
        loop {
            if source_done && self.driver.is_empty() {
                return Ok(());
            }
            let can_read = !source_done && self.driver.room_for_more(&(), 0);
            if !can_read {
                // Waiting for the store is not waiting for the broker.
                give_up = Instant::now() + STALL;
            }
            tokio::select! {
                biased;
                _ = interrupt.changed() => {
                    return Err(("interrupted by a signal before the swap; the live mailboxes are as they were".to_owned(), false));
                }
                reason = async { match renewal.as_mut() { Some(r) => r.lost().await, None => std::future::pending().await } } => {
                    return Err((format!("repair fence lost: {reason}"), false));
                }
                attempt = self.driver.next() => {
                    let (driver, mut policy) = self.split();
                    driver.handle(attempt, &mut policy)?;
                    if std::mem::take(&mut self.pause_rebuilding) {
                        pause_point("replay.rebuilding").await;
                    }
                }
                next = next_in_range(reader, topic, self.request.partition, range.end, give_up), if can_read => {
                    match next? {
                        Next::Done => source_done = true,
                        Next::Record(ReadRecord { offset, payload, .. }) => {
                            give_up = Instant::now() + STALL;
                            if offset >= next_offset {
                                next_offset = offset + 1;
                                self.admit(offset, &payload);
                            }
                            // Take what else is already fetched, so the deliveries of many
                            // records go to the store as one batch.
                            let mut taken = 1;
                            while next_offset < range.end && self.driver.room_for_more(&(), taken) {
                                taken += 1;
                                let message = match reader.recv().now_or_never() {
                                    Some(Ok(message)) => message,
                                    Some(Err(e)) if position_lost(&e) => {
                                        return Err((format!("the read position is gone ({e}): retention deleted records of the range while it was read; rerun"), false));
                                    }
                                    _ => break,
                                };
                                let offset = message.offset();
                                if offset >= range.end {
                                    next_offset = range.end;
                                    break;
                                }
                                if offset >= next_offset {
                                    next_offset = offset + 1;
                                    let payload = message.payload().unwrap_or_default().to_vec();
                                    drop(message);
                                    self.admit(offset, &payload);
                                }
                            }
                            if next_offset >= range.end {
                                source_done = true;
                            }
                        }
                    }
                }
            }
            self.settle();
        }
    }

    fn admit(&mut self, offset: i64, payload: &[u8]) {
        self.summary.records += 1;
        self.progress.read(1);
        let partition = self.request.partition;
        let decoded = decode(payload, &self.config.decode_options())
            .map(|d| d.record.at_position(Some(&self.log), partition, offset));
        let decoded = match decoded {
            Ok(record) if !self.wanted.is_empty() => {
                match record.retain_users(|u| self.wanted.contains(u)) {
                    Some(record) => Ok(record),
                    None => {
                        self.count("skipped");
                        return;
                    }
                }
            }
            other => other,
        };
        if let Err(e) = &decoded {
            tracing::info!(offset, error = %e, "malformed record (dead-lettered when first read)");
        }
        if self.request.dry_run {
            match &decoded {
                Ok(record) => {
                    let deliveries = record.deliveries();
                    for d in &deliveries {
                        self.seen_users.insert(d.mailbox().user_id.clone());
                    }
                    *self.summary.groups.entry("planned").or_default() += deliveries.len() as u64;
                    self.count("planned");
                }
                Err(_) => self.count("malformed"),
            }
            return;
        }
        let (driver, mut policy) = self.split();
        driver.admit((), offset, (), 0, (), decoded, &mut policy);
    }

    /// The driver, and the policy over the rest of the run's state.
    fn split(&mut self) -> (&mut Driver<(), (), (), ()>, ReplayPolicy<'_>) {
        (
            &mut self.driver,
            ReplayPolicy {
                config: self.config,
                targets: &self.targets,
                summary: self.summary,
                corrupt_users: &mut self.corrupt_users,
                seen_users: &mut self.seen_users,
                staged_any: &mut self.staged_any,
                pause_rebuilding: &mut self.pause_rebuilding,
            },
        )
    }

    /// Counts the records that left the window.
    fn settle(&mut self) {
        let finals = match self.driver.window_mut(&()) {
            Some(window) => window.pipeline.pop_final(),
            None => Vec::new(),
        };
        for record in finals {
            let word = replay_word(&record);
            if !record.held.is_empty() {
                *self.summary.groups.entry("held").or_default() += record.held.len() as u64;
            }
            self.count(word);
        }
    }

    fn count(&mut self, word: &'static str) {
        *self.summary.outcomes.entry(word).or_default() += 1;
        ReplayRecord(word).emit();
    }
}

/// A replay's answers to results the table does not make final: a corrupt live mailbox is
/// reported and the replay goes on; a corrupt staging copy, a lost fence, or a store still
/// unreachable after a few attempts stops the replay before the swap.
struct ReplayPolicy<'a> {
    config: &'a Config,
    targets: &'a HashMap<UserId, Arc<dyn MailboxStore>>,
    summary: &'a mut ReplaySummary,
    corrupt_users: &'a mut BTreeSet<UserId>,
    seen_users: &'a mut BTreeSet<UserId>,
    staged_any: &'a mut bool,
    pause_rebuilding: &'a mut bool,
}

impl Policy<(), ()> for ReplayPolicy<'_> {
    /// The reason, and whether a rerun may succeed.
    type Stop = (String, bool);

    fn target(&mut self, delivery: &Delivery) -> Option<Arc<dyn MailboxStore>> {
        let user = &delivery.mailbox().user_id;
        self.seen_users.insert(user.clone());
        self.targets.get(user).cloned()
    }

    fn not_final(
        &mut self,
        step: Step<'_, ()>,
        _state: &mut (),
        result: &Result<DeliveryOutcome, StoreError>,
        disposition: Disposition,
    ) -> Verdict<(String, bool)> {
        let user = &step.delivery.mailbox().user_id;
        let offset = step.at.offset;
        let reason = result
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        match disposition {
            Disposition::Advance | Disposition::DeadLetter => Verdict::Final,
            Disposition::AbortRepair => Verdict::Stop((format!("repair fence lost: {reason}"), false)),
            // A staging copy is built from nothing: a corrupt verdict there means the rebuild
            // cannot be trusted, and it must never be swapped in.
            Disposition::Block if self.targets.contains_key(user) => Verdict::Stop((
                format!(
                    "the rebuild of {} failed closed ({reason}); nothing was swapped",
                    user.as_str()
                ),
                false,
            )),
            Disposition::Block => {
                // A replay does not wait for a repair: it reports the mailbox and moves on.
                if self.corrupt_users.insert(user.clone()) {
                    tracing::error!(offset, user = %user.as_str(), error = %reason, "still corrupt");
                }
                Verdict::Final
            }
            Disposition::Retry { .. } if step.attempt + 1 >= MAX_TRANSIENT_ATTEMPTS => {
                Verdict::Stop((
                    format!("gave up after {MAX_TRANSIENT_ATTEMPTS} attempts at offset {offset}: {reason}"),
                    true,
                ))
            }
            Disposition::Retry { .. } => {
                tracing::warn!(offset, error = %reason, attempt = step.attempt, "transient store error; retrying");
                Verdict::Retry(self.config.kafka.backoff().delay(step.attempt))
            }
        }
    }

    fn delivery_final(
        &mut self,
        step: Step<'_, ()>,
        _state: &mut (),
        result: &Result<DeliveryOutcome, StoreError>,
    ) {
        let word = match result {
            Ok(outcome) => outcome.as_str(),
            Err(e) => e.outcome(),
        };
        *self.summary.groups.entry(word).or_default() += 1;
        if !*self.staged_any && self.targets.contains_key(&step.delivery.mailbox().user_id) {
            *self.staged_any = true;
            *self.pause_rebuilding = true;
        }
    }
}

/// The replay outcome of a final record: `corrupt` if a delivery met a corrupt mailbox, else
/// the record outcome.
fn replay_word(record: &FinalRecord<()>) -> &'static str {
    let corrupt =
        record
            .deliveries
            .iter()
            .any(|(_, r): &(_, Result<DeliveryOutcome, StoreError>)| {
                matches!(r, Err(StoreError::Corrupt { .. }))
            });
    if corrupt {
        "corrupt"
    } else if !record.held.is_empty() {
        // Its mailbox answered corrupt earlier in the run: held, as the daemon holds it.
        "held"
    } else {
        record.outcome.as_str()
    }
}
