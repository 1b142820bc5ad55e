//! The one place where a backend's native errors are classified (SPEC 7, error classes).
//!
//! Every store error reaches the rest of the product as a [`StoreError`] whose variant is its
//! class, and the class decides the route (see `crate::disposition`):
//!
//! - **transient** — [`StoreError::Unavailable`]: the server could not be reached or asked us to
//!   come back (connection refused or reset, timeout, `LOADING`, `BUSY`, `TRYAGAIN`, failover
//!   `READONLY`/`MASTERDOWN`/`CLUSTERDOWN`, CQL unavailable / overloaded / write timeout, fewer
//!   replica acknowledgements than `wait_replicas`). Retried with backoff; readiness turns false.
//! - **deterministic** — [`StoreError::Refused`]: the server refused this input and will refuse it
//!   again (a Lua runtime error, a CQL invalid request, a value the backend cannot hold). Never
//!   retried: the delivery ends `rejected` with kind `store_refused` and is dead-lettered.
//! - **corrupt** — [`StoreError::Corrupt`]: decided by the store rules themselves (SPEC 4), not
//!   here; fails closed until a repair.
//!
//! When a native error is not recognised it is classified **transient**: retrying an error we
//! do not understand costs time, while dead-lettering it could drop a record that a healthy
//! server would have accepted. Each such case logs its text so it can be added here.

pub mod cql;
pub mod redis;

use crate::model::StoreError;

/// A transient error of `backend`.
pub(crate) fn transient(backend: &'static str, detail: impl Into<String>) -> StoreError {
    StoreError::Unavailable {
        backend,
        detail: detail.into(),
    }
}

/// A deterministic refusal of `backend`.
pub(crate) fn refused(backend: &'static str, detail: impl Into<String>) -> StoreError {
    StoreError::Refused {
        backend,
        detail: detail.into(),
    }
}
