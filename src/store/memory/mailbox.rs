//! One user's state in the memory store and every rule of SPEC 4 applied to it.
//!
//! Read top to bottom, [`UserState::append`] answers "what happens to a replayed record?".

use serde::{Deserialize, Serialize};

use crate::model::rules::{self, AppendFacts, AppendStep, EpochStep};
use crate::model::{
    ActiveDay, AppendOutcome, EventGroup, MailboxInspection, PromoteOutcome, RetentionPolicy,
    ScanPage, ScanRequest, StoreError, TruncateOutcome,
};
use crate::store::fault::Corruption;

mod stored;

use stored::{canonical_events, IdentityIndex, Mailbox, Meta, StoredGroup};

/// Everything stored for one user: the epoch key and the current epoch's mailbox.
///
/// Older epochs are deleted when the user moves on, so only one mailbox is ever held.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct UserState {
    /// `P:epoch:T`: the largest epoch ever appended; `None` for a user never written.
    epoch: Option<u32>,
    mailbox: Mailbox,
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
                        return Ok(rules::identical_answer(stored.mark, group.token));
                    }
                }
                let held = mailbox.groups.get(&seq).and_then(|g| g.source.as_ref());
                if rules::superseded(held, group.source.as_ref()) {
                    rules::note_superseded(group, held);
                    return Ok(AppendOutcome::Superseded);
                }
                mailbox.put_group(
                    seq,
                    incoming_expires_at,
                    StoredGroup {
                        day,
                        created_at: group.created_at,
                        events,
                        source: group.source.clone(),
                        mark: group.token.map(crate::model::WriteMark::replaced),
                    },
                );
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
            incoming_expires_at,
            StoredGroup {
                day,
                created_at: group.created_at,
                events: canonical_events(&group.events),
                source: group.source.clone(),
                mark: group.token.map(crate::model::WriteMark::inserted),
            },
        );
        mailbox
            .identity
            .get_or_insert_with(IdentityIndex::default)
            .insert(seq, incoming_expires_at);
        mailbox.day_set.insert(day, incoming_expires_at);
        mailbox.note_expiry(incoming_expires_at);
        let meta = mailbox.meta.get_or_insert_with(Meta::new);
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
            // SPEC 7.3: keys of the mailbox without its meta are what is left of a lost meta,
            // never an empty mailbox.
            mailbox.check_meta_not_lost()?;
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
            mailbox.check_meta_not_lost()?;
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

    /// The live seqs of `epoch`'s mailbox and their stored versions' positions (explain).
    pub(super) fn seq_positions(&mut self, now: u64, epoch: u32) -> Vec<crate::store::SeqPosition> {
        if self.epoch != Some(epoch) {
            return Vec::new();
        }
        let mailbox = &mut self.mailbox;
        mailbox.expire_physically(now);
        let Some(identity) = mailbox.identity.as_ref() else {
            return Vec::new();
        };
        identity
            .by_seq
            .iter()
            .filter(|(_, &expires_at)| expires_at > now)
            .map(|(&seq, _)| crate::store::SeqPosition {
                seq,
                position: mailbox.groups.get(&seq).and_then(|g| g.source.clone()),
            })
            .collect()
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
            // Each identity carries its own expiry here; there is no key TTL to lose.
            Corruption::LoseIdentityTtl
            | Corruption::LoseDayEvents(_)
            | Corruption::LoseEpochKey
            | Corruption::LoseDaySet => false,
        }
    }
}
