//! Slots a reshard left open (SPEC 7.2: "a slot left migrating holds only the users of that slot,
//! turns readiness false with the slot named").
//!
//! A slot being moved is `MIGRATING` on its master and `IMPORTING` on the target for as long as
//! its keys are moved: milliseconds to seconds in a healthy `rebalance` or `reshard`. An
//! interrupted one (the operator's `redis-cli` killed, a node restarted meanwhile) leaves it open:
//! a script for a user of that slot whose keys are split between the two nodes, or that names a
//! key neither holds (a new day's bucket), is answered `TRYAGAIN` for ever, and that user's
//! deliveries wait (the others flow). `redis-cli --cluster fix` closes it. `CLUSTER NODES` shows a
//! node's own open slots on its `myself` line: `[1234->-<target id>]` (migrating) or
//! `[1234-<-<source id>]` (importing); every master is asked
//! (`RedisStore::master_readings`).

use super::{classified, Connection};
use crate::model::StoreError;

/// One open slot as one master reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpenSlot {
    pub slot: u16,
    /// The master that reports it (`host:port`).
    pub node: String,
    /// `migrating` or `importing`.
    pub state: &'static str,
    /// The other node's id.
    pub peer: String,
}

impl std::fmt::Display for OpenSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let direction = if self.state == "migrating" {
            "to"
        } else {
            "from"
        };
        write!(
            f,
            "slot {} {} on {} ({direction} node {})",
            self.slot, self.state, self.node, self.peer
        )
    }
}

/// The open slots of the `myself` line of a `CLUSTER NODES` reply of `node`.
pub(super) fn parse(node: &str, cluster_nodes: &str) -> Vec<OpenSlot> {
    let Some(myself) = cluster_nodes.lines().find(|line| {
        line.split_whitespace()
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|f| f == "myself"))
    }) else {
        return Vec::new();
    };
    myself
        .split_whitespace()
        .skip(8)
        .filter_map(|entry| {
            let inner = entry.strip_prefix('[')?.strip_suffix(']')?;
            let (slot, state, peer) = if let Some((slot, peer)) = inner.split_once("->-") {
                (slot, "migrating", peer)
            } else {
                let (slot, peer) = inner.split_once("-<-")?;
                (slot, "importing", peer)
            };
            Some(OpenSlot {
                slot: slot.parse().ok()?,
                node: node.to_owned(),
                state,
                peer: peer.to_owned(),
            })
        })
        .collect()
}

/// The slots the cluster master `node` (reached on `connection`) reports migrating or importing.
pub(super) async fn read(
    node: &str,
    connection: &mut Connection,
) -> Result<Vec<OpenSlot>, StoreError> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(connection)
        .await
        .map_err(classified)?;
    Ok(parse(node, &nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_slots_are_read_from_the_myself_line_only() {
        let reply = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922 [93-<-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1] [77-<-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]
";
        assert_eq!(
            parse("127.0.0.1:30001", reply),
            vec![
                OpenSlot {
                    slot: 5461,
                    node: "127.0.0.1:30001".to_owned(),
                    state: "migrating",
                    peer: "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1".to_owned(),
                },
                OpenSlot {
                    slot: 77,
                    node: "127.0.0.1:30001".to_owned(),
                    state: "importing",
                    peer: "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca".to_owned(),
                },
            ]
        );
        let closed = "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460\n";
        assert!(parse("127.0.0.1:30001", closed).is_empty());
    }
}
