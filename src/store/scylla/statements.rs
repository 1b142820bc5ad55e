//! Every CQL statement of the backend, prepared once per session.

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};

use super::ScyllaSettings;
use crate::model::StoreError;
use crate::store::classify::cql;

/// The columns of `user_mailbox` a snapshot reads (see [`super::state::PartitionRow`]).
pub(super) const PARTITION_COLUMNS: &str = "slot, seq, version, live_slot, fence_holder, \
     fence_until, generation, epoch, format_version, expired_gap_boundary, seqbucket_max_seq, \
     user_trim_seq, days, proof_max_seq, proof_expires_at, expires_at, digest, source_position";

/// How long a readiness probe waits for the cluster: short, so `/readyz` turns false while the
/// cluster is unreachable instead of hanging on the driver's default request timeout.
pub(super) const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub(super) struct Statements {
    // ---- reads of the user partition ----
    /// The user row, both meta rows and the identity rows of the given seqs: one read of one
    /// partition sees one committed state of the whole user. At the plain consistency
    /// (`LOCAL_QUORUM`), which sees every commit acknowledged in the datacenter (commits are
    /// written at that level too) ...
    pub snapshot: PreparedStatement,
    /// ... and at the commit point's serial consistency, which also completes a commit still in
    /// flight: used after a lost condition and to confirm a corrupt verdict.
    pub snapshot_serial: PreparedStatement,
    /// Whether a slot holds any identity that has not expired (by the store's clock), newest
    /// first, so a healthy index answers at its first row.
    pub probe_live_identity: PreparedStatement,
    /// Identity rows of a slot in `(after, until]`, at most `limit`: scans and counts.
    pub slot_identities: PreparedStatement,
    /// The identity rows of a slot with their stored versions' source positions (explain).
    pub slot_positions: PreparedStatement,
    // ---- reads of event rows ----
    /// One committed copy of one group.
    pub read_group: PreparedStatement,
    /// The events of several buckets of one generation, in a seq range.
    pub read_events_range: PreparedStatement,
    // ---- the commit point (first statement of every conditional batch) ----
    /// `SET version = ? ... IF version = ?` on the user row.
    pub bump_version: PreparedStatement,
    // ---- parts of a conditional batch (same partition) ----
    pub set_fence: PreparedStatement,
    pub clear_fence: PreparedStatement,
    pub set_live_slot: PreparedStatement,
    pub write_meta: PreparedStatement,
    pub put_identity: PreparedStatement,
    /// Identity rows of a slot with `lo < seq < hi` (never the meta row at seq 0).
    pub delete_identities: PreparedStatement,
    /// A whole slot: meta row and identity rows.
    pub delete_slot: PreparedStatement,
    // ---- event rows (idempotent, outside the commit point) ----
    pub insert_event: PreparedStatement,
    pub delete_events_bucket: PreparedStatement,
    pub delete_events_below: PreparedStatement,
    pub delete_events_digest: PreparedStatement,
    /// Readiness: one row of the coordinator's local system table, with a short timeout.
    pub ping: PreparedStatement,
    // ---- the repair registry ----
    pub registry_all: PreparedStatement,
    pub registry_of_user: PreparedStatement,
    pub registry_insert: PreparedStatement,
    pub registry_delete: PreparedStatement,
    // ---- the store marker (SPEC 7.3, `store_marker.rs`) ----
    pub marker_read: PreparedStatement,
    pub marker_write: PreparedStatement,
    /// Whether any user partition exists (one row at most).
    pub any_user: PreparedStatement,
}

pub(super) async fn prepare_all(
    session: &Session,
    settings: &ScyllaSettings,
) -> Result<Statements, StoreError> {
    let ks = &settings.keyspace;
    let serial = match settings.serial_consistency {
        SerialConsistency::Serial => Consistency::Serial,
        SerialConsistency::LocalSerial => Consistency::LocalSerial,
    };
    let prepare = |cql_text: String, consistency: Consistency| async move {
        let mut statement = session.prepare(cql_text).await.map_err(cql::from)?;
        statement.set_consistency(consistency);
        statement.set_serial_consistency(Some(settings.serial_consistency));
        Ok::<_, StoreError>(statement)
    };
    let plain = settings.consistency;
    let user_row = "user_id = ? AND slot = -1 AND seq = 0";
    let snapshot_cql = format!(
        "SELECT {PARTITION_COLUMNS} FROM {ks}.user_mailbox \
         WHERE user_id = ? AND slot IN (-1, 0, 1) AND seq IN ?"
    );
    Ok(Statements {
        snapshot: prepare(snapshot_cql.clone(), plain).await?,
        snapshot_serial: prepare(snapshot_cql, serial).await?,
        probe_live_identity: prepare(
            format!(
                "SELECT seq FROM {ks}.user_mailbox WHERE user_id = ? AND slot = ? AND seq > 0 \
                 AND expires_at > ? ORDER BY slot DESC, seq DESC LIMIT 1 ALLOW FILTERING"
            ),
            plain,
        )
        .await?,
        slot_positions: prepare(
            format!(
                "SELECT seq, expires_at, source_position FROM {ks}.user_mailbox \
                 WHERE user_id = ? AND slot = ? AND seq > ? LIMIT ?"
            ),
            plain,
        )
        .await?,
        slot_identities: prepare(
            format!(
                "SELECT seq, expires_at, digest FROM {ks}.user_mailbox \
                 WHERE user_id = ? AND slot = ? AND seq > ? AND seq <= ? LIMIT ?"
            ),
            plain,
        )
        .await?,
        read_group: prepare(
            format!(
                "SELECT ordinal, created_at, payload FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND generation = ? AND bucket = ? AND seq = ? AND digest = ?"
            ),
            plain,
        )
        .await?,
        read_events_range: prepare(
            format!(
                "SELECT seq, digest, ordinal, created_at, payload FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND generation = ? AND bucket IN ? AND seq >= ? AND seq <= ?"
            ),
            plain,
        )
        .await?,
        bump_version: prepare(
            format!("UPDATE {ks}.user_mailbox SET version = ? WHERE {user_row} IF version = ?"),
            plain,
        )
        .await?,
        set_fence: prepare(
            format!(
                "UPDATE {ks}.user_mailbox USING TTL ? SET fence_holder = ?, fence_until = ? \
                 WHERE {user_row}"
            ),
            plain,
        )
        .await?,
        clear_fence: prepare(
            format!(
                "UPDATE {ks}.user_mailbox SET fence_holder = null, fence_until = null WHERE {user_row}"
            ),
            plain,
        )
        .await?,
        set_live_slot: prepare(
            format!("UPDATE {ks}.user_mailbox SET live_slot = ? WHERE {user_row}"),
            plain,
        )
        .await?,
        write_meta: prepare(
            format!(
                "UPDATE {ks}.user_mailbox SET generation = ?, epoch = ?, format_version = ?, \
                 expired_gap_boundary = ?, seqbucket_max_seq = ?, user_trim_seq = ?, days = ?, \
                 proof_max_seq = ?, proof_expires_at = ? \
                 WHERE user_id = ? AND slot = ? AND seq = 0"
            ),
            plain,
        )
        .await?,
        put_identity: prepare(
            format!(
                "INSERT INTO {ks}.user_mailbox (user_id, slot, seq, expires_at, digest, \
                 source_position) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
            ),
            plain,
        )
        .await?,
        delete_identities: prepare(
            format!(
                "DELETE FROM {ks}.user_mailbox WHERE user_id = ? AND slot = ? AND seq > ? AND seq < ?"
            ),
            plain,
        )
        .await?,
        delete_slot: prepare(
            format!("DELETE FROM {ks}.user_mailbox WHERE user_id = ? AND slot = ?"),
            plain,
        )
        .await?,
        insert_event: prepare(
            format!(
                "INSERT INTO {ks}.mailbox_events \
                 (user_id, generation, bucket, seq, digest, ordinal, created_at, payload) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
            ),
            plain,
        )
        .await?,
        delete_events_bucket: prepare(
            format!(
                "DELETE FROM {ks}.mailbox_events WHERE user_id = ? AND generation = ? AND bucket = ?"
            ),
            plain,
        )
        .await?,
        delete_events_below: prepare(
            format!(
                "DELETE FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND generation = ? AND bucket = ? AND seq < ?"
            ),
            plain,
        )
        .await?,
        delete_events_digest: prepare(
            format!(
                "DELETE FROM {ks}.mailbox_events \
                 WHERE user_id = ? AND generation = ? AND bucket = ? AND seq = ? AND digest = ?"
            ),
            plain,
        )
        .await?,
        ping: {
            let mut ping = prepare(
                "SELECT release_version FROM system.local".to_owned(),
                Consistency::One,
            )
            .await?;
            ping.set_request_timeout(Some(PING_TIMEOUT));
            ping
        },
        registry_all: prepare(
            format!("SELECT user_id, holder FROM {ks}.repair_registry WHERE shard = 0"),
            plain,
        )
        .await?,
        registry_of_user: prepare(
            format!("SELECT holder FROM {ks}.repair_registry WHERE shard = 0 AND user_id = ?"),
            plain,
        )
        .await?,
        registry_insert: prepare(
            format!("INSERT INTO {ks}.repair_registry (shard, user_id, holder) VALUES (0, ?, ?)"),
            plain,
        )
        .await?,
        registry_delete: prepare(
            format!(
                "DELETE FROM {ks}.repair_registry WHERE shard = 0 AND user_id = ? AND holder = ?"
            ),
            plain,
        )
        .await?,
        marker_read: prepare(
            format!("SELECT written_at FROM {ks}.store_marker WHERE id = 0"),
            plain,
        )
        .await?,
        marker_write: prepare(
            format!("INSERT INTO {ks}.store_marker (id, written_at) VALUES (0, ?)"),
            plain,
        )
        .await?,
        any_user: prepare(
            format!("SELECT user_id FROM {ks}.user_mailbox LIMIT 1"),
            plain,
        )
        .await?,
    })
}
