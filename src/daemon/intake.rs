//! The poll thread: the only caller of the consumer's `poll`, feeding the engine in batches.
//!
//! One OS thread polls librdkafka, copies each record out of librdkafka's buffer, decodes it, and
//! hands the engine whole batches (up to [`MAX_BATCH_RECORDS`] records or [`MAX_BATCH_BYTES`]
//! bytes, whatever was ready) over a bounded channel: one wake-up of the engine per batch, not per
//! record, and the engine's loop never decodes nor polls — it only runs store calls and moves
//! windows. Decoding here puts the two CPU-heavy steps (decode, store call) on two threads, so
//! the daemon uses both cores of a small machine; librdkafka keeps prefetching meanwhile. Rebalance callbacks run inside `poll` on this
//! thread; their events are forwarded after the records polled before them, so the engine sees a
//! partition's records only between its `Assigned` and `Revoked`.
//!
//! Bounds: the channel holds at most [`CHANNEL_BATCHES`] batches, so besides the engine's window
//! at most `(CHANNEL_BATCHES + 2) * MAX_BATCH_BYTES` (1 MiB raw: the channel's batches, the one
//! this thread is handing over and the one the engine is admitting; plus one record beyond the
//! limit per batch, and their decoded form, about 3 MiB charged) are in transit. These bytes are
//! admitted even into a partition that was paused meanwhile, so they are the budget's overshoot:
//! kept small on purpose (4 batches of 1 MiB overshot a 64 MiB budget by 13-18 MiB). When the engine
//! falls behind, the channel fills and this thread blocks, which is the backpressure librdkafka
//! sees (its own prefetch queue is bounded by `queued.max.messages.kbytes`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use tokio::sync::mpsc;

use super::kafka::{DaemonContext, GroupEvent};
use super::metrics;
use crate::ingest::{decode, DecodeError, DecodeOptions, DispatchRecord};

/// Most records in one batch.
pub const MAX_BATCH_RECORDS: usize = 512;
/// Most payload bytes in one batch (a batch always holds at least one record). Small enough that
/// the batches in transit, decoded, stay about 3 MiB (they are the in-flight budget's overshoot);
/// large enough that records of up to 512 bytes still travel [`MAX_BATCH_RECORDS`] at a time.
pub const MAX_BATCH_BYTES: usize = 256 << 10;
/// Batches waiting between the poll thread and the engine: one to take while the next is built.
pub const CHANNEL_BATCHES: usize = 2;

/// One record copied out of librdkafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// The record's Kafka timestamp (ms), when it has one.
    pub timestamp_ms: Option<i64>,
}

impl RawRecord {
    /// Bytes held for this record.
    pub fn size(&self) -> usize {
        self.payload.len() + self.key.as_ref().map_or(0, Vec::len)
    }
}

/// A record and what its bytes decode to.
#[derive(Debug)]
pub struct Polled {
    pub raw: RawRecord,
    pub decoded: Result<DispatchRecord, DecodeError>,
}

/// What the poll thread tells the engine, in the order it happened.
#[derive(Debug)]
pub enum IntakeEvent {
    Group(GroupEvent),
    Records(Vec<Polled>),
    /// A consumer error (a broker down, a record librdkafka cannot read).
    Error(KafkaError),
}

/// The running poll thread.
pub struct Intake {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Intake {
    /// Starts polling `consumer`; events arrive on the returned receiver.
    pub fn start(
        consumer: Arc<BaseConsumer<DaemonContext>>,
        options: DecodeOptions,
    ) -> std::io::Result<(Self, mpsc::Receiver<IntakeEvent>)> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("kafka-poll".to_owned())
            .spawn({
                let stop = stop.clone();
                move || poll_loop(&consumer, &tx, &stop, &options)
            })?;
        Ok((
            Self {
                stop,
                thread: Some(thread),
            },
            rx,
        ))
    }

    /// Stops polling (records not yet handed over are dropped, uncommitted) and joins the thread.
    /// The receiver must be dropped or drained first, or a blocked hand-over waits for it.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Asks the thread to stop without waiting for it.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn poll_loop(
    consumer: &BaseConsumer<DaemonContext>,
    tx: &mpsc::Sender<IntakeEvent>,
    stop: &AtomicBool,
    options: &DecodeOptions,
) {
    let flush = |tx: &mpsc::Sender<IntakeEvent>, batch: &mut Vec<RawRecord>, bytes: &mut usize| {
        flush(tx, batch, bytes, options)
    };
    let mut batch: Vec<RawRecord> = Vec::with_capacity(MAX_BATCH_RECORDS);
    let mut batch_bytes = 0usize;
    while !stop.load(Ordering::Acquire) {
        // Block for the first record of a batch, then take whatever else is ready.
        let timeout = if batch.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        let polled = consumer.poll(timeout);
        // Rebalance events raised inside this poll come after the records polled before it.
        let group_events = consumer.context().take_group_events();
        if !group_events.is_empty() {
            if !flush(tx, &mut batch, &mut batch_bytes) {
                return;
            }
            for event in group_events {
                if tx.blocking_send(IntakeEvent::Group(event)).is_err() {
                    return;
                }
            }
        }
        match polled {
            Some(Ok(message)) => {
                let record = RawRecord {
                    partition: message.partition(),
                    offset: message.offset(),
                    key: message.key().map(<[u8]>::to_vec),
                    payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    timestamp_ms: message.timestamp().to_millis(),
                };
                batch_bytes += record.size();
                batch.push(record);
                if (batch.len() >= MAX_BATCH_RECORDS || batch_bytes >= MAX_BATCH_BYTES)
                    && !flush(tx, &mut batch, &mut batch_bytes)
                {
                    return;
                }
            }
            Some(Err(error)) => {
                if !flush(tx, &mut batch, &mut batch_bytes)
                    || tx.blocking_send(IntakeEvent::Error(error)).is_err()
                {
                    return;
                }
                // A persistent error (an unreadable record) comes back at once: do not spin.
                std::thread::sleep(Duration::from_millis(100));
            }
            None => {
                if !flush(tx, &mut batch, &mut batch_bytes) {
                    return;
                }
            }
        }
    }
}

/// Decodes the batch and hands it over; false when the engine is gone.
fn flush(
    tx: &mpsc::Sender<IntakeEvent>,
    batch: &mut Vec<RawRecord>,
    bytes: &mut usize,
    options: &DecodeOptions,
) -> bool {
    if batch.is_empty() {
        return true;
    }
    *bytes = 0;
    let records: Vec<Polled> = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH_RECORDS))
        .into_iter()
        .map(|raw| {
            let decoded = decode(&raw.payload, options).map(|decoded| {
                if !decoded.unknown_fields.is_empty() {
                    metrics::unknown_fields(&decoded.unknown_fields);
                }
                decoded.record
            });
            Polled { raw, decoded }
        })
        .collect();
    tx.blocking_send(IntakeEvent::Records(records)).is_ok()
}
