//! The Redis backend: the V4 layout of SPEC 5, every rule of SPEC 4 inside atomic Lua scripts.
//!
//! One script per operation, sharing `lua/includes/`: the SPEC 4 operations (`lua/append.lua`,
//! `truncate.lua`, `promote.lua`, `scan_begin.lua`, `scan_end.lua`, `inspect.lua`), the repair's
//! (`repair_begin.lua`, `repair_renew.lua`, `repair_swap.lua`, `repair_abort.lua`,
//! `repair_collect.lua`) and `user_keys.lua` (every key name of a user, for dumps). Batches of
//! appends are pipelines, split by master on a cluster (`batch`). "Now" is only ever the server's
//! `TIME`, so expiry decisions agree with Redis's own TTLs. A scan is a pre-read script, a
//! pipeline of `ZRANGE BYSCORE` reads over every active day, and a post-read script that refuses
//! the page if expiry crossed the cursor meanwhile.
//!
//! Standalone servers are reached through a `ConnectionManager` (reconnects by itself), Redis
//! Cluster through the cluster client; both are multiplexed, so concurrent calls on different
//! mailboxes share connections without waiting for each other.

mod batch;
pub mod keys;
pub mod scripts;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::model::error::{ConflictKind, CorruptKind, CursorExpired, RejectKind};
use crate::model::validate::{
    validate_before_seq, validate_group, validate_scan, MAX_EVENTS_PER_GROUP,
};
use crate::model::{
    ActiveDay, AppendOutcome, Event, EventGroup, MailboxId, MailboxInspection, Payload,
    PromoteOutcome, RetentionPolicy, ScanPage, ScanRequest, ScannedGroup, StoreError,
    TruncateOutcome, UserId, MAX_MAILBOX_SEQ,
};
use crate::store::{MailboxStore, PhaseHook, RepairToken, SwapReport};

use keys::{event_member, parse_event_member, KeySet, MailboxKeys};
use scripts::{ScriptCode, Scripts};

const BACKEND: &str = "redis";

/// How to reach Redis.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]`, `rediss://` for TLS, or `redis+unix://`.
    pub url: String,
    /// Use the Redis Cluster client (`url` is one seed node; more may follow in `extra_nodes`).
    pub cluster: bool,
    /// Further cluster seed nodes.
    pub extra_nodes: Vec<String>,
    /// Prefix `P` of every key.
    pub key_prefix: String,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// Replicas that must acknowledge a write before it counts as done (`WAIT`); 0: none.
    pub wait_replicas: u32,
    /// How long `WAIT` may block; must stay below `command_timeout`.
    pub wait_timeout: Duration,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &crate::config::redact_url(&self.url))
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("wait_replicas", &self.wait_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisSettings {
    pub fn new(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            cluster: false,
            extra_nodes: Vec::new(),
            key_prefix: key_prefix.into(),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
        }
    }
}

/// A standalone or a cluster connection; both are cheap to clone and multiplexed.
#[derive(Clone)]
pub enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The Redis backend.
pub struct RedisStore {
    connection: Connection,
    settings: RedisSettings,
    policy: RetentionPolicy,
    scripts: Scripts,
    after_scan_read: Mutex<Option<PhaseHook>>,
    /// A cluster's slot map, for batches grouped by master (`batch`).
    slot_map: Mutex<Option<std::sync::Arc<batch::SlotMap>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("settings", &self.settings)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Every error of the Redis client is classified in one place (SPEC 7, error classes).
fn classified(e: RedisError) -> StoreError {
    crate::store::classify::redis::classify(&e)
}

/// A script reply this code does not understand (see `classify::redis::unexpected_reply`).
fn protocol(detail: impl Into<String>) -> StoreError {
    crate::store::classify::redis::unexpected_reply(detail.into())
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn num(value: Option<&Value>) -> u64 {
    value.and_then(int).map_or(0, |i| i.max(0) as u64)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl RedisStore {
    /// Connects (standalone or cluster) and checks the server answers.
    pub async fn connect(
        settings: RedisSettings,
        policy: RetentionPolicy,
    ) -> Result<Self, StoreError> {
        let connection = if settings.cluster {
            let mut nodes = vec![settings.url.clone()];
            nodes.extend(settings.extra_nodes.iter().cloned());
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(settings.connect_timeout)
                .response_timeout(settings.command_timeout)
                .build()
                .map_err(classified)?;
            Connection::Cluster(client.get_async_connection().await.map_err(classified)?)
        } else {
            let client = redis::Client::open(settings.url.as_str()).map_err(classified)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.command_timeout))
                .set_number_of_retries(2);
            let manager = tokio::time::timeout(
                settings.connect_timeout,
                client.get_connection_manager_with_config(config),
            )
            .await
            .map_err(|_| StoreError::Unavailable {
                backend: BACKEND,
                detail: format!(
                    "no connection to {} within {:?}",
                    crate::config::redact_url(&settings.url),
                    settings.connect_timeout
                ),
            })?
            .map_err(classified)?;
            Connection::Single(manager)
        };
        let store = Self {
            connection,
            settings,
            policy,
            scripts: Scripts::new(),
            after_scan_read: Mutex::new(None),
            slot_map: Mutex::new(None),
        };
        let _: String = redis::cmd("PING")
            .query_async(&mut store.conn())
            .await
            .map_err(classified)?;
        Ok(store)
    }

    pub fn policy(&self) -> RetentionPolicy {
        self.policy
    }

    pub fn key_prefix(&self) -> &str {
        &self.settings.key_prefix
    }

    /// A handle on the shared connection (a clone is a new handle, not a new socket).
    pub fn conn(&self) -> Connection {
        self.connection.clone()
    }

    fn keys(&self, mailbox: &MailboxId) -> MailboxKeys {
        MailboxKeys::new(&self.settings.key_prefix, mailbox)
    }

    /// Installs (or clears) the hook run between a scan's bucket reads and its post-read check.
    pub fn set_after_scan_read_hook(&self, hook: Option<PhaseHook>) {
        *lock(&self.after_scan_read) = hook;
    }

    async fn invoke(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let reply: Value = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(classified)?;
        match reply {
            Value::Array(items) => Ok(items),
            other => Err(protocol(format!("{other:?}"))),
        }
    }

    /// Runs a write script and, with `wait_replicas > 0`, makes it durable before answering: the
    /// script and `WAIT wait_replicas wait_timeout` go in ONE pipeline, so both reach the server
    /// on the same connection, back to back. (A multiplexed connection may reconnect between two
    /// separate calls, and a `WAIT` on a new connection covers none of the old one's writes.)
    /// The scripts rewrite the epoch key when asked (`propagate_for_wait`), so the `WAIT` covers
    /// what the answer was read from even when the script itself changed nothing.
    ///
    /// Fewer acknowledgements than `wait_replicas` is transient `Unavailable`: the write may or
    /// may not survive a failover, so the caller retries, and the replay is idempotent.
    async fn invoke_durable(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let wanted = self.settings.wait_replicas;
        if wanted == 0 {
            return self.invoke(invocation).await;
        }
        let timeout_ms = u64::try_from(self.settings.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout_ms);
        let mut conn = self.conn();
        let result: Result<(Value, i64), RedisError> = pipe.query_async(&mut conn).await;
        let (reply, acks) = match result {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                invocation.load_async(&mut conn).await.map_err(classified)?;
                pipe.query_async(&mut conn).await.map_err(classified)?
            }
            other => other.map_err(classified)?,
        };
        if acks < i64::from(wanted) {
            return Err(crate::store::classify::redis::too_few_replicas(
                acks, wanted, timeout_ms,
            ));
        }
        match reply {
            Value::Array(items) => Ok(items),
            other => Err(protocol(format!("{other:?}"))),
        }
    }

    /// The durability flag the write scripts take (`'1'` when a `WAIT` follows them).
    fn wait_flag(&self) -> &'static str {
        if self.settings.wait_replicas > 0 {
            "1"
        } else {
            "0"
        }
    }

    /// Maps a negative script reply to the contract's error.
    fn script_error(&self, reply: &[Value]) -> StoreError {
        let code = reply.first().and_then(int).unwrap_or(0);
        let arg = |i: usize| reply.get(i).map(text).unwrap_or_default();
        let n = |i: usize| num(reply.get(i));
        match ScriptCode::from_code(code) {
            Some(ScriptCode::FutureCreatedAt) => StoreError::rejected(
                RejectKind::FutureCreatedAt,
                format!(
                    "created_at is beyond today + future_window_days ({}) by the server clock",
                    self.policy.future_window_days
                ),
            ),
            Some(ScriptCode::SpanExceeded) => StoreError::rejected(
                RejectKind::SpanExceeded,
                format!(
                    "the active days would span {}..={}, more than max_active_span_days ({})",
                    n(1),
                    n(2),
                    self.policy.max_active_span_days
                ),
            ),
            Some(ScriptCode::CrossDay) => StoreError::Conflict {
                kind: ConflictKind::CrossDay {
                    existing_day: n(1),
                    incoming_day: n(2),
                },
            },
            Some(ScriptCode::UnsupportedFormat) => {
                StoreError::corrupt(CorruptKind::UnsupportedFormat { found: arg(1) })
            }
            Some(ScriptCode::IndexLost) => StoreError::corrupt(CorruptKind::IndexLost),
            Some(ScriptCode::MetaLost) => StoreError::corrupt(CorruptKind::MetaLost),
            Some(ScriptCode::IdentityMissing) => {
                StoreError::corrupt(CorruptKind::IdentityMissing {
                    seq: n(2),
                    seqbucket_max_seq: n(1),
                })
            }
            Some(ScriptCode::BadProof) => {
                StoreError::corrupt(CorruptKind::BadProof { detail: arg(1) })
            }
            Some(ScriptCode::EpochMismatch) => StoreError::EpochMismatch {
                current: arg(1).parse().ok(),
            },
            Some(ScriptCode::CursorTrimmed) => StoreError::CursorExpired {
                cursor: CursorExpired::Trimmed {
                    resume_after: n(1).saturating_sub(1),
                },
            },
            Some(ScriptCode::CursorGap) => StoreError::CursorExpired {
                cursor: CursorExpired::ExpiredGap { boundary: n(1) },
            },
            Some(ScriptCode::UnderRepair) => StoreError::UnderRepair { holder: arg(1) },
            Some(ScriptCode::FenceLost) => StoreError::FenceLost {
                detail: match arg(1).as_str() {
                    "" => "the repair fence lapsed (no fence exists)".to_owned(),
                    other => format!("the repair fence is held by {other}"),
                },
            },
            None => protocol(format!("code {code}")),
        }
    }

    /// Every key name `user` may hold (fence, both epoch keys, and every key of the epoch each
    /// copy names plus `extra_epochs`), named exactly (`lua/user_keys.lua`), never by a pattern
    /// that could match another deployment's keys. Some names may not exist.
    pub async fn user_key_names(
        &self,
        user: &UserId,
        extra_epochs: &[u32],
    ) -> Result<Vec<String>, StoreError> {
        let keys = keys::UserKeys::new(&self.settings.key_prefix, user);
        let mut invocation = self.scripts.user_keys.prepare_invoke();
        invocation
            .key(&keys.repair)
            .key(&keys.live_epoch)
            .key(&keys.staging_epoch)
            .arg(&keys.live_stem)
            .arg(&keys.staging_stem)
            .arg(keys::tag(user))
            .arg(self.policy.retention_days)
            .arg(self.policy.future_window_days);
        for epoch in extra_epochs {
            invocation.arg(*epoch);
        }
        let names: Vec<String> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(classified)?;
        Ok(names)
    }

    /// Every existing key of `user` (see [`RedisStore::user_key_names`]) with its serialized value
    /// (`DUMP`) and absolute expiry in ms (`PEXPIRETIME`), sorted by key: a byte-exact fingerprint
    /// of the user's state in both copies, fence included.
    pub async fn dump_user(
        &self,
        user: &UserId,
        extra_epochs: &[u32],
    ) -> Result<Vec<(String, Vec<u8>, i64)>, StoreError> {
        let mut names = self.user_key_names(user, extra_epochs).await?;
        names.sort();
        names.dedup();
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("DUMP").arg(name).cmd("PEXPIRETIME").arg(name);
        }
        let replies: Vec<Value> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        let mut out = Vec::new();
        for (name, pair) in names.into_iter().zip(replies.chunks(2)) {
            if let [Value::BulkString(dump), expire] = pair {
                out.push((name, dump.clone(), int(expire).unwrap_or(-2)));
            }
        }
        Ok(out)
    }

    /// Reads the groups of every active day with seqs in `(after, until]` (SPEC 4.4 step 6).
    ///
    /// Each day is read with `ZRANGE BYSCORE ... LIMIT` so a page's memory stays bounded. A day
    /// whose read was cut by the limit is complete only below its last seq; the page then covers
    /// up to the smallest such bound, and never claims more.
    async fn read_days(
        &self,
        keys: &MailboxKeys,
        days: &[u64],
        request: &ScanRequest,
    ) -> Result<(BTreeMap<u64, ScannedGroup>, Option<u64>), StoreError> {
        let chunk = (request.limit_groups as usize).saturating_mul(4).max(64);
        let mut groups: BTreeMap<u64, (u64, Vec<Event>)> = BTreeMap::new();
        let mut covered: Option<u64> = None;
        let max = request
            .until_seq
            .map_or_else(|| "+inf".to_owned(), |u| u.to_string());
        let mut pending: Vec<(u64, usize)> = days.iter().map(|&d| (d, chunk)).collect();
        while !pending.is_empty() {
            let mut pipe = redis::pipe();
            for (day, count) in &pending {
                pipe.cmd("ZRANGE")
                    .arg(keys.day(*day))
                    .arg(request.after_seq.min(MAX_MAILBOX_SEQ))
                    .arg(&max)
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(*count);
            }
            let replies: Vec<Vec<String>> = pipe
                .query_async(&mut self.conn())
                .await
                .map_err(classified)?;
            let mut again = Vec::new();
            for ((day, count), members) in pending.iter().zip(replies) {
                let truncated = members.len() >= *count;
                let mut parsed = Vec::with_capacity(members.len());
                for member in &members {
                    let (seq, ordinal, created_at, payload) = parse_event_member(member)
                        .ok_or_else(|| {
                            StoreError::corrupt(CorruptKind::BadProof {
                                detail: format!("day {day}: unreadable bucket member"),
                            })
                        })?;
                    if seq <= request.after_seq || request.until_seq.is_some_and(|u| seq > u) {
                        continue;
                    }
                    let payload = Payload::from_canonical(payload).map_err(|e| {
                        StoreError::corrupt(CorruptKind::BadProof {
                            detail: format!("day {day}, seq {seq}: payload is not JSON: {e}"),
                        })
                    })?;
                    parsed.push((
                        seq,
                        created_at,
                        Event {
                            event_ordinal: ordinal,
                            payload,
                        },
                    ));
                }
                if truncated {
                    let last = parsed.last().map_or(request.after_seq, |p| p.0);
                    let complete_below = last.saturating_sub(1);
                    let no_whole_group = parsed.first().is_none_or(|p| p.0 == last);
                    if no_whole_group && *count <= MAX_EVENTS_PER_GROUP {
                        // Not one whole group fit: read this day again with room for the
                        // largest group there can be.
                        again.push((*day, MAX_EVENTS_PER_GROUP + chunk));
                        continue;
                    }
                    parsed.retain(|p| p.0 < last);
                    covered = Some(covered.map_or(complete_below, |c: u64| c.min(complete_below)));
                }
                for (seq, created_at, event) in parsed {
                    groups
                        .entry(seq)
                        .or_insert_with(|| (created_at, Vec::new()))
                        .1
                        .push(event);
                }
            }
            pending = again;
        }
        let groups = groups
            .into_iter()
            .filter(|(seq, _)| covered.is_none_or(|c| *seq <= c))
            .map(|(seq, (created_at, events))| {
                (
                    seq,
                    ScannedGroup {
                        mailbox_seq: seq,
                        created_at,
                        events: events.into(),
                    },
                )
            })
            .collect();
        Ok((groups, covered))
    }

    /// Promotes every mailbox whose meta key matches, walking every master with SCAN, at most
    /// `per_second` mailboxes a second, then removes the staging copies of crashed repairs
    /// ([`MailboxStore::repair_collect_garbage`]).
    pub async fn patrol(&self, per_second: u32) -> Result<PatrolReport, StoreError> {
        let pattern = keys::meta_pattern(&self.settings.key_prefix);
        let mut report = PatrolReport::default();
        let interval = Duration::from_secs_f64(1.0 / f64::from(per_second.max(1)));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for mut node in self.scan_targets().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = scan_batch(&mut node, cursor, &pattern).await?;
                for key in batch {
                    let Some(mailbox) = keys::parse_meta_key(&self.settings.key_prefix, &key)
                    else {
                        continue;
                    };
                    ticker.tick().await;
                    report.visited += 1;
                    match self.promote(&mailbox).await {
                        Ok(outcome) => report.expired_days += u64::from(outcome.expired_days),
                        Err(StoreError::Unavailable { .. }) => report.unavailable += 1,
                        Err(_) => report.corrupt += 1,
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        report.staging_collected = self.collect_staging_garbage().await?;
        Ok(report)
    }

    /// The connections SCAN must walk: the one server, or every master of the cluster.
    async fn scan_targets(&self) -> Result<Vec<Connection>, StoreError> {
        if !self.settings.cluster {
            return Ok(vec![self.conn()]);
        }
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        let mut targets = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 3 || !fields[2].split(',').any(|f| f == "master") {
                continue;
            }
            if fields[2].contains("fail") {
                continue;
            }
            let address = fields[1].split('@').next().unwrap_or_default();
            let url = node_url(&self.settings.url, address);
            let client = redis::Client::open(url.as_str()).map_err(classified)?;
            let manager = client
                .get_connection_manager_with_config(
                    ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.settings.connect_timeout))
                        .set_response_timeout(Some(self.settings.command_timeout)),
                )
                .await
                .map_err(classified)?;
            targets.push(Connection::Single(manager));
        }
        Ok(targets)
    }
}

/// One step of `SCAN cursor MATCH pattern` on one node: the next cursor (0 when done) and a
/// batch of keys. Walking batch by batch keeps the patrol's memory flat however many mailboxes
/// there are.
async fn scan_batch(
    node: &mut Connection,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<String>), StoreError> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(500)
        .query_async(node)
        .await
        .map_err(classified)
}

/// The URL of one cluster node: the configured URL with its host and port replaced, so scheme
/// and credentials carry over.
fn node_url(configured: &str, address: &str) -> String {
    let (scheme, rest) = configured
        .split_once("://")
        .unwrap_or(("redis", configured));
    let credentials = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority)
        .rsplit_once('@')
        .map(|(c, _)| format!("{c}@"))
        .unwrap_or_default();
    format!("{scheme}://{credentials}{address}")
}

/// The write paths shared by the live copy and a repair's staging copy: the same scripts, bound
/// to the copy's keys, with the fence check of `fence_verdict` (`lua/includes/common.lua`).
impl RedisStore {
    /// Appends `group` to one copy. `holder` is empty for a live write (refused under any fence)
    /// or the repair's holder id for a staged write (refused unless that repair holds the fence).
    /// The invocation of `lua/append.lua` that appends `group` to `copy` (as `holder`): exactly
    /// what [`MailboxStore::append`] sends. Benchmarks pipe the very same commands to the server
    /// raw, as the baseline of the daemon's rate.
    pub fn append_invocation(
        &self,
        copy: KeySet,
        holder: &str,
        group: &EventGroup,
    ) -> redis::ScriptInvocation<'_> {
        let keys = MailboxKeys::of(&self.settings.key_prefix, &group.mailbox, copy);
        let day = group.day();
        let mut events: Vec<&Event> = group.events.iter().collect();
        events.sort_by_key(|e| e.event_ordinal);
        let mut invocation = self.scripts.append.prepare_invoke();
        keys.bind(&mut invocation);
        // ARGV as `lua/append.lua` lists them.
        invocation
            .arg(&keys.stem)
            .arg(keys::tag(&group.mailbox.user_id))
            .arg(group.mailbox.epoch)
            .arg(group.mailbox_seq)
            .arg(format!("{:016}", group.mailbox_seq))
            .arg(day)
            .arg(self.policy.expires_at(day))
            .arg(
                day.saturating_sub(u64::from(self.policy.future_window_days))
                    .saturating_mul(crate::model::DAY_SECS),
            )
            .arg(self.policy.max_active_span_days)
            .arg(self.policy.retention_days)
            .arg(holder)
            .arg(self.wait_flag())
            .arg(events.len() + 1)
            .arg(group.source.map(|s| s.encode()).unwrap_or_default());
        for event in events {
            invocation.arg(event_member(
                group.mailbox_seq,
                event.event_ordinal,
                group.created_at,
                event.payload.as_str(),
            ));
        }
        invocation
    }

    async fn append_to(
        &self,
        copy: KeySet,
        holder: &str,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        validate_group(group)?;
        let invocation = self.append_invocation(copy, holder, group);
        let reply = self.invoke_durable(invocation).await?;
        self.append_reply(reply, group)
    }

    /// The outcome of `lua/append.lua`'s reply for `group`.
    fn append_reply(
        &self,
        reply: Vec<Value>,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        if matches!(reply.first().and_then(int), Some(1..=5)) {
            crate::store::note_promoted_days(num(reply.get(1)));
        }
        match reply.first().and_then(int) {
            Some(1) => Ok(AppendOutcome::Inserted),
            Some(2) => Ok(AppendOutcome::Unchanged),
            Some(3) => Ok(AppendOutcome::Replaced),
            Some(4) => Ok(AppendOutcome::ExpiredMerged),
            Some(5) => Ok(AppendOutcome::Trimmed),
            Some(6) => Ok(AppendOutcome::StaleEpoch),
            _ => {
                let mut reply = reply;
                // Cross-day and identity-missing replies name one side; add the other.
                match reply.first().and_then(int).and_then(ScriptCode::from_code) {
                    Some(ScriptCode::CrossDay) => reply.push(Value::Int(group.day() as i64)),
                    Some(ScriptCode::IdentityMissing) => {
                        reply.push(Value::Int(group.mailbox_seq as i64))
                    }
                    _ => {}
                }
                Err(self.script_error(&reply))
            }
        }
    }

    /// `truncate_before` on one copy; `holder` as in [`RedisStore::append_to`].
    async fn truncate_in(
        &self,
        copy: KeySet,
        holder: &str,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        validate_before_seq(before_seq)?;
        let keys = MailboxKeys::of(&self.settings.key_prefix, mailbox, copy);
        let mut invocation = self.scripts.truncate.prepare_invoke();
        keys.bind(&mut invocation);
        invocation
            .arg(mailbox.epoch)
            .arg(before_seq)
            .arg(holder)
            .arg(self.wait_flag());
        let reply = self.invoke_durable(invocation).await?;
        match reply.first().and_then(int) {
            Some(0) => Ok(TruncateOutcome {
                user_trim_seq: num(reply.get(1)),
                removed_groups: num(reply.get(2)),
            }),
            _ => Err(self.script_error(&reply)),
        }
    }

    /// Lease of a fence in whole milliseconds, at least one.
    fn lease_ms(lease: Duration) -> u64 {
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Removes the staging copies of users without a fence, walking `P:stgepoch:{*` with SCAN on
    /// every master; one script per user decides atomically (`lua/repair_collect.lua`).
    async fn collect_staging_garbage(&self) -> Result<u64, StoreError> {
        let prefix = &self.settings.key_prefix;
        let pattern = keys::staging_epoch_pattern(prefix);
        let mut collected = 0;
        for mut node in self.scan_targets().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = scan_batch(&mut node, cursor, &pattern).await?;
                for key in batch {
                    let Some(user) = keys::parse_staging_epoch_key(prefix, &key) else {
                        continue;
                    };
                    let keys = keys::UserKeys::new(prefix, &user);
                    let mut invocation = self.scripts.repair_collect.prepare_invoke();
                    invocation
                        .key(&keys.repair)
                        .key(&keys.staging_epoch)
                        .arg(&keys.staging_stem)
                        .arg(keys::tag(&user))
                        .arg(self.policy.retention_days)
                        .arg(self.policy.future_window_days);
                    let reply = self.invoke(invocation).await?;
                    if reply.first().and_then(int) == Some(1) {
                        tracing::info!(user = %user.as_str(), removed_keys = num(reply.get(1)), "removed the staging copy of a crashed repair");
                        collected += 1;
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(collected)
    }
}

/// What one patrol pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PatrolReport {
    pub visited: u64,
    pub expired_days: u64,
    pub corrupt: u64,
    pub unavailable: u64,
    /// Staging copies of crashed repairs (no fence left) removed by this pass.
    pub staging_collected: u64,
}

#[async_trait]
impl MailboxStore for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        self.append_to(KeySet::Live, "", group).await
    }

    async fn append_many(&self, groups: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        self.append_pipelined(groups).await
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.truncate_in(KeySet::Live, "", mailbox, before_seq)
            .await
    }

    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        validate_scan(&request)?;
        let keys = self.keys(mailbox);
        if request.until_seq.is_some_and(|u| u <= request.after_seq) {
            // SPEC 4.4: the epoch check (step 1) comes before the reverse-range answer (step 2),
            // which reads no bucket, meta or index: one GET of the epoch key.
            let current: Option<String> = redis::cmd("GET")
                .arg(&keys.epoch)
                .query_async(&mut self.conn())
                .await
                .map_err(classified)?;
            return match current {
                Some(current) if current != mailbox.epoch.to_string() => {
                    Err(StoreError::EpochMismatch {
                        current: current.parse().ok(),
                    })
                }
                _ => Ok(ScanPage::empty(request.after_seq)),
            };
        }
        let cursor_args = |invocation: &mut redis::ScriptInvocation<'_>| {
            keys.bind(invocation);
            invocation
                .arg(mailbox.epoch)
                .arg(request.after_seq.to_string())
                .arg(request.after_seq.saturating_add(1).to_string());
        };
        let mut begin = self.scripts.scan_begin.prepare_invoke();
        cursor_args(&mut begin);
        let reply = self.invoke(begin).await?;
        match reply.first().and_then(int) {
            Some(1) => return Ok(ScanPage::empty(request.after_seq)),
            Some(0) => {}
            _ => return Err(self.script_error(&reply)),
        }
        let seqbucket_max_seq = num(reply.get(1));
        let days: Vec<u64> = reply[2..]
            .iter()
            .filter_map(int)
            .map(|d| d as u64)
            .collect();
        let (mut groups, covered) = self.read_days(&keys, &days, &request).await?;

        let hook = lock(&self.after_scan_read).clone();
        if let Some(hook) = hook {
            hook().await;
        }
        let mut end = self.scripts.scan_end.prepare_invoke();
        cursor_args(&mut end);
        let reply = self.invoke(end).await?;
        if reply.first().and_then(int) != Some(0) {
            return Err(self.script_error(&reply));
        }

        let limit = request.limit_groups as usize;
        let more_than_limit = groups.len() > limit;
        let page: Vec<ScannedGroup> = {
            let mut page = Vec::with_capacity(groups.len().min(limit));
            while page.len() < limit {
                match groups.pop_first() {
                    Some((_, g)) => page.push(g),
                    None => break,
                }
            }
            page
        };
        let last = page.last().map(|g| g.mailbox_seq);
        let (up_to, has_more) = if more_than_limit {
            (last.unwrap_or(request.after_seq), true)
        } else if let Some(covered) = covered {
            (covered.max(request.after_seq), true)
        } else {
            let bound = request
                .until_seq
                .map_or(seqbucket_max_seq, |u| u.min(seqbucket_max_seq));
            (bound.max(request.after_seq).max(last.unwrap_or(0)), false)
        };
        Ok(ScanPage {
            groups: page,
            up_to,
            has_more,
        })
    }

    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        let keys = self.keys(mailbox);
        let mut invocation = self.scripts.promote.prepare_invoke();
        keys.bind(&mut invocation);
        invocation.arg(mailbox.epoch);
        let reply = self.invoke(invocation).await?;
        match reply.first().and_then(int) {
            Some(0) => Ok(PromoteOutcome {
                expired_days: num(reply.get(1)) as u32,
                expired_gap_boundary: num(reply.get(2)),
            }),
            _ => Err(self.script_error(&reply)),
        }
    }

    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError> {
        let keys = self.keys(mailbox);
        let mut invocation = self.scripts.inspect.prepare_invoke();
        keys.bind(&mut invocation);
        let reply = self.invoke(invocation).await?;
        let current_epoch = reply.first().map(text).and_then(|s| s.parse().ok());
        let identity_count = num(reply.get(1));
        let identity_index_present = num(reply.get(2)) == 1;
        let fields: BTreeMap<String, String> = reply[3.min(reply.len())..]
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (text(&c[0]), text(&c[1])))
            .collect();
        let field = |name: &str| fields.get(name).and_then(|v| v.parse::<u64>().ok());
        let mut active_days = BTreeMap::new();
        for (name, value) in &fields {
            let Some(day) = name.strip_prefix("bucket_max_seq:") else {
                continue;
            };
            let Ok(day) = day.parse::<u64>() else {
                continue;
            };
            active_days.insert(
                day,
                ActiveDay {
                    max_seq: value.parse().unwrap_or(0),
                    expires_at: field(&format!("bucket_expires_at:{day}")).unwrap_or(0),
                },
            );
        }
        // Proofs whose max_seq field was lost still show, with max_seq 0.
        for name in fields.keys() {
            if let Some(day) = name
                .strip_prefix("bucket_expires_at:")
                .and_then(|d| d.parse::<u64>().ok())
            {
                active_days.entry(day).or_insert(ActiveDay {
                    max_seq: 0,
                    expires_at: field(name).unwrap_or(0),
                });
            }
        }
        Ok(MailboxInspection {
            format_version: fields
                .get("retention_format_version")
                .and_then(|v| v.parse().ok()),
            current_epoch,
            min_day: field("min_day"),
            max_day: field("max_day"),
            active_day_count: field("active_day_count").unwrap_or(0) as u32,
            active_days,
            expired_gap_boundary: field("expired_gap_boundary").unwrap_or(0),
            seqbucket_max_seq: field("seqbucket_max_seq").unwrap_or(0),
            user_trim_seq: field("user_trim_seq").unwrap_or(0),
            identity_count,
            identity_index_present,
        })
    }

    async fn repair_fence(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        let user = &token.user;
        let keys = keys::UserKeys::new(&self.settings.key_prefix, user);
        let mut invocation = self.scripts.repair_begin.prepare_invoke();
        invocation
            .key(&keys.repair)
            .key(&keys.staging_epoch)
            .arg(&token.holder)
            .arg(Self::lease_ms(lease))
            .arg(&keys.staging_stem)
            .arg(keys::tag(user))
            .arg(self.policy.retention_days)
            .arg(self.policy.future_window_days);
        let reply = self.invoke(invocation).await?;
        match reply.first().and_then(int) {
            Some(0) => {
                let removed = num(reply.get(1));
                if removed > 0 {
                    tracing::info!(user = %user.as_str(), removed_keys = removed, "removed the staging copy of an earlier repair");
                }
                Ok(())
            }
            _ => Err(self.script_error(&reply)),
        }
    }

    async fn repair_renew(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        let keys = keys::UserKeys::new(&self.settings.key_prefix, &token.user);
        let mut invocation = self.scripts.repair_renew.prepare_invoke();
        invocation
            .key(&keys.repair)
            .arg(&token.holder)
            .arg(Self::lease_ms(lease));
        let reply = self.invoke(invocation).await?;
        match reply.first().and_then(int) {
            Some(0) => Ok(()),
            _ => Err(self.script_error(&reply)),
        }
    }

    async fn repair_append(
        &self,
        token: &RepairToken,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        token.check_user(&group.mailbox.user_id, BACKEND)?;
        self.append_to(KeySet::Staging, &token.holder, group).await
    }

    async fn repair_truncate(
        &self,
        token: &RepairToken,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        token.check_user(&mailbox.user_id, BACKEND)?;
        self.truncate_in(KeySet::Staging, &token.holder, mailbox, before_seq)
            .await
    }

    async fn repair_swap(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        let keys = keys::UserKeys::new(&self.settings.key_prefix, &token.user);
        let mut invocation = self.scripts.repair_swap.prepare_invoke();
        invocation
            .key(&keys.repair)
            .key(&keys.live_epoch)
            .key(&keys.staging_epoch)
            .arg(&token.holder)
            .arg(&keys.live_stem)
            .arg(&keys.staging_stem)
            .arg(keys::tag(&token.user))
            .arg(self.policy.retention_days)
            .arg(self.policy.future_window_days);
        let reply = self.invoke_durable(invocation).await?;
        match reply.first().and_then(int) {
            Some(0) => Ok(SwapReport {
                staged_groups: num(reply.get(1)),
                replaced: num(reply.get(2)),
            }),
            _ => Err(self.script_error(&reply)),
        }
    }

    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        let keys = keys::UserKeys::new(&self.settings.key_prefix, &token.user);
        let mut invocation = self.scripts.repair_abort.prepare_invoke();
        invocation
            .key(&keys.repair)
            .key(&keys.staging_epoch)
            .arg(&token.holder)
            .arg(&keys.staging_stem)
            .arg(keys::tag(&token.user))
            .arg(self.policy.retention_days)
            .arg(self.policy.future_window_days);
        self.invoke(invocation).await.map(|_| ())
    }

    async fn repair_collect_garbage(&self) -> Result<u64, StoreError> {
        self.collect_staging_garbage().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::node_url;

    #[test]
    fn node_urls_keep_scheme_and_credentials() {
        assert_eq!(
            node_url("rediss://u:pw@10.0.0.1:7000/0", "127.0.0.1:7001"),
            "rediss://u:pw@127.0.0.1:7001"
        );
        assert_eq!(
            node_url("redis://h:1", "127.0.0.1:7001"),
            "redis://127.0.0.1:7001"
        );
    }
}
