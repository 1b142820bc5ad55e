//! Everything stored for one user, as text: the fingerprint tests compare to prove that an
//! operation changed nothing (a refusal) or that an abort restored every row.

use scylla::value::{CqlValue, Row};

use super::ScyllaStore;
use crate::model::{StoreError, UserId};
use crate::store::classify::cql;

impl ScyllaStore {
    /// Every row of `user`: the user row's fence and live slot, both slots' meta rows (with the
    /// write time of their last commit) and identity rows (with theirs), the user's repair
    /// registrations, and the event rows of every generation the partition can have named, in
    /// the partitions of the days in `days`.
    ///
    /// The commit point's `version` is left out: taking and lifting a fence advances it, and an
    /// aborted repair must leave a fingerprint equal to the one before it began. Every change a
    /// commit makes to a slot still shows, through the rows' write times.
    pub async fn dump_user(&self, user: &UserId, days: &[u64]) -> Result<String, StoreError> {
        let ks = &self.settings.keyspace;
        let u = user.as_str();
        let mut out = String::new();
        let result = self
            .session
            .query_unpaged(
                format!(
                    "SELECT slot, seq, version, live_slot, fence_holder, fence_until, generation, \
                     epoch, format_version, writetime(format_version), expired_gap_boundary, \
                     seqbucket_max_seq, user_trim_seq, days, proof_max_seq, proof_expires_at, \
                     expires_at, writetime(expires_at), digest FROM {ks}.user_mailbox \
                     WHERE user_id = ?"
                ),
                (u,),
            )
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let mut version = 0;
        for row in rows.rows::<Row>().map_err(cql::from)? {
            let mut columns = row.map_err(cql::from)?.columns;
            if let Some(Some(CqlValue::BigInt(v))) = columns.get(2) {
                version = *v;
            }
            columns.remove(2);
            let is_user_row = matches!(columns.first(), Some(Some(CqlValue::Int(-1))));
            if is_user_row && columns[2..].iter().all(Option::is_none) {
                // Only the commit point: nothing a reader or a repair could observe.
                continue;
            }
            out.push_str(&format!("{columns:?}\n"));
        }

        let result = self
            .session
            .query_unpaged(
                format!("SELECT holder FROM {ks}.repair_registry WHERE shard = 0 AND user_id = ?"),
                (u,),
            )
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        for row in rows.rows::<(String,)>().map_err(cql::from)? {
            out.push_str(&format!(
                "repair registered by {}\n",
                row.map_err(cql::from)?.0
            ));
        }

        if days.is_empty() {
            return Ok(out);
        }
        let buckets: Vec<i64> = days
            .iter()
            .map(|&d| super::schema::event_bucket(d as i64))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let events = self
            .session
            .prepare(format!(
                "SELECT generation, bucket, seq, digest, ordinal, created_at, payload \
                 FROM {ks}.mailbox_events WHERE user_id = ? AND generation = ? AND bucket IN ?"
            ))
            .await
            .map_err(cql::from)?;
        // A generation is the version of the commit that created it (or the next one, for rows
        // written before a commit that never happened).
        for generation in 1..=version + 1 {
            let result = self
                .session
                .execute_unpaged(&events, (u, generation, &buckets))
                .await
                .map_err(cql::from)?;
            let rows = result.into_rows_result().map_err(cql::from)?;
            for row in rows.rows::<Row>().map_err(cql::from)? {
                out.push_str(&format!("{:?}\n", row.map_err(cql::from)?.columns));
            }
        }
        Ok(out)
    }
}
