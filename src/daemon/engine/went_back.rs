//! A store that went back in time under a running daemon (SPEC 7.3), healed at once rather than
//! at the next assignment.
//!
//! At each assignment the poll thread compares the store's record of what it holds
//! (`store::redis::applied`) with the committed offset. A failover to a replica that missed the
//! last writes can also happen while the daemon runs (a Redis Cluster's replica promoted, a
//! proxy that points at a new master): the group's assignment does not change, so that check
//! would not run until a rebalance. So every record write carries, per partition, the record
//! this process wrote last and the store acknowledged (its floor), and the store's script
//! leaves a key it finds below its floor as it is (the evidence) and names it. Such a partition
//! is read again from what the store holds, through the re-read of `reread.rs` (the window
//! closes, its calls come back, the poll thread seeks, a new window opens there): what the
//! store still holds answers `unchanged` or `superseded`, what it lost is written again. Its
//! watermarks are neither recorded nor handed to the offset store meanwhile, so the group never
//! commits past what the store holds, even if the process dies in between (the next owner's
//! assignment check then reads the same evidence).
//!
//! Bound: one offset per assigned partition.

use std::collections::BTreeMap;

use super::Engine;
use crate::daemon::events::{Event, StoreWentBack};

impl Engine {
    /// The positions of a record write, each with its floor: this process's last acknowledged
    /// record of the partition.
    pub(super) fn with_floors(&self, positions: &[(i32, i64)]) -> Vec<(i32, i64, Option<i64>)> {
        positions
            .iter()
            .map(|(partition, offset)| (*partition, *offset, self.recorded.get(partition).copied()))
            .collect()
    }

    /// A record write answered: the partitions the store holds below their floor are read again
    /// from there (and left out of `positions`); the others' records are this process's new
    /// floors.
    pub(super) fn went_back_found(
        &mut self,
        positions: &mut Vec<(i32, i64)>,
        behind: &BTreeMap<i32, i64>,
    ) {
        positions.retain(|(partition, _)| !behind.contains_key(partition));
        for (partition, offset) in positions.iter() {
            let floor = self.recorded.entry(*partition).or_insert(*offset);
            *floor = (*floor).max(*offset);
        }
        for (&partition, &holds_below) in behind {
            let recorded = self.recorded.remove(&partition).unwrap_or_default();
            self.unstored.remove(&partition);
            let Some(window) = self.driver.window_mut(&partition) else {
                continue;
            };
            if window.state.rewind_to.is_some() {
                continue;
            }
            StoreWentBack {
                partition,
                holds_below,
                committed: recorded,
            }
            .emit();
            window.state.rewind_to = Some(holds_below);
        }
    }
}
