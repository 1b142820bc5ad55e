//! Classification of CQL driver errors (see the module above for the classes).

use super::{refused, transient};
use crate::model::StoreError;

const BACKEND: &str = "scylla";

/// Classifies one error of the CQL driver from its rendered text.
///
/// Deterministic: the server's `Invalid` (invalid request), `SyntaxError`, `Unauthorized`,
/// `ConfigError` answers, and values the server cannot hold. Transient: everything about reaching
/// the cluster (`Unavailable`, `Overloaded`, `IsBootstrapping`, read/write timeouts and failures,
/// connection and pool errors).
pub fn classify(e: &dyn std::fmt::Display) -> StoreError {
    let text = e.to_string();
    let deterministic = [
        "Invalid query",
        "invalid request",
        "Syntax error",
        "InvalidRequest",
        "SyntaxError",
    ];
    if deterministic.iter().any(|needle| text.contains(needle)) {
        refused(BACKEND, text)
    } else {
        transient(BACKEND, text)
    }
}

/// Convenience for `map_err`.
pub fn from(e: impl std::fmt::Display) -> StoreError {
    classify(&e)
}
