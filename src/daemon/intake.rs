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
//!
//! Each record leaves this thread with its source position (SPEC 7.2): the log's identity
//! (`log_identity`), read again whenever partitions are assigned (a recreated topic or a new
//! cluster is assigned anew) before any record polled after the assignment is tagged, and the
//! record's partition and offset. While the identity cannot be read, records carry no position.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::Offset;
use tokio::sync::mpsc;

use super::events::{Event, UnknownFields};
use super::kafka::{DaemonContext, GroupEvent};
use super::log_identity;
use crate::ingest::{decode, DecodeError, DecodeOptions, DispatchRecord};
use crate::model::LogId;

/// Most records in one batch.
pub const MAX_BATCH_RECORDS: usize = 512;
/// Most payload bytes in one batch (a batch always holds at least one record). Small enough that
/// the batches in transit, decoded, stay about 3 MiB (they are the in-flight budget's overshoot);
/// large enough that records of up to 512 bytes still travel [`MAX_BATCH_RECORDS`] at a time.
pub(crate) const MAX_BATCH_BYTES: usize = 256 << 10;
/// Batches waiting between the poll thread and the engine: one to take while the next is built.
pub(crate) const CHANNEL_BATCHES: usize = 2;

/// One record copied out of librdkafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// The record's Kafka timestamp (ms), when it has one.
    pub timestamp_ms: Option<i64>,
    /// The identity of the log it was read from, when it could be read (`log_identity`).
    pub log: Option<LogId>,
}

impl RawRecord {
    /// Bytes held for this record.
    pub(crate) fn size(&self) -> usize {
        self.payload.len() + self.key.as_ref().map_or(0, Vec::len)
    }
}

/// A record and what its bytes decode to.
#[derive(Debug)]
pub(crate) struct Polled {
    pub raw: RawRecord,
    pub decoded: Result<DispatchRecord, DecodeError>,
}

/// What the poll thread tells the engine, in the order it happened.
#[derive(Debug)]
pub(crate) enum IntakeEvent {
    Group(GroupEvent),
    Records(Vec<Polled>),
    /// A consumer error (a broker down, a record librdkafka cannot read).
    Error(KafkaError),
    /// The consumer's position of partitions whose position moved, sent when nothing else is
    /// ready: every record below it was handed over before this event. It can be past the last
    /// record handed over: transaction markers and aborted transactions take offsets but are
    /// never delivered, and only the position says they were read.
    Positions(Vec<(i32, i64)>),
    /// A re-read the engine asked for (`DaemonContext::request_reread`): every record of the
    /// partition handed over after this event comes from `offset` on (`ok`), and none before
    /// it does. `ok` is false when the consumer refused the seek.
    Reread {
        partition: i32,
        offset: i64,
        token: u64,
        ok: bool,
    },
}

/// The running poll thread.
pub(crate) struct Intake {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Intake {
    /// Starts polling `consumer`; events arrive on the returned receiver.
    pub(crate) fn start(
        consumer: Arc<BaseConsumer<DaemonContext>>,
        options: DecodeOptions,
    ) -> std::io::Result<(Self, mpsc::Receiver<IntakeEvent>)> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("kafka-poll".to_owned())
            .spawn({
                let stop = stop.clone();
                move || {
                    poll_loop(&consumer, &tx, &stop, &options);
                    consumer.context().health().liveness.poll_stopped();
                }
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
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How long a read of the log's identity may take.
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an identity that could not be read is tried again (between assignments).
const IDENTITY_RETRY: Duration = Duration::from_secs(30);

/// The log's identity as this thread tags records with it.
struct Identity {
    log: Option<LogId>,
    /// When the last read failed; `None` after a success.
    failed_at: Option<std::time::Instant>,
}

impl Identity {
    /// Reads the identity again (an assignment, or a retry after a failure), logging a change.
    fn refresh(&mut self, consumer: &BaseConsumer<DaemonContext>) {
        let topic = consumer.context().topic();
        match log_identity::read(consumer.client(), topic, IDENTITY_TIMEOUT) {
            Ok(log) => {
                if self.log.as_ref() != Some(&log) {
                    tracing::info!(topic, log = %log, "dispatch log identity");
                }
                self.log = Some(log);
                self.failed_at = None;
            }
            Err(e) => {
                tracing::warn!(
                    topic,
                    error = %e,
                    "the dispatch log's identity cannot be read: records carry no source position until it can (they apply, and fence no zombie)"
                );
                self.log = None;
                self.failed_at = Some(std::time::Instant::now());
            }
        }
    }

    fn retry_due(&self) -> bool {
        self.failed_at
            .is_some_and(|at| at.elapsed() >= IDENTITY_RETRY)
    }
}

/// The batch being built: handed over once it holds [`MAX_BATCH_RECORDS`] records or
/// [`MAX_BATCH_BYTES`] bytes (or when nothing else is ready).
#[derive(Debug, Default)]
struct Batch {
    records: Vec<RawRecord>,
    bytes: usize,
}

impl Batch {
    /// Adds a record; true when the batch is full and goes to the engine now. A record larger
    /// than the byte limit makes a batch of its own.
    fn push(&mut self, record: RawRecord) -> bool {
        self.bytes += record.size();
        self.records.push(record);
        self.records.len() >= MAX_BATCH_RECORDS || self.bytes >= MAX_BATCH_BYTES
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn take(&mut self) -> Vec<RawRecord> {
        self.bytes = 0;
        std::mem::replace(&mut self.records, Vec::with_capacity(MAX_BATCH_RECORDS))
    }
}

fn poll_loop(
    consumer: &BaseConsumer<DaemonContext>,
    tx: &mpsc::Sender<IntakeEvent>,
    stop: &AtomicBool,
    options: &DecodeOptions,
) {
    let mut identity = Identity {
        log: None,
        failed_at: None,
    };
    let liveness = &consumer.context().health().liveness;
    // Every hand-over to the engine waits on it: that wait is the engine's to account for.
    let send = |event: IntakeEvent| {
        liveness.poll_waiting(true);
        let sent = tx.blocking_send(event).is_ok();
        liveness.poll_waiting(false);
        sent
    };
    let flush = |_: &mpsc::Sender<IntakeEvent>, batch: &mut Batch| flush(&send, batch, options);
    let mut batch = Batch::default();
    // The positions last sent, so an idle partition's position is sent once, not every poll.
    let mut sent: HashMap<i32, i64> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        liveness.poll_beat();
        // Block for the first record of a batch, then take whatever else is ready.
        let timeout = if batch.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        // A re-read: the records of the partition polled so far go first, then the seek, then
        // the event; librdkafka drops what it fetched before the seek.
        for (partition, offset, token) in consumer.context().take_rereads() {
            if !flush(tx, &mut batch) {
                return;
            }
            sent.remove(&partition);
            let ok = match consumer.seek(
                consumer.context().topic(),
                partition,
                Offset::Offset(offset),
                Duration::from_secs(10),
            ) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(partition, offset, error = %e, "the partition could not be read again from the offset");
                    false
                }
            };
            let event = IntakeEvent::Reread {
                partition,
                offset,
                token,
                ok,
            };
            if !send(event) {
                return;
            }
        }
        let polled = consumer.poll(timeout);
        // Rebalance events raised inside this poll come after the records polled before it.
        let group_events = consumer.context().take_group_events();
        if !group_events.is_empty() {
            // A partition assigned again starts a new window, which must be told its position.
            sent.clear();
            if !flush(tx, &mut batch) {
                return;
            }
            // Records polled from here on may come from a recreated topic or another cluster.
            if group_events
                .iter()
                .any(|e| matches!(e, GroupEvent::Assigned(..)))
            {
                identity.refresh(consumer);
            }
            for event in group_events {
                if !send(IntakeEvent::Group(event)) {
                    return;
                }
            }
        }
        match polled {
            Some(Ok(message)) => {
                wedge::poll();
                let record = RawRecord {
                    partition: message.partition(),
                    offset: message.offset(),
                    key: message.key().map(<[u8]>::to_vec),
                    payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    timestamp_ms: message.timestamp().to_millis(),
                    log: identity.log.clone(),
                };
                if batch.push(record) && !flush(tx, &mut batch) {
                    return;
                }
            }
            Some(Err(error)) => {
                if !flush(tx, &mut batch) || !send(IntakeEvent::Error(error)) {
                    return;
                }
                // A persistent error (an unreadable record) comes back at once: do not spin.
                std::thread::sleep(Duration::from_millis(100));
            }
            None => {
                if !flush(tx, &mut batch) {
                    return;
                }
                if identity.retry_due() {
                    identity.refresh(consumer);
                }
                let moved = moved_positions(consumer, &mut sent);
                if !moved.is_empty() && !send(IntakeEvent::Positions(moved)) {
                    return;
                }
            }
        }
    }
}

/// The positions of the assigned partitions of the topic that moved since `sent`.
fn moved_positions(
    consumer: &BaseConsumer<DaemonContext>,
    sent: &mut HashMap<i32, i64>,
) -> Vec<(i32, i64)> {
    let Ok(positions) = consumer.position() else {
        return Vec::new();
    };
    let topic = consumer.context().topic();
    let mut moved = Vec::new();
    for element in positions.elements() {
        if element.topic() != topic {
            continue;
        }
        if let Offset::Offset(position) = element.offset() {
            if sent.insert(element.partition(), position) != Some(position) {
                moved.push((element.partition(), position));
            }
        }
    }
    moved
}

/// Decodes the batch, tags each record with its source position, and hands it over; false
/// when the engine is gone.
fn flush(send: &dyn Fn(IntakeEvent) -> bool, batch: &mut Batch, options: &DecodeOptions) -> bool {
    if batch.is_empty() {
        return true;
    }
    let records: Vec<Polled> = batch
        .take()
        .into_iter()
        .map(|raw| {
            let decoded = decode(&raw.payload, options).map(|decoded| {
                UnknownFields(&decoded.unknown_fields).emit();
                decoded
                    .record
                    .at_position(raw.log.as_ref(), raw.partition, raw.offset)
            });
            Polled { raw, decoded }
        })
        .collect();
    send(IntakeEvent::Records(records))
}

/// A fault-injection point for the liveness tests: with `MATERIALIZER_WEDGE=poll` (test
/// builds), the poll thread blocks for good on the first record it polls.
mod wedge {
    #[cfg(not(feature = "failpoints"))]
    pub(super) fn poll() {}

    #[cfg(feature = "failpoints")]
    pub(super) fn poll() {
        if std::env::var("MATERIALIZER_WEDGE").as_deref() == Ok("poll") {
            eprintln!("the poll thread is wedged");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, bytes: usize) -> RawRecord {
        RawRecord {
            partition: 0,
            offset,
            key: None,
            payload: vec![b'x'; bytes],
            timestamp_ms: None,
            log: None,
        }
    }

    /// Fills a batch with `count` records of `bytes` each; answers after which record it was
    /// full (1-based), if it was.
    fn full_after(count: usize, bytes: usize) -> Option<usize> {
        let mut batch = Batch::default();
        (1..=count).find(|&i| batch.push(record(i as i64, bytes)))
    }

    #[test]
    fn a_batch_is_full_at_exactly_its_byte_limit() {
        let each = MAX_BATCH_BYTES / 4;
        assert_eq!(full_after(4, each), Some(4), "exact");
        let mut batch = Batch::default();
        for i in 0..3 {
            assert!(!batch.push(record(i, each)));
        }
        assert!(!batch.push(record(3, each - 1)), "one byte short");
        assert!(batch.push(record(4, 1)), "the limit reached");
        assert_eq!(batch.take().len(), 5);
        assert!(batch.is_empty());
        // Taking resets the count: the next batch starts from zero.
        assert!(!batch.push(record(5, each - 1)));
        assert!(batch.push(record(6, MAX_BATCH_BYTES + 1)), "one byte over");
    }

    #[test]
    fn a_record_over_the_byte_limit_is_a_batch_of_its_own() {
        assert_eq!(full_after(3, MAX_BATCH_BYTES + 1), Some(1));
        assert_eq!(full_after(3, MAX_BATCH_BYTES), Some(1));
        assert_eq!(full_after(3, MAX_BATCH_BYTES - 1), Some(2));
    }

    #[test]
    fn a_batch_is_full_at_exactly_its_record_limit() {
        assert_eq!(full_after(MAX_BATCH_RECORDS - 1, 10), None);
        assert_eq!(full_after(MAX_BATCH_RECORDS, 10), Some(MAX_BATCH_RECORDS));
        assert_eq!(
            full_after(MAX_BATCH_RECORDS + 1, 10),
            Some(MAX_BATCH_RECORDS)
        );
    }
}
