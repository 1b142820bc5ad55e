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
use super::state::{stored, unsigned, Admission, Meta, ReadAt, Snapshot, Writer};
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
    async fn decide<'a>(
        &'a self,
        chunk: &[&'a EventGroup],
        writer: Writer<'_>,
        now: u64,
        read: ReadAt,
    ) -> Result<Attempt<Answers>, StoreError> {
        let mut deciding = match self.open_chunk(chunk, writer, now, read).await? {
            Opened::Deciding(deciding) => *deciding,
            Opened::Answered(attempt) => return Ok(attempt),
        };
        let mut answers: Answers = Vec::with_capacity(chunk.len());
        for group in chunk {
            match self.decide_group(&mut deciding, group).await? {
                Decided::Answer(answer) => answers.push(answer),
                Decided::Blocked(corrupt) => {
                    answers.push(Err(corrupt));
                    break;
                }
                Decided::Retry => return Ok(Attempt::Retry),
                // A replace goes alone (it deletes the old rows after its commit): first in a
                // chunk, or the chunk ends before it.
                Decided::Replace { existing_digest } if answers.is_empty() => {
                    let Deciding {
                        slot,
                        generation,
                        epoch,
                        expected,
                        now,
                        meta,
                        commit,
                        ..
                    } = deciding;
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
                }
                Decided::Replace { .. } => break,
            }
        }
        self.close_chunk(deciding, answers).await
    }

    /// Steps 3 to 5 for the whole chunk: the snapshot (each group's identity and the one before
    /// it: for appends in source order the previous seq is live, which proves the identity
    /// index present without a second read), the writer's admission, the epoch step, the
    /// format and promote.
    async fn open_chunk<'a>(
        &'a self,
        chunk: &[&'a EventGroup],
        writer: Writer<'_>,
        now: u64,
        read: ReadAt,
    ) -> Result<Opened<'a>, StoreError> {
        let Some(first) = chunk.first() else {
            return Ok(Opened::Answered(Attempt::Done(Ok(Vec::new()))));
        };
        let mb = &first.mailbox;
        let user = mb.user_id.as_str();
        // A blocking verdict on a plain read is decided again on a serial one.
        let blocked = |corrupt: StoreError| match retry_or_block(read, corrupt) {
            Decided::Blocked(corrupt) => Opened::Answered(Attempt::Done(Ok(vec![Err(corrupt)]))),
            _ => Opened::Answered(Attempt::Retry),
        };
        let mut keys = Vec::with_capacity(chunk.len() * 2);
        for group in chunk {
            keys.push(stored(group.mailbox_seq));
            keys.push(stored(group.mailbox_seq) - 1);
        }
        let snapshot = self.read_snapshot(user, &keys, read).await?;
        let Admission { slot, clear_fence } = match snapshot.admit(writer, now) {
            Ok(admission) => admission,
            Err(refused) => return Ok(Opened::Answered(Attempt::Done(Ok(vec![Err(refused)])))),
        };
        let current = snapshot.slot(slot);
        let expected = snapshot.version;
        let fresh_generation = expected.unwrap_or(0) + 1;
        // 3. Epoch: a newer epoch (or a user never written) starts a fresh mailbox, applied
        //    only if something is written; the snapshot's identities are then the old one's.
        let moving = match rules::epoch_step(current.epoch.map(unsigned), u64::from(mb.epoch)) {
            EpochStep::Stale => {
                let stale = chunk.iter().map(|_| Ok(AppendOutcome::StaleEpoch));
                return Ok(Opened::Answered(Attempt::Done(Ok(stale.collect()))));
            }
            EpochStep::Current => false,
            EpochStep::Move => true,
        };
        // 4. Format.
        let (mut meta, generation) = if moving {
            (Meta::default(), fresh_generation)
        } else {
            if let Err(corrupt) = current.meta.check_format() {
                return Ok(blocked(corrupt));
            }
            (
                current.meta.clone(),
                current.generation.unwrap_or(fresh_generation),
            )
        };
        // 5. Promote.
        let promoted = if meta.exists() {
            match meta.promote(now) {
                Ok(days) => days.len(),
                Err(corrupt) => return Ok(blocked(corrupt)),
            }
        } else {
            0
        };
        let mut commit = Commit::new(&self.statements, user, expected);
        commit.count_promoted(promoted);
        if clear_fence {
            commit.clear_fence();
        }
        Ok(Opened::Deciding(Box::new(Deciding {
            user,
            slot,
            epoch: i64::from(mb.epoch),
            generation,
            moving,
            expected,
            now,
            read,
            meta,
            promoted,
            commit,
            written: BTreeMap::new(),
            wrote: false,
            index_anywhere: None,
            snapshot,
        })))
    }

    /// Steps 6 to 8 for one group, on the meta the groups before it left; an insert's rows are
    /// written and its identity goes into the chunk's commit.
    async fn decide_group<'a>(
        &self,
        d: &mut Deciding<'a>,
        group: &'a EventGroup,
    ) -> Result<Decided, StoreError> {
        let (seq, day, now) = (group.mailbox_seq, group.day(), d.now);
        let expires_at = self.policy.expires_at(day);
        let from_run = d.written.get(&seq).copied();
        let identity = match from_run {
            Some((expires, row_digest, _)) => Some((expires, row_digest)),
            None => d.snapshot_identity(seq),
        };

        // 6. Integrity (a mailbox this chunk starts has nothing to check before its first
        //    write, and only its own identities after).
        let proves_live_groups = d.meta.exists() && d.meta.proves_live_groups(now);
        let starting = d.moving && !d.wrote;
        if identity.is_some() && !starting && !d.meta.exists() {
            // SPEC 7.3: an identity row without its meta is what is left of a lost meta; a
            // replace over it would start the mailbox afresh.
            return Ok(retry_or_block(
                d.read,
                StoreError::corrupt(crate::model::error::CorruptKind::MetaLost),
            ));
        }
        if identity.is_none() && !starting && (!d.meta.exists() || proves_live_groups) {
            let mut present = !d.written.is_empty() || d.snapshot_identity(seq - 1).is_some();
            if !present && !d.moving {
                present = match d.index_anywhere {
                    Some(known) => known,
                    None => {
                        let known = self.any_live_identity(d.user, d.slot, now).await?;
                        d.index_anywhere = Some(known);
                        known
                    }
                };
            }
            if let Err(corrupt) =
                rules::check_integrity(d.meta.exists(), proves_live_groups, present)
            {
                // The probe was a second read: only an unchanged mailbox proves the loss.
                if d.read == ReadAt::Serial && !self.unchanged_since(d.user, d.expected).await? {
                    return Ok(Decided::Retry);
                }
                return Ok(retry_or_block(d.read, corrupt));
            }
        }

        // 7-8. Trim, identity lookup.
        let step = d
            .meta
            .append_step(&self.policy, seq, day, identity.map(|(e, _)| e), now);
        Ok(match step {
            Ok(AppendStep::Trimmed) => Decided::Answer(Ok(AppendOutcome::Trimmed)),
            Err(refusal) if refusal.is_final() => Decided::Answer(Err(refusal)),
            Err(corrupt) => retry_or_block(d.read, corrupt),
            Ok(AppendStep::SameDayReplay) => {
                let same = match (from_run, identity) {
                    (Some((_, _, earlier)), _) => same_content(earlier, group),
                    (None, Some((_, existing_digest))) => {
                        let stored_group = self
                            .read_group(
                                d.user,
                                d.generation,
                                event_bucket(stored(day)),
                                stored(seq),
                                existing_digest,
                            )
                            .await?;
                        if let Err(damage) = rules::check_stored_group(
                            stored_group.is_some(),
                            seq,
                            day,
                            expires_at,
                            now,
                        ) {
                            // Confirmed at the serial read: a replace that committed meanwhile
                            // deletes the rows it replaced.
                            return Ok(retry_or_block(d.read, damage));
                        }
                        let mut events: Vec<&Event> = group.events.iter().collect();
                        events.sort_by_key(|e| e.event_ordinal);
                        stores(stored_group.as_ref(), group.created_at, &events)
                    }
                    (None, None) => false,
                };
                // The stored version's position: the run's own earlier write of the seq, or the
                // identity row read with the snapshot.
                let held = match from_run {
                    Some((_, _, earlier)) => earlier.source.as_ref(),
                    None => d.snapshot.identity_source(d.slot, stored(seq)),
                };
                if same {
                    // The version this chunk wrote itself is always an insert (a replace goes
                    // alone); otherwise the stored version's mark.
                    let mark = match from_run {
                        Some((_, _, earlier)) => {
                            earlier.token.map(crate::model::WriteMark::inserted)
                        }
                        None => d.snapshot.identity_mark(d.slot, stored(seq)),
                    };
                    Decided::Answer(Ok(rules::identical_answer(mark, group.token)))
                } else if rules::superseded(held, group.source.as_ref()) {
                    rules::note_superseded(group, held);
                    Decided::Answer(Ok(AppendOutcome::Superseded))
                } else {
                    match (from_run, identity) {
                        // Its identity is the snapshot's: it can go first in a chunk.
                        (None, Some((_, existing_digest))) => Decided::Replace { existing_digest },
                        // Replacing what this chunk wrote: the next chunk reads it first.
                        (Some((_, existing_digest, _)), _) => Decided::Replace { existing_digest },
                        (None, None) => return Err(unreachable_step()),
                    }
                }
            }
            Ok(AppendStep::ExpiredMerge) => {
                d.meta.record_expired_merge(seq);
                d.wrote = true;
                Decided::Answer(Ok(AppendOutcome::ExpiredMerged))
            }
            Ok(AppendStep::Insert) => {
                let mut events: Vec<&Event> = group.events.iter().collect();
                events.sort_by_key(|e| e.event_ordinal);
                let content = digest(group.created_at, &events);
                let inserted = Inserted {
                    slot: d.slot,
                    generation: d.generation,
                    group,
                    events: &events,
                    content,
                    now,
                };
                self.insert_group(d.user, &inserted, &mut d.meta, &mut d.commit)
                    .await?;
                d.written.insert(seq, (expires_at, content, group));
                d.wrote = true;
                Decided::Answer(Ok(AppendOutcome::Inserted))
            }
        })
    }

    /// The chunk's one commit. As alone: a chunk that wrote nothing commits only what promote
    /// compacted, and a move to a newer epoch is applied only with a write (the old epoch's
    /// identities deleted in the same commit, its rows after it).
    async fn close_chunk(
        &self,
        d: Deciding<'_>,
        answers: Answers,
    ) -> Result<Attempt<Answers>, StoreError> {
        let Deciding {
            user,
            slot,
            epoch,
            generation,
            moving,
            meta,
            promoted,
            mut commit,
            written,
            wrote,
            snapshot,
            ..
        } = d;
        if wrote || promoted > 0 {
            commit.write_meta(slot, generation, epoch, &meta);
            if moving {
                let kept: Vec<i64> = written.keys().map(|&seq| stored(seq)).collect();
                commit.delete_identities_except(slot, &kept);
            }
            if !self.commit(commit).await? {
                return Ok(Attempt::Retry);
            }
            if moving {
                self.drop_generation(user, snapshot.slot(slot)).await?;
            }
        }
        Ok(Attempt::Done(Ok(answers)))
    }
}

/// A chunk being decided: what its snapshot said, and what its decisions so far changed.
struct Deciding<'a> {
    user: &'a str,
    snapshot: Snapshot,
    /// The slot the writer was admitted to, and the generation its rows go to.
    slot: i32,
    epoch: i64,
    generation: i64,
    /// The chunk starts the mailbox afresh (a newer epoch, or a user never written).
    moving: bool,
    /// The commit point the snapshot read.
    expected: Option<i64>,
    now: u64,
    read: ReadAt,
    /// The meta every decision reads and updates.
    meta: Meta,
    /// Days promote compacted (committed even when nothing else is).
    promoted: usize,
    commit: Commit<'a>,
    /// Identities this chunk puts: seq -> (expires_at, digest, the group).
    written: BTreeMap<u64, (u64, i64, &'a EventGroup)>,
    wrote: bool,
    /// Whether the slot holds any live identity, once asked.
    index_anywhere: Option<bool>,
}

impl Deciding<'_> {
    /// A seq's live identity as the snapshot read it (none in a mailbox the chunk starts: the
    /// snapshot's identities are the old epoch's).
    fn snapshot_identity(&self, seq: u64) -> Option<(u64, i64)> {
        if self.moving {
            None
        } else {
            self.snapshot
                .live_identity(self.slot, stored(seq), self.now)
        }
    }
}

/// The chunk, opened, or answered before any group was decided.
enum Opened<'a> {
    Deciding(Box<Deciding<'a>>),
    Answered(Attempt<Answers>),
}

/// What one group's decision asks of its chunk.
enum Decided {
    /// Its answer; the chunk goes on.
    Answer(Result<AppendOutcome, StoreError>),
    /// A corrupt verdict confirmed on a serial read: answered, and the chunk ends after it.
    Blocked(StoreError),
    /// A same-day replay with other content: it goes alone, first in a chunk.
    Replace { existing_digest: i64 },
    /// Decided on a read that may be stale: read again, serially.
    Retry,
}

/// A blocking verdict on a plain read is decided again on a serial one.
fn retry_or_block(read: ReadAt, corrupt: StoreError) -> Decided {
    if read == ReadAt::Quorum {
        Decided::Retry
    } else {
        Decided::Blocked(corrupt)
    }
}
