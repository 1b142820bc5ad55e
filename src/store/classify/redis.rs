//! Classification of Redis errors (see the module above for the classes).

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{refused, transient};
use crate::model::StoreError;

const BACKEND: &str = "redis";

/// Classifies one error of the Redis client.
///
/// Deterministic (`Refused`): a Lua runtime error of a script (`user_script:<line>: ...`, Redis 7;
/// `Error running script`, Redis 6), including an error a command raised inside the script for
/// this input (`WRONGTYPE`, wrong arguments), and `CROSSSLOT`. The same input fails the same way
/// on every retry.
///
/// Transient (`Unavailable`): I/O (connection refused, reset, dropped), timeouts, `LOADING`,
/// `BUSY`, `TRYAGAIN`, `MOVED`/`ASK` left over after the cluster client's redirects,
/// `CLUSTERDOWN`, failover `READONLY`/`MASTERDOWN`, `NOSCRIPT` after the reload, `OOM` (memory
/// pressure passes), `NOREPLICAS`, and refused credentials or permissions (`NOAUTH`, `NOPERM`,
/// `WRONGPASS`: an operator fixes the ACL, and the records must wait for it rather than be
/// dead-lettered). An error `OOM`, `READONLY` or `BUSY` raised *inside* a script keeps its code
/// and is transient too.
pub fn classify(e: &RedisError) -> StoreError {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        return transient(BACKEND, e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::NoScript,
        ) => transient(BACKEND, e.to_string()),
        ErrorKind::Server(ServerErrorKind::ResponseError) if is_script_error(e) => {
            refused(BACKEND, e.to_string())
        }
        ErrorKind::Server(ServerErrorKind::CrossSlot) => refused(BACKEND, e.to_string()),
        ErrorKind::AuthenticationFailed => transient(BACKEND, e.to_string()),
        _ => match e.code() {
            Some(
                "BUSY" | "OOM" | "NOREPLICAS" | "NOTREADY" | "UNBLOCKED" | "NOAUTH" | "NOPERM"
                | "WRONGPASS" | "MISCONF",
            ) => transient(BACKEND, e.to_string()),
            Some("WRONGTYPE") => refused(BACKEND, e.to_string()),
            _ => {
                tracing::warn!(error = %e, "unclassified Redis error: treated as transient");
                transient(BACKEND, e.to_string())
            }
        },
    }
}

/// A Lua runtime error of one of our scripts: the same input fails the same way every time.
fn is_script_error(e: &RedisError) -> bool {
    let text = e.to_string();
    text.contains("user_script:") || text.contains("Error running script")
}

/// A script reply whose shape or code this build does not know. The scripts ship inside the
/// binary, so the same input gets the same reply again: deterministic, never retried forever.
pub fn unexpected_reply(detail: String) -> StoreError {
    tracing::error!(detail = %detail, "unexpected Redis script reply");
    refused(BACKEND, format!("unexpected script reply: {detail}"))
}

/// A write that fewer replicas acknowledged (`WAIT`) than `store.redis.wait_replicas` asks for:
/// transient. The write may or may not survive a failover, so it never counts as final; the
/// retry is an idempotent replay.
pub fn too_few_replicas(acks: i64, wanted: u32, timeout_ms: u64) -> StoreError {
    transient(
        BACKEND,
        format!(
            "WAIT: {acks} of {wanted} replicas acknowledged the write within {timeout_ms} ms; \
             it may not be durable"
        ),
    )
}

/// Convenience for `map_err`.
pub fn from(e: RedisError) -> StoreError {
    classify(&e)
}
