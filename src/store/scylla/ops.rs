//! Append, truncate, promote and inspect (SPEC 4.2, 4.3, 4.5) on one slot of a user's partition:
//! the live slot for the daemon and the CLI, the staging slot for a repair.

use std::collections::BTreeMap;

use super::commit::Commit;
use super::schema::event_bucket;
use super::state::{Admission, Meta, ReadAt, Slot, Writer};
use super::{digest, ttl_until, Attempt, ScyllaStore, BACKEND, FORMAT_VERSION};
use crate::model::error::{ConflictKind, CorruptKind, RejectKind};
use crate::model::validate::{validate_before_seq, validate_group};
use crate::model::{
    ActiveDay, AppendOutcome, Event, EventGroup, MailboxId, MailboxInspection, PromoteOutcome,
    StoreError, TruncateOutcome,
};
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

fn check_writer_user(writer: Writer<'_>, mailbox: &MailboxId) -> Result<(), StoreError> {
    match writer {
        Writer::Staging(token) if token.user != mailbox.user_id => Err(StoreError::Unsupported {
            backend: BACKEND,
            operation: "writing another user into a repair's staging copy",
        }),
        _ => Ok(()),
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
        let now = self.now();
        if self.policy.is_beyond_future_window(group.day(), now as u64) {
            return Err(StoreError::rejected(
                RejectKind::FutureCreatedAt,
                format!(
                    "created_at day {} is beyond today + future_window_days ({})",
                    group.day(),
                    self.policy.future_window_days
                ),
            ));
        }
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_append(group, writer, now, read)
        })
        .await
    }

    pub(super) async fn truncate_as(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
        writer: Writer<'_>,
    ) -> Result<TruncateOutcome, StoreError> {
        validate_before_seq(before_seq)?;
        check_writer_user(writer, mailbox)?;
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_truncate(mailbox, before_seq as i64, writer, now, read)
        })
        .await
    }

    async fn try_append(
        &self,
        group: &EventGroup,
        writer: Writer<'_>,
        now: i64,
        read: ReadAt,
    ) -> Result<Attempt<AppendOutcome>, StoreError> {
        let mb = &group.mailbox;
        let user = mb.user_id.as_str();
        let seq = group.mailbox_seq as i64;
        let day = group.day() as i64;
        let expires_at = self.policy.expires_at(group.day()) as i64;
        let epoch = i64::from(mb.epoch);
        // The previous seq is read along as a probe of the identity index: for appends in
        // source order it is live, which proves the index present without a second read.
        let probe = seq - 1;
        let snapshot = self.read_snapshot(user, &[seq, probe], read).await?;
        let Admission { slot, clear_fence } = snapshot.admit(writer, now)?;
        let current = snapshot.slot(slot);
        let expected = snapshot.version;
        let fresh_generation = expected.unwrap_or(0) + 1;

        // 3. Epoch: older input is stale; newer input (or a user never written) starts a fresh
        //    mailbox under a new generation, applied only if something is written.
        let moving = match current.epoch {
            Some(c) if epoch < c => return Ok(Attempt::Done(Ok(AppendOutcome::StaleEpoch))),
            Some(c) => epoch > c,
            None => true,
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
            snapshot.live_identity(slot, seq, now)
        };
        if identity.is_none() && !moving && (!meta.exists() || meta.proves_live_groups(now)) {
            let index_exists = snapshot.live_identity(slot, probe, now).is_some()
                || self.any_live_identity(user, slot, now).await?;
            let verdict = match (meta.exists(), index_exists) {
                (true, false) => Some(CorruptKind::IndexLost),
                (false, true) => Some(CorruptKind::MetaLost),
                _ => None,
            };
            if let Some(kind) = verdict {
                // The probe was a second read: confirm nobody committed in between.
                if !self.unchanged_since(user, expected).await? {
                    return Ok(Attempt::Retry);
                }
                return Ok(Attempt::Done(Err(StoreError::corrupt(kind))));
            }
        }

        // Outcomes that write nothing but promote's changes.
        macro_rules! finish {
            ($result:expr) => {{
                if !promoted.is_empty() {
                    let mut commit = Commit::new(&self.statements, user, expected);
                    if clear_fence {
                        commit.clear_fence();
                    }
                    commit.write_meta(slot, generation, epoch, &meta);
                    if !self.commit(commit).await? {
                        return Ok(Attempt::Retry);
                    }
                }
                return Ok(Attempt::Done($result));
            }};
        }

        // 7. Trim.
        if seq < meta.user_trim_seq {
            finish!(Ok(AppendOutcome::Trimmed));
        }

        let mut events: Vec<&Event> = group.events.iter().collect();
        events.sort_by_key(|e| e.event_ordinal);
        let content = digest(group.created_at, &events);
        let ttl = ttl_until(expires_at, now);

        // 8. Identity lookup.
        if let Some((existing_expires_at, existing_digest)) = identity {
            if existing_expires_at != expires_at {
                finish!(Err(StoreError::Conflict {
                    kind: ConflictKind::CrossDay {
                        existing_day: self.day_of_expiry(existing_expires_at) as u64,
                        incoming_day: day as u64,
                    },
                }));
            }
            let stored = self
                .read_group(user, generation, event_bucket(day), seq, existing_digest)
                .await?;
            let same = stored.as_ref().is_some_and(|(created_at, stored_events)| {
                *created_at == group.created_at as i64
                    && stored_events.len() == events.len()
                    && stored_events.iter().zip(&events).all(|((o, p), e)| {
                        *o == i64::from(e.event_ordinal) && p == e.payload.as_str()
                    })
            });
            if same {
                finish!(Ok(AppendOutcome::Unchanged));
            }
            // The new copy's rows never share the key of the rows they replace, even if two
            // different contents hashed alike.
            let row_digest = if content == existing_digest {
                content.wrapping_add(1)
            } else {
                content
            };
            let rows = GroupRows {
                generation,
                bucket: event_bucket(day),
                seq,
                digest: row_digest,
                created_at: group.created_at as i64,
                ttl,
            };
            self.write_events(user, &rows, &events).await?;
            let mut commit = Commit::new(&self.statements, user, expected);
            if clear_fence {
                commit.clear_fence();
            }
            commit.write_meta(slot, generation, epoch, &meta);
            commit.put_identity(slot, seq, expires_at, row_digest, ttl);
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
            self.write(
                &self.statements.delete_events_digest,
                (user, generation, event_bucket(day), seq, existing_digest),
            )
            .await?;
            return Ok(Attempt::Done(Ok(AppendOutcome::Replaced)));
        }

        if expires_at <= now {
            // An expired replay: no events, no identity; only the gap boundary moves.
            meta.format_version = Some(FORMAT_VERSION);
            meta.expired_gap_boundary = meta.expired_gap_boundary.max(seq);
            let mut commit = Commit::new(&self.statements, user, expected);
            if clear_fence {
                commit.clear_fence();
            }
            commit.write_meta(slot, generation, epoch, &meta);
            if moving {
                commit.delete_identities_except(slot, None);
            }
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
            if moving {
                self.drop_generation(user, current).await?;
            }
            return Ok(Attempt::Done(Ok(AppendOutcome::ExpiredMerged)));
        }

        if seq <= meta.seqbucket_max_seq {
            finish!(Err(StoreError::corrupt(CorruptKind::IdentityMissing {
                seq: seq as u64,
                seqbucket_max_seq: meta.seqbucket_max_seq as u64,
            })));
        }

        let low = meta.days.keys().next().map_or(day, |&d| d.min(day));
        let high = meta.days.keys().next_back().map_or(day, |&d| d.max(day));
        if high - low > i64::from(self.policy.max_active_span_days) {
            finish!(Err(StoreError::rejected(
                RejectKind::SpanExceeded,
                format!(
                    "adding day {day} makes the active days span {low}..={high}, more than max_active_span_days ({})",
                    self.policy.max_active_span_days
                ),
            )));
        }

        // Insert: event rows, then meta and identity in one commit.
        let rows = GroupRows {
            generation,
            bucket: event_bucket(day),
            seq,
            digest: content,
            created_at: group.created_at as i64,
            ttl,
        };
        self.write_events(user, &rows, &events).await?;
        meta.format_version = Some(FORMAT_VERSION);
        meta.days.insert(day, expires_at);
        let proof = meta.proof_max_seq.entry(day).or_insert(seq);
        *proof = (*proof).max(seq);
        meta.proof_expires_at.insert(day, expires_at);
        meta.seqbucket_max_seq = meta.seqbucket_max_seq.max(seq);
        let mut commit = Commit::new(&self.statements, user, expected);
        if clear_fence {
            commit.clear_fence();
        }
        commit.write_meta(slot, generation, epoch, &meta);
        commit.put_identity(slot, seq, expires_at, content, ttl);
        if moving {
            commit.delete_identities_except(slot, Some(seq));
        }
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        if moving {
            self.drop_generation(user, current).await?;
        }
        Ok(Attempt::Done(Ok(AppendOutcome::Inserted)))
    }

    async fn try_truncate(
        &self,
        mb: &MailboxId,
        before: i64,
        writer: Writer<'_>,
        now: i64,
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
        let creating = match current.epoch {
            None => true,
            Some(c) if c != epoch => {
                return Ok(Attempt::Done(Err(StoreError::EpochMismatch {
                    current: u32::try_from(c).ok(),
                })))
            }
            Some(_) => false,
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
        if meta.exists() {
            meta.promote(now)?;
        }
        let trim = meta.user_trim_seq.max(before);
        // The identities this trim removes (work proportional to what is removed).
        let below = if creating {
            Vec::new()
        } else {
            self.slot_identities(user, slot, 0, trim - 1).await?
        };
        let removed_groups = below.iter().filter(|(_, e, _)| *e > now).count() as u64;
        if !creating && (!meta.exists() || meta.proves_live_groups(now)) {
            let index_exists =
                removed_groups > 0 || self.any_live_identity(user, slot, now).await?;
            let verdict = match (meta.exists(), index_exists) {
                (true, false) => Some(CorruptKind::IndexLost),
                (false, true) => Some(CorruptKind::MetaLost),
                _ => None,
            };
            if let Some(kind) = verdict {
                if !self.unchanged_since(user, expected).await? {
                    return Ok(Attempt::Retry);
                }
                return Ok(Attempt::Done(Err(StoreError::corrupt(kind))));
            }
        }
        meta.format_version = Some(FORMAT_VERSION);
        meta.user_trim_seq = trim;
        let mut commit = Commit::new(&self.statements, user, expected);
        if clear_fence {
            commit.clear_fence();
        }
        commit.write_meta(slot, generation, epoch, &meta);
        if !creating {
            commit.delete_identities(slot, 0, trim);
        }
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        for bucket in meta.known_buckets() {
            self.write(
                &self.statements.delete_events_below,
                (user, generation, bucket, trim),
            )
            .await?;
        }
        Ok(Attempt::Done(Ok(TruncateOutcome {
            user_trim_seq: trim as u64,
            removed_groups,
        })))
    }

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
        now: i64,
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
            return Ok(Attempt::Done(Ok(PromoteOutcome::default())));
        }
        let promoted = meta.promote(now)?;
        if !promoted.is_empty() {
            let generation = current
                .generation
                .unwrap_or(snapshot.version.unwrap_or(0) + 1);
            let mut commit = Commit::new(&self.statements, user, snapshot.version);
            commit.write_meta(slot, generation, epoch, &meta);
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
        }
        Ok(Attempt::Done(Ok(PromoteOutcome {
            expired_days: promoted.len() as u32,
            expired_gap_boundary: meta.expired_gap_boundary as u64,
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
            .filter(|(_, e, _)| *e > now)
            .count() as u64;
        for day in meta
            .proof_max_seq
            .keys()
            .chain(meta.proof_expires_at.keys())
        {
            inspection.active_days.insert(
                *day as u64,
                ActiveDay {
                    max_seq: meta.proof_max_seq.get(day).copied().unwrap_or(0) as u64,
                    expires_at: meta.proof_expires_at.get(day).copied().unwrap_or(0) as u64,
                },
            );
        }
        inspection.format_version = meta.format_version.and_then(|v| u32::try_from(v).ok());
        inspection.min_day = meta.days.keys().next().map(|&d| d as u64);
        inspection.max_day = meta.days.keys().next_back().map(|&d| d as u64);
        inspection.active_day_count = meta.days.len() as u32;
        inspection.expired_gap_boundary = meta.expired_gap_boundary as u64;
        inspection.seqbucket_max_seq = meta.seqbucket_max_seq as u64;
        inspection.user_trim_seq = meta.user_trim_seq as u64;
        inspection.identity_count = live;
        inspection.identity_index_present = live > 0;
        Ok(inspection)
    }

    /// The stored copy of one group: (created_at, events by ordinal).
    async fn read_group(
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
