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
//! record's partition and offset. Positions are never forgotten (SPEC 7.3): while the identity
//! cannot be read, records are **held**, never handed over without a position — a positionless
//! write would lose the fence a later zombie write is judged by, and tagging with the last
//! identity read would compare a recreated topic's offsets with the old log's. Holding is a seek
//! back to the first record not handed over ([`Held`]); the identity is read again every
//! [`IDENTITY_RETRY`] meanwhile, and the partition's position is not reported, so nothing past
//! the held record is committed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::events::{
    Event, PartitionGrowthDone, PartitionGrowthLeft, PartitionGrowthWait, RecordsLost,
    RecordsLostAccepted, StoreWentBack, UnknownFields,
};
use super::kafka::{DaemonContext, GroupEvent};
use super::log_identity;
use super::partition_growth::{self, Gates};
use super::records_lost::{Continuity, Loss};
use crate::config::OnRecordsLost;
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

/// The store's record of how far it holds each partition (`store::redis::applied`), read at
/// each assignment from this thread (`Handle::block_on`: the store is async).
pub(crate) type Applied = (Arc<dyn crate::store::MailboxStore>, tokio::runtime::Handle);

/// The running poll thread.
pub(crate) struct Intake {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Intake {
    /// Starts polling `consumer`; events arrive on the returned receiver.
    /// `known`: the log's identity when the caller knows it in advance (the demo's mock
    /// cluster, which answers no DescribeTopics); otherwise it is read on each assignment.
    /// `order_growth`: partitions new to the group wait for the older ones' commits
    /// (`partition_growth`), `None` when nothing is committed (the memory store); its value is
    /// `kafka.growth_allowance_ms`.
    pub(crate) fn start(
        consumer: Arc<BaseConsumer<DaemonContext>>,
        options: DecodeOptions,
        known: Option<LogId>,
        on_records_lost: OnRecordsLost,
        order_growth: Option<Duration>,
        applied: Option<Applied>,
    ) -> std::io::Result<(Self, mpsc::Receiver<IntakeEvent>)> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("kafka-poll".to_owned())
            .spawn({
                let stop = stop.clone();
                move || {
                    poll_loop(
                        &consumer,
                        &tx,
                        &stop,
                        &options,
                        (known, on_records_lost, order_growth, applied),
                    );
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
/// How often an identity that could not be read is tried again while records wait for it.
const IDENTITY_RETRY: Duration = Duration::from_secs(2);

/// The log's identity as this thread tags records with it.
struct Identity {
    log: Option<LogId>,
    /// Given by the caller: never read (see [`Intake::start`]).
    fixed: bool,
    /// When the last read failed; `None` after a success.
    failed_at: Option<std::time::Instant>,
}

impl Identity {
    /// Reads the identity again (an assignment, or a retry after a failure), logging a change.
    /// A failed read leaves no identity: records wait until one is read (see the module).
    fn refresh(&mut self, consumer: &BaseConsumer<DaemonContext>) {
        if self.fixed {
            return;
        }
        let topic = consumer.context().topic();
        match read_identity(consumer, topic) {
            Ok(log) => {
                if self.log.as_ref() != Some(&log) {
                    tracing::info!(topic, log = %log, "dispatch log identity");
                }
                if self.failed_at.is_some() {
                    tracing::info!(topic, log = %log, "the dispatch log's identity is read again: held records flow");
                }
                self.log = Some(log);
                self.failed_at = None;
            }
            Err(e) => {
                if self.failed_at.is_none() {
                    tracing::warn!(
                        topic,
                        error = %e,
                        "the dispatch log's identity cannot be read: records wait until it can (a record never applies without its source position); retrying every {IDENTITY_RETRY:?}"
                    );
                }
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

/// The identity read, or a fault injected by a test (`MATERIALIZER_FAIL_IDENTITY`, failpoints
/// builds: see `fault::identity`).
fn read_identity(
    consumer: &BaseConsumer<DaemonContext>,
    topic: &str,
) -> Result<LogId, log_identity::LogIdentityError> {
    fault::identity(topic)?;
    log_identity::read(consumer.client(), topic, IDENTITY_TIMEOUT)
}

/// Why a partition's records wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The log's identity is unknown (see the module).
    Identity,
    /// The log deleted records before they were read, and `kafka.on_records_lost = "hold"`:
    /// the partition waits (paused) until an operator accepts the loss.
    Lost,
    /// The partition appeared with a growth of the topic: it waits (paused) until the older
    /// partitions are consumed past the records written before it (`partition_growth`).
    Growth,
    /// The store went back in time (SPEC 7.3): it holds the partition only below the offset of
    /// the hold, while the group committed further. The first record polled is dropped and the
    /// partition sought back there, so the lost writes are applied again.
    Rewind,
}

impl Why {
    /// Which of two holds of one partition stays: one only an operator lifts outlasts one that
    /// lifts itself once the older partitions are consumed, which outlasts an identity hold.
    fn rank(self) -> u8 {
        match self {
            Why::Identity => 0,
            Why::Growth => 1,
            Why::Lost => 2,
            Why::Rewind => 3,
        }
    }
}

/// Partitions whose records wait: each at the offset of its first record not handed over, which
/// the consumer is sought back to. Bound: one entry per assigned partition.
#[derive(Debug, Default)]
struct Held {
    at: HashMap<i32, (i64, Why)>,
}

impl Held {
    /// A record at `offset` polled while its partition must wait for `why`: true when the
    /// consumer must be sought back to it (the first held record of its partition, or one the
    /// consumer delivers again after a seek); false for a later record fetched before the seek
    /// took effect (dropped: the seek brings it again).
    fn hold(&mut self, partition: i32, offset: i64, why: Why) -> bool {
        let why = match self.at.get(&partition) {
            Some((first, _)) if offset > *first => return false,
            Some((_, held)) if held.rank() > why.rank() => *held,
            _ => why,
        };
        self.at.insert(partition, (offset, why));
        true
    }

    /// Why `partition` waits, if it does.
    fn why(&self, partition: i32) -> Option<Why> {
        self.at.get(&partition).map(|(_, why)| *why)
    }

    fn holds(&self, partition: i32) -> bool {
        self.at.contains_key(&partition)
    }

    fn forget(&mut self, partitions: &[i32]) {
        for partition in partitions {
            self.at.remove(partition);
        }
    }

    fn clear(&mut self) {
        self.at.clear();
    }

    /// The partitions held for `why` among `only` (`None`: all), removed: `(partition, offset)`.
    fn release(&mut self, why: Why, only: Option<&[i32]>) -> Vec<(i32, i64)> {
        let released: Vec<(i32, i64)> = self
            .at
            .iter()
            .filter(|(p, (_, w))| *w == why && only.is_none_or(|only| only.contains(p)))
            .map(|(p, (offset, _))| (*p, *offset))
            .collect();
        for (partition, _) in &released {
            self.at.remove(partition);
        }
        released
    }
}

/// Once the identity is known, the partitions held for it flow again from their first held
/// record (librdkafka drops what it fetched before a seek, so nothing later comes first).
fn release(
    consumer: &BaseConsumer<DaemonContext>,
    identity: &Identity,
    held: &mut Held,
    sent: &mut HashMap<i32, i64>,
) {
    if identity.log.is_none() {
        return;
    }
    for (partition, offset) in held.release(Why::Identity, None) {
        sent.remove(&partition);
        seek_back(consumer, partition, offset);
    }
}

/// Pauses or resumes `partition` at the consumer (a hold for lost records or a growth, see
/// [`Why`]).
fn set_paused(consumer: &BaseConsumer<DaemonContext>, partition: i32, paused: bool) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(consumer.context().topic(), partition);
    let result = if paused {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    };
    if let Err(e) = result {
        tracing::warn!(partition, paused, error = %e, "a held partition could not be paused or resumed");
    }
}

/// The committed offsets of `partitions` (those with one), read at their assignment.
fn committed_offsets(
    consumer: &BaseConsumer<DaemonContext>,
    partitions: &[i32],
) -> HashMap<i32, Option<i64>> {
    let topic = consumer.context().topic();
    let mut tpl = TopicPartitionList::new();
    for partition in partitions {
        tpl.add_partition(topic, *partition);
    }
    match consumer.committed_offsets(tpl, IDENTITY_TIMEOUT) {
        Ok(committed) => partitions
            .iter()
            .map(|p| {
                let offset = committed
                    .find_partition(topic, *p)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                (*p, offset)
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the committed offsets of the assigned partitions could not be read: records lost before the first record read are not detected this time");
            HashMap::new()
        }
    }
}

/// How far the group consumed each of `partitions` (`partition_growth`): its committed offset.
/// `None` when the group's offsets could not be read.
fn group_progress(
    consumer: &BaseConsumer<DaemonContext>,
    partitions: &[i32],
) -> Option<BTreeMap<i32, i64>> {
    let committed = committed_offsets(consumer, partitions);
    if committed.is_empty() && !partitions.is_empty() {
        return None;
    }
    Some(
        committed
            .into_iter()
            .filter_map(|(p, offset)| offset.map(|o| (p, o)))
            .collect(),
    )
}

/// SPEC 7.3, a store that went back in time: the store's record of how far it holds each
/// assigned partition (`store::redis::applied`) below the group's committed offset means the
/// writes between were lost (a failover to a replica behind, an older snapshot). Such a
/// partition is held for [`Why::Rewind`]: its first record is dropped and the partition read
/// again from the record, so the lost writes are applied again (replays are idempotent).
fn went_back(
    consumer: &BaseConsumer<DaemonContext>,
    (store, runtime): &Applied,
    assigned: &[(i32, Option<i64>)],
    held: &mut Held,
) {
    let topic = consumer.context().topic();
    let with_commit: Vec<i32> = assigned
        .iter()
        .filter(|(_, c)| c.is_some())
        .map(|(p, _)| *p)
        .collect();
    if with_commit.is_empty() {
        return;
    }
    let records = match runtime.block_on(store.applied(topic, &with_commit)) {
        Ok(records) => records,
        Err(e) => {
            tracing::warn!(error = %e, "the store's record of what it holds could not be read: a store that went back in time is not detected at this assignment");
            return;
        }
    };
    for (partition, committed) in assigned {
        let (Some(committed), Some(held_below)) = (committed, records.get(partition)) else {
            continue;
        };
        if held_below < committed {
            StoreWentBack {
                partition: *partition,
                holds_below: *held_below,
                committed: *committed,
            }
            .emit();
            held.at.insert(*partition, (*held_below, Why::Rewind));
        }
    }
}

/// Where each of `partitions` stands at `timestamp` (ms): the first offset whose timestamp is at
/// or after it, or the end offset when none is (every record there is older). Without a
/// timestamp, the end offsets. `None` when one cannot be read.
fn ends_at(
    consumer: &BaseConsumer<DaemonContext>,
    partitions: &[i32],
    timestamp: Option<i64>,
) -> Option<BTreeMap<i32, i64>> {
    let topic = consumer.context().topic();
    let mut at = BTreeMap::new();
    if let Some(timestamp) = timestamp {
        let mut tpl = TopicPartitionList::new();
        for partition in partitions {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(timestamp));
        }
        match consumer.offsets_for_times(tpl, Duration::from_secs(5)) {
            Ok(found) => {
                for element in found.elements() {
                    if let Offset::Offset(offset) = element.offset() {
                        at.insert(element.partition(), offset);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the older partitions' offsets for a grown partition's first record could not be read: it waits on");
                return None;
            }
        }
    }
    for partition in partitions {
        if at.contains_key(partition) {
            continue;
        }
        match consumer.fetch_watermarks(topic, *partition, Duration::from_secs(5)) {
            Ok((_, high)) => {
                at.insert(*partition, high);
            }
            Err(e) => {
                tracing::warn!(partition, error = %e, "an older partition's end offset could not be read: the grown partition waits on");
                return None;
            }
        }
    }
    Some(at)
}

/// A record (at `offset`, written at `timestamp`) of a partition new to the group was polled:
/// the partition is held there (paused, sought back), and its wait begins once the older
/// partitions' offsets at that timestamp are read; it is checked at once.
fn on_growth_record(
    consumer: &BaseConsumer<DaemonContext>,
    gates: &mut Gates,
    held: &mut Held,
    sent: &mut HashMap<i32, i64>,
    (partition, offset, timestamp): (i32, i64, Option<i64>),
) {
    if held.hold(partition, offset, Why::Growth) {
        set_paused(consumer, partition, true);
        seek_back(consumer, partition, offset);
    }
    let Some(gate) = gates.gate(partition) else {
        return;
    };
    if gate.ends.is_some() {
        return;
    }
    let older = gate.older.clone();
    if let Some(ends) = ends_at(consumer, &older, timestamp) {
        gates.begin(partition, ends);
        check_growth(consumer, gates, held, sent);
    }
}

/// Reads the older partitions' end offsets for the waiting partitions whose allowance passed
/// (`partition_growth::Gate::seen`).
fn read_seen(consumer: &BaseConsumer<DaemonContext>, gates: &mut Gates) {
    for (partition, older) in gates.seen_due() {
        if let Some(seen) = ends_at(consumer, &older, None) {
            gates.seen(partition, seen);
        }
    }
}

/// Reads the older partitions' progress for every grown partition whose check is due, and lets
/// those whose older partitions all reached their ends flow from where they were held.
fn check_growth(
    consumer: &BaseConsumer<DaemonContext>,
    gates: &mut Gates,
    held: &mut Held,
    sent: &mut HashMap<i32, i64>,
) {
    let due = gates.due();
    if due.is_empty() {
        return;
    }
    let mut older: Vec<i32> = due
        .iter()
        .flat_map(|(_, ends)| ends.keys().copied())
        .collect();
    older.sort_unstable();
    older.dedup();
    let Some(progress) = group_progress(consumer, &older) else {
        return;
    };
    let health = consumer.context().health();
    for (partition, ends) in due {
        let short = partition_growth::short_of(&ends, &progress);
        if !short.is_empty() {
            if gates.announce(partition) {
                PartitionGrowthWait {
                    partition,
                    ends: ends.clone(),
                }
                .emit();
            }
            health.growth_waiting(partition, short);
            continue;
        }
        let (waited, named) = gates.release(partition).unwrap_or_default();
        health.growth_done(&[partition]);
        for (partition, offset) in held.release(Why::Growth, Some(&[partition])) {
            sent.remove(&partition);
            seek_back(consumer, partition, offset);
            set_paused(consumer, partition, false);
        }
        if named {
            PartitionGrowthDone { partition, waited }.emit();
        }
    }
}

/// The log's start of `partition` (see `records_lost`): from the last fetch, else the broker.
fn log_start(consumer: &BaseConsumer<DaemonContext>, partition: i32) -> Option<i64> {
    let topic = consumer.context().topic();
    super::kafka_ffi::cached_log_start(consumer.client(), topic, partition).or_else(|| {
        consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(5))
            .ok()
            .map(|(low, _)| low)
    })
}

/// What the poll thread does about a loss: names and counts it, and under `hold` holds the
/// partition at `at` (paused, sought back); true when it holds.
fn on_loss(
    consumer: &BaseConsumer<DaemonContext>,
    loss: Loss,
    policy: OnRecordsLost,
    at: i64,
    held: &mut Held,
) -> bool {
    let hold = policy == OnRecordsLost::Hold;
    RecordsLost { loss, held: hold }.emit();
    let health = consumer.context().health();
    if !hold {
        health.records_lost_carried_on(loss.partition, loss.from, loss.to);
        return false;
    }
    health.records_lost_held(loss.partition, loss.from, loss.to);
    held.hold(loss.partition, at, Why::Lost);
    set_paused(consumer, loss.partition, true);
    seek_back(consumer, loss.partition, at);
    true
}

/// The held-for-loss partitions an operator accepted flow again from where they were held.
fn release_accepted(
    consumer: &BaseConsumer<DaemonContext>,
    held: &mut Held,
    sent: &mut HashMap<i32, i64>,
) {
    let accepted = consumer.context().health().take_records_lost_accepted();
    if accepted.is_empty() {
        return;
    }
    for (partition, offset) in held.release(Why::Lost, Some(&accepted)) {
        sent.remove(&partition);
        seek_back(consumer, partition, offset);
        set_paused(consumer, partition, false);
        RecordsLostAccepted {
            partition,
            from: offset,
        }
        .emit();
    }
}

/// Seeks `partition` to `offset`: librdkafka drops what it fetched before, so the partition's
/// next record is the one at `offset` (a re-read, a held record).
fn seek(
    consumer: &BaseConsumer<DaemonContext>,
    partition: i32,
    offset: i64,
) -> Result<(), KafkaError> {
    consumer.seek(
        consumer.context().topic(),
        partition,
        Offset::Offset(offset),
        Duration::from_secs(10),
    )
}

/// Seeks `partition` back to `offset` (a held record, read again later).
fn seek_back(consumer: &BaseConsumer<DaemonContext>, partition: i32, offset: i64) {
    if let Err(e) = seek(consumer, partition, offset) {
        tracing::warn!(partition, offset, error = %e, "a held record's partition could not be sought back");
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
    (known, on_records_lost, order_growth, applied): (
        Option<LogId>,
        OnRecordsLost,
        Option<Duration>,
        Option<Applied>,
    ),
) {
    let mut identity = Identity {
        fixed: known.is_some(),
        log: known,
        failed_at: None,
    };
    let mut held = Held::default();
    let mut gates = Gates::default();
    let mut continuity = Continuity::default();
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
            if held.why(partition) == Some(Why::Identity) {
                held.forget(&[partition]);
            }
            continuity.reread(partition, offset);
            let ok = match seek(consumer, partition, offset) {
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
        read_seen(consumer, &mut gates);
        check_growth(consumer, &mut gates, &mut held, &mut sent);
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
            for event in &group_events {
                match event {
                    GroupEvent::Revoked(partitions) => {
                        let waiting: Vec<i32> = partitions
                            .iter()
                            .copied()
                            .filter(|p| gates.waits(*p))
                            .collect();
                        PartitionGrowthLeft(&waiting).emit();
                        held.forget(partitions);
                        gates.forget(partitions);
                        consumer.context().health().growth_done(partitions);
                        continuity.forget(partitions);
                        consumer.context().health().records_lost_forget(partitions);
                    }
                    GroupEvent::Lost => {
                        let all: Vec<i32> = held.at.keys().copied().collect();
                        consumer.context().health().records_lost_forget(&all);
                        let waiting: Vec<i32> = held.at.keys().copied().collect();
                        consumer.context().health().growth_done(&waiting);
                        held.clear();
                        gates.clear();
                        continuity.clear();
                    }
                    GroupEvent::Assigned(partitions, _) => {
                        let committed = committed_offsets(consumer, partitions);
                        let mut assigned = Vec::with_capacity(partitions.len());
                        for partition in partitions {
                            let offset = committed.get(partition).copied().flatten();
                            continuity.assigned(*partition, offset);
                            assigned.push((*partition, offset));
                        }
                        if let Some(applied) = &applied {
                            went_back(consumer, applied, &assigned, &mut held);
                        }
                        // A partition this thread paused (a hold) and that came back: librdkafka
                        // may keep an application's pause across a rebalance, and nothing here
                        // holds it any more.
                        for partition in partitions {
                            set_paused(consumer, *partition, false);
                        }
                        let Some(growth_allowance) = order_growth else {
                            continue;
                        };
                        for (partition, older) in gates.assigned(&assigned, growth_allowance) {
                            tracing::debug!(partition, ?older, "a partition new to the group: its first records wait for the older partitions' records written before them");
                        }
                        read_seen(consumer, &mut gates);
                    }
                }
            }
            if group_events
                .iter()
                .any(|e| matches!(e, GroupEvent::Assigned(..)))
            {
                identity.refresh(consumer);
                release(consumer, &identity, &mut held, &mut sent);
            }
            for event in group_events {
                if !send(IntakeEvent::Group(event)) {
                    return;
                }
            }
        }
        match polled {
            Some(Ok(message)) if held.why(message.partition()) == Some(Why::Rewind) => {
                // The store went back: the partition is read again from where it holds it.
                let partition = message.partition();
                for (partition, from) in held.release(Why::Rewind, Some(&[partition])) {
                    // This record is dropped: the seek brings it again.
                    let from = from.min(message.offset());
                    sent.remove(&partition);
                    continuity.reread(partition, from);
                    seek_back(consumer, partition, from);
                }
            }
            Some(Ok(message)) if held.why(message.partition()) == Some(Why::Lost) => {
                // Held for lost records: the engine's resume of a partition it had paused may
                // have let records through; the partition is paused and sought back again.
                if held.hold(message.partition(), message.offset(), Why::Lost) {
                    set_paused(consumer, message.partition(), true);
                    seek_back(consumer, message.partition(), message.offset());
                }
            }
            Some(Ok(message)) if gates.waits(message.partition()) => {
                on_growth_record(
                    consumer,
                    &mut gates,
                    &mut held,
                    &mut sent,
                    (
                        message.partition(),
                        message.offset(),
                        message.timestamp().to_millis(),
                    ),
                );
            }
            Some(Ok(message)) if identity.log.is_none() => {
                // No identity: the record waits (see the module), and so does every later one
                // of its partition.
                if held.hold(message.partition(), message.offset(), Why::Identity) {
                    seek_back(consumer, message.partition(), message.offset());
                    std::thread::sleep(Duration::from_millis(100));
                }
                if identity.retry_due() || identity.failed_at.is_none() {
                    identity.refresh(consumer);
                    release(consumer, &identity, &mut held, &mut sent);
                }
            }
            Some(Ok(message)) => {
                wedge::poll();
                let (partition, offset) = (message.partition(), message.offset());
                let loss = continuity.reached(partition, offset, offset + 1, || {
                    log_start(consumer, partition)
                });
                if let Some(loss) = loss {
                    if on_loss(consumer, loss, on_records_lost, offset, &mut held) {
                        continue;
                    }
                }
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
                    release(consumer, &identity, &mut held, &mut sent);
                }
                release_accepted(consumer, &mut held, &mut sent);
                let mut moved = moved_positions(consumer, &mut sent, &held);
                // A position past records never read (no record after them to show it).
                moved.retain(|&(partition, position)| {
                    let loss = continuity.reached(partition, position, position, || {
                        log_start(consumer, partition)
                    });
                    !loss.is_some_and(|loss| {
                        on_loss(consumer, loss, on_records_lost, position, &mut held)
                    })
                });
                if !moved.is_empty() && !send(IntakeEvent::Positions(moved)) {
                    return;
                }
            }
        }
    }
}

/// The positions of the assigned partitions of the topic that moved since `sent`; never a held
/// partition's (its position may be past records not handed over).
fn moved_positions(
    consumer: &BaseConsumer<DaemonContext>,
    sent: &mut HashMap<i32, i64>,
    held: &Held,
) -> Vec<(i32, i64)> {
    let Ok(positions) = consumer.position() else {
        return Vec::new();
    };
    let topic = consumer.context().topic();
    let mut moved = Vec::new();
    for element in positions.elements() {
        if element.topic() != topic || held.holds(element.partition()) {
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

/// Fault-injection points of the identity read (failpoints builds).
mod fault {
    use super::log_identity::LogIdentityError;

    #[cfg(not(feature = "failpoints"))]
    pub(super) fn identity(_topic: &str) -> Result<(), LogIdentityError> {
        Ok(())
    }

    /// With `MATERIALIZER_FAIL_IDENTITY=<ms>`, every read of the log's identity fails during the
    /// first `<ms>` milliseconds after the process's first read (a broker roll that times
    /// DescribeTopics out).
    #[cfg(feature = "failpoints")]
    pub(super) fn identity(topic: &str) -> Result<(), LogIdentityError> {
        use std::sync::OnceLock;
        use std::time::{Duration, Instant};
        static FIRST_READ: OnceLock<Instant> = OnceLock::new();
        let Some(window) = std::env::var("MATERIALIZER_FAIL_IDENTITY")
            .ok()
            .and_then(|ms| ms.parse::<u64>().ok())
        else {
            return Ok(());
        };
        let first = *FIRST_READ.get_or_init(Instant::now);
        if first.elapsed() < Duration::from_millis(window) {
            eprintln!("failpoint: the identity read fails");
            return Err(LogIdentityError::TimedOut {
                topic: topic.to_owned(),
                timeout: Duration::ZERO,
            });
        }
        Ok(())
    }
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
