//! `materializer explain --user U [--epoch E] [--daemon ADDR]... [--output json]`: one mailbox, as an
//! operator paged by `MaterializerPartitionBlocked` needs it.
//!
//! What it reads, all of it read-only:
//! - the store's metadata of the mailbox (`inspect`, no promote): days, bounds, gap boundary,
//!   trim, identity index; without `--epoch`, the user's current epoch;
//! - whether it is readable: a scan from 0 of one group, answered as a reader would be answered
//!   (a page, `cursor_expired`, or the corrupt verdict that fails it closed);
//! - the source position each live seq's stored version was written from (`seq_positions`):
//!   the newest few and the oldest, and how many have none;
//! - the repair fence, if one is held: its holder, the lease left, and whether its process still
//!   runs (when it ran on this host);
//! - each running replica's `/debug/blocked` (`--daemon ADDR`, repeatable; `http.debug_endpoints`
//!   must be on there): whether it holds the mailbox blocked, on which partition and offset,
//!   since when and why.
//!
//! The last line is what to do: the exact `replay --reset-mailboxes` command (the partition from
//! a replica that holds it blocked, else from the stored positions, the range from the start of the oldest day retention can
//! still hold, so the rebuild sees the whole history the log has), or "nothing to do".
//! Exit: 0 healthy (or never written), 3 corrupt (by the store's verdict or a replica's block),
//! 2 store unreachable.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::top::scrape::{authority, get};
use super::{bad_argument, fail_with, open_store_to_read};
use crate::config::Config;
use crate::daemon::http::Blocked;
use crate::model::Exit;
use crate::model::{MailboxId, ScanRequest, StoreError, UserId};
use crate::store::SeqPosition;

/// Newest seqs whose source positions `explain` shows.
const NEWEST_SHOWN: usize = 3;
/// How long one replica may take to answer `/debug/blocked`.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The user id.
    #[arg(long, value_name = "U")]
    pub user: String,
    /// The mailbox epoch; default: the user's current epoch.
    #[arg(long, value_name = "E")]
    pub epoch: Option<u32>,
    /// A running replica's `http.listen` address whose `/debug/blocked` is asked (repeatable;
    /// the replica needs `http.debug_endpoints = true`).
    #[arg(long = "daemon", value_name = "ADDR")]
    pub daemons: Vec<String>,
    /// The old spelling of `--output json` (accepted with a warning for one release).
    #[arg(long, hide = true)]
    pub json: bool,
}

/// What one replica said about the user.
#[derive(Debug)]
enum DaemonView {
    Blocked(Address, Blocked),
    NotBlocked(Address),
    Unanswered(Address, String),
}

type Address = String;

pub(super) async fn run(config: &Config, args: &ExplainArgs) -> ExitCode {
    let user = match UserId::parse(&args.user) {
        Ok(user) => user,
        Err(e) => {
            return bad_argument("--user", format!("{:?}: {e}", args.user));
        }
    };
    let opened = match open_store_to_read(config).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let store = opened.store.as_ref();
    let backend = store.backend();
    // The current epoch comes with any epoch's metadata.
    let probe = MailboxId {
        user_id: user.clone(),
        epoch: args.epoch.unwrap_or(0),
    };
    let first = store.inspect(&probe).await;
    if let Err(StoreError::Unavailable { .. }) = &first {
        return fail_with(
            Exit::Retry,
            "unavailable",
            format!(
                "the store is unreachable: {}",
                first.err().map(|e| e.to_string()).unwrap_or_default()
            ),
        );
    }
    let current = first.as_ref().ok().and_then(|i| i.current_epoch);
    let epoch = args.epoch.or(current);
    let daemons = ask_daemons(&args.daemons, user.as_str()).await;
    let blocked: Vec<&Blocked> = daemons
        .iter()
        .filter_map(|d| match d {
            DaemonView::Blocked(_, b) => Some(b),
            _ => None,
        })
        .collect();

    let (inspection, readable, corrupt_reason, positions) = match epoch {
        None => (
            json!(null),
            json!({"readable": true, "detail": "the user was never written"}),
            None,
            Ok(Vec::new()),
        ),
        Some(epoch) => {
            let mailbox = MailboxId {
                user_id: user.clone(),
                epoch,
            };
            let inspection = if epoch == probe.epoch {
                first
            } else {
                store.inspect(&mailbox).await
            };
            let scan = store
                .range_scan(
                    &mailbox,
                    ScanRequest {
                        after_seq: 0,
                        until_seq: None,
                        limit_groups: 1,
                    },
                )
                .await;
            let mut corrupt: Option<String> = None;
            let inspection = match inspection {
                Ok(i) => {
                    // SPEC 7.3: a piece lost that a scan does not read (the identity index of a
                    // Redis mailbox) is damage all the same.
                    if let Some(missing) = i.missing_piece(crate::wall_clock::now_ms() / 1000) {
                        corrupt = Some(format!(
                            "bad_proof: a piece of the mailbox is lost: {missing}"
                        ));
                    }
                    serde_json::to_value(&i).unwrap_or(Value::Null)
                }
                Err(e) => {
                    if e.outcome() == "corrupt" {
                        corrupt = Some(format!("{}: {e}", e.kind()));
                    }
                    json!({"error": {"kind": e.kind(), "detail": e.to_string()}})
                }
            };
            let readable = match scan {
                Ok(page) => json!({
                    "readable": true,
                    "detail": format!(
                        "a scan from 0 answers {} group(s) up to seq {}{}",
                        page.groups.len(),
                        page.up_to,
                        if page.has_more { ", more follow" } else { "" }
                    ),
                }),
                Err(e) => {
                    let is_corrupt = e.outcome() == "corrupt";
                    if is_corrupt && corrupt.is_none() {
                        corrupt = Some(format!("{}: {e}", e.kind()));
                    }
                    if let StoreError::Unavailable { .. } = e {
                        return fail_with(
                            Exit::Retry,
                            "unavailable",
                            format!("the store is unreachable: {e}"),
                        );
                    }
                    json!({
                        "readable": !is_corrupt,
                        "detail": format!("a scan from 0 answers {}: {e}", e.kind()),
                    })
                }
            };
            let positions = store.seq_positions(&mailbox).await;
            (inspection, readable, corrupt, positions)
        }
    };
    let positions_json = positions_json(&positions);
    // The partition of the repair: a replica's block names it; else the one partition every
    // position of the newest seq's log names.
    let partition = blocked
        .first()
        .map(|b| b.partition)
        .or_else(|| only_partition(positions.as_deref().unwrap_or_default()));
    let fence = match store.fence_of(&user).await {
        Ok(fence) => fence,
        Err(e) => {
            return fail_with(
                Exit::Retry,
                "unavailable",
                format!("reading the repair fence: {e}"),
            );
        }
    };
    let fence_json = fence.as_ref().map(|f| {
        let (process, gone) = crate::operator::replay::holder_process_state(&f.holder);
        json!({"holder": f.holder, "lease_left_ms": f.lease_left_ms, "process": process, "process_gone": gone})
    });
    let corrupt = corrupt_reason.is_some() || !blocked.is_empty();
    let mut fix = corrupt.then(|| super::fix::repair_command(config, &user, partition));
    if let (Some(f), Some(view)) = (&fence, &fence_json) {
        // A repair holds the user: its own outcome comes first.
        fix = Some(if view["process_gone"] == true {
            format!(
                "{} --take-over-fence {}",
                super::fix::repair_command(config, &user, partition),
                f.holder
            )
        } else {
            format!(
                "wait: a repair ({}) holds the fence ({} s of lease left); run explain again once it ended",
                f.holder,
                f.lease_left_ms / 1000
            )
        });
    }
    let report = json!({
        "user_id": user.as_str(),
        "epoch": epoch,
        "current_epoch": current,
        "backend": backend,
        "verdict": if corrupt { "corrupt" } else if epoch.is_none() { "absent" } else { "healthy" },
        "state": inspection,
        "readable": readable,
        "positions": positions_json,
        "corrupt": corrupt_reason,
        "fence": fence_json,
        "daemons": daemons.iter().map(daemon_json).collect::<Vec<_>>(),
        "fix": fix,
    });
    if super::report::json() {
        println!("{report}");
    } else {
        print_screen(&report);
    }
    if corrupt {
        Exit::Corrupt.into()
    } else {
        ExitCode::SUCCESS
    }
}

/// How many live seqs there are, how many carry no position, the newest [`NEWEST_SHOWN`] and
/// the oldest with their positions, and the partitions named.
fn positions_json(positions: &Result<Vec<SeqPosition>, StoreError>) -> Value {
    let positions = match positions {
        Ok(p) => p,
        Err(e) => return json!({"error": {"kind": e.kind(), "detail": e.to_string()}}),
    };
    let partitions: std::collections::BTreeSet<i32> = positions
        .iter()
        .filter_map(|p| p.position.as_ref().map(|at| at.partition))
        .collect();
    json!({
        "live_seqs": positions.len(),
        "without_position": positions.iter().filter(|p| p.position.is_none()).count(),
        "newest": positions.iter().rev().take(NEWEST_SHOWN).collect::<Vec<_>>(),
        "oldest": positions.first(),
        "partitions": partitions,
    })
}

/// The partition of the user's records when the stored positions say it: the newest seq's
/// log, and every position of that log on one partition (a user's records are on one
/// partition of a log; another log, from before a cut-over, may have had another count).
fn only_partition(positions: &[SeqPosition]) -> Option<i32> {
    let log = &positions
        .iter()
        .rev()
        .find_map(|p| p.position.as_ref())?
        .log;
    let mut partitions = positions
        .iter()
        .filter_map(|p| p.position.as_ref())
        .filter(|at| &at.log == log)
        .map(|at| at.partition);
    let first = partitions.next()?;
    partitions.all(|p| p == first).then_some(first)
}

/// Each replica's `/debug/blocked`, the entry for `user` if it holds one.
async fn ask_daemons(addresses: &[String], user: &str) -> Vec<DaemonView> {
    let mut views = Vec::new();
    for address in addresses {
        let host = authority(address);
        let view = match get(host, "/debug/blocked", DAEMON_TIMEOUT).await {
            Err(e) => DaemonView::Unanswered(address.clone(), e),
            Ok((404, body)) => DaemonView::Unanswered(address.clone(), body.trim().to_owned()),
            Ok((status, _)) if status != 200 => {
                DaemonView::Unanswered(address.clone(), format!("/debug/blocked answered {status}"))
            }
            Ok((_, body)) => match serde_json::from_str::<Value>(&body) {
                Err(e) => DaemonView::Unanswered(address.clone(), format!("/debug/blocked: {e}")),
                Ok(list) => {
                    let found = list["blocked"].as_array().and_then(|entries| {
                        entries
                            .iter()
                            .filter(|e| e["user_id"] == user)
                            .find_map(|e| serde_json::from_value::<Blocked>(e.clone()).ok())
                    });
                    match found {
                        Some(b) => DaemonView::Blocked(address.clone(), b),
                        None => DaemonView::NotBlocked(address.clone()),
                    }
                }
            },
        };
        views.push(view);
    }
    views
}

fn daemon_json(view: &DaemonView) -> Value {
    match view {
        DaemonView::Blocked(address, b) => json!({"daemon": address, "blocked": b}),
        DaemonView::NotBlocked(address) => json!({"daemon": address, "blocked": null}),
        DaemonView::Unanswered(address, why) => json!({"daemon": address, "error": why}),
    }
}

fn print_screen(report: &Value) {
    let user = report["user_id"].as_str().unwrap_or_default();
    let backend = report["backend"].as_str().unwrap_or_default();
    match report["epoch"].as_u64() {
        Some(epoch) => println!("mailbox {user} epoch {epoch} ({backend})"),
        None => println!("mailbox {user} ({backend}): the user was never written"),
    }
    let state = &report["state"];
    if let Some(error) = state.get("error") {
        println!(
            "  state:     {} ({})",
            error["kind"].as_str().unwrap_or_default(),
            error["detail"].as_str().unwrap_or_default()
        );
    } else if state.is_object() {
        println!(
            "  state:     days {}..{} ({} active), gap boundary {}, trim {}, {} identities{}",
            state["min_day"],
            state["max_day"],
            state["active_day_count"],
            state["expired_gap_boundary"],
            state["user_trim_seq"],
            state["identity_count"],
            if state["identity_index_present"] == true {
                ""
            } else {
                ", NO identity index"
            }
        );
    }
    let readable = &report["readable"];
    println!(
        "  readable:  {}: {}",
        if readable["readable"] == true {
            "yes"
        } else {
            "no"
        },
        readable["detail"].as_str().unwrap_or_default()
    );
    print_positions(&report["positions"]);
    if let Some(fence) = report.get("fence").filter(|f| !f.is_null()) {
        println!(
            "  fence:     held by {}, {} s of lease left; {}",
            fence["holder"].as_str().unwrap_or_default(),
            fence["lease_left_ms"].as_u64().unwrap_or(0) / 1000,
            fence["process"].as_str().unwrap_or_default()
        );
    }
    for daemon in report["daemons"].as_array().into_iter().flatten() {
        let address = daemon["daemon"].as_str().unwrap_or_default();
        if let Some(error) = daemon.get("error") {
            println!(
                "  daemon:    {address}: not asked ({})",
                error.as_str().unwrap_or_default()
            );
        } else if daemon["blocked"].is_null() {
            println!("  daemon:    {address}: not blocked there");
        } else {
            let b = &daemon["blocked"];
            let since = b["since_ms"]
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default();
            println!(
                "  blocked:   by {address} on partition {} at offset {} since {since}: {} ({})",
                b["partition"],
                b["offset"],
                b["kind"].as_str().unwrap_or_default(),
                b["detail"].as_str().unwrap_or_default()
            );
        }
    }
    if let Some(damage) = report["corrupt"].as_str() {
        println!("  damaged:   {damage}");
    }
    match report["fix"].as_str() {
        Some(wait) if wait.starts_with("wait:") => println!("{wait}"),
        Some(fix) => println!("fix: {fix}"),
        None => println!("nothing to do"),
    }
}

/// `  positions: ...`: where the newest and the oldest live seqs were written from.
fn print_positions(positions: &Value) {
    if positions.is_null() {
        return;
    }
    if let Some(error) = positions.get("error") {
        println!(
            "  positions: unknown ({})",
            error["detail"].as_str().unwrap_or_default()
        );
        return;
    }
    let live = positions["live_seqs"].as_u64().unwrap_or(0);
    if live == 0 {
        println!("  positions: no live seq");
        return;
    }
    let at = |p: &Value| match p["position"].as_object() {
        Some(at) => format!(
            "seq {} @ partition {} offset {}",
            p["seq"], at["partition"], at["offset"]
        ),
        None => format!("seq {} @ no position", p["seq"]),
    };
    let newest: Vec<String> = positions["newest"]
        .as_array()
        .into_iter()
        .flatten()
        .map(at)
        .collect();
    let log = positions["newest"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|p| p["position"]["log"].as_str())
        .map(|log| format!(" (log {log})"))
        .unwrap_or_default();
    let without = positions["without_position"].as_u64().unwrap_or(0);
    println!(
        "  positions: {live} live seq(s){}; newest {}; oldest {}{log}",
        if without > 0 {
            format!(", {without} without a position")
        } else {
            String::new()
        },
        newest.join(", "),
        at(&positions["oldest"])
    );
}
