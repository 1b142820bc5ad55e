//! Batches of live appends (the daemon's, `replay`'s and `apply`'s `append_runs`).
//!
//! On one server a batch is ONE pipeline: a script call per run (`append.lua` for one group,
//! `append_run.lua` for more), then (with `wait_replicas > 0`) one `WAIT` covering all of
//! them, on one connection in one round trip.
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
    /// Appends of several runs (each of one mailbox, [`MailboxStore::append_run`]) to the
    /// `copy` a write of `holder` reaches (live: `""`; a repair's staging copy: its holder id),
    /// as `lua/append.lua` names them: one pipeline on a single server; on a cluster one
    /// pipeline per master, all sent at once. Answers each run in the order given.
    ///
    /// [`MailboxStore::append_run`]: crate::store::MailboxStore::append_run
    pub(super) async fn append_runs_pipelined(
        &self,
        copy: KeySet,
        holder: &str,
        runs: &[&[&EventGroup]],
    ) -> Vec<Vec<Result<AppendOutcome, StoreError>>> {
        if !self.settings.cluster {
            return self.append_pipeline(copy, holder, runs, None).await;
        }
        let slots: Vec<u16> = runs
            .iter()
            .map(|run| {
                run.first()
                    .map_or(0, |g| slot_of_key(&keys::tag(&g.mailbox.user_id)))
            })
            .collect();
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
            let part_runs: Vec<&[&EventGroup]> = part.iter().map(|i| runs[*i]).collect();
            // Routed to the master of its first user's slot, which serves all of them.
            let route = Route::new(slots[part[0]], SlotAddr::Master);
            async move {
                self.append_pipeline(copy, holder, &part_runs, Some(route))
                    .await
            }
        }))
        .await;
        let mut results: Vec<Vec<Result<AppendOutcome, StoreError>>> =
            (0..runs.len()).map(|_| Vec::new()).collect();
        let mut moved = false;
        for (part, answer) in parts.iter().zip(answers) {
            for (i, outcomes) in part.iter().zip(answer) {
                moved |= outcomes.iter().any(|o| {
                    matches!(o, Err(StoreError::Unavailable { detail, .. }) if detail.contains("MOVED"))
                });
                results[*i] = outcomes;
            }
        }
        if moved {
            // A slot moved: read the map again before the next batch.
            *lock(&self.slot_map) = None;
        }
        for (answers, run) in results.iter_mut().zip(runs) {
            if answers.is_empty() && !run.is_empty() {
                answers.push(Err(protocol(
                    "a cluster part answered fewer appends than it was sent",
                )));
            }
        }
        results
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

    /// Appends of several runs to `copy` as ONE pipeline: a script call per run (`lua/append.lua`
    /// for a run of one group, `lua/append_run.lua` for more), then (with `wait_replicas > 0`)
    /// one `WAIT` that covers all of them, on one connection in one round trip. Each script
    /// stays atomic on its own; a script's error answers its own run only.
    async fn append_pipeline(
        &self,
        copy: KeySet,
        holder: &str,
        runs: &[&[&EventGroup]],
        route: Option<Route>,
    ) -> Vec<Vec<Result<AppendOutcome, StoreError>>> {
        // An invalid group is refused before anything is sent (final, it changes nothing, so
        // the rest of its run goes on); the valid ones of each run are sent as its command.
        let refused: Vec<Vec<Option<StoreError>>> = runs
            .iter()
            .map(|run| run.iter().map(|g| validate_group(g).err()).collect())
            .collect();
        let valid: Vec<Vec<&EventGroup>> = runs
            .iter()
            .zip(&refused)
            .map(|(run, refused)| {
                run.iter()
                    .zip(refused)
                    .filter(|(_, r)| r.is_none())
                    .map(|(g, _)| *g)
                    .collect()
            })
            .collect();
        let sent: Vec<usize> = (0..runs.len()).filter(|i| !valid[*i].is_empty()).collect();
        let mut scripted: Vec<Vec<Result<AppendOutcome, StoreError>>> =
            (0..runs.len()).map(|_| Vec::new()).collect();
        if !sent.is_empty() {
            for (i, answers) in self.send_runs(copy, holder, &valid, &sent, route).await {
                scripted[i] = answers;
            }
            // A run script the server refused as a whole (a Lua runtime error) names no
            // group: its groups go again one by one, so the refusal lands on its own group
            // (groups applied before the error replay idempotently).
            for i in &sent {
                if valid[*i].len() > 1
                    && matches!(scripted[*i].as_slice(), [Err(StoreError::Refused { .. })])
                {
                    scripted[*i] = crate::store::each_in_order(&valid[*i], |group| {
                        self.append_to(copy, holder, group)
                    })
                    .await;
                }
            }
        }
        runs.iter()
            .zip(refused)
            .zip(scripted)
            .map(|((run, refused), scripted)| {
                let mut scripted = scripted.into_iter();
                let mut answers = Vec::with_capacity(run.len());
                for refusal in refused {
                    let answer = match refusal {
                        Some(error) => Err(error),
                        None => match scripted.next() {
                            Some(answer) => answer,
                            // The script stopped before this group: so does the run.
                            None => break,
                        },
                    };
                    let stop = crate::store::ends_run(&answer);
                    answers.push(answer);
                    if stop {
                        break;
                    }
                }
                answers
            })
            .collect()
    }

    /// Sends the runs `sent` names (each non-empty, every group valid) as one pipeline and
    /// answers each, a prefix of its run. A server that lost a script (a restart, `SCRIPT
    /// FLUSH`, or the run script's first use) answers NOSCRIPT for that command alone: the
    /// scripts are loaded and only those runs are sent again, so no run is applied twice
    /// (twice would answer `unchanged` for what was `inserted`).
    async fn send_runs(
        &self,
        copy: KeySet,
        holder: &str,
        runs: &[Vec<&EventGroup>],
        sent: &[usize],
        route: Option<Route>,
    ) -> Vec<(usize, Vec<Result<AppendOutcome, StoreError>>)> {
        let mut answered = self.send_runs_once(copy, holder, runs, sent, route).await;
        let missing: Vec<usize> = answered
            .iter()
            .filter(|(_, a)| a.is_none())
            .map(|(i, _)| *i)
            .collect();
        if !missing.is_empty() {
            let mut conn = self.conn();
            let mut loaded = Ok(());
            for script in [&self.scripts.append, &self.scripts.append_run] {
                if let Err(e) = script.prepare_invoke().load_async(&mut conn).await {
                    loaded = Err(classified(e));
                    break;
                }
            }
            let again = match loaded {
                Ok(()) => {
                    self.send_runs_once(copy, holder, runs, &missing, route)
                        .await
                }
                Err(error) => missing
                    .iter()
                    .map(|i| (*i, Some(vec![Err(error.clone())])))
                    .collect(),
            };
            let mut again: HashMap<usize, Option<Vec<_>>> = again.into_iter().collect();
            for (i, answers) in answered.iter_mut() {
                if answers.is_none() {
                    *answers = again.remove(i).flatten();
                }
            }
        }
        answered
            .into_iter()
            .map(|(i, answers)| {
                (
                    i,
                    answers.unwrap_or_else(|| {
                        vec![Err(crate::store::classify::redis::lost_in_flight(
                            "NOSCRIPT: the script is still missing after loading it (flushed again?)",
                        ))]
                    }),
                )
            })
            .collect()
    }

    /// One pipeline of the runs `sent` names (and `WAIT` with `wait_replicas > 0`): each
    /// run's answers, or `None` for a run whose script the server did not have (NOSCRIPT:
    /// nothing of it ran).
    async fn send_runs_once(
        &self,
        copy: KeySet,
        holder: &str,
        runs: &[Vec<&EventGroup>],
        sent: &[usize],
        route: Option<Route>,
    ) -> Vec<(usize, Option<Vec<Result<AppendOutcome, StoreError>>>)> {
        let wanted = self.settings.wait_replicas;
        let timeout_ms = u64::try_from(self.settings.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        // Each invocation is dropped once the pipeline holds its command: the payloads are held
        // once here (and once more while the pipeline is written), not twice.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for i in sent {
            match runs[*i].as_slice() {
                [group] => pipe.invoke_script(&self.append_invocation(copy, holder, group)),
                run => pipe.invoke_script(&self.append_run_invocation(copy, holder, run)),
            };
        }
        if wanted > 0 {
            pipe.cmd("WAIT").arg(wanted).arg(timeout_ms);
        }
        let replies = match self.send_pipeline(&pipe, route).await {
            Ok(replies) => replies,
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                return sent.iter().map(|i| (*i, None)).collect();
            }
            Err(e) => {
                let error = classified(e);
                return sent
                    .iter()
                    .map(|i| (*i, Some(vec![Err(error.clone())])))
                    .collect();
            }
        };
        let mut replies = replies.into_iter();
        let mut answered = Vec::with_capacity(sent.len());
        for i in sent {
            let run = runs[*i].as_slice();
            let answers = match (replies.next(), run) {
                (Some(Err(e)), _)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    None
                }
                (Some(Ok(Value::Array(items))), [group]) => {
                    Some(vec![self.append_reply(items, group)])
                }
                (Some(Ok(Value::Array(items))), run) => Some(self.append_run_reply(items, run)),
                (Some(Ok(other)), _) => Some(vec![Err(protocol(format!("{other:?}")))]),
                (Some(Err(e)), _) => Some(vec![Err(classified(e))]),
                (None, _) => Some(vec![Err(crate::store::classify::redis::lost_in_flight(
                    "a pipeline reply is missing",
                ))]),
            };
            answered.push((*i, answers));
        }
        if wanted > 0 {
            let acks = match replies.next() {
                Some(Ok(Value::Int(acks))) => acks,
                _ => -1,
            };
            if acks < i64::from(wanted) {
                // Not durable: every write of the pipeline is retried (and replays
                // idempotently). A run ends at its first write, which answers the error.
                let error = crate::store::classify::redis::too_few_replicas(
                    acks.max(0),
                    wanted,
                    timeout_ms,
                );
                for answers in answered.iter_mut().filter_map(|(_, a)| a.as_mut()) {
                    if let Some(first_ok) = answers.iter().position(Result::is_ok) {
                        answers.truncate(first_ok);
                        answers.push(Err(error.clone()));
                    }
                }
            }
        }
        answered
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
