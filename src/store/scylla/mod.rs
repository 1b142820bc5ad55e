//! The Scylla backend over CQL (SPEC 4, 6 and 7.1); Apache Cassandra 5 speaks the same protocol.
//!
//! **One partition per user, one commit point.** Everything an operation decides on (the user's
//! epoch, the meta, the identity of a seq, the repair fence, which copy of the mailboxes is live)
//! lives in the user's `user_mailbox` partition ([`schema`]), so one query reads a consistent
//! snapshot of it and one conditional batch guarded by `IF version = ?` applies the decision
//! ([`commit`]). A lost race re-runs the operation on a fresh snapshot, so two writers can never
//! both win a seq.
//!
//! **Two slots.** The partition holds two copies of the user's mailboxes: the live slot and the
//! staging slot a repair rebuilds into (SPEC 7.1, [`repair`]). The swap is one commit that flips
//! `live_slot`, lifts the fence and deletes the replaced slot. Because every live write is
//! conditioned on the same version the fence and the swap advance, a live write either commits
//! before the fence (and is in the range the repair rebuilds) or fails with `UnderRepair`; it can
//! never commit into a copy the swap has replaced. `docs/decisions.md` has the full argument.
//!
//! **Event rows outside the commit point.** A group's events are written before the commit that
//! makes them visible, under the slot's `generation` and a `digest` of the group's content; readers
//! only read what a committed identity names. An interrupted append leaves rows nobody reads (they
//! expire with their day); its replay writes the very same rows and commits them. Work after a
//! commit (deleting a replaced digest, an old generation, rows below a trim) only removes rows no
//! reader can reach any more.
//!
//! Time is the store's [`Clock`]: rows whose day is expired by that clock are treated as gone even
//! before the server's TTL purges them; the fence's lease is measured by it too.

mod append;
mod commit;
mod decide;
mod dump;
mod failpoints;
pub mod grants;
mod inspect;
mod repair;
mod scan;
pub mod schema;
mod state;
mod statements;
mod store_marker;
mod tls;
mod truncate;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::response::query_result::QueryResult;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlValue, Row};

use crate::model::{
    AppendOutcome, Event, EventGroup, MailboxId, MailboxInspection, PromoteOutcome,
    RetentionPolicy, ScanPage, ScanRequest, StoreError, TruncateOutcome,
};
use crate::store::classify::cql;
use crate::store::{Clock, MailboxStore, PhaseHook, RepairToken, SwapReport};

use state::{ReadAt, Writer};
use statements::Statements;

const BACKEND: &str = "scylla";

/// How many times an operation re-runs after losing its commit to a concurrent writer before it
/// reports the mailbox as unavailable (transient; the caller retries later).
const MAX_ATTEMPTS: usize = 32;

/// Appends one store holds in flight unless configured otherwise
/// (`store.scylla.max_in_flight_appends`).
pub const DEFAULT_APPENDS_IN_FLIGHT: usize = 512;

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
    /// Consistency of reads, plain writes and the commit phase of lightweight transactions
    /// (default LOCAL_QUORUM; never weaker, see `Config::validate`).
    pub consistency: Consistency,
    /// Consistency of the lightweight transactions' conditions, and of the snapshot reads that
    /// follow a lost condition or confirm a corrupt verdict.
    pub serial_consistency: SerialConsistency,
    pub connect_timeout: Duration,
    /// The datacenter to route every request to (`LOCAL_*` consistency is relative to the
    /// coordinator's datacenter); `None`: no preference.
    pub local_dc: Option<String>,
    /// Most appends in flight at once (`store.scylla.max_in_flight_appends`): see
    /// [`MailboxStore::max_appends_in_flight`].
    pub max_in_flight_appends: usize,
    /// Client-to-node TLS; `None`: plain connections.
    pub tls: Option<ScyllaTls>,
    /// Create what the schema lacks at connect (needs DDL grants); `false`: refuse instead, and
    /// leave creating it to `materializer schema apply` run with a schema role.
    pub create_schema: bool,
}

/// TLS to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScyllaTls {
    /// PEM CA file the nodes' certificates must chain to; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and its private key, for client authentication.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Verify each node's certificate: its chain and its IP address (the driver connects to the
    /// addresses the cluster reports).
    pub verify: bool,
}

impl std::fmt::Debug for ScyllaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaSettings")
            .field("nodes", &self.nodes)
            .field("keyspace", &self.keyspace)
            .field("username", &self.username)
            .field("local_dc", &self.local_dc)
            .field("max_in_flight_appends", &self.max_in_flight_appends)
            .field("tls", &self.tls)
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
            local_dc: None,
            max_in_flight_appends: DEFAULT_APPENDS_IN_FLIGHT,
            tls: None,
            create_schema: true,
        }
    }
}

/// What the caller of one attempt does next.
enum Attempt<T> {
    Done(Result<T, StoreError>),
    /// A concurrent writer committed first: re-read and decide again.
    Retry,
}

/// The Scylla backend.
pub struct ScyllaStore {
    session: Arc<Session>,
    statements: Statements,
    settings: ScyllaSettings,
    policy: RetentionPolicy,
    clock: Arc<dyn Clock>,
    /// Injected failures and commit hooks (feature `failpoints`, tests only).
    failpoints: failpoints::Failpoints,
    after_scan_read: Mutex<Option<PhaseHook>>,
    /// Lightweight transactions and `SERIAL` reads sent: each costs the cluster a Paxos round.
    paxos_rounds: AtomicU64,
    /// Day buckets compacted by commits that were applied.
    promoted: crate::store::PromotedBuckets,
    /// What this process knows of the keyspace's store marker (SPEC 7.3).
    marker: store_marker::MarkerState,
}

impl std::fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("settings", &self.settings)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

use crate::locks::lock;

/// FNV-1a over the canonical content of a group (`created_at`, then each event's ordinal and
/// payload in ordinal order): the key of its event rows. Stable across processes and versions, so
/// a replay of the same content writes the very same rows.
fn digest(created_at: u64, events: &[&Event]) -> i64 {
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

/// Seconds from `now` until `expires_at`, as a CQL TTL (at least 1).
fn ttl_until(expires_at: u64, now: u64) -> i32 {
    expires_at.saturating_sub(now).clamp(1, i32::MAX as u64) as i32
}

/// Whether a lightweight transaction applied (its first column, `[applied]`).
fn applied(result: &QueryResult) -> Result<bool, StoreError> {
    let rows = result.clone().into_rows_result().map_err(cql::from)?;
    let first: Option<Row> = rows.maybe_first_row::<Row>().map_err(cql::from)?;
    Ok(matches!(
        first.and_then(|r| r.columns.into_iter().next().flatten()),
        Some(CqlValue::Boolean(true))
    ))
}

impl ScyllaStore {
    /// Connects, checks the schema (a mismatched one is refused; a missing keyspace, table or
    /// column is created only when `create_schema` allows it, else refused naming what is
    /// missing), and prepares every statement. A complete schema costs no DDL statement, so a
    /// role without DDL grants runs against it (`materializer schema apply` creates it).
    pub async fn connect(
        settings: ScyllaSettings,
        policy: RetentionPolicy,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let session = open_session(&settings).await?;
        let missing = schema::missing(&session, &settings.keyspace).await?;
        if !missing.is_empty() {
            if !settings.create_schema {
                return Err(schema::incomplete(&settings.keyspace, &missing));
            }
            schema::apply(&session, &settings, &missing).await?;
            let still = schema::missing(&session, &settings.keyspace).await?;
            if !still.is_empty() {
                return Err(schema::incomplete(&settings.keyspace, &still));
            }
        }
        let statements = statements::prepare_all(&session, &settings).await?;
        Ok(Self {
            session: Arc::new(session),
            statements,
            settings,
            policy,
            clock,
            failpoints: failpoints::Failpoints::default(),
            after_scan_read: Mutex::new(None),
            paxos_rounds: AtomicU64::new(0),
            promoted: Default::default(),
            marker: Default::default(),
        })
    }

    pub fn keyspace(&self) -> &str {
        &self.settings.keyspace
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Installs (or clears) the hook run between a scan's reads and its post-read check.
    pub fn set_after_scan_read_hook(&self, hook: Option<PhaseHook>) {
        *lock(&self.after_scan_read) = hook;
    }

    /// Paxos rounds this handle has asked the cluster for (lightweight transactions and
    /// `SERIAL` reads): what the store's operations cost the cluster beyond plain reads and writes.
    pub fn paxos_rounds(&self) -> u64 {
        self.paxos_rounds.load(Ordering::Relaxed)
    }

    fn count_paxos_round(&self) {
        self.paxos_rounds.fetch_add(1, Ordering::Relaxed);
    }

    fn tick_failpoint(&self) -> Result<(), StoreError> {
        self.failpoints.after_write()
    }

    fn now(&self) -> u64 {
        self.clock.now_secs()
    }

    /// One plain (unconditional) write, counted by the failpoint.
    async fn write(
        &self,
        statement: &scylla::statement::prepared::PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<QueryResult, StoreError> {
        let result = self
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(cql::from)?;
        self.tick_failpoint()?;
        Ok(result)
    }

    /// Runs one attempt of an operation after another, each on a fresh snapshot and a fresh
    /// "now", until one is not overtaken by a concurrent commit ([`MAX_ATTEMPTS`] at most).
    ///
    /// The first attempt reads at `first` (plain quorum for the mailbox operations: no Paxos
    /// round). After a lost condition the next attempts read at the serial level, which finishes
    /// any commit left in flight, so contention converges. A corrupt verdict reached on a plain
    /// read is decided again on a serial one before it is returned: it blocks the mailbox, so it
    /// must not rest on anything but the latest committed state.
    async fn settle<T, F, Fut>(&self, first: ReadAt, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut(u64, ReadAt) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, StoreError>>,
    {
        let mut read = first;
        for _ in 0..MAX_ATTEMPTS {
            match attempt(self.now(), read).await {
                Ok(Attempt::Done(Err(StoreError::Corrupt { .. })))
                | Err(StoreError::Corrupt { .. })
                    if read == ReadAt::Quorum =>
                {
                    read = ReadAt::Serial;
                }
                Ok(Attempt::Done(result)) => return result,
                Ok(Attempt::Retry) => read = ReadAt::Serial,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            detail: "too much contention on the user's commit point".to_owned(),
        })
    }

    /// True when nobody committed since the snapshot at `expected`: a verdict built from that
    /// snapshot and a later read saw one committed state.
    async fn unchanged_since(&self, user: &str, expected: Option<i64>) -> Result<bool, StoreError> {
        Ok(self.read_snapshot(user, &[], ReadAt::Serial).await?.version == expected)
    }
}

/// A session to the cluster with the settings' credentials, TLS and routing; refuses a
/// `local_dc` no node belongs to.
async fn open_session(settings: &ScyllaSettings) -> Result<Session, StoreError> {
    let mut builder = SessionBuilder::new()
        .known_nodes(&settings.nodes)
        .connection_timeout(settings.connect_timeout);
    if let (Some(user), Some(password)) = (&settings.username, &settings.password) {
        builder = builder.user(user, password);
    }
    if let Some(tls) = &settings.tls {
        builder = builder.tls_context(Some(tls::context(tls)?));
    }
    if let Some(dc) = &settings.local_dc {
        // Only the local datacenter's nodes coordinate: a remote coordinator would make
        // LOCAL_QUORUM mean a quorum of its own datacenter.
        let policy = DefaultPolicy::builder()
            .prefer_datacenter(dc.clone())
            .permit_dc_failover(false)
            .build();
        let profile = ExecutionProfile::builder()
            .load_balancing_policy(policy)
            .build();
        builder = builder.default_execution_profile_handle(profile.into_handle());
    }
    let session = tokio::time::timeout(settings.connect_timeout * 2, builder.build())
        .await
        .map_err(|_| StoreError::Unavailable {
            backend: BACKEND,
            detail: format!("no CQL connection to {:?}", settings.nodes),
        })?
        .map_err(cql::from)?;
    if let Some(dc) = &settings.local_dc {
        check_datacenter(&session, dc)?;
    }
    Ok(session)
}

/// `materializer schema apply`: connects and creates or migrates the keyspace and tables (the
/// only code that sends DDL); returns what was missing before, empty when nothing was.
pub async fn apply_schema(settings: &ScyllaSettings) -> Result<Vec<String>, StoreError> {
    let session = open_session(settings).await?;
    let missing = schema::missing(&session, &settings.keyspace).await?;
    if !missing.is_empty() {
        schema::apply(&session, settings, &missing).await?;
        let still = schema::missing(&session, &settings.keyspace).await?;
        if !still.is_empty() {
            return Err(schema::incomplete(&settings.keyspace, &still));
        }
    }
    Ok(missing)
}

/// `materializer schema check`: what the schema lacks (empty when complete); a mismatched
/// column is an error.
pub async fn check_schema(settings: &ScyllaSettings) -> Result<Vec<String>, StoreError> {
    let session = open_session(settings).await?;
    schema::missing(&session, &settings.keyspace).await
}

/// Refuses a `local_dc` no node of the cluster belongs to: with datacenter-aware routing and no
/// failover, every request would find no node.
fn check_datacenter(session: &Session, dc: &str) -> Result<(), StoreError> {
    let state = session.get_cluster_state();
    let known: BTreeSet<&str> = state
        .get_nodes_info()
        .iter()
        .filter_map(|node| node.datacenter.as_deref())
        .collect();
    if known.contains(dc) {
        return Ok(());
    }
    Err(StoreError::Unavailable {
        backend: BACKEND,
        detail: format!(
            "store.scylla.local_dc {dc:?} names no datacenter of the cluster (its datacenters: {})",
            known.into_iter().collect::<Vec<_>>().join(", ")
        ),
    })
}

#[async_trait]
impl MailboxStore for ScyllaStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn max_appends_in_flight(&self) -> Option<usize> {
        Some(self.settings.max_in_flight_appends)
    }

    fn promoted_buckets_total(&self) -> u64 {
        self.promoted.total()
    }

    /// One snapshot read and one conditional commit per run (`decide.rs`), after the store
    /// marker's check (`store_marker.rs`).
    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        if !crate::store::one_mailbox(run) {
            return crate::store::append_one_by_one(self, run).await;
        }
        if let Err(e) = self.check_marker().await {
            return vec![Err(e)];
        }
        let answers = self.append_run_as(run, Writer::Live).await;
        if answers.iter().any(Result::is_ok) {
            self.note_written().await;
        }
        answers
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.check_marker().await?;
        let outcome = self.truncate_as(mailbox, before_seq, Writer::Live).await?;
        self.note_written().await;
        Ok(outcome)
    }

    async fn load_data_markers(&self) -> Result<Option<(u32, bool)>, StoreError> {
        self.load_marker().await.map(Some)
    }

    fn expect_data_everywhere(&self) {
        self.expect_marker();
    }

    async fn accept_data_loss(&self) -> Result<Option<u32>, StoreError> {
        self.accept_loss().await.map(Some)
    }

    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        self.scan_live(mailbox, request).await
    }

    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        self.promote_live(mailbox).await
    }

    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError> {
        self.inspect_live(mailbox).await
    }

    async fn repair_fence(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        self.begin_repair(token, lease).await
    }

    async fn repair_renew(&self, token: &RepairToken, lease: Duration) -> Result<(), StoreError> {
        self.renew_repair(token, lease).await
    }

    /// A repair's run is decided by the same body as a live one (`decide.rs`): one snapshot
    /// read and one conditional commit of the staging slot per run.
    async fn repair_append_run(
        &self,
        token: &RepairToken,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        if !crate::store::one_mailbox(run) {
            let staging = Writer::Staging(token);
            return crate::store::each_in_order(run, |group| self.append_as(group, staging)).await;
        }
        self.append_run_as(run, Writer::Staging(token)).await
    }

    async fn repair_truncate(
        &self,
        token: &RepairToken,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.truncate_as(mailbox, before_seq, Writer::Staging(token))
            .await
    }

    async fn repair_swap(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        self.swap_repair(token).await
    }

    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        self.abort_repair(token).await
    }

    async fn repair_collect_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        self.collect_repair_garbage(dry_run).await
    }

    /// One cheap query (the coordinator's `system.local`), bounded by a short timeout: fails
    /// while no node of the cluster answers.
    async fn ping(&self) -> Result<(), StoreError> {
        self.session
            .execute_unpaged(&self.statements.ping, ())
            .await
            .map_err(cql::from)?;
        Ok(())
    }

    /// The user row's fence, lapsed by the store's clock or not.
    async fn seq_positions(
        &self,
        mailbox: &MailboxId,
    ) -> Result<Vec<crate::store::SeqPosition>, StoreError> {
        self.seq_positions_live(mailbox).await
    }

    async fn fence_of(
        &self,
        user: &crate::model::UserId,
    ) -> Result<Option<crate::store::FenceView>, StoreError> {
        let snapshot = self
            .read_snapshot(user.as_str(), &[], ReadAt::Quorum)
            .await?;
        let now = self.now();
        Ok(snapshot
            .fence
            .filter(|f| f.until > now)
            .map(|f| crate::store::FenceView {
                holder: f.holder,
                lease_left_ms: (f.until - now) * 1000,
            }))
    }
}
