//! Batches of live appends (the daemon's, `replay`'s and `apply`'s `append_many`).
//!
//! On one server a batch is ONE pipeline: every script, then (with `wait_replicas > 0`) one
//! `WAIT` covering all of them, on one connection in one round trip.
//!
//! On a Redis Cluster the client refuses a pipeline whose commands name several slots (a
//! client-side `CROSSSLOT`), so a batch is first split **by node**: the slot of each user's hash
//! tag, looked up in the cluster's slot map (`CLUSTER SLOTS`, cached for [`SLOT_MAP_TTL`]), names
//! the master that serves it, and each master gets one pipeline routed to it, all sent at once.
//! A master runs commands of any of its slots in one pipeline. A slot that moved since the map
//! was read answers `MOVED` for its command alone (transient: that delivery is retried on its
//! own, and the map is read again). Without a map (it could not be read) the batch is split by
//! slot instead. A record's outcome therefore never depends on which other records shared its
//! batch (SPEC 7.2). Each part keeps its own `WAIT` (WAIT covers one connection's writes).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Pipeline, RedisError, Value};

use super::keys::{self, KeySet};
use super::{classified, lock, protocol, validate_group, Connection, RedisStore};
use crate::model::{AppendOutcome, EventGroup, StoreError};

/// How long a cluster's slot map is used before it is read again (a `MOVED` answer drops it at
/// once).
pub(super) const SLOT_MAP_TTL: Duration = Duration::from_secs(30);

/// Redis Cluster's 16,384 hash slots: `(first slot, last slot, "host:port" of the master)`.
#[derive(Debug)]
pub(super) struct SlotMap {
    ranges: Vec<(u16, u16, String)>,
    read_at: Instant,
}

impl SlotMap {
    /// The master serving `slot`, if the map covers it.
    fn master(&self, slot: u16) -> Option<&str> {
        let i = self.ranges.partition_point(|(_, last, _)| *last < slot);
        self.ranges
            .get(i)
            .filter(|(first, _, _)| *first <= slot)
            .map(|(_, _, node)| node.as_str())
    }

    /// Parses a `CLUSTER SLOTS` reply.
    fn parse(reply: &Value) -> Option<Self> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return None;
            };
            let number = |v: &Value| match v {
                Value::Int(i) => u16::try_from(*i).ok(),
                _ => None,
            };
            let (first, last) = (number(fields.first()?)?, number(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = match master.get(1)? {
                Value::Int(p) => *p,
                _ => return None,
            };
            ranges.push((first, last, format!("{host}:{port}")));
        }
        ranges.sort();
        Some(Self {
            ranges,
            read_at: Instant::now(),
        })
    }
}

/// The Redis Cluster slot of a key (CRC16/XMODEM of its hash tag, or of the key, mod 16,384).
pub(super) fn slot_of_key(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16_xmodem(tagged.unwrap_or(bytes)) % 16_384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

impl RedisStore {
    /// Live appends of several groups: one pipeline on a single server; on a cluster one
    /// pipeline per master, all sent at once. Answers in the order given.
    pub(super) async fn append_pipelined(
        &self,
        groups: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        if !self.settings.cluster {
            return self.append_pipeline(groups, None).await;
        }
        let tags: Vec<String> = groups
            .iter()
            .map(|g| keys::tag(&g.mailbox.user_id))
            .collect();
        let slots: Vec<u16> = tags.iter().map(|t| slot_of_key(t)).collect();
        let map = self.slot_map().await;
        let mut parts: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, &slot) in slots.iter().enumerate() {
            let node = map
                .as_deref()
                .and_then(|m| m.master(slot))
                .map_or_else(|| format!("slot {slot}"), str::to_owned);
            parts.entry(node).or_default().push(i);
        }
        let parts: Vec<Vec<usize>> = parts.into_values().collect();
        let answers = futures::future::join_all(parts.iter().map(|part| {
            let part_groups: Vec<&EventGroup> = part.iter().map(|i| groups[*i]).collect();
            // Routed to the master of its first user's slot, which serves all of them.
            let route = Route::new(slots[part[0]], SlotAddr::Master);
            async move { self.append_pipeline(&part_groups, Some(route)).await }
        }))
        .await;
        let mut results: Vec<Option<Result<AppendOutcome, StoreError>>> =
            (0..groups.len()).map(|_| None).collect();
        let mut moved = false;
        for (part, answer) in parts.iter().zip(answers) {
            for (i, outcome) in part.iter().zip(answer) {
                moved |= matches!(&outcome, Err(StoreError::Unavailable { detail, .. }) if detail.contains("MOVED"));
                results[*i] = Some(outcome);
            }
        }
        if moved {
            // A slot moved: read the map again before the next batch.
            *lock(&self.slot_map) = None;
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(protocol(
                        "a cluster part answered fewer appends than it was sent",
                    ))
                })
            })
            .collect()
    }

    /// The cluster's slot map, read again when older than [`SLOT_MAP_TTL`]; `None` when it
    /// cannot be read (batches are then split by slot).
    async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        if let Some(map) = lock(&self.slot_map).clone() {
            if map.read_at.elapsed() < SLOT_MAP_TTL {
                return Some(map);
            }
        }
        let reply: Result<Value, RedisError> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn())
            .await;
        let map = match reply {
            Ok(reply) => SlotMap::parse(&reply).map(Arc::new),
            Err(e) => {
                tracing::warn!(error = %e, "CLUSTER SLOTS failed: batches are split by slot until it answers");
                None
            }
        };
        *lock(&self.slot_map) = map.clone();
        map
    }

    /// Sends `pipe` (errors answered per command) to `route`'s master on a cluster, or as the
    /// connection routes it.
    async fn send_pipeline(
        &self,
        pipe: &Pipeline,
        route: Option<Route>,
    ) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
        match (route, &self.connection) {
            (Some(route), Connection::Cluster(cluster)) => {
                let mut cluster = cluster.clone();
                let values = cluster
                    .route_pipeline(
                        pipe.clone(),
                        0,
                        pipe.len(),
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await?;
                Ok(values
                    .into_iter()
                    .map(|v| match v {
                        Value::ServerError(e) => Err(RedisError::from(e)),
                        other => Ok(other),
                    })
                    .collect())
            }
            _ => pipe.query_async(&mut self.conn()).await,
        }
    }

    /// Live appends of several groups as ONE pipeline: every script, then (with
    /// `wait_replicas > 0`) one `WAIT` that covers all of them, on one connection in one round
    /// trip. Each script stays atomic on its own; a script's error answers its own group only.
    async fn append_pipeline(
        &self,
        groups: &[&EventGroup],
        route: Option<Route>,
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        let mut results: Vec<Option<Result<AppendOutcome, StoreError>>> = groups
            .iter()
            .map(|g| validate_group(g).err().map(Err))
            .collect();
        let sent: Vec<usize> = (0..groups.len())
            .filter(|i| results[*i].is_none())
            .collect();
        if sent.is_empty() {
            return results.into_iter().flatten().collect();
        }
        let wanted = self.settings.wait_replicas;
        let timeout_ms = u64::try_from(self.settings.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        // Each invocation is dropped once the pipeline holds its command: the payloads are held
        // once here (and once more while the pipeline is written), not twice.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for i in &sent {
            pipe.invoke_script(&self.append_invocation(KeySet::Live, "", groups[*i]));
        }
        if wanted > 0 {
            pipe.cmd("WAIT").arg(wanted).arg(timeout_ms);
        }
        let mut conn = self.conn();
        let mut replies: Result<Vec<redis::RedisResult<Value>>, RedisError> =
            self.send_pipeline(&pipe, route).await;
        // A server that lost its scripts (restart, SCRIPT FLUSH) answers NOSCRIPT: load, resend.
        let noscript = |r: &Result<Vec<redis::RedisResult<Value>>, RedisError>| match r {
            Ok(items) => items.iter().any(|i| {
                i.as_ref().is_err_and(|e| {
                    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                })
            }),
            Err(e) => e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
        };
        if noscript(&replies) {
            if let Err(e) = self
                .scripts
                .append
                .prepare_invoke()
                .load_async(&mut conn)
                .await
            {
                let error = classified(e);
                return groups
                    .iter()
                    .zip(results)
                    .map(|(_, r)| r.unwrap_or_else(|| Err(error.clone())))
                    .collect();
            }
            replies = self.send_pipeline(&pipe, route).await;
        }
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                let error = classified(e);
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(error.clone())))
                    .collect();
            }
        };
        let mut replies = replies.into_iter();
        let mut scripted: Vec<Result<Vec<Value>, StoreError>> = Vec::with_capacity(sent.len());
        for _ in &sent {
            scripted.push(match replies.next() {
                Some(Ok(Value::Array(items))) => Ok(items),
                Some(Ok(other)) => Err(protocol(format!("{other:?}"))),
                Some(Err(e)) => Err(classified(e)),
                None => Err(protocol("a pipeline reply is missing")),
            });
        }
        if wanted > 0 {
            let acks = match replies.next() {
                Some(Ok(Value::Int(acks))) => acks,
                _ => -1,
            };
            if acks < i64::from(wanted) {
                // Not durable: every write of the pipeline is retried (and replays idempotently).
                let error = crate::store::classify::redis::too_few_replicas(
                    acks.max(0),
                    wanted,
                    timeout_ms,
                );
                for outcome in scripted.iter_mut() {
                    if outcome.is_ok() {
                        *outcome = Err(error.clone());
                    }
                }
            }
        }
        for (i, outcome) in sent.into_iter().zip(scripted) {
            results[i] = Some(outcome.and_then(|reply| self.append_reply(reply, groups[i])));
        }
        results.into_iter().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Values of `CLUSTER KEYSLOT` on a real server.
        assert_eq!(slot_of_key("foo"), 12182);
        assert_eq!(slot_of_key("bar"), 5061);
        assert_eq!(slot_of_key("mm:epoch:{u-17}"), slot_of_key("u-17"));
        assert_eq!(slot_of_key("{}x"), slot_of_key("{}x"));
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    #[test]
    fn a_slot_map_names_the_master_of_each_slot() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("127.0.0.1", 7001),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                node("127.0.0.1", 7002),
            ]),
        ]);
        let map = SlotMap::parse(&reply).expect("parses");
        assert_eq!(map.master(0), Some("127.0.0.1:7000"));
        assert_eq!(map.master(5461), Some("127.0.0.1:7001"));
        assert_eq!(map.master(16383), Some("127.0.0.1:7002"));
        assert_eq!(SlotMap::parse(&Value::Int(1)).map(|m| m.ranges.len()), None);
    }
}
