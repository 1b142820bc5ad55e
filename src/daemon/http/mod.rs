//! The daemon's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the engine loop and
//! the poll thread make progress: `liveness`),
//! `/debug/tap` (every final delivery as a JSON line, streamed; with `http.debug_endpoints`),
//! `/debug/blocked` (the mailboxes this replica holds failing closed, JSON; only with
//! `http.debug_endpoints`, since it names users),
//! `/readyz` (every readiness condition of [`Health::describe`] holds: the store and the broker
//! answer, writes and dead letters succeed, partitions are readable, ...).
//!
//! This module holds what the endpoints report; [`server`] serves them on hyper.

mod server;
mod write_deadline;

pub use server::serve;

use std::sync::atomic::{AtomicBool, Ordering};

/// What `/readyz` reports, updated by the daemon's health checks.
#[derive(Debug, Default)]
pub struct Health {
    store_ok: AtomicBool,
    broker_ok: AtomicBool,
    /// True while an assigned partition is stalled (records waiting that cannot be read), and
    /// for good once the consumer failed fatally (the run is draining to exit).
    consumer_stalled: AtomicBool,
    /// True while dead letters keep failing (their records' offsets wait).
    dead_letters_failing: AtomicBool,
    /// When a store write last failed transiently (ms since the Unix epoch; 0: never). A store
    /// that answers pings but refuses writes (too few replica acknowledgements) is not ready.
    write_failed_at_ms: std::sync::atomic::AtomicU64,
    /// Failing while the subscribed topic cannot be consumed (missing, unauthorized, without
    /// partitions) or no assignment arrived in time (`health::subscription`); its line also says
    /// why a ready replica is idle.
    subscription: Condition,
    /// Failing while a Redis master evicts keys without `store.redis.allow_eviction`
    /// (`health::watch_redis_masters`).
    store_policy: Condition,
    /// Failing while a Redis master is at its `maxmemory` as the periodic read of every master
    /// found it (`health::watch_redis_masters`); its line names the masters and their use.
    store_memory: Condition,
    /// When a write was last refused for memory (`OOM`; ms since the Unix epoch, 0: never):
    /// the store is full for [`WRITE_FAILURE_WINDOW_MS`] after it, whatever the periodic read
    /// saw (a master hovers just under its limit between the refused calls).
    oom_at_ms: std::sync::atomic::AtomicU64,
    /// When a call last found the store's data gone (a wiped store or master, SPEC 7.3; ms since
    /// the Unix epoch, 0: never), and what it said: not ready for [`WRITE_FAILURE_WINDOW_MS`]
    /// after it (the writes retry meanwhile, so a store still wiped keeps it failing).
    store_lost_at_ms: std::sync::atomic::AtomicU64,
    store_lost_detail: std::sync::Mutex<Option<String>>,
    /// Failing while a Redis Cluster slot stays migrating or importing (an interrupted reshard;
    /// `health::watch_redis_masters`).
    store_slots: Condition,
    /// Failing while more mailboxes fail closed than `kafka.max_blocked_mailboxes` (the
    /// engine's housekeeping).
    blocked: Condition,
    /// Failing while the broker says the daemon lacks an ACL records need (`health::spawn`).
    kafka_grants: Condition,
    /// Partitions whose records the log deleted before they were read (SPEC 7.3): held ones
    /// (`kafka.on_records_lost = "hold"`) fail readiness until an operator accepts the loss;
    /// the line names the last loss either way.
    records_lost: std::sync::Mutex<RecordsLostState>,
    /// Partitions that appeared with a growth of the topic and wait for older ones (SPEC 7.2):
    /// by partition, the older partitions still short of their ends `(partition, at, end)` and
    /// since when. Ready meanwhile: the wait is the order, not a fault.
    growth: std::sync::Mutex<std::collections::BTreeMap<i32, GrowthWait>>,
    /// Why the store did not open yet at start (unreachable, a missing grant, an incomplete
    /// schema): the `store:` line of `/readyz` until it opens.
    store_waiting: std::sync::Mutex<Option<String>>,
    /// The mailboxes failing closed, as the engine's housekeeping last listed them
    /// (`/debug/blocked`): how many, and the first [`BLOCKED_SHOWN`].
    blocked_list: std::sync::Mutex<(usize, Vec<Blocked>)>,
    /// Serve `/debug/blocked` (`http.debug_endpoints`): it names users, so it is off unless asked.
    debug_endpoints: AtomicBool,
    /// The engine loop's and the poll thread's heartbeats (`/healthz`).
    pub(crate) liveness: super::liveness::Liveness,
    /// The live decisions `/debug/tap` streams.
    pub(crate) tap: super::tap::Tap,
}

/// A grown partition's wait, as `/readyz` shows it.
#[derive(Debug, Clone)]
struct GrowthWait {
    short: Vec<(i32, i64, i64)>,
    since: std::time::Instant,
}

/// What `/readyz` knows of records lost (see [`Health::records_lost_held`]).
#[derive(Debug, Default)]
struct RecordsLostState {
    /// Held partitions and their lost ranges.
    held: std::collections::BTreeMap<i32, (i64, i64)>,
    /// Held partitions an operator accepted, not yet released by the poll thread.
    accepted: std::collections::BTreeSet<i32>,
    /// The last loss carried on from: partition and range.
    last: Option<(i32, i64, i64)>,
}

/// A readiness condition that a probe decides as a whole: whether it fails, and its `/readyz`
/// line when that is not plain `ok` (the problem, or a note on a condition that holds).
#[derive(Debug, Default)]
struct Condition {
    failing: AtomicBool,
    line: std::sync::Mutex<Option<String>>,
}

impl Condition {
    fn set(&self, failing: bool, line: Option<String>) {
        self.failing.store(failing, Ordering::Relaxed);
        *self.line.lock().unwrap_or_else(|p| p.into_inner()) = line;
    }

    fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    fn line(&self) -> String {
        self.line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "ok".to_owned())
    }
}

/// Most blocked mailboxes `/debug/blocked` lists (it also says how many there are).
pub(crate) const BLOCKED_SHOWN: usize = 100;

/// One mailbox a replica holds failing closed (`/debug/blocked`, `materializer explain`): the
/// delivery it stopped at and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub partition: i32,
    pub user_id: String,
    pub epoch: u32,
    /// The offset of the record whose delivery failed closed: the committed offset stays at or
    /// before it until the mailbox is repaired.
    pub offset: i64,
    /// The error kind (`index_lost`, `identity_missing`, ...).
    pub kind: String,
    pub detail: String,
    /// When it started failing closed, ms since the Unix epoch.
    pub since_ms: u64,
}

/// How long after a transient write failure the store counts as not ready.
pub(crate) const WRITE_FAILURE_WINDOW_MS: u64 = 5_000;

pub(crate) use crate::wall_clock::now_ms;

impl Health {
    pub(crate) fn set_store(&self, ok: bool) {
        self.store_ok.store(ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Why the store is not open yet (`None` once it is).
    pub(crate) fn set_store_waiting(&self, why: Option<String>) {
        *self.store_waiting.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    pub(crate) fn set_broker(&self, ok: bool) {
        self.broker_ok.store(ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Whether every assigned partition can be read (see the engine's stall detection).
    pub(crate) fn set_consumer(&self, ok: bool) {
        self.consumer_stalled.store(!ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Whether dead letters are being acknowledged.
    pub(crate) fn set_dead_letters(&self, ok: bool) {
        self.dead_letters_failing.store(!ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// The subscription's state: `failing` turns readiness false; `line` (the problem, or a
    /// note such as idle) replaces `ok` on `/readyz`.
    pub(crate) fn set_subscription(&self, failing: bool, line: Option<String>) {
        self.subscription.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The store's eviction policy as the periodic re-check found it (`health::watch_redis_masters`).
    pub(crate) fn set_store_policy(&self, failing: bool, line: Option<String>) {
        self.store_policy.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The masters at their `maxmemory` (`failing`), as the periodic check found them; the
    /// line names the masters near it either way.
    pub(crate) fn set_store_memory(&self, failing: bool, line: Option<String>) {
        self.store_memory.set(failing, line);
        super::metrics::store_full(self.store_full());
        super::metrics::ready(self.ready());
    }

    /// The cluster's open slots as the periodic check found them (`health::watch_redis_masters`).
    pub(crate) fn set_store_slots(&self, failing: bool, line: Option<String>) {
        self.store_slots.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The Kafka ACLs the daemon lacks, as the broker last said.
    pub(crate) fn set_kafka_grants(&self, failing: bool, line: Option<String>) {
        self.kafka_grants.set(failing, line);
        super::metrics::ready(self.ready());
    }

    fn lost(&self) -> std::sync::MutexGuard<'_, RecordsLostState> {
        self.records_lost.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The poll thread holds `partition` after offsets `from..to` were lost unread.
    pub(crate) fn records_lost_held(&self, partition: i32, from: i64, to: i64) {
        self.lost().held.insert(partition, (from, to));
        super::metrics::ready(self.ready());
    }

    /// The poll thread carried on past offsets `from..to` of `partition`, lost unread.
    pub(crate) fn records_lost_carried_on(&self, partition: i32, from: i64, to: i64) {
        self.lost().last = Some((partition, from, to));
    }

    /// The held partitions an operator accepted since the last call: the poll thread releases
    /// them.
    pub(crate) fn take_records_lost_accepted(&self) -> Vec<i32> {
        let mut lost = self.lost();
        if lost.accepted.is_empty() {
            return Vec::new();
        }
        let accepted: Vec<i32> = std::mem::take(&mut lost.accepted).into_iter().collect();
        for partition in &accepted {
            if let Some((from, to)) = lost.held.remove(partition) {
                lost.last = Some((*partition, from, to));
            }
        }
        drop(lost);
        super::metrics::ready(self.ready());
        accepted
    }

    /// A held partition left this replica: its hold goes with it (the next owner finds the
    /// loss again at its committed offset).
    pub(crate) fn records_lost_forget(&self, partitions: &[i32]) {
        let mut lost = self.lost();
        for partition in partitions {
            lost.held.remove(partition);
            lost.accepted.remove(partition);
        }
    }

    /// `POST /records-lost/accept?partition=N`: the operator accepts the loss of a held
    /// partition. `Err` says why nothing was accepted.
    pub(crate) fn accept_records_lost(&self, partition: i32) -> Result<(i64, i64), String> {
        let mut lost = self.lost();
        match lost.held.get(&partition).copied() {
            Some(range) => {
                lost.accepted.insert(partition);
                Ok(range)
            }
            None => Err(format!(
                "partition {partition} is not held for lost records on this replica (held: {:?})",
                lost.held.keys().collect::<Vec<_>>()
            )),
        }
    }

    fn records_lost_line(&self) -> String {
        let lost = self.lost();
        if !lost.held.is_empty() {
            let held: Vec<String> = lost
                .held
                .iter()
                .map(|(p, (from, to))| format!("partition {p} offsets {from}..{to}"))
                .collect();
            return format!(
                "held: {} deleted by the log before this group read them; accept with POST /records-lost/accept?partition=N (kafka.on_records_lost = \"hold\")",
                held.join(", ")
            );
        }
        match lost.last {
            Some((p, from, to)) => {
                format!("ok (the last loss: partition {p} offsets {from}..{to}, carried on)")
            }
            None => "ok".to_owned(),
        }
    }

    fn growth(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<i32, GrowthWait>> {
        self.growth.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `partition` waits for the older partitions in `short` (`(partition, at, end)`).
    pub(crate) fn growth_waiting(&self, partition: i32, short: Vec<(i32, i64, i64)>) {
        let mut growth = self.growth();
        let since = growth
            .get(&partition)
            .map_or_else(std::time::Instant::now, |w| w.since);
        growth.insert(partition, GrowthWait { short, since });
    }

    /// `partition` no longer waits (its wait ended, or it left this replica).
    pub(crate) fn growth_done(&self, partitions: &[i32]) {
        let mut growth = self.growth();
        for partition in partitions {
            growth.remove(partition);
        }
    }

    /// The partitions waiting after a growth, for `/readyz`'s `partition growth:` line.
    fn growth_line(&self) -> String {
        let growth = self.growth();
        if growth.is_empty() {
            return "ok".to_owned();
        }
        let waits: Vec<String> = growth
            .iter()
            .map(|(p, wait)| {
                let short: Vec<String> = wait
                    .short
                    .iter()
                    .map(|(q, at, end)| format!("{q} (at {at} of {end})"))
                    .collect();
                format!(
                    "partition {p} waits {}s for partitions {}",
                    wait.since.elapsed().as_secs(),
                    if short.is_empty() {
                        "(reading their ends)".to_owned()
                    } else {
                        short.join(", ")
                    }
                )
            })
            .collect();
        format!(
            "ok, {}: the topic grew, and records written before the growth apply first",
            waits.join("; ")
        )
    }

    fn records_lost_failing(&self) -> bool {
        !self.lost().held.is_empty()
    }

    /// Turns `/debug/blocked` on (`http.debug_endpoints`).
    pub fn serve_debug_endpoints(&self, on: bool) {
        self.debug_endpoints.store(on, Ordering::Relaxed);
    }

    /// The mailboxes failing closed: how many, and the first [`BLOCKED_SHOWN`] of them.
    pub(crate) fn set_blocked_list(&self, total: usize, shown: Vec<Blocked>) {
        *self.blocked_list.lock().unwrap_or_else(|p| p.into_inner()) = (total, shown);
    }

    /// Whether `/debug/blocked` and `/debug/tap` are served.
    fn debug_endpoints(&self) -> bool {
        self.debug_endpoints.load(Ordering::Relaxed)
    }

    /// `/debug/blocked`'s body.
    fn blocked_json(&self) -> String {
        let (total, shown) = self
            .blocked_list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        serde_json::json!({"total": total, "shown": shown.len(), "blocked": shown}).to_string()
    }

    /// The mailboxes this replica holds failing closed, against its limit.
    pub(crate) fn set_blocked(&self, failing: bool, line: Option<String>) {
        self.blocked.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// A store write failed transiently just now; `out_of_memory` when the store refused it
    /// for memory (`OOM`, SPEC 7.3 "store full").
    pub(crate) fn write_failed(&self, out_of_memory: bool) {
        self.write_failed_at_ms.store(now_ms(), Ordering::Relaxed);
        if out_of_memory {
            self.oom_at_ms.store(now_ms(), Ordering::Relaxed);
            super::metrics::store_full(true);
        }
        super::metrics::ready(false);
    }

    /// A call found the store's data gone (`StoreError::store_lost`): `detail` names it.
    pub(crate) fn store_lost(&self, detail: &str) {
        let first = now_ms().saturating_sub(self.store_lost_at_ms.load(Ordering::Relaxed))
            >= WRITE_FAILURE_WINDOW_MS;
        self.store_lost_at_ms.store(now_ms(), Ordering::Relaxed);
        *self
            .store_lost_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(detail.to_owned());
        if first {
            tracing::error!(detail, "store lost: the store no longer holds data it held; every write there waits (readiness false) until an operator rebuilds from the log or accepts the loss");
        }
        super::metrics::store_lost(true);
        super::metrics::ready(false);
    }

    /// Whether a call found the store's data gone within [`WRITE_FAILURE_WINDOW_MS`].
    fn store_lost_now(&self) -> bool {
        now_ms().saturating_sub(self.store_lost_at_ms.load(Ordering::Relaxed))
            < WRITE_FAILURE_WINDOW_MS
    }

    /// `/readyz`'s whole `store data:` line.
    fn store_data_line(&self) -> String {
        if !self.store_lost_now() {
            return "store data: ok".to_owned();
        }
        let detail = self
            .store_lost_detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        format!("store data: lost: {detail}")
    }

    /// The store refuses writes for memory: a master read at its limit, or an `OOM` answer
    /// within [`WRITE_FAILURE_WINDOW_MS`].
    fn store_full(&self) -> bool {
        self.store_memory.failing()
            || now_ms().saturating_sub(self.oom_at_ms.load(Ordering::Relaxed))
                < WRITE_FAILURE_WINDOW_MS
    }

    fn store_memory_line(&self) -> String {
        if self.store_memory.failing() || !self.store_full() {
            return self.store_memory.line();
        }
        let masters = self
            .store_memory
            .line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        format!(
            "store full: writes are refused with OOM (used memory > maxmemory) and wait, nothing is dead-lettered; free memory or raise maxmemory{}",
            masters.map(|m| format!(" ({m})")).unwrap_or_default()
        )
    }

    /// Sets the `ready` and `store_full` gauges from the current state (a write failure ages
    /// out of the window).
    pub fn refresh(&self) {
        super::metrics::store_full(self.store_full());
        super::metrics::store_lost(self.store_lost_now());
        super::metrics::ready(self.ready());
    }

    pub(crate) fn store_ok(&self) -> bool {
        self.store_ok.load(Ordering::Relaxed)
    }

    pub(crate) fn broker_ok(&self) -> bool {
        self.broker_ok.load(Ordering::Relaxed)
    }

    /// One line per readiness condition, for `/readyz`'s body.
    pub(crate) fn describe(&self) -> String {
        let word = |ok: bool, bad: &'static str| if ok { "ok" } else { bad };
        let recent_write_failure = now_ms()
            .saturating_sub(self.write_failed_at_ms.load(Ordering::Relaxed))
            < WRITE_FAILURE_WINDOW_MS;
        format!(
            "store: {}\nstore writes: {}\nstore policy: {}\nstore memory: {}\n{}\nstore slots: {}\nbroker: {}\nkafka grants: {}\nsubscription: {}\npartitions: {}\nrecords lost: {}\npartition growth: {}\nblocked mailboxes: {}\ndead letters: {}\n",
            if self.store_ok() {
                "ok".to_owned()
            } else {
                self.store_waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_else(|| "unreachable".to_owned())
            },
            word(!recent_write_failure, "failing"),
            self.store_policy.line(),
            self.store_memory_line(),
            self.store_data_line(),
            self.store_slots.line(),
            word(self.broker_ok(), "unreachable"),
            self.kafka_grants.line(),
            self.subscription.line(),
            word(!self.consumer_stalled.load(Ordering::Relaxed), "stalled"),
            self.records_lost_line(),
            self.growth_line(),
            self.blocked.line(),
            word(
                !self.dead_letters_failing.load(Ordering::Relaxed),
                "failing"
            ),
        )
    }

    pub fn ready(&self) -> bool {
        let recent_write_failure = now_ms()
            .saturating_sub(self.write_failed_at_ms.load(Ordering::Relaxed))
            < WRITE_FAILURE_WINDOW_MS;
        self.store_ok()
            && self.broker_ok()
            && !self.consumer_stalled.load(Ordering::Relaxed)
            && !self.dead_letters_failing.load(Ordering::Relaxed)
            && !recent_write_failure
            && !self.subscription.failing()
            && !self.store_policy.failing()
            && !self.store_slots.failing()
            && !self.store_full()
            && !self.store_lost_now()
            && !self.blocked.failing()
            && !self.kafka_grants.failing()
            && !self.records_lost_failing()
    }
}
