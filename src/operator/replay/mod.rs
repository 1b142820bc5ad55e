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
//!    group's committed offset (the rebuild would miss records the daemon already committed), a
//!    compacted topic (`cleanup.policy` contains `compact`: the log keeps only the newest record
//!    of each user, so the rebuilt mailbox would lose its history; see
//!    [`crate::daemon::topic_policy`]) or one whose policy cannot be read. No flag overrides it.
//! 2. **Fence** each named user ([`crate::store::MailboxStore::repair_begin`]): the daemon's writes
//!    to them wait. The end is read again *after* the fences are up, so every record the daemon
//!    wrote before them is inside the range, and every record after them waits for the swap.
//! 3. **Build aside**: the range is applied to the users' staging copies, the fences renewed by a
//!    task of their own ([`Renewal`]). The live mailboxes are untouched (a corrupt one keeps
//!    failing closed).
//! 4. **Check** that every named user had a record in the range (unless `--allow-empty`).
//! 5. **Swap** each user in one atomic step, after the topic's policy is read once more (a topic
//!    turned compacted during the rebuild is refused before anything is swapped). Any error, a lost fence, SIGINT/SIGTERM or a crash
//!    before it leaves the live mailboxes exactly as they were; the staging copies are removed
//!    (or collected later by the next repair or `patrol`), and a rerun starts over.
//!
//! Malformed, refused and conflicting records are counted, not dead-lettered again: the daemon
//! did that when it first read them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::config::Config;
use crate::daemon::topic_policy;
use crate::disposition::Disposition;
use crate::ingest::drive::Driver;
use crate::model::{Exit, UserId};
use crate::store::repair::Renewal;
use crate::store::{MailboxStore, RepairToken, StagingView};

mod fence;
pub(crate) use fence::holder_process_state;
mod other_partitions;
mod progress;
pub(crate) mod range;
mod rebuild;

pub(crate) use progress::Progress;
pub use progress::{parse_time_ms, ProgressMode};

use range::Clients;
use rebuild::Rebuild;

/// Transient store errors of one delivery are retried this many times before the replay gives up
/// (exit 2): an operator command must not hang on a store that is down.
const MAX_TRANSIENT_ATTEMPTS: u32 = 12;
/// Records read ahead of the slowest lane.
const WINDOW: usize = 2_000;
/// No record for this long while offsets remain: the broker is unreachable.
const STALL: Duration = Duration::from_secs(60);
/// How long the broker may take to describe the topic's configuration.
const POLICY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStart {
    Offset(i64),
    /// Milliseconds since the Unix epoch: the first record at or after it.
    TimeMs(i64),
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
    /// Go on although the replayed users have records on other partitions of the topic (a
    /// growth moved them): the operator replays the partitions in order.
    pub allow_other_partitions: bool,
    pub progress: ProgressMode,
    /// Lease of the repair fences: how long the daemon's writes to a user stay fenced if this
    /// process dies mid-repair. Renewed every third of it.
    pub lease: Duration,
    /// Holders of fences to take over when their process is provably gone (`--take-over-fence`).
    pub take_over: Vec<String>,
}

/// Why a replay refused to start (nothing was touched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `empty_range`, `from_time_in_future`, `from_time_past_end`, `log_start_above_start`,
    /// `user_before_start`, `end_below_committed`, `end_below_log_end`, `user_not_in_range`,
    /// `reset_without_user`, `compacted_topic`, `topic_policy_unknown`,
    /// `user_on_other_partition`, `other_partitions_unchecked`.
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
    /// Offsets of the range read that held no record: removed by compaction, or taken by
    /// transaction markers and aborted transactions. 0 until the whole range was read.
    pub offsets_without_record: u64,
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
    /// The abort was a signal's (SIGINT/SIGTERM): exit 4.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Set when the replay stopped midway (signal, lost fence, store or broker unreachable): the
    /// live mailboxes are as they were before it, and a rerun starts over.
    pub aborted: Option<String>,
    /// Why it stopped, when it stopped because the store or broker was unreachable or another
    /// repair held a fence: retry later (exit 2).
    #[serde(skip)]
    pub retryable: bool,
}

impl ReplaySummary {
    /// The exit status of `materializer replay` (SPEC 8.2): 0 done (every named user swapped),
    /// 1 refused, 2 aborted (unreachable, fenced by another repair, its own fence lost, its range
    /// deleted while read: each ends "rerun"), 3 a mailbox stays corrupt, 4 interrupted.
    pub fn exit_status(&self) -> Exit {
        if self.refused.is_some() {
            Exit::Finding
        } else if self.interrupted {
            Exit::Interrupted
        } else if self.aborted.is_some() {
            Exit::Retry
        } else if !self.corrupt_users.is_empty() {
            Exit::Corrupt
        } else {
            Exit::Done
        }
    }

    /// The `error` object of the summary when the replay did not end done: its kind and detail.
    pub fn failure(&self) -> Option<(&'static str, String)> {
        if let Some(refusal) = &self.refused {
            Some((
                "refused",
                format!("replay refused ({}): {}", refusal.reason, refusal.detail),
            ))
        } else if let Some(reason) = &self.aborted {
            let kind = if self.interrupted {
                "interrupted"
            } else if self.retryable {
                "unavailable"
            } else {
                "aborted"
            };
            Some((kind, format!("replay aborted: {reason}")))
        } else if !self.corrupt_users.is_empty() {
            Some((
                "corrupt",
                format!(
                    "still corrupt after the replay: {}",
                    self.corrupt_users.join(", ")
                ),
            ))
        } else {
            None
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

use crate::wall_clock::now_ms_signed as now_ms;

/// How a step ends the replay early. Whatever fences the repair holds are then abandoned in one
/// place ([`replay`]): renewal stopped, every staging copy not yet swapped removed, the live
/// mailboxes as they were.
enum Stop {
    /// Refused: nothing in the store was changed.
    Refused(Refusal),
    /// Stopped midway; worth running again (exit 2) when `retryable`.
    Aborted { reason: String, retryable: bool },
    /// The summary already says which (the topic policy's check writes its own).
    Said,
}

impl Stop {
    fn refused(reason: &'static str, detail: String) -> Self {
        Self::Refused(Refusal { reason, detail })
    }

    fn aborted(reason: impl Into<String>, retryable: bool) -> Self {
        Self::Aborted {
            reason: reason.into(),
            retryable,
        }
    }
}

/// The fences a repair holds and their renewal, so that one call gives them up.
struct Fences {
    store: Arc<dyn MailboxStore>,
    /// Taken and not yet swapped.
    tokens: Vec<RepairToken>,
    renewal: Option<Renewal>,
}

impl Fences {
    /// Stops renewing and removes the staging copies not swapped: the live mailboxes stay as
    /// they were.
    async fn abandon(&mut self) {
        self.stop_renewal();
        abort_all(self.store.as_ref(), &self.tokens).await;
        self.tokens.clear();
    }

    fn stop_renewal(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop();
        }
    }
}

/// Runs a replay to its end, its refusal or its abort; `interrupt` flips on SIGINT/SIGTERM.
pub async fn replay(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    interrupt: watch::Receiver<bool>,
) -> ReplaySummary {
    let mut summary = ReplaySummary {
        partition: request.partition,
        dry_run: request.dry_run,
        ..ReplaySummary::default()
    };
    let mut fences = Fences {
        store: store.clone(),
        tokens: Vec::new(),
        renewal: None,
    };
    let outcome = steps(
        config,
        &store,
        request,
        interrupt,
        &mut summary,
        &mut fences,
    )
    .await;
    if let Err(stop) = outcome {
        fences.abandon().await;
        match stop {
            Stop::Refused(refusal) => summary.refused = Some(refusal),
            Stop::Aborted { reason, retryable } => {
                summary.abort(reason, retryable);
            }
            Stop::Said => {}
        }
    }
    fences.stop_renewal();
    summary
}

/// The replay's steps, as the module's documentation numbers them.
async fn steps(
    config: &Config,
    store: &Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    mut interrupt: watch::Receiver<bool>,
    summary: &mut ReplaySummary,
    fences: &mut Fences,
) -> Result<(), Stop> {
    let fenced = request.reset_mailboxes && !request.dry_run;
    let (clients, log, mut range) = refuse_or_resolve(config, request, summary, fenced).await?;
    if fenced {
        take_fences(store, request, &clients, &mut range, summary, fences).await?;
    }
    let seen_users = build_aside(
        config,
        store,
        request,
        (&clients, log, &range),
        &mut interrupt,
        summary,
        fences,
    )
    .await?;
    if fenced {
        check_and_swap(
            config,
            store,
            request,
            &range,
            &seen_users,
            &interrupt,
            summary,
            fences,
        )
        .await?;
    }
    Ok(())
}

/// Step 1: refuse before touching anything. The range resolved, or why not.
async fn refuse_or_resolve(
    config: &Config,
    request: &ReplayRequest,
    summary: &mut ReplaySummary,
    fenced: bool,
) -> Result<(Clients, crate::model::LogId, range::Range), Stop> {
    if request.reset_mailboxes && request.users.is_empty() {
        return Err(Stop::refused(
            "reset_without_user",
            "--reset-mailboxes needs at least one --user: a partition's users are only known after reading it".to_owned(),
        ));
    }
    let clients = Clients::new(config, request.partition)
        .map_err(|e| Stop::aborted(format!("kafka: {e}"), true))?;
    if request.reset_mailboxes && !keeps_every_record(config, summary).await {
        return Err(Stop::Said);
    }
    // Each record re-applies with its own source position (SPEC 7.2), so a replay of the past
    // never reverts what a later record of the log wrote: without the log's identity it would.
    let log = clients
        .log_identity()
        .map_err(|e| Stop::aborted(format!("kafka: {e}"), true))?;
    let range = match clients.resolve(request).await {
        Ok(Ok(range)) => range,
        Ok(Err(refusal)) => return Err(Stop::Refused(refusal)),
        Err(e) => return Err(Stop::aborted(e, true)),
    };
    summary.from_offset = range.from;
    summary.end_offset = range.end;

    // A rebuild replaces the whole mailbox: a named user with records before the start would
    // lose them. Read (never apply) what the log holds before the start to be sure.
    if request.reset_mailboxes && range.from > range.low && !request.allow_partial_history {
        let found = clients
            .first_record_of(&request.users, range.low, range.from, config)
            .await
            .map_err(|e| Stop::aborted(e, true))?;
        if let Some((offset, user)) = found {
            return Err(Stop::refused(
                "user_before_start",
                format!(
                    "the log still holds a record of {} at offset {offset}, before the requested start {}: a rebuild from there would lose it; start at or before {offset} (or pass --allow-partial-history)",
                    user.as_str(),
                    range.from
                ),
            ));
        }
    }

    // A growth of the topic splits a user's history over partitions: one partition's range
    // alone would revert or drop what another holds (SPEC 7.2).
    if let Some(refusal) = other_partitions::check(&clients, config, request, &range)
        .await
        .map_err(|e| Stop::aborted(e, true))?
    {
        return Err(Stop::Refused(refusal));
    }

    // A rebuild of a named user the range never mentions would empty its mailboxes: read the
    // range (never apply it) and refuse before any fence goes up. (Checked again after the
    // rebuild, which reads the range as it stands then.)
    if fenced && !request.allow_empty {
        let seen = clients
            .users_in_range(&request.users, range.from, range.end, config)
            .await
            .map_err(|e| Stop::aborted(e, true))?;
        let missing: Vec<&str> = request
            .users
            .iter()
            .filter(|u| !seen.contains(*u))
            .map(UserId::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(Stop::refused(
                "user_not_in_range",
                not_in_range(&missing, &range),
            ));
        }
    }
    Ok((clients, log, range))
}

/// Step 2: fence each named user, renew the fences, and move the end to what the daemon wrote
/// before them.
async fn take_fences(
    store: &Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    clients: &Clients,
    range: &mut range::Range,
    summary: &mut ReplaySummary,
    fences: &mut Fences,
) -> Result<(), Stop> {
    {
        for user in &request.users {
            let token = fence::take(store.as_ref(), user, request.lease, &request.take_over)
                .await
                .map_err(|(reason, retryable)| Stop::aborted(reason, retryable))?;
            fences.tokens.push(token);
        }
        // Renewed from now on: the Kafka calls below may take several timeouts, and a short
        // lease must not lapse before its first renewal.
        fences.renewal = Some(Renewal::start(
            store.clone(),
            fences.tokens.clone(),
            request.lease,
            request.lease / 3,
        ));
        // Everything the daemon wrote before the fences is below the high watermark now.
        range.end = match clients.recheck_after_fence(request, range).await {
            Ok(Ok(end)) => end,
            Ok(Err(refusal)) => return Err(Stop::Refused(refusal)),
            Err(e) => return Err(Stop::aborted(e, true)),
        };
        summary.end_offset = range.end;
    }
    Ok(())
}

/// Step 3, build aside: the range applied to the fenced users' staging copies (the others' live
/// mailboxes, when nothing is fenced). Returns the users the range delivered to.
async fn build_aside(
    config: &Config,
    store: &Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    (clients, log, range): (&Clients, crate::model::LogId, &range::Range),
    interrupt: &mut watch::Receiver<bool>,
    summary: &mut ReplaySummary,
    fences: &mut Fences,
) -> Result<BTreeSet<UserId>, Stop> {
    pause_point("replay.fenced").await;
    let targets: HashMap<UserId, Arc<dyn MailboxStore>> = fences
        .tokens
        .iter()
        .map(|t| {
            let view: Arc<dyn MailboxStore> = Arc::new(StagingView::new(store.clone(), t.clone()));
            (t.user.clone(), view)
        })
        .collect();
    let mut run = Rebuild {
        config,
        request,
        log,
        targets,
        driver: {
            let mut driver = Driver::new(store.clone());
            driver.open((), WINDOW, ());
            driver
        },
        summary: &mut *summary,
        corrupt_users: BTreeSet::new(),
        seen_users: BTreeSet::new(),
        wanted: request.users.iter().cloned().collect(),
        progress: Progress::new(request.progress, request.partition, range.end - range.from),
        staged_any: false,
        pause_rebuilding: false,
    };
    let read = run
        .read(&clients.reader, range, interrupt, fences.renewal.as_mut())
        .await;
    run.driver.cancel_all();
    let corrupt_users = std::mem::take(&mut run.corrupt_users);
    let seen_users = std::mem::take(&mut run.seen_users);
    run.progress.finish();
    drop(run);
    summary.corrupt_users = corrupt_users
        .iter()
        .map(|u| u.as_str().to_owned())
        .collect();
    read.map_err(|(reason, retryable)| Stop::aborted(reason, retryable))?;
    summary.offsets_without_record = u64::try_from(range.end - range.from)
        .unwrap_or(0)
        .saturating_sub(summary.records);
    Ok(seen_users)
}

/// Steps 4 and 5: check that every named user had a record in the range, then swap each, once
/// nothing says stop.
#[allow(clippy::too_many_arguments)]
async fn check_and_swap(
    config: &Config,
    store: &Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    range: &range::Range,
    seen_users: &BTreeSet<UserId>,
    interrupt: &watch::Receiver<bool>,
    summary: &mut ReplaySummary,
    fences: &mut Fences,
) -> Result<(), Stop> {
    let missing: Vec<&str> = fences
        .tokens
        .iter()
        .filter(|t| !seen_users.contains(&t.user))
        .map(|t| t.user.as_str())
        .collect();
    if !missing.is_empty() && !request.allow_empty {
        return Err(Stop::refused(
            "user_not_in_range",
            not_in_range(&missing, range),
        ));
    }
    pause_point("replay.before_swap").await;
    // A signal that arrived after the last record was read still stops the repair: nothing has
    // been swapped yet.
    if *interrupt.borrow() {
        return Err(Stop::aborted(
            "interrupted by a signal before the swap; the live mailboxes are as they were",
            false,
        ));
    }
    // The policy again: a topic turned compacted while the range was read may have lost records
    // of it. Nothing is swapped then.
    if !keeps_every_record(config, summary).await {
        return Err(Stop::Said);
    }
    if let Some(reason) = fences.renewal.as_ref().and_then(Renewal::is_lost) {
        return Err(Stop::aborted(format!("repair fence lost: {reason}"), false));
    }
    while let Some(token) = fences.tokens.first().cloned() {
        match store.repair_swap(&token).await {
            Ok(report) => {
                // Its fence is lifted: stop renewing it (a renewal would find it gone), and it is
                // no longer this repair's to abandon.
                if let Some(renewal) = fences.renewal.as_ref() {
                    renewal.release(&token);
                }
                fences.tokens.remove(0);
                summary.staged_groups += report.staged_groups;
                summary.swapped_users.push(token.user.as_str().to_owned());
                tracing::info!(user = %token.user.as_str(), staged_groups = report.staged_groups, "rebuilt mailboxes swapped in");
            }
            Err(e) => {
                // Worth running again (exit 2) exactly when the disposition says retry.
                let retryable = matches!(Disposition::of_error(&e), Disposition::Retry { .. });
                return Err(Stop::aborted(
                    format!("swap of {} failed: {e}", token.user.as_str()),
                    retryable,
                ));
            }
        }
    }
    Ok(())
}

/// SPEC 7.1: a repair rebuilds a mailbox from the whole history in the log, which a compacted
/// topic no longer holds. True when the topic keeps every record; otherwise `summary` says why
/// the repair stops: refused (`compacted_topic`, or `topic_policy_unknown` when the broker
/// refuses to describe the topic: a policy that cannot be read is never taken as safe), or
/// aborted for a retry when the broker did not answer.
async fn keeps_every_record(config: &Config, summary: &mut ReplaySummary) -> bool {
    let topic = config.kafka.topic.as_str();
    match topic_policy::read(&config.kafka, topic, POLICY_TIMEOUT).await {
        Ok(policy) if policy.is_compacted() => {
            summary.refuse("compacted_topic", policy.consequence(topic));
        }
        Ok(_) => return true,
        Err(e) if e.is_transient() => {
            summary.abort(format!("kafka: {e}"), true);
        }
        Err(e) => {
            summary.refuse(
                "topic_policy_unknown",
                format!(
                    "{e}; a repair must know that the topic keeps every record (is not compacted) before it touches a mailbox"
                ),
            );
        }
    }
    false
}

/// The detail of a `user_not_in_range` refusal.
fn not_in_range(missing: &[&str], range: &range::Range) -> String {
    format!(
        "no record of {} in offsets {}..{}: a rebuild would empty the mailbox; check --partition and the range, or force it with --allow-empty",
        missing.join(", "),
        range.from,
        range.end
    )
}

async fn abort_all(store: &dyn MailboxStore, tokens: &[RepairToken]) {
    for token in tokens {
        if let Err(e) = store.repair_abort(token).await {
            tracing::warn!(user = %token.user.as_str(), error = %e, "staging copy not removed; the next repair of the user or patrol removes it");
        }
    }
}
