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
pub(crate) fn unexpected_reply(detail: String) -> StoreError {
    tracing::error!(detail = %detail, "unexpected Redis script reply");
    refused(BACKEND, format!("unexpected script reply: {detail}"))
}

/// A batch whose command found no script even after the scripts were loaded again (a `SCRIPT
/// FLUSH` or a restart between the load and the resend), or whose pipeline answered fewer
/// replies than it sent: the server's state, never the record's, so transient — whether the
/// record came alone or in a batch (SPEC 7: no outcome depends on batching). Nothing of such
/// a command ran; the retry is an idempotent replay.
pub(crate) fn lost_in_flight(detail: &str) -> StoreError {
    transient(BACKEND, detail.to_owned())
}

/// A write that fewer replicas acknowledged (`WAIT`) than `store.redis.wait_replicas` asks for:
/// transient. The write may or may not survive a failover, so it never counts as final; the
/// retry is an idempotent replay.
pub(crate) fn too_few_replicas(acks: i64, wanted: u32, timeout_ms: u64) -> StoreError {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a real server sends for `line` (a RESP error line without the leading `-`).
    fn server_error(line: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("a RESP error line parses");
        value.extract_error().expect_err("an error reply")
    }

    fn class(e: &StoreError) -> &'static str {
        match e {
            StoreError::Unavailable { .. } => "transient",
            StoreError::Refused { .. } => "refused",
            StoreError::Corrupt { .. } => "corrupt",
            _ => "other",
        }
    }

    /// Every text below was copied from redis-server 7.0 (ACL user without `SET`, `maxmemory
    /// 1`, `SCRIPT KILL`, a list under a string command, `error()` in a script). SPEC 7: an
    /// error of the server's state is transient, a damaged value is corrupt, and only the
    /// record's own failure is a refusal.
    #[test]
    fn every_error_text_has_its_class() {
        let script = "script: bd6f3018b28bbdb36260f19d3c44afed740db987, on @user_script:1.";
        let table: &[(String, &str)] = &[
            (format!("ERR The user executing the script can't run this command or subcommand {script}"), "transient"),
            (format!("NOPERM User limited has no permissions to run the 'set' command {script}"), "transient"),
            ("NOPERM this user has no permissions to run the 'evalsha' command".to_owned(), "transient"),
            (format!("OOM command not allowed when used memory > 'maxmemory'. {script}"), "transient"),
            ("OOM command not allowed when used memory > 'maxmemory'.".to_owned(), "transient"),
            (format!("ERR Script killed by user with SCRIPT KILL... {script}"), "transient"),
            ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.".to_owned(), "transient"),
            (format!("READONLY You can't write against a read only replica. {script}"), "transient"),
            ("LOADING Redis is loading the dataset in memory".to_owned(), "transient"),
            ("TRYAGAIN Multiple keys request during rehashing of slot".to_owned(), "transient"),
            ("CLUSTERDOWN The cluster is down".to_owned(), "transient"),
            ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.".to_owned(), "transient"),
            ("NOSCRIPT No matching script. Please use EVAL.".to_owned(), "transient"),
            ("CROSSSLOT Keys in request don't hash to the same slot".to_owned(), "transient"),
            ("NOREPLICAS Not enough good replicas to write.".to_owned(), "transient"),
            ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.".to_owned(), "transient"),
            (format!("WRONGTYPE Operation against a key holding the wrong kind of value {script}"), "corrupt"),
            ("WRONGTYPE Operation against a key holding the wrong kind of value".to_owned(), "corrupt"),
            (format!("ERR user_script:1: boom {script}"), "refused"),
            ("ERR Error running script (call to f_abc): @user_script:12: attempt to compare nil with number".to_owned(), "refused"),
        ];
        for (text, want) in table {
            let got = classify(&server_error(text));
            assert_eq!(class(&got), *want, "{text} -> {got:?}");
        }
    }

    /// A cluster client's own refusal of a mixed-slot pipeline is a program error, never the
    /// record's verdict.
    #[test]
    fn client_side_crossslot_is_transient() {
        let e = RedisError::from((
            ErrorKind::Server(ServerErrorKind::CrossSlot),
            "Received crossed slots in pipeline",
        ));
        assert_eq!(class(&classify(&e)), "transient");
    }
}
