//! Append (SPEC 4.2) on one slot of a user's partition: the live slot for the daemon and the CLI,
//! the staging slot for a repair. The verdict comes from `crate::model::rules`; this module reads the
//! snapshot it decides on and turns the verdict into event rows and one commit.

use super::commit::Commit;
use super::schema::event_bucket;
use super::state::{stored, unsigned, Admission, Meta, ReadAt, Slot, Writer};
use super::{digest, ttl_until, Attempt, ScyllaStore, BACKEND};
use crate::model::rules::{self, AppendStep, EpochStep};
use crate::model::validate::validate_group;
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

/// A step the verdict above has already ruled out; reported, never panicked on.
fn unreachable_step() -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        detail: "internal: an append step was reached that its verdict excludes".to_owned(),
    }
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
    pub(super) async fn append_as(
        &self,
        group: &EventGroup,
        writer: Writer<'_>,
    ) -> Result<AppendOutcome, StoreError> {
        validate_group(group)?;
        check_writer_user(writer, &group.mailbox)?;
        rules::check_future_window(&self.policy, group.day(), self.now())?;
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_append(group, writer, now, read)
        })
        .await
    }

    pub(super) async fn try_append(
        &self,
        group: &EventGroup,
        writer: Writer<'_>,
        now: u64,
        read: ReadAt,
    ) -> Result<Attempt<AppendOutcome>, StoreError> {
        let mb = &group.mailbox;
        let user = mb.user_id.as_str();
        let seq = group.mailbox_seq;
        let day = group.day();
        let expires_at = self.policy.expires_at(day);
        let epoch = i64::from(mb.epoch);
        // The previous seq is read along as a probe of the identity index: for appends in
        // source order it is live, which proves the index present without a second read.
        let probe = seq - 1;
        let snapshot = self
            .read_snapshot(user, &[stored(seq), stored(probe)], read)
            .await?;
        let Admission { slot, clear_fence } = snapshot.admit(writer, now)?;
        let current = snapshot.slot(slot);
        let expected = snapshot.version;
        let fresh_generation = expected.unwrap_or(0) + 1;

        // 3. Epoch: a newer epoch (or a user never written) starts a fresh mailbox under a new
        //    generation, applied only if something is written.
        let moving = match rules::epoch_step(current.epoch.map(unsigned), u64::from(mb.epoch)) {
            EpochStep::Stale => return Ok(Attempt::Done(Ok(AppendOutcome::StaleEpoch))),
            EpochStep::Current => false,
            EpochStep::Move => true,
        };
        let (mut meta, generation) = if moving {
            (Meta::default(), fresh_generation)
        } else {
            // 4. Format.
            current.meta.check_format()?;
            (
                current.meta.clone(),
                current.generation.unwrap_or(fresh_generation),
            )
        };

        // 5. Promote.
        let promoted = if meta.exists() {
            meta.promote(now)?
        } else {
            Vec::new()
        };

        // 6. Integrity (a fresh mailbox has nothing to check).
        let identity = if moving {
            None
        } else {
            snapshot.live_identity(slot, stored(seq), now)
        };
        let proves_live_groups = meta.exists() && meta.proves_live_groups(now);
        if identity.is_none() && !moving && (!meta.exists() || proves_live_groups) {
            let index_present = snapshot.live_identity(slot, stored(probe), now).is_some()
                || self.any_live_identity(user, slot, now).await?;
            if let Err(corrupt) =
                rules::check_integrity(meta.exists(), proves_live_groups, index_present)
            {
                // The probe was a second read: confirm nobody committed in between.
                if !self.unchanged_since(user, expected).await? {
                    return Ok(Attempt::Retry);
                }
                return Ok(Attempt::Done(Err(corrupt)));
            }
        }

        // 7-8. Trim, identity lookup.
        let step = meta.append_step(&self.policy, seq, day, identity.map(|(e, _)| e), now);
        let promoted_days = promoted.len();
        // Outcomes that write nothing but promote's changes.
        let finish = |result: Result<AppendOutcome, StoreError>| {
            let meta = &meta;
            async move {
                if !promoted.is_empty() {
                    let mut commit = Commit::new(&self.statements, user, expected);
                    commit.count_promoted(promoted_days);
                    if clear_fence {
                        commit.clear_fence();
                    }
                    commit.write_meta(slot, generation, epoch, meta);
                    if !self.commit(commit).await? {
                        return Ok(Attempt::Retry);
                    }
                }
                Ok(Attempt::Done(result))
            }
        };
        let step = match step {
            Ok(AppendStep::Trimmed) => return finish(Ok(AppendOutcome::Trimmed)).await,
            Err(refusal) => return finish(Err(refusal)).await,
            Ok(step) => step,
        };

        let mut events: Vec<&Event> = group.events.iter().collect();
        events.sort_by_key(|e| e.event_ordinal);
        let content = digest(group.created_at, &events);
        let ttl = ttl_until(expires_at, now);
        let bucket = event_bucket(stored(day));
        let mut commit = Commit::new(&self.statements, user, expected);
        commit.count_promoted(promoted_days);
        if clear_fence {
            commit.clear_fence();
        }
        let outcome = match step {
            AppendStep::SameDayReplay => {
                let Some((_, existing_digest)) = identity else {
                    return Err(unreachable_step());
                };
                let stored_group = self
                    .read_group(user, generation, bucket, stored(seq), existing_digest)
                    .await?;
                if let Err(damage) =
                    rules::check_stored_group(stored_group.is_some(), seq, day, expires_at, now)
                {
                    // A replace that committed meanwhile deletes the rows it replaced: only
                    // an unchanged mailbox proves them lost.
                    if !self.unchanged_since(user, expected).await? {
                        return Ok(Attempt::Retry);
                    }
                    return Ok(Attempt::Done(Err(damage)));
                }
                if stores(stored_group.as_ref(), group.created_at, &events) {
                    return finish(Ok(AppendOutcome::Unchanged)).await;
                }
                // Different content from an older offset of the log and partition that wrote the
                // stored version: a zombie's late write or a replay of a superseded record
                // (SPEC 7.2). A write that lost its condition re-decides here, against the newer
                // owner's position.
                let held = snapshot.identity_source(slot, stored(seq));
                if rules::superseded(held, group.source.as_ref()) {
                    rules::note_superseded(group, held);
                    return finish(Ok(AppendOutcome::Superseded)).await;
                }
                let row_digest = replacement_key(content, existing_digest, expected);
                let rows = GroupRows {
                    generation,
                    bucket,
                    seq: stored(seq),
                    digest: row_digest,
                    created_at: stored(group.created_at),
                    ttl,
                };
                self.write_events(user, &rows, &events).await?;
                commit.write_meta(slot, generation, epoch, &meta);
                commit.put_identity(
                    slot,
                    stored(seq),
                    stored(expires_at),
                    row_digest,
                    group.source.as_ref(),
                    ttl,
                );
                if !self.commit(commit).await? {
                    return Ok(Attempt::Retry);
                }
                // The clean-up of the old version: keyed so that it can only match rows no
                // identity names (`replacement_key`), however late it runs.
                self.failpoints.after_replace_commit().await;
                self.write(
                    &self.statements.delete_events_digest,
                    (user, generation, bucket, stored(seq), existing_digest),
                )
                .await?;
                return Ok(Attempt::Done(Ok(AppendOutcome::Replaced)));
            }
            AppendStep::ExpiredMerge => {
                meta.record_expired_merge(seq);
                commit.write_meta(slot, generation, epoch, &meta);
                if moving {
                    commit.delete_identities_except(slot, None);
                }
                AppendOutcome::ExpiredMerged
            }
            AppendStep::Insert => {
                let inserted = Inserted {
                    slot,
                    generation,
                    group,
                    events: &events,
                    content,
                    now,
                };
                self.insert_group(user, &inserted, &mut meta, &mut commit)
                    .await?;
                commit.write_meta(slot, generation, epoch, &meta);
                if moving {
                    commit.delete_identities_except(slot, Some(stored(seq)));
                }
                AppendOutcome::Inserted
            }
            AppendStep::Trimmed => return Err(unreachable_step()),
        };
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        if moving {
            self.drop_generation(user, current).await?;
        }
        Ok(Attempt::Done(Ok(outcome)))
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
            group.source.as_ref(),
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
