//! `materializer tap [--daemon ADDR]... [--user U]... [--outcome O]... [--partition P]
//! [--limit N]`: the live decisions of running replicas, one JSON line per final delivery
//! (`partition, offset, user_id, epoch, mailbox_seq, outcome, error_kind`, plus the `daemon` it
//! came from), like `vector tap`.
//!
//! Each replica streams from `/debug/tap` (`http.debug_endpoints` on); the filter runs on the
//! replica, so only what was asked crosses the network. A reader that cannot keep up loses
//! decisions rather than slowing the pipeline: the replica says how many, and `tap` reports it
//! on stderr. Ends on Ctrl-C, after `--limit` lines, or when every replica went away. Exit 0;
//! 2 when a replica could not be reached or refused the tap.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::top::scrape::{authority, send_get};
use crate::config::Config;
use crate::daemon::tap::percent_encode;
use crate::model::Exit;

/// How long a replica may take to accept the tap.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct TapArgs {
    /// A running replica's `http.listen` address (repeatable; default: the configuration's).
    #[arg(long = "daemon", value_name = "ADDR")]
    pub daemons: Vec<String>,
    /// Only this user's deliveries (repeatable).
    #[arg(long = "user", value_name = "U")]
    pub users: Vec<String>,
    /// Only deliveries with this outcome (repeatable): inserted, replaced, conflict, corrupt...
    #[arg(long = "outcome", value_name = "O")]
    pub outcomes: Vec<String>,
    /// Only this partition's deliveries.
    #[arg(long, value_name = "P")]
    pub partition: Option<i32>,
    /// Stop after this many lines.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
}

/// What one replica's stream sends the printer.
enum Line {
    Decision(String),
    Dropped(String, u64),
    Ended(String, Result<(), String>),
    Listening(String),
}

pub(super) async fn run(config: &Config, args: &TapArgs) -> ExitCode {
    let daemons = if args.daemons.is_empty() {
        vec![config.http.listen.clone()]
    } else {
        args.daemons.clone()
    };
    let mut query: Vec<String> = Vec::new();
    query.extend(
        args.users
            .iter()
            .map(|u| format!("user={}", percent_encode(u))),
    );
    query.extend(
        args.outcomes
            .iter()
            .map(|o| format!("outcome={}", percent_encode(o))),
    );
    if let Some(p) = args.partition {
        query.push(format!("partition={p}"));
    }
    let path = format!("/debug/tap?{}", query.join("&"));
    // Bounded: a printer slower than the replicas makes them drop, never this process grow.
    let (tx, mut rx) = mpsc::channel::<Line>(1024);
    for daemon in &daemons {
        tokio::spawn(stream(daemon.clone(), path.clone(), tx.clone()));
    }
    drop(tx);
    let mut printed = 0u64;
    let mut failed: Vec<String> = Vec::new();
    let mut stdout = tokio::io::stdout();
    let signal = super::run::termination();
    tokio::pin!(signal);
    let mut interrupted = false;
    loop {
        let line = tokio::select! {
            line = rx.recv() => line,
            _ = &mut signal => {
                interrupted = true;
                break;
            }
        };
        let Some(line) = line else { break };
        match line {
            Line::Listening(daemon) => eprintln!("tap: listening to {daemon}"),
            Line::Decision(text) => {
                if stdout.write_all(text.as_bytes()).await.is_err()
                    || stdout.write_all(b"\n").await.is_err()
                    || stdout.flush().await.is_err()
                {
                    break;
                }
                printed += 1;
                if args.limit.is_some_and(|limit| printed >= limit) {
                    break;
                }
            }
            Line::Dropped(daemon, n) => {
                eprintln!("tap: {daemon} dropped {n} decision(s): this reader fell behind")
            }
            Line::Ended(daemon, Ok(())) => eprintln!("tap: {daemon} ended the stream"),
            Line::Ended(daemon, Err(e)) => {
                eprintln!("tap: {daemon}: {e}");
                failed.push(format!("{daemon}: {e}"));
            }
        }
    }
    // SPEC 8.2: a signal before the --limit is exit 4 (a stream without a limit ends only so),
    // a replica lost mid-stream 2.
    if interrupted {
        super::fail_with(Exit::Interrupted, "interrupted", "interrupted by a signal")
    } else if !failed.is_empty() {
        super::fail_with(
            Exit::Retry,
            "unavailable",
            format!("replicas lost: {}", failed.join("; ")),
        )
    } else {
        ExitCode::SUCCESS
    }
}

/// Longest line a replica may send; a longer one ends its stream (a decision is a few hundred
/// bytes).
const MAX_LINE_BYTES: usize = 1 << 20;

/// Streams one replica's tap into `tx`, each line tagged with the replica's address, over
/// hyper's HTTP/1 client (the stream comes chunked: hyper decodes it).
async fn stream(daemon: String, path: String, tx: mpsc::Sender<Line>) {
    let result = async {
        let host = authority(&daemon).to_owned();
        let (response, driver) = tokio::time::timeout(CONNECT_TIMEOUT, send_get(&host, &path))
            .await
            .map_err(|_| format!("no answer within {CONNECT_TIMEOUT:?}"))??;
        let status = response.status();
        let mut body = response.into_body();
        if status != hyper::StatusCode::OK {
            let text = Limited::new(body, 64 << 10)
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            driver.abort();
            return Err(format!("HTTP {status} {}", text.trim()));
        }
        let _ = tx.send(Line::Listening(daemon.clone())).await;
        let mut pending: Vec<u8> = Vec::new();
        let ended = loop {
            let Some(frame) = body.frame().await else {
                break Ok(());
            };
            let frame = frame.map_err(|e| e.to_string())?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=at).collect();
                if !forward(&daemon, &line, &tx).await {
                    driver.abort();
                    return Ok(());
                }
            }
            if pending.len() > MAX_LINE_BYTES {
                break Err(format!("a line longer than {MAX_LINE_BYTES} bytes"));
            }
        };
        driver.abort();
        ended
    }
    .await;
    let _ = tx.send(Line::Ended(daemon, result)).await;
}

/// Hands one line of a replica's stream on: a decision (tagged with the replica), or the count
/// of decisions it dropped. False when nobody reads any more.
async fn forward(daemon: &str, line: &[u8], tx: &mpsc::Sender<Line>) -> bool {
    let Ok(mut value) = serde_json::from_slice::<Value>(line) else {
        return true;
    };
    if let Some(n) = value.get("dropped").and_then(Value::as_u64) {
        let _ = tx.send(Line::Dropped(daemon.to_owned(), n)).await;
        return true;
    }
    if let Some(object) = value.as_object_mut() {
        object.insert("daemon".to_owned(), Value::String(daemon.to_owned()));
    }
    tx.send(Line::Decision(value.to_string())).await.is_ok()
}
