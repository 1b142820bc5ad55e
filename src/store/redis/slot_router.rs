//! The Redis Cluster routing of batched appends: one request per run, sent to the master of its
//! slot, and every `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or `LOADING` answered for that
//! request alone (SPEC 7.2, "The cluster may change under load").
//!
//! Why not the redis crate's cluster client (1.8.1) for this path: it re-sends a whole pipeline
//! when one of its commands is redirected, waits at least 1.28 s before each `TRYAGAIN` retry,
//! re-reads its slot map on every `MOVED` (751 refreshes for one rebalance), and, in about one
//! rebalance under load in three, stalled in a refresh that never finished, so that every
//! request timed out until a fresh client replaced it and the retries of requests that had run
//! answered `unchanged`. Here a request is one script call (and its `WAIT`): an answer that
//! redirects it is an answer that ran nothing, so sending it again is the one execution.
//!
//! - **Slot table**: 16,384 entries, each a master's address, read with `CLUSTER SLOTS`. A
//!   `MOVED <slot> <addr>` updates that slot's entry at once, and asks for one re-read of the
//!   whole table; re-reads are coalesced (one at a time, at most one per [`REFRESH_SPACING`]),
//!   so a rebalance moving thousands of slots costs one `CLUSTER SLOTS` a second, not one per
//!   command. Each re-read logs what moved since the previous one ("slots 0-1364 now on
//!   127.0.0.1:7003"), once per change.
//! - **Connections**: one multiplexed connection per master, opened on first use with the
//!   configured URL's scheme and credentials, dropped when it fails (opened again on next use).
//!   At most one per node of the table plus the nodes a redirect named: bounded by the cluster.
//! - **`ASK`**: `ASKING` and the request on the target node's connection, in one pipeline (the
//!   slot is importing there; the table does not change).
//! - **`TRYAGAIN` / `CLUSTERDOWN` / `LOADING`**: the request waits [`WAIT_BACKOFF`] (10 ms,
//!   doubling, at most 320 ms) and is sent again, at most [`MAX_WAITS`] times (about 5 s), then
//!   answers its error (transient: the engine retries the delivery with its own backoff). A
//!   script names every key of its user (`KEYS`, one hash tag, one slot), so while its slot
//!   migrates and the user's keys are split between two nodes the server answers `TRYAGAIN`
//!   instead of running it: a script never sees half a mailbox, and only that slot's users wait.
//! - **Counted, not logged per delivery**: [`SlotRouter::redirects`] counts each redirection
//!   by kind; the daemon exports them as `materializer_store_redirects_total{kind}` and logs
//!   one INFO line summing up each 10 s that had any.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::node_url::node_url;
use super::RedisSettings;
use crate::retry::Backoff;

/// Slots of a Redis Cluster.
const SLOTS: usize = 16_384;
/// Re-reads of the slot table are at least this far apart (a rebalance moves a slot every few
/// milliseconds; `MOVED` keeps each request right meanwhile).
const REFRESH_SPACING: Duration = Duration::from_secs(1);
/// Waits of one request for a slot that answers `TRYAGAIN`, `CLUSTERDOWN` or `LOADING`.
const MAX_WAITS: u32 = 20;
/// The backoff of those waits.
const WAIT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(320));
/// Redirections of one request it follows (`MOVED` then `ASK` is two) before it answers the
/// last one as its error: a slot map changing faster than that is not routine.
const MAX_REDIRECTS: u32 = 8;

/// Kinds of redirection, as the metric labels them.
pub const REDIRECT_KINDS: &[&str] = &["moved", "ask", "tryagain", "clusterdown", "loading"];

/// The append path's routing on a Redis Cluster (see the module's doc).
pub(super) struct SlotRouter {
    settings: RedisSettings,
    /// The seed addresses (`host:port`), asked when no node of the table answers.
    seeds: Vec<String>,
    /// The master of each slot (`None`: no node serves it).
    table: RwLock<Vec<Option<Arc<str>>>>,
    /// The table as last read with `CLUSTER SLOTS`: what a re-read compares to, for its log.
    read: Mutex<Vec<Option<Arc<str>>>>,
    nodes: Mutex<HashMap<Arc<str>, MultiplexedConnection>>,
    /// A re-read is wanted (a `MOVED`, a failed connection).
    stale: AtomicBool,
    /// A re-read is running.
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
    /// Redirections met, by kind ([`REDIRECT_KINDS`]).
    counts: [AtomicU64; 5],
}

impl std::fmt::Debug for SlotRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRouter").finish_non_exhaustive()
    }
}

/// What an answer asks of the request that got it.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    /// Send it to this node from now on (the slot moved).
    Moved(u16, String),
    /// Send it once to this node, after `ASKING` (the slot is importing there).
    Ask(String),
    /// Wait and send it again (`kind` as [`REDIRECT_KINDS`] names it).
    Wait(usize),
}

fn redirect_of(e: &RedisError) -> Option<Redirect> {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => e
            .redirect_node()
            .map(|(addr, slot)| Redirect::Moved(slot, addr.to_owned())),
        ErrorKind::Server(ServerErrorKind::Ask) => e
            .redirect_node()
            .map(|(addr, _)| Redirect::Ask(addr.to_owned())),
        ErrorKind::Server(ServerErrorKind::TryAgain) => Some(Redirect::Wait(2)),
        ErrorKind::Server(ServerErrorKind::ClusterDown) => Some(Redirect::Wait(3)),
        ErrorKind::Server(ServerErrorKind::BusyLoading) => Some(Redirect::Wait(4)),
        _ => None,
    }
}

impl SlotRouter {
    pub(super) fn new(settings: &RedisSettings) -> Arc<Self> {
        let seeds = std::iter::once(&settings.url)
            .chain(&settings.extra_nodes)
            .filter_map(|url| address_of(url))
            .collect();
        Arc::new(Self {
            settings: settings.clone(),
            seeds,
            table: RwLock::new(vec![None; SLOTS]),
            read: Mutex::new(vec![None; SLOTS]),
            nodes: Mutex::new(HashMap::new()),
            stale: AtomicBool::new(true),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            counts: Default::default(),
        })
    }

    /// Redirections met so far, by kind (as [`REDIRECT_KINDS`] orders them).
    pub(super) fn redirects(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    /// Sends `pipe` (one run's request: its script call, then `WAIT` when configured) to the
    /// master of `slot` and answers each command's reply. Redirections are followed for this
    /// request alone; an error that is not one (a connection that failed, a timeout) is
    /// answered as is.
    pub(super) async fn send(
        self: &Arc<Self>,
        slot: u16,
        pipe: &Pipeline,
    ) -> Result<Vec<RedisResult<Value>>, RedisError> {
        let mut target: Option<(String, bool)> = None;
        let mut redirects = 0u32;
        let mut waits = 0u32;
        loop {
            let (addr, asking) = match target.take() {
                Some(t) => t,
                None => (self.owner(slot).await?, false),
            };
            let replies = match self.send_to(&addr, pipe, asking).await {
                Ok(replies) => replies,
                Err(e) => {
                    self.forget(&addr);
                    return Err(e);
                }
            };
            let redirect = match replies.first() {
                Some(Err(e)) => redirect_of(e),
                _ => None,
            };
            let Some(redirect) = redirect else {
                return Ok(replies);
            };
            let give_up = || {
                replies
                    .into_iter()
                    .next()
                    .and_then(Result::err)
                    .unwrap_or_else(|| RedisError::from((ErrorKind::Client, "redirect")))
            };
            match redirect {
                Redirect::Moved(moved_slot, to) => {
                    self.count(0);
                    self.set_owner(moved_slot, &to);
                    self.wants_refresh();
                    redirects += 1;
                    if redirects > MAX_REDIRECTS {
                        return Err(give_up());
                    }
                    target = Some((to, false));
                }
                Redirect::Ask(to) => {
                    self.count(1);
                    redirects += 1;
                    if redirects > MAX_REDIRECTS {
                        return Err(give_up());
                    }
                    target = Some((to, true));
                }
                Redirect::Wait(kind) => {
                    self.count(kind);
                    if waits >= MAX_WAITS {
                        return Err(give_up());
                    }
                    if kind != 2 {
                        // A failover or a node loading: the table may be about to change.
                        self.wants_refresh();
                    }
                    tokio::time::sleep(WAIT_BACKOFF.delay(waits)).await;
                    waits += 1;
                }
            }
        }
    }

    /// Loads `scripts` on the master of `slot` (a master that joined the cluster after the
    /// scripts were loaded answers `NOSCRIPT`).
    pub(super) async fn load_scripts(
        self: &Arc<Self>,
        slot: u16,
        scripts: &[&redis::Script],
    ) -> Result<(), RedisError> {
        let addr = self.owner(slot).await?;
        let mut conn = self.connection(&addr).await?;
        for script in scripts {
            if let Err(e) = script.prepare_invoke().load_async(&mut conn).await {
                self.forget(&addr);
                return Err(e);
            }
        }
        Ok(())
    }

    async fn send_to(
        &self,
        addr: &str,
        pipe: &Pipeline,
        asking: bool,
    ) -> Result<Vec<RedisResult<Value>>, RedisError> {
        let mut conn = self.connection(addr).await?;
        if !asking {
            return pipe.query_async(&mut conn).await;
        }
        let mut asked = redis::pipe();
        asked.ignore_errors();
        asked.cmd("ASKING");
        for cmd in pipe.cmd_iter() {
            asked.add_command(cmd.clone());
        }
        let mut replies: Vec<RedisResult<Value>> = asked.query_async(&mut conn).await?;
        if replies.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Client,
                "ASKING answered nothing",
            )));
        }
        // ASKING refused (an ACL without it): the request did not run; its error says why.
        replies.remove(0)?;
        Ok(replies)
    }

    /// The master of `slot`, reading the table first when it is stale or names none.
    async fn owner(self: &Arc<Self>, slot: u16) -> Result<String, RedisError> {
        if self.stale.load(Ordering::Relaxed) {
            self.refresh_soon();
        }
        if let Some(addr) = self.owner_in_table(slot) {
            return Ok(addr);
        }
        // No owner known (the first request, or a slot no node served at the last read): read
        // the table now rather than in the background.
        self.refresh().await;
        self.owner_in_table(slot).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ClusterDown),
                "no Redis Cluster master serves the slot",
                format!("slot {slot}"),
            ))
        })
    }

    fn owner_in_table(&self, slot: u16) -> Option<String> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(usize::from(slot))
            .cloned()
            .flatten()
            .map(|a| a.to_string())
    }

    fn set_owner(&self, slot: u16, addr: &str) {
        let mut table = self
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = table.get_mut(usize::from(slot)) {
            if entry.as_deref() != Some(addr) {
                *entry = Some(Arc::from(addr));
            }
        }
    }

    fn wants_refresh(self: &Arc<Self>) {
        self.stale.store(true, Ordering::Relaxed);
        self.refresh_soon();
    }

    /// Starts a re-read in the background unless one runs or the last one is too recent (the
    /// next request after the spacing starts it).
    fn refresh_soon(self: &Arc<Self>) {
        let recent =
            super::lock(&self.last_refresh).is_some_and(|at| at.elapsed() < REFRESH_SPACING);
        if recent || self.refreshing.load(Ordering::Relaxed) {
            return;
        }
        let router = Arc::clone(self);
        tokio::spawn(async move { router.refresh().await });
    }

    /// Reads the slot table with `CLUSTER SLOTS` from the first node that answers (the nodes
    /// of the table, then the seeds) and logs what moved since the previous read.
    async fn refresh(&self) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            // Another read runs: wait for it rather than read twice.
            while self.refreshing.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            return;
        }
        self.stale.store(false, Ordering::Relaxed);
        *super::lock(&self.last_refresh) = Some(Instant::now());
        let mut candidates: Vec<String> = {
            let table = self
                .table
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut seen: Vec<String> = Vec::new();
            for addr in table.iter().flatten() {
                if !seen.iter().any(|s| s.as_str() == &**addr) {
                    seen.push(addr.to_string());
                }
            }
            seen
        };
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut fresh = None;
        for addr in &candidates {
            match self.read_slots(addr).await {
                Ok(table) => {
                    fresh = Some(table);
                    break;
                }
                Err(_) => self.forget(addr),
            }
        }
        match fresh {
            Some(fresh) => {
                let moved = {
                    let mut read = super::lock(&self.read);
                    // The first read names every slot: nothing moved.
                    let moved = if read.iter().all(Option::is_none) {
                        None
                    } else {
                        describe_moves(&read, &fresh)
                    };
                    read.clone_from(&fresh);
                    moved
                };
                if let Some(moved) = moved {
                    tracing::info!("Redis Cluster slots moved: {moved}");
                }
                let live: Vec<Arc<str>> = fresh.iter().flatten().cloned().collect();
                *self
                    .table
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                // Connections to nodes that serve no slot any more are closed.
                super::lock(&self.nodes).retain(|addr, _| live.contains(addr));
            }
            None => {
                // Nothing answered: the next request asks again.
                self.stale.store(true, Ordering::Relaxed);
            }
        }
        self.refreshing.store(false, Ordering::Release);
    }

    async fn read_slots(&self, addr: &str) -> Result<Vec<Option<Arc<str>>>, RedisError> {
        let mut conn = self.connection(addr).await?;
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await?;
        parse_slots(&reply, addr).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Client,
                "CLUSTER SLOTS answered an unexpected reply",
                format!("{reply:?}"),
            ))
        })
    }

    async fn connection(&self, addr: &str) -> Result<MultiplexedConnection, RedisError> {
        if let Some(conn) = super::lock(&self.nodes).get(addr) {
            return Ok(conn.clone());
        }
        let client = redis::Client::open(node_url(&self.settings.url, addr))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.command_timeout));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        super::lock(&self.nodes).insert(Arc::from(addr), conn.clone());
        Ok(conn)
    }

    /// Drops the connection to `addr` (it failed) and asks for a re-read of the table (a node
    /// that fails may be failing over).
    fn forget(&self, addr: &str) {
        super::lock(&self.nodes).remove(addr);
        self.stale.store(true, Ordering::Relaxed);
    }

    fn count(&self, kind: usize) {
        self.counts[kind].fetch_add(1, Ordering::Relaxed);
    }
}

/// `host:port` of a configured node URL (`redis://[user:pw@]host:port[/db]`).
fn address_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    (!host_port.is_empty()).then(|| host_port.to_owned())
}

/// The slot table of a `CLUSTER SLOTS` reply (`[[start, end, [host, port, ...], replicas...],
/// ...]`); a master announced without a host (`""` or `?`) is the node that answered.
fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<Option<Arc<str>>>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
    let mut table = vec![None; SLOTS];
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_owned()
        } else {
            host
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let addr: Arc<str> = Arc::from(format!("{host}:{port}"));
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        if start > end || end >= SLOTS {
            return None;
        }
        for entry in &mut table[start..=end] {
            *entry = Some(addr.clone());
        }
    }
    Some(table)
}

/// "slots 0-1364 now on 127.0.0.1:7003; slot 5000 now on ..." for the entries that differ
/// (`None` when none does); at most 8 ranges named, then how many more.
fn describe_moves(before: &[Option<Arc<str>>], after: &[Option<Arc<str>>]) -> Option<String> {
    let mut ranges: Vec<(usize, usize, String)> = Vec::new();
    for (slot, (old, new)) in before.iter().zip(after).enumerate() {
        if old == new {
            continue;
        }
        let to = new.as_deref().unwrap_or("no node").to_owned();
        match ranges.last_mut() {
            Some((_, end, owner)) if *end + 1 == slot && *owner == to => *end = slot,
            _ => ranges.push((slot, slot, to)),
        }
    }
    if ranges.is_empty() {
        return None;
    }
    let mut named: Vec<String> = ranges
        .iter()
        .take(8)
        .map(|(start, end, to)| {
            if start == end {
                format!("slot {start} now on {to}")
            } else {
                format!("slots {start}-{end} now on {to}")
            }
        })
        .collect();
    if ranges.len() > 8 {
        named.push(format!("and {} more ranges", ranges.len() - 8));
    }
    Some(named.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn cluster_slots_replies_fill_the_table() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "", 7001),
            range(10923, 16383, "127.0.0.1", 7002),
        ]);
        let table = parse_slots(&reply, "10.0.0.9:7001").expect("parsed");
        assert_eq!(table[0].as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(table[5461].as_deref(), Some("10.0.0.9:7001"));
        assert_eq!(table[16383].as_deref(), Some("127.0.0.1:7002"));
        assert!(parse_slots(&Value::Array(vec![range(0, 16384, "h", 1)]), "h:1").is_none());
        assert!(parse_slots(&Value::Int(1), "h:1").is_none());
    }

    #[test]
    fn moves_are_named_as_ranges() {
        let a: Arc<str> = Arc::from("a:1");
        let b: Arc<str> = Arc::from("b:2");
        let before = vec![Some(a.clone()); 10];
        let mut after = before.clone();
        for entry in &mut after[2..5] {
            *entry = Some(b.clone());
        }
        after[7] = Some(b.clone());
        assert_eq!(
            describe_moves(&before, &after).as_deref(),
            Some("slots 2-4 now on b:2; slot 7 now on b:2")
        );
        assert_eq!(describe_moves(&before, &before), None);
    }

    #[test]
    fn redirects_are_told_apart() {
        let moved = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Moved),
            "An error was signalled by the server",
            "3999 127.0.0.1:6381".to_owned(),
        ));
        assert_eq!(
            redirect_of(&moved),
            Some(Redirect::Moved(3999, "127.0.0.1:6381".to_owned()))
        );
        let ask = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "An error was signalled by the server",
            "3999 127.0.0.1:6381".to_owned(),
        ));
        assert_eq!(
            redirect_of(&ask),
            Some(Redirect::Ask("127.0.0.1:6381".to_owned()))
        );
        let again = RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "x"));
        assert_eq!(redirect_of(&again), Some(Redirect::Wait(2)));
        assert_eq!(redirect_of(&RedisError::from((ErrorKind::Io, "x"))), None);
    }

    #[test]
    fn seed_addresses_drop_scheme_and_credentials() {
        assert_eq!(
            address_of("rediss://u:pw@10.0.0.1:7000/0").as_deref(),
            Some("10.0.0.1:7000")
        );
        assert_eq!(address_of("redis://h:1").as_deref(), Some("h:1"));
    }
}
