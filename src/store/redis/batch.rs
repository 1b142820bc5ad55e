//! Batches of live appends (the daemon's, `replay`'s and `apply`'s `append_runs`).
//!
//! On one server a batch is ONE pipeline: a script call per run (`append.lua` for one group,
//! `append_run.lua` for more), then (with `wait_replicas > 0`) one `WAIT` covering all of
//! them, on one connection in one round trip.
//!
//! On a Redis Cluster each run is its own request (its script call, then its own `WAIT` with
//! `wait_replicas > 0`), sent to the master of its user's slot by the store's `SlotRouter`, all
//! at once: the requests of one node share its multiplexed connection back to back, so the batch
//! still costs about one round trip per node. One request per script call is what keeps every
//! outcome the answer of the one execution that changed the store while slots move (SPEC 7.2,
//! "The cluster may change under load"): a `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or
//! `LOADING` answer comes before the script runs, and the router sends again the request that
//! got it and no other (see `slot_router.rs` for why not the redis crate's cluster client).

use std::collections::HashMap;

use redis::{Pipeline, RedisError, Value};

use super::keys::{self, KeySet};
use super::{classified, protocol, validate_group, RedisStore};
use crate::model::{AppendOutcome, EventGroup, StoreError};

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
    /// as `lua/append.lua` names them: one pipeline on a single server; on a cluster one request
    /// per run, all sent at once (see the module's doc). Answers each run in the order given.
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
        futures::future::join_all(runs.iter().map(|run| {
            let slot = run
                .first()
                .map_or(0, |g| slot_of_key(&keys::tag(&g.mailbox.user_id)));
            async move {
                let mut answers = self.append_pipeline(copy, holder, &[run], Some(slot)).await;
                let answer = answers.pop().unwrap_or_default();
                if answer.is_empty() && !run.is_empty() {
                    return vec![Err(protocol(
                        "a cluster request answered no append of its run",
                    ))];
                }
                answer
            }
        }))
        .await
    }

    /// Sends `pipe` (errors answered per command) to the master of `slot` on a cluster (one
    /// run's request, redirections followed for it alone by the store's [`SlotRouter`]), or on
    /// the one connection.
    ///
    /// [`SlotRouter`]: super::slot_router::SlotRouter
    async fn send_pipeline(
        &self,
        pipe: &Pipeline,
        slot: Option<u16>,
    ) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
        match (slot, &self.router) {
            (Some(slot), Some(router)) => router.send(slot, pipe).await,
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
        slot: Option<u16>,
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
            for (i, answers) in self.send_runs(copy, holder, &valid, &sent, slot).await {
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
        slot: Option<u16>,
    ) -> Vec<(usize, Vec<Result<AppendOutcome, StoreError>>)> {
        let mut answered = self.send_runs_once(copy, holder, runs, sent, slot).await;
        let missing: Vec<usize> = answered
            .iter()
            .filter(|(_, a)| a.is_none())
            .map(|(i, _)| *i)
            .collect();
        if !missing.is_empty() {
            let scripts = [&self.scripts.append, &self.scripts.append_run];
            let loaded = match (slot, &self.router) {
                // The master of the slot, wherever the table says it is now.
                (Some(slot), Some(router)) => router.load_scripts(slot, &scripts).await,
                _ => {
                    let mut conn = self.conn();
                    let mut loaded = Ok(());
                    for script in scripts {
                        if let Err(e) = script.prepare_invoke().load_async(&mut conn).await {
                            loaded = Err(e);
                            break;
                        }
                    }
                    loaded
                }
            }
            .map_err(classified);
            let again = match loaded {
                Ok(()) => {
                    self.send_runs_once(copy, holder, runs, &missing, slot)
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
        slot: Option<u16>,
    ) -> Vec<(usize, Option<Vec<Result<AppendOutcome, StoreError>>>)> {
        let wanted = self.settings.wait_replicas;
        let timeout_ms = self.wait_timeout_ms();
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
        let replies = match self.send_pipeline(&pipe, slot).await {
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
                // Not durable: every answer of the pipeline is retried (writes replay
                // idempotently). Verdicts too (a conflict, a corrupt mailbox): they were read
                // from state no replica acknowledged, such as a master that restarted empty and
                // still serves its slots until the cluster demotes it; when the state is real,
                // the retry answers the same once replicas acknowledge. Each run answers the
                // error for its first group and stops there.
                let error = crate::store::classify::redis::too_few_replicas(
                    acks.max(0),
                    wanted,
                    timeout_ms,
                );
                for answers in answered.iter_mut().filter_map(|(_, a)| a.as_mut()) {
                    answers.clear();
                    answers.push(Err(error.clone()));
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
}
