//! The ordering core of one partition, free of Kafka and of the store so it can be tested alone.
//!
//! Records are admitted in offset order into a bounded window. Each record's deliveries join the
//! **lane** of their user (all epochs of a user share one lane, so an epoch move stays ordered
//! with the older epoch's records); a lane runs one delivery at a time in source order, lanes run
//! concurrently. A record is final when every delivery has a final outcome and, if it has to be
//! dead-lettered, the dead letter is acknowledged. The **watermark** is the lowest offset that is
//! not final: everything below it may be committed, nothing at or above it may — so a blocked
//! (corrupt) mailbox holds the commit at its record while other lanes keep flowing until the
//! window is full.
//!
//! Bounds: at most `max_in_flight` records (and their deliveries) are held; lanes only exist for
//! users with a delivery in the window.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::ingest::{DecodeError, Delivery, DeliveryOutcome, DispatchRecord};
use crate::model::{StoreError, UserId};

/// A delivery's address inside the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryRef {
    pub offset: i64,
    pub index: usize,
}

/// A delivery that ended rejected or in conflict: the reason its record is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub index: usize,
    pub delivery: Delivery,
    pub error: StoreError,
}

/// Why a final record must go to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetter {
    Malformed(DecodeError),
    Failed(Vec<DeliveryFailure>),
}

/// A record whose deliveries are all final, handed back for dead-lettering and counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub offset: i64,
    /// `None`: every delivery succeeded and the record is final now.
    pub dead_letter: Option<DeadLetter>,
    pub dispatch_id: Option<String>,
}

#[derive(Debug)]
struct Slot {
    deliveries: Vec<Delivery>,
    pending: usize,
    failures: Vec<DeliveryFailure>,
    malformed: Option<DecodeError>,
    dispatch_id: Option<String>,
    /// Deliveries all final; waiting for the dead letter to be acknowledged.
    settled: bool,
}

/// The window of one partition.
#[derive(Debug)]
pub struct PartitionPipeline {
    max_in_flight: usize,
    slots: BTreeMap<i64, Slot>,
    lanes: HashMap<UserId, VecDeque<DeliveryRef>>,
    /// One past the highest admitted offset.
    next_offset: Option<i64>,
}

impl PartitionPipeline {
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            slots: BTreeMap::new(),
            lanes: HashMap::new(),
            next_offset: None,
        }
    }

    /// True when no more records may be admitted: the caller pauses the partition.
    pub fn is_full(&self) -> bool {
        self.slots.len() >= self.max_in_flight
    }

    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// One past the highest offset admitted so far.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    /// The offset to commit: the first record not yet final, or one past the last admitted.
    pub fn watermark(&self) -> Option<i64> {
        self.slots.keys().next().copied().or(self.next_offset)
    }

    /// Admits the record at `offset` (strictly after every admitted one; an older offset is a
    /// redelivery and is ignored, returning `None`). Returns the deliveries that may start now
    /// and, for a malformed record, its immediate settlement.
    pub fn admit(
        &mut self,
        offset: i64,
        decoded: Result<DispatchRecord, DecodeError>,
    ) -> Option<(Vec<DeliveryRef>, Option<Settled>)> {
        if self.next_offset.is_some_and(|next| offset < next) {
            return None;
        }
        self.next_offset = Some(offset + 1);
        match decoded {
            Err(error) => {
                self.slots.insert(
                    offset,
                    Slot {
                        deliveries: Vec::new(),
                        pending: 0,
                        failures: Vec::new(),
                        malformed: Some(error.clone()),
                        dispatch_id: None,
                        settled: true,
                    },
                );
                Some((
                    Vec::new(),
                    Some(Settled {
                        offset,
                        dead_letter: Some(DeadLetter::Malformed(error)),
                        dispatch_id: None,
                    }),
                ))
            }
            Ok(record) => {
                let deliveries = record.deliveries();
                let mut ready = Vec::new();
                for (index, delivery) in deliveries.iter().enumerate() {
                    let lane = self
                        .lanes
                        .entry(delivery.mailbox().user_id.clone())
                        .or_default();
                    let delivery_ref = DeliveryRef { offset, index };
                    if lane.is_empty() {
                        ready.push(delivery_ref);
                    }
                    lane.push_back(delivery_ref);
                }
                self.slots.insert(
                    offset,
                    Slot {
                        pending: deliveries.len(),
                        deliveries,
                        failures: Vec::new(),
                        malformed: None,
                        dispatch_id: record.dispatch_id().map(str::to_owned),
                        settled: false,
                    },
                );
                Some((ready, None))
            }
        }
    }

    /// The delivery at `at`, while its record is in the window.
    pub fn delivery(&self, at: DeliveryRef) -> Option<&Delivery> {
        self.slots.get(&at.offset)?.deliveries.get(at.index)
    }

    /// Records the final result of the delivery at `at` (transient errors and corrupt mailboxes
    /// are retried by the caller and never arrive here). Returns the next delivery of the same
    /// lane, now runnable, and the record's settlement when this was its last delivery.
    pub fn complete(
        &mut self,
        at: DeliveryRef,
        result: &Result<DeliveryOutcome, StoreError>,
    ) -> (Option<DeliveryRef>, Option<Settled>) {
        let Some(slot) = self.slots.get_mut(&at.offset) else {
            return (None, None);
        };
        let Some(delivery) = slot.deliveries.get(at.index).cloned() else {
            return (None, None);
        };
        if slot.pending == 0 || slot.settled {
            return (None, None);
        }
        slot.pending -= 1;
        if let Err(error) = result {
            slot.failures.push(DeliveryFailure {
                index: at.index,
                delivery: delivery.clone(),
                error: error.clone(),
            });
        }
        let settled = if slot.pending == 0 {
            slot.settled = true;
            let dead_letter = if slot.failures.is_empty() {
                None
            } else {
                slot.failures.sort_by_key(|f| f.index);
                Some(DeadLetter::Failed(slot.failures.clone()))
            };
            Some(Settled {
                offset: at.offset,
                dead_letter,
                dispatch_id: slot.dispatch_id.clone(),
            })
        } else {
            None
        };

        let user = &delivery.mailbox().user_id;
        let mut next = None;
        if let Some(lane) = self.lanes.get_mut(user) {
            if lane.front() == Some(&at) {
                lane.pop_front();
            } else {
                lane.retain(|r| *r != at);
            }
            next = lane.front().copied();
            if lane.is_empty() {
                self.lanes.remove(user);
            }
        }
        (next, settled)
    }

    /// Marks a settled record final (its dead letter, if any, is acknowledged) and drops it
    /// from the window. Returns true when the watermark may have moved.
    pub fn finish(&mut self, offset: i64) -> bool {
        match self.slots.get(&offset) {
            Some(slot) if slot.settled => {
                self.slots.remove(&offset);
                true
            }
            _ => false,
        }
    }

    /// Whether the record at `offset` was malformed (for counting).
    pub fn was_malformed(&self, offset: i64) -> bool {
        self.slots
            .get(&offset)
            .is_some_and(|slot| slot.malformed.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::decode_record;
    use crate::model::AppendOutcome;

    fn record(users: &[(&str, u64)]) -> DispatchRecord {
        let deliveries: Vec<serde_json::Value> = users
            .iter()
            .map(|(user, seq)| {
                serde_json::json!({"user_id": user, "epoch": 1, "mailbox_seq": seq,
                    "events": [{"event_ordinal": 0, "payload": {"n": seq}}]})
            })
            .collect();
        let raw = serde_json::json!({"dispatch_id": "d", "group_id": "g",
            "committed_at": 1_764_633_600_123u64, "deliveries": deliveries});
        decode_record(raw.to_string().as_bytes(), 1 << 20).expect("valid record")
    }

    const OK: Result<DeliveryOutcome, StoreError> =
        Ok(DeliveryOutcome::Append(AppendOutcome::Inserted));

    #[test]
    fn one_mailbox_runs_in_source_order_while_others_flow() {
        let mut p = PartitionPipeline::new(10);
        let (ready, _) = p.admit(0, Ok(record(&[("a", 1)]))).expect("admitted");
        assert_eq!(
            ready,
            vec![DeliveryRef {
                offset: 0,
                index: 0
            }]
        );
        let (ready, _) = p.admit(1, Ok(record(&[("a", 2)]))).expect("admitted");
        assert!(
            ready.is_empty(),
            "a's second delivery waits behind its first"
        );
        let (ready, _) = p.admit(2, Ok(record(&[("b", 1)]))).expect("admitted");
        assert_eq!(
            ready,
            vec![DeliveryRef {
                offset: 2,
                index: 0
            }]
        );

        // b finishes first: its record is settled but the watermark stays at offset 0.
        let (next, settled) = p.complete(
            DeliveryRef {
                offset: 2,
                index: 0,
            },
            &OK,
        );
        assert_eq!(next, None);
        assert!(settled.is_some_and(|s| s.dead_letter.is_none()));
        assert!(p.finish(2));
        assert_eq!(p.watermark(), Some(0));

        let (next, _) = p.complete(
            DeliveryRef {
                offset: 0,
                index: 0,
            },
            &OK,
        );
        assert_eq!(
            next,
            Some(DeliveryRef {
                offset: 1,
                index: 0
            })
        );
        p.finish(0);
        assert_eq!(p.watermark(), Some(1));
        p.complete(
            DeliveryRef {
                offset: 1,
                index: 0,
            },
            &OK,
        );
        p.finish(1);
        assert_eq!(
            p.watermark(),
            Some(3),
            "everything final: one past the last"
        );
        assert!(p.is_empty());
    }

    #[test]
    fn a_record_is_final_only_when_every_delivery_is() {
        let mut p = PartitionPipeline::new(10);
        let (ready, _) = p
            .admit(5, Ok(record(&[("a", 1), ("b", 1)])))
            .expect("admitted");
        assert_eq!(ready.len(), 2);
        let (_, settled) = p.complete(ready[0], &OK);
        assert!(settled.is_none());
        let conflict = Err(StoreError::Conflict {
            kind: crate::model::error::ConflictKind::CrossDay {
                existing_day: 1,
                incoming_day: 2,
            },
        });
        let (_, settled) = p.complete(ready[1], &conflict);
        let settled = settled.expect("settled");
        match settled.dead_letter {
            Some(DeadLetter::Failed(failures)) => {
                assert_eq!(failures.len(), 1);
                assert_eq!(failures[0].index, 1);
            }
            other => panic!("expected a dead letter, got {other:?}"),
        }
        assert_eq!(
            p.watermark(),
            Some(5),
            "not final until the dead letter is acked"
        );
        p.finish(5);
        assert_eq!(p.watermark(), Some(6));
    }

    #[test]
    fn malformed_records_settle_at_once_and_redeliveries_are_ignored() {
        let mut p = PartitionPipeline::new(2);
        let bad = decode_record(b"{", 1 << 20);
        assert!(bad.is_err());
        let (ready, settled) = p.admit(0, bad).expect("admitted");
        assert!(ready.is_empty());
        assert!(matches!(
            settled.and_then(|s| s.dead_letter),
            Some(DeadLetter::Malformed(_))
        ));
        assert!(p.admit(0, Ok(record(&[("a", 1)]))).is_none());
        p.admit(1, Ok(record(&[("a", 1)])));
        assert!(p.is_full());
        p.finish(0);
        assert!(!p.is_full());
        assert_eq!(p.watermark(), Some(1));
    }
}
