//! `materializer apply`: dispatch records from a file or stdin straight into the store, through
//! the daemon's drive loop ([`Driver`]): many users in flight, each user's deliveries in line
//! order, and the output still one JSON line per delivery in input order.
//!
//! What a line's result means is [`Disposition`]'s table. `apply` differs from the daemon only in
//! its [`ApplyPolicy`], what it does not wait for: a corrupt mailbox is printed `corrupt` (exit 3) instead of blocking,
//! and its later lines are printed `held` (the drive loop holds it for the rest of the run),
//! a user fenced by a running repair stops the run (exit 2, retry later) with no line printed for
//! that record, and an unreachable store is retried briefly before the same exit 2. A stop waits
//! for the calls already sent, so every line the store applied is printed; lines printed before
//! an exit 2 are final, and rerunning the whole input is safe (replay is idempotent).

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::output::ApplyLine;
use super::{fail_with, ApplyArgs};
use crate::config::Config;
use crate::disposition::Disposition;
use crate::ingest::drive::{Driver, Policy, Step, Verdict};
use crate::ingest::pipeline::FinalRecord;
use crate::ingest::{decode, DecodeOptions, DeliveryOutcome};
use crate::model::Exit;
use crate::model::StoreError;
use crate::retry::Backoff;
use crate::store::MailboxStore;

/// Lines read ahead of the slowest lane (bounds the memory of a run).
const WINDOW: usize = 4096;
/// Attempts of a delivery on a transient store error before `apply` gives up (exit 2).
const MAX_TRANSIENT_ATTEMPTS: u32 = 5;
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// How long a stopping run waits for the store calls it already sent (each is bounded by the
/// store's own timeouts; this bounds the whole wait).
const DRAIN: Duration = Duration::from_secs(30);

/// One input line, numbered from 1.
struct Line {
    number: u64,
    bytes: Vec<u8>,
}

pub(super) async fn run(
    store: Arc<dyn MailboxStore>,
    args: &ApplyArgs,
    config: &Config,
) -> ExitCode {
    let options = DecodeOptions {
        max_record_bytes: args.max_record_bytes,
        strict_fields: config.ingest.strict_fields,
    };
    let reader: Box<dyn BufRead + Send> = if args.input == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        match std::fs::File::open(&args.input) {
            Ok(file) => Box::new(std::io::BufReader::new(file)),
            Err(e) => {
                return super::bad_argument("FILE", format!("cannot open {}: {e}", args.input));
            }
        }
    };
    // Reading blocks (a pipe may stay open and silent): a detached thread of its own feeds the
    // loop, so an early exit never waits for the next line.
    let (tx, lines) = tokio::sync::mpsc::channel::<Result<Line, String>>(WINDOW);
    let input = args.input.clone();
    let cap = args.max_record_bytes.saturating_add(1);
    let spawned = std::thread::Builder::new()
        .name("apply-input".to_owned())
        .spawn(move || read_lines(reader, &input, cap, &tx));
    if let Err(e) = spawned {
        return fail_with(
            Exit::Retry,
            "io",
            format!("cannot start the input reader: {e}"),
        );
    }

    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let (failure, corrupt) = apply_lines(store, lines, &mut out, &options).await;
    if let Some((line, message, exit)) = failure {
        return report_failure(line, &message, exit);
    }
    if corrupt {
        Exit::Corrupt.into()
    } else {
        ExitCode::SUCCESS
    }
}

/// Applies the numbered lines `lines` brings, printing one line per delivery to `out` in input
/// order; answers why the run stopped early, if it did, and whether a mailbox was corrupt.
async fn apply_lines(
    store: Arc<dyn MailboxStore>,
    mut lines: tokio::sync::mpsc::Receiver<Result<Line, String>>,
    out: &mut impl Write,
    options: &DecodeOptions,
) -> (Option<Failure>, bool) {
    let mut driver: Driver<(), (), u64, ()> = Driver::new(store);
    driver.open((), WINDOW, ());
    let mut policy = ApplyPolicy;
    let mut corrupt = false;
    let mut input_done = false;
    let mut failure: Option<Failure> = None;
    while failure.is_none() && !(input_done && driver.is_empty()) {
        tokio::select! {
            biased;
            attempt = driver.next() => {
                failure = driver.handle_with_ready(attempt, &mut policy).err();
            }
            line = lines.recv(), if !input_done && driver.room_for_more(&(), 0) => {
                // Take every line already read (up to a batch), so their deliveries go to the
                // store together.
                let mut next = line;
                let mut taken = 0usize;
                loop {
                    match next {
                        None => {
                            input_done = true;
                            break;
                        }
                        Some(Err(e)) => {
                            failure = Some((0, e, Exit::Finding));
                            break;
                        }
                        Some(Ok(line)) => {
                            let decoded = decode(&line.bytes, options).map(|d| d.record);
                            driver.admit((), line.number as i64, (), 0, line.number, decoded, &mut policy);
                        }
                    }
                    taken += 1;
                    if !driver.room_for_more(&(), taken) {
                        break;
                    }
                    match lines.try_recv() {
                        Ok(line) => next = Some(line),
                        Err(_) => break,
                    }
                }
            }
        }
        if let Some(window) = driver.window_mut(&()) {
            for record in window.pipeline.pop_final() {
                corrupt |= print_record(out, &record);
            }
        }
        // Lines are written in 64 KiB blocks while input streams in, and flushed whenever the
        // input pauses: a reader of a slow or open-ended input (a pipe from a live source) sees
        // each outcome as soon as its record is final, not at the end.
        if lines.is_empty() {
            let _ = out.flush();
        }
    }
    drop(lines);
    if failure.is_some() {
        // Stopping early: nothing new starts, but the calls already sent to the store are
        // waited for (at most DRAIN), so a line the store applied beside the one that stopped
        // the run is printed rather than left unknown. Every line applied is then printed, also
        // those behind a line that never finished (their users' records are independent of it).
        if !driver.drain_after_stop(&(), &mut policy, DRAIN).await {
            tracing::warn!(
                "the store did not answer every call in flight within {DRAIN:?}: their lines are not printed (rerunning the input is safe)"
            );
        }
        if let Some(window) = driver.window_mut(&()) {
            for record in window.pipeline.take_every_final() {
                corrupt |= print_record(out, &record);
            }
        }
    }
    driver.cancel_all();
    let _ = out.flush();
    (failure, corrupt)
}

/// Reads numbered lines, keeping at most `cap` bytes of each (a longer line still ends at its
/// newline; its first `cap` bytes are decoded and refused as oversized), so one endless line
/// cannot exhaust memory.
fn read_lines(
    mut reader: Box<dyn BufRead + Send>,
    input: &str,
    cap: usize,
    tx: &tokio::sync::mpsc::Sender<Result<Line, String>>,
) {
    let mut number = 0u64;
    loop {
        let mut bytes = Vec::new();
        let mut ended = false;
        loop {
            let chunk = match reader.fill_buf() {
                Ok(chunk) => chunk,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.blocking_send(Err(format!("reading {input}: {e}")));
                    return;
                }
            };
            if chunk.is_empty() {
                ended = true;
                break;
            }
            let (take, newline) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            let room = cap.saturating_sub(bytes.len());
            bytes.extend_from_slice(&chunk[..take.min(room)]);
            reader.consume(take);
            if newline {
                break;
            }
        }
        if ended && bytes.is_empty() {
            return;
        }
        number += 1;
        while matches!(bytes.last(), Some(b'\n' | b'\r')) {
            bytes.pop();
        }
        if !bytes.iter().all(u8::is_ascii_whitespace)
            && tx.blocking_send(Ok(Line { number, bytes })).is_err()
        {
            return;
        }
        if ended {
            return;
        }
    }
}

/// Why a run stops: the line (0: none), the message and the exit status.
pub(super) type Failure = (u64, String, Exit);

/// Reports why a run of records stopped (the line it stopped at, when one did).
pub(super) fn report_failure(line: u64, message: &str, exit: Exit) -> ExitCode {
    let kind = match exit {
        Exit::Retry => "unavailable",
        Exit::Usage => "usage",
        Exit::Interrupted => "interrupted",
        Exit::Corrupt => "corrupt",
        Exit::Done | Exit::Finding => "input",
    };
    if line > 0 {
        fail_with(exit, kind, format!("line {line}: {message}"))
    } else {
        fail_with(exit, kind, message)
    }
}

/// `apply`'s answers (and `dlq redrive`'s) to results the table does not make final: it reports
/// a corrupt mailbox (exit 3 at the end) instead of waiting for its repair, stops at a repair's
/// fence, and retries an unreachable store a few times before it gives up. The [`Failure`]
/// names the window's offset (`apply`: the line).
pub(super) struct ApplyPolicy;

impl<S> Policy<S, ()> for ApplyPolicy {
    type Stop = Failure;

    fn not_final(
        &mut self,
        step: Step<'_, S>,
        _state: &mut (),
        result: &Result<DeliveryOutcome, StoreError>,
        disposition: Disposition,
    ) -> Verdict<Failure> {
        let line = u64::try_from(step.at.offset).unwrap_or(0);
        let error = result.as_ref().err();
        let detail = match error {
            Some(StoreError::Unavailable { detail, .. }) => detail.clone(),
            Some(e) => e.to_string(),
            None => String::new(),
        };
        match disposition {
            Disposition::Advance | Disposition::DeadLetter | Disposition::Block => Verdict::Final,
            Disposition::Retry { under_repair: true } => Verdict::Stop((
                line,
                format!(
                    "the user's mailboxes are being rebuilt ({}); nothing was written for this record: rerun when the repair is done",
                    error.map(StoreError::detail).unwrap_or_default()
                ),
                Exit::Retry,
            )),
            Disposition::Retry {
                under_repair: false,
            } if step.attempt + 1 >= MAX_TRANSIENT_ATTEMPTS => Verdict::Stop((
                line,
                format!("store unreachable: {detail}"),
                Exit::Retry,
            )),
            Disposition::Retry {
                under_repair: false,
            } => Verdict::Retry(BACKOFF.delay(step.attempt)),
            Disposition::AbortRepair => {
                Verdict::Stop((line, detail, Exit::Retry))
            }
        }
    }
}

/// Whether one of a final record's deliveries met a corrupt mailbox, or was held because its
/// mailbox answered `corrupt` earlier in the run: either exits 3.
pub(super) fn is_corrupt(record: &FinalRecord<impl Sized>) -> bool {
    !record.held.is_empty()
        || record
            .deliveries
            .iter()
            .any(|(_, r)| matches!(r, Err(StoreError::Corrupt { .. })))
}

/// Prints a final record's lines; true when one of its deliveries met a corrupt mailbox.
fn print_record(out: &mut impl Write, record: &FinalRecord<u64>) -> bool {
    let line = record.meta;
    if let Some(error) = &record.malformed {
        print_line(out, &ApplyLine::malformed(Some(line), error));
        return false;
    }
    for result in &record.results() {
        print_line(out, &ApplyLine::delivery(Some(line), result));
    }
    for delivery in &record.held {
        print_line(out, &ApplyLine::held(Some(line), delivery));
    }
    is_corrupt(record)
}

/// One JSON line. Output goes through a buffer (one write per many lines, not one per line):
/// a write error (a closed pipe) is left to the final flush.
fn print_line(out: &mut impl Write, line: &ApplyLine<'_>) {
    if let Ok(text) = serde_json::to_string(line) {
        let _ = writeln!(out, "{text}");
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::model::{AppendOutcome, EventGroup, RetentionPolicy};
    use crate::store::memory::MemoryStore;
    use crate::store::wrapper::Wrapper;
    use crate::store::SystemClock;

    /// The memory store, where user `slow`'s appends take 300 ms and user `fenced` is under a
    /// repair: the fenced answer comes back first although its line comes second.
    struct SlowAndFenced(MemoryStore);

    #[async_trait]
    impl Wrapper for SlowAndFenced {
        fn inner(&self) -> &dyn MailboxStore {
            &self.0
        }

        async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
            match group.mailbox.user_id.as_str() {
                "slow" => tokio::time::sleep(Duration::from_millis(300)).await,
                "fenced" => {
                    return Err(StoreError::UnderRepair {
                        holder: "repair-test".to_owned(),
                    })
                }
                _ => {}
            }
            self.0.append(group).await
        }
    }

    fn record(user: &str) -> Vec<u8> {
        let now = crate::wall_clock::now_ms();
        serde_json::json!({"dispatch_id": format!("d-{user}"), "group_id": "g",
            "committed_at": now, "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": 1,
            "events": [{"event_ordinal": 0, "payload": {}}]}]})
        .to_string()
        .into_bytes()
    }

    /// A stop waits for the calls already sent: the slow user's line, applied by the store while
    /// the fenced one stopped the run, is printed. It used to be cancelled: on Redis, a script
    /// already sent ran and its line was never printed (a CI run caught it).
    #[tokio::test]
    async fn a_stop_prints_the_lines_the_store_applied_beside_it() {
        let inner = MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock));
        let store: Arc<dyn MailboxStore> = Arc::new(SlowAndFenced(inner));
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        // Line 1 goes to the store on its own; line 2 follows in a call of its own while line
        // 1's is still in flight, and its answer comes back first.
        tokio::spawn(async move {
            for (number, user) in [(1, "slow"), (2, "fenced")] {
                let line = Line {
                    number,
                    bytes: record(user),
                };
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut out = Vec::new();
        let options = DecodeOptions {
            max_record_bytes: crate::ingest::decode::DEFAULT_MAX_RECORD_BYTES,
            strict_fields: false,
        };
        let (failure, corrupt) = apply_lines(store.clone(), rx, &mut out, &options).await;
        let (line, message, exit) = failure.expect("the fenced user stops the run");
        assert_eq!((line, exit), (2, Exit::Retry), "{message}");
        assert!(!corrupt);
        let printed = String::from_utf8(out).expect("utf-8");
        let lines: Vec<serde_json::Value> = printed
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(lines.len(), 1, "{printed}");
        assert_eq!(lines[0]["user_id"], "slow");
        assert_eq!(lines[0]["outcome"], "inserted");
    }
}
