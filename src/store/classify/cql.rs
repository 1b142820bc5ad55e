//! Classification of CQL driver errors (see the module above for the classes), from the driver's
//! error enums rather than their text.
//!
//! - **Deterministic** ([`StoreError::Refused`]): the server answered that this request is wrong
//!   and always will be — `Invalid` (invalid request, e.g. a TTL above the server's limit),
//!   `SyntaxError`, `FunctionFailure`, `AlreadyExists` — or the driver refused to send values it
//!   cannot encode for the statement (`BadQuery`: serialization, a key too long, too many
//!   statements in a batch).
//! - **Transient** ([`StoreError::Unavailable`]): everything about reaching and loading the
//!   cluster — `Unavailable`, `Overloaded`, `IsBootstrapping`, read/write timeouts and failures,
//!   rate limits, broken or refused connections, empty query plans, client-side timeouts, schema
//!   agreement. Also the server's `Unauthorized`, `AuthenticationError` and `ConfigError`: they
//!   hold for every record alike (a grant or a setting is missing), so dead-lettering would drop
//!   the whole stream; retrying keeps it, with readiness false, until an operator fixes it.
//! - A reply the driver cannot decode (a row of an unexpected type) means the schema is not the
//!   one checked at start; it is transient too, for the same reason.

use scylla::errors::{
    BadQuery, DbError, DeserializationError, ExecutionError, IntoRowsResultError,
    MaybeFirstRowError, NewSessionError, PrepareError, RequestAttemptError, RowsError,
    SchemaAgreementError, TypeCheckError,
};

use super::{refused, transient};
use crate::model::StoreError;

const BACKEND: &str = "scylla";

/// The class of one driver error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Transient,
    Refused,
}

/// A driver error this module can classify.
pub trait CqlFailure: std::fmt::Display {
    fn class(&self) -> Class;
}

/// The class of a server error, from its code and, for `Invalid`, its message: an invalid
/// request that names a table or keyspace the server does not have ("unconfigured table",
/// "Keyspace ... does not exist") is about the server's schema, not the record (SPEC 7, error
/// classes): transient, so the records wait with readiness false until the schema is back.
pub(crate) fn db_error_class(error: &DbError, message: &str) -> Class {
    if matches!(error, DbError::Invalid) && is_missing_schema(message) {
        tracing::error!(error = %message, "the CQL server lacks the table or keyspace: records wait until the schema exists (`materializer schema apply` creates it; a keyspace that held data and is created again empty is a lost store: docs/operations.md)");
        return Class::Transient;
    }
    match error {
        DbError::Invalid
        | DbError::SyntaxError
        | DbError::FunctionFailure { .. }
        | DbError::AlreadyExists { .. } => Class::Refused,
        _ => Class::Transient,
    }
}

/// Whether an invalid-request message (or an error's text: the store marker's check tells a
/// dropped keyspace by it) names a missing table or keyspace.
pub(crate) fn is_missing_schema(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("unconfigured table")
        || lower.contains("unconfigured columnfamily")
        || (lower.contains("keyspace") && lower.contains("does not exist"))
        || lower.contains("non-existing keyspace")
        || (lower.contains("table") && lower.contains("does not exist"))
}

impl CqlFailure for RequestAttemptError {
    fn class(&self) -> Class {
        match self {
            RequestAttemptError::DbError(db, message) => db_error_class(db, message),
            RequestAttemptError::SerializationError(_)
            | RequestAttemptError::CqlRequestSerialization(_) => Class::Refused,
            _ => Class::Transient,
        }
    }
}

impl CqlFailure for ExecutionError {
    fn class(&self) -> Class {
        match self {
            ExecutionError::LastAttemptError(attempt) => attempt.class(),
            ExecutionError::BadQuery(
                BadQuery::SerializationError(_)
                | BadQuery::ValuesTooLongForKey(..)
                | BadQuery::TooManyQueriesInBatchStatement(_),
            ) => Class::Refused,
            ExecutionError::PrepareError(prepare) => prepare.class(),
            _ => Class::Transient,
        }
    }
}

impl CqlFailure for PrepareError {
    fn class(&self) -> Class {
        match self {
            PrepareError::AllAttemptsFailed { first_attempt } => first_attempt.class(),
            _ => Class::Transient,
        }
    }
}

impl CqlFailure for NewSessionError {
    fn class(&self) -> Class {
        // No node reached, a name that does not resolve, credentials refused: configuration or
        // reachability, never the input.
        Class::Transient
    }
}

macro_rules! transient_failures {
    ($($error:ty),* $(,)?) => {$(
        impl CqlFailure for $error {
            fn class(&self) -> Class {
                Class::Transient
            }
        }
    )*};
}

transient_failures!(
    SchemaAgreementError,
    IntoRowsResultError,
    RowsError,
    MaybeFirstRowError,
    DeserializationError,
    TypeCheckError,
);

/// Classifies one driver error.
pub fn classify(e: &impl CqlFailure) -> StoreError {
    match e.class() {
        Class::Refused => refused(BACKEND, e.to_string()),
        Class::Transient => transient(BACKEND, e.to_string()),
    }
}

/// Convenience for `map_err`.
pub fn from(e: impl CqlFailure) -> StoreError {
    classify(&e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server answers held to their class (texts as Apache Cassandra 5.0 and ScyllaDB word them).
    #[test]
    fn every_server_error_has_its_class() {
        let table: &[(DbError, &str, Class)] = &[
            (
                DbError::Invalid,
                "unconfigured table mailbox_users",
                Class::Transient,
            ),
            (
                DbError::Invalid,
                "Keyspace 'mm' does not exist",
                Class::Transient,
            ),
            (
                DbError::Invalid,
                "Keyspace mm does not exist",
                Class::Transient,
            ),
            (
                DbError::Invalid,
                "Can't use a non-existing keyspace",
                Class::Transient,
            ),
            (
                DbError::Invalid,
                "Table mm.events does not exist",
                Class::Transient,
            ),
            (
                DbError::Invalid,
                "ttl is too large. requested (700000000) maximum (630720000)",
                Class::Refused,
            ),
            (
                DbError::Invalid,
                "Key length of 70000 is longer than maximum of 65535",
                Class::Refused,
            ),
            (
                DbError::SyntaxError,
                "line 1:0 no viable alternative",
                Class::Refused,
            ),
            (
                DbError::Unauthorized,
                "User mm has no MODIFY permission",
                Class::Transient,
            ),
            (DbError::Overloaded, "overloaded", Class::Transient),
            (DbError::IsBootstrapping, "bootstrapping", Class::Transient),
            (
                DbError::ServerError,
                "java.lang.RuntimeException",
                Class::Transient,
            ),
        ];
        for (error, message, want) in table {
            assert_eq!(
                db_error_class(error, message),
                *want,
                "{error:?}: {message}"
            );
        }
    }
}
