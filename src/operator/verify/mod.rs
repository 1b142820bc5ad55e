//! `materializer verify`: a scrub. Reads a range of one partition, derives each user's mailbox
//! from it with the memory store as the reference (the same decode and rules as every front end),
//! reads the live store, and says per mailbox `match`, `differs`, `corrupt` or `unknown`.
//! Read-only on the live store: it calls only `inspect`, `range_scan` and `seq_positions`.
//!
//! - **The range** ends at the daemon group's committed offset (or `--to-offset`, whichever is
//!   lower): a record the daemon has not applied yet is not a difference. A seq the daemon
//!   rewrote after the end carries that newer position and is not compared ([`compare`]).
//! - **Bounded memory**: users are verified in batches chosen by a hash of the user id. A batch
//!   holds at most `batch_bytes` of record payloads (the decoded deliveries and the reference
//!   built from them take a small multiple of that); a batch that would hold more is split in two
//!   and read again. Each batch reads the range once.
//! - **Gentle**: `max_records_per_second` paces the reads, and at most `store_concurrency`
//!   mailboxes are read from the store at once.

mod compare;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::watch;

use compare::{Bounds, Expected, Held};
pub use compare::{Findings, Unknown};

use super::replay::range::Clients;
use super::replay::{Progress, ProgressMode, ReplayRequest, ReplayStart};
use crate::config::Config;
use crate::ingest::{apply_delivery, decode, Delivery};
use crate::model::{CursorExpired, Exit, MailboxId, ScanRequest, ScannedGroup, StoreError, UserId};
use crate::store::memory::MemoryStore;
use crate::store::{MailboxStore, SystemClock};

/// Record payload bytes one batch holds by default.
pub const DEFAULT_BATCH_BYTES: usize = 64 << 20;
/// Groups per page of the full scans.
const SCAN_PAGE: u32 = 500;

#[derive(Debug, Clone)]
pub struct VerifyRequest {
    pub partition: i32,
    pub start: ReplayStart,
    /// Last offset verified (inclusive); it never passes the group's committed offset.
    pub to_offset: Option<i64>,
    /// Only these users (all when empty).
    pub users: Vec<UserId>,
    pub progress: ProgressMode,
    pub batch_bytes: usize,
    pub max_records_per_second: Option<u32>,
    pub store_concurrency: usize,
    /// Users a running replica holds failing closed (`/debug/blocked`), with its reason:
    /// reported `corrupt`.
    pub blocked: BTreeMap<UserId, String>,
}

/// The verdict on one mailbox.
#[derive(Debug, Clone, Serialize)]
pub struct MailboxReport {
    pub user_id: String,
    pub epoch: u32,
    /// `match`, `differs`, `corrupt` or `unknown`.
    pub verdict: &'static str,
    #[serde(flatten)]
    pub findings: Findings,
    /// Why it is `corrupt` (the store's verdict, or a replica's block), or the error that left
    /// it `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The summary line.
#[derive(Debug, Default, Clone, Serialize)]
pub struct VerifySummary {
    pub partition: i32,
    pub from_offset: i64,
    pub end_offset: i64,
    /// The daemon group's committed offset when the verify started (`None`: never committed).
    pub committed_offset: Option<i64>,
    pub records: u64,
    /// Records that do not decode (the daemon dead-lettered them).
    pub malformed: u64,
    pub users: u64,
    pub batches: u64,
    pub verdicts: BTreeMap<&'static str, u64>,
    pub seconds: f64,
    /// Why it stopped before the end (store or broker unreachable: exit 2; a signal: exit 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    /// The abort was a signal's (SIGINT/SIGTERM): exit 4.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Why it refused to start (an empty range): exit 1, nothing was read from the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl VerifySummary {
    /// SPEC 8.2: 0 nothing differs, 1 a mailbox differs or the range is empty (refused), 2
    /// unreachable, 3 a mailbox is corrupt, 4 interrupted.
    pub fn exit_status(&self) -> Exit {
        let count = |verdict: &str| self.verdicts.get(verdict).copied().unwrap_or(0);
        if self.interrupted {
            Exit::Interrupted
        } else if self.aborted.is_some() {
            Exit::Retry
        } else if self.refused.is_some() {
            Exit::Finding
        } else if count("corrupt") > 0 {
            Exit::Corrupt
        } else if count("differs") > 0 {
            Exit::Finding
        } else {
            Exit::Done
        }
    }

    /// The `error` object of the summary when the verify stopped or refused.
    pub fn failure(&self) -> Option<(&'static str, String)> {
        match (&self.aborted, &self.refused) {
            (Some(reason), _) if self.interrupted => {
                Some(("interrupted", format!("verify stopped: {reason}")))
            }
            (Some(reason), _) => Some(("unavailable", format!("verify stopped: {reason}"))),
            (None, Some(reason)) => Some(("refused", format!("verify refused: {reason}"))),
            (None, None) => None,
        }
    }
}

/// Stable hash of a user id: which batch it is verified in.
fn bucket_of(user: &UserId, buckets: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in user.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash % buckets
}

/// Runs a verify to its end; `report` gets every mailbox's verdict as it is decided.
pub async fn verify(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    request: &VerifyRequest,
    mut report: impl FnMut(&MailboxReport),
    interrupt: watch::Receiver<bool>,
) -> VerifySummary {
    let started = Instant::now();
    let mut summary = VerifySummary {
        partition: request.partition,
        ..VerifySummary::default()
    };
    let clients = match Clients::new(config, request.partition) {
        Ok(clients) => clients,
        Err(e) => {
            summary.aborted = Some(format!("kafka: {e}"));
            return summary;
        }
    };
    let log = match clients.log_identity() {
        Ok(log) => log,
        Err(e) => {
            summary.aborted = Some(format!("kafka: {e}"));
            return summary;
        }
    };
    let as_replay = ReplayRequest {
        partition: request.partition,
        start: request.start,
        to_offset: request.to_offset,
        users: request.users.clone(),
        reset_mailboxes: false,
        dry_run: true,
        allow_partial_history: true,
        allow_empty: true,
        allow_other_partitions: true,
        progress: ProgressMode::Off,
        lease: Duration::from_secs(30),
        take_over: Vec::new(),
    };
    let range = match clients.resolve(&as_replay).await {
        Ok(Ok(range)) => range,
        Ok(Err(refusal)) => {
            summary.refused = Some(format!("{}: {}", refusal.reason, refusal.detail));
            return summary;
        }
        Err(e) => {
            summary.aborted = Some(e);
            return summary;
        }
    };
    let committed = match tokio::task::block_in_place(|| clients.offsets()) {
        Ok((_, _, committed)) => committed,
        Err(e) => {
            summary.aborted = Some(e);
            return summary;
        }
    };
    summary.committed_offset = committed;
    let end = committed.map_or(range.end, |c| c.min(range.end));
    summary.from_offset = range.from;
    summary.end_offset = end;
    if range.from >= end {
        summary.refused = Some(format!(
            "empty_range: offsets {}..{end} of partition {} hold nothing the daemon committed",
            range.from, request.partition
        ));
        return summary;
    }
    let bounds = Bounds {
        log,
        partition: request.partition,
        from: range.from,
        end,
    };
    let wanted: BTreeSet<UserId> = request.users.iter().cloned().collect();
    let mut worklist: Vec<(u64, u64)> = vec![(1, 0)];
    let mut paced = Pacer::new(request.max_records_per_second);
    while let Some((buckets, bucket)) = worklist.pop() {
        summary.batches += 1;
        let read = read_batch(
            config,
            &clients,
            request,
            &bounds,
            &wanted,
            (buckets, bucket),
            &mut paced,
            &interrupt,
        )
        .await;
        let batch = match read {
            Err(reason) => {
                summary.aborted = Some(reason);
                break;
            }
            Ok(None) => {
                // Too much for one batch: each half is read again on its own.
                worklist.push((buckets * 2, bucket + buckets));
                worklist.push((buckets * 2, bucket));
                continue;
            }
            Ok(Some(batch)) => batch,
        };
        // Every batch reads the whole range: the counts are the range's.
        summary.records = batch.records;
        summary.malformed = batch.malformed;
        match judge(config, store.as_ref(), request, &bounds, batch).await {
            Ok(reports) => {
                for r in &reports {
                    summary.users += 1;
                    *summary.verdicts.entry(r.verdict).or_default() += 1;
                    report(r);
                }
            }
            Err(e) => {
                summary.aborted = Some(format!("the store: {e}"));
                break;
            }
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary
}

/// Paces reads at most `per_second` records a second.
struct Pacer {
    per_second: Option<u32>,
    started: Instant,
    records: u64,
}

impl Pacer {
    fn new(per_second: Option<u32>) -> Self {
        Self {
            per_second,
            started: Instant::now(),
            records: 0,
        }
    }

    /// One record read: sleeps while ahead of the pace.
    fn one(&mut self) {
        self.records += 1;
        let Some(rate) = self.per_second.filter(|r| *r > 0) else {
            return;
        };
        let due = Duration::from_secs_f64(self.records as f64 / f64::from(rate));
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            tokio::task::block_in_place(|| std::thread::sleep(ahead));
        }
    }
}

/// One batch: its users' deliveries in offset order, the bytes they came from, and counts.
struct Batch {
    deliveries: Vec<(i64, Delivery)>,
    records: u64,
    malformed: u64,
}

/// Reads the range for the users of `bucket` of `buckets`: `Ok(None)` when they hold more than
/// `batch_bytes`.
#[allow(clippy::too_many_arguments)]
async fn read_batch(
    config: &Config,
    clients: &Clients,
    request: &VerifyRequest,
    bounds: &Bounds,
    wanted: &BTreeSet<UserId>,
    (buckets, bucket): (u64, u64),
    pacer: &mut Pacer,
    interrupt: &watch::Receiver<bool>,
) -> Result<Option<Batch>, String> {
    let mut batch = Batch {
        deliveries: Vec::new(),
        records: 0,
        malformed: 0,
    };
    let mut held_bytes = 0usize;
    let mut overflow = false;
    let mut interrupted = false;
    let mut progress = Progress::named(
        "verify",
        request.progress,
        request.partition,
        bounds.end - bounds.from,
    );
    let options = config.decode_options();
    clients
        .read_records(bounds.from, bounds.end, |offset, payload| {
            batch.records += 1;
            progress.read(1);
            pacer.one();
            if *interrupt.borrow() {
                interrupted = true;
                return true;
            }
            let Ok(decoded) = decode(payload, &options) else {
                batch.malformed += 1;
                return false;
            };
            let record = decoded
                .record
                .at_position(Some(&bounds.log), bounds.partition, offset);
            let mut kept = false;
            for delivery in record.deliveries() {
                let user = &delivery.mailbox().user_id;
                if (wanted.is_empty() || wanted.contains(user))
                    && bucket_of(user, buckets) == bucket
                {
                    batch.deliveries.push((offset, delivery));
                    kept = true;
                }
            }
            if kept {
                held_bytes += payload.len();
                if held_bytes > request.batch_bytes {
                    overflow = true;
                    return true;
                }
            }
            false
        })
        .await
        .map_err(|(reason, _)| reason)?;
    progress.finish();
    if interrupted {
        return Err("interrupted by a signal".to_owned());
    }
    Ok((!overflow).then_some(batch))
}

/// Builds the batch's reference and compares each of its mailboxes with the store.
async fn judge(
    config: &Config,
    store: &dyn MailboxStore,
    request: &VerifyRequest,
    bounds: &Bounds,
    batch: Batch,
) -> Result<Vec<MailboxReport>, StoreError> {
    let policy = config.retention.policy();
    let clock = Arc::new(SystemClock);
    let reference = MemoryStore::new(policy, clock);
    let mut expected: BTreeMap<UserId, (u32, Expected)> = BTreeMap::new();
    for (offset, delivery) in &batch.deliveries {
        let mailbox = delivery.mailbox();
        let entry = expected
            .entry(mailbox.user_id.clone())
            .or_insert_with(|| (mailbox.epoch, Expected::default()));
        if mailbox.epoch > entry.0 {
            // A newer epoch replaces the older one, in the reference as in the store.
            *entry = (mailbox.epoch, Expected::default());
        }
        if mailbox.epoch == entry.0 {
            match delivery {
                Delivery::Append(group) => {
                    entry.1.delivered.insert(group.mailbox_seq, *offset);
                }
                Delivery::Truncate { .. } => entry.1.truncated = true,
            }
        }
        // The reference's own answer (a refusal, a conflict) is what the store answered too;
        // a corrupt verdict means the range lacks the history before it.
        let answer = apply_delivery(&reference, delivery).await;
        if let (Err(StoreError::Corrupt { .. }), Delivery::Append(group)) = (&answer, delivery) {
            if let Some((epoch, want)) = expected.get_mut(&mailbox.user_id) {
                if *epoch == mailbox.epoch {
                    want.undecidable.insert(group.mailbox_seq);
                }
            }
        }
    }
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let reference = &reference;
    let policy = &policy;
    let results: Vec<Result<MailboxReport, StoreError>> = futures::stream::iter(
        expected
            .into_iter()
            .map(|(user, (epoch, mut want))| async move {
                let mailbox = MailboxId {
                    user_id: user.clone(),
                    epoch,
                };
                let blocked = request.blocked.get(&user).cloned();
                match full_scan(reference, &mailbox).await {
                    Ok(groups) => want.groups = groups,
                    Err(e) if blocked.is_none() => return Ok(unreadable_reference(&mailbox, &e)),
                    Err(_) => {}
                }
                judge_one(store, &mailbox, &want, bounds, policy, now_secs, blocked).await
            }),
    )
    .buffer_unordered(request.store_concurrency.max(1))
    .collect()
    .await;
    let mut reports = Vec::with_capacity(results.len());
    for result in results {
        reports.push(result?);
    }
    reports.sort_by(|a, b| a.user_id.cmp(&b.user_id));
    Ok(reports)
}

/// `unknown`: the reference refuses to read what the range built (its history starts before
/// the range).
fn unreadable_reference(mailbox: &MailboxId, e: &StoreError) -> MailboxReport {
    MailboxReport {
        user_id: mailbox.user_id.as_str().to_owned(),
        epoch: mailbox.epoch,
        verdict: "unknown",
        findings: Findings {
            unknown: vec![Unknown {
                seq: 0,
                why: "the reference cannot read what the range builds: the mailbox's history starts before the range",
            }],
            ..Findings::default()
        },
        detail: Some(format!("{}: {e}", e.kind())),
    }
}

/// One mailbox's verdict; `Err` only when the store is unreachable.
async fn judge_one(
    store: &dyn MailboxStore,
    mailbox: &MailboxId,
    want: &Expected,
    bounds: &Bounds,
    policy: &crate::model::RetentionPolicy,
    now_secs: u64,
    blocked: Option<String>,
) -> Result<MailboxReport, StoreError> {
    let mut report = MailboxReport {
        user_id: mailbox.user_id.as_str().to_owned(),
        epoch: mailbox.epoch,
        verdict: "match",
        findings: Findings::default(),
        detail: None,
    };
    if let Some(why) = blocked {
        report.verdict = "corrupt";
        report.detail = Some(why);
        return Ok(report);
    }
    let inspection = match store.inspect(mailbox).await {
        Ok(inspection) => inspection,
        Err(e) => return verdict_of_error(report, e),
    };
    if inspection
        .current_epoch
        .is_some_and(|current| current > mailbox.epoch)
    {
        report.verdict = "unknown";
        report.findings.unknown.push(Unknown {
            seq: 0,
            why: "the store holds a newer epoch than the range's last",
        });
        return Ok(report);
    }
    let groups = if inspection.current_epoch == Some(mailbox.epoch) {
        match full_scan(store, mailbox).await {
            Ok(groups) => groups,
            Err(e) => return verdict_of_error(report, e),
        }
    } else {
        BTreeMap::new()
    };
    let positions = match store.seq_positions(mailbox).await {
        Ok(positions) => positions.into_iter().map(|p| (p.seq, p.position)).collect(),
        Err(e) => return verdict_of_error(report, e),
    };
    // The metadata is read again last: the checks of the events against it
    // ([`compare::compare`]) need metadata at least as new as the events and identities read,
    // while a daemon may be writing to the mailbox (proofs and the newest seq only grow).
    let inspection = match store.inspect(mailbox).await {
        Ok(inspection) => inspection,
        Err(e) => return verdict_of_error(report, e),
    };
    let held = Held {
        groups,
        positions,
        user_trim_seq: inspection.user_trim_seq,
        newest_seq: inspection.seqbucket_max_seq,
        proofs: inspection
            .active_days
            .iter()
            .filter(|(_, day)| day.expires_at > now_secs)
            .map(|(day, proof)| (*day, proof.max_seq))
            .collect(),
    };
    report.findings = compare::compare(want, &held, bounds, policy, now_secs);
    report.verdict = if report.findings.differs() {
        "differs"
    } else if report.findings.unknown.is_empty() {
        "match"
    } else {
        "unknown"
    };
    Ok(report)
}

/// A store error as a verdict: corrupt is the store's own; unreachable ends the verify.
fn verdict_of_error(mut report: MailboxReport, e: StoreError) -> Result<MailboxReport, StoreError> {
    match e {
        StoreError::Corrupt { .. } => {
            report.verdict = "corrupt";
            report.detail = Some(format!("{}: {e}", e.kind()));
            Ok(report)
        }
        StoreError::Unavailable { .. } => Err(e),
        other => {
            report.verdict = "unknown";
            report.findings.unknown.push(Unknown {
                seq: 0,
                why: "the store answered the read with an error",
            });
            report.detail = Some(format!("{}: {other}", other.kind()));
            Ok(report)
        }
    }
}

/// Every live group of the mailbox, paging through expired gaps and trims.
async fn full_scan(
    store: &dyn MailboxStore,
    mailbox: &MailboxId,
) -> Result<BTreeMap<u64, ScannedGroup>, StoreError> {
    let mut groups = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = store
            .range_scan(
                mailbox,
                ScanRequest {
                    after_seq: after,
                    until_seq: None,
                    limit_groups: SCAN_PAGE,
                },
            )
            .await;
        match page {
            Ok(page) => {
                for group in page.groups {
                    groups.insert(group.mailbox_seq, group);
                }
                if !page.has_more || page.up_to <= after {
                    return Ok(groups);
                }
                after = page.up_to;
            }
            Err(StoreError::CursorExpired {
                cursor: CursorExpired::Trimmed { resume_after },
            }) if resume_after > after => after = resume_after,
            Err(StoreError::CursorExpired {
                cursor: CursorExpired::ExpiredGap { boundary },
            }) if boundary > after => after = boundary,
            Err(StoreError::EpochMismatch { .. }) => return Ok(groups),
            Err(e) => return Err(e),
        }
    }
}
