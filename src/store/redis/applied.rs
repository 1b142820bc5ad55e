//! How far the store holds each partition of the dispatch log, kept in the store itself, so a
//! store that went back in time is found and healed (SPEC 7.3).
//!
//! A store can lose only its latest writes: a failover to a replica that had not received them
//! (`wait_replicas = 0`, the default), a restore of an older snapshot. Its markers
//! (`store_marker`) survive, and the consumer group's committed offsets say the lost writes were
//! applied, so nothing would ever bring them back.
//!
//! **The record.** The daemon writes each partition's watermark here *before* it hands that
//! watermark to the consumer's offset store, so what the store says it holds is never behind
//! what the group commits (the daemon's `engine`). The writes travel in the same replication
//! stream as the data, after it: a replica, or a snapshot, that has a record has every write the
//! record covers. So after a failover or a restore the record tells where the store went back to.
//!
//! **The layout.** `P:applied:{T}` hashes, one per 256 slots (64 keys, `T` a tag of slot
//! `k * 256`), each holding every partition's record under the field `topic|partition`: every
//! master of a cluster holds some of them (a master owning no slot of the 64 is named in
//! docs/operations.md as what this cannot see), and a master that went back takes its records
//! back with it. The position a partition is read again from is the lowest record of all keys
//! that have one.
//!
//! **The check.** At each assignment the daemon compares the record with the committed offset:
//! a record below it means the store lost the writes between them, and the partition is read
//! again from the record (replays are idempotent: what the store still holds answers
//! `unchanged` or `superseded`, what it lost is written again). Where the log no longer holds
//! them (retention passed the record), the records-lost rules apply (`kafka.on_records_lost`).
//!
//! **While running.** Each write carries, per partition, the record this process wrote last and
//! the store acknowledged (its floor). A key holding less than that lost writes since (a
//! failover under the running daemon): the script leaves it as it is, as the evidence, and the
//! daemon reads the partition again from it at once (the engine's `went_back`), instead of
//! waiting for an assignment that a running group may never have.
//!
//! Cost: 64 script calls per write (side by side; the daemon writes at most every 200 ms), 64
//! `HMGET`s per assignment.

use std::collections::BTreeMap;

use redis::Value;

use super::{store_marker, RedisStore};
use crate::model::StoreError;

/// The records' keys: one per 256 slots.
const KEYS: u16 = 64;

fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS)
        .map(|k| {
            let slot_key = store_marker::marker_key(prefix, k * 256);
            // `P:store:{T}` -> `P:applied:{T}`: the same tag, so the same slot.
            slot_key.replacen(":store:{", ":applied:{", 1)
        })
        .collect()
}

/// A record's offset as Redis answers it (a bulk string, or an integer).
fn offset_of(value: &Value) -> Option<i64> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn field(topic: &str, partition: i32) -> String {
    format!("{topic}|{partition}")
}

impl RedisStore {
    /// Records that the store holds every write of `topic`'s partitions below these offsets,
    /// except where a key's record is below the caller's floor (the store went back): those are
    /// left as they are and answered with the lowest record found
    /// ([`MailboxStore::record_applied`]; `lua/applied_record.lua`, one call per key, side by
    /// side).
    pub(crate) async fn write_applied(
        &self,
        topic: &str,
        positions: &[(i32, i64, Option<i64>)],
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        let mut behind: BTreeMap<i32, i64> = BTreeMap::new();
        if positions.is_empty() {
            return Ok(behind);
        }
        self.check_markers_of_records().await?;
        let by_field: BTreeMap<String, i32> = positions
            .iter()
            .map(|(partition, _, _)| (field(topic, *partition), *partition))
            .collect();
        let calls = keys(&self.settings.key_prefix).into_iter().map(|key| {
            let mut invocation = self.scripts.applied_record.prepare_invoke();
            invocation.key(key);
            for (partition, offset, floor) in positions {
                invocation
                    .arg(field(topic, *partition))
                    .arg(*offset)
                    .arg(floor.map(|f| f.to_string()).unwrap_or_default());
            }
            async move { self.invoke(invocation).await }
        });
        for reply in futures::future::try_join_all(calls).await? {
            for pair in reply.chunks(2) {
                let [Value::BulkString(name), held] = pair else {
                    continue;
                };
                let held = offset_of(held);
                let partition = std::str::from_utf8(name)
                    .ok()
                    .and_then(|name| by_field.get(name));
                if let (Some(partition), Some(held)) = (partition, held) {
                    let lowest = behind.entry(*partition).or_insert(held);
                    *lowest = (*lowest).min(held);
                }
            }
        }
        // The records are data of their slots: a slot that loses them is a wiped slot too.
        for k in 0..KEYS {
            self.note_slot(k * 256);
        }
        self.write_markers().await;
        Ok(behind)
    }

    /// A record is written only where the store still holds its data: the markers of the
    /// records' slots that are known to hold data must exist (`store_marker`), or the write is
    /// `store_lost` and nothing is written (a wiped store gets nothing, the offsets wait).
    async fn check_markers_of_records(&self) -> Result<(), StoreError> {
        if !self.settings.markers {
            return Ok(());
        }
        let prefix = &self.settings.key_prefix;
        let expected: Vec<u16> = (0..KEYS)
            .map(|k| k * 256)
            .filter(|slot| self.expected.contains(*slot))
            .collect();
        if expected.is_empty() {
            return Ok(());
        }
        let present = self.markers_present(&expected).await?;
        if let Some((slot, _)) = expected.iter().zip(present).find(|(_, p)| !*p) {
            return Err(StoreError::store_lost(
                super::BACKEND,
                format!(
                    "the store marker {} is gone: the data of this slot was wiped; the offsets wait until an operator rebuilds from the log or runs `materializer accept-store-loss`",
                    store_marker::marker_key(prefix, *slot)
                ),
            ));
        }
        Ok(())
    }

    /// The offset below which the store holds every write of each of `partitions` (the lowest
    /// record of all keys): partitions never recorded are absent.
    pub(crate) async fn read_applied(
        &self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        let mut out: BTreeMap<i32, i64> = BTreeMap::new();
        if partitions.is_empty() {
            return Ok(out);
        }
        let commands = keys(&self.settings.key_prefix)
            .into_iter()
            .map(|key| {
                let mut command = redis::cmd("HMGET");
                command.arg(key);
                for partition in partitions {
                    command.arg(field(topic, *partition));
                }
                command
            })
            .collect();
        let replies: Vec<Vec<Value>> = self.each(commands).await?;
        for reply in replies {
            for (partition, value) in partitions.iter().zip(reply) {
                if let Some(offset) = offset_of(&value) {
                    let entry = out.entry(*partition).or_insert(offset);
                    *entry = (*entry).min(offset);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_records_spread_over_the_slots_one_per_256() {
        let keys = keys("mm");
        assert_eq!(keys.len(), 64);
        for (k, key) in keys.iter().enumerate() {
            assert!(key.starts_with("mm:applied:{"), "{key}");
            assert_eq!(
                super::super::batch::slot_of_key(key),
                (k * 256) as u16,
                "{key}"
            );
        }
    }
}
