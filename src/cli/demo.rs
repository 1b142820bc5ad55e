//! `materializer demo`: the embedded default. No service is needed: a synthetic dispatch log is
//! decoded and applied, record by record and in log order, through the same code as `apply`, into
//! a memory store; the outcomes are tallied and printed as a table.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use crate::config::Config;
use crate::demo::synthetic_workload;
use crate::ingest::decode::DEFAULT_MAX_RECORD_BYTES;
use crate::ingest::{apply_record, decode_record};
use crate::model::{MailboxId, ScanRequest, StoreError, UserId};
use crate::store::memory::MemoryStore;
use crate::store::{Clock, MailboxStore, SystemClock};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Mailboxes in the workload.
    #[arg(long, default_value_t = 200)]
    pub users: u64,
    /// Rounds of one fresh group per mailbox (plus replays and bad input).
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    /// Seed of the workload generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// What happens to a delivery with this outcome in the daemon.
fn route(outcome: &str) -> &'static str {
    match outcome {
        "malformed" | "rejected" | "conflict" => "dead-letter topic, offset advances",
        "corrupt" => "mailbox blocked until replayed",
        "unchanged" | "trimmed" | "stale_epoch" => "nothing to write, offset advances",
        _ => "written, offset advances",
    }
}

pub async fn run(config: &Config, args: &DemoArgs) -> ExitCode {
    let clock = Arc::new(SystemClock);
    let now_ms = clock.now_secs() * 1000;
    let store = MemoryStore::new(config.retention.policy(), clock);
    let workload = synthetic_workload(args.users.max(2), args.rounds.max(1), now_ms, args.seed);

    let started = Instant::now();
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut deliveries = 0u64;
    for record in &workload.records {
        match decode_record(record, DEFAULT_MAX_RECORD_BYTES) {
            Err(_) => *counts.entry("malformed").or_default() += 1,
            Ok(record) => {
                for delivery in apply_record(&store, &record).await {
                    deliveries += 1;
                    let word = match &delivery.result {
                        Ok(outcome) => outcome.as_str(),
                        Err(e) => e.outcome(),
                    };
                    *counts.entry(word).or_default() += 1;
                }
            }
        }
    }
    let elapsed = started.elapsed();

    println!(
        "materializer demo: a synthetic dispatch log applied in log order to the memory store"
    );
    println!(
        "records: {}   deliveries: {deliveries}   mailboxes: {}   elapsed: {:.1} ms",
        workload.records.len(),
        args.users.max(2),
        elapsed.as_secs_f64() * 1000.0
    );
    println!();
    println!(
        "{:<16} {:>8}   in the daemon (malformed counts records, the rest deliveries)",
        "outcome", "count"
    );
    let order = [
        "inserted",
        "unchanged",
        "replaced",
        "expired_merged",
        "trimmed",
        "stale_epoch",
        "truncated",
        "rejected",
        "conflict",
        "malformed",
        "corrupt",
    ];
    for word in order {
        let count = counts.get(word).copied().unwrap_or(0);
        println!("{word:<16} {count:>8}   {}", route(word));
    }

    // One mailbox read back through a scan, as a client would.
    let Ok(user) = UserId::parse("demo-user-1") else {
        return ExitCode::FAILURE;
    };
    let mailbox = MailboxId::new(user, 1);
    let request = ScanRequest {
        after_seq: 0,
        until_seq: None,
        limit_groups: 5,
    };
    println!();
    match store.range_scan(&mailbox, request).await {
        Ok(page) => println!(
            "scan demo-user-1 epoch 1 after 0: {} groups (seqs {:?}), up_to {}, has_more {}",
            page.groups.len(),
            page.groups
                .iter()
                .map(|g| g.mailbox_seq)
                .collect::<Vec<_>>(),
            page.up_to,
            page.has_more
        ),
        Err(StoreError::CursorExpired { cursor }) => println!(
            "scan demo-user-1 epoch 1 after 0: cursor expired ({}); a client resumes past it",
            cursor.reason()
        ),
        Err(e) => println!("scan demo-user-1 epoch 1 after 0: {e}"),
    }
    ExitCode::SUCCESS
}
