//! The commit point: one conditional batch on the user's partition, guarded by `IF version = ?`.
//!
//! Every change to `user_mailbox` goes through a [`Commit`]: it advances `version` and applies
//! meta, identity, fence and slot changes together, or (when another writer committed since the
//! snapshot) applies nothing. Writes outside it touch only event rows, which no reader sees until
//! a committed identity names them.

use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;

use std::collections::BTreeMap;

use super::state::{stored, Meta};
use super::statements::Statements;
use super::{applied, ScyllaStore};
use crate::model::rules::FORMAT_VERSION;
use crate::model::StoreError;
use crate::store::classify::cql;

type Values = Box<dyn SerializeRow + Send + Sync>;

/// A conditional batch being built: the version bump first, then the changes.
pub(super) struct Commit<'s> {
    statements: &'s Statements,
    user: String,
    parts: Vec<(PreparedStatement, Values)>,
    /// Expired days this commit's meta compacted (counted once the commit applied).
    promoted_days: u64,
}

impl<'s> Commit<'s> {
    /// The meta this commit writes compacted `days` expired days.
    pub(crate) fn count_promoted(&mut self, days: usize) {
        self.promoted_days = days as u64;
    }

    /// A commit that applies only if the partition's version is still `expected`.
    pub(super) fn new(statements: &'s Statements, user: &str, expected: Option<i64>) -> Self {
        let next = expected.unwrap_or(0) + 1;
        let mut commit = Self {
            statements,
            user: user.to_owned(),
            parts: Vec::with_capacity(4),
            promoted_days: 0,
        };
        let user = commit.user.clone();
        commit.push(
            &statements.bump_version,
            Box::new((next, user, expected)) as Values,
        );
        commit
    }

    fn push(&mut self, statement: &PreparedStatement, values: Values) {
        self.parts.push((statement.clone(), values));
    }

    /// The slot's meta row: generation, epoch and every V4 field, written whole.
    pub(crate) fn write_meta(&mut self, slot: i32, generation: i64, epoch: i64, meta: &Meta) {
        let map = |m: &BTreeMap<u64, u64>| -> BTreeMap<i64, i64> {
            m.iter().map(|(&k, &v)| (stored(k), stored(v))).collect()
        };
        let values = (
            generation,
            epoch,
            meta.format_version.unwrap_or(FORMAT_VERSION as i32),
            stored(meta.expired_gap_boundary),
            stored(meta.seqbucket_max_seq),
            stored(meta.user_trim_seq),
            map(&meta.days),
            map(&meta.proof_max_seq),
            map(&meta.proof_expires_at),
            self.user.clone(),
            slot,
        );
        self.push(&self.statements.write_meta, Box::new(values));
    }

    /// Writes the identity row of `seq`: its expiry, the key of its event rows and the log
    /// position of the version (null for none: a replace without a position clears the old
    /// version's), in its stored form with the write's mark ([`stored_position`]).
    pub(crate) fn put_identity(
        &mut self,
        slot: i32,
        seq: i64,
        expires_at: i64,
        digest: i64,
        source: Option<String>,
        ttl: i32,
    ) {
        let values = (
            self.user.clone(),
            slot,
            seq,
            expires_at,
            digest,
            source,
            ttl,
        );
        self.push(&self.statements.put_identity, Box::new(values));
    }

    /// Deletes the identity rows of `slot` with `lo < seq < hi`.
    pub(crate) fn delete_identities(&mut self, slot: i32, lo: i64, hi: i64) {
        let values = (self.user.clone(), slot, lo, hi);
        self.push(&self.statements.delete_identities, Box::new(values));
    }

    /// Deletes every identity row of `slot` except those of `keep` (sorted seqs written in the
    /// same batch): one range between each two of them, since a range tombstone covering a row
    /// written in the same batch would shadow it (both carry the batch's timestamp).
    pub(crate) fn delete_identities_except(&mut self, slot: i32, keep: &[i64]) {
        let mut low = 0;
        for &seq in keep {
            self.delete_identities(slot, low, seq);
            low = seq;
        }
        self.delete_identities(slot, low, i64::MAX);
    }

    /// Deletes a whole slot (meta row and identities). Nothing else may write to the slot in the
    /// same batch, for the reason above.
    pub(crate) fn delete_slot(&mut self, slot: i32) {
        let values = (self.user.clone(), slot);
        self.push(&self.statements.delete_slot, Box::new(values));
    }

    pub(crate) fn set_fence(&mut self, holder: &str, until: u64, ttl: i32) {
        let values = (ttl, holder.to_owned(), stored(until), self.user.clone());
        self.push(&self.statements.set_fence, Box::new(values));
    }

    pub(crate) fn clear_fence(&mut self) {
        let values = (self.user.clone(),);
        self.push(&self.statements.clear_fence, Box::new(values));
    }

    pub(crate) fn set_live_slot(&mut self, slot: i32) {
        let values = (slot, self.user.clone());
        self.push(&self.statements.set_live_slot, Box::new(values));
    }
}

impl ScyllaStore {
    /// Runs `commit` as one conditional batch. `Ok(false)`: another writer committed first and
    /// nothing was applied; the operation decides again on a fresh snapshot.
    pub(super) async fn commit(&self, commit: Commit<'_>) -> Result<bool, StoreError> {
        self.failpoints.before_commit().await;
        let mut batch = Batch::new(BatchType::Logged);
        batch.set_consistency(self.settings.consistency);
        batch.set_serial_consistency(Some(self.settings.serial_consistency));
        let mut values = Vec::with_capacity(commit.parts.len());
        let promoted_days = commit.promoted_days;
        for (statement, row) in commit.parts {
            batch.append_statement(statement);
            values.push(row);
        }
        self.count_paxos_round();
        let result = self
            .session
            .batch(&batch, values)
            .await
            .map_err(cql::from)?;
        self.tick_failpoint()?;
        let applied = applied(&result)?;
        if applied {
            self.promoted.add(promoted_days);
        }
        Ok(applied)
    }
}

/// The stored form of the position of the version `group` writes, with the write's mark
/// (`model::written`): `replaced` when the write replaces an older version.
pub(crate) fn stored_position(group: &crate::model::EventGroup, replaced: bool) -> Option<String> {
    let mark = group
        .token
        .map(|token| crate::model::WriteMark { token, replaced });
    group
        .source
        .as_ref()
        .map(|position| crate::model::written::encode(position, mark))
}
