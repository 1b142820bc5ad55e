//! Graceful hand-over of revoked partitions (SPEC 7.2).
//!
//! librdkafka runs the revoke callback on the poll thread, inside `poll`. The callback sends the
//! engine a [`Handover`] and waits (bounded) for its answer before it lets the revoke complete:
//!
//! 1. the engine cancels the revoked partitions at once: no new store call starts for them (a
//!    queued or backing-off attempt never reaches the store, and records still in transit are
//!    dropped, uncommitted);
//! 2. it keeps serving the store calls and dead letters already sent for them until none is left
//!    or `kafka.shutdown_deadline_ms` passes, so their records can still become final;
//! 3. it stores each partition's final watermark and answers with it; the callback commits
//!    those offsets synchronously, then returns, and only then does the next owner start reading.
//!
//! The next owner therefore resumes exactly where this replica's final records end, instead of at
//! the last periodic commit: a rolling restart re-applies only what was still in flight at the
//! deadline (idempotent replay makes even that harmless).

use std::time::Duration;

use super::Engine;

use crate::daemon::kafka::Handover;

/// A hand-over in progress.
pub(super) struct Pending {
    handover: Handover,
    deadline: tokio::time::Instant,
}

impl Pending {
    pub(super) fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }
}

impl Engine {
    /// Step 1: nothing new starts for the revoked partitions.
    pub(super) fn begin_handover(&mut self, mut handover: Handover) {
        let generation = handover.generation;
        handover.partitions.retain(|partition| {
            let newer = self
                .driver
                .window(partition)
                .is_some_and(|w| w.state.generation > generation);
            if newer {
                tracing::info!(
                    partition,
                    "a hand-over of an earlier assignment arrived after the partition was assigned again: the new assignment keeps it"
                );
            }
            !newer
        });
        for partition in &handover.partitions {
            self.driver.begin_close(partition);
        }
        let in_flight: usize = handover
            .partitions
            .iter()
            .filter_map(|p| self.driver.window(p))
            .map(|w| w.calls() + w.state.letters)
            .sum();
        tracing::info!(partitions = ?handover.partitions, in_flight, "revoke: handing over once the calls already sent finish");
        let deadline = if handover.lost {
            tokio::time::Instant::now()
        } else {
            tokio::time::Instant::now() + self.settings.shutdown_deadline
        };
        self.handovers.push(Pending { handover, deadline });
    }

    /// Steps 2 and 3 for every hand-over whose calls are done or whose deadline passed. Call
    /// after [`Engine::advance`], so the watermarks include everything final.
    pub(super) fn finish_handovers(&mut self) {
        if self.handovers.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.handovers)
            .into_iter()
            .partition(|pending| {
                now >= pending.deadline
                    || pending.handover.partitions.iter().all(|p| {
                        self.driver
                            .window(p)
                            .is_none_or(|w| w.calls() == 0 && w.state.letters == 0)
                    })
            });
        self.handovers = waiting;
        for pending in ready {
            let Pending {
                mut handover,
                deadline,
            } = pending;
            // A newer assignment of a partition since `begin_handover` keeps its window.
            let generation = handover.generation;
            handover.partitions.retain(|partition| {
                self.driver
                    .window(partition)
                    .is_none_or(|w| w.state.generation <= generation)
            });
            let mut watermarks = Vec::new();
            for partition in &handover.partitions {
                let Some(window) = self.driver.window(partition) else {
                    continue;
                };
                if self.settings.commit_offsets && !handover.lost {
                    if let Some(watermark) = window.pipeline.watermark() {
                        watermarks.push((*partition, watermark));
                    }
                }
                let in_flight = window.calls() + window.state.letters;
                if now >= deadline && !handover.lost && in_flight > 0 {
                    tracing::warn!(
                        partition,
                        in_flight,
                        "revoke: hand-over deadline passed with calls in flight; their records are left to the next owner"
                    );
                }
            }
            self.revoke(handover.partitions.clone());
            tracing::info!(final_offsets = ?watermarks, "revoke: handed over");
            if watermarks.is_empty() || !self.store.keeps_applied() {
                let _ = handover.done.try_send(watermarks);
                continue;
            }
            // The store's record of what it holds goes first (see `Engine::record_applied`);
            // the callback commits the watermarks once answered.
            for (partition, _) in &watermarks {
                self.unstored.remove(partition);
            }
            let with_floors = self.with_floors(&watermarks);
            for (partition, _) in &watermarks {
                self.recorded.remove(partition);
            }
            let store = self.store.clone();
            let topic = self.settings.topic.clone();
            tokio::spawn(async move {
                let mut watermarks = watermarks;
                match store.record_applied(&topic, &with_floors).await {
                    // A partition the store holds below this process's record went back in
                    // time: its watermark is not committed, and the next owner's assignment
                    // check reads it again from what the store holds (`went_back.rs`).
                    Ok(behind) => watermarks.retain(|(p, _)| !behind.contains_key(p)),
                    Err(e) => {
                        tracing::warn!(error = %e, "revoke: the store's record of what it holds could not be written; the next owner may read a few records again")
                    }
                }
                let _ = handover.done.try_send(watermarks);
            });
        }
    }

    /// How long the poll thread waits for a hand-over's answer: the engine's deadline plus a
    /// margin for the last call's answer.
    pub(crate) fn handover_wait(shutdown_deadline: Duration) -> Duration {
        shutdown_deadline + Duration::from_secs(2)
    }
}
