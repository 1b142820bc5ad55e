//! What one read of a user's partition shows: the commit point, the fence, both slots' meta and
//! the identity rows asked for, decoded into plain values the operations decide on.

use std::collections::{BTreeMap, BTreeSet};

use scylla::DeserializeRow;

use crate::model::rules;
use crate::model::{SourcePosition, StoreError};
use crate::store::classify::cql;
use crate::store::RepairToken;

use super::ScyllaStore;

/// The clustering value of `slot` on the user row.
pub(super) const USER_ROW_SLOT: i32 = -1;

/// The meta of one slot: the fields of the V4 meta hash and the day set. Stored as `bigint`s;
/// decided on as the unsigned values of the rules (`crate::model::rules`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Meta {
    pub format_version: Option<i32>,
    pub expired_gap_boundary: u64,
    pub seqbucket_max_seq: u64,
    pub user_trim_seq: u64,
    /// The day set: day -> expires_at.
    pub days: BTreeMap<u64, u64>,
    pub proof_max_seq: BTreeMap<u64, u64>,
    pub proof_expires_at: BTreeMap<u64, u64>,
    // An older release kept one `source_position` per mailbox on the meta row; it is neither
    // read nor written now: positions are kept per seq, on the identity rows (`Identity`).
}

impl Meta {
    pub(super) fn exists(&self) -> bool {
        self.format_version.is_some()
    }

    pub(crate) fn check_format(&self) -> Result<(), StoreError> {
        rules::check_format(self.format_version.map(i64::from))
    }

    fn proof(&self, day: u64) -> rules::Proof {
        rules::Proof {
            max_seq: self.proof_max_seq.get(&day).copied(),
            expires_at: self.proof_expires_at.get(&day).copied(),
        }
    }

    /// Promote phase 1 and 2 on this in-memory copy (SPEC 4.5): validates every expired day,
    /// then merges them. Returns the days compacted; on a bad proof nothing is changed.
    pub(super) fn promote(&mut self, now: u64) -> Result<Vec<u64>, StoreError> {
        let plan = rules::plan_promote(
            self.days.iter().map(|(&day, &score)| (day, score)),
            |day| self.proof(day),
            self.expired_gap_boundary,
            self.user_trim_seq,
            now,
        )?;
        for day in &plan.expired_days {
            self.days.remove(day);
            self.proof_max_seq.remove(day);
            self.proof_expires_at.remove(day);
        }
        self.expired_gap_boundary = plan.new_boundary;
        Ok(plan.expired_days)
    }

    pub(crate) fn check_cursor(&self, after: u64) -> Result<(), StoreError> {
        rules::check_cursor(after, self.user_trim_seq, self.expired_gap_boundary)
    }

    /// SPEC 4.2.6.
    pub(crate) fn proves_live_groups(&self, now: u64) -> bool {
        let days: BTreeSet<u64> = self
            .proof_max_seq
            .keys()
            .chain(self.proof_expires_at.keys())
            .copied()
            .collect();
        rules::proves_live_groups(
            days.into_iter().map(|day| self.proof(day)),
            self.user_trim_seq,
            now,
        )
    }

    /// What an insert of `seq` on `day` (expiring at `expires_at`) records: the format, the
    /// day, its proof and the largest seq.
    pub(super) fn record_insert(&mut self, day: u64, seq: u64, expires_at: u64) {
        self.format_version = Some(rules::FORMAT_VERSION as i32);
        self.days.insert(day, expires_at);
        let proof = self.proof_max_seq.entry(day).or_insert(seq);
        *proof = (*proof).max(seq);
        self.proof_expires_at.insert(day, expires_at);
        self.seqbucket_max_seq = self.seqbucket_max_seq.max(seq);
    }

    /// SPEC 4.2 steps 7-8 for a group of `seq` on `day` on this meta: `identity_expires_at` is
    /// the live identity of the seq, if any.
    pub(super) fn append_step(
        &self,
        policy: &crate::model::RetentionPolicy,
        seq: u64,
        day: u64,
        identity_expires_at: Option<u64>,
        now: u64,
    ) -> Result<rules::AppendStep, StoreError> {
        rules::append_step(
            policy,
            &rules::AppendFacts {
                seq,
                day,
                trim: self.user_trim_seq,
                identity_expires_at,
                seqbucket_max_seq: self.seqbucket_max_seq,
                active_days: self.active_days(),
                now,
            },
        )
    }

    /// What an expired replay of `seq` records: no events, no identity; only the gap boundary
    /// moves.
    pub(super) fn record_expired_merge(&mut self, seq: u64) {
        self.format_version = Some(rules::FORMAT_VERSION as i32);
        self.expired_gap_boundary = self.expired_gap_boundary.max(seq);
    }

    /// The first and last day of the day set.
    pub(super) fn active_days(&self) -> Option<(u64, u64)> {
        self.days
            .first_key_value()
            .zip(self.days.last_key_value())
            .map(|((&low, _), (&high, _))| (low, high))
    }

    /// The event partitions (buckets) of every day this meta knows of: where a generation's
    /// live rows are.
    pub(crate) fn known_buckets(&self) -> BTreeSet<i64> {
        self.days
            .keys()
            .chain(self.proof_max_seq.keys())
            .chain(self.proof_expires_at.keys())
            .map(|&day| super::schema::event_bucket(stored(day)))
            .collect()
    }
}

/// A stored `bigint` as the unsigned value the rules use (a negative one can only come from
/// damage, and reads as 0).
pub(super) fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// An unsigned value as the `bigint` it is stored as (every value the rules produce fits: seqs
/// stop at 16 digits, days and seconds at year 9999).
pub(super) fn stored(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn unsigned_map(map: Option<BTreeMap<i64, i64>>) -> BTreeMap<u64, u64> {
    map.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (unsigned(k), unsigned(v)))
        .collect()
}

/// The repair fence as stored: who holds it and until when (seconds of the store's clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fence {
    pub holder: String,
    pub until: u64,
}

impl Fence {
    pub(super) fn live(&self, now: u64) -> bool {
        now < self.until
    }
}

/// One slot: a generation of the user's mailboxes (the live one or a repair's staging copy).
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    /// `None`: the slot has no meta row (never written since it was last reset).
    pub generation: Option<i64>,
    /// The user's current epoch in this slot; `None` for a user never written.
    pub epoch: Option<i64>,
    pub meta: Meta,
}

/// One consistent read of a user's partition.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    /// The commit point; `None` before the partition's first commit.
    pub version: Option<i64>,
    pub live_slot: i32,
    pub fence: Option<Fence>,
    pub slots: [Slot; 2],
    /// Identity rows read with the snapshot: (slot, seq) -> the row.
    pub identities: BTreeMap<(i32, i64), Identity>,
}

/// An identity row: the seq's day expiry, the key of its event rows, and the log position its
/// stored version was written from (SPEC 7.2; `None` for a write without one, or a row an older
/// release wrote). The row's TTL is the day's expiry, so the position lives and dies with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub expires_at: i64,
    pub digest: i64,
    pub source: Option<SourcePosition>,
    /// The write that made the version (`model::written`), when it had a token.
    pub mark: Option<crate::model::WriteMark>,
}

impl Snapshot {
    pub(crate) fn staging_slot(&self) -> i32 {
        1 - self.live_slot
    }

    pub(super) fn slot(&self, slot: i32) -> &Slot {
        &self.slots[slot_index(slot)]
    }

    /// The identity of `seq` in `slot` (its expiry and digest), if its row was read and has not
    /// expired.
    pub(crate) fn live_identity(&self, slot: i32, seq: i64, now: u64) -> Option<(u64, i64)> {
        self.identities
            .get(&(slot, seq))
            .map(|identity| (unsigned(identity.expires_at), identity.digest))
            .filter(|(expires_at, _)| *expires_at > now)
    }

    /// The log position of `seq`'s stored version in `slot`, if its identity row was read.
    pub(crate) fn identity_source(&self, slot: i32, seq: i64) -> Option<&SourcePosition> {
        self.identities
            .get(&(slot, seq))
            .and_then(|identity| identity.source.as_ref())
    }

    /// The mark of the write that made `seq`'s stored version in `slot` (`model::written`).
    pub(crate) fn identity_mark(&self, slot: i32, seq: i64) -> Option<crate::model::WriteMark> {
        self.identities
            .get(&(slot, seq))
            .and_then(|identity| identity.mark)
    }

    /// Decides which slot a writer may change, or why it may not (SPEC 7.1).
    pub(crate) fn admit(&self, writer: Writer<'_>, now: u64) -> Result<Admission, StoreError> {
        match writer {
            Writer::Live => match &self.fence {
                Some(fence) if fence.live(now) => Err(StoreError::UnderRepair {
                    holder: fence.holder.clone(),
                }),
                lapsed => Ok(Admission {
                    slot: self.live_slot,
                    // A lapsed fence is cleared by the first live write that passes it, in the
                    // same commit: its holder can then never renew or swap over this write.
                    clear_fence: lapsed.is_some(),
                }),
            },
            Writer::Staging(token) => match &self.fence {
                Some(fence) if fence.holder == token.holder && fence.live(now) => Ok(Admission {
                    slot: self.staging_slot(),
                    clear_fence: false,
                }),
                _ => Err(fence_lost(token)),
            },
        }
    }
}

/// How a snapshot is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadAt {
    /// The plain consistency: no Paxos round. Enough to decide, because every write decided on
    /// it commits with `IF version = ?` and every write-free verdict is a state that was committed.
    Quorum,
    /// The serial consistency: a Paxos round that also finishes a commit left in flight.
    Serial,
}

/// Who writes: the daemon and the CLI write the live mailbox; a repair writes its staging copy.
#[derive(Debug, Clone, Copy)]
pub(super) enum Writer<'a> {
    Live,
    Staging(&'a RepairToken),
}

/// What [`Snapshot::admit`] grants.
#[derive(Debug, Clone, Copy)]
pub(super) struct Admission {
    pub slot: i32,
    pub clear_fence: bool,
}

pub(super) fn fence_lost(token: &RepairToken) -> StoreError {
    StoreError::FenceLost {
        detail: format!(
            "the repair fence of {} is no longer held by {} (its lease lapsed or another repair took it)",
            token.user.as_str(),
            token.holder
        ),
    }
}

pub(super) fn slot_index(slot: i32) -> usize {
    usize::from(slot == 1)
}

/// One row of a snapshot read; which columns are set depends on the row's kind.
#[derive(Debug, DeserializeRow)]
pub(super) struct PartitionRow {
    slot: i32,
    seq: i64,
    version: Option<i64>,
    live_slot: Option<i32>,
    fence_holder: Option<String>,
    fence_until: Option<i64>,
    generation: Option<i64>,
    epoch: Option<i64>,
    format_version: Option<i32>,
    expired_gap_boundary: Option<i64>,
    seqbucket_max_seq: Option<i64>,
    user_trim_seq: Option<i64>,
    days: Option<BTreeMap<i64, i64>>,
    proof_max_seq: Option<BTreeMap<i64, i64>>,
    proof_expires_at: Option<BTreeMap<i64, i64>>,
    expires_at: Option<i64>,
    digest: Option<i64>,
    source_position: Option<String>,
}

impl Snapshot {
    pub(crate) fn from_rows(rows: impl IntoIterator<Item = PartitionRow>) -> Self {
        let mut snapshot = Snapshot::default();
        for row in rows {
            match (row.slot, row.seq) {
                (USER_ROW_SLOT, 0) => {
                    snapshot.version = row.version;
                    snapshot.live_slot = i32::from(row.live_slot == Some(1));
                    snapshot.fence = match (row.fence_holder, row.fence_until) {
                        (Some(holder), Some(until)) => Some(Fence {
                            holder,
                            until: unsigned(until),
                        }),
                        // A holder without a lease (or the reverse) is a fence nobody can
                        // renew: treat it as lapsed at once.
                        (Some(holder), None) => Some(Fence { holder, until: 0 }),
                        _ => None,
                    };
                }
                (slot @ (0 | 1), 0) => {
                    snapshot.slots[slot_index(slot)] = Slot {
                        generation: row.generation,
                        epoch: row.epoch,
                        meta: Meta {
                            format_version: row.format_version,
                            expired_gap_boundary: unsigned(row.expired_gap_boundary.unwrap_or(0)),
                            seqbucket_max_seq: unsigned(row.seqbucket_max_seq.unwrap_or(0)),
                            user_trim_seq: unsigned(row.user_trim_seq.unwrap_or(0)),
                            days: unsigned_map(row.days),
                            proof_max_seq: unsigned_map(row.proof_max_seq),
                            proof_expires_at: unsigned_map(row.proof_expires_at),
                        },
                    };
                }
                (slot @ (0 | 1), seq) => {
                    if let Some(expires_at) = row.expires_at {
                        let (source, mark) = row
                            .source_position
                            .as_deref()
                            .map_or((None, None), crate::model::written::decode);
                        let identity = Identity {
                            expires_at,
                            digest: row.digest.unwrap_or(0),
                            source,
                            mark,
                        };
                        snapshot.identities.insert((slot, seq), identity);
                    }
                }
                _ => {}
            }
        }
        snapshot
    }
}

impl ScyllaStore {
    /// Reads the user row, both meta rows and the identity rows of `seqs` in one query.
    pub(super) async fn read_snapshot(
        &self,
        user: &str,
        seqs: &[i64],
        read: ReadAt,
    ) -> Result<Snapshot, StoreError> {
        let mut keys: Vec<i64> = Vec::with_capacity(seqs.len() + 1);
        keys.push(0);
        for &seq in seqs {
            if seq > 0 && !keys.contains(&seq) {
                keys.push(seq);
            }
        }
        let statement = match read {
            ReadAt::Quorum => &self.statements.snapshot,
            ReadAt::Serial => {
                self.count_paxos_round();
                &self.statements.snapshot_serial
            }
        };
        let result = self
            .session
            .execute_unpaged(statement, (user, keys))
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let decoded = rows
            .rows::<PartitionRow>()
            .map_err(cql::from)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(cql::from)?;
        Ok(Snapshot::from_rows(decoded))
    }

    /// Whether `slot` holds any identity that has not expired by `now`.
    pub(super) async fn any_live_identity(
        &self,
        user: &str,
        slot: i32,
        now: u64,
    ) -> Result<bool, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.probe_live_identity,
                (user, slot, stored(now)),
            )
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        Ok(rows.rows_num() > 0)
    }

    /// Identity rows of `slot` with `after < seq <= until`: (seq, expires_at, digest), in seq
    /// order, read page by page (bounded by the live groups plus expired rows not yet purged).
    pub(super) async fn slot_identities(
        &self,
        user: &str,
        slot: i32,
        after: i64,
        until: i64,
    ) -> Result<Vec<(i64, i64, i64)>, StoreError> {
        const PAGE: i32 = 5_000;
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let rows = self.identity_chunk(user, slot, cursor, until, PAGE).await?;
            let seen = rows.len();
            for (seq, expires_at, digest) in rows {
                cursor = seq;
                if let Some(expires_at) = expires_at {
                    out.push((seq, expires_at, digest.unwrap_or(0)));
                }
            }
            if seen < PAGE as usize {
                return Ok(out);
            }
        }
    }

    /// One read of at most `limit` identity rows of `slot` with `after < seq <= until`, in seq
    /// order: (seq, expires_at, digest) as stored. The callers page with the last seq.
    pub(super) async fn identity_chunk(
        &self,
        user: &str,
        slot: i32,
        after: i64,
        until: i64,
        limit: i32,
    ) -> Result<Vec<(i64, Option<i64>, Option<i64>)>, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.slot_identities,
                (user, slot, after, until, limit),
            )
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let rows = rows
            .rows::<(i64, Option<i64>, Option<i64>)>()
            .map_err(cql::from)?;
        rows.map(|row| row.map_err(cql::from)).collect()
    }
}
