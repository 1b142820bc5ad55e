//! The CQL permissions the runtime role needs, and a probe that finds what a role lacks.
//!
//! The runtime role (the daemon and every command but `schema apply`) reads and writes the three
//! tables and reads `system_schema` (every role may): `SELECT` and `MODIFY` on the keyspace.
//! Lightweight transactions need both. The schema role (`materializer schema apply`) needs
//! `CREATE` on the keyspace an administrator created (`CREATE ON ALL KEYSPACES` when it creates
//! the keyspace itself) and `ALTER` on it (a column a newer release adds). The CQL block of
//! docs/grants.md is the list; a test runs the product with exactly it.
//!
//! The probe sends, per table, one conditional delete of a row that never exists (`IF EXISTS`):
//! the server checks `MODIFY` and `SELECT` before it evaluates the condition, the condition
//! fails, and nothing is written (no tombstone: an unapplied lightweight transaction writes
//! nothing).

use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

use super::ScyllaStore;
use crate::model::StoreError;
use crate::store::classify::cql;

/// The probe statement of each table: a conditional delete of a row that does not exist.
fn probes(keyspace: &str) -> [(&'static str, String); 3] {
    [
        (
            "user_mailbox",
            format!("DELETE FROM {keyspace}.user_mailbox WHERE user_id = 'grants-probe' AND slot = -2 AND seq = 0 IF EXISTS"),
        ),
        (
            "mailbox_events",
            format!("DELETE FROM {keyspace}.mailbox_events WHERE user_id = 'grants-probe' AND generation = -1 AND bucket = -1 AND seq = 0 AND digest = 0 AND ordinal = 0 IF EXISTS"),
        ),
        (
            "repair_registry",
            format!("DELETE FROM {keyspace}.repair_registry WHERE shard = -1 AND user_id = 'grants-probe' AND holder = 'grants-probe' IF EXISTS"),
        ),
    ]
}

/// The server's refusal text when `e` is an authorization error.
fn unauthorized(e: &ExecutionError) -> Option<String> {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::Unauthorized,
            message,
        )) => Some(message.clone()),
        _ => None,
    }
}

impl ScyllaStore {
    /// What the connected role may not do on the keyspace's tables (empty: nothing), each as
    /// the server's refusal, which names the permission and the table (`User r has no MODIFY
    /// permission on <table ks.user_mailbox> or any of its parents`).
    pub async fn missing_grants(&self) -> Result<Vec<String>, StoreError> {
        let mut missing = Vec::new();
        for (_, statement) in probes(self.keyspace()) {
            match self.session().query_unpaged(statement, ()).await {
                Ok(_) => {}
                Err(e) => match unauthorized(&e) {
                    Some(message) => missing.push(message),
                    None => return Err(cql::from(e)),
                },
            }
        }
        Ok(missing)
    }
}
