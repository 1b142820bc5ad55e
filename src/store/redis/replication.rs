//! What a failover can take back (SPEC 7.3 "A store that went back in time"): a master with
//! replicas under `store.redis.wait_replicas = 0` acknowledges a write before any replica has
//! it, so a failover to a replica that missed the last writes loses them while the group's
//! committed offsets say they were applied. The daemon names every such master in a warning at
//! start.

use super::invoke::classified;
use super::RedisStore;
use crate::model::StoreError;

/// A master and how many replicas it reports connected (`INFO replication`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterReplicas {
    pub node: String,
    pub replicas: u32,
}

impl RedisStore {
    /// Every master's connected replicas.
    pub async fn master_replicas(&self) -> Result<Vec<MasterReplicas>, StoreError> {
        let mut out = Vec::new();
        for (node, mut connection) in self.masters().await? {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut connection)
                .await
                .map_err(classified)?;
            out.push(MasterReplicas {
                node,
                replicas: connected_replicas(&info),
            });
        }
        Ok(out)
    }

    /// The warning of SPEC 7.3 for the masters that have replicas while no write waits for them
    /// (`None`: none, or writes wait).
    pub async fn unreplicated_writes_warning(&self) -> Option<String> {
        if self.settings.wait_replicas > 0 {
            return None;
        }
        let masters = self.master_replicas().await.ok()?;
        warning(&masters)
    }
}

/// `connected_slaves:<n>` of `INFO replication` (0 when absent).
fn connected_replicas(info: &str) -> u32 {
    info.lines()
        .find_map(|line| line.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn warning(masters: &[MasterReplicas]) -> Option<String> {
    let with: Vec<String> = masters
        .iter()
        .filter(|m| m.replicas > 0)
        .map(|m| format!("{} ({} replica(s))", m.node, m.replicas))
        .collect();
    (!with.is_empty()).then(|| {
        format!(
            "Redis masters with replicas and store.redis.wait_replicas = 0: {}; a write is acknowledged before any replica has it, so a failover to a replica that missed the last writes loses them although their offsets are committed; set store.redis.wait_replicas to the replicas a write must reach",
            with.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_with_replicas_are_named_and_the_others_are_not() {
        assert_eq!(
            connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n"),
            2
        );
        assert_eq!(connected_replicas("role:master\n"), 0);
        let masters = [
            MasterReplicas {
                node: "a:1".to_owned(),
                replicas: 1,
            },
            MasterReplicas {
                node: "b:2".to_owned(),
                replicas: 0,
            },
        ];
        let line = warning(&masters).expect("one master has a replica");
        assert!(
            line.contains("a:1 (1 replica(s))") && !line.contains("b:2"),
            "{line}"
        );
        assert_eq!(warning(&masters[1..]), None);
    }
}
