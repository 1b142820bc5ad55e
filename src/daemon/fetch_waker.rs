//! Restarts librdkafka's fetcher promptly after the engine resumes a partition.
//!
//! librdkafka applies a resume on its main thread but does not wake the broker thread that
//! fetches the partition: when every partition that broker serves was paused, that thread sleeps
//! on its socket for up to one second (a constant in librdkafka) before it sees the resume. In a
//! catch-up every partition fills its share of the budget and is paused at about the same time,
//! so each pause cost the daemon up to a second with an empty window (measured: the in-flight
//! bytes sat at zero for 400-800 ms after every resume, and 4 KB records caught up into Redis at
//! half the rate of a budget four times larger).
//!
//! Any request queued to that broker wakes its thread, so after a resume this module asks the
//! partition's leader for the partition's watermarks (one small `ListOffsets` round trip, on a
//! thread of its own because the call blocks). Bound: one thread, at most
//! [`MAX_PENDING_WAKES`] partitions waiting; a wake that does not fit is dropped, and the fetcher
//! then starts within librdkafka's own second.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::kafka::DaemonContext;

/// Partitions waiting for their wake-up request.
pub(crate) const MAX_PENDING_WAKES: usize = 64;
/// How long one wake-up request may take; it only matters that it was sent.
const WAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The handle the engine keeps; dropping it ends the thread.
pub(crate) struct FetchWaker {
    tx: Option<SyncSender<i32>>,
}

impl FetchWaker {
    /// Starts the thread; without one (the system refused it) resumes keep librdkafka's delay.
    pub(crate) fn start(consumer: Arc<BaseConsumer<DaemonContext>>, topic: Arc<str>) -> Self {
        let (tx, rx) = sync_channel::<i32>(MAX_PENDING_WAKES);
        // Weak: the daemon's shutdown closes the consumer when it drops its handle, not when
        // this thread lets go of it.
        let consumer: Weak<BaseConsumer<DaemonContext>> = Arc::downgrade(&consumer);
        let spawned = std::thread::Builder::new()
            .name("kafka-fetch-waker".to_owned())
            .spawn(move || {
                while let Ok(partition) = rx.recv() {
                    let Some(consumer) = consumer.upgrade() else {
                        return;
                    };
                    if let Err(e) = consumer.fetch_watermarks(&topic, partition, WAKE_TIMEOUT) {
                        tracing::debug!(partition, error = %e, "fetcher wake-up request failed");
                    }
                }
            });
        match spawned {
            Ok(_) => Self { tx: Some(tx) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the fetcher wake-up thread; a resumed partition may wait up to a second for its next fetch");
                Self { tx: None }
            }
        }
    }

    /// Wakes the broker thread that fetches `partition`, which was just resumed.
    pub(crate) fn wake(&self, partition: i32) {
        if let Some(tx) = &self.tx {
            match tx.try_send(partition) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => {
                    tracing::debug!(partition, "fetcher wake-up thread gone");
                }
            }
        }
    }
}
