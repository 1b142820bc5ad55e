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
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, RetentionPolicy,
    ScanPage, ScanRequest, StoreError, TruncateOutcome, UserId,
};
use crate::store::fault::Corruption;
use crate::store::{Clock, MailboxStore, PhaseHook};

use mailbox::UserState;

/// Number of lock shards. A power of two well above the core count keeps contention between
/// unrelated mailboxes negligible.
pub const SHARDS: usize = 64;

/// The memory backend. Cheap to share behind an `Arc`.
pub struct MemoryStore {
    policy: RetentionPolicy,
    clock: Arc<dyn Clock>,
    shards: Box<[Mutex<HashMap<UserId, UserState>>]>,
    after_scan_read: Mutex<Option<PhaseHook>>,
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

    /// Everything stored for `user`, after physical expiry, as text: a fingerprint tests compare
    /// to prove that a refused operation modified nothing.
    pub fn debug_dump(&self, user: &UserId) -> String {
        let now = self.clock.now_secs();
        let mut shard = self.shard(user);
        match shard.get_mut(user) {
            Some(state) => state.dump(now),
            None => String::new(),
        }
    }

    fn shard(&self, user: &UserId) -> MutexGuard<'_, HashMap<UserId, UserState>> {
        let mut hasher = DefaultHasher::new();
        user.hash(&mut hasher);
        let index = (hasher.finish() as usize) % SHARDS;
        lock(&self.shards[index])
    }
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

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        crate::model::validate::validate_group(group)?;
        let now = self.clock.now_secs();
        if self.policy.is_beyond_future_window(group.day(), now) {
            return Err(mailbox::future_rejection(&self.policy, group.day(), now));
        }
        let mut shard = self.shard(&group.mailbox.user_id);
        match shard.get_mut(&group.mailbox.user_id) {
            Some(user) => user.append(&self.policy, now, group),
            None => {
                // A cold user: build the state aside and keep it only if something was written,
                // so a rejected input leaves no trace.
                let mut user = UserState::default();
                let result = user.append(&self.policy, now, group);
                if user.exists() {
                    shard.insert(group.mailbox.user_id.clone(), user);
                }
                result
            }
        }
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        crate::model::validate::validate_before_seq(before_seq)?;
        let now = self.clock.now_secs();
        let mut shard = self.shard(&mailbox.user_id);
        let user = shard.entry(mailbox.user_id.clone()).or_default();
        let result = user.truncate_before(now, mailbox.epoch, before_seq);
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
            Some(user) => user.promote(now, mailbox.epoch),
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
}
