//! Redis must not evict the mailboxes' keys (SPEC 5 as amended).
//!
//! Under any `maxmemory-policy` but `noeviction` Redis deletes keys on its own once `maxmemory`
//! is reached, and a mailbox that lost a key has lost groups (the scripts then fail it closed,
//! but the groups are gone until a repair). Several managed Redis offerings default to an
//! evicting policy. So the policy of every master is read (`CONFIG GET maxmemory-policy`, or
//! `INFO memory` where `CONFIG` is not granted) and [`verdict`] decides, in one place, for the
//! daemon's start and its periodic re-check, every command that writes, and `check-config
//! --connect`: anything but `noeviction` is refused unless `store.redis.allow_eviction = true`,
//! which turns the refusal into a warning (and `materializer_store_evicting` 1).

use super::*;

/// One master's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePolicy {
    /// The master's address (the redacted URL of a standalone server).
    pub node: String,
    pub policy: String,
    /// `used_memory` and `maxmemory` of `INFO memory` (bytes; no limit is `None`), when the
    /// server reports them: a master at its limit refuses every script that adds data (`OOM`).
    pub memory: Option<(u64, u64)>,
}

impl NodePolicy {
    /// The master is at or over its `maxmemory`: writes that add data are refused (SPEC 7.3).
    pub fn full(&self) -> bool {
        self.memory.is_some_and(|(used, limit)| used >= limit)
    }
}

/// The readiness line of the masters at 90% of their `maxmemory` or more, `None` when none is
/// (SPEC 7.3: "store full", naming the master). Only a master at its limit fails readiness
/// ([`NodePolicy::full`]); a nearer one is named, since a master refuses a large call before
/// `INFO` shows it at the limit.
pub fn full_line(policies: &[NodePolicy]) -> Option<String> {
    let near = |p: &&NodePolicy| p.memory.is_some_and(|(used, limit)| used * 10 >= limit * 9);
    let any_full = policies.iter().any(NodePolicy::full);
    let full: Vec<String> = policies
        .iter()
        .filter(near)
        .filter_map(|p| {
            let (used, limit) = p.memory?;
            Some(format!(
                "{} uses {:.1} MiB of maxmemory {:.1} MiB",
                p.node,
                used as f64 / 1_048_576.0,
                limit as f64 / 1_048_576.0
            ))
        })
        .collect();
    (!full.is_empty()).then(|| {
        if any_full {
            format!(
                "store full: {}: writes are refused (OOM) and wait, nothing is dead-lettered; free memory or raise maxmemory",
                full.join("; ")
            )
        } else {
            format!("near maxmemory: {}", full.join("; "))
        }
    })
}

/// The policy that never evicts.
pub const NO_EVICTION: &str = "noeviction";

/// What the masters' policies mean for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every master is `noeviction`.
    Safe { masters: usize },
    /// A master evicts, and `store.redis.allow_eviction` accepts it: the warning to log.
    Allowed(String),
    /// A master evicts: the refusal, naming the policy, the master and the fix.
    Refused(String),
}

impl Verdict {
    /// Whether a master may evict keys (refused or allowed).
    pub fn evicting(&self) -> bool {
        !matches!(self, Self::Safe { .. })
    }
}

/// The one decision on the masters' policies.
pub fn verdict(policies: &[NodePolicy], allow_eviction: bool) -> Verdict {
    let evicting: Vec<&NodePolicy> = policies
        .iter()
        .filter(|p| !p.policy.eq_ignore_ascii_case(NO_EVICTION))
        .collect();
    if evicting.is_empty() {
        return Verdict::Safe {
            masters: policies.len(),
        };
    }
    let which = evicting
        .iter()
        .map(|p| format!("maxmemory-policy {} on {}", p.policy, p.node))
        .collect::<Vec<_>>()
        .join(", ");
    if allow_eviction {
        Verdict::Allowed(format!(
            "Redis evicts keys ({which}) and store.redis.allow_eviction = true accepts it: a mailbox that loses a key to eviction fails closed (corrupt) and must be rebuilt with replay --reset-mailboxes"
        ))
    } else {
        Verdict::Refused(format!(
            "Redis evicts keys ({which}): an evicted key silently takes mailbox groups with it; set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction and in redis.conf, or the managed service's parameter), or set store.redis.allow_eviction = true to run anyway"
        ))
    }
}

impl RedisStore {
    /// The `maxmemory-policy` of every master.
    pub async fn eviction_policies(&self) -> Result<Vec<NodePolicy>, StoreError> {
        let mut policies = Vec::new();
        for (node, mut connection) in self.masters().await? {
            let (policy, memory) = policy_of(&mut connection).await?;
            policies.push(NodePolicy {
                node,
                policy,
                memory,
            });
        }
        Ok(policies)
    }

    /// What the daemon's readiness watch reads of every master, in one pass over them: its
    /// `maxmemory-policy`, and on a cluster the slots it reports open (`open_slots`).
    pub async fn master_readings(
        &self,
    ) -> Result<(Vec<NodePolicy>, Vec<super::open_slots::OpenSlot>), StoreError> {
        let mut policies = Vec::new();
        let mut open = Vec::new();
        for (node, mut connection) in self.masters().await? {
            let (policy, memory) = policy_of(&mut connection).await?;
            if self.settings.cluster {
                open.extend(super::open_slots::read(&node, &mut connection).await?);
            }
            policies.push(NodePolicy {
                node,
                policy,
                memory,
            });
        }
        open.sort();
        Ok((policies, open))
    }
}

/// The `maxmemory_policy` line of `INFO memory`, falling back to `CONFIG GET
/// maxmemory-policy` (a managed service that hides it from `INFO`). `INFO` first: the ACL user
/// of the grants table has `+info` and no `+config|get`, which would also show secrets. With it,
/// the memory used and the limit, when `INFO` tells them.
async fn policy_of(
    connection: &mut Connection,
) -> Result<(String, Option<(u64, u64)>), StoreError> {
    let info: Result<String, RedisError> = redis::cmd("INFO")
        .arg("memory")
        .query_async(connection)
        .await;
    let field = |name: &str| -> Option<String> {
        info.as_ref().ok().and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|p| p.trim().to_owned())
        })
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let memory = match (number("used_memory:"), number("maxmemory:")) {
        (Some(used), Some(limit)) if limit > 0 => Some((used, limit)),
        _ => None,
    };
    if let Some(policy) = field("maxmemory_policy:") {
        return Ok((policy, memory));
    }
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(connection)
        .await
        .map_err(|e| match &info {
            Err(info_error) => StoreError::Unavailable {
                backend: BACKEND,
                detail: format!(
                    "neither INFO memory ({info_error}) nor CONFIG GET maxmemory-policy ({e}) \
                     tells the eviction policy"
                ),
            },
            Ok(_) => classified(e),
        })?;
    config
        .get(1)
        .cloned()
        .map(|policy| (policy, memory))
        .ok_or_else(|| StoreError::Unavailable {
            backend: BACKEND,
            detail: "neither INFO memory nor CONFIG GET maxmemory-policy tells the eviction policy"
                .to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(node: &str, policy: &str) -> NodePolicy {
        NodePolicy {
            memory: None,
            node: node.to_owned(),
            policy: policy.to_owned(),
        }
    }

    #[test]
    fn only_noeviction_everywhere_is_safe() {
        let all = [node("a:1", "noeviction"), node("b:1", "noeviction")];
        assert_eq!(verdict(&all, false), Verdict::Safe { masters: 2 });
        assert_eq!(verdict(&all, true), Verdict::Safe { masters: 2 });
    }

    /// One evicting master of three is enough to refuse, and the refusal names it, its policy
    /// and the fix; the override turns it into a warning.
    #[test]
    fn one_evicting_master_is_refused_unless_allowed() {
        let masters = [
            node("a:1", "noeviction"),
            node("b:1", "allkeys-lru"),
            node("c:1", "noeviction"),
        ];
        let Verdict::Refused(text) = verdict(&masters, false) else {
            panic!("not refused");
        };
        assert!(
            text.contains("maxmemory-policy allkeys-lru on b:1"),
            "{text}"
        );
        assert!(!text.contains("a:1"), "{text}");
        assert!(
            text.contains("noeviction") && text.contains("allow_eviction"),
            "{text}"
        );
        let allowed = verdict(&masters, true);
        assert!(matches!(&allowed, Verdict::Allowed(t) if t.contains("allkeys-lru on b:1")));
        assert!(allowed.evicting());
        for policy in [
            "volatile-lru",
            "allkeys-lfu",
            "volatile-ttl",
            "allkeys-random",
        ] {
            assert!(
                verdict(&[node("a:1", policy)], false).evicting(),
                "{policy}"
            );
        }
    }
}
