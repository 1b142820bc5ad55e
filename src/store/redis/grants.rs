//! The Redis ACL a process of this product needs, and a probe that finds what a user lacks.
//!
//! [`acl_rules`] is the one list: the grants of docs/grants.md are checked against it by a
//! test, the ACL tests create their users from its line, and [`RedisStore::missing_grants`]
//! probes exactly these commands. Every process that opens a Redis store (the daemon, `replay`,
//! `dlq redrive`, `apply`, `scan`, `inspect`, `truncate`, `promote`, `patrol`, `check-config
//! --connect`) runs the probe before it touches a mailbox: a user without a rule is refused up
//! front, with the rule named, instead of failing inside a script half way through a batch
//! (Redis's error from inside a script does not name the command).
//!
//! - Key pattern `~P:*`: every key of the product carries the prefix (`store.redis.key_prefix`);
//!   the user needs nothing outside it. No pub/sub channel (`resetchannels`).
//! - Commands outside scripts: `PING` (the connection check), `INFO` (the eviction policy and the
//!   server version: `CONFIG GET` is tried only when `INFO` does not tell, and is not granted: it
//!   would also show secrets), `EVALSHA` and `SCRIPT LOAD` (every write and read is a script),
//!   `SCAN` (`patrol`, and a repair collecting the staging copies of crashed repairs), `PTTL`
//!   (`explain`: the lease left on a repair fence), `WAIT`
//!   only with `wait_replicas > 0`, and on a cluster `CLUSTER SLOTS`, `CLUSTER NODES` (the slot
//!   table, the masters, open slots) and `ASKING` (a migrating slot).
//! - Commands the scripts call, checked by Redis against the same user: [`SCRIPT_COMMANDS`]. Two of
//!   them are also sent outside scripts: `EXISTS` (the store markers read at start) and `SET` (a
//!   slot's store marker, and `accept-store-loss`; see `store_marker`).

use redis::Script;

use super::{classified, RedisStore};
use crate::model::StoreError;

/// Commands the Lua scripts call (`lua/`), in the order `lua/grants_probe.lua` probes them.
pub const SCRIPT_COMMANDS: &[&str] = &[
    "set",
    "get",
    "mget",
    "exists",
    "type",
    "expireat",
    "pexpire",
    "expiretime",
    "hset",
    "hget",
    "hmget",
    "hgetall",
    "hkeys",
    "hdel",
    "zadd",
    "zrange",
    "zscore",
    "zcount",
    "zcard",
    "zrem",
    "zremrangebyscore",
    "rename",
    "time",
    "del",
];

/// Commands sent outside scripts by every process, whatever the topology.
pub const SERVER_COMMANDS: &[&str] = &["ping", "info", "evalsha", "script|load", "scan", "pttl"];

/// Sent only with `store.redis.wait_replicas > 0`.
pub const WAIT_COMMANDS: &[&str] = &["wait"];

/// Sent only with `store.redis.cluster = true`.
pub const CLUSTER_COMMANDS: &[&str] = &["cluster|slots", "cluster|nodes", "asking"];

/// The ACL rules of a user for key prefix `prefix`, ready for `ACL SETUSER <name> on >password
/// <rules>` or a `user` line of an ACL file.
pub fn acl_rules(prefix: &str, cluster: bool, wait: bool) -> String {
    let mut rules = vec![
        format!("~{prefix}:*"),
        "resetchannels".to_owned(),
        "-@all".to_owned(),
    ];
    let mut commands: Vec<&str> = SERVER_COMMANDS.to_vec();
    if wait {
        commands.extend(WAIT_COMMANDS);
    }
    if cluster {
        commands.extend(CLUSTER_COMMANDS);
    }
    commands.extend(SCRIPT_COMMANDS);
    rules.extend(commands.iter().map(|c| format!("+{c}")));
    rules.join(" ")
}

/// Whether a Redis error is an ACL denial (`NOPERM`, or a script's "can't run"/"can't access").
fn denied(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("noperm")
        || text.contains("no permissions")
        || text.contains("can't run this command")
        || text.contains("can't access at least one of the keys")
}

impl RedisStore {
    /// The ACL rules this connection's user lacks for what this store does (empty: none), each
    /// written as the rule to add (`+zadd`, `~mm:*`). Probes the scripts' commands with
    /// `lua/grants_probe.lua` (on every master of a cluster: ACLs are per node) and sends each
    /// other command once in a form that changes nothing.
    pub async fn missing_grants(&self) -> Result<Vec<String>, StoreError> {
        let prefix = self.settings.key_prefix.clone();
        let mut missing: Vec<String> = Vec::new();
        let mut add = |rule: String| {
            if !missing.contains(&rule) {
                missing.push(rule);
            }
        };
        let mut conn = self.conn();
        let mut server: Vec<(&str, redis::Cmd)> = vec![
            ("info", redis::cmd("INFO").arg("server").clone()),
            (
                "pttl",
                redis::cmd("PTTL")
                    .arg(format!("{prefix}:grants-probe:{{probe}}:s"))
                    .clone(),
            ),
            (
                "scan",
                redis::cmd("SCAN")
                    .arg(0)
                    .arg("MATCH")
                    .arg(format!("{prefix}:grants-probe:*"))
                    .arg("COUNT")
                    .arg(1)
                    .clone(),
            ),
        ];
        if self.settings.wait_replicas > 0 {
            server.push(("wait", redis::cmd("WAIT").arg(0).arg(0).clone()));
        }
        if self.settings.cluster {
            server.push(("cluster|slots", redis::cmd("CLUSTER").arg("SLOTS").clone()));
            server.push(("cluster|nodes", redis::cmd("CLUSTER").arg("NODES").clone()));
        }
        for (rule, command) in server {
            if let Err(e) = command.query_async::<redis::Value>(&mut conn).await {
                if denied(&e) && e.to_string().contains("key") {
                    add(format!("~{prefix}:*"));
                } else if denied(&e) {
                    add(format!("+{rule}"));
                } else {
                    return Err(classified(e));
                }
            }
        }
        let probe = Script::new(include_str!("../../../lua/grants_probe.lua"));
        for tag in self.probe_tags().await? {
            let key = |kind: &str| format!("{prefix}:grants-probe:{{{tag}}}:{kind}");
            let mut invocation = probe.prepare_invoke();
            for kind in ["s", "h", "z", "r"] {
                invocation.key(key(kind));
            }
            if let Err(e) = invocation.load_async(&mut conn).await {
                if denied(&e) {
                    add("+script|load".to_owned());
                } else {
                    return Err(classified(e));
                }
            }
            match invocation.invoke_async::<Vec<String>>(&mut conn).await {
                Ok(rules) => {
                    for rule in rules {
                        add(if rule == "~keys" {
                            format!("~{prefix}:*")
                        } else {
                            rule
                        });
                    }
                }
                Err(e) if denied(&e) => {
                    // EVALSHA itself, or the probe keys: name what the error says it is.
                    if e.to_string().contains("key") {
                        add(format!("~{prefix}:*"));
                    } else {
                        add("+evalsha".to_owned());
                    }
                }
                Err(e) => return Err(classified(e)),
            }
        }
        Ok(missing)
    }

    /// One hash tag per master whose slot that master serves (standalone: one tag), so the
    /// probe runs on every master of a cluster.
    async fn probe_tags(&self) -> Result<Vec<String>, StoreError> {
        if !self.settings.cluster {
            return Ok(vec!["probe".to_owned()]);
        }
        let nodes: String = match redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.conn())
            .await
        {
            Ok(nodes) => nodes,
            // Already reported as a missing `+cluster|nodes`: probe one master.
            Err(e) if denied(&e) => return Ok(vec!["probe".to_owned()]),
            Err(e) => return Err(classified(e)),
        };
        let mut tags = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].split(',').any(|f| f == "master") {
                continue;
            }
            let Some((first, last)) = fields[8]
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<u16>().ok()?, b.parse::<u16>().ok()?)))
                .or_else(|| fields[8].parse::<u16>().ok().map(|s| (s, s)))
            else {
                continue;
            };
            // A tag's slot is uniform over 16,384: a range of a few slots is found within a few
            // ten thousand tries, a single slot within ~16,384 on average.
            if let Some(tag) = (0u32..1_000_000).map(|n| format!("probe-{n}")).find(|tag| {
                (first..=last).contains(&super::batch::slot_of_key(&format!("{{{tag}}}")))
            }) {
                tags.push(tag);
            }
        }
        if tags.is_empty() {
            tags.push("probe".to_owned());
        }
        Ok(tags)
    }
}
