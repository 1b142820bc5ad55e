//! The Scylla backend over CQL (SPEC 4 and 6); Apache Cassandra 5 speaks the same protocol.
//!
//! Atomicity per mailbox comes from one commit point: the `version` static column of the
//! mailbox partition, advanced only by a lightweight transaction (`IF version = ?`). An operation
//! reads the meta, decides its outcome with the same rules as every backend, writes any event
//! rows first (idempotent, under a generation named by a hash of the group's content), then
//! commits meta and identity together in one conditional batch. A lost race re-runs the whole
//! operation on fresh state, so two writers can never both win a seq.
//!
//! Crash convergence: event rows written before a commit that never happened belong to a
//! generation no identity names, so no reader sees them; replaying the same input writes the same
//! rows (same generation) and commits them. Work after a commit (deleting a replaced generation,
//! an old epoch, rows below a trim) only removes rows readers no longer see.
//!
//! Time is the store's [`Clock`]: rows whose day is expired by that clock are treated as gone even
//! before the server's TTL purges them.

pub mod schema;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::response::query_result::QueryResult;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlValue, Row};

use crate::model::error::{ConflictKind, CorruptKind, CursorExpired, RejectKind};
use crate::model::validate::{validate_before_seq, validate_group, validate_scan};
use crate::model::{
    ActiveDay, AppendOutcome, Event, EventGroup, MailboxId, MailboxInspection, Payload,
    PromoteOutcome, RetentionPolicy, ScanPage, ScanRequest, ScannedGroup, StoreError,
    TruncateOutcome, UserId, DAY_SECS,
};
use crate::store::{Clock, MailboxStore, PhaseHook};

const BACKEND: &str = "scylla";
const FORMAT_VERSION: i32 = 4;

/// How many times an operation re-runs after losing its commit to a concurrent writer before it
/// reports the mailbox as unavailable (transient; the caller retries later).
const MAX_ATTEMPTS: usize = 32;

/// How to reach the cluster.
#[derive(Clone)]
pub struct ScyllaSettings {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    pub keyspace: String,
    /// The keyspace's replication map, used only when the keyspace is created.
    pub replication: String,
    /// Credentials, if the cluster requires them.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Consistency of reads and plain writes (default LOCAL_QUORUM).
    pub consistency: Consistency,
    /// Consistency of the lightweight transactions and the reads of the commit point.
    pub serial_consistency: SerialConsistency,
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for ScyllaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaSettings")
            .field("nodes", &self.nodes)
            .field("keyspace", &self.keyspace)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl ScyllaSettings {
    pub fn new(nodes: Vec<String>, keyspace: impl Into<String>) -> Self {
        Self {
            nodes,
            keyspace: keyspace.into(),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".to_owned(),
            username: None,
            password: None,
            consistency: Consistency::LocalQuorum,
            serial_consistency: SerialConsistency::Serial,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        detail: e.to_string(),
    }
}

/// The meta of one mailbox: the static columns of its partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Meta {
    format_version: Option<i32>,
    version: Option<i64>,
    expired_gap_boundary: i64,
    seqbucket_max_seq: i64,
    user_trim_seq: i64,
    /// The day set: day -> expires_at.
    days: BTreeMap<i64, i64>,
    proof_max_seq: BTreeMap<i64, i64>,
    proof_expires_at: BTreeMap<i64, i64>,
}

type MetaRow = (
    Option<i32>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<BTreeMap<i64, i64>>,
    Option<BTreeMap<i64, i64>>,
    Option<BTreeMap<i64, i64>>,
);

impl Meta {
    fn exists(&self) -> bool {
        self.format_version.is_some()
    }

    fn from_row(row: MetaRow) -> Self {
        let (format_version, version, boundary, sbmax, trim, days, pmax, pexp) = row;
        Self {
            format_version,
            version,
            expired_gap_boundary: boundary.unwrap_or(0),
            seqbucket_max_seq: sbmax.unwrap_or(0),
            user_trim_seq: trim.unwrap_or(0),
            days: days.unwrap_or_default(),
            proof_max_seq: pmax.unwrap_or_default(),
            proof_expires_at: pexp.unwrap_or_default(),
        }
    }

    fn check_format(&self) -> Result<(), StoreError> {
        match self.format_version {
            Some(v) if v != FORMAT_VERSION => {
                Err(StoreError::corrupt(CorruptKind::UnsupportedFormat {
                    found: v.to_string(),
                }))
            }
            _ => Ok(()),
        }
    }

    /// Promote phase 1 and 2 on this in-memory copy (SPEC 4.5): validates every expired day,
    /// then merges them. Returns the days compacted; on a bad proof nothing is changed.
    fn promote(&mut self, now: i64) -> Result<Vec<i64>, StoreError> {
        let mut boundary = self.expired_gap_boundary;
        let mut expired = Vec::new();
        for (&day, &score) in &self.days {
            if score > now {
                continue;
            }
            let bad = |what: String| {
                StoreError::corrupt(CorruptKind::BadProof {
                    detail: format!("expired day {day}: {what}"),
                })
            };
            let max_seq = *self
                .proof_max_seq
                .get(&day)
                .ok_or_else(|| bad("bucket_max_seq is missing".into()))?;
            let expires_at = *self
                .proof_expires_at
                .get(&day)
                .ok_or_else(|| bad("bucket_expires_at is missing".into()))?;
            if expires_at != score {
                return Err(bad(format!(
                    "bucket_expires_at {expires_at} disagrees with the day set score {score}"
                )));
            }
            if max_seq >= self.user_trim_seq {
                boundary = boundary.max(max_seq);
            }
            expired.push(day);
        }
        for day in &expired {
            self.days.remove(day);
            self.proof_max_seq.remove(day);
            self.proof_expires_at.remove(day);
        }
        self.expired_gap_boundary = boundary;
        Ok(expired)
    }

    fn check_cursor(&self, after: u64) -> Result<(), StoreError> {
        let trim = self.user_trim_seq as u64;
        if after.saturating_add(1) < trim {
            return Err(StoreError::CursorExpired {
                cursor: CursorExpired::Trimmed {
                    resume_after: trim - 1,
                },
            });
        }
        let boundary = self.expired_gap_boundary as u64;
        if after < boundary {
            return Err(StoreError::CursorExpired {
                cursor: CursorExpired::ExpiredGap { boundary },
            });
        }
        Ok(())
    }

    /// True when a non-expired proof covers a seq at or above the trim (SPEC 4.2.6).
    fn proves_live_groups(&self, now: i64) -> bool {
        self.proof_expires_at.iter().any(|(day, &e)| {
            e > now
                && self
                    .proof_max_seq
                    .get(day)
                    .is_some_and(|&m| m >= self.user_trim_seq)
        })
    }
}

/// What the caller of one attempt does next.
enum Attempt<T> {
    Done(Result<T, StoreError>),
    /// A concurrent writer committed first: re-read and decide again.
    Retry,
}

/// How the user's epoch row must change before the mailbox is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Establish {
    Nothing,
    Create,
    Move { from: i64 },
}

struct Statements {
    read_epoch: PreparedStatement,
    create_epoch: PreparedStatement,
    move_epoch: PreparedStatement,
    read_meta: PreparedStatement,
    read_identity: PreparedStatement,
    read_identities_desc: PreparedStatement,
    read_identities_all: PreparedStatement,
    scan_identities: PreparedStatement,
    read_group: PreparedStatement,
    read_events_range: PreparedStatement,
    insert_event: PreparedStatement,
    commit_meta: PreparedStatement,
    insert_identity: PreparedStatement,
    delete_identities_below: PreparedStatement,
    delete_identity: PreparedStatement,
    delete_mailbox: PreparedStatement,
    delete_events_day: PreparedStatement,
    delete_events_below: PreparedStatement,
    delete_events_gen: PreparedStatement,
}

/// The Scylla backend.
pub struct ScyllaStore {
    session: Arc<Session>,
    statements: Statements,
    settings: ScyllaSettings,
    policy: RetentionPolicy,
    clock: Arc<dyn Clock>,
    /// Writes left before an injected failure; negative when disarmed (tests only).
    failpoint: AtomicI64,
    after_scan_read: Mutex<Option<PhaseHook>>,
}

impl std::fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("settings", &self.settings)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// FNV-1a over the canonical content of a group: the generation of its event rows. Stable across
/// processes and versions, so a replay of the same content writes the very same rows.
fn generation(created_at: u64, events: &[&Event]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(&created_at.to_be_bytes());
    for e in events {
        feed(&e.event_ordinal.to_be_bytes());
        feed(e.payload.as_str().as_bytes());
        feed(&[0xff]);
    }
    hash as i64
}

fn applied(result: &QueryResult) -> Result<bool, StoreError> {
    let rows = result
        .clone()
        .into_rows_result()
        .map_err(|e| unavailable(format!("lightweight transaction reply: {e}")))?;
    let first: Option<Row> = rows
        .maybe_first_row::<Row>()
        .map_err(|e| unavailable(format!("lightweight transaction reply: {e}")))?;
    Ok(matches!(
        first.and_then(|r| r.columns.into_iter().next().flatten()),
        Some(CqlValue::Boolean(true))
    ))
}

impl ScyllaStore {
    /// Connects, creates the keyspace and tables if missing, refuses a mismatched schema, and
    /// prepares every statement.
    pub async fn connect(
        settings: ScyllaSettings,
        policy: RetentionPolicy,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let mut builder = SessionBuilder::new()
            .known_nodes(&settings.nodes)
            .connection_timeout(settings.connect_timeout);
        if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
            builder = builder.user(user, password);
        }
        let session = tokio::time::timeout(settings.connect_timeout * 2, builder.build())
            .await
            .map_err(|_| unavailable(format!("no CQL connection to {:?}", settings.nodes)))?
            .map_err(unavailable)?;
        let ks = &settings.keyspace;
        for statement in schema::create_statements(ks, &settings.replication) {
            session
                .query_unpaged(statement, ())
                .await
                .map_err(unavailable)?;
        }
        session
            .await_schema_agreement()
            .await
            .map_err(unavailable)?;
        check_schema(&session, ks).await?;
        let statements = prepare_all(&session, &settings).await?;
        Ok(Self {
            session: Arc::new(session),
            statements,
            settings,
            policy,
            clock,
            failpoint: AtomicI64::new(-1),
            after_scan_read: Mutex::new(None),
        })
    }

    pub fn keyspace(&self) -> &str {
        &self.settings.keyspace
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Makes the `n`-th write from now fail after it has been executed (n >= 1), aborting the
    /// operation there as a crash would; `None` disarms. For crash-convergence tests.
    pub fn arm_failpoint(&self, n: Option<u32>) {
        self.failpoint
            .store(n.map_or(-1, i64::from), Ordering::SeqCst);
    }

    /// Installs (or clears) the hook run between a scan's reads and its post-read check.
    pub fn set_after_scan_read_hook(&self, hook: Option<PhaseHook>) {
        *lock(&self.after_scan_read) = hook;
    }

    fn tick_failpoint(&self) -> Result<(), StoreError> {
        let left = self.failpoint.load(Ordering::SeqCst);
        if left < 0 {
            return Ok(());
        }
        let left = self.failpoint.fetch_sub(1, Ordering::SeqCst) - 1;
        if left == 0 {
            self.failpoint.store(-1, Ordering::SeqCst);
            return Err(unavailable("injected failure after a write (failpoint)"));
        }
        Ok(())
    }

    fn now(&self) -> i64 {
        self.clock.now_secs() as i64
    }

    fn day_of_expiry(&self, expires_at: i64) -> i64 {
        (expires_at / DAY_SECS as i64) - 1 - i64::from(self.policy.retention_days)
    }

    async fn write(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<QueryResult, StoreError> {
        let result = self
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(unavailable)?;
        self.tick_failpoint()?;
        Ok(result)
    }

    async fn read_epoch(&self, user: &UserId) -> Result<Option<i64>, StoreError> {
        let result = self
            .session
            .execute_unpaged(&self.statements.read_epoch, (user.as_str(),))
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        let row: Option<(Option<i64>,)> = rows.maybe_first_row().map_err(unavailable)?;
        Ok(row.and_then(|r| r.0))
    }

    async fn read_meta(&self, mb: &MailboxId) -> Result<Meta, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_meta,
                (mb.user_id.as_str(), i64::from(mb.epoch)),
            )
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        let row: Option<MetaRow> = rows.maybe_first_row().map_err(unavailable)?;
        Ok(row.map(Meta::from_row).unwrap_or_default())
    }

    /// The identity of `seq`, if its row exists: (expires_at, gen).
    async fn read_identity(
        &self,
        mb: &MailboxId,
        seq: i64,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_identity,
                (mb.user_id.as_str(), i64::from(mb.epoch), seq),
            )
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        let row: Option<(Option<i64>, Option<i64>)> =
            rows.maybe_first_row().map_err(unavailable)?;
        Ok(row.and_then(|(e, g)| Some((e?, g.unwrap_or(0)))))
    }

    /// Whether the identity index holds any live member (checked from the highest seqs down).
    async fn any_live_identity(&self, mb: &MailboxId, now: i64) -> Result<bool, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_identities_desc,
                (mb.user_id.as_str(), i64::from(mb.epoch)),
            )
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        for row in rows
            .rows::<(Option<i64>, Option<i64>)>()
            .map_err(unavailable)?
        {
            let (seq, expires_at) = row.map_err(unavailable)?;
            if seq.is_some() && expires_at.is_some_and(|e| e > now) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// All identity rows of a mailbox: (seq, expires_at, gen). Bounded by the live groups plus
    /// the not yet purged expired ones.
    async fn all_identities(&self, mb: &MailboxId) -> Result<Vec<(i64, i64, i64)>, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_identities_all,
                (mb.user_id.as_str(), i64::from(mb.epoch)),
            )
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        let mut out = Vec::new();
        for row in rows
            .rows::<(Option<i64>, Option<i64>, Option<i64>)>()
            .map_err(unavailable)?
        {
            if let (Some(seq), Some(e), g) = row.map_err(unavailable)? {
                out.push((seq, e, g.unwrap_or(0)));
            }
        }
        Ok(out)
    }

    /// The stored group of one generation: (created_at, events by ordinal).
    async fn read_group(
        &self,
        mb: &MailboxId,
        day: i64,
        seq: i64,
        gen: i64,
    ) -> Result<Option<(i64, Vec<(i32, String)>)>, StoreError> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.read_group,
                (mb.user_id.as_str(), i64::from(mb.epoch), day, seq, gen),
            )
            .await
            .map_err(unavailable)?;
        let rows = result.into_rows_result().map_err(unavailable)?;
        let mut created = None;
        let mut events = Vec::new();
        for row in rows
            .rows::<(i32, Option<i64>, Option<String>)>()
            .map_err(unavailable)?
        {
            let (ordinal, created_at, payload) = row.map_err(unavailable)?;
            created = created.or(created_at);
            events.push((ordinal, payload.unwrap_or_default()));
        }
        Ok(created.map(|c| (c, events)))
    }

    /// Runs the epoch row's lightweight transaction; false when another writer changed it.
    async fn establish(&self, mb: &MailboxId, establish: Establish) -> Result<bool, StoreError> {
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        match establish {
            Establish::Nothing => Ok(true),
            Establish::Create => {
                let r = self
                    .write(&self.statements.create_epoch, (user, epoch))
                    .await?;
                applied(&r)
            }
            Establish::Move { from } => {
                let old = self
                    .read_meta(&MailboxId::new(mb.user_id.clone(), from as u32))
                    .await?;
                let r = self
                    .write(&self.statements.move_epoch, (epoch, user, from))
                    .await?;
                if !applied(&r)? {
                    return Ok(false);
                }
                // The old epoch is no longer readable; delete its rows (bounded: its partition
                // plus one events partition per day it knew).
                let days: BTreeSet<i64> = old
                    .days
                    .keys()
                    .chain(old.proof_max_seq.keys())
                    .chain(old.proof_expires_at.keys())
                    .copied()
                    .collect();
                for day in days {
                    self.write(&self.statements.delete_events_day, (user, from, day))
                        .await?;
                }
                self.write(&self.statements.delete_mailbox, (user, from))
                    .await?;
                Ok(true)
            }
        }
    }

    /// The commit point: writes the whole meta `next` if the stored version is still `expected`,
    /// together with the optional identity change, in one conditional batch.
    async fn commit(
        &self,
        mb: &MailboxId,
        expected: Option<i64>,
        next: &Meta,
        identity: IdentityChange,
    ) -> Result<bool, StoreError> {
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        let version = expected.unwrap_or(0) + 1;
        let meta_values = (
            version,
            next.expired_gap_boundary,
            next.seqbucket_max_seq,
            next.user_trim_seq,
            next.days.clone(),
            next.proof_max_seq.clone(),
            next.proof_expires_at.clone(),
            user,
            epoch,
            expected,
        );
        let mut batch = Batch::new(BatchType::Logged);
        batch.set_consistency(self.settings.consistency);
        batch.set_serial_consistency(Some(self.settings.serial_consistency));
        batch.append_statement(self.statements.commit_meta.clone());
        let result = match identity {
            IdentityChange::None => self
                .session
                .batch(&batch, (meta_values,))
                .await
                .map_err(unavailable)?,
            IdentityChange::Put {
                seq,
                expires_at,
                gen,
                ttl,
            } => {
                batch.append_statement(self.statements.insert_identity.clone());
                self.session
                    .batch(
                        &batch,
                        (meta_values, (user, epoch, seq, expires_at, gen, ttl)),
                    )
                    .await
                    .map_err(unavailable)?
            }
            IdentityChange::DeleteBelow(trim) => {
                batch.append_statement(self.statements.delete_identities_below.clone());
                self.session
                    .batch(&batch, (meta_values, (user, epoch, trim)))
                    .await
                    .map_err(unavailable)?
            }
        };
        self.tick_failpoint()?;
        applied(&result)
    }

    /// True when no commit happened since the meta was read at `expected`: the separate reads an
    /// operation made (meta, identity rows, group rows) then all saw one committed state, so a
    /// verdict that writes nothing (unchanged, conflict, corrupt) may be returned. Every commit
    /// advances the version, so a changed version means "decide again".
    async fn unchanged_since(
        &self,
        mb: &MailboxId,
        expected: Option<i64>,
    ) -> Result<bool, StoreError> {
        Ok(self.read_meta(mb).await?.version == expected)
    }

    /// Deletes identity rows whose day has expired (promote's "drop expired identity members");
    /// runs after a promote commit, and only removes rows no reader uses any more.
    async fn drop_expired_identities(&self, mb: &MailboxId, now: i64) -> Result<(), StoreError> {
        for (seq, expires_at, _) in self.all_identities(mb).await? {
            if expires_at <= now {
                self.write(
                    &self.statements.delete_identity,
                    (mb.user_id.as_str(), i64::from(mb.epoch), seq),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Commits a promote that changed the meta, for an operation that writes nothing else.
    /// `Ok(false)` means a concurrent writer won and the operation must re-run.
    async fn commit_promote_only(
        &self,
        mb: &MailboxId,
        expected: Option<i64>,
        meta: &Meta,
        promoted: &[i64],
        now: i64,
    ) -> Result<bool, StoreError> {
        if promoted.is_empty() {
            return Ok(true);
        }
        if !self
            .commit(mb, expected, meta, IdentityChange::None)
            .await?
        {
            return Ok(false);
        }
        self.drop_expired_identities(mb, now).await?;
        Ok(true)
    }

    async fn write_events(
        &self,
        mb: &MailboxId,
        rows: &GroupRows,
        events: &[&Event],
    ) -> Result<(), StoreError> {
        let GroupRows {
            day,
            seq,
            gen,
            created_at,
            ttl,
        } = *rows;
        let user = mb.user_id.as_str();
        let epoch = i64::from(mb.epoch);
        // One partition; small groups go in one unlogged batch, large ones row by row so no
        // batch approaches the server's batch size limit.
        let total: usize = events.iter().map(|e| e.payload.len()).sum();
        if events.len() <= 16 && total <= 16 * 1024 {
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_consistency(self.settings.consistency);
            let mut values = Vec::with_capacity(events.len());
            for e in events {
                batch.append_statement(self.statements.insert_event.clone());
                values.push((
                    user,
                    epoch,
                    day,
                    seq,
                    gen,
                    e.event_ordinal as i32,
                    created_at,
                    e.payload.as_str(),
                    ttl,
                ));
            }
            self.session
                .batch(&batch, values)
                .await
                .map_err(unavailable)?;
            self.tick_failpoint()?;
        } else {
            for e in events {
                self.write(
                    &self.statements.insert_event,
                    (
                        user,
                        epoch,
                        day,
                        seq,
                        gen,
                        e.event_ordinal as i32,
                        created_at,
                        e.payload.as_str(),
                        ttl,
                    ),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn try_append(
        &self,
        group: &EventGroup,
        now: i64,
    ) -> Result<Attempt<AppendOutcome>, StoreError> {
        let mb = &group.mailbox;
        let seq = group.mailbox_seq as i64;
        let day = group.day() as i64;
        let expires_at = self.policy.expires_at(group.day()) as i64;
        let epoch = i64::from(mb.epoch);

        // 3. Epoch; the change is applied only when something is written.
        let establish = match self.read_epoch(&mb.user_id).await? {
            Some(current) if epoch < current => {
                return Ok(Attempt::Done(Ok(AppendOutcome::StaleEpoch)))
            }
            Some(current) if epoch > current => Establish::Move { from: current },
            Some(_) => Establish::Nothing,
            None => Establish::Create,
        };

        // 4-5. Format, promote.
        let mut meta = self.read_meta(mb).await?;
        meta.check_format()?;
        let expected = meta.version;
        let promoted = if meta.exists() {
            meta.promote(now)?
        } else {
            Vec::new()
        };

        // 6. Integrity.
        let identity = self.read_identity(mb, seq).await?.filter(|(e, _)| *e > now);
        if identity.is_none() {
            let needs_index = (meta.exists() && meta.proves_live_groups(now)) || !meta.exists();
            if needs_index {
                let index_exists = self.any_live_identity(mb, now).await?;
                let verdict = if meta.exists() && !index_exists {
                    Some(CorruptKind::IndexLost)
                } else if !meta.exists() && index_exists {
                    Some(CorruptKind::MetaLost)
                } else {
                    None
                };
                if let Some(kind) = verdict {
                    if !self.unchanged_since(mb, expected).await? {
                        return Ok(Attempt::Retry);
                    }
                    return Ok(Attempt::Done(Err(StoreError::corrupt(kind))));
                }
            }
        }

        // Outcomes that write nothing but promote's changes.
        macro_rules! finish {
            ($result:expr) => {{
                if promoted.is_empty() {
                    if !self.unchanged_since(mb, expected).await? {
                        return Ok(Attempt::Retry);
                    }
                } else if !self
                    .commit_promote_only(mb, expected, &meta, &promoted, now)
                    .await?
                {
                    return Ok(Attempt::Retry);
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
        let gen = generation(group.created_at, &events);
        let ttl = (expires_at - now).clamp(1, i64::from(i32::MAX)) as i32;
        let rows = GroupRows {
            day,
            seq,
            gen,
            created_at: group.created_at as i64,
            ttl,
        };

        // 8. Identity lookup.
        if let Some((existing_expires_at, existing_gen)) = identity {
            if existing_expires_at != expires_at {
                finish!(Err(StoreError::Conflict {
                    kind: ConflictKind::CrossDay {
                        existing_day: self.day_of_expiry(existing_expires_at) as u64,
                        incoming_day: day as u64,
                    },
                }));
            }
            let stored = self.read_group(mb, day, seq, existing_gen).await?;
            let same = stored.as_ref().is_some_and(|(created_at, stored_events)| {
                *created_at == group.created_at as i64
                    && stored_events.len() == events.len()
                    && stored_events
                        .iter()
                        .zip(&events)
                        .all(|((o, p), e)| *o == e.event_ordinal as i32 && p == e.payload.as_str())
            });
            if same {
                finish!(Ok(AppendOutcome::Unchanged));
            }
            self.write_events(mb, &rows, &events).await?;
            let put = IdentityChange::Put {
                seq,
                expires_at,
                gen,
                ttl,
            };
            if !self.commit(mb, expected, &meta, put).await? {
                return Ok(Attempt::Retry);
            }
            if !promoted.is_empty() {
                self.drop_expired_identities(mb, now).await?;
            }
            if existing_gen != gen {
                self.write(
                    &self.statements.delete_events_gen,
                    (mb.user_id.as_str(), epoch, day, seq, existing_gen),
                )
                .await?;
            }
            return Ok(Attempt::Done(Ok(AppendOutcome::Replaced)));
        }

        if expires_at <= now {
            if !self.establish(mb, establish).await? {
                return Ok(Attempt::Retry);
            }
            meta.format_version = Some(FORMAT_VERSION);
            meta.expired_gap_boundary = meta.expired_gap_boundary.max(seq);
            if !self
                .commit(mb, expected, &meta, IdentityChange::None)
                .await?
            {
                return Ok(Attempt::Retry);
            }
            if !promoted.is_empty() {
                self.drop_expired_identities(mb, now).await?;
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

        // Insert: epoch row, event rows, then the commit of meta and identity together.
        if !self.establish(mb, establish).await? {
            return Ok(Attempt::Retry);
        }
        self.write_events(mb, &rows, &events).await?;
        meta.format_version = Some(FORMAT_VERSION);
        meta.days.insert(day, expires_at);
        let proof = meta.proof_max_seq.entry(day).or_insert(seq);
        *proof = (*proof).max(seq);
        meta.proof_expires_at.insert(day, expires_at);
        meta.seqbucket_max_seq = meta.seqbucket_max_seq.max(seq);
        let put = IdentityChange::Put {
            seq,
            expires_at,
            gen,
            ttl,
        };
        if !self.commit(mb, expected, &meta, put).await? {
            return Ok(Attempt::Retry);
        }
        if !promoted.is_empty() {
            self.drop_expired_identities(mb, now).await?;
        }
        Ok(Attempt::Done(Ok(AppendOutcome::Inserted)))
    }

    async fn try_truncate(
        &self,
        mb: &MailboxId,
        before: i64,
        now: i64,
    ) -> Result<Attempt<TruncateOutcome>, StoreError> {
        let establish = match self.read_epoch(&mb.user_id).await? {
            None => Establish::Create,
            Some(current) if current != i64::from(mb.epoch) => {
                return Ok(Attempt::Done(Err(StoreError::EpochMismatch {
                    current: u32::try_from(current).ok(),
                })))
            }
            Some(_) => Establish::Nothing,
        };
        let mut meta = self.read_meta(mb).await?;
        meta.check_format()?;
        let expected = meta.version;
        let promoted = if meta.exists() {
            meta.promote(now)?
        } else {
            Vec::new()
        };
        let identities = self.all_identities(mb).await?;
        let index_exists = identities.iter().any(|(_, e, _)| *e > now);
        let verdict = if meta.exists() && !index_exists && meta.proves_live_groups(now) {
            Some(CorruptKind::IndexLost)
        } else if !meta.exists() && index_exists {
            Some(CorruptKind::MetaLost)
        } else {
            None
        };
        if let Some(kind) = verdict {
            if !self.unchanged_since(mb, expected).await? {
                return Ok(Attempt::Retry);
            }
            return Ok(Attempt::Done(Err(StoreError::corrupt(kind))));
        }
        let trim = meta.user_trim_seq.max(before);
        let removed_groups = identities
            .iter()
            .filter(|(seq, e, _)| *seq < trim && *e > now)
            .count() as u64;
        if !self.establish(mb, establish).await? {
            return Ok(Attempt::Retry);
        }
        meta.format_version = Some(FORMAT_VERSION);
        meta.user_trim_seq = trim;
        if !self
            .commit(mb, expected, &meta, IdentityChange::DeleteBelow(trim))
            .await?
        {
            return Ok(Attempt::Retry);
        }
        if !promoted.is_empty() {
            self.drop_expired_identities(mb, now).await?;
        }
        let days: BTreeSet<i64> = meta
            .days
            .keys()
            .chain(meta.proof_max_seq.keys())
            .copied()
            .collect();
        for day in days {
            self.write(
                &self.statements.delete_events_below,
                (mb.user_id.as_str(), i64::from(mb.epoch), day, trim),
            )
            .await?;
        }
        Ok(Attempt::Done(Ok(TruncateOutcome {
            user_trim_seq: trim as u64,
            removed_groups,
        })))
    }

    /// Reads the meta of the current mailbox for a scan, promoting (and committing that) first.
    /// `Ok(None)` means there is nothing to read.
    async fn scan_meta(
        &self,
        mb: &MailboxId,
        now: i64,
    ) -> Result<Attempt<Option<Meta>>, StoreError> {
        match self.read_epoch(&mb.user_id).await? {
            None => return Ok(Attempt::Done(Ok(None))),
            Some(current) if current != i64::from(mb.epoch) => {
                return Ok(Attempt::Done(Err(StoreError::EpochMismatch {
                    current: u32::try_from(current).ok(),
                })))
            }
            Some(_) => {}
        }
        let mut meta = self.read_meta(mb).await?;
        meta.check_format()?;
        if !meta.exists() {
            return Ok(Attempt::Done(Ok(None)));
        }
        let expected = meta.version;
        let promoted = meta.promote(now)?;
        if !self
            .commit_promote_only(mb, expected, &meta, &promoted, now)
            .await?
        {
            return Ok(Attempt::Retry);
        }
        if !promoted.is_empty() {
            meta.version = Some(expected.unwrap_or(0) + 1);
        }
        Ok(Attempt::Done(Ok(Some(meta))))
    }

    async fn scan_meta_settled(&self, mb: &MailboxId) -> Result<Option<Meta>, StoreError> {
        self.settle(|now| self.scan_meta(mb, now)).await
    }

    /// Runs one attempt of an operation after another, each on fresh state and a fresh "now",
    /// until one is not overtaken by a concurrent commit ([`MAX_ATTEMPTS`] at most).
    async fn settle<T, F, Fut>(&self, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut(i64) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, StoreError>>,
    {
        for _ in 0..MAX_ATTEMPTS {
            if let Attempt::Done(result) = attempt(self.now()).await? {
                return result;
            }
        }
        Err(unavailable(
            "too much contention on the mailbox's commit point",
        ))
    }

    async fn try_promote(
        &self,
        mailbox: &MailboxId,
        now: i64,
    ) -> Result<Attempt<PromoteOutcome>, StoreError> {
        if self.read_epoch(&mailbox.user_id).await? != Some(i64::from(mailbox.epoch)) {
            return Ok(Attempt::Done(Ok(PromoteOutcome::default())));
        }
        let mut meta = self.read_meta(mailbox).await?;
        meta.check_format()?;
        if !meta.exists() {
            return Ok(Attempt::Done(Ok(PromoteOutcome::default())));
        }
        let expected = meta.version;
        let promoted = meta.promote(now)?;
        if !self
            .commit_promote_only(mailbox, expected, &meta, &promoted, now)
            .await?
        {
            return Ok(Attempt::Retry);
        }
        Ok(Attempt::Done(Ok(PromoteOutcome {
            expired_days: promoted.len() as u32,
            expired_gap_boundary: meta.expired_gap_boundary as u64,
        })))
    }

    /// SPEC 4.4 step 6 over the identity index: live identities in `(after, until]` whose day is
    /// active, then their committed generation's event rows, day by day.
    async fn read_page(
        &self,
        mb: &MailboxId,
        meta: &Meta,
        request: &ScanRequest,
        now: i64,
    ) -> Result<(Vec<ScannedGroup>, bool), StoreError> {
        let limit = request.limit_groups as usize;
        let until = request
            .until_seq
            .map_or(i64::MAX, |u| u.min(i64::MAX as u64) as i64);
        let mut cursor = request.after_seq.min(i64::MAX as u64) as i64;
        let chunk = (limit as i32).saturating_mul(2).saturating_add(16);
        let mut selected: Vec<(i64, i64, i64)> = Vec::new(); // (seq, day, gen)
        'paging: loop {
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.scan_identities,
                    (
                        mb.user_id.as_str(),
                        i64::from(mb.epoch),
                        cursor,
                        until,
                        chunk,
                    ),
                )
                .await
                .map_err(unavailable)?;
            let rows = result.into_rows_result().map_err(unavailable)?;
            let mut seen = 0;
            for row in rows
                .rows::<(i64, Option<i64>, Option<i64>)>()
                .map_err(unavailable)?
            {
                let (seq, expires_at, gen) = row.map_err(unavailable)?;
                seen += 1;
                cursor = seq;
                let Some(expires_at) = expires_at.filter(|e| *e > now) else {
                    continue;
                };
                let day = self.day_of_expiry(expires_at);
                if !meta.days.contains_key(&day) {
                    continue;
                }
                selected.push((seq, day, gen.unwrap_or(0)));
                if selected.len() > limit {
                    break 'paging;
                }
            }
            if seen < chunk {
                break;
            }
        }
        let has_more = selected.len() > limit;
        selected.truncate(limit);

        // One read for every day of the page: the days' partitions, the page's seq range; rows of
        // generations no identity names are skipped.
        let mut groups: BTreeMap<i64, (i64, Vec<Event>)> = BTreeMap::new();
        if !selected.is_empty() {
            let days: Vec<i64> = selected
                .iter()
                .map(|s| s.1)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let low = selected.first().map_or(0, |s| s.0);
            let high = selected.last().map_or(0, |s| s.0);
            let wanted: BTreeSet<(i64, i64)> = selected.iter().map(|s| (s.0, s.2)).collect();
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.read_events_range,
                    (mb.user_id.as_str(), i64::from(mb.epoch), days, low, high),
                )
                .await
                .map_err(unavailable)?;
            let rows = result.into_rows_result().map_err(unavailable)?;
            for row in rows
                .rows::<(i64, i64, i32, Option<i64>, Option<String>)>()
                .map_err(unavailable)?
            {
                let (seq, gen, ordinal, created_at, payload) = row.map_err(unavailable)?;
                if !wanted.contains(&(seq, gen)) {
                    continue;
                }
                let payload = Payload::from_canonical(payload.as_deref().unwrap_or("null"))
                    .map_err(|e| {
                        StoreError::corrupt(CorruptKind::BadProof {
                            detail: format!("seq {seq}: payload is not JSON: {e}"),
                        })
                    })?;
                groups
                    .entry(seq)
                    .or_insert_with(|| (created_at.unwrap_or(0), Vec::new()))
                    .1
                    .push(Event {
                        event_ordinal: ordinal as u32,
                        payload,
                    });
            }
        }
        let page = selected
            .iter()
            .filter_map(|(seq, _, _)| {
                groups.remove(seq).map(|(created_at, events)| ScannedGroup {
                    mailbox_seq: *seq as u64,
                    created_at: created_at as u64,
                    events: events.into(),
                })
            })
            .collect();
        Ok((page, has_more))
    }

    /// Every row of `user` as JSON text, for tests that prove nothing changed: the epoch row,
    /// each epoch's partition (static meta with the commit version's write time, identity rows),
    /// and the events of every day in `days`.
    pub async fn dump_user(
        &self,
        user: &UserId,
        epochs: &[u32],
        days: &[u64],
    ) -> Result<String, StoreError> {
        let ks = &self.settings.keyspace;
        let mut out = String::new();
        let query = |cql: String| {
            let session = Arc::clone(&self.session);
            async move {
                let result = session.query_unpaged(cql, ()).await.map_err(unavailable)?;
                let rows = result.into_rows_result().map_err(unavailable)?;
                let mut text = String::new();
                for row in rows.rows::<Row>().map_err(unavailable)? {
                    text.push_str(&format!("{:?}\n", row.map_err(unavailable)?.columns));
                }
                Ok::<_, StoreError>(text)
            }
        };
        let u = user.as_str().replace('\'', "''");
        out.push_str(
            &query(format!(
                "SELECT epoch FROM {ks}.user_epoch WHERE user_id = '{u}'"
            ))
            .await?,
        );
        for epoch in epochs {
            out.push_str(
                &query(format!(
                    "SELECT seq, format_version, version, writetime(version), expired_gap_boundary, \
                     seqbucket_max_seq, user_trim_seq, days, proof_max_seq, proof_expires_at, \
                     expires_at, gen FROM {ks}.mailbox WHERE user_id = '{u}' AND epoch = {epoch}"
                ))
                .await?,
            );
            if !days.is_empty() {
                let list = days
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                out.push_str(
                    &query(format!(
                        "SELECT day, seq, gen, ordinal, created_at, payload FROM {ks}.mailbox_events \
                         WHERE user_id = '{u}' AND epoch = {epoch} AND day IN ({list})"
                    ))
                    .await?,
                );
            }
        }
        Ok(out)
    }
}

/// Where one generation of a group's event rows goes, and how long it lives.
#[derive(Debug, Clone, Copy)]
struct GroupRows {
    day: i64,
    seq: i64,
    gen: i64,
    created_at: i64,
    ttl: i32,
}

/// The identity part of a commit.
enum IdentityChange {
    None,
    Put {
        seq: i64,
        expires_at: i64,
        gen: i64,
        ttl: i32,
    },
    DeleteBelow(i64),
}

async fn check_schema(session: &Session, keyspace: &str) -> Result<(), StoreError> {
    let result = session
        .query_unpaged(
            "SELECT table_name, column_name, type FROM system_schema.columns WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await
        .map_err(unavailable)?;
    let rows = result.into_rows_result().map_err(unavailable)?;
    let mut found: BTreeMap<(String, String), String> = BTreeMap::new();
    for row in rows
        .rows::<(String, String, String)>()
        .map_err(unavailable)?
    {
        let (table, column, kind) = row.map_err(unavailable)?;
        found.insert((table, column), kind);
    }
    for (table, columns) in schema::EXPECTED {
        for (column, kind) in *columns {
            match found.get(&((*table).to_owned(), (*column).to_owned())) {
                Some(actual) if actual == kind => {}
                Some(actual) => {
                    return Err(unavailable(format!(
                        "schema mismatch in keyspace {keyspace}: {table}.{column} is {actual}, expected {kind}; \
                         use another keyspace or migrate it"
                    )))
                }
                None => {
                    return Err(unavailable(format!(
                        "schema mismatch in keyspace {keyspace}: {table}.{column} is missing; \
                         use another keyspace or migrate it"
                    )))
                }
            }
        }
    }
    Ok(())
}

async fn prepare_all(
    session: &Session,
    settings: &ScyllaSettings,
) -> Result<Statements, StoreError> {
    let ks = &settings.keyspace;
    let prepare = |cql: String, serial_read: bool| async move {
        let mut statement = session.prepare(cql).await.map_err(unavailable)?;
        statement.set_consistency(settings.consistency);
        statement.set_serial_consistency(Some(settings.serial_consistency));
        if serial_read {
            // Reads of the commit point see every committed lightweight transaction.
            statement.set_consistency(match settings.serial_consistency {
                SerialConsistency::Serial => Consistency::Serial,
                SerialConsistency::LocalSerial => Consistency::LocalSerial,
            });
        }
        Ok::<_, StoreError>(statement)
    };
    Ok(Statements {
        read_epoch: prepare(format!("SELECT epoch FROM {ks}.user_epoch WHERE user_id = ?"), true).await?,
        create_epoch: prepare(
            format!("INSERT INTO {ks}.user_epoch (user_id, epoch) VALUES (?, ?) IF NOT EXISTS"),
            false,
        )
        .await?,
        move_epoch: prepare(
            format!("UPDATE {ks}.user_epoch SET epoch = ? WHERE user_id = ? IF epoch = ?"),
            false,
        )
        .await?,
        read_meta: prepare(
            format!(
                "SELECT format_version, version, expired_gap_boundary, seqbucket_max_seq, user_trim_seq, \
                 days, proof_max_seq, proof_expires_at FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? LIMIT 1"
            ),
            true,
        )
        .await?,
        read_identity: prepare(
            format!("SELECT expires_at, gen FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? AND seq = ?"),
            true,
        )
        .await?,
        read_identities_desc: prepare(
            format!(
                "SELECT seq, expires_at FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? ORDER BY seq DESC LIMIT 100"
            ),
            false,
        )
        .await?,
        read_identities_all: prepare(
            format!("SELECT seq, expires_at, gen FROM {ks}.mailbox WHERE user_id = ? AND epoch = ?"),
            false,
        )
        .await?,
        scan_identities: prepare(
            format!(
                "SELECT seq, expires_at, gen FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? \
                 AND seq > ? AND seq <= ? LIMIT ?"
            ),
            false,
        )
        .await?,
        read_group: prepare(
            format!(
                "SELECT ordinal, created_at, payload FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND epoch = ? AND day = ? AND seq = ? AND gen = ?"
            ),
            false,
        )
        .await?,
        read_events_range: prepare(
            format!(
                "SELECT seq, gen, ordinal, created_at, payload FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND epoch = ? AND day IN ? AND seq >= ? AND seq <= ?"
            ),
            false,
        )
        .await?,
        insert_event: prepare(
            format!(
                "INSERT INTO {ks}.mailbox_events (user_id, epoch, day, seq, gen, ordinal, created_at, payload) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
            ),
            false,
        )
        .await?,
        commit_meta: prepare(
            format!(
                "UPDATE {ks}.mailbox SET version = ?, format_version = 4, expired_gap_boundary = ?, \
                 seqbucket_max_seq = ?, user_trim_seq = ?, days = ?, proof_max_seq = ?, proof_expires_at = ? \
                 WHERE user_id = ? AND epoch = ? IF version = ?"
            ),
            false,
        )
        .await?,
        insert_identity: prepare(
            format!(
                "INSERT INTO {ks}.mailbox (user_id, epoch, seq, expires_at, gen) VALUES (?, ?, ?, ?, ?) USING TTL ?"
            ),
            false,
        )
        .await?,
        delete_identities_below: prepare(
            format!("DELETE FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? AND seq < ?"),
            false,
        )
        .await?,
        delete_identity: prepare(
            format!("DELETE FROM {ks}.mailbox WHERE user_id = ? AND epoch = ? AND seq = ?"),
            false,
        )
        .await?,
        delete_mailbox: prepare(
            format!("DELETE FROM {ks}.mailbox WHERE user_id = ? AND epoch = ?"),
            false,
        )
        .await?,
        delete_events_day: prepare(
            format!("DELETE FROM {ks}.mailbox_events WHERE user_id = ? AND epoch = ? AND day = ?"),
            false,
        )
        .await?,
        delete_events_below: prepare(
            format!(
                "DELETE FROM {ks}.mailbox_events WHERE user_id = ? AND epoch = ? AND day = ? AND seq < ?"
            ),
            false,
        )
        .await?,
        delete_events_gen: prepare(
            format!(
                "DELETE FROM {ks}.mailbox_events WHERE user_id = ? AND epoch = ? AND day = ? AND seq = ? AND gen = ?"
            ),
            false,
        )
        .await?,
    })
}

#[async_trait]
impl MailboxStore for ScyllaStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        validate_group(group)?;
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
        self.settle(|now| self.try_append(group, now)).await
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        validate_before_seq(before_seq)?;
        self.settle(|now| self.try_truncate(mailbox, before_seq as i64, now))
            .await
    }

    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        validate_scan(&request)?;
        if request.until_seq.is_some_and(|u| u <= request.after_seq) {
            return Ok(ScanPage::empty(request.after_seq));
        }
        let Some(meta) = self.scan_meta_settled(mailbox).await? else {
            return Ok(ScanPage::empty(request.after_seq));
        };
        meta.check_cursor(request.after_seq)?;
        let (groups, more_than_limit) =
            self.read_page(mailbox, &meta, &request, self.now()).await?;

        let hook = lock(&self.after_scan_read).clone();
        if let Some(hook) = hook {
            hook().await;
        }
        match self.scan_meta_settled(mailbox).await? {
            Some(after) => after.check_cursor(request.after_seq)?,
            None => {
                return Err(StoreError::corrupt(CorruptKind::BadProof {
                    detail: "meta disappeared between the scan read and its check".to_owned(),
                }))
            }
        }

        let last = groups.last().map(|g| g.mailbox_seq);
        let (up_to, has_more) = if more_than_limit {
            (last.unwrap_or(request.after_seq), true)
        } else {
            let sbmax = meta.seqbucket_max_seq as u64;
            let bound = request.until_seq.map_or(sbmax, |u| u.min(sbmax));
            (bound.max(request.after_seq).max(last.unwrap_or(0)), false)
        };
        Ok(ScanPage {
            groups,
            up_to,
            has_more,
        })
    }

    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        self.settle(|now| self.try_promote(mailbox, now)).await
    }

    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError> {
        let now = self.now();
        let current_epoch = self
            .read_epoch(&mailbox.user_id)
            .await?
            .and_then(|e| u32::try_from(e).ok());
        let meta = self.read_meta(mailbox).await?;
        let identities = self.all_identities(mailbox).await?;
        // Like the Redis index key, whose TTL is its largest score: gone once nothing is live.
        let present = identities.iter().any(|(_, e, _)| *e > now);
        let mut active_days = BTreeMap::new();
        for day in meta
            .proof_max_seq
            .keys()
            .chain(meta.proof_expires_at.keys())
        {
            active_days.insert(
                *day as u64,
                ActiveDay {
                    max_seq: meta.proof_max_seq.get(day).copied().unwrap_or(0) as u64,
                    expires_at: meta.proof_expires_at.get(day).copied().unwrap_or(0) as u64,
                },
            );
        }
        Ok(MailboxInspection {
            format_version: meta.format_version.and_then(|v| u32::try_from(v).ok()),
            current_epoch,
            min_day: meta.days.keys().next().map(|&d| d as u64),
            max_day: meta.days.keys().next_back().map(|&d| d as u64),
            active_day_count: meta.days.len() as u32,
            active_days,
            expired_gap_boundary: meta.expired_gap_boundary as u64,
            seqbucket_max_seq: meta.seqbucket_max_seq as u64,
            user_trim_seq: meta.user_trim_seq as u64,
            identity_count: if present { identities.len() as u64 } else { 0 },
            identity_index_present: present,
        })
    }
}
