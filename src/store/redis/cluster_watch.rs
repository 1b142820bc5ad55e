//! A watch on the Redis Cluster client: a fresh client connection when the one in use stops
//! answering.
//!
//! The redis crate's cluster connection (1.8.1) re-reads its slot map on every `MOVED` it meets;
//! during a rebalance under load, in about one run in three of
//! `a_rebalance_onto_a_fourth_master_under_load_reports_every_outcome_once`, one of those
//! refreshes never finished, and from then on every request of the process timed out while the
//! cluster itself answered every other client: the daemon retried for ever without writing.
//! The watch probes the connection in use every [`PROBE_EVERY`] (a `PING`, bounded by the
//! command timeout); after [`FAILED_PROBES`] probes in a row without an answer it builds a
//! new connection from the same client (which reads the slot map afresh) and swaps it in.
//! Requests already waiting on the old connection time out and are retried by their callers on
//! the new one. When the cluster really is down, building fails and the old connection stays
//! (it recovers by itself once the cluster answers); the watch tries again after the next
//! failed probes. The task ends with the store.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::cluster::ClusterClient;

use super::Connection;

/// How often the connection in use is probed.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Probes in a row without an answer before the connection is replaced.
const FAILED_PROBES: u32 = 3;

/// The connection every request of the store uses: swapped as a whole by the watch.
pub(super) type Shared = Arc<RwLock<Connection>>;

/// The current connection (a cheap handle).
pub(super) fn current(shared: &Shared) -> Connection {
    shared
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Starts the watch of `shared`, a cluster connection built from `client`.
pub(super) fn spawn(client: ClusterClient, shared: &Shared, timeout: Duration, connect: Duration) {
    let weak: Weak<RwLock<Connection>> = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut failed = 0u32;
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let mut conn = current(&shared);
            let probe = tokio::time::timeout(
                timeout.saturating_mul(2),
                redis::cmd("PING").query_async::<redis::Value>(&mut conn),
            )
            .await;
            if matches!(probe, Ok(Ok(_))) {
                failed = 0;
                continue;
            }
            failed += 1;
            if failed < FAILED_PROBES {
                continue;
            }
            match tokio::time::timeout(connect, client.get_async_connection()).await {
                Ok(Ok(fresh)) => {
                    *shared
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Connection::Cluster(fresh);
                    failed = 0;
                    tracing::warn!(
                        "the Redis Cluster client stopped answering ({FAILED_PROBES} probes in a row); a fresh connection replaced it"
                    );
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the Redis Cluster does not answer; retrying the connection later")
                }
                Err(_) => {
                    tracing::warn!("the Redis Cluster does not answer within the connect timeout; retrying the connection later")
                }
            }
        }
    });
}
