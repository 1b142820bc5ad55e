//! Promote (SPEC 4.5) and inspect of the live mailbox.

use std::collections::BTreeMap;

use super::commit::Commit;
use super::state::{unsigned, ReadAt};
use super::{Attempt, ScyllaStore};
use crate::model::{ActiveDay, MailboxId, MailboxInspection, PromoteOutcome, StoreError};

impl ScyllaStore {
    pub(super) async fn promote_live(
        &self,
        mailbox: &MailboxId,
    ) -> Result<PromoteOutcome, StoreError> {
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_promote(mailbox, now, read)
        })
        .await
    }

    async fn try_promote(
        &self,
        mb: &MailboxId,
        now: u64,
        read: ReadAt,
    ) -> Result<Attempt<PromoteOutcome>, StoreError> {
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        let snapshot = self.read_snapshot(user, &[], read).await?;
        let slot = snapshot.live_slot;
        let current = snapshot.slot(slot);
        if current.epoch != Some(epoch) {
            return Ok(Attempt::Done(Ok(PromoteOutcome::default())));
        }
        let mut meta = current.meta.clone();
        meta.check_format()?;
        if !meta.exists() {
            // SPEC 7.3: the live slot holds this epoch without its meta: the meta was lost.
            return Err(StoreError::corrupt(
                crate::model::error::CorruptKind::MetaLost,
            ));
        }
        let promoted = meta.promote(now)?;
        if !promoted.is_empty() {
            let generation = current
                .generation
                .unwrap_or(snapshot.version.unwrap_or(0) + 1);
            let mut commit = Commit::new(&self.statements, user, snapshot.version);
            commit.write_meta(slot, generation, epoch, &meta);
            commit.count_promoted(promoted.len());
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
        }
        Ok(Attempt::Done(Ok(PromoteOutcome {
            expired_days: promoted.len() as u32,
            expired_gap_boundary: meta.expired_gap_boundary,
        })))
    }

    pub(super) async fn inspect_live(
        &self,
        mb: &MailboxId,
    ) -> Result<MailboxInspection, StoreError> {
        let now = self.now();
        let user = mb.user_id.as_str();
        let snapshot = self.read_snapshot(user, &[], ReadAt::Quorum).await?;
        let slot = snapshot.live_slot;
        let current = snapshot.slot(slot);
        let current_epoch = current.epoch.and_then(|e| u32::try_from(e).ok());
        let mut inspection = MailboxInspection {
            format_version: None,
            current_epoch,
            min_day: None,
            max_day: None,
            active_day_count: 0,
            active_days: BTreeMap::new(),
            expired_gap_boundary: 0,
            seqbucket_max_seq: 0,
            user_trim_seq: 0,
            identity_count: 0,
            identity_index_present: false,
        };
        if current.epoch != Some(i64::from(mb.epoch)) {
            return Ok(inspection);
        }
        let meta = &current.meta;
        // Like the Redis index key, whose TTL is its largest score: only live members count.
        let live = self
            .slot_identities(user, slot, 0, i64::MAX)
            .await?
            .iter()
            .filter(|(_, e, _)| unsigned(*e) > now)
            .count() as u64;
        for day in meta
            .proof_max_seq
            .keys()
            .chain(meta.proof_expires_at.keys())
        {
            inspection.active_days.insert(
                *day,
                ActiveDay {
                    max_seq: meta.proof_max_seq.get(day).copied().unwrap_or(0),
                    expires_at: meta.proof_expires_at.get(day).copied().unwrap_or(0),
                },
            );
        }
        inspection.format_version = meta.format_version.and_then(|v| u32::try_from(v).ok());
        inspection.min_day = meta.days.keys().next().copied();
        inspection.max_day = meta.days.keys().next_back().copied();
        inspection.active_day_count = meta.days.len() as u32;
        inspection.expired_gap_boundary = meta.expired_gap_boundary;
        inspection.seqbucket_max_seq = meta.seqbucket_max_seq;
        inspection.user_trim_seq = meta.user_trim_seq;
        inspection.identity_count = live;
        inspection.identity_index_present = live > 0;
        Ok(inspection)
    }

    /// The live seqs of the mailbox's live slot and their source positions, in seq order.
    pub(super) async fn seq_positions_live(
        &self,
        mb: &MailboxId,
    ) -> Result<Vec<crate::store::SeqPosition>, StoreError> {
        const PAGE: i32 = 5_000;
        let now = self.now();
        let user = mb.user_id.as_str();
        let snapshot = self.read_snapshot(user, &[], ReadAt::Quorum).await?;
        let slot = snapshot.live_slot;
        if snapshot.slot(slot).epoch != Some(i64::from(mb.epoch)) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut cursor = 0i64;
        loop {
            let result = self
                .session
                .execute_unpaged(&self.statements.slot_positions, (user, slot, cursor, PAGE))
                .await
                .map_err(super::cql::from)?;
            let rows = result.into_rows_result().map_err(super::cql::from)?;
            let mut seen = 0;
            for row in rows
                .rows::<(i64, Option<i64>, Option<String>)>()
                .map_err(super::cql::from)?
            {
                let (seq, expires_at, position) = row.map_err(super::cql::from)?;
                seen += 1;
                cursor = seq;
                if expires_at.is_some_and(|e| unsigned(e) > now) {
                    out.push(crate::store::SeqPosition {
                        seq: unsigned(seq),
                        position: position
                            .as_deref()
                            .and_then(crate::model::SourcePosition::decode),
                    });
                }
            }
            if seen < PAGE {
                return Ok(out);
            }
        }
    }
}
