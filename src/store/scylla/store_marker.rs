//! "This keyspace holds this product's data" on Scylla (SPEC 7.3, a wiped store): the Redis
//! backend's store markers (`redis::store_marker`) for a keyspace, so a keyspace dropped or
//! truncated and then created again empty (`schema apply`, `check-config --connect`, a connect
//! with `create_schema`, an operator's CQL) is told from a new one before writes go on in it.
//!
//! **The marker.** One row of `store_marker` (`id = 0`), written once by a process after its
//! first write that landed, never deleted by the product: it disappears only with the keyspace's
//! data.
//!
//! **The check, before every live write.** A process that knows the keyspace holds data (it read
//! the marker at start, wrote it since, or was told the store was wiped) reads the marker before
//! an append run or a truncate, at most once a second ([`VERIFY_EVERY`]): a marker that is
//! missing, or tables that are gone, answer `store_lost`. The write waits (transient, never
//! dead-lettered), readiness names the loss, and nothing is written in the empty keyspace until
//! an operator accepts the loss (`materializer accept-store-loss` writes the marker) or
//! rebuilds from the log (the daemon stopped, each partition replayed from the log's start by a
//! fresh process, whose writes put the marker back).
//!
//! **Cost and what it cannot see.** One quorum read of one row a second per process, whatever
//! the write rate. A keyspace lost and created again within one second of a verified read,
//! with no write failing in between (a write in that window finds the tables gone and waits),
//! is written to until the next read: at most a second of writes, found then. A keyspace that
//! lost rows but kept its marker is the per-key case (SPEC 7.3's first bullet), answered
//! `corrupt` by the mailbox's own checks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{ScyllaStore, BACKEND};
use crate::model::StoreError;
use crate::store::classify::cql;

/// How long a read of the marker vouches for the keyspace.
pub(super) const VERIFY_EVERY: Duration = Duration::from_secs(1);

/// What this process knows of the marker.
#[derive(Debug, Default)]
pub(super) struct MarkerState {
    /// The keyspace holds this product's data: its marker must exist.
    expected: AtomicBool,
    /// When the marker was last read present (ms since the Unix epoch; 0: never).
    verified_at_ms: AtomicU64,
}

impl MarkerState {
    fn expect(&self) {
        self.expected.store(true, Ordering::SeqCst);
    }

    fn verified(&self) {
        self.verified_at_ms
            .store(crate::wall_clock::now_ms(), Ordering::SeqCst);
    }
}

impl ScyllaStore {
    /// Whether `statement` (no values) answers any row.
    async fn any_row(
        &self,
        statement: &scylla::statement::prepared::PreparedStatement,
    ) -> Result<bool, StoreError> {
        let result = self
            .session
            .execute_unpaged(statement, ())
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        Ok(rows.rows_num() > 0)
    }

    /// Whether the marker row exists (plain consistency).
    async fn marker_present(&self) -> Result<bool, StoreError> {
        self.any_row(&self.statements.marker_read).await
    }

    /// Before a live write: `store_lost` when this process expects the marker and it is gone
    /// (or the tables are); nothing when it expects none, or read it within [`VERIFY_EVERY`].
    pub(super) async fn check_marker(&self) -> Result<(), StoreError> {
        let state = &self.marker;
        if !state.expected.load(Ordering::SeqCst) {
            return Ok(());
        }
        let age =
            crate::wall_clock::now_ms().saturating_sub(state.verified_at_ms.load(Ordering::SeqCst));
        if u128::from(age) < VERIFY_EVERY.as_millis() {
            return Ok(());
        }
        let lost = |what: &str| {
            StoreError::store_lost(
                BACKEND,
                format!(
                    "{what} in keyspace {}, which held this product's data: it was dropped or truncated (and perhaps created again empty); writes wait until an operator rebuilds from the log or runs `materializer accept-store-loss` (docs/operations.md)",
                    self.settings.keyspace
                ),
            )
        };
        match self.marker_present().await {
            Ok(true) => {
                state.verified();
                Ok(())
            }
            Ok(false) => Err(lost("the store marker is gone")),
            Err(e) if cql::is_missing_schema(&e.to_string()) => Err(lost("the tables are gone")),
            Err(e) => Err(e),
        }
    }

    /// After a live write that landed: the marker is written once, by the first such write of a
    /// process that did not know of it (a failed write is tried again by the next one).
    pub(super) async fn note_written(&self) {
        if self.marker.expected.load(Ordering::SeqCst) {
            return;
        }
        self.write_marker().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the store marker was not written (tried again with the next write)");
        });
    }

    async fn write_marker(&self) -> Result<(), StoreError> {
        let now = i64::try_from(crate::wall_clock::now_ms()).unwrap_or(i64::MAX);
        self.session
            .execute_unpaged(&self.statements.marker_write, (now,))
            .await
            .map_err(cql::from)?;
        self.marker.expect();
        self.marker.verified();
        Ok(())
    }

    /// At start: `(1, true)` with the marker (this process then expects it), else `(0, whether
    /// any user partition exists)`.
    pub(super) async fn load_marker(&self) -> Result<(u32, bool), StoreError> {
        if self.marker_present().await? {
            self.marker.expect();
            self.marker.verified();
            return Ok((1, true));
        }
        Ok((0, self.any_row(&self.statements.any_user).await?))
    }

    /// The store was found wiped at start: every live write waits for the marker.
    pub(super) fn expect_marker(&self) {
        self.marker.expect();
        self.marker.verified_at_ms.store(0, Ordering::SeqCst);
    }

    /// `accept-store-loss`: the marker written again.
    pub(super) async fn accept_loss(&self) -> Result<u32, StoreError> {
        self.write_marker().await?;
        Ok(1)
    }
}
