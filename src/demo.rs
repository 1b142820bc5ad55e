//! The synthetic workload of `materializer demo`: a dispatch log that exercises every path of
//! the ingest rules (fresh groups, identical and different same-day replays, a cross-day
//! conflict, already-expired input, a truncate, a stale epoch, malformed records).
//!
//! Deterministic for a given seed and clock, so a demo run can be repeated exactly.

use serde_json::json;

use crate::model::DAY_MS;

/// Partitions (shards) of the demo's dispatch topic: user `demo-user-N` lives in shard `N % 3`.
pub const DEMO_SHARDS: u64 = 3;

/// The shard of a demo record: its first delivery's user, `N % DEMO_SHARDS`; 0 when the record
/// names no demo user (malformed input).
pub fn demo_shard(record: &[u8]) -> i32 {
    let text = String::from_utf8_lossy(record);
    text.split("\"demo-user-")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .map_or(0, |n| (n % DEMO_SHARDS) as i32)
}

/// The records of one workload, as the raw bytes a producer would write, in log order.
#[derive(Debug, Clone)]
pub struct Workload {
    pub records: Vec<Vec<u8>>,
}

use crate::splitmix::Rng;

fn dispatch(id: u64, committed_at: u64, deliveries: Vec<serde_json::Value>) -> Vec<u8> {
    json!({
        "type": "group_dispatch",
        "dispatch_id": format!("demo/msg-{id}"),
        "group_id": format!("demo-group-{}", id % 17),
        "committed_at": committed_at,
        "deliveries": deliveries,
    })
    .to_string()
    .into_bytes()
}

fn delivery(user: u64, epoch: u32, seq: u64, body: &str, events: u32) -> serde_json::Value {
    json!({
        "user_id": format!("demo-user-{user}"),
        "epoch": epoch,
        "mailbox_seq": seq,
        "events": (0..events)
            .map(|i| json!({"event_ordinal": i, "payload": {"kind": "message", "body": body, "part": i}}))
            .collect::<Vec<_>>(),
    })
}

/// Builds a workload for `users` mailboxes around `now_ms`.
pub fn synthetic_workload(users: u64, rounds: u64, now_ms: u64, seed: u64) -> Workload {
    let mut rng = Rng(seed);
    let mut records = Vec::new();
    let mut next_seq = vec![0u64; users as usize];
    let mut sent: Vec<(u64, u64, u64, Vec<u8>)> = Vec::new(); // (user, seq, committed_at, record)
    let mut id = 0u64;
    let today_start = now_ms - now_ms % DAY_MS;

    for round in 0..rounds {
        for user in 0..users {
            id += 1;
            next_seq[user as usize] += 1;
            let seq = next_seq[user as usize];
            // Mostly today and the last few days; group fan-out of one to three mailboxes is
            // modelled by occasionally delivering to the next user too.
            let committed_at =
                today_start.saturating_sub(rng.below(4) * DAY_MS) + rng.below(DAY_MS / 2);
            let mut deliveries = vec![delivery(
                user,
                1,
                seq,
                &format!("hello {round}"),
                1 + rng.below(3) as u32,
            )];
            if rng.below(5) == 0 && user + DEMO_SHARDS < users {
                // Fan-out stays inside the shard: a record lives in one partition.
                let other = user + DEMO_SHARDS;
                next_seq[other as usize] += 1;
                deliveries.push(delivery(other, 1, next_seq[other as usize], "fan-out", 1));
            }
            let record = dispatch(id, committed_at, deliveries);
            sent.push((user, seq, committed_at, record.clone()));
            records.push(record);
        }
        // Replays and the unhappy paths, a few per round.
        for _ in 0..(users / 4).max(1) {
            let (user, seq, committed_at, record) =
                sent[rng.below(sent.len() as u64) as usize].clone();
            match rng.below(4) {
                // A log replay: identical.
                0 | 1 => records.push(record),
                // Same day, other content.
                2 => {
                    id += 1;
                    records.push(dispatch(
                        id,
                        committed_at,
                        vec![delivery(user, 1, seq, "edited", 1)],
                    ));
                }
                // Another day: a cross-day conflict.
                _ => {
                    id += 1;
                    let other_day = committed_at.saturating_sub(DAY_MS * (1 + rng.below(3)));
                    records.push(dispatch(
                        id,
                        other_day,
                        vec![delivery(user, 1, seq, "moved", 1)],
                    ));
                }
            }
        }
        // Already-expired input for a fresh seq: merged into the gap boundary.
        let user = rng.below(users);
        next_seq[user as usize] += 1;
        id += 1;
        records.push(dispatch(
            id,
            today_start.saturating_sub(45 * DAY_MS),
            vec![delivery(user, 1, next_seq[user as usize], "ancient", 1)],
        ));
        // A stale epoch.
        id += 1;
        records.push(dispatch(
            id,
            today_start,
            vec![delivery(rng.below(users), 0, 1, "stale", 1)],
        ));
        // Malformed records: broken JSON and a bad user id.
        records.push(b"{\"type\": \"group_dispatch\", \"deliveries\": [".to_vec());
        id += 1;
        let mut bad = delivery(0, 1, 1, "x", 1);
        bad["user_id"] = json!("not a {valid} id");
        records.push(dispatch(id, today_start, vec![bad]));
    }
    // A truncate of the first mailbox.
    records.push(
        json!({"type": "truncate_before", "user_id": "demo-user-0", "epoch": 1, "before_seq": 2})
            .to_string()
            .into_bytes(),
    );
    Workload { records }
}
