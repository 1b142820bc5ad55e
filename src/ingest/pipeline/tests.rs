//! The window's rules one by one: admission in source order, lanes and their runs, settling,
//! dead letters and the watermark, and the pause/resume hysteresis.

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

fn ok() -> Result<DeliveryOutcome, StoreError> {
    Ok(DeliveryOutcome::Append(AppendOutcome::Inserted))
}

fn at(offset: i64, index: usize) -> DeliveryRef {
    DeliveryRef { offset, index }
}

/// The meta of a record is its offset.
type P = PartitionPipeline<Vec<u8>, i64>;

/// The runs ready after an admission (taken, as a driver with room would).
struct Admitted {
    ready: Vec<DeliveryRef>,
}

fn take_all(p: &mut P) -> Vec<DeliveryRef> {
    let mut all = Vec::new();
    while let Some(run) = p.take_run() {
        all.extend(run);
    }
    all
}

fn admit(p: &mut P, offset: i64, users: &[(&str, u64)]) -> Admitted {
    p.admit(offset, vec![0; 10], 10, offset, Ok(record(users)))
        .expect("admitted");
    Admitted { ready: take_all(p) }
}

/// Completes `at` and takes the runs then ready.
fn complete(
    p: &mut P,
    at: DeliveryRef,
    result: Result<DeliveryOutcome, StoreError>,
) -> (Vec<DeliveryRef>, Option<Settled>) {
    let settled = p.complete(at, result);
    (take_all(p), settled)
}

#[test]
fn one_mailbox_runs_in_source_order_while_others_flow() {
    let mut p = P::new(10);
    assert_eq!(admit(&mut p, 0, &[("a", 1)]).ready, vec![at(0, 0)]);
    assert!(
        admit(&mut p, 1, &[("a", 2)]).ready.is_empty(),
        "a's second delivery waits behind its first"
    );
    assert_eq!(admit(&mut p, 2, &[("b", 1)]).ready, vec![at(2, 0)]);

    // b finishes first: final, but nothing is committable before offset 0 is.
    let (next, settled) = complete(&mut p, at(2, 0), ok());
    assert!(next.is_empty());
    assert!(settled.is_some_and(|s| s.dead_letter.is_none()));
    assert!(p.pop_final().is_empty());
    assert_eq!(p.watermark(), Some(0));

    let (next, _) = complete(&mut p, at(0, 0), ok());
    assert_eq!(next, vec![at(1, 0)], "a's next delivery is runnable now");
    let popped: Vec<i64> = p.pop_final().iter().map(|f| f.meta).collect();
    assert_eq!(popped, vec![0]);
    assert_eq!(p.watermark(), Some(1));
    complete(&mut p, at(1, 0), ok());
    let popped: Vec<i64> = p.pop_final().iter().map(|f| f.meta).collect();
    assert_eq!(popped, vec![1, 2], "final records leave in source order");
    assert_eq!(
        p.watermark(),
        Some(3),
        "everything final: one past the last"
    );
    assert!(p.is_empty());
}

#[test]
fn a_record_is_final_only_when_every_delivery_is_and_its_dead_letter_is_acked() {
    let mut p = P::new(10);
    let ready = admit(&mut p, 5, &[("a", 1), ("b", 1)]).ready;
    assert_eq!(ready.len(), 2);
    let (_, settled) = complete(&mut p, ready[0], ok());
    assert!(settled.is_none());
    let conflict = Err(StoreError::Conflict {
        kind: crate::model::error::ConflictKind::CrossDay {
            existing_day: 1,
            incoming_day: 2,
        },
    });
    let (_, settled) = complete(&mut p, ready[1], conflict);
    match settled.expect("settled").dead_letter {
        Some(DeadLetter::Failed(failures)) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].index, 1);
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    assert!(p.raw(5).is_some(), "raw bytes kept for the dead letter");
    assert!(
        p.pop_final().is_empty(),
        "not final until the dead letter is acked"
    );
    assert_eq!(p.watermark(), Some(5));
    assert!(p.dead_lettered(5));
    assert!(p.raw(5).is_none(), "raw bytes released once final");
    assert_eq!(
        p.bytes(),
        10,
        "still counted until the record leaves the window"
    );
    let popped = p.pop_final();
    assert_eq!(popped[0].outcome, RecordOutcome::DeadLettered);
    assert_eq!(p.watermark(), Some(6));
    assert_eq!(p.bytes(), 0);
}

#[test]
fn malformed_records_settle_at_once_and_redeliveries_are_ignored() {
    let mut p = P::new(2);
    let bad = decode_record(b"{", 1 << 20);
    assert!(bad.is_err());
    let admission = p.admit(0, b"{".to_vec(), 1, 0, bad).expect("admitted");
    assert!(!p.has_ready());
    assert!(matches!(
        admission.settled.and_then(|s| s.dead_letter),
        Some(DeadLetter::Malformed(_))
    ));
    assert!(p.admit(0, vec![], 0, 0, Ok(record(&[("a", 1)]))).is_none());
    admit(&mut p, 1, &[("a", 1)]);
    assert!(p.is_full());
    p.dead_lettered(0);
    assert_eq!(p.pop_final()[0].outcome, RecordOutcome::Malformed);
    assert!(!p.is_full());
    assert_eq!(p.watermark(), Some(1));
}

#[test]
fn the_window_counts_final_records_until_they_leave_and_resumes_at_half() {
    let mut p = P::new(4);
    let first = admit(&mut p, 0, &[("stuck", 1)]).ready;
    for offset in 1..4 {
        let ready = admit(&mut p, offset, &[("u", offset as u64)]).ready;
        for r in ready {
            complete(&mut p, r, ok());
        }
        // Each of u's deliveries is runnable only after the previous one.
        while let Some(next) = p
            .lanes
            .get(&UserId::parse("u").expect("id"))
            .and_then(|l| l.queue.front().copied())
        {
            complete(&mut p, next, ok());
        }
    }
    assert!(
        p.is_full(),
        "a blocked head keeps final records in the window"
    );
    assert!(p.pop_final().is_empty());
    complete(&mut p, first[0], ok());
    assert_eq!(p.pop_final().len(), 4);
    assert!(p.drained_to_half());
}

#[test]
fn a_lane_hands_out_what_waits_for_one_mailbox_as_one_run() {
    let mut p = P::new(1_000);
    assert_eq!(admit(&mut p, 0, &[("a", 1)]).ready, vec![at(0, 0)]);
    for offset in 1..=(RUN_MAX_GROUPS as i64 + 1) {
        assert!(admit(&mut p, offset, &[("a", offset as u64 + 1)])
            .ready
            .is_empty());
    }
    // The first run was the lone head; the next takes RUN_MAX_GROUPS, then the rest.
    let (run, _) = complete(&mut p, at(0, 0), ok());
    let want: Vec<DeliveryRef> = (1..=RUN_MAX_GROUPS as i64).map(|o| at(o, 0)).collect();
    assert_eq!(run, want);
    for (i, r) in run.iter().enumerate() {
        let (next, _) = complete(&mut p, *r, ok());
        if i + 1 < run.len() {
            assert!(next.is_empty(), "the run is still out");
        } else {
            assert_eq!(next, vec![at(RUN_MAX_GROUPS as i64 + 1, 0)]);
        }
    }
}

/// A run is one store call: when its answer is lost, each write's retry must find the store as
/// that write left it, so a same-day replace of a seq the run holds starts the next run
/// (`model::written`); the runs still take everything else in order.
#[test]
fn a_seq_is_written_at_most_once_per_run() {
    let mut p = P::new(100);
    assert_eq!(admit(&mut p, 0, &[("a", 1)]).ready, vec![at(0, 0)]);
    for (offset, seq) in [(1, 5), (2, 6), (3, 5), (4, 7), (5, 6), (6, 8)] {
        assert!(admit(&mut p, offset, &[("a", seq)]).ready.is_empty());
    }
    let (run, _) = complete(&mut p, at(0, 0), ok());
    assert_eq!(run, vec![at(1, 0), at(2, 0)], "seq 5 again ends the run");
    complete(&mut p, at(1, 0), ok());
    let (run, _) = complete(&mut p, at(2, 0), ok());
    assert_eq!(run, vec![at(3, 0), at(4, 0), at(5, 0), at(6, 0)]);
}

#[test]
fn an_epoch_or_a_truncate_ends_a_run() {
    let mut p = P::new(100);
    let epoch = |offset: i64, epoch: u32| {
        let raw = serde_json::json!({"dispatch_id": "d", "group_id": "g",
            "committed_at": 1_764_633_600_123u64, "deliveries": [{"user_id": "a",
            "epoch": epoch, "mailbox_seq": offset + 1,
            "events": [{"event_ordinal": 0, "payload": {}}]}]});
        decode_record(raw.to_string().as_bytes(), 1 << 20).expect("valid record")
    };
    let truncate = serde_json::json!({"type": "truncate_before", "user_id": "a",
        "epoch": 2, "before_seq": 3});
    let truncate = decode_record(truncate.to_string().as_bytes(), 1 << 20);
    let records = [
        Ok(epoch(0, 1)),
        Ok(epoch(1, 1)),
        Ok(epoch(2, 1)),
        Ok(epoch(3, 2)),
        truncate,
        Ok(epoch(5, 2)),
    ];
    for (offset, record) in records.into_iter().enumerate() {
        let record = record.expect("valid record");
        p.admit(offset as i64, vec![0; 10], 10, offset as i64, Ok(record));
    }
    // Formed when taken: everything waiting for epoch 1 at once.
    assert_eq!(
        take_all(&mut p),
        vec![at(0, 0), at(1, 0), at(2, 0)],
        "epoch 1 only"
    );
    complete(&mut p, at(0, 0), ok());
    complete(&mut p, at(1, 0), ok());
    let (run, _) = complete(&mut p, at(2, 0), ok());
    assert_eq!(run, vec![at(3, 0)], "epoch 2 up to the truncate");
    let (run, _) = complete(&mut p, at(3, 0), ok());
    assert_eq!(run, vec![at(4, 0)], "a truncate runs alone");
    let (run, _) = complete(&mut p, at(4, 0), ok());
    assert_eq!(run, vec![at(5, 0)]);
}

#[test]
fn what_a_stopped_run_did_not_reach_leads_the_next_run() {
    let mut p = P::new(100);
    admit(&mut p, 0, &[("a", 1)]);
    for offset in 1..=4 {
        admit(&mut p, offset, &[("a", offset as u64 + 1)]);
    }
    let (run, _) = complete(&mut p, at(0, 0), ok());
    assert_eq!(run.len(), 4);
    // The store answered 1, stopped at 2 (retried, not complete), never reached 3 and 4.
    assert!(complete(&mut p, at(1, 0), ok()).0.is_empty());
    p.not_reached(at(3, 0));
    p.not_reached(at(4, 0));
    assert!(take_all(&mut p).is_empty(), "2 is still out");
    p.not_reached(at(3, 0));
    assert!(take_all(&mut p).is_empty(), "counted once");
    let (run, _) = complete(&mut p, at(2, 0), ok());
    assert_eq!(run, vec![at(3, 0), at(4, 0)]);
    assert_eq!(p.pop_final().len(), 3);
    assert_eq!(p.watermark(), Some(3), "the unreached ones hold the commit");
}

/// A transactional partition's last offsets are markers, never delivered: once the source says
/// its position is past them, the watermark follows as soon as every record before is final,
/// never while one still waits, and an older position changes nothing.
#[test]
fn the_watermark_skips_offsets_the_source_says_hold_no_record() {
    let mut p = P::new(10);
    p.skip_to(4);
    assert_eq!(
        p.watermark(),
        Some(4),
        "an empty window starts at the position"
    );
    let ready = admit(&mut p, 4, &[("a", 1)]).ready;
    // Offset 5 is a commit marker: the source's position is 6 while offset 4 waits.
    p.skip_to(6);
    assert_eq!(
        p.watermark(),
        Some(4),
        "never past a record that is not final"
    );
    complete(&mut p, ready[0], ok());
    p.pop_final();
    assert_eq!(p.watermark(), Some(6), "past the marker once 4 is final");
    p.skip_to(5);
    assert_eq!(p.watermark(), Some(6), "an older position changes nothing");
    assert!(
        p.admit(5, vec![0; 10], 10, 5, Ok(record(&[("a", 2)])))
            .is_none(),
        "an offset below the position is a redelivery"
    );
    assert_eq!(admit(&mut p, 6, &[("a", 2)]).ready.len(), 1);
    assert_eq!(p.watermark(), Some(6));
}

/// SPEC 7 "a corrupt mailbox holds only itself": once its user is parked, the user's other
/// deliveries (already waiting, and admitted later) are skipped, the other users' records leave
/// the window however many the parked user receives, and the watermark stays at the head's
/// record. Once the head is final, the watermark stays at the first skipped delivery and the
/// window asks to be read again from there.
#[test]
fn a_parked_mailbox_holds_only_itself_and_asks_for_a_reread_once_healed() {
    let mut p = P::new(8);
    let head = admit(&mut p, 0, &[("hot", 1)]).ready;
    assert_eq!(head, vec![at(0, 0)]);
    assert!(admit(&mut p, 1, &[("hot", 2)]).ready.is_empty());
    // hot's head fails closed: parked. Its waiting delivery at offset 1 is skipped.
    let settled = p.park(at(0, 0));
    assert_eq!(
        settled.len(),
        1,
        "offset 1 held only hot's skipped delivery"
    );
    assert_eq!(p.watermark(), Some(0));
    // Many more records: hot's are skipped, b's flow and leave; the window never fills.
    for offset in 2..100 {
        let users: &[(&str, u64)] = if offset % 2 == 0 {
            &[("hot", offset as u64 + 1)]
        } else {
            &[("b", offset as u64)]
        };
        for r in admit(&mut p, offset, users).ready {
            complete(&mut p, r, ok());
        }
        let popped = p.pop_final();
        assert!(
            popped.iter().all(|f| f.meta != 0),
            "the head's record stays"
        );
        assert!(
            !p.is_full(),
            "offset {offset}: the window holds only hot's head"
        );
        assert_eq!(
            p.watermark(),
            Some(0),
            "nothing past hot's head is committable"
        );
    }
    assert_eq!(p.in_flight(), 1);
    assert_eq!(p.reread_from(), None, "hot is still blocked");
    let (_, skipped, first) = p.skipped().next().expect("hot is parked");
    assert_eq!((skipped, first), (50, Some(1)));

    // The head heals (a repair): its record leaves, the watermark waits at the first skipped
    // delivery, and hot's later deliveries are still skipped until the window is read again.
    complete(&mut p, at(0, 0), ok());
    assert_eq!(p.pop_final().len(), 1);
    assert_eq!(p.watermark(), Some(1));
    assert_eq!(p.reread_from(), Some(1));
    assert!(admit(&mut p, 100, &[("hot", 200)]).ready.is_empty());
    assert_eq!(p.watermark(), Some(1));
}

/// A record holding a parked head and another user's delivery leaves only when both are final;
/// a record holding a skipped delivery and a refused one still goes to the dead-letter topic.
#[test]
fn records_shared_with_a_parked_mailbox_settle_by_their_other_deliveries() {
    let mut p = P::new(8);
    let ready = admit(&mut p, 0, &[("hot", 1), ("b", 1)]).ready;
    assert_eq!(ready.len(), 2);
    assert!(p.park(at(0, 0)).is_empty());
    complete(&mut p, at(0, 1), ok());
    for r in admit(&mut p, 1, &[("c", 1)]).ready {
        complete(&mut p, r, ok());
    }
    let popped: Vec<i64> = p.pop_final().iter().map(|f| f.meta).collect();
    assert_eq!(
        popped,
        vec![1],
        "the head's record stays; the next one leaves"
    );
    let refused = Err(StoreError::Rejected {
        kind: crate::model::error::RejectKind::FutureCreatedAt,
        detail: "x".to_owned(),
    });
    let ready = admit(&mut p, 2, &[("hot", 2), ("d", 1)]).ready;
    assert_eq!(
        ready,
        vec![at(2, 1)],
        "hot's delivery is skipped at admission"
    );
    let (_, settled) = complete(&mut p, at(2, 1), refused);
    let settled = settled.expect("settled by d's refusal");
    assert!(settled.dead_letter.is_some());
}
