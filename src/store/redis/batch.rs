//! Batches of live appends (the daemon's, `replay`'s and `apply`'s `append_many`).
//!
//! On one server a batch is ONE pipeline: every script, then (with `wait_replicas > 0`) one
//! `WAIT` covering all of them, on one connection in one round trip.
//!
//! On a Redis Cluster a pipeline may only hold commands of one slot (the cluster client refuses
//! anything else with a client-side `CROSSSLOT` before sending), so a batch is first split by the
//! slot of each user's hash tag and the parts go out **concurrently**, each its own pipeline to
//! the node owning its slot. A record's outcome therefore never depends on which other records
//! shared its batch (SPEC 7.2). Each part keeps its own `WAIT` (WAIT covers one connection's
//! writes, and the parts reach different nodes).

use std::collections::HashMap;

use redis::cluster_routing::Slot;
use redis::{RedisError, Value};

use super::keys::{self, KeySet};
use super::{classified, protocol, validate_group, RedisStore};
use crate::model::{AppendOutcome, EventGroup, StoreError};

impl RedisStore {
    /// Live appends of several groups: one pipeline on a single server; on a cluster one
    /// pipeline per slot, all sent at once. Answers in the order given.
    pub(super) async fn append_pipelined(
        &self,
        groups: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        if !self.settings.cluster || groups.len() < 2 {
            return self.append_pipeline(groups).await;
        }
        let mut parts: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, group) in groups.iter().enumerate() {
            parts
                .entry(Slot::for_key(keys::tag(&group.mailbox.user_id)))
                .or_default()
                .push(i);
        }
        if parts.len() == 1 {
            return self.append_pipeline(groups).await;
        }
        let parts: Vec<Vec<usize>> = parts.into_values().collect();
        let answers = futures::future::join_all(parts.iter().map(|part| {
            let part_groups: Vec<&EventGroup> = part.iter().map(|i| groups[*i]).collect();
            async move { self.append_pipeline(&part_groups).await }
        }))
        .await;
        let mut results: Vec<Option<Result<AppendOutcome, StoreError>>> =
            (0..groups.len()).map(|_| None).collect();
        for (part, answer) in parts.iter().zip(answers) {
            for (i, outcome) in part.iter().zip(answer) {
                results[*i] = Some(outcome);
            }
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

    /// Live appends of several groups as ONE pipeline: every script, then (with
    /// `wait_replicas > 0`) one `WAIT` that covers all of them, on one connection in one round
    /// trip. Each script stays atomic on its own; a script's error answers its own group only.
    async fn append_pipeline(
        &self,
        groups: &[&EventGroup],
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
        let invocations: Vec<redis::ScriptInvocation<'_>> = sent
            .iter()
            .map(|i| self.append_invocation(KeySet::Live, "", groups[*i]))
            .collect();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for invocation in &invocations {
            pipe.invoke_script(invocation);
        }
        if wanted > 0 {
            pipe.cmd("WAIT").arg(wanted).arg(timeout_ms);
        }
        let mut conn = self.conn();
        let mut replies: Result<Vec<redis::RedisResult<Value>>, RedisError> =
            pipe.query_async(&mut conn).await;
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
            if let Err(e) = invocations[0].load_async(&mut conn).await {
                let error = classified(e);
                return groups
                    .iter()
                    .zip(results)
                    .map(|(_, r)| r.unwrap_or_else(|| Err(error.clone())))
                    .collect();
            }
            replies = pipe.query_async(&mut conn).await;
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
