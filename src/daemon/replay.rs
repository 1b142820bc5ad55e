//! `materializer replay`: re-reads one partition of the dispatch topic from an offset (or a time)
//! with its own assignment — no consumer group membership, no commits — and applies it again
//! through the same ordering core as the daemon (`ingest::pipeline` and `ingest::runner`): many
//! users in flight, each user's deliveries in offset order.
//!
//! With `--reset-mailboxes` it is the **repair** of SPEC 7.1, the recovery path for a corrupt
//! mailbox, and the safest command of the product:
//!
//! 1. **Refuse before touching anything**: an empty range, a `--from-time` in the future or past
//!    the end, a log start above the requested start (retention deleted records) or a named user
//!    with records between the log start and the requested start (both would leave the rebuilt
//!    mailbox without groups; unless `--allow-partial-history`), an end below the consumer
//!    group's committed offset (the rebuild would miss records the daemon already committed).
//! 2. **Fence** each named user ([`crate::store::MailboxStore::repair_begin`]): the daemon's writes
//!    to them wait. The end is read again *after* the fences are up, so every record the daemon
//!    wrote before them is inside the range, and every record after them waits for the swap.
//! 3. **Build aside**: the range is applied to the users' staging copies, the fences renewed by a
//!    task of their own ([`Renewal`]). The live mailboxes are untouched (a corrupt one keeps
//!    failing closed).
//! 4. **Check** that every named user had a record in the range (unless `--allow-empty`).
//! 5. **Swap** each user in one atomic step. Any error, a lost fence, SIGINT/SIGTERM or a crash
//!    before it leaves the live mailboxes exactly as they were; the staging copies are removed
//!    (or collected later by the next repair or `patrol`), and a rerun starts over.
//!
//! Malformed, refused and conflicting records are counted, not dead-lettered again: the daemon
//! did that when it first read them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use tokio::sync::watch;

use super::metrics;
use crate::config::Config;
use crate::disposition::Disposition;
use crate::ingest::pipeline::{DeliveryRef, FinalRecord, PartitionPipeline};
use crate::ingest::runner::{Attempt, Cancel, Runner};
use crate::ingest::{decode, DeliveryOutcome};
use crate::model::{StoreError, UserId};
use crate::store::repair::Renewal;
use crate::store::{MailboxStore, RepairToken, StagingView};

/// Transient store errors of one delivery are retried this many times before the replay gives up
/// (exit 2): an operator command must not hang on a store that is down.
const MAX_TRANSIENT_ATTEMPTS: u32 = 12;
/// Records read ahead of the slowest lane.
const WINDOW: usize = 2_000;
/// No record for this long while offsets remain: the broker is unreachable.
const STALL: Duration = Duration::from_secs(60);

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStart {
    Offset(i64),
    /// Milliseconds since the Unix epoch: the first record at or after it.
    TimeMs(i64),
}

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A redrawn bar (a terminal).
    Bar,
    /// A plain line every few seconds (a log file, a Kubernetes Job).
    Lines,
    Off,
}

impl ProgressMode {
    /// A bar on a terminal, lines otherwise.
    pub fn for_stderr() -> Self {
        if std::io::stderr().is_terminal() {
            Self::Bar
        } else {
            Self::Lines
        }
    }
}

#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub partition: i32,
    pub start: ReplayStart,
    /// Last offset replayed (inclusive); default: the end of the partition.
    pub to_offset: Option<i64>,
    /// Only these users' deliveries are applied (all when empty).
    pub users: Vec<UserId>,
    pub reset_mailboxes: bool,
    pub dry_run: bool,
    /// Replay from the log start when retention already deleted the requested start.
    pub allow_partial_history: bool,
    /// Swap a named user even when the range holds no record of it (its mailboxes become empty).
    pub allow_empty: bool,
    pub progress: ProgressMode,
    /// Lease of the repair fences: how long the daemon's writes to a user stay fenced if this
    /// process dies mid-repair. Renewed every third of it.
    pub lease: Duration,
}

/// Why a replay refused to start (nothing was touched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `empty_range`, `from_time_in_future`, `from_time_past_end`, `log_start_above_start`,
    /// `user_before_start`, `end_below_committed`, `user_not_in_range`, `reset_without_user`.
    pub reason: &'static str,
    pub detail: String,
}

/// What a replay did, printed as one JSON object.
#[derive(Debug, Default, Serialize)]
pub struct ReplaySummary {
    pub partition: i32,
    pub from_offset: i64,
    /// One past the last offset replayed.
    pub end_offset: i64,
    pub records: u64,
    /// Record outcomes: applied, dead_lettered, malformed, skipped (no delivery to the named
    /// users), corrupt, planned (dry run).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Delivery outcome words.
    pub groups: BTreeMap<&'static str, u64>,
    /// Groups the staging copies held when swapped.
    pub staged_groups: u64,
    /// Users whose rebuilt mailboxes are live.
    pub swapped_users: Vec<String>,
    pub dry_run: bool,
    /// Users whose mailbox was still corrupt during the replay (no reset).
    pub corrupt_users: Vec<String>,
    /// Set when the replay refused to start; nothing was touched.
    pub refused: Option<Refusal>,
    /// Set when the replay stopped midway (signal, lost fence, store or broker unreachable): the
    /// live mailboxes are as they were before it, and a rerun starts over.
    pub aborted: Option<String>,
    /// Why it stopped, when it stopped because the store or broker was unreachable or another
    /// repair held a fence: retry later (exit 2).
    #[serde(skip)]
    pub retryable: bool,
}

impl ReplaySummary {
    /// The exit status of `materializer replay`: 0 done (every named user swapped), 1 refused,
    /// 2 unreachable or fenced by another repair (retry), 3 a mailbox stays corrupt, 4 aborted.
    pub fn exit_status(&self) -> u8 {
        if self.refused.is_some() {
            1
        } else if self.retryable {
            2
        } else if self.aborted.is_some() {
            4
        } else if !self.corrupt_users.is_empty() {
            3
        } else {
            0
        }
    }

    fn refuse(&mut self, reason: &'static str, detail: String) -> &mut Self {
        self.refused = Some(Refusal { reason, detail });
        self
    }

    fn abort(&mut self, reason: String, retryable: bool) -> &mut Self {
        self.aborted = Some(reason);
        self.retryable = retryable;
        self
    }
}

/// A fault-injection point for tests of the repair: with `MATERIALIZER_PAUSE_AT=<point>` (or
/// `<point>:<ms>`) in the environment the replay prints `paused at <point>` on stderr and waits
/// there (forever, or `ms`), so a test can kill it, stop it or let a lease lapse at exactly that
/// step. Points: `replay.fenced` (fences taken, nothing staged), `replay.rebuilding` (the first
/// delivery staged), `replay.before_swap` (everything staged, nothing swapped).
async fn pause_point(point: &str) {
    let Ok(spec) = std::env::var("MATERIALIZER_PAUSE_AT") else {
        return;
    };
    let (name, ms) = match spec.split_once(':') {
        Some((name, ms)) => (name, ms.parse::<u64>().ok()),
        None => (spec.as_str(), None),
    };
    if name != point {
        return;
    }
    eprintln!("paused at {point}");
    match ms {
        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        None => std::future::pending::<()>().await,
    }
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The offsets of the partition, read from the broker.
struct Range {
    /// The partition's log start when the replay began.
    low: i64,
    from: i64,
    end: i64,
}

/// Runs a replay to its end, its refusal or its abort; `interrupt` flips on SIGINT/SIGTERM.
pub async fn replay(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    mut interrupt: watch::Receiver<bool>,
) -> ReplaySummary {
    let mut summary = ReplaySummary {
        partition: request.partition,
        dry_run: request.dry_run,
        ..ReplaySummary::default()
    };
    if request.reset_mailboxes && request.users.is_empty() {
        summary.refuse(
            "reset_without_user",
            "--reset-mailboxes needs at least one --user: a partition's users are only known after reading it".to_owned(),
        );
        return summary;
    }
    let clients = match Clients::new(config, request.partition) {
        Ok(clients) => clients,
        Err(e) => {
            summary.abort(format!("kafka: {e}"), true);
            return summary;
        }
    };
    let range = match clients.resolve(request).await {
        Ok(Ok(range)) => range,
        Ok(Err(refusal)) => {
            summary.refused = Some(refusal);
            return summary;
        }
        Err(e) => {
            summary.abort(e, true);
            return summary;
        }
    };
    summary.from_offset = range.from;
    summary.end_offset = range.end;

    // A rebuild replaces the whole mailbox: a named user with records before the start would
    // lose them. Read (never apply) what the log holds before the start to be sure.
    if request.reset_mailboxes && range.from > range.low && !request.allow_partial_history {
        match clients
            .first_record_of(&request.users, range.low, range.from, config)
            .await
        {
            Ok(Some((offset, user))) => {
                summary.refuse(
                    "user_before_start",
                    format!(
                        "the log still holds a record of {} at offset {offset}, before the requested start {}: a rebuild from there would lose it; start at or before {offset} (or pass --allow-partial-history)",
                        user.as_str(),
                        range.from
                    ),
                );
                return summary;
            }
            Ok(None) => {}
            Err(e) => {
                summary.abort(e, true);
                return summary;
            }
        }
    }

    let fenced = request.reset_mailboxes && !request.dry_run;
    let mut tokens: Vec<RepairToken> = Vec::new();
    let mut range = range;
    if fenced {
        for user in &request.users {
            match store.repair_begin(user, request.lease).await {
                Ok(token) => tokens.push(token),
                Err(e) => {
                    abort_all(store.as_ref(), &tokens).await;
                    let retryable = matches!(
                        e,
                        StoreError::UnderRepair { .. } | StoreError::Unavailable { .. }
                    );
                    summary.abort(format!("fence of {}: {e}", user.as_str()), retryable);
                    return summary;
                }
            }
        }
        // Everything the daemon wrote before the fences is below the high watermark now.
        match clients.recheck_after_fence(request, &range).await {
            Ok(Ok(end)) => range.end = end,
            Ok(Err(refusal)) => {
                abort_all(store.as_ref(), &tokens).await;
                summary.refused = Some(refusal);
                return summary;
            }
            Err(e) => {
                abort_all(store.as_ref(), &tokens).await;
                summary.abort(e, true);
                return summary;
            }
        }
        summary.end_offset = range.end;
    }

    pause_point("replay.fenced").await;
    let mut renewal = fenced.then(|| {
        Renewal::start_with(
            store.clone(),
            tokens.clone(),
            request.lease,
            request.lease / 3,
        )
    });
    let targets: HashMap<UserId, Arc<dyn MailboxStore>> = tokens
        .iter()
        .map(|t| {
            let view: Arc<dyn MailboxStore> = Arc::new(StagingView::new(store.clone(), t.clone()));
            (t.user.clone(), view)
        })
        .collect();
    let mut run = Rebuild {
        config,
        request,
        store: store.clone(),
        targets,
        pipeline: PartitionPipeline::new(WINDOW),
        runner: Runner::default(),
        cancel: Cancel::default(),
        summary: &mut summary,
        corrupt_users: BTreeSet::new(),
        seen_users: BTreeSet::new(),
        wanted: request.users.iter().cloned().collect(),
        progress: Progress::new(request.progress, request.partition, range.end - range.from),
        staged_any: false,
        pause_rebuilding: false,
    };
    let read = run
        .read(&clients.reader, &range, &mut interrupt, renewal.as_mut())
        .await;
    run.cancel.cancel();
    let corrupt_users = std::mem::take(&mut run.corrupt_users);
    let seen_users = std::mem::take(&mut run.seen_users);
    run.progress.finish();
    drop(run);
    summary.corrupt_users = corrupt_users
        .iter()
        .map(|u| u.as_str().to_owned())
        .collect();
    if let Err((reason, retryable)) = read {
        if let Some(renewal) = renewal.take() {
            renewal.stop();
        }
        abort_all(store.as_ref(), &tokens).await;
        summary.abort(reason, retryable);
        return summary;
    }
    if !fenced {
        return summary;
    }

    let missing: Vec<&str> = tokens
        .iter()
        .filter(|t| !seen_users.contains(&t.user))
        .map(|t| t.user.as_str())
        .collect();
    if !missing.is_empty() && !request.allow_empty {
        if let Some(renewal) = renewal.take() {
            renewal.stop();
        }
        abort_all(store.as_ref(), &tokens).await;
        summary.refuse(
            "user_not_in_range",
            format!(
                "no record of {} in offsets {}..{}: a rebuild would empty the mailbox; check --partition and the range, or force it with --allow-empty",
                missing.join(", "),
                range.from,
                range.end
            ),
        );
        return summary;
    }
    pause_point("replay.before_swap").await;
    if let Some(reason) = renewal.as_ref().and_then(Renewal::is_lost) {
        if let Some(renewal) = renewal.take() {
            renewal.stop();
        }
        abort_all(store.as_ref(), &tokens).await;
        summary.abort(format!("repair fence lost: {reason}"), false);
        return summary;
    }
    for (i, token) in tokens.iter().enumerate() {
        match store.repair_swap(token).await {
            Ok(report) => {
                // Its fence is lifted: stop renewing it (a renewal would find it gone).
                if let Some(renewal) = renewal.as_ref() {
                    renewal.release(token);
                }
                summary.staged_groups += report.staged_groups;
                summary.swapped_users.push(token.user.as_str().to_owned());
                tracing::info!(user = %token.user.as_str(), staged_groups = report.staged_groups, "rebuilt mailboxes swapped in");
            }
            Err(e) => {
                if let Some(renewal) = renewal.take() {
                    renewal.stop();
                }
                abort_all(store.as_ref(), &tokens[i..]).await;
                let retryable = matches!(e, StoreError::Unavailable { .. });
                summary.abort(
                    format!("swap of {} failed: {e}", token.user.as_str()),
                    retryable,
                );
                return summary;
            }
        }
    }
    if let Some(renewal) = renewal.take() {
        renewal.stop();
    }
    summary
}

async fn abort_all(store: &dyn MailboxStore, tokens: &[RepairToken]) {
    for token in tokens {
        if let Err(e) = store.repair_abort(token).await {
            tracing::warn!(user = %token.user.as_str(), error = %e, "staging copy not removed; the next repair of the user or patrol removes it");
        }
    }
}

/// The replay's Kafka clients: a reader with its own assignment (never committing) and a
/// watcher that only asks the daemon's consumer group what it committed.
struct Clients {
    topic: String,
    partition: i32,
    reader: StreamConsumer,
    watcher: BaseConsumer,
}

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

impl Clients {
    fn new(config: &Config, partition: i32) -> Result<Self, rdkafka::error::KafkaError> {
        let mut reader = super::kafka::base_config(&config.kafka);
        // librdkafka wants a group id even for a manual assignment; nothing is ever committed
        // to it, and it is not the daemon's group.
        reader
            .set("group.id", format!("{}-replay", config.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // A position that retention deleted mid-read must stop the replay, never jump to
            // the end (librdkafka's default reset), which would look like a complete range.
            .set("auto.offset.reset", "error");
        let mut watcher = super::kafka::base_config(&config.kafka);
        // The daemon's group, only to read its committed offsets (OffsetFetch): this client never
        // subscribes, so it never joins the group or disturbs its members.
        watcher
            .set("group.id", &config.kafka.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        Ok(Self {
            topic: config.kafka.topic.clone(),
            partition,
            reader: reader.create()?,
            watcher: watcher.create()?,
        })
    }

    /// (low, high) watermarks and the daemon group's committed offset of the partition.
    fn offsets(&self) -> Result<(i64, i64, Option<i64>), String> {
        let (low, high) = self
            .watcher
            .fetch_watermarks(&self.topic, self.partition, KAFKA_TIMEOUT)
            .map_err(|e| format!("kafka: watermarks of partition {}: {e}", self.partition))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, self.partition);
        let committed = self
            .watcher
            .committed_offsets(tpl, KAFKA_TIMEOUT)
            .map_err(|e| {
                format!(
                    "kafka: committed offset of partition {}: {e}",
                    self.partition
                )
            })?
            .find_partition(&self.topic, self.partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        Ok((low, high, committed))
    }

    /// Resolves the requested range, or refuses it. `Err` is an unreachable broker.
    async fn resolve(&self, request: &ReplayRequest) -> Result<Result<Range, Refusal>, String> {
        let (low, high, committed) = tokio::task::block_in_place(|| self.offsets())?;
        let refuse = |reason, detail| Ok(Err(Refusal { reason, detail }));
        let from = match request.start {
            ReplayStart::Offset(offset) => offset,
            ReplayStart::TimeMs(ms) => {
                if ms > now_ms() {
                    return refuse(
                        "from_time_in_future",
                        format!("--from-time {ms} ms is in the future: there is nothing to replay"),
                    );
                }
                let mut query = TopicPartitionList::new();
                query
                    .add_partition_offset(&self.topic, self.partition, Offset::Offset(ms))
                    .map_err(|e| format!("kafka: {e}"))?;
                let found = tokio::task::block_in_place(|| {
                    self.watcher.offsets_for_times(query, KAFKA_TIMEOUT)
                })
                .map_err(|e| format!("kafka: offsets for --from-time: {e}"))?;
                match found
                    .find_partition(&self.topic, self.partition)
                    .map(|e| e.offset())
                {
                    // The first record at or after the time is the log start, and the log lost
                    // records before it: they may be newer than the time asked for.
                    Some(Offset::Offset(offset))
                        if offset == low
                            && low > 0
                            && request.reset_mailboxes
                            && !request.allow_partial_history =>
                    {
                        return refuse(
                            "log_start_above_start",
                            format!(
                                "--from-time {ms} ms resolves to the log start {low}: retention already deleted the records before it, which may include records after that time; pass --allow-partial-history to rebuild from {low}"
                            ),
                        );
                    }
                    Some(Offset::Offset(offset)) if offset < high => offset,
                    _ => {
                        return refuse(
                            "from_time_past_end",
                            format!(
                                "no record of partition {} at or after --from-time {ms} ms",
                                self.partition
                            ),
                        )
                    }
                }
            }
        };
        let from = if from < low {
            if !request.allow_partial_history {
                return refuse(
                    "log_start_above_start",
                    format!(
                        "the partition's log starts at offset {low} (retention deleted the records before it), above the requested start {from}: a rebuild would miss them; pass --allow-partial-history to replay from {low}"
                    ),
                );
            }
            low
        } else {
            from
        };
        let end = request
            .to_offset
            .map_or(high, |to| to.saturating_add(1).min(high));
        if from >= end {
            return refuse(
                "empty_range",
                format!("offsets {from}..{end} of partition {} hold no record (the partition ends at {high})", self.partition),
            );
        }
        if request.reset_mailboxes {
            if let Some(committed) = committed.filter(|c| end < *c) {
                return refuse("end_below_committed", end_below(end, committed));
            }
        }
        Ok(Ok(Range { low, from, end }))
    }

    /// The first record in `[low, from)` with a delivery to one of `users`, read and decoded but
    /// never applied.
    async fn first_record_of(
        &self,
        users: &[UserId],
        low: i64,
        from: i64,
        config: &Config,
    ) -> Result<Option<(i64, UserId)>, String> {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&self.topic, self.partition, Offset::Offset(low))
            .map_err(|e| format!("kafka: {e}"))?;
        self.reader
            .assign(&assignment)
            .map_err(|e| format!("kafka: {e}"))?;
        let mut give_up = Instant::now() + STALL;
        loop {
            let (offset, payload) =
                match next_in_range(&self.reader, &self.topic, self.partition, from, give_up)
                    .await
                    .map_err(|(reason, _)| reason)?
                {
                    Next::Done => return Ok(None),
                    Next::Record(offset, payload) => (offset, payload),
                };
            give_up = Instant::now() + STALL;
            if let Ok(record) = decode(&payload, &config.decode_options()).map(|d| d.record) {
                if let Some(delivery) = record
                    .deliveries()
                    .into_iter()
                    .find(|d| users.contains(&d.mailbox().user_id))
                {
                    return Ok(Some((offset, delivery.mailbox().user_id.clone())));
                }
            }
        }
    }

    /// With the fences up: the end moves to the high watermark now (unless `--to-offset` fixed
    /// it), and must still cover what the daemon committed.
    async fn recheck_after_fence(
        &self,
        request: &ReplayRequest,
        range: &Range,
    ) -> Result<Result<i64, Refusal>, String> {
        let (_, high, committed) = tokio::task::block_in_place(|| self.offsets())?;
        // The daemon may have applied (not yet committed) every record below `high` before the
        // fence went up: a rebuild that stops earlier would drop the user's groups it wrote.
        if let Some(to) = request.to_offset.filter(|to| to.saturating_add(1) < high) {
            return Ok(Err(Refusal {
                reason: "end_below_log_end",
                detail: format!(
                    "--to-offset {to} is below the partition's end {high} at the fence: the daemon may already have written records after it, which the rebuilt mailbox would lose; a repair runs to the end of the partition (leave --to-offset out)"
                ),
            }));
        }
        let end = high.max(range.end);
        match committed.filter(|c| end < *c) {
            Some(committed) => Ok(Err(Refusal {
                reason: "end_below_committed",
                detail: end_below(end, committed),
            })),
            None => Ok(Ok(end)),
        }
    }
}

/// How a read of `[.., end)` goes on.
enum Next {
    Record(i64, Vec<u8>),
    /// The reader's position reached `end`: the range is read.
    Done,
}

/// The next record of the partition before `end`, or [`Next::Done`] once the reader's position
/// reached `end` — the last offsets of a range may be transaction markers, which are never
/// delivered, so the position, not the last offset seen, says when a range is read. `Err` when
/// the position was lost (retention deleted it: never a silent jump) or nothing arrived until
/// `give_up` (the broker is unreachable; retryable).
async fn next_in_range(
    reader: &StreamConsumer,
    topic: &str,
    partition: i32,
    end: i64,
    give_up: Instant,
) -> Result<Next, (String, bool)> {
    loop {
        match tokio::time::timeout(Duration::from_secs(1), reader.recv()).await {
            Ok(Ok(message)) => {
                let offset = message.offset();
                if offset >= end {
                    return Ok(Next::Done);
                }
                let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
                return Ok(Next::Record(offset, payload));
            }
            Ok(Err(e)) if position_lost(&e) => {
                return Err((
                    format!("the read position of partition {partition} is gone ({e}): retention deleted records of the range while it was read; rerun (with --allow-partial-history if the history is truly gone)"),
                    false,
                ))
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "replay consumer error"),
            Err(_) => {}
        }
        let position = reader.position().ok().and_then(|tpl| {
            tpl.find_partition(topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        });
        if position.is_some_and(|p| p >= end) {
            return Ok(Next::Done);
        }
        if Instant::now() >= give_up {
            return Err((
                format!("no record arrived for {STALL:?} while offsets up to {end} remained; is the broker reachable?"),
                true,
            ));
        }
    }
}

/// Whether a consumer error means the read position no longer exists.
fn position_lost(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode;
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
    )
}

fn end_below(end: i64, committed: i64) -> String {
    format!(
        "the replay would end at offset {end} but the daemon's group already committed {committed}: the rebuilt mailbox would miss records {end}..{committed}; raise --to-offset or leave it out"
    )
}

/// The replay's read-and-apply loop.
struct Rebuild<'a> {
    config: &'a Config,
    request: &'a ReplayRequest,
    store: Arc<dyn MailboxStore>,
    /// Staging views of the fenced users; other deliveries go to the live store.
    targets: HashMap<UserId, Arc<dyn MailboxStore>>,
    pipeline: PartitionPipeline<(), ()>,
    runner: Runner<DeliveryRef>,
    cancel: Cancel,
    summary: &'a mut ReplaySummary,
    corrupt_users: BTreeSet<UserId>,
    seen_users: BTreeSet<UserId>,
    wanted: BTreeSet<UserId>,
    progress: Progress,
    /// The first staged delivery has landed (the `replay.rebuilding` pause point is due).
    staged_any: bool,
    pause_rebuilding: bool,
}

impl Rebuild<'_> {
    /// Reads `range` and applies it. `Err((reason, retryable))` aborts the replay.
    async fn read(
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
            if source_done && self.pipeline.is_empty() {
                return Ok(());
            }
            let can_read = !source_done && !self.pipeline.is_full();
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
                attempt = self.runner.next() => {
                    self.on_attempt(attempt)?;
                    if std::mem::take(&mut self.pause_rebuilding) {
                        pause_point("replay.rebuilding").await;
                    }
                }
                next = next_in_range(reader, topic, self.request.partition, range.end, give_up), if can_read => {
                    match next? {
                        Next::Done => source_done = true,
                        Next::Record(offset, payload) => {
                            give_up = Instant::now() + STALL;
                            if offset >= next_offset {
                                next_offset = offset + 1;
                                self.admit(offset, &payload);
                                if next_offset >= range.end {
                                    source_done = true;
                                }
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
        let decoded = decode(payload, &self.config.decode_options()).map(|d| d.record);
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
        let Some(admission) = self.pipeline.admit(offset, (), 0, (), decoded) else {
            return;
        };
        for at in admission.ready {
            self.start(at, 0, Duration::ZERO);
        }
        if admission.settled.is_some() {
            // Counted, not dead-lettered again.
            self.pipeline.dead_lettered(offset);
        }
    }

    fn start(&mut self, at: DeliveryRef, attempt: u32, delay: Duration) {
        let Some(delivery) = self.pipeline.delivery(at).cloned() else {
            return;
        };
        let user = &delivery.mailbox().user_id;
        self.seen_users.insert(user.clone());
        let target = self.targets.get(user).unwrap_or(&self.store).clone();
        self.runner
            .start(at, target, delivery, attempt, delay, self.cancel.clone());
    }

    fn on_attempt(&mut self, attempt: Attempt<DeliveryRef>) -> Result<(), (String, bool)> {
        let Some(result) = attempt.result else {
            return Ok(());
        };
        let at = attempt.key;
        let disposition = Disposition::of(&result);
        let user = attempt.delivery.mailbox().user_id.clone();
        let result = match disposition {
            Disposition::Advance | Disposition::DeadLetter => result,
            Disposition::AbortRepair => {
                let reason = result.err().map(|e| e.to_string()).unwrap_or_default();
                return Err((format!("repair fence lost: {reason}"), false));
            }
            Disposition::Block if self.targets.contains_key(&user) => {
                // A staging copy is built from nothing: a corrupt verdict there means the rebuild
                // cannot be trusted, and it must never be swapped in.
                let reason = result.err().map(|e| e.to_string()).unwrap_or_default();
                return Err((
                    format!(
                        "the rebuild of {} failed closed ({reason}); nothing was swapped",
                        user.as_str()
                    ),
                    false,
                ));
            }
            Disposition::Block => {
                // A replay does not wait for a repair: it reports the mailbox and moves on.
                if self.corrupt_users.insert(user.clone()) {
                    if let Err(e) = &result {
                        tracing::error!(offset = at.offset, user = %user.as_str(), error = %e, "still corrupt");
                    }
                }
                result
            }
            Disposition::Retry { .. } => {
                if attempt.attempt + 1 >= MAX_TRANSIENT_ATTEMPTS {
                    let reason = result.err().map(|e| e.to_string()).unwrap_or_default();
                    return Err((
                        format!("gave up after {MAX_TRANSIENT_ATTEMPTS} attempts at offset {}: {reason}", at.offset),
                        true,
                    ));
                }
                if let Err(e) = &result {
                    tracing::warn!(offset = at.offset, error = %e, attempt = attempt.attempt, "transient store error; retrying");
                }
                let delay = self.config.kafka.backoff().delay(attempt.attempt);
                self.runner.start(
                    at,
                    self.targets.get(&user).unwrap_or(&self.store).clone(),
                    attempt.delivery,
                    attempt.attempt + 1,
                    delay,
                    self.cancel.clone(),
                );
                return Ok(());
            }
        };
        let word = match &result {
            Ok(outcome) => outcome.as_str(),
            Err(e) => e.outcome(),
        };
        *self.summary.groups.entry(word).or_default() += 1;
        if !self.staged_any && self.targets.contains_key(&user) {
            self.staged_any = true;
            self.pause_rebuilding = true;
        }
        let (next, settled) = self.pipeline.complete(at, result);
        if let Some(next) = next {
            self.start(next, 0, Duration::ZERO);
        }
        if let Some(settled) = settled {
            if settled.dead_letter.is_some() {
                self.pipeline.dead_lettered(settled.offset);
            }
        }
        Ok(())
    }

    /// Counts the records that left the window.
    fn settle(&mut self) {
        for record in self.pipeline.pop_final() {
            let word = replay_word(&record);
            self.count(word);
        }
    }

    fn count(&mut self, word: &'static str) {
        *self.summary.outcomes.entry(word).or_default() += 1;
        metrics::replay_record(word);
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
    } else {
        record.outcome.as_str()
    }
}

/// Progress on stderr: a redrawn bar on a terminal, a plain line every five seconds otherwise.
struct Progress {
    mode: ProgressMode,
    partition: i32,
    total: u64,
    done: u64,
    last: Instant,
}

impl Progress {
    fn new(mode: ProgressMode, partition: i32, total: i64) -> Self {
        Self {
            mode,
            partition,
            total: total.max(0) as u64,
            done: 0,
            last: Instant::now(),
        }
    }

    fn read(&mut self, n: u64) {
        self.done += n;
        let every = match self.mode {
            ProgressMode::Bar => Duration::from_millis(250),
            ProgressMode::Lines => Duration::from_secs(5),
            ProgressMode::Off => return,
        };
        if self.last.elapsed() >= every {
            self.draw();
            self.last = Instant::now();
        }
    }

    fn draw(&self) {
        let percent = (self.done * 100).checked_div(self.total).unwrap_or(100);
        let mut stderr = std::io::stderr();
        match self.mode {
            ProgressMode::Bar => {
                let width = 30u64;
                let filled = (self.done.min(self.total) * width)
                    .checked_div(self.total)
                    .unwrap_or(width) as usize;
                let _ = write!(
                    stderr,
                    "\rreplay partition {} [{}{}] {}/{} records ({percent}%)",
                    self.partition,
                    "#".repeat(filled),
                    ".".repeat(width as usize - filled),
                    self.done,
                    self.total
                );
            }
            ProgressMode::Lines => {
                let _ = writeln!(
                    stderr,
                    "replay partition {}: {}/{} records ({percent}%)",
                    self.partition, self.done, self.total
                );
            }
            ProgressMode::Off => {}
        }
        let _ = stderr.flush();
    }

    fn finish(&self) {
        match self.mode {
            ProgressMode::Bar => {
                self.draw();
                eprintln!();
            }
            ProgressMode::Lines => self.draw(),
            ProgressMode::Off => {}
        }
    }
}

/// Parses `--from-time`: milliseconds since the Unix epoch, or an RFC 3339 date-time (any
/// offset, optional fraction), checked as a real calendar date.
pub fn parse_time_ms(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return if ms >= 0 {
            Ok(ms)
        } else {
            Err("must not be negative".to_owned())
        };
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("{text:?} is neither milliseconds nor an RFC 3339 date-time such as 2026-02-03T04:05:06Z: {e}")
        })
        .and_then(|ms| {
            if ms >= 0 {
                Ok(ms)
            } else {
                Err(format!("{text:?} is before 1970"))
            }
        })
}

#[cfg(test)]
mod tests {
    use super::parse_time_ms;

    #[test]
    fn times_parse_as_ms_or_rfc3339_and_impossible_dates_are_refused() {
        assert_eq!(parse_time_ms("1764633600123"), Ok(1_764_633_600_123));
        assert_eq!(parse_time_ms("2025-12-02T00:00:00Z"), Ok(1_764_633_600_000));
        assert_eq!(parse_time_ms("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(
            parse_time_ms("2025-12-02T01:00:00+01:00"),
            Ok(1_764_633_600_000)
        );
        assert_eq!(
            parse_time_ms("2025-12-02T00:00:00.250Z"),
            Ok(1_764_633_600_250)
        );
        assert!(
            parse_time_ms("2026-02-31T00:00:00Z").is_err(),
            "no 31 February"
        );
        assert!(parse_time_ms("2025-13-02T00:00:00Z").is_err());
        assert!(parse_time_ms("yesterday").is_err());
        assert!(parse_time_ms("-5").is_err());
    }
}
