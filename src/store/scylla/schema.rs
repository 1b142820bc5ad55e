//! The CQL schema of the Scylla backend: what it is, what a keyspace lacks of it, and the one
//! place that sends DDL (`materializer schema apply`, or a connect allowed to create it).
//!
//! - `user_mailbox`: **one partition per user**, so that a single lightweight transaction can
//!   check and change everything a store operation decides on. Clustering `(slot, seq)`:
//!   - the **user row** `(slot -1, seq 0)`: `version`, the commit point every conditional batch is
//!     guarded by (`IF version = ?`) and advances; `live_slot`, which of the two slots is the live
//!     mailbox; the repair fence (`fence_holder`, `fence_until` by the store's clock, written
//!     `USING TTL` so a crashed repair's fence also vanishes server-side);
//!   - per slot `s` in {0, 1}, the **meta row** `(s, 0)`: the slot's `generation` (names its event
//!     partitions; new on every epoch move and every fresh staging copy), its `epoch` (the user's
//!     current epoch in that slot, `P:epoch` on Redis), the V4 meta of SPEC 5 (`mbmeta` plus
//!     the `mbdays` day set as the `days` map) (its `source_position`, the mailbox-level position
//!     an older release kept, is neither read nor written any more);
//!   - per slot, the **identity rows** `(s, seq > 0)`: `expires_at(day)`, the `digest` naming
//!     the committed copy of the group's event rows (`mbseqbucket` on Redis) and the
//!     `source_position` of that copy (zombie fencing, SPEC 7.2), `USING TTL`.
//!
//!   The slot that is not live is a repair's staging copy (SPEC 7.1); the swap flips `live_slot`.
//! - `mailbox_events`: one partition per `(user_id, generation, bucket)`, where the bucket is
//!   [`DAYS_PER_EVENT_PARTITION`] consecutive days ([`event_bucket`]), clustered by
//!   `(seq, digest, ordinal)`, written `USING TTL` so rows vanish at `expires_at(day)`. The
//!   ordinal is a `bigint`: CQL has no unsigned 32-bit type, and a u32 cast to `int` would order
//!   ordinals from 2^31 up before 0. Rows of a
//!   digest no identity names (an append interrupted before its commit, a replaced group) or of a
//!   generation no slot names (an old epoch, a replaced or abandoned copy) are never read.
//! - `repair_registry`: the repairs that took a fence, so that garbage collection finds the staging
//!   copies of crashed repairs without scanning every user. One partition (`shard = 0`): repairs
//!   are operator commands, few at a time.
//! - `store_marker`: one row (`id = 0`), "this keyspace holds this product's data", written
//!   after the first write that lands and never deleted by the product, so a keyspace dropped
//!   or truncated and created again empty is told from a new one (SPEC 7.3; `store_marker.rs`).

use std::collections::BTreeMap;

use scylla::client::session::Session;

use super::ScyllaSettings;
use crate::model::StoreError;
use crate::store::classify::cql;

/// Days of events one partition of `mailbox_events` holds.
///
/// A scan page reads every partition its groups live in, one partition lookup each: with one
/// partition per day, a page of 50 groups spread over 25 days cost 25 lookups, more than the rows
/// themselves (`BENCHMARKS.md`). A week per partition keeps a page to a handful of lookups, and a
/// partition holds at most a week of one mailbox's events. Expiry stays exact per day: every row
/// carries its own TTL, and a scan's seq range never reaches the rows of days that expired (their
/// seqs are at or below the gap boundary, which a cursor never precedes).
pub(crate) const DAYS_PER_EVENT_PARTITION: i64 = 7;

/// The `mailbox_events` partition bucket of `day`.
pub fn event_bucket(day: i64) -> i64 {
    day.div_euclid(DAYS_PER_EVENT_PARTITION)
}

/// The kind of a column in `system_schema.columns`.
pub(crate) const PARTITION_KEY: &str = "partition_key";
pub(crate) const CLUSTERING: &str = "clustering";
pub(crate) const REGULAR: &str = "regular";

/// One expected column: name, CQL type (`system_schema.columns.type`) and kind.
pub(crate) type Column = (&'static str, &'static str, &'static str);

/// Columns every table must have.
pub(crate) const EXPECTED: &[(&str, &[Column])] = &[
    (
        "user_mailbox",
        &[
            ("user_id", "text", PARTITION_KEY),
            ("slot", "int", CLUSTERING),
            ("seq", "bigint", CLUSTERING),
            ("version", "bigint", REGULAR),
            ("live_slot", "int", REGULAR),
            ("fence_holder", "text", REGULAR),
            ("fence_until", "bigint", REGULAR),
            ("generation", "bigint", REGULAR),
            ("epoch", "bigint", REGULAR),
            ("format_version", "int", REGULAR),
            ("expired_gap_boundary", "bigint", REGULAR),
            ("seqbucket_max_seq", "bigint", REGULAR),
            ("user_trim_seq", "bigint", REGULAR),
            ("days", "map<bigint, bigint>", REGULAR),
            ("proof_max_seq", "map<bigint, bigint>", REGULAR),
            ("proof_expires_at", "map<bigint, bigint>", REGULAR),
            ("expires_at", "bigint", REGULAR),
            ("digest", "bigint", REGULAR),
            ("source_position", "text", REGULAR),
        ],
    ),
    (
        "mailbox_events",
        &[
            ("user_id", "text", PARTITION_KEY),
            ("generation", "bigint", PARTITION_KEY),
            ("bucket", "bigint", PARTITION_KEY),
            ("seq", "bigint", CLUSTERING),
            ("digest", "bigint", CLUSTERING),
            ("ordinal", "bigint", CLUSTERING),
            ("created_at", "bigint", REGULAR),
            ("payload", "text", REGULAR),
        ],
    ),
    (
        "repair_registry",
        &[
            ("shard", "int", PARTITION_KEY),
            ("user_id", "text", CLUSTERING),
            ("holder", "text", CLUSTERING),
        ],
    ),
    (
        "store_marker",
        &[
            ("id", "int", PARTITION_KEY),
            ("written_at", "bigint", REGULAR),
        ],
    ),
];

/// Columns added after a table's first release: `(table, column, type)`, added to a keyspace
/// created before them (`ALTER TABLE ... ADD`, an error for a column already there is ignored).
/// `user_mailbox.source_position`: the log position of a seq's stored version, on its identity
/// row (zombie fencing, `model::rules::superseded`).
pub(crate) const ADDED_COLUMNS: &[(&str, &str, &str)] =
    &[("user_mailbox", "source_position", "text")];

/// The statements that create the schema (idempotent).
pub(crate) fn create_statements(keyspace: &str, replication: &str) -> Vec<String> {
    vec![
        format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.user_mailbox (
                user_id text, slot int, seq bigint,
                version bigint, live_slot int, fence_holder text, fence_until bigint,
                generation bigint, epoch bigint, format_version int,
                expired_gap_boundary bigint, seqbucket_max_seq bigint, user_trim_seq bigint,
                days map<bigint, bigint>,
                proof_max_seq map<bigint, bigint>,
                proof_expires_at map<bigint, bigint>,
                expires_at bigint, digest bigint, source_position text,
                PRIMARY KEY ((user_id), slot, seq))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.mailbox_events (
                user_id text, generation bigint, bucket bigint, seq bigint, digest bigint,
                ordinal bigint, created_at bigint, payload text,
                PRIMARY KEY ((user_id, generation, bucket), seq, digest, ordinal))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.repair_registry (
                shard int, user_id text, holder text,
                PRIMARY KEY ((shard), user_id, holder))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.store_marker (
                id int PRIMARY KEY, written_at bigint)"
        ),
    ]
}

/// What the keyspace lacks, one word each (`keyspace mailbox`, `table mailbox.user_mailbox`,
/// `column mailbox.user_mailbox.source_position text`); empty when the schema is complete. A
/// column of another type or kind is an error: no statement of ours migrates it.
///
/// Reads `system_schema` only, which every role may read: a role without DDL grants runs this.
pub(crate) async fn missing(session: &Session, keyspace: &str) -> Result<Vec<String>, StoreError> {
    let keyspaces = session
        .query_unpaged(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await
        .map_err(cql::from)?
        .into_rows_result()
        .map_err(cql::from)?
        .rows_num();
    if keyspaces == 0 {
        return Ok(vec![format!("keyspace {keyspace}")]);
    }
    let result = session
        .query_unpaged(
            "SELECT table_name, column_name, type, kind FROM system_schema.columns WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await
        .map_err(cql::from)?;
    let rows = result.into_rows_result().map_err(cql::from)?;
    let mut found: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for row in rows
        .rows::<(String, String, String, String)>()
        .map_err(cql::from)?
    {
        let (table, column, kind, role) = row.map_err(cql::from)?;
        found.insert((table, column), (kind, role));
    }
    let mut missing = Vec::new();
    for (table, columns) in EXPECTED {
        if !found.keys().any(|(t, _)| t == table) {
            missing.push(format!("table {keyspace}.{table}"));
            continue;
        }
        for (column, kind, role) in *columns {
            match found.get(&((*table).to_owned(), (*column).to_owned())) {
                Some((actual, actual_role)) if actual == kind && actual_role == role => {}
                Some((actual, actual_role)) => {
                    return Err(StoreError::Unavailable {
                        backend: "scylla",
                        detail: format!(
                            "schema mismatch in keyspace {keyspace}: {table}.{column} is {actual} \
                             ({actual_role}), expected {kind} ({role}); use another keyspace or \
                             migrate it"
                        ),
                    })
                }
                None => missing.push(format!("column {keyspace}.{table}.{column} {kind}")),
            }
        }
    }
    Ok(missing)
}

/// The error of a connect that found the schema incomplete and may not create it.
pub(crate) fn incomplete(keyspace: &str, missing: &[String]) -> StoreError {
    StoreError::Unavailable {
        backend: "scylla",
        detail: format!(
            "the schema of keyspace {keyspace} is incomplete: missing {}; run `materializer \
             schema apply` with a role that may create and alter it (docs/grants.md), or set \
             store.scylla.create_schema = true",
            missing.join(", ")
        ),
    }
}

/// Creates what `missing` (from [`missing`]) names: the keyspace, each table, each column a
/// later release added. Only those statements are sent, because the server checks a statement's
/// permission before its `IF NOT EXISTS`: a schema role with `CREATE` on the keyspace an
/// administrator created (and no `CREATE ON ALL KEYSPACES`) would be refused a `CREATE KEYSPACE
/// IF NOT EXISTS` of it. The one place that sends DDL.
pub(crate) async fn apply(
    session: &Session,
    settings: &ScyllaSettings,
    missing: &[String],
) -> Result<(), StoreError> {
    let ks = &settings.keyspace;
    let keyspace_missing = missing.contains(&format!("keyspace {ks}"));
    let statements = create_statements(ks, &settings.replication);
    // create_statements: the keyspace, then one table each in EXPECTED's order.
    let mut wanted: Vec<&String> = Vec::new();
    if keyspace_missing {
        wanted.push(&statements[0]);
    }
    for ((table, _), statement) in EXPECTED.iter().zip(&statements[1..]) {
        if keyspace_missing || missing.contains(&format!("table {ks}.{table}")) {
            wanted.push(statement);
        }
    }
    for statement in wanted {
        session
            .query_unpaged(statement.clone(), ())
            .await
            .map_err(cql::from)?;
    }
    for (table, column, kind) in ADDED_COLUMNS {
        if !missing.contains(&format!("column {ks}.{table}.{column} {kind}")) {
            continue;
        }
        let added = session
            .query_unpaged(format!("ALTER TABLE {ks}.{table} ADD {column} {kind}"), ())
            .await;
        if let Err(e) = added {
            let text = e.to_string();
            if !(text.contains("conflicts with an existing column")
                || text.contains("already exists"))
            {
                return Err(cql::from(e));
            }
        }
    }
    session.await_schema_agreement().await.map_err(cql::from)?;
    Ok(())
}
