//! One user's state in the memory store and every rule of SPEC 4 applied to it.
//!
//! Read top to bottom, [`UserState::append`] answers "what happens to a replayed record?".

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::rules::{self, AppendFacts, AppendStep, EpochStep, FORMAT_VERSION};
use crate::model::SourcePosition;
use crate::model::{
    ActiveDay, AppendOutcome, Event, EventGroup, MailboxInspection, PromoteOutcome,
    RetentionPolicy, ScanPage, ScanRequest, ScannedGroup, StoreError, TruncateOutcome,
};
use crate::store::fault::Corruption;

/// Everything stored for one user: the epoch key and the current epoch's mailbox.
///
/// Older epochs are deleted when the user moves on, so only one mailbox is ever held.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct UserState {
    /// `P:epoch:T`: the largest epoch ever appended; `None` for a user never written.
    epoch: Option<u32>,
    mailbox: Mailbox,
}

/// The keys of one `(user, epoch)`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Mailbox {
    /// `P:mbmeta`.
    meta: Option<Meta>,
    /// `P:mbseqbucket`; `None` when the key does not exist.
    identity: Option<IdentityIndex>,
    /// `P:mbdays`: day -> `expires_at(day)`. Empty means the key does not exist.
    day_set: BTreeMap<u64, u64>,
    /// The `P:mbday:<day>` keys that exist: day -> expiry and group count.
    buckets: BTreeMap<u64, DayBucket>,
    /// The members of every day bucket, by seq. Held in one map rather than one map per day so
    /// that a scan walks contiguous memory in seq order; each group records its day, and a group
    /// is readable only while its day is in the day set (exactly what reading the day buckets of
    /// the day set gives on Redis).
    groups: BTreeMap<u64, StoredGroup>,
    /// Nothing of this mailbox (bucket, day-set entry, identity) expires before this second;
    /// 0 means unknown. Lets the per-operation expiry and promote checks cost O(1) on the common
    /// path where nothing has expired. Only ever lowered by writes, recomputed after expiry work.
    #[serde(skip)]
    next_expiry: u64,
    /// Days compacted by the promotes of writes and explicit promotes (not a scan's, see
    /// `store::PromotedBuckets`) since the store last took the count
    /// ([`UserState::take_promoted`]).
    #[serde(skip)]
    promoted: u64,
}

/// The V4 meta hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    format_version: u32,
    active_day_count: u32,
    min_day: Option<u64>,
    max_day: Option<u64>,
    expired_gap_boundary: u64,
    seqbucket_max_seq: u64,
    user_trim_seq: u64,
    /// `bucket_max_seq:<day>` and `bucket_expires_at:<day>`; at most `max_active_span_days + 1`
    /// entries (the span check bounds the day set, promote removes expired days). Fields are
    /// optional so a damaged proof can be represented and detected.
    proofs: BTreeMap<u64, Proof>,
    /// The log position of the last write that changed the mailbox (zombie fencing,
    /// `rules::superseded`).
    #[serde(default)]
    source: Option<SourcePosition>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Proof {
    max_seq: Option<u64>,
    expires_at: Option<u64>,
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
    fn new() -> Self {
        Self {
            format_version: FORMAT_VERSION,
            active_day_count: 0,
            min_day: None,
            max_day: None,
            expired_gap_boundary: 0,
            seqbucket_max_seq: 0,
            user_trim_seq: 0,
            proofs: BTreeMap::new(),
            source: None,
        }
    }

    /// Recomputes `min_day/max_day/active_day_count` from the day set.
    fn recompute_range(&mut self, day_set: &BTreeMap<u64, u64>) {
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
struct IdentityIndex {
    by_seq: BTreeMap<u64, u64>,
}

impl IdentityIndex {
    fn insert(&mut self, seq: u64, expires_at: u64) {
        self.by_seq.insert(seq, expires_at);
    }

    fn remove(&mut self, seq: u64) -> bool {
        self.by_seq.remove(&seq).is_some()
    }

    fn max_score(&self) -> Option<u64> {
        self.by_seq.values().copied().max()
    }

    fn min_score(&self) -> Option<u64> {
        self.by_seq.values().copied().min()
    }

    /// Drops members whose expiry has passed.
    fn drop_expired(&mut self, now: u64) {
        self.by_seq.retain(|_, expires_at| *expires_at > now);
    }

    fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }
}

/// One `P:mbday:<day>` key: its EXPIREAT and how many groups it holds (deleted at zero).
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
struct DayBucket {
    expires_at: u64,
    groups: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredGroup {
    day: u64,
    created_at: u64,
    events: Arc<[Event]>,
}

/// Events sorted by ordinal: the order every backend stores and returns them in.
fn canonical_events(events: &[Event]) -> Arc<[Event]> {
    if events.is_sorted_by_key(|e| e.event_ordinal) {
        return events.iter().cloned().collect();
    }
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.event_ordinal);
    sorted.into()
}

impl UserState {
    /// Whether any key of this user exists.
    pub(super) fn exists(&self) -> bool {
        self.epoch.is_some()
    }

    /// SPEC 4.2, steps 3 to 8 (validation and the future window ran before the lock was taken).
    pub(super) fn append(
        &mut self,
        policy: &RetentionPolicy,
        now: u64,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        let seq = group.mailbox_seq;
        let day = group.day();
        let incoming_expires_at = policy.expires_at(day);

        // 3. Epoch: older input is stale; newer input moves the user and deletes the old epoch.
        match rules::epoch_step(self.epoch.map(u64::from), u64::from(group.mailbox.epoch)) {
            EpochStep::Stale => return Ok(AppendOutcome::StaleEpoch),
            EpochStep::Current => {}
            EpochStep::Move => {
                // Checked before the move so a cold user's span rejection cannot happen after it:
                // a fresh mailbox holds no day, so a single day never exceeds the span.
                self.epoch = Some(group.mailbox.epoch);
                self.mailbox = Mailbox::default();
            }
        }
        let mailbox = &mut self.mailbox;
        // 4-6. Format, promote, identity hygiene, integrity.
        mailbox.prepare_write(now)?;

        // 7-8. Trim, identity lookup.
        let meta = mailbox.meta.as_ref();
        let step = rules::append_step(
            policy,
            &AppendFacts {
                seq,
                day,
                trim: meta.map_or(0, |m| m.user_trim_seq),
                identity_expires_at: mailbox
                    .identity
                    .as_ref()
                    .and_then(|index| index.by_seq.get(&seq).copied()),
                seqbucket_max_seq: meta.map_or(0, |m| m.seqbucket_max_seq),
                active_days: mailbox
                    .day_set
                    .first_key_value()
                    .zip(mailbox.day_set.last_key_value())
                    .map(|((&low, _), (&high, _))| (low, high)),
                now,
            },
        )?;
        match step {
            AppendStep::Trimmed => return Ok(AppendOutcome::Trimmed),
            AppendStep::SameDayReplay => {
                let events = canonical_events(&group.events);
                if let Some(stored) = mailbox.groups.get(&seq) {
                    if stored.day == day
                        && stored.created_at == group.created_at
                        && stored.events == events
                    {
                        return Ok(AppendOutcome::Unchanged);
                    }
                }
                let held = mailbox.meta.as_ref().and_then(|m| m.source);
                if rules::superseded(held, group.source) {
                    return Ok(AppendOutcome::Unchanged);
                }
                mailbox.put_group(seq, day, incoming_expires_at, group.created_at, events);
                if let Some(meta) = mailbox.meta.as_mut() {
                    meta.source = SourcePosition::after_write(meta.source, group.source);
                }
                return Ok(AppendOutcome::Replaced);
            }
            AppendStep::ExpiredMerge => {
                let meta = mailbox.meta.get_or_insert_with(Meta::new);
                meta.expired_gap_boundary = meta.expired_gap_boundary.max(seq);
                return Ok(AppendOutcome::ExpiredMerged);
            }
            AppendStep::Insert => {}
        }

        // Insert: events, identity, day member, proofs, range, seqbucket_max_seq.
        mailbox.put_group(
            seq,
            day,
            incoming_expires_at,
            group.created_at,
            canonical_events(&group.events),
        );
        mailbox
            .identity
            .get_or_insert_with(IdentityIndex::default)
            .insert(seq, incoming_expires_at);
        mailbox.day_set.insert(day, incoming_expires_at);
        mailbox.note_expiry(incoming_expires_at);
        let meta = mailbox.meta.get_or_insert_with(Meta::new);
        meta.source = SourcePosition::after_write(meta.source, group.source);
        let proof = meta.proofs.entry(day).or_default();
        proof.max_seq = Some(proof.max_seq.map_or(seq, |m| m.max(seq)));
        proof.expires_at = Some(incoming_expires_at);
        meta.recompute_range(&mailbox.day_set);
        meta.seqbucket_max_seq = meta.seqbucket_max_seq.max(seq);
        Ok(AppendOutcome::Inserted)
    }

    /// SPEC 4.3.
    pub(super) fn truncate_before(
        &mut self,
        now: u64,
        epoch: u32,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        if !rules::check_epoch(self.epoch.map(u64::from), u64::from(epoch))? {
            // A user never written: the truncate establishes the mailbox so the trim is durable
            // and a later replay of older seqs stays trimmed.
            self.epoch = Some(epoch);
            self.mailbox = Mailbox::default();
        }
        let mailbox = &mut self.mailbox;
        mailbox.prepare_write(now)?;

        let meta = mailbox.meta.get_or_insert_with(Meta::new);
        meta.user_trim_seq = meta.user_trim_seq.max(before_seq);
        let trim = meta.user_trim_seq;
        let removed_groups = mailbox.remove_groups_below(trim);
        if let Some(index) = mailbox.identity.as_mut() {
            let below: Vec<u64> = index.by_seq.range(..trim).map(|(&s, _)| s).collect();
            for seq in below {
                index.remove(seq);
            }
            if index.is_empty() {
                mailbox.identity = None;
            }
        }
        Ok(TruncateOutcome {
            user_trim_seq: trim,
            removed_groups,
        })
    }

    /// SPEC 4.4 steps 1 to 6. `Ok(None)` means nothing was read (reverse range, empty mailbox).
    pub(crate) fn scan_read(
        &mut self,
        now: u64,
        epoch: u32,
        request: &ScanRequest,
    ) -> Result<Option<ScanPage>, StoreError> {
        if !rules::check_epoch(self.epoch.map(u64::from), u64::from(epoch))? {
            return Ok(None);
        }
        if request
            .until_seq
            .is_some_and(|until| until <= request.after_seq)
        {
            return Ok(None);
        }
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        mailbox.check_format()?;
        if mailbox.meta.is_none() {
            return Ok(None);
        }
        mailbox.promote(now)?;
        mailbox.check_cursor(request.after_seq)?;
        Ok(Some(mailbox.read_page(request)))
    }

    /// SPEC 4.4 step 7: promote again after the read and refuse a page whose coverage expiry
    /// crossed meanwhile.
    pub(crate) fn scan_verify(
        &mut self,
        now: u64,
        epoch: u32,
        request: &ScanRequest,
    ) -> Result<(), StoreError> {
        if !rules::check_epoch(self.epoch.map(u64::from), u64::from(epoch))? {
            // The user vanished between the read and this check.
            return Err(StoreError::EpochMismatch { current: None });
        }
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        mailbox.check_format()?;
        if mailbox.meta.is_none() {
            return Err(rules::meta_vanished_during_scan());
        }
        mailbox.promote(now)?;
        mailbox.check_cursor(request.after_seq)
    }

    /// Days compacted by this user's promotes since the last call (the store adds them to its
    /// count after every operation).
    pub(crate) fn take_promoted(&mut self) -> u64 {
        std::mem::take(&mut self.mailbox.promoted)
    }

    /// SPEC 4.5 for the mailbox of `epoch`, if it is the current one.
    pub(super) fn promote(&mut self, now: u64, epoch: u32) -> Result<PromoteOutcome, StoreError> {
        if self.epoch != Some(epoch) {
            return Ok(PromoteOutcome::default());
        }
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        mailbox.check_format()?;
        if mailbox.meta.is_none() {
            return Ok(PromoteOutcome::default());
        }
        let expired_days = mailbox.promote(now)?;
        mailbox.promoted += u64::from(expired_days);
        mailbox.drop_expired_identities(now);
        Ok(PromoteOutcome {
            expired_days,
            expired_gap_boundary: mailbox.meta.as_ref().map_or(0, |m| m.expired_gap_boundary),
        })
    }

    pub(super) fn inspect(&mut self, now: u64, epoch: u32) -> MailboxInspection {
        let mailbox_present = self.epoch == Some(epoch);
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        let meta = mailbox.meta.as_ref().filter(|_| mailbox_present);
        let identity = mailbox.identity.as_ref().filter(|_| mailbox_present);
        MailboxInspection {
            format_version: meta.map(|m| m.format_version),
            current_epoch: self.epoch,
            min_day: meta.and_then(|m| m.min_day),
            max_day: meta.and_then(|m| m.max_day),
            active_day_count: meta.map_or(0, |m| m.active_day_count),
            active_days: meta
                .map(|m| {
                    m.proofs
                        .iter()
                        .map(|(&day, p)| {
                            (
                                day,
                                ActiveDay {
                                    max_seq: p.max_seq.unwrap_or(0),
                                    expires_at: p.expires_at.unwrap_or(0),
                                },
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            expired_gap_boundary: meta.map_or(0, |m| m.expired_gap_boundary),
            seqbucket_max_seq: meta.map_or(0, |m| m.seqbucket_max_seq),
            user_trim_seq: meta.map_or(0, |m| m.user_trim_seq),
            identity_count: identity.map_or(0, |i| i.by_seq.len() as u64),
            identity_index_present: identity.is_some(),
        }
    }

    /// Groups readable in the current epoch's mailbox after physical expiry (a repair's report).
    pub(crate) fn group_count(&mut self, now: u64) -> u64 {
        self.mailbox.expire_physically(now);
        self.mailbox.groups.len() as u64
    }

    /// The whole state, after physical expiry, as text.
    pub(super) fn dump(&mut self, now: u64) -> String {
        self.mailbox.expire_physically(now);
        format!("{self:?}")
    }

    pub(super) fn inject(&mut self, epoch: u32, corruption: &Corruption, now: u64) -> bool {
        if self.epoch != Some(epoch) {
            return false;
        }
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        match corruption {
            Corruption::FormatVersion(version) => match mailbox.meta.as_mut() {
                Some(meta) => {
                    meta.format_version = *version;
                    true
                }
                None => false,
            },
            Corruption::LoseIdentityIndex => mailbox.identity.take().is_some(),
            Corruption::LoseIdentity(seq) => {
                let removed = mailbox.identity.as_mut().is_some_and(|i| i.remove(*seq));
                if mailbox
                    .identity
                    .as_ref()
                    .is_some_and(IdentityIndex::is_empty)
                {
                    mailbox.identity = None;
                }
                removed
            }
            Corruption::LoseMeta => mailbox.meta.take().is_some(),
            Corruption::BreakProof(day) => mailbox
                .meta
                .as_mut()
                .and_then(|m| m.proofs.get_mut(day))
                .map(|p| p.max_seq.take().is_some())
                .unwrap_or(false),
        }
    }
}

/// Hints the CPU to load the cache lines of an `Arc`'s header and first bytes of data.
#[inline]
#[allow(unsafe_code)] // each unsafe block below says why it is sound
fn prefetch<T: ?Sized>(shared: &Arc<T>) {
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
    /// Writes (or replaces) the whole group at `seq` in the bucket of `day`.
    fn put_group(
        &mut self,
        seq: u64,
        day: u64,
        expires_at: u64,
        created_at: u64,
        events: Arc<[Event]>,
    ) {
        let old = self.groups.insert(
            seq,
            StoredGroup {
                day,
                created_at,
                events,
            },
        );
        match old {
            Some(old) if old.day == day => {}
            Some(old) => {
                self.release_bucket(old.day, 1);
                self.claim_bucket(day, expires_at);
            }
            None => self.claim_bucket(day, expires_at),
        }
    }

    fn claim_bucket(&mut self, day: u64, expires_at: u64) {
        self.note_expiry(expires_at);
        let bucket = self.buckets.entry(day).or_insert(DayBucket {
            expires_at,
            groups: 0,
        });
        bucket.groups += 1;
    }

    fn release_bucket(&mut self, day: u64, groups: u32) {
        if let Some(bucket) = self.buckets.get_mut(&day) {
            bucket.groups = bucket.groups.saturating_sub(groups);
            if bucket.groups == 0 {
                self.buckets.remove(&day);
            }
        }
    }

    /// Deletes every group with `seq < trim`; returns how many.
    fn remove_groups_below(&mut self, trim: u64) -> u64 {
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
    fn expire_physically(&mut self, now: u64) {
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
    fn note_expiry(&mut self, expires_at: u64) {
        if self.next_expiry != 0 {
            self.next_expiry = self.next_expiry.min(expires_at);
        }
    }

    fn recompute_next_expiry(&mut self) {
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
    fn prepare_write(&mut self, now: u64) -> Result<(), StoreError> {
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
    fn check_format(&self) -> Result<(), StoreError> {
        rules::check_format(self.meta.as_ref().map(|m| i64::from(m.format_version)))
    }

    fn drop_expired_identities(&mut self, now: u64) {
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
    fn check_integrity(&self, now: u64) -> Result<(), StoreError> {
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
    fn promote(&mut self, now: u64) -> Result<u32, StoreError> {
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
    fn check_cursor(&self, after_seq: u64) -> Result<(), StoreError> {
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
    fn read_page(&self, request: &ScanRequest) -> ScanPage {
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
