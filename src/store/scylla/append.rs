//! The writes an append's verdict asks for (SPEC 4.2 step 8): an insert's event rows and identity,
//! a replace's new rows and the delete of the old ones, a dropped generation's partitions. The
//! verdicts are decided in one place, `decide.rs`; this module only writes them.

use super::commit::Commit;
use super::schema::event_bucket;
use super::state::{stored, Meta, Slot, Writer};
use super::{digest, ttl_until, Attempt, ScyllaStore, BACKEND};
use crate::model::{AppendOutcome, Event, EventGroup, MailboxId, StoreError};
use crate::store::classify::cql;

/// Where one copy of a group's event rows goes, and how long it lives.
#[derive(Debug, Clone, Copy)]
struct GroupRows {
    generation: i64,
    bucket: i64,
    seq: i64,
    digest: i64,
    created_at: i64,
    ttl: i32,
}

/// A group an append inserts: where (the slot and its generation), what (its events sorted by
/// ordinal and their digest) and when.
#[derive(Clone, Copy)]
pub(super) struct Inserted<'a> {
    pub slot: i32,
    pub generation: i64,
    pub group: &'a EventGroup,
    pub events: &'a [&'a Event],
    pub content: i64,
    pub now: u64,
}

/// A same-day replay that replaces: the slot and generation it writes, the group, the digest
/// keying the rows it replaces, and the commit point its snapshot read.
#[derive(Clone, Copy)]
pub(super) struct Replacing<'a> {
    pub slot: i32,
    pub generation: i64,
    pub epoch: i64,
    pub group: &'a EventGroup,
    pub existing_digest: i64,
    pub expected: Option<i64>,
    pub now: u64,
}

/// Whether a stored group (its created_at and events by ordinal, as `read_group` answers) holds
/// exactly `created_at` and `events` (sorted by ordinal): an identical replay.
pub(super) fn stores(
    stored_group: Option<&(i64, Vec<(i64, String)>)>,
    created_at: u64,
    events: &[&Event],
) -> bool {
    stored_group.is_some_and(|(stored_at, stored_events)| {
        *stored_at == stored(created_at)
            && stored_events.len() == events.len()
            && stored_events
                .iter()
                .zip(events)
                .all(|((o, p), e)| *o == i64::from(e.event_ordinal) && p == e.payload.as_str())
    })
}

/// The key of a replacing version's event rows: the content's digest mixed with the commit that
/// makes it visible (the version after `expected`), never the key of the rows it replaces.
///
/// A replace deletes the old version's rows after its commit (SPEC 7.2): a writer frozen between
/// the two deletes late. Only the commit made from a snapshot at `expected` can succeed, so every
/// later write's rows carry a later commit in their key, and the late delete can only ever match
/// rows no identity names any more, even when a later writer stored the same content again
/// (A -> B -> A). Rows an insert writes keep the content's digest: a seq is inserted once per
/// generation (an expired or trimmed seq is never written again).
pub(super) fn replacement_key(content: i64, existing: i64, expected: Option<i64>) -> i64 {
    const MIX: u64 = 0x9E37_79B9_7F4A_7C15;
    let commit = expected.unwrap_or(0).wrapping_add(1) as u64;
    let key = content ^ (commit.wrapping_mul(MIX) as i64);
    if key == existing {
        key.wrapping_add(1)
    } else {
        key
    }
}

pub(super) fn check_writer_user(writer: Writer<'_>, mailbox: &MailboxId) -> Result<(), StoreError> {
    match writer {
        Writer::Staging(token) => token.check_user(&mailbox.user_id, BACKEND),
        Writer::Live => Ok(()),
    }
}

impl ScyllaStore {
    /// A replace's writes (SPEC 4.2 step 8, a same-day replay with other content, not
    /// superseded): the new version's rows under `replacement_key`, the meta and the identity in
    /// `commit`, then the old rows deleted. `Retry` when the commit lost its condition.
    pub(super) async fn replace(
        &self,
        replacing: &Replacing<'_>,
        meta: &Meta,
        mut commit: Commit<'_>,
    ) -> Result<Attempt<AppendOutcome>, StoreError> {
        let Replacing {
            slot,
            generation,
            epoch,
            group,
            existing_digest,
            expected,
            now,
        } = *replacing;
        let user = group.mailbox.user_id.as_str();
        let (seq, day) = (group.mailbox_seq, group.day());
        let expires_at = self.policy.expires_at(day);
        let mut events: Vec<&Event> = group.events.iter().collect();
        events.sort_by_key(|e| e.event_ordinal);
        let content = digest(group.created_at, &events);
        let row_digest = replacement_key(content, existing_digest, expected);
        let ttl = ttl_until(expires_at, now);
        let bucket = event_bucket(stored(day));
        let rows = GroupRows {
            generation,
            bucket,
            seq: stored(seq),
            digest: row_digest,
            created_at: stored(group.created_at),
            ttl,
        };
        self.write_events(user, &rows, &events).await?;
        commit.write_meta(slot, generation, epoch, meta);
        commit.put_identity(
            slot,
            stored(seq),
            stored(expires_at),
            row_digest,
            super::commit::stored_position(group, true),
            ttl,
        );
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        // The clean-up of the old version: keyed so that it can only match rows no identity
        // names (`replacement_key`), however late it runs.
        self.failpoints.after_replace_commit().await;
        self.write(
            &self.statements.delete_events_digest,
            (user, generation, bucket, stored(seq), existing_digest),
        )
        .await?;
        Ok(Attempt::Done(Ok(AppendOutcome::Replaced)))
    }

    /// An insert's writes (SPEC 4.2 step 8): the group's event rows now, and its meta changes
    /// and identity into `commit`, which makes them visible at once.
    pub(super) async fn insert_group(
        &self,
        user: &str,
        inserted: &Inserted<'_>,
        meta: &mut Meta,
        commit: &mut Commit<'_>,
    ) -> Result<(), StoreError> {
        let Inserted {
            slot,
            generation,
            group,
            events,
            content,
            now,
        } = *inserted;
        let (seq, day) = (group.mailbox_seq, group.day());
        let expires_at = self.policy.expires_at(day);
        let ttl = ttl_until(expires_at, now);
        let rows = GroupRows {
            generation,
            bucket: event_bucket(stored(day)),
            seq: stored(seq),
            digest: content,
            created_at: stored(group.created_at),
            ttl,
        };
        self.write_events(user, &rows, events).await?;
        meta.record_insert(day, seq, expires_at);
        commit.put_identity(
            slot,
            stored(seq),
            stored(expires_at),
            content,
            super::commit::stored_position(group, false),
            ttl,
        );
        Ok(())
    }

    /// The stored copy of one group: (created_at, events by ordinal).
    pub(super) async fn read_group(
        &self,
        user: &str,
        generation: i64,
        bucket: i64,
        seq: i64,
        digest: i64,
    ) -> Result<Option<(i64, Vec<(i64, String)>)>, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_group,
                (user, generation, bucket, seq, digest),
            )
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let mut created = None;
        let mut events = Vec::new();
        for row in rows
            .rows::<(i64, Option<i64>, Option<String>)>()
            .map_err(cql::from)?
        {
            let (ordinal, created_at, payload) = row.map_err(cql::from)?;
            created = created.or(created_at);
            events.push((ordinal, payload.unwrap_or_default()));
        }
        Ok(created.map(|c| (c, events)))
    }

    async fn write_events<'a>(
        &self,
        user: &'a str,
        rows: &GroupRows,
        events: &[&'a Event],
    ) -> Result<(), StoreError> {
        let GroupRows {
            generation,
            bucket,
            seq,
            digest,
            created_at,
            ttl,
        } = *rows;
        type EventValues<'a> = (&'a str, i64, i64, i64, i64, i64, i64, &'a str, i32);
        let values = |e: &'a Event| -> EventValues<'a> {
            (
                user,
                generation,
                bucket,
                seq,
                digest,
                i64::from(e.event_ordinal),
                created_at,
                e.payload.as_str(),
                ttl,
            )
        };
        // One partition; small groups go in one unlogged batch, large ones row by row so no
        // batch approaches the server's batch size limit.
        let total: usize = events.iter().map(|e| e.payload.len()).sum();
        if events.len() <= 16 && total <= 16 * 1024 {
            let mut batch =
                scylla::statement::batch::Batch::new(scylla::statement::batch::BatchType::Unlogged);
            batch.set_consistency(self.settings.consistency);
            for _ in events {
                batch.append_statement(self.statements.insert_event.clone());
            }
            let all: Vec<_> = events.iter().map(|e| values(e)).collect();
            self.session.batch(&batch, all).await.map_err(cql::from)?;
            self.tick_failpoint()?;
        } else {
            for e in events {
                self.write(&self.statements.insert_event, values(e)).await?;
            }
        }
        Ok(())
    }

    /// Deletes the event partitions of a generation no slot names any more (an old epoch, a
    /// replaced or abandoned copy): the buckets of the days its meta knew.
    pub(super) async fn drop_generation(&self, user: &str, old: &Slot) -> Result<u64, StoreError> {
        let Some(generation) = old.generation else {
            return Ok(0);
        };
        let mut dropped = 0;
        for bucket in old.meta.known_buckets() {
            self.write(
                &self.statements.delete_events_bucket,
                (user, generation, bucket),
            )
            .await?;
            dropped += 1;
        }
        Ok(dropped)
    }
}
