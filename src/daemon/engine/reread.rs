//! Re-reading a partition after a blocked mailbox heals (SPEC 7: a corrupt mailbox holds only
//! itself).
//!
//! While a mailbox fails closed its user is parked in the window (`PartitionPipeline::park`):
//! its head delivery is retried, everything else of it is skipped, and the rest of the partition
//! flows; the watermark, and so the committed offset, stays before the head. Once the head is
//! final (an operator rebuilt the mailbox with `replay --reset-mailboxes`), what was skipped must
//! be applied in source order, from the log and never from memory:
//!
//! 1. the window closes (nothing new starts; the calls and dead letters already sent come back);
//! 2. the poll thread seeks the partition to the window's watermark (the first record not final,
//!    never past the first skipped delivery) and says so in order with the records
//!    (`IntakeEvent::Reread`): everything after that event comes from the watermark on;
//! 3. a new window opens at the watermark and reads on, as after a restart: the healed user's
//!    deliveries are applied in order, other users' records met again are replays of what is
//!    stored and answer `unchanged` (or `superseded`), and users still blocked are parked again
//!    when their head fails again.
//!
//! Restart-safe by construction: nothing of it is kept anywhere but in the log and the committed
//! offset, which never passes a skipped delivery. A seek the consumer refuses ends the run with
//! an error (the process restarts and reads from the committed offset).

use rdkafka::consumer::Consumer;

use super::{Engine, PartitionState, Rereading};
use crate::daemon::events::{Event, RereadBehind, RereadStarted};

impl Engine {
    /// Starts the re-reads that are due and finishes the closes of those whose calls are back.
    pub(super) fn rereads_due(&mut self) {
        let mut closing = Vec::new();
        let mut ready = Vec::new();
        for (partition, window) in self.driver.windows() {
            if window.state.reread {
                if window.calls() == 0 && window.state.letters == 0 {
                    ready.push(*partition);
                }
            } else if !window.is_closing()
                && (window.pipeline.reread_from().is_some() || window.state.rewind_to.is_some())
            {
                closing.push(*partition);
            }
        }
        for partition in closing {
            self.driver.begin_close(&partition);
            if let Some(window) = self.driver.window_mut(&partition) {
                window.state.reread = true;
                if window.state.rewind_to.is_none() {
                    tracing::info!(
                        partition,
                        from = window.pipeline.watermark().unwrap_or_default(),
                        "a blocked mailbox is healthy again: the partition is read again from its committed position, so its skipped deliveries are applied from the log"
                    );
                }
            }
        }
        for partition in ready {
            let Some(window) = self.driver.close(&partition) else {
                continue;
            };
            // A store that went back is read again from what it holds, below the watermark.
            let from = [window.state.rewind_to, window.pipeline.watermark()]
                .into_iter()
                .flatten()
                .min();
            let Some(from) = from else {
                continue;
            };
            self.rereads += 1;
            let token = self.rereads;
            self.rereading.insert(
                partition,
                Rereading {
                    token,
                    from,
                    until: window.pipeline.next_offset(),
                    generation: window.state.generation,
                },
            );
            RereadStarted { partition }.emit();
            self.consumer
                .context()
                .request_reread(partition, from, token);
        }
    }

    /// The poll thread seeked `partition` to `offset` for the re-read `token`: its new window
    /// opens there.
    pub(super) fn reread_started(&mut self, partition: i32, offset: i64, token: u64, ok: bool) {
        let Some(rereading) = self.rereading.remove(&partition) else {
            return;
        };
        if rereading.token != token {
            self.rereading.insert(partition, rereading);
            return;
        }
        if !ok || offset != rereading.from {
            self.fatal = Some(format!(
                "partition {partition} could not be read again from offset {}: restarting reads it from the committed offset",
                rereading.from
            ));
            return;
        }
        let mut state = PartitionState::new(rereading.generation);
        state.reread_until = rereading.until.filter(|until| *until > offset);
        self.driver
            .open(partition, self.settings.max_records, state);
        if let Some(window) = self.driver.window_mut(&partition) {
            window.pipeline.skip_to(offset);
        }
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&self.settings.topic, partition);
        if let Err(e) = self.consumer.resume(&tpl) {
            tracing::warn!(partition, error = %e, "resume of a re-read partition failed");
        }
        self.waker.wake(partition);
    }

    /// Follows the re-reads still behind the position their old window had reached.
    pub(super) fn reread_progress(&mut self) {
        for (partition, window) in self.driver.windows_mut() {
            let Some(until) = window.state.reread_until else {
                continue;
            };
            let position = window.pipeline.watermark().unwrap_or(until);
            let behind = (until - position).max(0);
            RereadBehind {
                partition: *partition,
                behind,
                until,
            }
            .emit();
            if behind == 0 {
                window.state.reread_until = None;
            }
        }
    }
}
