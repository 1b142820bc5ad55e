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
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::top::scrape::authority;
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

/// Streams one replica's tap into `tx`, each line tagged with the replica's address.
async fn stream(daemon: String, path: String, tx: mpsc::Sender<Line>) {
    let result = async {
        let host = authority(&daemon).to_owned();
        let mut socket = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&host))
            .await
            .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        // HTTP/1.0: the stream then ends when the connection does, as plain lines (an HTTP/1.1
        // response of unknown length would come chunked).
        let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
        socket
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(socket);
        let mut status = String::new();
        reader
            .read_line(&mut status)
            .await
            .map_err(|e| e.to_string())?;
        let mut header = String::new();
        loop {
            header.clear();
            let n = reader
                .read_line(&mut header)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 || header == "\r\n" {
                break;
            }
        }
        if status.split_whitespace().nth(1) != Some("200") {
            let mut body = String::new();
            let _ = reader.read_line(&mut body).await;
            return Err(format!("{} {}", status.trim(), body.trim()));
        }
        let _ = tx.send(Line::Listening(daemon.clone())).await;
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok(());
            }
            let Ok(mut value) = serde_json::from_str::<Value>(line.trim_end()) else {
                continue;
            };
            if let Some(n) = value.get("dropped").and_then(Value::as_u64) {
                let _ = tx.send(Line::Dropped(daemon.clone(), n)).await;
                continue;
            }
            if let Some(object) = value.as_object_mut() {
                object.insert("daemon".to_owned(), Value::String(daemon.clone()));
            }
            if tx.send(Line::Decision(value.to_string())).await.is_err() {
                return Ok(());
            }
        }
    }
    .await;
    let _ = tx.send(Line::Ended(daemon, result)).await;
}
