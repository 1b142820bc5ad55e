//! `materializer verify`: the scrub of one partition's range ([`crate::operator::verify`]). One
//! JSON line per mailbox that is not a `match` (every mailbox with `--all`), each `differs` and
//! `corrupt` one with the command that repairs it, then the summary line. Exit 0 nothing differs,
//! 1 something differs or is corrupt, 2 unreachable (or stopped, or nothing to verify).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde_json::json;
use tokio::sync::watch;

use super::run::{parse_users, ProgressArg};
use super::top::scrape::{authority, get};
use super::{bad_argument, fail_with, open_store_to_read};
use crate::config::Config;
use crate::model::Exit;
use crate::model::UserId;
use crate::operator::replay::{parse_time_ms, ReplayStart};
use crate::operator::verify::{verify, MailboxReport, VerifyRequest, DEFAULT_BATCH_BYTES};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The partition (shard) whose range is verified.
    #[arg(long, value_name = "P")]
    pub partition: i32,
    /// First offset of the range.
    #[arg(
        long,
        value_name = "X",
        conflicts_with_all = ["from_time", "since"],
        required_unless_present_any = ["from_time", "since"]
    )]
    pub from_offset: Option<i64>,
    /// First record at or after this time: milliseconds since the epoch, an RFC 3339 date-time, or
    /// a duration ago (`24h`).
    #[arg(long, value_name = "T", value_parser = parse_time_ms, conflicts_with = "since")]
    pub from_time: Option<i64>,
    /// The same as --from-time (a scheduled scrub's `--since 24h`): any time form.
    #[arg(long, value_name = "T", value_parser = parse_time_ms)]
    pub since: Option<i64>,
    /// Last offset of the range (inclusive); never past the daemon group's committed offset,
    /// which is the default end.
    #[arg(long, value_name = "Y")]
    pub to_offset: Option<i64>,
    /// Only this user's mailbox (repeatable); default: every user of the range.
    #[arg(long = "user", value_name = "U")]
    pub users: Vec<String>,
    /// A running replica's `http.listen` address (repeatable; `http.debug_endpoints = true`
    /// there): the mailboxes it holds failing closed are reported `corrupt`.
    #[arg(long = "daemon", value_name = "ADDR")]
    pub daemons: Vec<String>,
    /// Print every mailbox's line, `match` included.
    #[arg(long)]
    pub all: bool,
    /// Record bytes one batch of users holds at most (the reference built from them takes a
    /// small multiple); a larger range is verified in more batches, each reading it again.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BATCH_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1_024..=(1 << 34)))]
    pub batch_bytes: usize,
    /// Read at most this many records a second (default: as fast as the broker serves).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_records_per_second: Option<u32>,
    /// Mailboxes read from the store at once.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub store_concurrency: usize,
    /// Progress on stderr: a bar on a terminal, a line every 5 s otherwise, or none.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    pub progress: ProgressArg,
}

pub(super) async fn run(config: &Config, args: &VerifyArgs) -> ExitCode {
    let users = match parse_users(&args.users) {
        Ok(users) => users,
        Err(code) => return code,
    };
    let start = match (args.from_offset, args.from_time, args.since) {
        (Some(offset), _, _) => ReplayStart::Offset(offset),
        (None, Some(ms), _) => ReplayStart::TimeMs(ms),
        (None, None, Some(ms)) => ReplayStart::TimeMs(ms),
        (None, None, None) => {
            return bad_argument(
                "--from-offset",
                "--from-offset, --from-time or --since is required",
            );
        }
    };
    let blocked = match blocked_users(&args.daemons).await {
        Ok(blocked) => blocked,
        Err(e) => return fail_with(Exit::Retry, "unavailable", e),
    };
    let opened = match open_store_to_read(config).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let request = VerifyRequest {
        partition: args.partition,
        start,
        to_offset: args.to_offset,
        users,
        progress: args.progress.mode(),
        batch_bytes: args.batch_bytes,
        max_records_per_second: args.max_records_per_second,
        store_concurrency: args.store_concurrency,
        blocked,
    };
    let (interrupt_tx, interrupt) = watch::channel(false);
    let signals = tokio::spawn(async move {
        super::run::termination().await;
        let _ = interrupt_tx.send(true);
    });
    let store: Arc<dyn crate::store::MailboxStore> = opened.store.clone();
    let all = args.all;
    let signalled = interrupt.clone();
    let mut summary = verify(
        config,
        store,
        &request,
        |report: &MailboxReport| {
            if report.verdict == "match" && !all {
                return;
            }
            let mut line = serde_json::to_value(report).unwrap_or_default();
            if matches!(report.verdict, "differs" | "corrupt") {
                if let Ok(user) = UserId::parse(&report.user_id) {
                    line["fix"] = json!(super::fix::repair_command(
                        config,
                        &user,
                        Some(args.partition)
                    ));
                }
            }
            println!("{line}");
        },
        interrupt,
    )
    .await;
    signals.abort();
    summary.interrupted = summary.aborted.is_some() && *signalled.borrow();
    super::run::print_summary(&json!({ "summary": summary }), summary.failure());
    summary.exit_status().into()
}

/// Each replica's `/debug/blocked`: the users it holds failing closed, with why.
async fn blocked_users(daemons: &[String]) -> Result<BTreeMap<UserId, String>, String> {
    let mut blocked = BTreeMap::new();
    for daemon in daemons {
        let (status, body) = get(
            authority(daemon),
            "/debug/blocked",
            std::time::Duration::from_secs(5),
        )
        .await
        .map_err(|e| format!("--daemon {daemon}: {e}"))?;
        if status != 200 {
            return Err(format!(
                "--daemon {daemon}: /debug/blocked answered {status}: {}",
                body.trim()
            ));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("--daemon {daemon}: {e}"))?;
        for entry in list["blocked"].as_array().into_iter().flatten() {
            if let Some(user) = entry["user_id"]
                .as_str()
                .and_then(|u| UserId::parse(u).ok())
            {
                blocked.insert(
                    user,
                    format!(
                        "blocked by {daemon} at offset {}: {}",
                        entry["offset"],
                        entry["kind"].as_str().unwrap_or_default()
                    ),
                );
            }
        }
    }
    Ok(blocked)
}
