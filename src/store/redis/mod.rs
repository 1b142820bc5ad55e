//! The Redis backend: the V4 layout of SPEC 5, every rule of SPEC 4 inside atomic Lua scripts.
//!
//! One script per operation, sharing `lua/includes/`: the SPEC 4 operations (`lua/append.lua`,
//! `append_run.lua` (a run of one mailbox's groups: `append.lua`'s body once per group),
//! `truncate.lua`, `promote.lua`, `scan_begin.lua`, `scan_end.lua`, `inspect.lua`), the repair's
//! (`repair_begin.lua`, `repair_renew.lua`, `repair_swap.lua`, `repair_abort.lua`,
//! `repair_collect.lua`) and `user_keys.lua` (every key name of a user, for dumps). Batches of
//! runs are pipelines, a script call per run, split by master on a cluster (`batch`). "Now" is
//! only ever the server's `TIME`, so expiry decisions agree with Redis's own TTLs. A scan is a pre-read script, a
//! pipeline of `ZRANGE BYSCORE` reads over every active day, and a post-read script that refuses
//! the page if expiry crossed the cursor meanwhile.
//!
//! Standalone servers are reached through a `ConnectionManager` (reconnects by itself), Redis
//! Cluster through the cluster client; both are multiplexed, so concurrent calls on different
//! mailboxes share connections without waiting for each other.
//!
//! Files by job: `connection` (settings, connecting, the masters a SCAN walks), `invoke` (script
//! calls, `WAIT`, and the one mapping of replies and client errors to [`StoreError`]), `append`
//! (the write scripts on the live or a staging copy), `batch` (pipelines of appends), `scan`
//! (a page's bucket reads), `dump`, `patrol`, `repair` (leases, staging clean-up), `keys` (the
//! key layout of SPEC 5) and `scripts` (the Lua sources and their error codes). This file holds
//! the store itself and the [`MailboxStore`] trait.

mod append;
mod applied;
mod batch;
mod cluster_watch;
mod connection;
mod dump;
pub mod eviction;
pub mod grants;
mod invoke;
pub mod keys;
mod node_url;
pub mod open_slots;
mod patrol;
mod repair;
pub mod replication;
mod scan;
mod slot_router;
pub(crate) mod store_marker;
pub use slot_router::REDIRECT_KINDS;
pub mod scripts;

pub use connection::{Connection, RedisSettings};
pub use patrol::PatrolReport;

use connection::scan_batch;
use invoke::{classified, int, num, protocol, text};

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::model::error::{ConflictKind, CorruptKind, CursorExpired};
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

/// The Redis backend.
pub struct RedisStore {
    /// The connection every request uses; on a cluster, swapped by `cluster_watch` when it
    /// stops answering.
    connection: cluster_watch::Shared,
    /// On a cluster, the routing of batched appends (their redirections answered one request
    /// at a time).
    router: Option<std::sync::Arc<slot_router::SlotRouter>>,
    settings: RedisSettings,
    policy: RetentionPolicy,
    scripts: Scripts,
    after_scan_read: Mutex<Option<PhaseHook>>,
    /// Day buckets the append script compacted (its reply says how many).
    promoted: crate::store::PromotedBuckets,
    /// The slots known to hold data, whose marker every script checks (`store_marker`).
    expected: store_marker::Expected,
    /// Slots a write just succeeded in whose marker is not known yet: written by
    /// [`RedisStore::write_markers`] after the call. Bound: at most every slot.
    pending_markers: Mutex<std::collections::BTreeSet<u16>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("settings", &self.settings)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

use crate::locks::lock;

impl RedisStore {
    pub fn policy(&self) -> RetentionPolicy {
        self.policy
    }

    pub fn key_prefix(&self) -> &str {
        &self.settings.key_prefix
    }

    /// A handle on the shared connection (a clone is a new handle, not a new socket).
    pub fn conn(&self) -> Connection {
        cluster_watch::current(&self.connection)
    }

    fn keys(&self, mailbox: &MailboxId) -> MailboxKeys {
        self.keys_of(mailbox, KeySet::Live)
    }

    /// The keys of `mailbox`'s `copy`, with the slot's store marker when the slot is known to
    /// hold data (`store_marker`).
    pub(super) fn keys_of(&self, mailbox: &MailboxId, copy: KeySet) -> MailboxKeys {
        let mut keys = MailboxKeys::of(&self.settings.key_prefix, mailbox, copy);
        let slot = batch::slot_of_key(&keys::tag(&mailbox.user_id));
        if self.settings.markers && self.expected.contains(slot) {
            keys.marker = store_marker::marker_key(&self.settings.key_prefix, slot);
        }
        keys
    }

    /// A call on `user`'s mailbox succeeded: its slot holds data, and its marker is written
    /// after the call if this process does not know it yet.
    pub(super) fn note_data(&self, user: &UserId) {
        self.note_slot(batch::slot_of_key(&keys::tag(user)));
    }

    /// [`Self::note_data`] of a slot.
    pub(super) fn note_slot(&self, slot: u16) {
        if self.settings.markers && !self.expected.contains(slot) {
            lock(&self.pending_markers).insert(slot);
        }
    }

    /// Writes the markers [`Self::note_data`] asked for (`SET`, one per slot, once per process
    /// and slot). A marker that could not be written is asked for again by the next success.
    pub(super) async fn write_markers(&self) {
        let slots = std::mem::take(&mut *lock(&self.pending_markers));
        let wanted = self.settings.wait_replicas;
        let timeout_ms = self.wait_timeout_ms();
        for slot in slots {
            let key = store_marker::marker_key(&self.settings.key_prefix, slot);
            // Under `wait_replicas` the marker is expected only once replicas hold it, as the
            // data is: a replica promoted after a failover must not miss a marker this process
            // expects (it would hold the slot's writes as if it were wiped).
            let mut pipe = redis::pipe();
            pipe.cmd("SET").arg(&key).arg(1);
            if wanted > 0 {
                pipe.cmd("WAIT").arg(wanted).arg(timeout_ms);
            }
            let written: Result<Vec<Value>, RedisError> = pipe.query_async(&mut self.conn()).await;
            let acknowledged = match &written {
                Ok(replies) if wanted > 0 => {
                    matches!(replies.get(1), Some(Value::Int(acks)) if *acks >= i64::from(wanted))
                }
                Ok(_) => true,
                Err(_) => false,
            };
            if acknowledged {
                self.expected.insert(slot);
            } else {
                tracing::debug!(key, "a store marker was not written (or not acknowledged by the replicas); the next write in its slot tries again");
            }
        }
    }

    /// Sends `commands` (each about keys of one slot) and answers their replies in order: one
    /// pipeline on a single server; on a cluster each command alone, 256 in flight at once (a
    /// cluster pipeline may not cross slots). For the markers and the applied records, which
    /// spread over the slots on purpose.
    pub(super) async fn each<T: redis::FromRedisValue + Send>(
        &self,
        commands: Vec<Cmd>,
    ) -> Result<Vec<T>, StoreError> {
        if !self.settings.cluster {
            let mut pipe = redis::pipe();
            for command in commands {
                pipe.add_command(command);
            }
            return pipe.query_async(&mut self.conn()).await.map_err(classified);
        }
        use futures::StreamExt;
        let replies: Vec<Result<T, RedisError>> = futures::stream::iter(commands)
            .map(|command| {
                let mut connection = self.conn();
                async move { command.query_async::<T>(&mut connection).await }
            })
            .buffered(256)
            .collect()
            .await;
        replies
            .into_iter()
            .collect::<Result<Vec<T>, RedisError>>()
            .map_err(classified)
    }

    /// Whether the marker of each of `slots` exists (one `EXISTS` each, through [`Self::each`]).
    pub(super) async fn markers_present(&self, slots: &[u16]) -> Result<Vec<bool>, StoreError> {
        let prefix = &self.settings.key_prefix;
        let commands = slots
            .iter()
            .map(|slot| {
                let mut command = redis::cmd("EXISTS");
                command.arg(store_marker::marker_key(prefix, *slot));
                command
            })
            .collect();
        let present: Vec<u8> = self.each(commands).await?;
        Ok(present.into_iter().map(|p| p > 0).collect())
    }

    /// Reads which slots' markers are present (`store_marker`): one `EXISTS` per slot,
    /// pipelined (16,384 whatever the store's size). The slots found are known to hold data
    /// from now on. Answers how many, and whether the store holds any key of the prefix (an
    /// empty store: new, or wiped while no process watched).
    pub async fn load_markers(&self) -> Result<(u32, bool), StoreError> {
        if !self.settings.markers {
            // Under allow_eviction: treated as a store with data and no markers.
            return Ok((0, true));
        }
        let prefix = &self.settings.key_prefix;
        let slots: Vec<u16> = (0..store_marker::SLOTS as u16).collect();
        for chunk in slots.chunks(1024) {
            let present = self.markers_present(chunk).await?;
            for (slot, present) in chunk.iter().zip(present) {
                if present {
                    self.expected.insert(*slot);
                }
            }
        }
        let found = self.expected.count();
        if found > 0 {
            return Ok((found, true));
        }
        let any = format!("{prefix}:*");
        for mut node in self.scan_targets().await? {
            let mut cursor = 0;
            loop {
                let (next, batch) = scan_batch(&mut node, cursor, &any).await?;
                if !batch.is_empty() {
                    return Ok((0, true));
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok((0, false))
    }

    /// Expects every slot's marker: a store found wiped at start (see `store_marker`), so every
    /// write waits until an operator acts.
    pub fn expect_every_marker(&self) {
        self.expected.insert_all();
    }

    /// `materializer accept-store-loss`: writes the marker of every slot, so the scripts that
    /// found one missing (a wiped store or master) answer again, from what the store holds now.
    /// Answers how many were missing.
    pub async fn write_every_marker(&self) -> Result<u32, StoreError> {
        let prefix = &self.settings.key_prefix;
        let mut written = 0;
        for chunk in (0..store_marker::SLOTS as u16)
            .collect::<Vec<_>>()
            .chunks(512)
        {
            let commands = chunk
                .iter()
                .map(|slot| {
                    let mut command = redis::cmd("SET");
                    command
                        .arg(store_marker::marker_key(prefix, *slot))
                        .arg(1)
                        .arg("NX");
                    command
                })
                .collect();
            let answers: Vec<Option<String>> = self.each(commands).await?;
            written += answers.iter().filter(|a| a.is_some()).count() as u32;
            for slot in chunk {
                self.expected.insert(*slot);
            }
        }
        Ok(written)
    }

    /// Installs (or clears) the hook run between a scan's bucket reads and its post-read check.
    pub fn set_after_scan_read_hook(&self, hook: Option<PhaseHook>) {
        *lock(&self.after_scan_read) = hook;
    }
}

#[async_trait]
impl MailboxStore for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn promoted_buckets_total(&self) -> u64 {
        self.promoted.total()
    }

    async fn load_data_markers(&self) -> Result<Option<(u32, bool)>, StoreError> {
        self.load_markers().await.map(Some)
    }

    fn expect_data_everywhere(&self) {
        self.expect_every_marker();
    }

    async fn accept_data_loss(&self) -> Result<Option<u32>, StoreError> {
        self.write_every_marker().await.map(Some)
    }

    fn keeps_applied(&self) -> bool {
        self.settings.applied
    }

    async fn record_applied(
        &self,
        topic: &str,
        positions: &[(i32, i64, Option<i64>)],
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.write_applied(topic, positions).await
    }

    async fn applied(
        &self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.read_applied(topic, partitions).await
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        let answer = self.append_to(KeySet::Live, "", group).await;
        self.write_markers().await;
        answer
    }

    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        if !crate::store::one_mailbox(run) {
            // One script call holds one mailbox's keys.
            return crate::store::append_one_by_one(self, run).await;
        }
        let mut answers = self.append_runs_pipelined(KeySet::Live, "", &[run]).await;
        self.write_markers().await;
        answers.pop().unwrap_or_default()
    }

    async fn append_runs(
        &self,
        runs: &[&[&EventGroup]],
    ) -> Vec<Vec<Result<AppendOutcome, StoreError>>> {
        if runs.iter().all(|run| crate::store::one_mailbox(run)) {
            let answers = self.append_runs_pipelined(KeySet::Live, "", runs).await;
            self.write_markers().await;
            return answers;
        }
        futures::future::join_all(runs.iter().map(|run| self.append_run(run))).await
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        let answer = self
            .truncate_in(KeySet::Live, "", mailbox, before_seq)
            .await;
        self.write_markers().await;
        answer
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
        let (mut groups, covered, empty_days) = self.read_days(&keys, &days, &request).await?;

        let hook = lock(&self.after_scan_read).clone();
        if let Some(hook) = hook {
            hook().await;
        }
        let mut end = self.scripts.scan_end.prepare_invoke();
        cursor_args(&mut end);
        // The days whose read found nothing: a lost bucket reads as empty, and fails the page.
        for day in &empty_days {
            end.arg(*day);
        }
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
            Some(0) => {
                self.promoted.add(num(reply.get(1)));
                Ok(PromoteOutcome {
                    expired_days: num(reply.get(1)) as u32,
                    expired_gap_boundary: num(reply.get(2)),
                })
            }
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

    /// One script call for the run, on the staging copy (`append_run.lua` with the holder).
    async fn repair_append_run(
        &self,
        token: &RepairToken,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        let others = run
            .iter()
            .any(|g| token.check_user(&g.mailbox.user_id, BACKEND).is_err());
        if others || !crate::store::one_mailbox(run) {
            return crate::store::each_in_order(run, |group| self.repair_append(token, group))
                .await;
        }
        let mut answers = self
            .append_runs_pipelined(KeySet::Staging, &token.holder, &[run])
            .await;
        answers.pop().unwrap_or_default()
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

    async fn repair_collect_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        self.collect_staging_garbage(dry_run).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        Ok(())
    }

    /// `GET` and `PTTL` of `P:repair:{user}` in one pipeline (one slot on a cluster).
    async fn seq_positions(
        &self,
        mailbox: &MailboxId,
    ) -> Result<Vec<crate::store::SeqPosition>, StoreError> {
        let keys = self.keys(mailbox);
        let mut invocation = self.scripts.inspect.prepare_invoke();
        keys.bind(&mut invocation);
        invocation.arg("positions");
        let reply = self.invoke(invocation).await?;
        Ok(reply[1.min(reply.len())..]
            .chunks(2)
            .filter(|c| c.len() == 2)
            .filter_map(|c| {
                Some(crate::store::SeqPosition {
                    seq: text(&c[0]).parse().ok()?,
                    position: crate::model::SourcePosition::decode(&text(&c[1])),
                })
            })
            .collect())
    }

    async fn fence_of(&self, user: &UserId) -> Result<Option<crate::store::FenceView>, StoreError> {
        let key = keys::repair_key(&self.settings.key_prefix, user);
        let (holder, ttl): (Option<String>, i64) = redis::pipe()
            .cmd("GET")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        Ok(holder.map(|holder| crate::store::FenceView {
            holder,
            lease_left_ms: u64::try_from(ttl).unwrap_or(0),
        }))
    }
}
