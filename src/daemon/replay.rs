//! `materializer replay`: re-reads one partition of the dispatch topic from an offset (or a
//! time) with its own assignment — no consumer group, no commits — and applies it again through
//! the daemon's code path. Replay is idempotent, so re-applying what is already there is safe.
//!
//! With `--reset-mailboxes` (which needs `--user`), the named users are first fenced in the store
//! (a running daemon's writes to them wait),
//! deleted, and rebuilt from the log; the fence is lifted at the end, also on failure, and its
//! lease expires on its own if this process dies.
//!
//! Records are applied one at a time in offset order. Malformed, rejected and conflicting
//! records are counted, not dead-lettered again: the daemon did that when it first read them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{metrics, RetryPolicy};
use crate::config::Config;
use crate::ingest::{apply_delivery, decode_record};
use crate::model::error::RetryClass;
use crate::model::{StoreError, UserId};
use crate::store::repair::{REPAIR_LEASE, REPAIR_RENEW_EVERY};
use crate::store::{MailboxStore, RepairToken, StagingView};

/// Transient store errors are retried this many times before the replay gives up.
const MAX_TRANSIENT_ATTEMPTS: u32 = 12;

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
    /// Last offset replayed (inclusive); default: the end of the partition when the replay starts.
    pub to_offset: Option<i64>,
    /// Only these users' deliveries are applied (all when empty).
    pub users: Vec<UserId>,
    pub reset_mailboxes: bool,
    pub dry_run: bool,
    /// Draw a progress line on stderr.
    pub progress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("--reset-mailboxes needs at least one --user: a partition's users are only known after reading it")]
    ResetWithoutUsers,
    #[error("store: {0}")]
    Store(StoreError),
    #[error("no record arrived for {0:?} while offsets remained; is the broker reachable?")]
    Stalled(Duration),
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
    pub reset_users: Vec<String>,
    pub removed_keys: u64,
    pub dry_run: bool,
    /// Users whose mailbox was still corrupt during the replay.
    pub corrupt_users: Vec<String>,
}

/// Runs a replay. With `--reset-mailboxes` the named users are rebuilt into staging copies under
/// their fences and swapped in at the end; on every other path out the staging copies are
/// abandoned and the live mailboxes stay as they were.
pub async fn replay(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    request: &ReplayRequest,
) -> Result<ReplaySummary, ReplayError> {
    if request.reset_mailboxes && request.users.is_empty() {
        return Err(ReplayError::ResetWithoutUsers);
    }
    let fenced = request.reset_mailboxes && !request.dry_run;
    let mut summary = ReplaySummary {
        partition: request.partition,
        dry_run: request.dry_run,
        ..ReplaySummary::default()
    };
    let mut tokens = Vec::new();
    if fenced {
        for user in &request.users {
            match store.repair_begin(user, REPAIR_LEASE).await {
                Ok(token) => tokens.push(token),
                Err(e) => {
                    abort(store.as_ref(), &tokens).await;
                    return Err(ReplayError::Store(e));
                }
            }
        }
    }
    let result = run(config, store.clone(), request, &mut summary, &tokens).await;
    if fenced {
        match result {
            Ok(()) => {
                for token in &tokens {
                    match store.repair_swap(token).await {
                        Ok(report) => {
                            summary.removed_keys += report.replaced;
                            summary.reset_users.push(token.user.as_str().to_owned());
                        }
                        Err(e) => {
                            abort(store.as_ref(), &tokens).await;
                            return Err(ReplayError::Store(e));
                        }
                    }
                }
            }
            Err(e) => {
                abort(store.as_ref(), &tokens).await;
                return Err(e);
            }
        }
    } else if request.reset_mailboxes {
        summary.reset_users = request
            .users
            .iter()
            .map(|u| u.as_str().to_owned())
            .collect();
    }
    result.map(|()| summary)
}

async fn abort(store: &dyn MailboxStore, tokens: &[RepairToken]) {
    for token in tokens {
        if let Err(e) = store.repair_abort(token).await {
            tracing::warn!(user = %token.user.as_str(), error = %e, "staging copy not removed; the next repair or patrol removes it");
        }
    }
}

async fn run(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    request: &ReplayRequest,
    summary: &mut ReplaySummary,
    tokens: &[RepairToken],
) -> Result<(), ReplayError> {
    let fenced = !tokens.is_empty();
    let staging: std::collections::HashMap<UserId, Arc<dyn MailboxStore>> = tokens
        .iter()
        .map(|t| {
            let view: Arc<dyn MailboxStore> = Arc::new(StagingView::new(store.clone(), t.clone()));
            (t.user.clone(), view)
        })
        .collect();
    let topic = config.kafka.topic.as_str();
    let mut client = super::kafka::base_config(&config.kafka);
    // librdkafka wants a group id even for a manual assignment; nothing is ever committed to it.
    client
        .set("group.id", format!("{}-replay", config.kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    let consumer: StreamConsumer = client.create()?;
    let timeout = Duration::from_secs(10);

    let (low, high) = {
        let topic = topic.to_owned();
        let partition = request.partition;
        let consumer_ref = &consumer;
        tokio::task::block_in_place(|| consumer_ref.fetch_watermarks(&topic, partition, timeout))?
    };
    let from = match request.start {
        ReplayStart::Offset(offset) => offset.max(low),
        ReplayStart::TimeMs(ms) => {
            let mut query = TopicPartitionList::new();
            query.add_partition_offset(topic, request.partition, Offset::Offset(ms))?;
            let found = tokio::task::block_in_place(|| consumer.offsets_for_times(query, timeout))?;
            match found
                .find_partition(topic, request.partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(offset)) => offset,
                _ => high,
            }
        }
    };
    let end = match request.to_offset {
        Some(to) => (to.saturating_add(1)).min(high),
        None => high,
    };
    summary.from_offset = from;
    summary.end_offset = end.max(from);

    if from >= end {
        return Ok(());
    }

    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, request.partition, Offset::Offset(from))?;
    consumer.assign(&assignment)?;

    let wanted: BTreeSet<&str> = request.users.iter().map(UserId::as_str).collect();
    let retry = RetryPolicy::from_config(config);
    let mut corrupt_users = BTreeSet::new();
    let mut last_renew = Instant::now();
    let mut last_draw = Instant::now();
    let total = (end - from) as u64;
    let stall = Duration::from_secs(60);
    loop {
        let message = match tokio::time::timeout(stall, consumer.recv()).await {
            Err(_) => return Err(ReplayError::Stalled(stall)),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "replay consumer error");
                continue;
            }
            Ok(Ok(message)) => message,
        };
        let offset = message.offset();
        if offset >= end {
            break;
        }
        let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
        drop(message);
        summary.records += 1;

        let outcome = match decode_record(&payload, config.kafka.max_record_bytes) {
            Err(e) => {
                tracing::info!(offset, error = %e, "malformed record (dead-lettered when first read)");
                "malformed"
            }
            Ok(record) => {
                let deliveries: Vec<_> = record
                    .deliveries()
                    .into_iter()
                    .filter(|d| wanted.is_empty() || wanted.contains(d.mailbox().user_id.as_str()))
                    .collect();
                if deliveries.is_empty() {
                    "skipped"
                } else if request.dry_run {
                    *summary.groups.entry("planned").or_default() += deliveries.len() as u64;
                    "planned"
                } else {
                    let mut outcome = "applied";
                    for delivery in &deliveries {
                        let target = staging.get(&delivery.mailbox().user_id).unwrap_or(&store);
                        let result = apply_with_retry(target.as_ref(), delivery, retry).await?;
                        let word = match &result {
                            Ok(o) => o.as_str(),
                            Err(e) => e.outcome(),
                        };
                        *summary.groups.entry(word).or_default() += 1;
                        match &result {
                            Err(e) if e.retry_class() == RetryClass::Corrupt => {
                                corrupt_users
                                    .insert(delivery.mailbox().user_id.as_str().to_owned());
                                tracing::error!(offset, user = %delivery.mailbox().user_id.as_str(), error = %e, "still corrupt");
                                outcome = "corrupt";
                            }
                            Err(_) if outcome == "applied" => outcome = "dead_lettered",
                            _ => {}
                        }
                    }
                    outcome
                }
            }
        };
        *summary.outcomes.entry(outcome).or_default() += 1;
        metrics::replay_record(outcome);

        if fenced && last_renew.elapsed() > REPAIR_RENEW_EVERY {
            for token in tokens {
                store
                    .repair_renew(token, REPAIR_LEASE)
                    .await
                    .map_err(ReplayError::Store)?;
            }
            last_renew = Instant::now();
        }
        let done = (offset - from + 1) as u64;
        if request.progress
            && (last_draw.elapsed() > Duration::from_millis(250) || offset + 1 >= end)
        {
            draw_progress(request.partition, done, total);
            last_draw = Instant::now();
        }
        if offset + 1 >= end {
            break;
        }
    }
    if request.progress {
        eprintln!();
    }
    summary.corrupt_users = corrupt_users.into_iter().collect();
    Ok(())
}

/// Applies one delivery, retrying transient errors a bounded number of times.
async fn apply_with_retry(
    store: &dyn MailboxStore,
    delivery: &crate::ingest::Delivery,
    retry: RetryPolicy,
) -> Result<Result<crate::ingest::DeliveryOutcome, StoreError>, ReplayError> {
    let mut attempt = 0;
    loop {
        let result = apply_delivery(store, delivery).await;
        match &result {
            Err(e) if e.retry_class() == RetryClass::Transient => {
                attempt += 1;
                if attempt >= MAX_TRANSIENT_ATTEMPTS {
                    return Err(ReplayError::Store(e.clone()));
                }
                tracing::warn!(error = %e, attempt, "transient store error; retrying");
                tokio::time::sleep(retry.delay(attempt)).await;
            }
            _ => return Ok(result),
        }
    }
}

fn draw_progress(partition: i32, done: u64, total: u64) {
    let width = 30usize;
    let filled = if total == 0 {
        width
    } else {
        ((done.min(total) as f64 / total as f64) * width as f64) as usize
    };
    let percent = (done * 100).checked_div(total).unwrap_or(100);
    let mut stderr = std::io::stderr();
    let _ = write!(
        stderr,
        "\rreplay partition {partition} [{}{}] {done}/{total} records ({percent}%)",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
    let _ = stderr.flush();
}

/// Parses `--from-time`: milliseconds since the Unix epoch, or `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn parse_time_ms(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return if ms >= 0 {
            Ok(ms)
        } else {
            Err("must not be negative".to_owned())
        };
    }
    let bad = || format!("{text:?} is neither milliseconds nor YYYY-MM-DDTHH:MM:SSZ");
    let text = text.strip_suffix('Z').ok_or_else(bad)?;
    let (date, time) = text.split_once('T').ok_or_else(bad)?;
    let date: Vec<i64> = date
        .split('-')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let time: Vec<i64> = time
        .split(':')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let ([y, m, d], [hh, mm, ss]) = (date.as_slice(), time.as_slice()) else {
        return Err(bad());
    };
    if !(1..=12).contains(m) || !(1..=31).contains(d) || *hh > 23 || *mm > 59 || *ss > 60 {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(((days * 86_400) + hh * 3600 + mm * 60 + ss) * 1000)
}

#[cfg(test)]
mod tests {
    use super::parse_time_ms;

    #[test]
    fn times_parse_as_ms_or_utc() {
        assert_eq!(parse_time_ms("1764633600123"), Ok(1_764_633_600_123));
        assert_eq!(parse_time_ms("2025-12-02T00:00:00Z"), Ok(1_764_633_600_000));
        assert_eq!(parse_time_ms("1970-01-01T00:00:01Z"), Ok(1000));
        assert!(parse_time_ms("2025-13-02T00:00:00Z").is_err());
        assert!(parse_time_ms("yesterday").is_err());
    }
}
