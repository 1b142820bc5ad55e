//! TruncateBefore (SPEC 4.3) on one slot of a user's partition.

use super::append::check_writer_user;
use super::commit::Commit;
use super::state::{stored, unsigned, Admission, Meta, ReadAt, Writer};
use super::{Attempt, ScyllaStore};
use crate::model::rules::{self, FORMAT_VERSION};
use crate::model::validate::validate_before_seq;
use crate::model::{MailboxId, StoreError, TruncateOutcome};

impl ScyllaStore {
    pub(super) async fn truncate_as(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
        writer: Writer<'_>,
    ) -> Result<TruncateOutcome, StoreError> {
        validate_before_seq(before_seq)?;
        check_writer_user(writer, mailbox)?;
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_truncate(mailbox, before_seq, writer, now, read)
        })
        .await
    }

    async fn try_truncate(
        &self,
        mb: &MailboxId,
        before: u64,
        writer: Writer<'_>,
        now: u64,
        read: ReadAt,
    ) -> Result<Attempt<TruncateOutcome>, StoreError> {
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        let snapshot = self.read_snapshot(user, &[], read).await?;
        let Admission { slot, clear_fence } = snapshot.admit(writer, now)?;
        let current = snapshot.slot(slot);
        let expected = snapshot.version;
        // A user never written: the truncate establishes the mailbox so the trim is durable and a
        // later replay of older seqs stays trimmed.
        let creating = match rules::check_epoch(current.epoch.map(unsigned), u64::from(mb.epoch)) {
            Ok(exists) => !exists,
            Err(mismatch) => return Ok(Attempt::Done(Err(mismatch))),
        };
        let (mut meta, generation) = if creating {
            (Meta::default(), expected.unwrap_or(0) + 1)
        } else {
            current.meta.check_format()?;
            (
                current.meta.clone(),
                current.generation.unwrap_or(expected.unwrap_or(0) + 1),
            )
        };
        let promoted_days = if meta.exists() {
            meta.promote(now)?.len()
        } else {
            0
        };
        let trim = meta.user_trim_seq.max(before);
        // The identities this trim removes (work proportional to what is removed).
        let below = if creating {
            Vec::new()
        } else {
            self.slot_identities(user, slot, 0, stored(trim) - 1)
                .await?
        };
        let removed_groups = below.iter().filter(|(_, e, _)| unsigned(*e) > now).count() as u64;
        let proves_live_groups = meta.exists() && meta.proves_live_groups(now);
        if !creating && (!meta.exists() || proves_live_groups) {
            let index_present =
                removed_groups > 0 || self.any_live_identity(user, slot, now).await?;
            if let Err(corrupt) =
                rules::check_integrity(meta.exists(), proves_live_groups, index_present)
            {
                if !self.unchanged_since(user, expected).await? {
                    return Ok(Attempt::Retry);
                }
                return Ok(Attempt::Done(Err(corrupt)));
            }
        }
        meta.format_version = Some(FORMAT_VERSION as i32);
        meta.user_trim_seq = trim;
        let mut commit = Commit::new(&self.statements, user, expected);
        if clear_fence {
            commit.clear_fence();
        }
        commit.write_meta(slot, generation, epoch, &meta);
        commit.count_promoted(promoted_days);
        if !creating {
            commit.delete_identities(slot, 0, stored(trim));
        }
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        for bucket in meta.known_buckets() {
            self.write(
                &self.statements.delete_events_below,
                (user, generation, bucket, stored(trim)),
            )
            .await?;
        }
        Ok(Attempt::Done(Ok(TruncateOutcome {
            user_trim_seq: trim,
            removed_groups,
        })))
    }
}
