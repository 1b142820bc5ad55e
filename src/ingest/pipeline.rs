//! The ordering core of one source (a Kafka partition, an `apply` input, a replay): each record's
//! lifecycle from admission to committable, free of Kafka, of the store and of the clock so it can
//! be tested alone.
//!
//! A record's life:
//!
//! 1. **Admitted** in source order (offsets strictly increase; an older offset is a redelivery and
//!    is ignored) into a bounded window, with the raw bytes it would need for a dead letter.
//! 2. Its **deliveries** join the **lane** of their user: all epochs of a user share one lane (so an
//!    epoch move stays ordered with the older epoch's records), lanes run concurrently. A lane
//!    hands out one **run** at a time, from its front in source order: the appends waiting there
//!    for one mailbox, each seq once (at most [`RUN_MAX_GROUPS`] and [`RUN_MAX_BYTES`] of payload), or one
//!    truncate; the next run only once every delivery of the last one is back. A lane with
//!    something to run joins the window's **ready** queue, and its run is formed only when the
//!    caller takes it ([`PartitionPipeline::take_run`]), as late as the store's capacity allows:
//!    what arrives in the meantime rides along. A delivery
//!    leaves its lane only with a final result ([`Disposition::is_final`]): retries, fences and
//!    corrupt mailboxes keep it at the lane's head, and the deliveries of its run behind it
//!    that the store did not reach ([`PartitionPipeline::not_reached`]) wait for the next run.
//! 3. **Settled** when every delivery is final. A record with a refused delivery (or a malformed
//!    one) then needs a dead letter; otherwise it is final at once.
//! 4. **Final** once its dead letter (if any) is acknowledged: its raw bytes are released.
//! 5. **Committable** when every record before it is final too: [`PartitionPipeline::pop_final`]
//!    hands out final records from the front of the window in source order, and the
//!    **watermark** — the first offset not yet final — is the only offset that may be committed.
//!    A blocked (corrupt) mailbox therefore holds the commit at its record while other lanes keep
//!    flowing until the window is full.
//!
//! Bounds: the window holds at most `max_records` records (final or not); [`bytes`] counts their
//! size from admission until they leave, for the caller's byte budget; lanes exist only for users
//! with a delivery in the window.
//!
//! The caller pauses its source when [`PartitionPipeline::is_full`] and resumes it below
//! [`PartitionPipeline::drained_to_half`] (hysteresis, so a full window does not turn into a
//! pause/resume per record).
//!
//! [`bytes`]: PartitionPipeline::bytes
//!
//! [`Disposition::is_final`]: crate::disposition::Disposition::is_final

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use super::{DecodeError, Delivery, DeliveryOutcome, DispatchRecord};
use crate::model::{StoreError, UserId};

/// Most deliveries in one run: the groups one store call decides together (one Redis script
/// call, one commit on Scylla, one lock on memory). Bounds the server time of one call (a
/// Redis script blocks the server while it runs: 64 warm appends take on the order of a few
/// milliseconds) and what one retry re-sends.
pub const RUN_MAX_GROUPS: usize = 64;

/// Most payload bytes in one run (a run's first group is taken whatever its size, so a single
/// group at the record limit still goes): keeps one call's request, and the script's work, near
/// what one large group costs today.
pub const RUN_MAX_BYTES: usize = 1 << 20;

/// A delivery's address inside the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryRef {
    pub offset: i64,
    pub index: usize,
}

/// A delivery that ended refused: why its record is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeliveryFailure {
    pub index: usize,
    pub delivery: Arc<Delivery>,
    pub error: StoreError,
}

/// Why a settled record must go to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeadLetter {
    Malformed(DecodeError),
    Failed(Vec<DeliveryFailure>),
}

impl DeadLetter {
    /// The `dlq_total{reason}` word: `malformed`, or the first failure's outcome word.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::Failed(failures) => failures.first().map_or("rejected", |f| f.error.outcome()),
        }
    }
}

/// A record whose deliveries are all final, handed back for dead-lettering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub offset: i64,
    /// `None`: every delivery succeeded and the record is final now.
    pub dead_letter: Option<DeadLetter>,
    pub dispatch_id: Option<String>,
}

/// What became of a whole record (`records_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RecordOutcome {
    /// Every delivery final and written, or a no-op.
    Applied = 0,
    /// Some delivery refused: the record went to the dead-letter topic.
    DeadLettered = 1,
    /// Not decodable: the record went to the dead-letter topic.
    Malformed = 2,
}

impl RecordOutcome {
    pub(crate) const ALL: [RecordOutcome; 3] = [Self::Applied, Self::DeadLettered, Self::Malformed];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::DeadLettered => "dead_lettered",
            Self::Malformed => "malformed",
        }
    }
}

/// A final record leaving the front of the window, in source order.
#[derive(Debug)]
pub(crate) struct FinalRecord<M> {
    pub outcome: RecordOutcome,
    /// The caller's metadata of the record (a Kafka timestamp, an input line number).
    pub meta: M,
    /// The record's deliveries with their final results, in record order.
    pub deliveries: Vec<(Arc<Delivery>, Result<DeliveryOutcome, StoreError>)>,
    pub malformed: Option<DecodeError>,
    /// Some delivery was skipped (its user is parked): the record is not done with yet, it is
    /// read again once that user heals, and counted then.
    pub skipped: bool,
    /// The deliveries skipped, in record order: a front end that holds a corrupt mailbox for
    /// the rest of its run reports each as `held` (SPEC 8.1).
    pub held: Vec<Arc<Delivery>>,
}

impl<M> FinalRecord<M> {
    /// Each delivery with its final result, as the commands print them.
    pub(crate) fn results(&self) -> Vec<super::DeliveryResult> {
        self.deliveries
            .iter()
            .map(|(delivery, result)| super::DeliveryResult {
                mailbox: delivery.mailbox().clone(),
                mailbox_seq: delivery.mailbox_seq(),
                result: result.clone(),
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Deliveries still running.
    Running,
    /// Every delivery final; the dead letter is not acknowledged yet.
    AwaitingDeadLetter,
    /// Final: may leave the window once everything before it has.
    Final,
}

#[derive(Debug)]
struct Slot<R, M> {
    stage: Stage,
    /// The bytes a dead letter would carry; released when the record is final.
    raw: Option<R>,
    raw_bytes: usize,
    meta: M,
    deliveries: Vec<Arc<Delivery>>,
    results: Vec<Option<Result<DeliveryOutcome, StoreError>>>,
    /// Deliveries of a parked (blocked) user, skipped: neither applied nor kept waiting (see
    /// [`PartitionPipeline::park`]).
    skipped: Vec<bool>,
    pending: usize,
    malformed: Option<DecodeError>,
    dispatch_id: Option<String>,
}

impl<R, M> Slot<R, M> {
    fn outcome(&self) -> RecordOutcome {
        if self.malformed.is_some() {
            RecordOutcome::Malformed
        } else if self.results.iter().flatten().any(|r| {
            crate::disposition::Disposition::of(r) == crate::disposition::Disposition::DeadLetter
        }) {
            RecordOutcome::DeadLettered
        } else {
            RecordOutcome::Applied
        }
    }

    fn settle(&mut self, offset: i64) -> Settled {
        let failures: Vec<DeliveryFailure> = self
            .results
            .iter()
            .enumerate()
            .filter_map(|(index, result)| match result {
                Some(Err(error)) => Some(DeliveryFailure {
                    index,
                    delivery: self.deliveries[index].clone(),
                    error: error.clone(),
                }),
                _ => None,
            })
            .collect();
        let dead_letter = match &self.malformed {
            Some(error) => Some(DeadLetter::Malformed(error.clone())),
            None if failures.is_empty() => None,
            None => Some(DeadLetter::Failed(failures)),
        };
        self.stage = if dead_letter.is_some() {
            Stage::AwaitingDeadLetter
        } else {
            Stage::Final
        };
        Settled {
            offset,
            dead_letter,
            dispatch_id: self.dispatch_id.clone(),
        }
    }
}

/// What [`PartitionPipeline::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    /// Set when the record settled at once (malformed, or no delivery).
    pub settled: Option<Settled>,
}

/// One user's deliveries in the window, in source order.
#[derive(Debug, Default)]
struct Lane {
    queue: VecDeque<DeliveryRef>,
    /// The deliveries of the current run (at the front) not back yet: at most
    /// [`RUN_MAX_GROUPS`].
    out: Vec<DeliveryRef>,
    /// In the window's ready queue.
    ready: bool,
}

/// A user whose mailbox fails closed (corrupt), parked so it holds only itself: its head
/// delivery (the one that failed) stays at its lane's head and is retried; every other delivery
/// of the user, already in the window or admitted later, is skipped, so the rest of the window
/// flows and releases its records. The watermark stays at or before the head's record and, once
/// the head is final, at the first skipped delivery until the front end re-reads the source from
/// there ([`PartitionPipeline::reread_from`]): the skipped deliveries are applied from the log,
/// never from memory. Bound: one entry (a delivery reference and three numbers) and the head's
/// record per parked user.
#[derive(Debug)]
struct Parked {
    head: DeliveryRef,
    /// The offset of the first delivery skipped.
    first_skipped: Option<i64>,
    /// Deliveries skipped so far.
    skipped: u64,
    /// The head is final: what was skipped waits for the re-read.
    healed: bool,
    /// Held for the rest of the run ([`PartitionPipeline::hold`]): a front end that reports a
    /// corrupt answer as final (`apply`, `replay`, `dlq redrive`) skips the user's later
    /// deliveries for good, instead of re-reading them once the head is final.
    held: bool,
}

/// The window of one source.
#[derive(Debug)]
pub(crate) struct PartitionPipeline<R, M = ()> {
    max_records: usize,
    slots: BTreeMap<i64, Slot<R, M>>,
    lanes: HashMap<UserId, Lane>,
    /// Users failing closed (see [`Parked`]).
    parked: HashMap<UserId, Parked>,
    /// Lanes with nothing out and something to run, in the order they became so.
    ready: VecDeque<UserId>,
    /// One past the highest admitted offset.
    next_offset: Option<i64>,
    /// Bytes of the records in the window, as the caller charged each at admission (the daemon:
    /// raw size plus [`crate::ingest::DispatchRecord::in_flight_bytes`]), counted until they
    /// leave the window.
    bytes: usize,
}

impl<R, M> PartitionPipeline<R, M> {
    /// A window of at most `max_records` records (at least 1).
    pub(crate) fn new(max_records: usize) -> Self {
        Self {
            max_records: max_records.max(1),
            slots: BTreeMap::new(),
            lanes: HashMap::new(),
            parked: HashMap::new(),
            ready: VecDeque::new(),
            next_offset: None,
            bytes: 0,
        }
    }

    /// True when no more records may be admitted: the caller pauses its source.
    pub(crate) fn is_full(&self) -> bool {
        self.slots.len() >= self.max_records
    }

    /// True when the window has drained to half its records: a paused source may resume (the
    /// gap between this and [`is_full`](Self::is_full) keeps pause and resume from flapping).
    pub(crate) fn drained_to_half(&self) -> bool {
        self.slots.len() <= self.max_records / 2
    }

    /// Records in the window, final or not.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of the records in the window: a record counts from admission until it leaves the
    /// window (its raw bytes are released when it is final, its decoded deliveries only then).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The offset to commit: the first record not yet final, or one past the last admitted, and
    /// never past the first delivery a parked user skipped.
    pub(crate) fn watermark(&self) -> Option<i64> {
        let window = self.slots.keys().next().copied().or(self.next_offset);
        let skipped = self.parked.values().filter_map(|p| p.first_skipped).min();
        match (window, skipped) {
            (Some(w), Some(s)) => Some(w.min(s)),
            (w, s) => w.or(s),
        }
    }

    /// Where the source must be read again from: the first delivery a parked user skipped, once
    /// that user's head is final (its mailbox is healthy again). `None` while no healed user
    /// waits for its skipped deliveries.
    pub(crate) fn reread_from(&self) -> Option<i64> {
        self.parked
            .values()
            .filter(|p| p.healed)
            .filter_map(|p| p.first_skipped)
            .min()
    }

    /// One past the highest admitted offset (or the offset [`Self::skip_to`] moved to).
    pub(crate) fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    /// Deliveries skipped for parked users, by user, and the offset each user's first skipped
    /// delivery is at.
    pub(crate) fn skipped(&self) -> impl Iterator<Item = (&UserId, u64, Option<i64>)> {
        self.parked
            .iter()
            .map(|(user, p)| (user, p.skipped, p.first_skipped))
    }

    /// Parks the user of the delivery at `head` (its result failed closed; it stays at its
    /// lane's head and is retried by the caller): every other delivery of the user in the window
    /// is skipped, and so is every one admitted later (see [`Parked`]). Returns the records this
    /// settled (their other deliveries were all final). Parking a parked user changes nothing.
    pub(crate) fn park(&mut self, head: DeliveryRef) -> Vec<Settled> {
        self.park_as(head, false)
    }

    /// Holds the user of the delivery at `head` for the rest of the run: as [`Self::park`], but
    /// the head is completed by the caller (its corrupt answer is final) and the user stays
    /// parked afterwards, so every later delivery of it is skipped and reported held (SPEC 7.3:
    /// every front end holds a corrupt mailbox the way the daemon does). Holding a held user
    /// changes nothing; holding a parked one makes it held.
    pub(crate) fn hold(&mut self, head: DeliveryRef) -> Vec<Settled> {
        if let Some(user) = self.delivery(head).map(|d| d.mailbox().user_id.clone()) {
            if let Some(parked) = self.parked.get_mut(&user) {
                parked.held = true;
                return Vec::new();
            }
        }
        self.park_as(head, true)
    }

    fn park_as(&mut self, head: DeliveryRef, held: bool) -> Vec<Settled> {
        let Some(user) = self.delivery(head).map(|d| d.mailbox().user_id.clone()) else {
            return Vec::new();
        };
        if self.parked.contains_key(&user) {
            return Vec::new();
        }
        let mut rest: Vec<DeliveryRef> = Vec::new();
        if let Some(lane) = self.lanes.get_mut(&user) {
            rest.extend(lane.queue.iter().filter(|at| **at != head));
            lane.queue.retain(|at| *at == head);
            lane.out.retain(|at| *at == head);
        }
        let mut parked = Parked {
            head,
            first_skipped: None,
            skipped: 0,
            healed: false,
            held,
        };
        let mut settled = Vec::new();
        for at in rest {
            if let Some(done) = self.skip(at) {
                settled.push(done);
            }
            parked.skipped += 1;
            parked.first_skipped =
                Some(parked.first_skipped.map_or(at.offset, |f| f.min(at.offset)));
        }
        self.parked.insert(user, parked);
        settled
    }

    /// Marks the delivery at `at` skipped (its user is parked); its record settles when it was
    /// the last one pending.
    fn skip(&mut self, at: DeliveryRef) -> Option<Settled> {
        let slot = self.slots.get_mut(&at.offset)?;
        if slot.stage != Stage::Running
            || slot.results.get(at.index)?.is_some()
            || slot.skipped[at.index]
        {
            return None;
        }
        slot.skipped[at.index] = true;
        slot.pending -= 1;
        let settled = (slot.pending == 0).then(|| slot.settle(at.offset));
        if settled.as_ref().is_some_and(|s| s.dead_letter.is_none()) {
            slot.raw = None;
        }
        settled
    }

    /// The source says no record below `offset` is still to come: the offsets between the last
    /// admitted record and `offset` hold none (transaction markers, aborted transactions, records
    /// compacted away). Once every record in the window is final the watermark is `offset`, so the
    /// committed offset reaches the log end and the lag is 0 on an idle transactional partition.
    /// An `offset` at or below what was admitted changes nothing.
    pub(crate) fn skip_to(&mut self, offset: i64) {
        if self.next_offset.is_none_or(|next| offset > next) {
            self.next_offset = Some(offset);
        }
    }

    /// Admits the record at `offset`, strictly after every admitted one (an older offset is a
    /// redelivery: ignored, `None`). `raw` (of `raw_bytes` bytes) is kept until the record is
    /// final, for a possible dead letter; `meta` travels with the record to [`Self::pop_final`].
    pub(crate) fn admit(
        &mut self,
        offset: i64,
        raw: R,
        raw_bytes: usize,
        meta: M,
        decoded: Result<DispatchRecord, DecodeError>,
    ) -> Option<Admission> {
        if self.next_offset.is_some_and(|next| offset < next) {
            return None;
        }
        self.next_offset = Some(offset + 1);
        self.bytes += raw_bytes;
        let mut slot = Slot {
            stage: Stage::Running,
            raw: Some(raw),
            raw_bytes,
            meta,
            deliveries: Vec::new(),
            results: Vec::new(),
            skipped: Vec::new(),
            pending: 0,
            malformed: None,
            dispatch_id: None,
        };
        match decoded {
            Err(error) => slot.malformed = Some(error),
            Ok(record) => {
                slot.dispatch_id = record.dispatch_id().map(str::to_owned);
                let deliveries: Vec<Arc<Delivery>> =
                    record.deliveries().into_iter().map(Arc::new).collect();
                slot.skipped = vec![false; deliveries.len()];
                for (index, delivery) in deliveries.iter().enumerate() {
                    if let Some(parked) = self.parked.get_mut(&delivery.mailbox().user_id) {
                        // A parked user's later deliveries are re-read from the source once it
                        // heals; none is kept here.
                        slot.skipped[index] = true;
                        parked.skipped += 1;
                        parked.first_skipped.get_or_insert(offset);
                        continue;
                    }
                    let lane = self
                        .lanes
                        .entry(delivery.mailbox().user_id.clone())
                        .or_default();
                    let at = DeliveryRef { offset, index };
                    lane.queue.push_back(at);
                    if lane.out.is_empty() && !lane.ready {
                        lane.ready = true;
                        self.ready.push_back(delivery.mailbox().user_id.clone());
                    }
                }
                slot.pending = slot.skipped.iter().filter(|s| !**s).count();
                slot.results = vec![None; deliveries.len()];
                slot.deliveries = deliveries;
            }
        }
        let settled = (slot.pending == 0).then(|| slot.settle(offset));
        if settled.as_ref().is_some_and(|s| s.dead_letter.is_none()) {
            self.release_raw(&mut slot);
        }
        self.slots.insert(offset, slot);
        Some(Admission { settled })
    }

    /// The delivery at `at`, while its record is in the window.
    pub(crate) fn delivery(&self, at: DeliveryRef) -> Option<&Arc<Delivery>> {
        self.slots.get(&at.offset)?.deliveries.get(at.index)
    }

    /// The raw bytes of a record awaiting its dead letter.
    pub(crate) fn raw(&self, offset: i64) -> Option<&R> {
        self.slots.get(&offset)?.raw.as_ref()
    }

    /// Records the **final** result of the delivery at `at` (a non-final one — retry, fence,
    /// corrupt — must not arrive here: the delivery stays at its lane's head). Once every
    /// delivery of the lane's run is back, the lane is ready again if it has more. Returns the
    /// record's settlement when this was its last delivery.
    pub(crate) fn complete(
        &mut self,
        at: DeliveryRef,
        result: Result<DeliveryOutcome, StoreError>,
    ) -> Option<Settled> {
        let slot = self.slots.get_mut(&at.offset)?;
        let delivery = slot.deliveries.get(at.index).cloned()?;
        if slot.stage != Stage::Running
            || slot.results[at.index].is_some()
            || slot.skipped[at.index]
        {
            return None;
        }
        slot.results[at.index] = Some(result);
        slot.pending -= 1;
        let settled = (slot.pending == 0).then(|| slot.settle(at.offset));
        if settled.as_ref().is_some_and(|s| s.dead_letter.is_none()) {
            if let Some(mut slot) = self.slots.remove(&at.offset) {
                self.release_raw(&mut slot);
                self.slots.insert(at.offset, slot);
            }
        }

        let user = delivery.mailbox().user_id.clone();
        if let Some(parked) = self.parked.get_mut(&user).filter(|p| p.head == at) {
            // The parked user's head is final: its mailbox is healthy again. Nothing skipped:
            // it flows again at once; otherwise its skipped deliveries wait for the re-read.
            if parked.first_skipped.is_some() || parked.held {
                parked.healed = true;
            } else {
                self.parked.remove(&user);
            }
        }
        if let Some(lane) = self.lanes.get_mut(&user) {
            if lane.queue.front() == Some(&at) {
                lane.queue.pop_front();
            } else {
                lane.queue.retain(|r| *r != at);
            }
            lane.out.retain(|r| *r != at);
            if lane.queue.is_empty() && !lane.ready {
                self.lanes.remove(&user);
            } else {
                self.mark_ready(&user);
            }
        }
        settled
    }

    /// Queues `user`'s lane as ready when nothing of it is out and it has something to run.
    fn mark_ready(&mut self, user: &UserId) {
        if let Some(lane) = self.lanes.get_mut(user) {
            if lane.out.is_empty() && !lane.queue.is_empty() && !lane.ready {
                lane.ready = true;
                self.ready.push_back(user.clone());
            }
        }
    }

    /// Whether some lane has a run to hand out.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next ready lane's run, formed now from everything waiting at its front (see the
    /// module docs), marked out; `None` when no lane is ready.
    pub(crate) fn take_run(&mut self) -> Option<Vec<DeliveryRef>> {
        while let Some(user) = self.ready.pop_front() {
            let Some(lane) = self.lanes.get_mut(&user) else {
                continue;
            };
            lane.ready = false;
            if !lane.out.is_empty() {
                continue;
            }
            if lane.queue.is_empty() {
                self.lanes.remove(&user);
                continue;
            }
            let run = self.next_run(&user);
            if !run.is_empty() {
                return Some(run);
            }
        }
        None
    }

    /// A delivery of the current run that never reached the store (the store stopped the run
    /// before it): it stays in its lane, unanswered, and once the rest of its run is back the
    /// lane is ready again, its next run starting with it.
    pub(crate) fn not_reached(&mut self, at: DeliveryRef) {
        let Some(user) = self.delivery(at).map(|d| d.mailbox().user_id.clone()) else {
            return;
        };
        let Some(lane) = self.lanes.get_mut(&user) else {
            return;
        };
        if lane.out.contains(&at) {
            lane.out.retain(|r| *r != at);
            self.mark_ready(&user);
        }
    }

    /// Forms `user`'s next run from the front of its lane (see the module docs) and marks it
    /// out.
    fn next_run(&mut self, user: &UserId) -> Vec<DeliveryRef> {
        let Some(lane) = self.lanes.get(user) else {
            return Vec::new();
        };
        let mut run = Vec::new();
        let mut bytes = 0;
        let mut mailbox = None;
        // The seqs of `run` (at most RUN_MAX_GROUPS).
        let mut seqs: Vec<u64> = Vec::new();
        for at in &lane.queue {
            let Some(delivery) = self
                .slots
                .get(&at.offset)
                .and_then(|slot| slot.deliveries.get(at.index))
            else {
                break;
            };
            let Delivery::Append(group) = &**delivery else {
                // A truncate runs alone.
                if run.is_empty() {
                    run.push(*at);
                }
                break;
            };
            let size: usize = group.events.iter().map(|e| e.payload.as_str().len()).sum();
            // A seq at most once per run: a run is one store call, and when its answer is lost
            // and it is sent again, each write must find the store as that write left it, or
            // a later write of the same seq in the same call would answer the retry of the
            // first (`superseded`, its own call's later version) instead of its own outcome
            // (`model::written`). A same-day replace of a seq of this run starts the next run.
            let joins = mailbox.is_none_or(|m| m == &group.mailbox)
                && run.len() < RUN_MAX_GROUPS
                && (run.is_empty() || bytes + size <= RUN_MAX_BYTES)
                && !seqs.contains(&group.mailbox_seq);
            if !joins {
                break;
            }
            mailbox = Some(&group.mailbox);
            bytes += size;
            seqs.push(group.mailbox_seq);
            run.push(*at);
        }
        if let Some(lane) = self.lanes.get_mut(user) {
            lane.out.clone_from(&run);
        }
        run
    }

    /// Marks a record awaiting its dead letter final (the dead letter is acknowledged) and
    /// releases its raw bytes. Returns false when the record is not awaiting one.
    pub(crate) fn dead_lettered(&mut self, offset: i64) -> bool {
        let Some(mut slot) = self.slots.remove(&offset) else {
            return false;
        };
        let was_waiting = slot.stage == Stage::AwaitingDeadLetter;
        if was_waiting {
            slot.stage = Stage::Final;
            self.release_raw(&mut slot);
        }
        self.slots.insert(offset, slot);
        was_waiting
    }

    /// Takes every final record from the front of the window, in source order; the watermark
    /// moves past them.
    pub(crate) fn pop_final(&mut self) -> Vec<FinalRecord<M>> {
        let mut out = Vec::new();
        if self.parked.values().all(|p| p.healed) {
            // No parked head in the window: final records leave from the front.
            while let Some(entry) = self.slots.first_entry() {
                if entry.get().stage != Stage::Final {
                    break;
                }
                let slot = entry.remove();
                out.push(self.leave(slot));
            }
            return out;
        }
        // Records after one that only a parked head holds leave too (its record stays, and so
        // does the watermark): a blocked mailbox holds only itself.
        let mut heads: HashMap<i64, usize> = HashMap::new();
        for parked in self.parked.values().filter(|p| !p.healed) {
            *heads.entry(parked.head.offset).or_default() += 1;
        }
        let mut leaving = Vec::new();
        for (offset, slot) in &self.slots {
            if slot.stage == Stage::Final {
                leaving.push(*offset);
            } else if !(slot.stage == Stage::Running
                && heads.get(offset).is_some_and(|n| *n == slot.pending))
            {
                break;
            }
        }
        for offset in leaving {
            if let Some(slot) = self.slots.remove(&offset) {
                out.push(self.leave(slot));
            }
        }
        out
    }

    /// Every final record, wherever it stands in the window, in source order: what a front end
    /// that stops early (`apply` on an unreachable or full store) reports before it exits, so
    /// every line it applied is printed even behind one that never finished.
    pub(crate) fn take_every_final(&mut self) -> Vec<FinalRecord<M>> {
        let finals: Vec<i64> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.stage == Stage::Final)
            .map(|(offset, _)| *offset)
            .collect();
        let mut out = Vec::with_capacity(finals.len());
        for offset in finals {
            if let Some(slot) = self.slots.remove(&offset) {
                out.push(self.leave(slot));
            }
        }
        out
    }

    /// A final record leaving the window: its bytes are no longer charged.
    fn leave(&mut self, slot: Slot<R, M>) -> FinalRecord<M> {
        self.bytes -= slot.raw_bytes;
        let outcome = slot.outcome();
        let skipped = slot.skipped.iter().any(|s| *s);
        let held = slot
            .deliveries
            .iter()
            .zip(&slot.skipped)
            .filter(|(_, skipped)| **skipped)
            .map(|(d, _)| d.clone())
            .collect();
        let deliveries = slot
            .deliveries
            .into_iter()
            .zip(slot.results)
            .filter_map(|(d, r)| r.map(|r| (d, r)))
            .collect();
        FinalRecord {
            outcome,
            meta: slot.meta,
            deliveries,
            malformed: slot.malformed,
            skipped,
            held,
        }
    }

    fn release_raw(&mut self, slot: &mut Slot<R, M>) {
        slot.raw = None;
    }
}

#[cfg(test)]
mod tests;
