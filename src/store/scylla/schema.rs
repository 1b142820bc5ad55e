//! The CQL schema of the Scylla backend, created on start or checked against what exists.
//!
//! - `user_epoch`: the current epoch of a user (`P:epoch` on Redis).
//! - `mailbox`: one partition per `(user_id, epoch)`. Its **static** columns are the meta (the
//!   `mbmeta` hash and the `mbdays` set of Redis), with `version` as the lightweight-transaction
//!   commit point; its **clustering rows** (by `seq`) are the identity index, each naming the
//!   committed generation `gen` of its group. One partition lets a single conditional batch commit
//!   meta and identity together.
//! - `mailbox_events`: one partition per `(user_id, epoch, day)`, clustered by
//!   `(seq, gen, ordinal)`, written `USING TTL` so rows vanish at `expires_at(day)`. Rows of a
//!   generation that no identity names (an append interrupted before its commit, or a replaced
//!   group) are never read and expire with their day.

/// Columns every table must have, with their CQL types (`system_schema.columns.type`).
pub const EXPECTED: &[(&str, &[(&str, &str)])] = &[
    ("user_epoch", &[("user_id", "text"), ("epoch", "bigint")]),
    (
        "mailbox",
        &[
            ("user_id", "text"),
            ("epoch", "bigint"),
            ("seq", "bigint"),
            ("format_version", "int"),
            ("version", "bigint"),
            ("expired_gap_boundary", "bigint"),
            ("seqbucket_max_seq", "bigint"),
            ("user_trim_seq", "bigint"),
            ("days", "map<bigint, bigint>"),
            ("proof_max_seq", "map<bigint, bigint>"),
            ("proof_expires_at", "map<bigint, bigint>"),
            ("expires_at", "bigint"),
            ("gen", "bigint"),
        ],
    ),
    (
        "mailbox_events",
        &[
            ("user_id", "text"),
            ("epoch", "bigint"),
            ("day", "bigint"),
            ("seq", "bigint"),
            ("gen", "bigint"),
            ("ordinal", "int"),
            ("created_at", "bigint"),
            ("payload", "text"),
        ],
    ),
];

/// The statements that create the schema (idempotent).
pub fn create_statements(keyspace: &str, replication: &str) -> Vec<String> {
    vec![
        format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.user_epoch (user_id text PRIMARY KEY, epoch bigint)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.mailbox (
                user_id text, epoch bigint, seq bigint,
                format_version int static, version bigint static,
                expired_gap_boundary bigint static, seqbucket_max_seq bigint static,
                user_trim_seq bigint static,
                days map<bigint, bigint> static,
                proof_max_seq map<bigint, bigint> static,
                proof_expires_at map<bigint, bigint> static,
                expires_at bigint, gen bigint,
                PRIMARY KEY ((user_id, epoch), seq))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.mailbox_events (
                user_id text, epoch bigint, day bigint, seq bigint, gen bigint, ordinal int,
                created_at bigint, payload text,
                PRIMARY KEY ((user_id, epoch, day), seq, gen, ordinal))"
        ),
    ]
}
