//! Scylla backend figures on the CQL server at `SCYLLA_NODES` (start one with
//! `scripts/cassandra start`), against baselines measured in the same run on the same server:
//!
//! - appends/s (groups of 3 events, 64 in flight, one writer per mailbox as the daemon orders them,
//!   over 64 mailboxes) versus plain unconditional `INSERT`s of the same three event rows at the
//!   same concurrency: the floor a write path without a commit point pays;
//! - identical replays/s of those groups (a log replay that changes nothing) versus one plain
//!   `SELECT` of a group's three event rows: the floor of a read that compares content;
//! - 50-group scans/s of those mailboxes versus one plain `SELECT` of a 150-row events partition;
//! - appends in runs (`append_run`, one commit per run) of 50 groups for each of 1,000 hot
//!   mailboxes, per group, versus the same plain `INSERT`s.
//!
//! For each phase it also reports the CPU time per operation of this process and of the server
//! (found by its listening port in `/proc`), and the Paxos rounds the store asked for per
//! operation (lightweight transactions and `SERIAL` reads).
//!
//! Then a breakdown: each CQL statement an append and a scan send, run alone at the same
//! concurrency (its rate and CPU per statement), and one traced execution (`TRACING ON`) of the
//! commit's conditional batch, of a plain `INSERT` and of a scan's events read, with the server's
//! own steps and their elapsed microseconds.
//!
//! Run: `SCYLLA_NODES=127.0.0.1:19042 cargo bench --bench scylla_store` (`BENCH_ROUNDS`, default
//! 2, rounds of every phase; `BENCH_BREAKDOWN=0` skips the breakdown). Prints a Markdown report.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "support/proc.rs"]
mod proc;
#[path = "support/workers.rs"]
mod workers;

use std::sync::Arc;
use std::time::Instant;

use mailbox_materializer::model::{
    Event, EventGroup, MailboxId, Payload, RetentionPolicy, ScanRequest, SourcePosition, UserId,
    DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::scylla::{ScyllaSettings, ScyllaStore};
use mailbox_materializer::store::{MailboxStore, SystemClock};

const MAILBOXES: u64 = 64;
const GROUPS_PER_MAILBOX: u64 = 60;
const IN_FLIGHT: u64 = 64;
const SCANS: u64 = 2_000;
/// Mailboxes of the hot-mailbox phase, and the groups waiting in each (one run).
const HOT_MAILBOXES: u64 = 1_000;
const RUN: u64 = 50;

fn events() -> Vec<Event> {
    (0..3)
        .map(|i| Event {
            event_ordinal: i,
            payload: Payload::from_value(
                &serde_json::json!({"kind": "message", "body": "hello there", "i": i}),
            ),
        })
        .collect()
}

fn mailbox(round: u32, i: u64) -> MailboxId {
    MailboxId::new(UserId::parse(&format!("bench-{round}-{i}")).expect("id"), 1)
}

/// What one phase measured.
struct Phase {
    ops_per_sec: f64,
    /// CPU milliseconds per operation: this process, the server.
    bench_cpu_ms: f64,
    server_cpu_ms: Option<f64>,
    paxos_per_op: f64,
}

struct Meter {
    server: Option<String>,
    store: Arc<ScyllaStore>,
}

impl Meter {
    /// Runs `total` jobs with `IN_FLIGHT` workers and measures them.
    async fn run<F, Fut>(&self, total: u64, job: F) -> Phase
    where
        F: Fn(u64) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let bench_before = proc::cpu_seconds("self").unwrap_or(0.0);
        let server_before = self.server.as_deref().and_then(proc::cpu_seconds);
        let paxos_before = self.store.paxos_rounds();
        let started = Instant::now();
        workers::striped(total, IN_FLIGHT, job).await;
        let elapsed = started.elapsed().as_secs_f64();
        let n = total as f64;
        let bench_cpu = proc::cpu_seconds("self").unwrap_or(0.0) - bench_before;
        let server_cpu = self
            .server
            .as_deref()
            .and_then(proc::cpu_seconds)
            .zip(server_before)
            .map(|(after, before)| after - before);
        Phase {
            ops_per_sec: n / elapsed,
            bench_cpu_ms: bench_cpu * 1000.0 / n,
            server_cpu_ms: server_cpu.map(|c| c * 1000.0 / n),
            paxos_per_op: (self.store.paxos_rounds() - paxos_before) as f64 / n,
        }
    }
}

fn row(name: &str, store: &Phase, baseline_name: &str, baseline: &Phase) -> String {
    let server = |p: &Phase| {
        p.server_cpu_ms
            .map_or("n/a".to_owned(), |c| format!("{c:.2}"))
    };
    format!(
        "| {name} | {:.0} | {:.2} | {:.2} / {} | {baseline_name} | {:.0} | {:.2} / {} | **{:.2}** |",
        store.ops_per_sec,
        store.paxos_per_op,
        store.bench_cpu_ms,
        server(store),
        baseline.ops_per_sec,
        baseline.bench_cpu_ms,
        server(baseline),
        store.ops_per_sec / baseline.ops_per_sec,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let nodes: Vec<String> = std::env::var("SCYLLA_NODES")
        .expect("set SCYLLA_NODES (scripts/cassandra start prints one)")
        .split(',')
        .map(str::to_owned)
        .collect();
    let port: u16 = nodes[0]
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9042);
    let keyspace = format!("mm_bench_{}", std::process::id());
    let store = Arc::new(
        ScyllaStore::connect(
            ScyllaSettings::new(nodes, keyspace.clone()),
            RetentionPolicy::default(),
            Arc::new(SystemClock),
        )
        .await
        .expect("connect"),
    );
    let meter = Meter {
        server: proc::listener_pid(port),
        store: store.clone(),
    };
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        / DAY_SECS;
    // A server's JIT warms up during the first rounds; every round is printed, the last one is
    // the figure to quote.
    let rounds: u32 = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        println!("### round {} of {rounds}\n", round + 1);
        run_round(&meter, &store, &keyspace, today, round).await;
    }
    if std::env::var("BENCH_BREAKDOWN").map_or(true, |v| v != "0") {
        breakdown(&meter, &store, &keyspace, today, rounds.saturating_sub(1)).await;
    }
    let _ = store
        .session()
        .query_unpaged(format!("DROP KEYSPACE {keyspace}"), ())
        .await;
}

/// One round of every phase on fresh mailboxes (`round` keeps their names apart).
async fn run_round(
    meter: &Meter,
    store: &Arc<ScyllaStore>,
    keyspace: &str,
    today: u64,
    round: u32,
) {
    let events = Arc::new(events());
    let group_of = {
        let events = events.clone();
        Arc::new(move |i: u64| {
            // Worker w gets i = w, w + 64, w + 128, ...: mailbox w, seqs 1, 2, 3, ...
            let seq = i / MAILBOXES + 1;
            let day = today - 29 + (seq * 30 / GROUPS_PER_MAILBOX) % 30;
            EventGroup {
                mailbox: mailbox(round, i % MAILBOXES),
                mailbox_seq: seq,
                created_at: day * DAY_MS + 1,
                events: events.to_vec(),
                source: None,
                token: None,
            }
        })
    };

    // Appends: worker w owns mailbox w and sends its seqs in order, as the daemon does.
    assert_eq!(MAILBOXES, IN_FLIGHT, "one worker per mailbox");
    let total = MAILBOXES * GROUPS_PER_MAILBOX;
    let (s, g) = (store.clone(), group_of.clone());
    let appends = meter
        .run(total, move |i| {
            let (store, group) = (s.clone(), g(i));
            async move {
                store.append(&group).await.expect("append");
            }
        })
        .await;

    // The daemon's appends carry their log position (zombie fencing keeps it in the meta row):
    // the same appends on other mailboxes, each group with a position.
    let (s, g) = (store.clone(), group_of.clone());
    let positioned = meter
        .run(total, move |i| {
            let store = s.clone();
            let mut group = g(i);
            group.mailbox = mailbox(round + 1_000, i % MAILBOXES);
            group.source = Some(SourcePosition::new(bench_log(), 0, i as i64));
            async move {
                store.append(&group).await.expect("append");
            }
        })
        .await;

    // Hot mailboxes, as a catch-up meets them: HOT_MAILBOXES mailboxes with RUN groups each
    // waiting, every mailbox's groups appended as one run (`append_run`). Measured per run, and
    // reported per group.
    let ev = events.clone();
    let s = store.clone();
    let runs = meter
        .run(HOT_MAILBOXES, move |i| {
            let store = s.clone();
            let events = ev.clone();
            async move {
                let groups: Vec<EventGroup> = (1..=RUN)
                    .map(|seq| {
                        let day = today - 29 + (seq * 30 / RUN) % 30;
                        EventGroup {
                            mailbox: mailbox(round + 2_000, i),
                            mailbox_seq: seq,
                            created_at: day * DAY_MS + 1,
                            events: events.to_vec(),
                            source: Some(SourcePosition::new(
                                bench_log(),
                                0,
                                (i * RUN + seq) as i64,
                            )),
                            token: None,
                        }
                    })
                    .collect();
                let run: Vec<&EventGroup> = groups.iter().collect();
                let answers = store.append_run(&run).await;
                assert!(
                    answers.len() == run.len() && answers.iter().all(Result::is_ok),
                    "{answers:?}"
                );
            }
        })
        .await;
    let per_group = |phase: Phase| Phase {
        ops_per_sec: phase.ops_per_sec * RUN as f64,
        bench_cpu_ms: phase.bench_cpu_ms / RUN as f64,
        server_cpu_ms: phase.server_cpu_ms.map(|c| c / RUN as f64),
        paxos_per_op: phase.paxos_per_op / RUN as f64,
    };
    let runs = per_group(runs);

    // Baseline: the same three rows per group, plain INSERTs, no reads, no commit point.
    let plain = Arc::new(
        store
            .session()
            .prepare(format!(
                "INSERT INTO {keyspace}.mailbox_events (user_id, generation, bucket, seq, digest, ordinal, created_at, payload) \
                 VALUES (?, 1, ?, ?, 0, ?, ?, ?)"
            ))
            .await
            .expect("prepare"),
    );
    let (s, ev) = (store.clone(), events.clone());
    let inserts = meter
        .run(total, move |i| {
            let (store, plain, events) = (s.clone(), plain.clone(), ev.clone());
            async move {
                for e in events.iter() {
                    store
                        .session()
                        .execute_unpaged(
                            &plain,
                            (
                                format!("plain-{round}-{}", i % MAILBOXES),
                                today as i64,
                                i as i64,
                                i64::from(e.event_ordinal),
                                0i64,
                                e.payload.as_str(),
                            ),
                        )
                        .await
                        .expect("insert");
                }
            }
        })
        .await;

    // Identical replays of every group: nothing changes.
    let (s, g) = (store.clone(), group_of.clone());
    let replays = meter
        .run(total, move |i| {
            let (store, group) = (s.clone(), g(i));
            async move {
                let outcome = store.append(&group).await.expect("replay");
                assert_eq!(
                    outcome,
                    mailbox_materializer::model::AppendOutcome::Unchanged
                );
            }
        })
        .await;
    let group_read = Arc::new(
        store
            .session()
            .prepare(format!(
                "SELECT ordinal, created_at, payload FROM {keyspace}.mailbox_events \
                 WHERE user_id = ? AND generation = 1 AND bucket = ? AND seq = ? AND digest = 0"
            ))
            .await
            .expect("prepare"),
    );
    let s = store.clone();
    let group_reads = meter
        .run(total, move |i| {
            let (store, select) = (s.clone(), group_read.clone());
            async move {
                store
                    .session()
                    .execute_unpaged(
                        &select,
                        (
                            format!("plain-{round}-{}", i % MAILBOXES),
                            today as i64,
                            i as i64,
                        ),
                    )
                    .await
                    .expect("select");
            }
        })
        .await;

    // Mailboxes whose 60 groups lie within the last 2 days (one or two event partitions), as a
    // sync client's recent pages are; written outside any measurement.
    let recent = move |i: u64| {
        MailboxId::new(
            UserId::parse(&format!("recent-{round}-{i}")).expect("id"),
            1,
        )
    };
    let (s, ev) = (store.clone(), events.clone());
    meter
        .run(total, move |i| {
            let (store, events) = (s.clone(), ev.clone());
            async move {
                let seq = i / MAILBOXES + 1;
                let group = EventGroup {
                    mailbox: recent(i % MAILBOXES),
                    mailbox_seq: seq,
                    created_at: (today - 1 + seq * 2 / GROUPS_PER_MAILBOX) * DAY_MS + 1,
                    events: events.to_vec(),
                    source: None,
                    token: None,
                };
                store.append(&group).await.expect("append");
            }
        })
        .await;
    let s = store.clone();
    let recent_scans = meter
        .run(SCANS, move |i| {
            let store = s.clone();
            async move {
                let page = store
                    .range_scan(
                        &recent(i % MAILBOXES),
                        ScanRequest {
                            after_seq: 0,
                            until_seq: None,
                            limit_groups: 50,
                        },
                    )
                    .await
                    .expect("scan");
                assert_eq!(page.groups.len(), 50);
            }
        })
        .await;

    let s = store.clone();
    let scans = meter
        .run(SCANS, move |i| {
            let store = s.clone();
            async move {
                let page = store
                    .range_scan(
                        &mailbox(round, i % MAILBOXES),
                        ScanRequest {
                            after_seq: 0,
                            until_seq: None,
                            limit_groups: 50,
                        },
                    )
                    .await
                    .expect("scan");
                assert_eq!(page.groups.len(), 50);
            }
        })
        .await;

    let select = Arc::new(
        store
            .session()
            .prepare(format!(
                "SELECT seq, ordinal, payload FROM {keyspace}.mailbox_events WHERE user_id = ? AND generation = 1 AND bucket = ? LIMIT 150"
            ))
            .await
            .expect("prepare"),
    );
    let s = store.clone();
    let reads = meter
        .run(SCANS, move |i| {
            let (store, select) = (s.clone(), select.clone());
            async move {
                store
                    .session()
                    .execute_unpaged(
                        &select,
                        (format!("plain-{round}-{}", i % MAILBOXES), today as i64),
                    )
                    .await
                    .expect("select");
            }
        })
        .await;

    println!(
        "{total} appends and replays over {MAILBOXES} mailboxes, {SCANS} scans, {IN_FLIGHT} in flight.\n"
    );
    println!(
        "CPU per operation in ms, bench process / server process (server pid {}).\n",
        meter.server.as_deref().unwrap_or("not found")
    );
    println!("| operation | store ops/s | Paxos rounds / op | CPU ms / op | baseline | baseline ops/s | baseline CPU ms / op | store / baseline |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "{}",
        row("append (3 events)", &appends, "3 plain INSERTs", &inserts)
    );
    println!(
        "{}",
        row(
            "append with a log position (the daemon's)",
            &positioned,
            "3 plain INSERTs",
            &inserts
        )
    );
    println!(
        "{}",
        row(
            "append in runs of 50, per group (hot mailboxes, the daemon's)",
            &runs,
            "3 plain INSERTs",
            &inserts
        )
    );
    println!(
        "{}",
        row(
            "identical replay",
            &replays,
            "1 plain SELECT of a 3-row group",
            &group_reads
        )
    );
    println!(
        "{}",
        row(
            "scan, 50 groups over 25 days",
            &scans,
            "1 plain SELECT of 150 rows",
            &reads
        )
    );
    println!(
        "{}",
        row(
            "scan, 50 groups over 2 days",
            &recent_scans,
            "1 plain SELECT of 150 rows",
            &reads
        )
    );
}

/// The statements of one append and one scan, each alone, then one traced execution of each kind.
async fn breakdown(
    meter: &Meter,
    store: &Arc<ScyllaStore>,
    keyspace: &str,
    today: u64,
    round: u32,
) {
    let session = store.session();
    let prepare =
        |cql: String| async move { Arc::new(session.prepare(cql).await.expect("prepare")) };
    let snapshot = prepare(format!(
        "SELECT slot, seq, version, live_slot, fence_holder, fence_until, generation, epoch, \
         format_version, expired_gap_boundary, seqbucket_max_seq, user_trim_seq, days, \
         proof_max_seq, proof_expires_at, expires_at, digest FROM {keyspace}.user_mailbox \
         WHERE user_id = ? AND slot IN (-1, 0, 1) AND seq IN ?"
    ))
    .await;
    let insert_event = prepare(format!(
        "INSERT INTO {keyspace}.mailbox_events \
         (user_id, generation, bucket, seq, digest, ordinal, created_at, payload) \
         VALUES (?, 1, ?, ?, 7, ?, 1, ?) USING TTL 86400"
    ))
    .await;
    let bump = prepare(format!(
        "UPDATE {keyspace}.user_mailbox SET version = 1 WHERE user_id = ? AND slot = -1 AND seq = 0 \
         IF version = null"
    ))
    .await;
    let meta = prepare(format!(
        "UPDATE {keyspace}.user_mailbox SET generation = 1, epoch = 1, format_version = 4, \
         expired_gap_boundary = 0, seqbucket_max_seq = 1, user_trim_seq = 0, days = ?, \
         proof_max_seq = ?, proof_expires_at = ? WHERE user_id = ? AND slot = 0 AND seq = 0"
    ))
    .await;
    let identity = prepare(format!(
        "INSERT INTO {keyspace}.user_mailbox (user_id, slot, seq, expires_at, digest) \
         VALUES (?, 0, 1, 1, 7) USING TTL 86400"
    ))
    .await;
    let identities = prepare(format!(
        "SELECT seq, expires_at, digest FROM {keyspace}.user_mailbox \
         WHERE user_id = ? AND slot = 0 AND seq > 0 AND seq <= 9223372036854775807 LIMIT 51"
    ))
    .await;
    let events_range = prepare(format!(
        "SELECT seq, digest, ordinal, created_at, payload FROM {keyspace}.mailbox_events \
         WHERE user_id = ? AND generation = ? AND bucket IN ? AND seq >= 1 AND seq <= 50"
    ))
    .await;
    let plain_insert = prepare(format!(
        "INSERT INTO {keyspace}.mailbox_events \
         (user_id, generation, bucket, seq, digest, ordinal, created_at, payload) \
         VALUES (?, 1, ?, ?, 0, 0, 1, 'x')"
    ))
    .await;
    // The buckets of the days a 50-group page of the warm mailboxes spans.
    let days: Arc<Vec<i64>> = Arc::new(
        (today as i64 - 29..=today as i64)
            .map(mailbox_materializer::store::scylla::schema::event_bucket)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
    );
    let day_map = Arc::new(std::collections::BTreeMap::from([(today as i64, 1i64)]));
    let payload =
        Payload::from_value(&serde_json::json!({"kind": "message", "body": "hello there", "i": 0}));
    let payload = Arc::new(payload.as_str().to_owned());
    let n = MAILBOXES * GROUPS_PER_MAILBOX;
    let warm_user = move |i: u64| format!("bench-{round}-{}", i % MAILBOXES);
    // The generation the warm mailboxes' events live under (their first commit's version).
    let generation = 1i64;

    let mut rows = Vec::new();
    let (st, s) = (snapshot.clone(), store.clone());
    rows.push((
        "snapshot read (user row, 2 meta rows, 2 identities)",
        meter
            .run(n, move |i| {
                let (st, s) = (st.clone(), s.clone());
                async move {
                    s.session()
                        .execute_unpaged(&st, (warm_user(i), vec![0i64, 5, 4]))
                        .await
                        .expect("snapshot");
                }
            })
            .await,
    ));
    let (st, s, p) = (insert_event.clone(), store.clone(), payload.clone());
    rows.push((
        "events write (unlogged batch of 3 rows)",
        meter
            .run(n, move |i| {
                let (st, s, p) = (st.clone(), s.clone(), p.clone());
                async move {
                    let mut batch = scylla::statement::batch::Batch::new(
                        scylla::statement::batch::BatchType::Unlogged,
                    );
                    for _ in 0..3 {
                        batch.append_statement((*st).clone());
                    }
                    let user = format!("brk-ev-{}", i % MAILBOXES);
                    let values: Vec<_> = (0..3i64)
                        .map(|o| (user.clone(), today as i64, i as i64, o, p.as_str()))
                        .collect();
                    s.session().batch(&batch, values).await.expect("events");
                }
            })
            .await,
    ));
    let (b, m, id, s, dm) = (
        bump.clone(),
        meta.clone(),
        identity.clone(),
        store.clone(),
        day_map.clone(),
    );
    rows.push((
        "commit (conditional batch: version, meta row, identity row)",
        meter
            .run(n, move |i| {
                let (b, m, id, s, dm) = (b.clone(), m.clone(), id.clone(), s.clone(), dm.clone());
                async move {
                    let mut batch = scylla::statement::batch::Batch::new(
                        scylla::statement::batch::BatchType::Logged,
                    );
                    batch.append_statement((*b).clone());
                    batch.append_statement((*m).clone());
                    batch.append_statement((*id).clone());
                    // A fresh partition each time: the condition holds, as it does for an append.
                    let user = format!("brk-lwt-{round}-{i}");
                    let result = s
                        .session()
                        .batch(
                            &batch,
                            (
                                (user.clone(),),
                                ((*dm).clone(), (*dm).clone(), (*dm).clone(), user.clone()),
                                (user,),
                            ),
                        )
                        .await
                        .expect("commit");
                    let applied = result
                        .into_rows_result()
                        .ok()
                        .and_then(|r| r.maybe_first_row::<(bool,)>().ok().flatten());
                    assert_eq!(applied, Some((true,)));
                }
            })
            .await,
    ));
    let (st, s) = (plain_insert.clone(), store.clone());
    rows.push((
        "baseline: 3 plain INSERTs",
        meter
            .run(n, move |i| {
                let (st, s) = (st.clone(), s.clone());
                async move {
                    for o in 0..3i64 {
                        s.session()
                            .execute_unpaged(
                                &st,
                                (
                                    format!("brk-plain-{}", i % MAILBOXES),
                                    today as i64,
                                    i as i64 * 3 + o,
                                ),
                            )
                            .await
                            .expect("insert");
                    }
                }
            })
            .await,
    ));
    let (st, s) = (identities.clone(), store.clone());
    rows.push((
        "scan: identity page (51 rows)",
        meter
            .run(SCANS, move |i| {
                let (st, s) = (st.clone(), s.clone());
                async move {
                    s.session()
                        .execute_unpaged(&st, (warm_user(i),))
                        .await
                        .expect("identities");
                }
            })
            .await,
    ));
    let (st, s, d) = (events_range.clone(), store.clone(), days.clone());
    rows.push((
        "scan: events of 50 groups (5 partitions)",
        meter
            .run(SCANS, move |i| {
                let (st, s, d) = (st.clone(), s.clone(), d.clone());
                async move {
                    s.session()
                        .execute_unpaged(&st, (warm_user(i), generation, (*d).clone()))
                        .await
                        .expect("events");
                }
            })
            .await,
    ));

    println!("### Breakdown: each statement alone, {IN_FLIGHT} in flight\n");
    println!("| statement | per second | Paxos rounds | CPU ms / statement (bench / server) |");
    println!("|---|---|---|---|");
    for (name, phase) in &rows {
        println!(
            "| {name} | {:.0} | {} | {:.2} / {} |",
            phase.ops_per_sec,
            if name.starts_with("commit") { 1 } else { 0 },
            phase.bench_cpu_ms,
            phase
                .server_cpu_ms
                .map_or("n/a".to_owned(), |c| format!("{c:.2}")),
        );
    }

    // One traced execution of each kind, on warm statements.
    let trace = |result: scylla::response::query_result::QueryResult, title: &'static str| async move {
        let Some(id) = result.tracing_id() else {
            return;
        };
        // The server writes trace events asynchronously; give it a moment.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        match session.get_tracing_info(&id).await {
            Ok(info) => {
                println!(
                    "\n#### TRACING ON: {title} ({} µs)\n",
                    info.duration.unwrap_or(0)
                );
                println!("| µs since start | activity |");
                println!("|---|---|");
                for event in &info.events {
                    println!(
                        "| {} | {} |",
                        event.source_elapsed.unwrap_or(0),
                        event.activity.as_deref().unwrap_or("").replace('|', "/")
                    );
                }
            }
            Err(e) => println!("\n(trace of {title} unavailable: {e})"),
        }
    };
    let mut batch =
        scylla::statement::batch::Batch::new(scylla::statement::batch::BatchType::Logged);
    batch.append_statement((*bump).clone());
    batch.append_statement((*meta).clone());
    batch.append_statement((*identity).clone());
    batch.set_tracing(true);
    let user = format!("brk-trace-{}", std::process::id());
    let result = session
        .batch(
            &batch,
            (
                (user.clone(),),
                (
                    (*day_map).clone(),
                    (*day_map).clone(),
                    (*day_map).clone(),
                    user.clone(),
                ),
                (user,),
            ),
        )
        .await
        .expect("traced commit");
    trace(result, "the commit's conditional batch").await;
    let mut insert = (*plain_insert).clone();
    insert.set_tracing(true);
    let result = session
        .execute_unpaged(&insert, ("brk-trace".to_owned(), today as i64, 1i64))
        .await
        .expect("traced insert");
    trace(result, "one plain INSERT").await;
    let mut events = (*events_range).clone();
    events.set_tracing(true);
    let result = session
        .execute_unpaged(&events, (warm_user(0), generation, (*days).clone()))
        .await
        .expect("traced events read");
    trace(result, "a scan's events read (5 partitions)").await;
}

/// The log every benchmark position names (a topic ID as a broker reports one).
fn bench_log() -> mailbox_materializer::model::LogId {
    mailbox_materializer::model::LogId::topic_id("3kZpM0bHQ0-5b2S0CkL8nA").expect("log id")
}
