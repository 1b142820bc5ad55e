//! Classification of Redis errors (see the module above for the classes).

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{refused, transient};
use crate::model::StoreError;

const BACKEND: &str = "redis";

/// Classifies one error of the Redis client.
///
/// Deterministic: a script runtime error (`ERR user_script:...`, `ERR Error running script`),
/// a wrong-type or argument error the server answers for this input, an `OOM` refusal of a
/// script flagged `deny-oom` is *not* here — memory pressure passes, so it is transient.
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
        _ => match e.code() {
            Some("BUSY" | "OOM" | "NOREPLICAS" | "NOTREADY" | "UNBLOCKED") => {
                transient(BACKEND, e.to_string())
            }
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

/// Convenience for `map_err`.
pub fn from(e: RedisError) -> StoreError {
    classify(&e)
}
