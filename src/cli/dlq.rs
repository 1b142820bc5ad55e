//! `materializer dlq`: the dead-letter topic read back — `list` and `show` its letters, and
//! `redrive` the original records once the cause is fixed.
//!
//! `redrive` applies the records through the same drive loop and policy as `apply`
//! ([`ApplyPolicy`]): idempotent replay makes a second re-drive harmless, a corrupt mailbox is
//! reported (exit 3), a user under repair or an unreachable store stops the run (exit 2) with
//! nothing past it committed. A record refused again is printed (`refused_again`, exit 1), never
//! dead-lettered again, so nothing loops. Progress is the committed offsets of its own consumer
//! group on the dead-letter topic (`<kafka.group_id>-dlq-redrive-<kind or all>`): committed up
//! to the first letter that was not re-driven — a record not final yet (the run stopped), a
//! record refused again or whose source is gone, a letter a time or partition filter passed
//! over — so the next run (after the next fix, or without the filter) sees it again. Letters of
//! another kind are passed: the group is the kind's.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::apply::{is_corrupt, report_failure, ApplyPolicy, Failure};
use super::fail_with;
use crate::config::Config;
use crate::ingest::decode;
use crate::ingest::drive::Driver;
use crate::ingest::pipeline::{FinalRecord, RecordOutcome};
use crate::model::Exit;
use crate::model::LogId;
use crate::operator::dlq_reader::{
    fetch, log_identity, DeadLetterMessage, DlqReader, PartitionSpan,
};
use crate::operator::replay::parse_time_ms;
use crate::store::MailboxStore;

use super::output::ApplyLine;

/// Records of one dead-letter partition in the re-drive's window at once.
const WINDOW: usize = 4096;
/// Bytes of a payload `show` prints by default.
const DEFAULT_SHOW_BYTES: usize = 4096;

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    pub command: DlqCommand,
}

impl DlqArgs {
    /// Whether this is `dlq show`.
    pub(super) fn shows(&self) -> bool {
        matches!(self.command, DlqCommand::Show(_))
    }
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// One JSON line per dead letter (its headers decoded, not its payload), per partition in
    /// offset order, up to the topic's end when the command started.
    List(ListArgs),
    /// One dead letter as a JSON object: every header, and its payload (as JSON when it is one,
    /// excerpted beyond --max-payload-bytes).
    Show(ShowArgs),
    /// Apply the original records of dead letters again (the record from its source topic when
    /// the letter holds an excerpt), printing one JSON line per record. Exit 0 all applied, 1 a
    /// record was refused again, 2 the store or a repair stopped the run (rerun later), 3 a
    /// mailbox is corrupt.
    Redrive(RedriveArgs),
}

/// Which letters a command looks at.
#[derive(Debug, Clone, Args)]
pub struct Filter {
    /// Only letters of this kind (`error_kind`, e.g. store_refused, future_created_at) or
    /// outcome (`error_outcome`, e.g. rejected, conflict, malformed).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// Only letters produced at or after this time (ms since the epoch, RFC 3339, or a duration
    /// ago such as 24h).
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub since: Option<i64>,
    /// Only letters produced before this time (ms since the epoch, RFC 3339, or a duration ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub until: Option<i64>,
    /// Only letters of records read from this partition of the dispatch topic (the old
    /// spelling `--source-partition` is accepted for one release).
    #[arg(long = "partition", alias = "source-partition", value_name = "P")]
    pub source_partition: Option<i32>,
}

impl Filter {
    fn kind_matches(&self, letter: &DeadLetterMessage) -> bool {
        self.kind.as_deref().is_none_or(|k| letter.is_of_kind(k))
    }

    /// The other filters (time, source partition).
    fn rest_matches(&self, letter: &DeadLetterMessage) -> bool {
        let at = letter.timestamp_ms.unwrap_or(0);
        self.since.is_none_or(|s| at >= s)
            && self.until.is_none_or(|u| at < u)
            && self
                .source_partition
                .is_none_or(|p| letter.source().is_some_and(|(_, sp, _)| sp == p))
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: Filter,
    /// At most this many letters.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The letter's partition of the dead-letter topic (`--partition`, the old spelling, is
    /// accepted for one release: `--partition` names a dispatch-topic partition everywhere).
    #[arg(long = "dlq-partition", alias = "partition", value_name = "P")]
    pub partition: i32,
    /// The letter's offset.
    #[arg(long, value_name = "O")]
    pub offset: i64,
    /// Most payload bytes printed; a longer payload is shown as an excerpt.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SHOW_BYTES)]
    pub max_payload_bytes: usize,
}

#[derive(Debug, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub filter: Filter,
    /// The consumer group keeping the re-drive's progress (default
    /// `<kafka.group_id>-dlq-redrive-<kind or all>`).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Start at the topic's beginning instead of the group's committed offsets (every letter
    /// again: the ones re-driven before answer `unchanged`).
    #[arg(long)]
    pub from_beginning: bool,
    /// Print what would be re-driven (the `list` lines); write and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Progress on stderr: a count redrawn on a terminal, a line every 5 s otherwise, or none.
    #[arg(long, value_enum, default_value_t = super::run::ProgressArg::Auto)]
    pub progress: super::run::ProgressArg,
}

/// A letter as `list` prints it.
#[derive(Debug, Serialize)]
struct ListLine<'a> {
    partition: i32,
    offset: i64,
    timestamp_ms: Option<i64>,
    kind: &'a str,
    outcome: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_topic: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch_id: Option<&'a str>,
    truncated: bool,
    payload_bytes: usize,
}

impl<'a> ListLine<'a> {
    fn of(letter: &'a DeadLetterMessage) -> Self {
        let source = letter.source();
        Self {
            partition: letter.partition,
            offset: letter.offset,
            timestamp_ms: letter.timestamp_ms,
            kind: letter.kind(),
            outcome: letter.outcome(),
            detail: letter.headers.get("error_detail").map(String::as_str),
            source_topic: source.map(|s| s.0),
            source_partition: source.map(|s| s.1),
            source_offset: source.map(|s| s.2),
            dispatch_id: letter.headers.get("dispatch_id").map(String::as_str),
            truncated: letter.truncated(),
            payload_bytes: letter.value.len(),
        }
    }
}

pub(super) async fn run(config: &Config, args: &DlqArgs) -> ExitCode {
    match &args.command {
        DlqCommand::List(args) => list(config, args).await,
        DlqCommand::Show(args) => show(config, args).await,
        DlqCommand::Redrive(args) => {
            let opened = match super::open_store_for_command(config).await {
                Ok(opened) => opened,
                Err(failure) => return failure.report(),
            };
            let code = redrive(opened.store.clone(), config, args).await;
            if let Err(e) = opened.persist() {
                return fail_with(Exit::Retry, "snapshot", e);
            }
            code
        }
    }
}

fn print<T: Serialize>(value: &T) {
    if let Ok(text) = serde_json::to_string(value) {
        println!("{text}");
    }
}

/// Opens a reader on every partition from `start` (or each partition's beginning) to its end now.
fn open_reader(
    config: &Config,
    group: &str,
    start: impl FnOnce(&DlqReader, &[PartitionSpan]) -> Result<BTreeMap<i32, i64>, String>,
) -> Result<DlqReader, String> {
    let mut reader = DlqReader::open(config, group)?;
    let spans = reader.partitions()?;
    let starts = start(&reader, &spans)?;
    let ranges = spans
        .iter()
        .map(|s| {
            let from = starts.get(&s.partition).copied().unwrap_or(s.low);
            (s.partition, (from.clamp(s.low, s.high), s.high))
        })
        .collect();
    reader.assign(&ranges)?;
    Ok(reader)
}

/// The first offsets at or after `since` (each partition's beginning without it).
fn since_offsets(
    reader: &DlqReader,
    spans: &[PartitionSpan],
    since: Option<i64>,
) -> Result<BTreeMap<i32, i64>, String> {
    match since {
        Some(ms) => reader.offsets_for_time(spans, ms),
        None => Ok(spans.iter().map(|s| (s.partition, s.low)).collect()),
    }
}

async fn list(config: &Config, args: &ListArgs) -> ExitCode {
    let group = format!("{}-dlq-inspect", config.kafka.group_id);
    let since = args.filter.since;
    let mut reader = match open_reader(config, &group, |r, s| since_offsets(r, s, since)) {
        Ok(reader) => reader,
        Err(e) => {
            return fail_with(Exit::Retry, "unavailable", e);
        }
    };
    let mut printed = 0usize;
    while args.limit.is_none_or(|limit| printed < limit) {
        match reader.next().await {
            Ok(Some(letter)) => {
                if args.filter.kind_matches(&letter) && args.filter.rest_matches(&letter) {
                    print(&ListLine::of(&letter));
                    printed += 1;
                }
            }
            Ok(None) => break,
            Err(e) => {
                return fail_with(Exit::Retry, "unavailable", e);
            }
        }
    }
    ExitCode::SUCCESS
}

async fn show(config: &Config, args: &ShowArgs) -> ExitCode {
    let letter = match fetch(config, &config.kafka.dlq_topic, args.partition, args.offset).await {
        Ok(Some(letter)) => letter,
        Ok(None) => {
            return fail_with(
                Exit::Finding,
                "not_found",
                format!(
                    "{} partition {} holds no message at offset {}",
                    config.kafka.dlq_topic, args.partition, args.offset
                ),
            );
        }
        Err(e) => {
            return fail_with(Exit::Retry, "unavailable", e);
        }
    };
    let mut headers = serde_json::Map::new();
    for (name, value) in &letter.headers {
        // `failed_deliveries` is a JSON list: shown as one.
        let value = match serde_json::from_str::<serde_json::Value>(value) {
            Ok(list @ serde_json::Value::Array(_)) => list,
            _ => serde_json::Value::String(value.clone()),
        };
        headers.insert(name.clone(), value);
    }
    let mut out = serde_json::json!({
        "partition": letter.partition,
        "offset": letter.offset,
        "timestamp_ms": letter.timestamp_ms,
        "key": letter.key.as_deref().map(String::from_utf8_lossy),
        "headers": headers,
        "payload_bytes": letter.value.len(),
    });
    if letter.value.len() <= args.max_payload_bytes {
        out["payload"] = serde_json::from_slice(&letter.value).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&letter.value).into_owned())
        });
    } else {
        let excerpt = String::from_utf8_lossy(&letter.value[..args.max_payload_bytes]);
        out["payload_excerpt"] = serde_json::Value::String(excerpt.into_owned());
    }
    print(&out);
    ExitCode::SUCCESS
}

/// What a re-driven record carries through the window.
#[derive(Debug, Clone)]
struct Origin {
    /// The letter's offset.
    offset: i64,
    source: Option<(String, i32, i64)>,
    kind: String,
}

/// One line of `dlq redrive`.
#[derive(Debug, Serialize)]
struct RedriveLine<'a> {
    partition: i32,
    offset: i64,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_topic: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_offset: Option<i64>,
    /// `applied`, `refused_again`, `malformed`, `corrupt` or `source_gone`.
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    /// One entry per delivery: the `apply` line without its line number.
    deliveries: Vec<ApplyLine<'a>>,
}

impl<'a> RedriveLine<'a> {
    fn new(
        partition: i32,
        origin: &'a Origin,
        result: &'static str,
        detail: Option<&'a str>,
        deliveries: Vec<ApplyLine<'a>>,
    ) -> Self {
        let source = origin.source.as_ref();
        Self {
            partition,
            offset: origin.offset,
            kind: &origin.kind,
            source_topic: source.map(|s| s.0.as_str()),
            source_partition: source.map(|s| s.1),
            source_offset: source.map(|s| s.2),
            result,
            detail,
            deliveries,
        }
    }
}

/// Per dead-letter partition: how far the re-drive may commit.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// One past the last letter read.
    read_to: Option<i64>,
    /// The first letter a time or partition filter passed over: never committed past.
    hold: Option<i64>,
}

async fn redrive(store: Arc<dyn MailboxStore>, config: &Config, args: &RedriveArgs) -> ExitCode {
    let filter = &args.filter;
    let group = args.group.clone().unwrap_or_else(|| {
        format!(
            "{}-dlq-redrive-{}",
            config.kafka.group_id,
            filter.kind.as_deref().unwrap_or("all")
        )
    });
    let mut holds: BTreeMap<i32, i64> = BTreeMap::new();
    let opened = open_reader(config, &group, |reader, spans| {
        let partitions: Vec<i32> = spans.iter().map(|s| s.partition).collect();
        let committed = if args.from_beginning {
            BTreeMap::new()
        } else {
            reader.committed(&partitions)?
        };
        let since = since_offsets(reader, spans, filter.since)?;
        let mut starts = BTreeMap::new();
        for span in spans {
            let from = committed.get(&span.partition).copied().unwrap_or(span.low);
            let at = since.get(&span.partition).copied().unwrap_or(span.low);
            if at > from {
                // The letters between are passed over by the time filter: held.
                holds.insert(span.partition, from);
            }
            starts.insert(span.partition, at.max(from));
        }
        Ok(starts)
    });
    let mut reader = match opened {
        Ok(reader) => reader,
        Err(e) => {
            return fail_with(Exit::Retry, "unavailable", e);
        }
    };
    let options = config.decode_options();
    let mut driver: Driver<i32, (), Origin, ()> = Driver::new(store);
    let mut progress: BTreeMap<i32, Progress> = holds
        .into_iter()
        .map(|(p, hold)| {
            (
                p,
                Progress {
                    read_to: None,
                    hold: Some(hold),
                },
            )
        })
        .collect();
    let mut policy = ApplyPolicy;
    let mut identities: BTreeMap<String, LogId> = BTreeMap::new();
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failure: Option<Failure> = None;
    let mut source_done = false;
    let mut shown =
        crate::operator::replay::Progress::count("dlq redrive", "letters", args.progress.mode());
    while failure.is_none() && !(source_done && driver.is_empty()) {
        let can_read = !source_done && driver.windows().all(|(_, w)| !w.pipeline.is_full());
        tokio::select! {
            biased;
            attempt = driver.next() => {
                failure = driver.handle_with_ready(attempt, &mut policy).err();
            }
            next = reader.next(), if can_read => match next {
                Ok(None) => source_done = true,
                Err(e) => failure = Some((0, e, Exit::Retry)),
                Ok(Some(letter)) => {
                    shown.note(counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "));
                    shown.read(1);
                    let at = progress.entry(letter.partition).or_default();
                    at.read_to = Some(letter.offset + 1);
                    if !filter.kind_matches(&letter) {
                        continue;
                    }
                    if !filter.rest_matches(&letter) {
                        at.hold.get_or_insert(letter.offset);
                        continue;
                    }
                    if args.dry_run {
                        print(&ListLine::of(&letter));
                        *counts.entry("planned").or_default() += 1;
                        continue;
                    }
                    let origin = Origin {
                        offset: letter.offset,
                        source: letter.source().map(|(t, p, o)| (t.to_owned(), p, o)),
                        kind: letter.kind().to_owned(),
                    };
                    let bytes = match original(config, &letter, &mut identities).await {
                        Ok(bytes) => bytes,
                        Err(Original::Gone(detail)) => {
                            // Reported; nothing can bring the record back, but the progress
                            // stays before it so that it is reported again, not forgotten.
                            print_gone(letter.partition, &origin, &detail);
                            *counts.entry("source_gone").or_default() += 1;
                            at.hold.get_or_insert(letter.offset);
                            continue;
                        }
                        Err(Original::Unreadable(e)) => {
                            // The run stops here, and its progress stays before this letter:
                            // a rerun once the source is readable re-drives it.
                            at.hold.get_or_insert(letter.offset);
                            failure = Some((0, e, Exit::Retry));
                            continue;
                        }
                    };
                    // Only the deliveries the letter names as failed, each with the letter's
                    // source position (SPEC 7.2): a re-drive never reverts a seq that succeeded,
                    // nor one a later record of the log rewrote.
                    let position = letter.source_position();
                    let failed = letter.failed_deliveries();
                    let decoded = decode(&bytes, &options).map(|d| {
                        let record = match &position {
                            Some(at) => d.record.at_position(Some(&at.log), at.partition, at.offset),
                            None => d.record,
                        };
                        match &failed {
                            Some(failed) => record.retain_deliveries(failed),
                            None => record,
                        }
                    });
                    driver.open(letter.partition, WINDOW, ());
                    driver.admit(letter.partition, letter.offset, (), 0, origin, decoded, &mut policy);
                }
            },
        }
        for (partition, window) in driver.windows_mut() {
            for record in window.pipeline.pop_final() {
                let result = print_redriven(*partition, &record);
                *counts.entry(result).or_default() += 1;
                if result != "applied" {
                    // Still failing: the next re-drive (after the next fix) sees it again.
                    let at = progress.entry(*partition).or_default();
                    at.hold.get_or_insert(record.meta.offset);
                }
            }
        }
    }
    driver.cancel_all();
    shown.finish();
    if !args.dry_run {
        // Each partition: up to the first record not final (the window's front), and never
        // past a letter a filter held back.
        let mut commit = BTreeMap::new();
        for (partition, at) in &progress {
            let window_front = driver
                .window(partition)
                .filter(|w| !w.pipeline.is_empty())
                .and_then(|w| w.pipeline.watermark());
            let reached = window_front.or(at.read_to);
            let offset = match (reached, at.hold) {
                (Some(r), Some(h)) => Some(r.min(h)),
                (r, h) => r.or(h),
            };
            if let Some(offset) = offset {
                commit.insert(*partition, offset);
            }
        }
        if let Err(e) = reader.commit(&commit) {
            super::report::warn(format!("the progress was not committed ({e}); a rerun re-drives the same letters again, harmlessly"));
        }
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("dlq redrive: {}", summary.join(" "));
    if let Some((offset, message, exit)) = failure {
        return report_failure(
            0,
            &if offset > 0 {
                format!("dead letter at offset {offset}: {message}")
            } else {
                message
            },
            exit,
        );
    }
    if counts.contains_key("corrupt") || counts.contains_key("held") {
        Exit::Corrupt.into()
    } else if ["refused_again", "malformed", "source_gone"]
        .iter()
        .any(|word| counts.contains_key(word))
    {
        Exit::Finding.into()
    } else {
        ExitCode::SUCCESS
    }
}

/// Why a letter's original record cannot be had.
enum Original {
    /// The letter holds an excerpt and the source no longer holds the record.
    Gone(String),
    /// The source could not be read now (the broker): the run stops.
    Unreadable(String),
}

/// The original record of a letter: its value, or (an excerpt) the record at its source, once
/// the source is proven to be the same log the letter's record was read from (SPEC 7.3): after
/// the topic was recreated or cut over under the same name, the record at those coordinates is
/// an unrelated one, and the letter's original is gone. `identities` caches each topic's
/// identity for the run.
async fn original(
    config: &Config,
    letter: &DeadLetterMessage,
    identities: &mut BTreeMap<String, LogId>,
) -> Result<Vec<u8>, Original> {
    if !letter.truncated() {
        return Ok(letter.value.clone());
    }
    let Some((topic, partition, offset)) = letter.source() else {
        return Err(Original::Gone(
            "the letter holds an excerpt and no source coordinates".to_owned(),
        ));
    };
    if let Some(position) = letter.source_position() {
        let current = match identities.get(topic) {
            Some(log) => log.clone(),
            None => {
                let log = log_identity(config, topic).await.map_err(|e| {
                    Original::Unreadable(format!(
                        "the letter at offset {} holds an excerpt and the identity of its source could not be read: {e}",
                        letter.offset
                    ))
                })?;
                identities.insert(topic.to_owned(), log.clone());
                log
            }
        };
        if current != position.log {
            return Err(Original::Gone(format!(
                "the letter holds an excerpt of a record of log {}, and {topic} is now log {current} (deleted and recreated, or cut over under the same name): the record at partition {partition} offset {offset} is not the original",
                position.log
            )));
        }
    }
    match fetch(config, topic, partition, offset).await {
        Ok(Some(record)) => Ok(record.value),
        Ok(None) => Err(Original::Gone(format!(
            "the letter holds an excerpt and {topic} partition {partition} no longer holds offset {offset}"
        ))),
        Err(e) => Err(Original::Unreadable(format!(
            "the letter at offset {} holds an excerpt and its source could not be read: {e}",
            letter.offset
        ))),
    }
}

/// Prints the line of a letter whose record is gone.
fn print_gone(partition: i32, origin: &Origin, detail: &str) {
    print(&RedriveLine::new(
        partition,
        origin,
        "source_gone",
        Some(detail),
        Vec::new(),
    ));
}

/// Prints a re-driven record's line and answers its result word.
fn print_redriven(partition: i32, record: &FinalRecord<Origin>) -> &'static str {
    let results = record.results();
    let mut deliveries: Vec<ApplyLine<'_>> = results
        .iter()
        .map(|r| ApplyLine::delivery(None, r))
        .collect();
    deliveries.extend(record.held.iter().map(|d| ApplyLine::held(None, d)));
    if let Some(error) = &record.malformed {
        deliveries.push(ApplyLine::malformed(None, error));
    }
    let result = if record.malformed.is_some() {
        "malformed"
    } else if is_corrupt(record) && record.held.is_empty() {
        "corrupt"
    } else if is_corrupt(record) {
        "held"
    } else if record.outcome == RecordOutcome::Applied {
        "applied"
    } else {
        "refused_again"
    };
    print(&RedriveLine::new(
        partition,
        &record.meta,
        result,
        None,
        deliveries,
    ));
    result
}
