//! Classification of Redis errors (see the module above for the classes).

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{refused, transient};
use crate::model::error::CorruptKind;
use crate::model::StoreError;

const BACKEND: &str = "redis";

/// Classifies one error of the Redis client (SPEC 7, error classes: *deterministic* is a verdict
/// about the record, never about the server).
///
/// Transient (`Unavailable`): I/O (connection refused, reset, dropped), timeouts, `LOADING`,
/// `BUSY`, `TRYAGAIN`, `MOVED`/`ASK` left over after the cluster client's redirects,
/// `CLUSTERDOWN`, failover `READONLY`/`MASTERDOWN`, `NOSCRIPT` after the reload, `OOM` (memory
/// pressure passes), `NOREPLICAS`, refused credentials or permissions (`NOAUTH`, `NOPERM`,
/// `WRONGPASS`: an operator fixes the ACL, and the records must wait for it rather than be
/// dead-lettered), and a client-side `CROSSSLOT` (a batch that mixed slots is a program error,
/// logged as one, never the record's fault). The same errors raised **inside a script** (an
/// ACL denial of a command the script calls, `OOM`, `READONLY`, `BUSY`, a script killed with
/// `SCRIPT KILL`) are transient too, whatever code the server wraps them in.
///
/// Corrupt: `WRONGTYPE`, in or out of a script: a stored value of the wrong type is damage to
/// the mailbox, which fails closed until a repair (the scripts' own checks of damaged values
/// answer with their reply codes instead).
///
/// Deterministic (`Refused`): any other Lua runtime error of a script (`user_script:<line>:
/// ...`, Redis 7; `Error running script`, Redis 6): the same input fails the same way on every
/// retry.
///
/// Nothing here depends on how the call was sent (alone, in a pipeline, before a `WAIT`).
pub fn classify(e: &RedisError) -> StoreError {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        return transient(BACKEND, e.to_string());
    }
    let text = e.to_string();
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
        ) => return transient(BACKEND, text),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => {
            tracing::error!(error = %text, "CROSSSLOT: a batch mixed Redis Cluster slots; a program error, the records are retried");
            return transient(BACKEND, text);
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::AuthenticationFailed => {
            return server_state(text)
        }
        _ => {}
    }
    match e.code() {
        Some(
            "BUSY" | "OOM" | "NOREPLICAS" | "NOTREADY" | "UNBLOCKED" | "NOAUTH" | "NOPERM"
            | "WRONGPASS" | "MISCONF",
        ) => return server_state(text),
        Some("WRONGTYPE") => return wrong_type(text),
        _ => {}
    }
    if is_script_error(&text) {
        if let Some(cause) = server_state_in_script(&text) {
            tracing::error!(error = %text, cause, "a script was stopped by the server's state, not by the record: retried");
            return transient(BACKEND, text);
        }
        if text.contains("WRONGTYPE") {
            return wrong_type(text);
        }
        return refused(BACKEND, text);
    }
    tracing::warn!(error = %text, "unclassified Redis error: treated as transient");
    transient(BACKEND, text)
}

/// A refusal that comes from the server's configuration or state (ACL, memory, credentials):
/// transient, and logged so an operator sees what to fix while the records wait.
fn server_state(text: String) -> StoreError {
    tracing::error!(error = %text, "Redis refused the call for a reason of its own (ACL, memory, credentials): retried until fixed");
    transient(BACKEND, text)
}

/// `WRONGTYPE`: a key of the mailbox holds a value of another type.
fn wrong_type(text: String) -> StoreError {
    StoreError::corrupt(CorruptKind::BadProof {
        detail: format!("a key of the mailbox holds a value of the wrong type: {text}"),
    })
}

/// What, in a script error's text, names a cause outside the record: the server wraps an error
/// that a command raised inside a script in its own text, so the cause is read from there.
fn server_state_in_script(text: &str) -> Option<&'static str> {
    const CAUSES: &[(&str, &str)] = &[
        ("can't run this command", "acl"),
        ("no permissions", "acl"),
        ("NOPERM", "acl"),
        ("OOM ", "oom"),
        ("used memory > 'maxmemory'", "oom"),
        ("Script killed", "script_killed"),
        ("READONLY", "readonly"),
        ("MASTERDOWN", "masterdown"),
        ("BUSY", "busy"),
        ("LOADING", "loading"),
        ("CLUSTERDOWN", "clusterdown"),
        ("TRYAGAIN", "tryagain"),
        ("MISCONF", "misconf"),
        ("NOREPLICAS", "noreplicas"),
    ];
    CAUSES
        .iter()
        .find(|(needle, _)| text.contains(needle))
        .map(|(_, cause)| *cause)
}

/// An error raised while one of our scripts ran.
fn is_script_error(text: &str) -> bool {
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
