//! How the memory store holds one mailbox: the same keys as Redis's layout (meta, identity
//! index, day set, day buckets), and the bookkeeping of each write on them. The rules that decide
//! what to write are the parent module's.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::rules::{self, FORMAT_VERSION};
use crate::model::{Event, ScanPage, ScanRequest, ScannedGroup, SourcePosition, StoreError};

/// The keys of one `(user, epoch)`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(super) struct Mailbox {
    /// `P:mbmeta`.
    pub(super) meta: Option<Meta>,
    /// `P:mbseqbucket`; `None` when the key does not exist.
    pub(super) identity: Option<IdentityIndex>,
    /// `P:mbdays`: day -> `expires_at(day)`. Empty means the key does not exist.
    pub(super) day_set: BTreeMap<u64, u64>,
    /// The `P:mbday:<day>` keys that exist: day -> expiry and group count.
    pub(super) buckets: BTreeMap<u64, DayBucket>,
    /// The members of every day bucket, by seq. Held in one map rather than one map per day so
    /// that a scan walks contiguous memory in seq order; each group records its day, and a group
    /// is readable only while its day is in the day set (exactly what reading the day buckets of
    /// the day set gives on Redis).
    pub(super) groups: BTreeMap<u64, StoredGroup>,
    /// Nothing of this mailbox (bucket, day-set entry, identity) expires before this second;
    /// 0 means unknown. Lets the per-operation expiry and promote checks cost O(1) on the common
    /// path where nothing has expired. Only ever lowered by writes, recomputed after expiry work.
    #[serde(skip)]
    pub(super) next_expiry: u64,
    /// Days compacted by the promotes of writes and explicit promotes (not a scan's, see
    /// `store::PromotedBuckets`) since the store last took the count
    /// ([`UserState::take_promoted`]).
    #[serde(skip)]
    pub(super) promoted: u64,
}

impl Mailbox {
    /// SPEC 7.3: the meta and the other keys of a mailbox are written together; an identity
    /// index, a day set or a bucket without the meta is what is left of a lost meta.
    pub(super) fn check_meta_not_lost(&self) -> Result<(), crate::model::StoreError> {
        let leftovers =
            self.identity.is_some() || !self.day_set.is_empty() || !self.buckets.is_empty();
        if self.meta.is_none() && leftovers {
            return Err(crate::model::StoreError::corrupt(
                crate::model::CorruptKind::MetaLost,
            ));
        }
        Ok(())
    }
}

/// The V4 meta hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Meta {
    pub(super) format_version: u32,
    pub(super) active_day_count: u32,
    pub(super) min_day: Option<u64>,
    pub(super) max_day: Option<u64>,
    pub(super) expired_gap_boundary: u64,
    pub(super) seqbucket_max_seq: u64,
    pub(super) user_trim_seq: u64,
    /// `bucket_max_seq:<day>` and `bucket_expires_at:<day>`; at most `max_active_span_days + 1`
    /// entries (the span check bounds the day set, promote removes expired days). Fields are
    /// optional so a damaged proof can be represented and detected.
    pub(super) proofs: BTreeMap<u64, Proof>,
    // An older release kept one position per mailbox here (`source`); a snapshot holding it
    // still loads (the field is ignored): positions are kept per seq (`StoredGroup::source`).
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(super) struct Proof {
    pub(super) max_seq: Option<u64>,
    pub(super) expires_at: Option<u64>,
}

impl From<Proof> for rules::Proof {
    #[inline]
    fn from(p: Proof) -> Self {
        rules::Proof {
            max_seq: p.max_seq,
            expires_at: p.expires_at,
        }
    }
}

impl Meta {
    pub(super) fn new() -> Self {
        Self {
            format_version: FORMAT_VERSION,
            active_day_count: 0,
            min_day: None,
            max_day: None,
            expired_gap_boundary: 0,
            seqbucket_max_seq: 0,
            user_trim_seq: 0,
            proofs: BTreeMap::new(),
        }
    }

    /// Recomputes `min_day/max_day/active_day_count` from the day set.
    pub(super) fn recompute_range(&mut self, day_set: &BTreeMap<u64, u64>) {
        self.min_day = day_set.keys().next().copied();
        self.max_day = day_set.keys().next_back().copied();
        self.active_day_count = day_set.len() as u32;
    }
}

/// The identity index: seq -> `expires_at(day)`.
///
/// Holds only identities of groups that can still physically exist: expired members are dropped
/// by every append and promote, and the whole index is gone once its largest score has passed
/// (the Redis key's EXPIREAT). Expiry work runs only once [`Mailbox::next_expiry`] has passed, so
/// the linear walks below stay off the per-append path.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct IdentityIndex {
    pub(super) by_seq: BTreeMap<u64, u64>,
}

impl IdentityIndex {
    pub(super) fn insert(&mut self, seq: u64, expires_at: u64) {
        self.by_seq.insert(seq, expires_at);
    }

    pub(super) fn remove(&mut self, seq: u64) -> bool {
        self.by_seq.remove(&seq).is_some()
    }

    pub(super) fn max_score(&self) -> Option<u64> {
        self.by_seq.values().copied().max()
    }

    pub(super) fn min_score(&self) -> Option<u64> {
        self.by_seq.values().copied().min()
    }

    /// Drops members whose expiry has passed.
    pub(super) fn drop_expired(&mut self, now: u64) {
        self.by_seq.retain(|_, expires_at| *expires_at > now);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }
}

/// One `P:mbday:<day>` key: its EXPIREAT and how many groups it holds (deleted at zero).
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub(super) struct DayBucket {
    pub(super) expires_at: u64,
    pub(super) groups: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredGroup {
    pub(super) day: u64,
    pub(super) created_at: u64,
    pub(super) events: Arc<[Event]>,
    /// The log position this version was written from (SPEC 7.2, `rules::superseded`); `None`
    /// for a write without one (`apply`). Lives and dies with the version.
    #[serde(default)]
    pub(super) source: Option<SourcePosition>,
    /// The write that made this version (`model::written`): a retry of it whose answer was
    /// lost is answered as it was. `None` for a write without a token.
    #[serde(default)]
    pub(super) mark: Option<crate::model::WriteMark>,
}

/// Events sorted by ordinal: the order every backend stores and returns them in.
pub(super) fn canonical_events(events: &[Event]) -> Arc<[Event]> {
    if events.is_sorted_by_key(|e| e.event_ordinal) {
        return events.iter().cloned().collect();
    }
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.event_ordinal);
    sorted.into()
}

/// Hints the CPU to load the cache lines of an `Arc`'s header and first bytes of data.
#[inline]
#[allow(unsafe_code)] // each unsafe block below says why it is sound
pub(super) fn prefetch<T: ?Sized>(shared: &Arc<T>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let data = Arc::as_ptr(shared) as *const i8;
        // The counts sit just before the data, possibly on the previous cache line. A prefetch
        // never faults, whatever the address.
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch neither reads nor writes
        // memory as far as the program is concerned.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(data.wrapping_sub(16));
            _mm_prefetch::<_MM_HINT_T0>(data);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = shared;
}

impl Mailbox {
    /// Writes (or replaces) the whole group at `seq` in the bucket of its day.
    pub(super) fn put_group(&mut self, seq: u64, expires_at: u64, group: StoredGroup) {
        let day = group.day;
        let old = self.groups.insert(seq, group);
        match old {
            Some(old) if old.day == day => {}
            Some(old) => {
                self.release_bucket(old.day, 1);
                self.claim_bucket(day, expires_at);
            }
            None => self.claim_bucket(day, expires_at),
        }
    }

    pub(super) fn claim_bucket(&mut self, day: u64, expires_at: u64) {
        self.note_expiry(expires_at);
        let bucket = self.buckets.entry(day).or_insert(DayBucket {
            expires_at,
            groups: 0,
        });
        bucket.groups += 1;
    }

    pub(super) fn release_bucket(&mut self, day: u64, groups: u32) {
        if let Some(bucket) = self.buckets.get_mut(&day) {
            bucket.groups = bucket.groups.saturating_sub(groups);
            if bucket.groups == 0 {
                self.buckets.remove(&day);
            }
        }
    }

    /// Deletes every group with `seq < trim`; returns how many.
    pub(super) fn remove_groups_below(&mut self, trim: u64) -> u64 {
        let kept = self.groups.split_off(&trim);
        let removed = std::mem::replace(&mut self.groups, kept);
        let mut per_day: BTreeMap<u64, u32> = BTreeMap::new();
        for group in removed.values() {
            *per_day.entry(group.day).or_default() += 1;
        }
        for (day, count) in per_day {
            self.release_bucket(day, count);
        }
        removed.len() as u64
    }

    /// Imitates key TTLs: buckets past their expiry and an identity index past its largest score
    /// no longer exist.
    pub(super) fn expire_physically(&mut self, now: u64) {
        if now < self.next_expiry {
            return;
        }
        if self.buckets.values().any(|bucket| bucket.expires_at <= now) {
            self.buckets.retain(|_, bucket| bucket.expires_at > now);
            let buckets = &self.buckets;
            self.groups.retain(|_, g| buckets.contains_key(&g.day));
        }
        if self
            .identity
            .as_ref()
            .is_some_and(|index| index.max_score().is_none_or(|max| max <= now))
        {
            self.identity = None;
        }
        self.recompute_next_expiry();
    }

    /// Lowers [`Mailbox::next_expiry`] for something written to expire at `expires_at`.
    pub(super) fn note_expiry(&mut self, expires_at: u64) {
        if self.next_expiry != 0 {
            self.next_expiry = self.next_expiry.min(expires_at);
        }
    }

    pub(super) fn recompute_next_expiry(&mut self) {
        let buckets = self.buckets.values().map(|b| b.expires_at);
        let days = self.day_set.values().copied();
        let identities = self.identity.as_ref().and_then(IdentityIndex::min_score);
        self.next_expiry = buckets
            .chain(days)
            .chain(identities)
            .min()
            .unwrap_or(u64::MAX);
    }

    /// The checks every write starts with (SPEC 4.2 steps 4 to 6): physical expiry, format,
    /// promote, identity hygiene, integrity.
    pub(super) fn prepare_write(&mut self, now: u64) -> Result<(), StoreError> {
        self.expire_physically(now);
        self.check_format()?;
        if self.meta.is_some() {
            // Counted: a write's compaction stands even when the write is refused after it.
            self.promoted += u64::from(self.promote(now)?);
        }
        self.drop_expired_identities(now);
        self.check_integrity(now)
    }

    /// SPEC 4.2.4: meta of another format is never read or written.
    pub(super) fn check_format(&self) -> Result<(), StoreError> {
        rules::check_format(self.meta.as_ref().map(|m| i64::from(m.format_version)))
    }

    pub(super) fn drop_expired_identities(&mut self, now: u64) {
        if now < self.next_expiry {
            return;
        }
        if let Some(index) = self.identity.as_mut() {
            index.drop_expired(now);
            if index.is_empty() {
                self.identity = None;
            }
        }
    }

    /// SPEC 4.2.6.
    pub(super) fn check_integrity(&self, now: u64) -> Result<(), StoreError> {
        match (&self.meta, &self.identity) {
            // The common case, with nothing to prove: skip the walk over the proofs.
            (Some(_), Some(_)) | (None, None) => Ok(()),
            (meta, identity) => rules::check_integrity(
                meta.is_some(),
                meta.as_ref().is_some_and(|m| {
                    rules::proves_live_groups(
                        m.proofs.values().map(|&p| p.into()),
                        m.user_trim_seq,
                        now,
                    )
                }),
                identity.is_some(),
            ),
        }
    }

    /// SPEC 4.5 on a mailbox with meta: compacts expired days and drops expired identity
    /// members. Returns the number of days compacted.
    pub(super) fn promote(&mut self, now: u64) -> Result<u32, StoreError> {
        if now < self.next_expiry {
            // No day can have expired: phase 1 would find nothing to validate or merge.
            return Ok(0);
        }
        let Some(meta) = self.meta.as_ref() else {
            return Ok(0);
        };
        let plan = rules::plan_promote(
            self.day_set.iter().map(|(&day, &score)| (day, score)),
            |day| meta.proofs.get(&day).copied().unwrap_or_default().into(),
            meta.expired_gap_boundary,
            meta.user_trim_seq,
            now,
        )?;
        let Some(meta) = self.meta.as_mut() else {
            return Ok(0);
        };
        // Phase 2: apply everything at once.
        for day in &plan.expired_days {
            meta.proofs.remove(day);
            self.day_set.remove(day);
        }
        meta.expired_gap_boundary = plan.new_boundary;
        meta.recompute_range(&self.day_set);
        self.drop_expired_identities(now);
        self.recompute_next_expiry();
        Ok(plan.expired_days.len() as u32)
    }

    /// SPEC 4.4 steps 4 and 5.
    pub(super) fn check_cursor(&self, after_seq: u64) -> Result<(), StoreError> {
        match self.meta.as_ref() {
            Some(meta) => {
                rules::check_cursor(after_seq, meta.user_trim_seq, meta.expired_gap_boundary)
            }
            None => Ok(()),
        }
    }

    /// SPEC 4.4 step 6: every active day from the true `min_day` to `max_day` (the whole day set,
    /// never `max_day - retention_days`), seqs in `(after_seq, until_seq]`, whole groups, in seq
    /// order.
    pub(super) fn read_page(&self, request: &ScanRequest) -> ScanPage {
        let low = request.after_seq.saturating_add(1);
        let high = request.until_seq.unwrap_or(u64::MAX);
        let limit = request.limit_groups as usize;
        let mut groups = Vec::with_capacity(limit.min(256));
        let mut has_more = false;
        if low <= high {
            let mut selected = Vec::with_capacity(limit.min(256));
            for (&seq, group) in self.groups.range(low..=high) {
                if !self.day_set.contains_key(&group.day) {
                    continue;
                }
                if selected.len() == limit {
                    has_more = true;
                    break;
                }
                selected.push((seq, group));
            }
            // Sharing a group's events bumps a reference count that lives in its own allocation,
            // and a locked increment waits for its cache miss alone; touching every count first
            // lets those misses overlap.
            for (_, group) in &selected {
                prefetch(&group.events);
            }
            groups.extend(selected.into_iter().map(|(seq, group)| ScannedGroup {
                mailbox_seq: seq,
                created_at: group.created_at,
                events: Arc::clone(&group.events),
            }));
        }
        let up_to = rules::page_up_to(
            request.after_seq,
            request.until_seq,
            self.meta.as_ref().map_or(0, |m| m.seqbucket_max_seq),
            groups.last().map(|g| g.mailbox_seq),
            has_more,
        );
        ScanPage {
            groups,
            up_to,
            has_more,
        }
    }
}
