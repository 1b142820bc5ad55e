//! The in-memory store: the executable reference of SPEC section 4.
//!
//! Its state mirrors the Redis V4 layout one to one (epoch, meta with day proofs, identity index,
//! day set, day buckets), so a disagreement with another backend points at a rule, not at a
//! different data model. Physical expiry imitates key TTLs: a day bucket is gone once
//! `expires_at(day) <= now`, and the identity index is gone once its largest score has passed.
//! Everything else (gap boundary, proof compaction) happens only through promote, exactly as on
//! Redis.
//!
//! Concurrency: users are spread over [`SHARDS`] mutexes; an operation holds its user's shard lock
//! for its whole duration, which makes it atomic per mailbox. No lock is held across an `.await`.

mod mailbox;
mod snapshot;

pub use snapshot::{SnapshotError, SNAPSHOT_FORMAT};

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, RetentionPolicy,
    ScanPage, ScanRequest, StoreError, TruncateOutcome, UserId,
};
use crate::store::fault::Corruption;
use crate::store::{Clock, MailboxStore, PhaseHook, RepairToken, SwapReport};

use mailbox::UserState;

/// Number of lock shards. A power of two well above the core count keeps contention between
/// unrelated mailboxes negligible.
pub(crate) const SHARDS: usize = 64;

/// The memory backend. Cheap to share behind an `Arc`.
pub struct MemoryStore {
    policy: RetentionPolicy,
    clock: Arc<dyn Clock>,
    shards: Box<[Mutex<HashMap<UserId, UserState>>]>,
    after_scan_read: Mutex<Option<PhaseHook>>,
    /// Repairs in progress (SPEC 7.1): the in-process fence and staging copy of each fenced user.
    /// Lock order: a user's shard first, then this map, so a live write's fence check and a swap
    /// are atomic with respect to each other.
    repairs: Mutex<HashMap<UserId, Repair>>,
    /// `repairs.len()`, read without the lock by live writes: while no repair runs (the common
    /// case) a write skips the map entirely. Written under the user's shard lock, so a write
    /// holding that lock sees every fence taken before it.
    active_repairs: AtomicUsize,
    /// Day buckets compacted by promotes (live and staging mailboxes).
    promoted: crate::store::PromotedBuckets,
}

/// One user's repair: the fence (holder and lease, by the store's clock) and the staging copy.
#[derive(Debug)]
struct Repair {
    holder: String,
    /// The fence holds while `now < lease_until` (seconds of the store's clock).
    lease_until: u64,
    /// The user's state being rebuilt; `None` until the first staged write creates it.
    staging: Option<UserState>,
}

impl Repair {
    fn held_by(&self, token: &RepairToken, now: u64) -> bool {
        self.holder == token.holder && now < self.lease_until
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store with the given retention policy and time authority.
    pub fn new(policy: RetentionPolicy, clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        Self {
            policy,
            clock,
            shards,
            after_scan_read: Mutex::new(None),
            repairs: Mutex::new(HashMap::new()),
            active_repairs: AtomicUsize::new(0),
            promoted: Default::default(),
        }
    }

    pub fn policy(&self) -> RetentionPolicy {
        self.policy
    }

    /// Installs (or clears) the hook run between a scan's read and its post-read check.
    pub fn set_after_scan_read_hook(&self, hook: Option<PhaseHook>) {
        *lock(&self.after_scan_read) = hook;
    }

    /// Damages a mailbox as `corruption` says. Returns false when the mailbox has nothing to damage.
    pub fn inject(&self, mailbox: &MailboxId, corruption: &Corruption) -> bool {
        let mut shard = self.shard(&mailbox.user_id);
        let Some(user) = shard.get_mut(&mailbox.user_id) else {
            return false;
        };
        user.inject(mailbox.epoch, corruption, self.clock.now_secs())
    }

    /// Everything stored for `user` (live state, fence and staging copy), after physical expiry,
    /// as text: a fingerprint tests compare to prove that a refused operation modified nothing.
    pub fn debug_dump(&self, user: &UserId) -> String {
        let now = self.clock.now_secs();
        let mut shard = self.shard(user);
        let mut dump = match shard.get_mut(user) {
            Some(state) => state.dump(now),
            None => String::new(),
        };
        // A repair's fence and staging copy are part of what is stored for the user.
        if let Some(repair) = lock(&self.repairs).get_mut(user) {
            let staging = repair.staging.as_mut().map(|s| s.dump(now));
            dump.push_str(&format!(
                "\nrepair holder={} lease_until={} staging={staging:?}",
                repair.holder, repair.lease_until
            ));
        }
        dump
    }

    /// Refuses a live write to a fenced user. Called with the user's shard lock held.
    fn check_fence(&self, user: &UserId) -> Result<(), StoreError> {
        if self.active_repairs.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let now = self.clock.now_secs();
        match lock(&self.repairs).get(user) {
            Some(repair) if now < repair.lease_until => Err(StoreError::UnderRepair {
                holder: repair.holder.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Runs `write` on the staging copy of `token`'s repair, if the fence is still held.
    fn with_staging<T>(
        &self,
        token: &RepairToken,
        write: impl FnOnce(&mut UserState, u64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _shard = self.shard(&token.user);
        let now = self.clock.now_secs();
        let mut repairs = lock(&self.repairs);
        let repair = match repairs.get_mut(&token.user) {
            Some(repair) if repair.held_by(token, now) => repair,
            _ => return Err(fence_lost(token)),
        };
        let mut state = repair.staging.take().unwrap_or_default();
        let result = self.counted(&mut state, |state| write(state, now));
        if state.exists() {
            repair.staging = Some(state);
        }
        result
    }

    /// Runs `op` on `user`, then adds the days its promotes compacted to the store's count:
    /// every operation on a user's state goes through here.
    fn counted<T>(&self, user: &mut UserState, op: impl FnOnce(&mut UserState) -> T) -> T {
        let result = op(user);
        self.promoted.add(user.take_promoted());
        result
    }

    /// One append (validated, inside the future window) with its user's shard locked, at `now`.
    fn append_locked(
        &self,
        shard: &mut HashMap<UserId, UserState>,
        now: u64,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        self.check_fence(&group.mailbox.user_id)?;
        match shard.get_mut(&group.mailbox.user_id) {
            Some(user) => self.counted(user, |u| u.append(&self.policy, now, group)),
            None => {
                // A cold user: build the state aside and keep it only if something was written,
                // so a rejected input leaves no trace.
                let mut user = UserState::default();
                let result = self.counted(&mut user, |u| u.append(&self.policy, now, group));
                if user.exists() {
                    shard.insert(group.mailbox.user_id.clone(), user);
                }
                result
            }
        }
    }

    fn set_active_repairs(&self, repairs: &HashMap<UserId, Repair>) {
        self.active_repairs.store(repairs.len(), Ordering::Release);
    }

    fn shard(&self, user: &UserId) -> MutexGuard<'_, HashMap<UserId, UserState>> {
        let mut hasher = DefaultHasher::new();
        user.hash(&mut hasher);
        let index = (hasher.finish() as usize) % SHARDS;
        lock(&self.shards[index])
    }
}

fn fence_lost(token: &RepairToken) -> StoreError {
    StoreError::FenceLost {
        detail: format!(
            "the repair fence of {} is no longer held by {} (its lease lapsed or another repair took it)",
            token.user.as_str(),
            token.holder
        ),
    }
}

/// Whole seconds of a lease, at least one.
fn lease_secs(lease: Duration) -> u64 {
    lease.as_secs().max(1)
}

/// Locks a mutex, recovering from poisoning: every operation validates before it mutates, so a
/// panic elsewhere cannot have left a half-applied change behind.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl MailboxStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn seq_positions(
        &self,
        mailbox: &MailboxId,
    ) -> Result<Vec<crate::store::SeqPosition>, StoreError> {
        let now = self.clock.now_secs();
        let mut shard = self.shard(&mailbox.user_id);
        Ok(shard
            .get_mut(&mailbox.user_id)
            .map(|user| user.seq_positions(now, mailbox.epoch))
            .unwrap_or_default())
    }

    async fn fence_of(&self, user: &UserId) -> Result<Option<crate::store::FenceView>, StoreError> {
        let now = self.clock.now_secs();
        let repairs = self.repairs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(repairs
            .get(user)
            .filter(|r| now < r.lease_until)
            .map(|r| crate::store::FenceView {
                holder: r.holder.clone(),
                lease_left_ms: (r.lease_until - now) * 1000,
            }))
    }

    fn promoted_buckets_total(&self) -> u64 {
        self.promoted.total()
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        crate::model::validate::validate_group(group)?;
        let now = self.clock.now_secs();
        crate::model::rules::check_future_window(&self.policy, group.day(), now)?;
        let mut shard = self.shard(&group.mailbox.user_id);
        self.append_locked(&mut shard, now, group)
    }

    /// The whole run under its user's shard lock, at one instant: nothing else touches the
    /// mailbox between two of its groups.
    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        let Some(first) = run.first().filter(|_| crate::store::one_mailbox(run)) else {
            return crate::store::append_one_by_one(self, run).await;
        };
        let now = self.clock.now_secs();
        let mut shard = self.shard(&first.mailbox.user_id);
        crate::store::answer_run(run, |group| {
            crate::model::validate::validate_group(group)?;
            crate::model::rules::check_future_window(&self.policy, group.day(), now)?;
            self.append_locked(&mut shard, now, group)
        })
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        crate::model::validate::validate_before_seq(before_seq)?;
        let now = self.clock.now_secs();
        let mut shard = self.shard(&mailbox.user_id);
        self.check_fence(&mailbox.user_id)?;
        let user = shard.entry(mailbox.user_id.clone()).or_default();
        let result = self.counted(user, |u| u.truncate_before(now, mailbox.epoch, before_seq));
        if !user.exists() {
            shard.remove(&mailbox.user_id);
        }
        result
    }

    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        crate::model::validate::validate_scan(&request)?;
        let page = {
            let mut shard = self.shard(&mailbox.user_id);
            let Some(user) = shard.get_mut(&mailbox.user_id) else {
                return Ok(ScanPage::empty(request.after_seq));
            };
            user.scan_read(self.clock.now_secs(), mailbox.epoch, &request)?
        };
        let Some(page) = page else {
            // Reverse range or empty mailbox: nothing was read, nothing to re-check.
            return Ok(ScanPage::empty(request.after_seq));
        };
        let hook = lock(&self.after_scan_read).clone();
        if let Some(hook) = hook {
            hook().await;
        }
        let mut shard = self.shard(&mailbox.user_id);
        match shard.get_mut(&mailbox.user_id) {
            Some(user) => {
                user.scan_verify(self.clock.now_secs(), mailbox.epoch, &request)?;
                Ok(page)
            }
            // The user vanished between the read and the check: an epoch move by another
            // operation would have left a user behind, so this is a deleted mailbox.
            None => Err(StoreError::EpochMismatch { current: None }),
        }
    }

    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        let now = self.clock.now_secs();
        let mut shard = self.shard(&mailbox.user_id);
        match shard.get_mut(&mailbox.user_id) {
            Some(user) => self.counted(user, |u| u.promote(now, mailbox.epoch)),
            None => Ok(PromoteOutcome::default()),
        }
    }

    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError> {
        let now = self.clock.now_secs();
        let mut shard = self.shard(&mailbox.user_id);
        Ok(match shard.get_mut(&mailbox.user_id) {
            Some(user) => user.inspect(now, mailbox.epoch),
            None => UserState::default().inspect(now, mailbox.epoch),
        })
    }

    async fn repair_fence(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        let user = &token.user;
        let _shard = self.shard(user);
        let now = self.clock.now_secs();
        let mut repairs = lock(&self.repairs);
        if let Some(repair) = repairs.get(user) {
            if now < repair.lease_until {
                return Err(StoreError::UnderRepair {
                    holder: repair.holder.clone(),
                });
            }
        }
        // A lapsed repair's staging copy is dropped here: the rebuild starts from nothing.
        repairs.insert(
            user.clone(),
            Repair {
                holder: token.holder.clone(),
                lease_until: now + lease_secs(lease),
                staging: None,
            },
        );
        self.set_active_repairs(&repairs);
        Ok(())
    }

    async fn repair_renew(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        let _shard = self.shard(&token.user);
        let now = self.clock.now_secs();
        let mut repairs = lock(&self.repairs);
        match repairs.get_mut(&token.user) {
            Some(repair) if repair.held_by(token, now) => {
                repair.lease_until = now + lease_secs(lease);
                Ok(())
            }
            _ => Err(fence_lost(token)),
        }
    }

    /// Group by group, each under the staging lock as one append alone.
    async fn repair_append_run(
        &self,
        token: &RepairToken,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        let policy = self.policy;
        let one = |group: &EventGroup| -> Result<AppendOutcome, StoreError> {
            crate::model::validate::validate_group(group)?;
            token.check_user(&group.mailbox.user_id, self.backend())?;
            self.with_staging(token, |state, now| {
                crate::model::rules::check_future_window(&policy, group.day(), now)?;
                state.append(&policy, now, group)
            })
        };
        crate::store::answer_run(run, one)
    }

    async fn repair_truncate(
        &self,
        token: &RepairToken,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        crate::model::validate::validate_before_seq(before_seq)?;
        token.check_user(&mailbox.user_id, self.backend())?;
        self.with_staging(token, |state, now| {
            state.truncate_before(now, mailbox.epoch, before_seq)
        })
    }

    async fn repair_swap(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        let mut shard = self.shard(&token.user);
        let now = self.clock.now_secs();
        let mut repairs = lock(&self.repairs);
        match repairs.get(&token.user) {
            Some(repair) if repair.held_by(token, now) => {}
            _ => return Err(fence_lost(token)),
        }
        let Some(repair) = repairs.remove(&token.user) else {
            return Err(fence_lost(token));
        };
        self.set_active_repairs(&repairs);
        let replaced = u64::from(shard.remove(&token.user).is_some());
        let mut staged_groups = 0;
        if let Some(mut staging) = repair.staging {
            staged_groups = staging.group_count(now);
            shard.insert(token.user.clone(), staging);
        }
        Ok(SwapReport {
            staged_groups,
            replaced,
        })
    }

    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        let _shard = self.shard(&token.user);
        let mut repairs = lock(&self.repairs);
        if repairs
            .get(&token.user)
            .is_some_and(|r| r.holder == token.holder)
        {
            repairs.remove(&token.user);
            self.set_active_repairs(&repairs);
        }
        Ok(())
    }

    async fn repair_collect_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        let now = self.clock.now_secs();
        let mut repairs = lock(&self.repairs);
        if dry_run {
            let lapsed = repairs.values().filter(|r| now >= r.lease_until).count();
            return Ok(lapsed as u64);
        }
        let before = repairs.len();
        repairs.retain(|_, repair| now < repair.lease_until);
        self.set_active_repairs(&repairs);
        Ok((before - repairs.len()) as u64)
    }
}
