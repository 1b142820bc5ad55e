//! Script calls and their replies: `EVALSHA` with the script loaded on a miss, `WAIT` for a
//! durable write, and the one mapping of a script's error code or a client error to a
//! [`StoreError`].

use super::*;

/// Every error of the Redis client is classified in one place (SPEC 7, error classes).
pub(super) fn classified(e: RedisError) -> StoreError {
    crate::store::classify::redis::classify(&e)
}

/// A script reply this code does not understand (see `classify::redis::unexpected_reply`).
pub(super) fn protocol(detail: impl Into<String>) -> StoreError {
    crate::store::classify::redis::unexpected_reply(detail.into())
}

pub(super) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

pub(super) fn num(value: Option<&Value>) -> u64 {
    value.and_then(int).map_or(0, |i| i.max(0) as u64)
}

impl RedisStore {
    pub(super) async fn invoke(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let reply: Value = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(classified)?;
        match reply {
            Value::Array(items) => Ok(items),
            other => Err(protocol(format!("{other:?}"))),
        }
    }

    /// Runs a write script and, with `wait_replicas > 0`, makes it durable before answering: the
    /// script and `WAIT wait_replicas wait_timeout` go in ONE pipeline, so both reach the server
    /// on the same connection, back to back. (A multiplexed connection may reconnect between two
    /// separate calls, and a `WAIT` on a new connection covers none of the old one's writes.)
    /// The scripts rewrite the epoch key when asked (`propagate_for_wait`), so the `WAIT` covers
    /// what the answer was read from even when the script itself changed nothing.
    ///
    /// Fewer acknowledgements than `wait_replicas` is transient `Unavailable`: the write may or
    /// may not survive a failover, so the caller retries, and the replay is idempotent.
    pub(super) async fn invoke_durable(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let wanted = self.settings.wait_replicas;
        if wanted == 0 {
            return self.invoke(invocation).await;
        }
        let timeout_ms = self.wait_timeout_ms();
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout_ms);
        let mut conn = self.conn();
        let result: Result<(Value, i64), RedisError> = pipe.query_async(&mut conn).await;
        let (reply, acks) = match result {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                invocation.load_async(&mut conn).await.map_err(classified)?;
                pipe.query_async(&mut conn).await.map_err(classified)?
            }
            other => other.map_err(classified)?,
        };
        if acks < i64::from(wanted) {
            return Err(crate::store::classify::redis::too_few_replicas(
                acks, wanted, timeout_ms,
            ));
        }
        match reply {
            Value::Array(items) => Ok(items),
            other => Err(protocol(format!("{other:?}"))),
        }
    }

    /// `store.redis.wait_timeout_ms` as `WAIT` takes it (at least 1: 0 would wait for ever).
    pub(super) fn wait_timeout_ms(&self) -> u64 {
        u64::try_from(self.settings.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The durability flag the write scripts take (`'1'` when a `WAIT` follows them).
    pub(super) fn wait_flag(&self) -> &'static str {
        if self.settings.wait_replicas > 0 {
            "1"
        } else {
            "0"
        }
    }

    /// Maps a negative script reply to the contract's error.
    pub(super) fn script_error(&self, reply: &[Value]) -> StoreError {
        reply_error(reply, &self.policy)
    }
}

/// The one mapping of a negative script reply to the contract's error; `policy` words the
/// refusals that name a limit.
pub(super) fn reply_error(reply: &[Value], policy: &RetentionPolicy) -> StoreError {
    let code = reply.first().and_then(int).unwrap_or(0);
    let arg = |i: usize| reply.get(i).map(text).unwrap_or_default();
    let n = |i: usize| num(reply.get(i));
    match ScriptCode::from_code(code) {
        Some(ScriptCode::FutureCreatedAt) => {
            crate::model::rules::future_created_at(policy, n(1), n(2))
        }
        Some(ScriptCode::SpanExceeded) => {
            crate::model::rules::span_exceeded(policy, n(3), n(1), n(2))
        }
        Some(ScriptCode::CrossDay) => StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: n(1),
                incoming_day: n(2),
            },
        },
        Some(ScriptCode::UnsupportedFormat) => {
            StoreError::corrupt(CorruptKind::UnsupportedFormat { found: arg(1) })
        }
        Some(ScriptCode::IndexLost) => StoreError::corrupt(CorruptKind::IndexLost),
        Some(ScriptCode::MetaLost) => StoreError::corrupt(CorruptKind::MetaLost),
        Some(ScriptCode::IdentityMissing) => StoreError::corrupt(CorruptKind::IdentityMissing {
            seq: n(2),
            seqbucket_max_seq: n(1),
        }),
        Some(ScriptCode::BadProof) => StoreError::corrupt(CorruptKind::BadProof { detail: arg(1) }),
        Some(ScriptCode::EpochMismatch) => StoreError::EpochMismatch {
            current: arg(1).parse().ok(),
        },
        Some(ScriptCode::CursorTrimmed) => StoreError::CursorExpired {
            cursor: CursorExpired::Trimmed {
                resume_after: n(1).saturating_sub(1),
            },
        },
        Some(ScriptCode::CursorGap) => StoreError::CursorExpired {
            cursor: CursorExpired::ExpiredGap { boundary: n(1) },
        },
        Some(ScriptCode::UnderRepair) => StoreError::UnderRepair { holder: arg(1) },
        Some(ScriptCode::FenceLost) => StoreError::FenceLost {
            detail: match arg(1).as_str() {
                "" => "the repair fence lapsed (no fence exists)".to_owned(),
                other => format!("the repair fence is held by {other}"),
            },
        },
        Some(ScriptCode::StoreLost) => StoreError::store_lost(
            BACKEND,
            format!(
                "the store marker {} is gone: the data of this slot was wiped (FLUSHALL, a restart without persistence, a failover to an empty replica, a master replaced empty); writes wait until an operator rebuilds from the log or runs `materializer accept-store-loss`",
                arg(1)
            ),
        ),
        None => protocol(format!("code {code}")),
    }
}
