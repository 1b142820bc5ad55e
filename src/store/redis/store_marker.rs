//! "This store holds this product's data": one marker key per Redis Cluster slot that holds a
//! mailbox, so a store that lost everything (`FLUSHALL`, a restart without persistence, a
//! failover to an empty replica, one master of a cluster replaced empty) is told from a new one
//! before a write lands on it (SPEC 7.3).
//!
//! **The marker.** `P:store:{T}`, where `T` is a hash tag of the slot (so the marker lives in the
//! slot it vouches for, on whichever master holds that slot, and moves with the slot in a
//! reshard). It is written once, after the first successful write of a mailbox in its slot, and
//! never deleted by the product: a slot's marker disappears only with the slot's data.
//!
//! **The check, inside every script that answers from a mailbox.** Each script takes the
//! marker of its user's slot as `KEYS[7]` when this process knows the slot holds data (it saw the
//! marker at start, or wrote it since), and otherwise its own `KEYS[6]` again (nothing to check
//! yet). A script given a marker that is missing answers `store_lost` before it reads or writes
//! anything: the caller retries (nothing is dead-lettered), readiness turns false naming the
//! slot, and no write lands on the wiped data until an operator says what to do
//! (`materializer accept-store-loss` writes the markers back; rebuilding from the log is resetting
//! the group's offsets to the log's start, see docs/operations.md). Cost: one more key in the
//! read the scripts already start with (`MGET` of the fence and the epoch), or one `EXISTS`.
//!
//! **At start.** The markers present are read with one pipelined `EXISTS` per slot (16,384,
//! whatever the store's size). A store with no marker and no key of the prefix is empty: new, or wiped while no
//! process of the product watched. Only the daemon can tell the two apart, from its consumer
//! group's committed offsets: an empty store under a group that committed is a wipe, and the
//! daemon then expects every slot's marker (so every write waits) until the operator acts.
//!
//! **What it cannot see.** A slot that never held a mailbox has no marker, so its loss is no loss.
//! A master replaced empty while no daemon ran, in a cluster whose other masters kept their data,
//! is not found at start (the daemon learns which slots hold data from the markers themselves):
//! its mailboxes start over when written. A store that kept its markers but lost other keys is
//! the per-key case (SPEC 7.3's first bullet), answered `corrupt` by the scripts.
//!
//! Bound: 16,384 bits of what this process expects, and at most 16,384 marker keys on the server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Slots of a Redis Cluster (a standalone server uses the same markers).
pub(crate) const SLOTS: usize = 16_384;

/// A hash tag per slot: `TAGS[s]` hashes to slot `s`.
fn tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS];
        let mut missing = SLOTS;
        let mut n: u64 = 0;
        while missing > 0 {
            let candidate = format!("s{n}");
            let slot = usize::from(super::batch::slot_of_key(&candidate));
            if tags[slot].is_empty() {
                tags[slot] = candidate;
                missing -= 1;
            }
            n += 1;
        }
        tags
    })
}

/// The marker key of `slot`: `P:store:{T}`.
pub(crate) fn marker_key(prefix: &str, slot: u16) -> String {
    format!("{prefix}:store:{{{}}}", tags()[usize::from(slot) % SLOTS])
}

/// The slots this process knows hold data (their marker must exist).
#[derive(Debug)]
pub(crate) struct Expected {
    bits: Vec<AtomicU64>,
}

impl Default for Expected {
    fn default() -> Self {
        Self {
            bits: (0..SLOTS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Expected {
    pub(crate) fn contains(&self, slot: u16) -> bool {
        let slot = usize::from(slot) % SLOTS;
        self.bits[slot / 64].load(Ordering::Relaxed) & (1 << (slot % 64)) != 0
    }

    /// Marks `slot`; true when it was not marked before.
    pub(crate) fn insert(&self, slot: u16) -> bool {
        let slot = usize::from(slot) % SLOTS;
        let bit = 1 << (slot % 64);
        self.bits[slot / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// Every slot (a store found wiped at start: every write waits).
    pub(crate) fn insert_all(&self) {
        for word in &self.bits {
            word.store(u64::MAX, Ordering::Relaxed);
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.bits
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in [0u16, 1, 777, 16_383] {
            let key = marker_key("mm", slot);
            assert_eq!(super::super::batch::slot_of_key(&key), slot, "{key}");
            assert!(key.starts_with("mm:store:{"), "{key}");
        }
    }

    #[test]
    fn the_expected_slots_are_a_bit_each() {
        let expected = Expected::default();
        assert_eq!(expected.count(), 0);
        assert!(expected.insert(16_383));
        assert!(!expected.insert(16_383));
        assert!(expected.contains(16_383));
        assert!(!expected.contains(0));
        assert_eq!(expected.count(), 1);
        expected.insert_all();
        assert_eq!(expected.count(), 16_384);
    }
}
