//! Append (SPEC 4.2) on one slot of a user's partition, walked once: a single append is a run of
//! one, and a run of one mailbox's groups ([`MailboxStore::append_run`]) is ONE snapshot read, the
//! groups decided one after another in memory through `crate::model::rules` on a meta that each
//! decision updates, their event rows written, and ONE conditional commit for all of them. A Paxos
//! round per run instead of per group: what a catch-up gains when a mailbox has many groups
//! waiting. The live slot is the daemon's and the CLI's, the staging slot a repair's.
//!
//! Every group is answered exactly as it would be alone, in order. A run that starts a mailbox (a
//! user's first write, or a move to a newer epoch) starts it with its first write and goes on in
//! the fresh generation, the old epoch's identities deleted in the same commit and its rows after
//! it. A same-day replay with other content (a replace, which deletes the old rows after its
//! commit, `append.rs`) goes alone: a chunk ends before it, and the next chunk reads again and
//! starts with it.
//!
//! A verdict that blocks (corrupt) is decided again on a serial read before it is answered; the
//! groups decided before it in the chunk are committed first, and the run ends there.
//!
//! [`MailboxStore::append_run`]: crate::store::MailboxStore::append_run

use std::collections::BTreeMap;

use super::append::{check_writer_user, stores, Inserted, Replacing};
use super::commit::Commit;
use super::schema::event_bucket;
use super::state::{stored, unsigned, Admission, Meta, ReadAt, Writer};
use super::{digest, Attempt, ScyllaStore, BACKEND};
use crate::model::rules::{self, AppendStep, EpochStep};
use crate::model::validate::validate_group;
use crate::model::{AppendOutcome, Event, EventGroup, StoreError};
use crate::store::ends_run;

/// The answers of a chunk: a non-empty prefix of it.
type Answers = Vec<Result<AppendOutcome, StoreError>>;

/// Whether two groups of one seq hold the same content (created_at and events by ordinal).
fn same_content(a: &EventGroup, b: &EventGroup) -> bool {
    a.created_at == b.created_at && by_ordinal(a) == by_ordinal(b)
}

fn by_ordinal(group: &EventGroup) -> Vec<(u32, &str)> {
    let mut events: Vec<(u32, &str)> = group
        .events
        .iter()
        .map(|e| (e.event_ordinal, e.payload.as_str()))
        .collect();
    events.sort_unstable();
    events
}

/// A step the verdict has already ruled out; reported, never panicked on.
fn unreachable_step() -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        detail: "internal: an append step was reached that its verdict excludes".to_owned(),
    }
}

impl ScyllaStore {
    /// One group: a run of one, so it is decided by the very body a run's groups are.
    pub(super) async fn append_as(
        &self,
        group: &EventGroup,
        writer: Writer<'_>,
    ) -> Result<AppendOutcome, StoreError> {
        let mut answers = self.append_run_as(&[group], writer).await;
        // A run of one answers exactly once.
        answers.pop().unwrap_or_else(|| Err(unreachable_step()))
    }

    /// The checks an append makes before it reads anything.
    fn precheck(&self, group: &EventGroup, writer: Writer<'_>) -> Result<(), StoreError> {
        validate_group(group)?;
        check_writer_user(writer, &group.mailbox)?;
        rules::check_future_window(&self.policy, group.day(), self.now())
    }

    /// Appends `run` (groups of one mailbox, in source order) to `writer`'s slot, chunk by
    /// chunk, answering each group as a single append would and stopping after the first
    /// answer that is not final.
    pub(super) async fn append_run_as(&self, run: &[&EventGroup], writer: Writer<'_>) -> Answers {
        let mut answers = Vec::with_capacity(run.len());
        let mut rest = run;
        while let Some(first) = rest.first() {
            if let Err(refused) = self.precheck(first, writer) {
                // Refused before any read, as alone; a final refusal changes nothing.
                let stop = !refused.is_final();
                answers.push(Err(refused));
                if stop {
                    break;
                }
                rest = &rest[1..];
                continue;
            }
            let valid = rest
                .iter()
                .take_while(|g| self.precheck(g, writer).is_ok())
                .count();
            let chunk = &rest[..valid];
            let decided = self
                .settle(ReadAt::Quorum, |now, read| {
                    self.decide(chunk, writer, now, read)
                })
                .await
                .unwrap_or_else(|e| vec![Err(e)]);
            let taken = decided.len().clamp(1, chunk.len());
            let stop = decided.last().is_none_or(ends_run);
            answers.extend(decided);
            if stop {
                break;
            }
            rest = &rest[taken..];
        }
        answers
    }

    /// Decides a prefix of `chunk` (every group passed the precheck) on one snapshot and
    /// commits it once: SPEC 4.2's steps 3 to 8 for each group, on the meta the groups before it
    /// left.
    async fn decide(
        &self,
        chunk: &[&EventGroup],
        writer: Writer<'_>,
        now: u64,
        read: ReadAt,
    ) -> Result<Attempt<Answers>, StoreError> {
        let Some(first) = chunk.first() else {
            return Ok(Attempt::Done(Ok(Vec::new())));
        };
        let mb = &first.mailbox;
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        // A blocking verdict on a plain read is decided again on a serial one.
        let blocked = |corrupt: StoreError| -> Result<Attempt<Answers>, StoreError> {
            if read == ReadAt::Quorum {
                Ok(Attempt::Retry)
            } else {
                Ok(Attempt::Done(Ok(vec![Err(corrupt)])))
            }
        };
        // Each group's identity and the one before it: for appends in source order the previous
        // seq is live, which proves the identity index present without a second read.
        let mut keys = Vec::with_capacity(chunk.len() * 2);
        for group in chunk {
            keys.push(stored(group.mailbox_seq));
            keys.push(stored(group.mailbox_seq) - 1);
        }
        let snapshot = self.read_snapshot(user, &keys, read).await?;
        let Admission { slot, clear_fence } = match snapshot.admit(writer, now) {
            Ok(admission) => admission,
            Err(refused) => return Ok(Attempt::Done(Ok(vec![Err(refused)]))),
        };
        let current = snapshot.slot(slot);
        let expected = snapshot.version;
        let fresh_generation = expected.unwrap_or(0) + 1;
        // 3. Epoch: a newer epoch (or a user never written) starts a fresh mailbox, applied
        //    only if something is written; the snapshot's identities are then the old one's.
        let moving = match rules::epoch_step(current.epoch.map(unsigned), u64::from(mb.epoch)) {
            EpochStep::Stale => {
                let stale = chunk.iter().map(|_| Ok(AppendOutcome::StaleEpoch));
                return Ok(Attempt::Done(Ok(stale.collect())));
            }
            EpochStep::Current => false,
            EpochStep::Move => true,
        };
        let (mut meta, generation) = if moving {
            (Meta::default(), fresh_generation)
        } else {
            if let Err(corrupt) = current.meta.check_format() {
                return blocked(corrupt);
            }
            (
                current.meta.clone(),
                current.generation.unwrap_or(fresh_generation),
            )
        };
        let from_snapshot = |seq: u64| {
            if moving {
                None
            } else {
                snapshot.live_identity(slot, stored(seq), now)
            }
        };
        let promoted = if meta.exists() {
            match meta.promote(now) {
                Ok(days) => days,
                Err(corrupt) => return blocked(corrupt),
            }
        } else {
            Vec::new()
        };

        let mut commit = Commit::new(&self.statements, user, expected);
        commit.count_promoted(promoted.len());
        if clear_fence {
            commit.clear_fence();
        }
        let mut answers: Answers = Vec::with_capacity(chunk.len());
        // Identities this chunk puts: seq -> (expires_at, digest, the group).
        let mut written: BTreeMap<u64, (u64, i64, &EventGroup)> = BTreeMap::new();
        let mut wrote = false;
        let mut index_anywhere: Option<bool> = None;
        for group in chunk {
            let seq = group.mailbox_seq;
            let day = group.day();
            let expires_at = self.policy.expires_at(day);
            let from_run = written.get(&seq).copied();
            let identity = match from_run {
                Some((expires, row_digest, _)) => Some((expires, row_digest)),
                None => from_snapshot(seq),
            };

            // 6. Integrity (a mailbox this chunk starts has nothing to check before its first
            //    write, and only its own identities after).
            let proves_live_groups = meta.exists() && meta.proves_live_groups(now);
            let starting = moving && !wrote;
            if identity.is_none() && !starting && (!meta.exists() || proves_live_groups) {
                let mut present = !written.is_empty() || from_snapshot(seq - 1).is_some();
                if !present && !moving {
                    present = match index_anywhere {
                        Some(known) => known,
                        None => {
                            let known = self.any_live_identity(user, slot, now).await?;
                            index_anywhere = Some(known);
                            known
                        }
                    };
                }
                if let Err(corrupt) =
                    rules::check_integrity(meta.exists(), proves_live_groups, present)
                {
                    if read == ReadAt::Quorum || !self.unchanged_since(user, expected).await? {
                        return Ok(Attempt::Retry);
                    }
                    answers.push(Err(corrupt));
                    break;
                }
            }

            // 7-8. Trim, identity lookup.
            let step = meta.append_step(&self.policy, seq, day, identity.map(|(e, _)| e), now);
            match step {
                Ok(AppendStep::Trimmed) => answers.push(Ok(AppendOutcome::Trimmed)),
                Err(refusal) if refusal.is_final() => answers.push(Err(refusal)),
                Err(corrupt) => {
                    if read == ReadAt::Quorum {
                        return Ok(Attempt::Retry);
                    }
                    answers.push(Err(corrupt));
                    break;
                }
                Ok(AppendStep::SameDayReplay) => {
                    let same = match (from_run, identity) {
                        (Some((_, _, earlier)), _) => same_content(earlier, group),
                        (None, Some((_, existing_digest))) => {
                            let stored_group = self
                                .read_group(
                                    user,
                                    generation,
                                    event_bucket(stored(day)),
                                    stored(seq),
                                    existing_digest,
                                )
                                .await?;
                            if let Err(damage) = rules::check_stored_group(
                                stored_group.is_some(),
                                seq,
                                day,
                                self.policy.expires_at(day),
                                now,
                            ) {
                                // Confirmed at the serial read: a replace that committed
                                // meanwhile deletes the rows it replaced.
                                if read == ReadAt::Quorum {
                                    return Ok(Attempt::Retry);
                                }
                                answers.push(Err(damage));
                                break;
                            }
                            let mut events: Vec<&Event> = group.events.iter().collect();
                            events.sort_by_key(|e| e.event_ordinal);
                            stores(stored_group.as_ref(), group.created_at, &events)
                        }
                        (None, None) => false,
                    };
                    // The stored version's position: the run's own earlier write of the seq, or
                    // the identity row read with the snapshot.
                    let held = match from_run {
                        Some((_, _, earlier)) => earlier.source.as_ref(),
                        None => snapshot.identity_source(slot, stored(seq)),
                    };
                    if same {
                        answers.push(Ok(AppendOutcome::Unchanged));
                    } else if rules::superseded(held, group.source.as_ref()) {
                        rules::note_superseded(group, held);
                        answers.push(Ok(AppendOutcome::Superseded));
                    } else if answers.is_empty() {
                        // A replace goes alone (it deletes the old rows after its commit); being
                        // first, its identity is the snapshot's.
                        let Some((_, existing_digest)) = identity else {
                            return Err(unreachable_step());
                        };
                        let replacing = Replacing {
                            slot,
                            generation,
                            epoch,
                            group,
                            existing_digest,
                            expected,
                            now,
                        };
                        return Ok(match self.replace(&replacing, &meta, commit).await? {
                            Attempt::Done(outcome) => Attempt::Done(Ok(vec![outcome])),
                            Attempt::Retry => Attempt::Retry,
                        });
                    } else {
                        break;
                    }
                }
                Ok(AppendStep::ExpiredMerge) => {
                    meta.record_expired_merge(seq);
                    wrote = true;
                    answers.push(Ok(AppendOutcome::ExpiredMerged));
                }
                Ok(AppendStep::Insert) => {
                    let mut events: Vec<&Event> = group.events.iter().collect();
                    events.sort_by_key(|e| e.event_ordinal);
                    let content = digest(group.created_at, &events);
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
                    written.insert(seq, (expires_at, content, group));
                    wrote = true;
                    answers.push(Ok(AppendOutcome::Inserted));
                }
            }
        }
        // As alone: a chunk that wrote nothing commits only what promote compacted (and a move
        // is applied only with a write).
        if wrote || !promoted.is_empty() {
            commit.write_meta(slot, generation, epoch, &meta);
            if moving {
                let kept: Vec<i64> = written.keys().map(|&seq| stored(seq)).collect();
                commit.delete_identities_except(slot, &kept);
            }
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
            if moving {
                self.drop_generation(user, current).await?;
            }
        }
        Ok(Attempt::Done(Ok(answers)))
    }
}
