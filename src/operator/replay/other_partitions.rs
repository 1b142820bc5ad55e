//! A replay over a range that spans a growth of the topic (SPEC 7.2, "more partitions keep each
//! user's order"). Once the topic grew, a keyed producer sends a user's next records to another
//! partition, so the user's history is split: its older records on a lower partition, its newer
//! ones on a higher one. The daemon orders the two (`daemon::partition_growth`); a replay reads
//! one partition, so on its own it would:
//! - without `--reset-mailboxes`, apply the range's older records over the newer ones a higher
//!   partition holds (a write from another partition applies, SPEC 7.2);
//! - with it, rebuild the mailbox from one partition's share of the history and swap it in,
//!   dropping what the other partitions hold.
//!
//! So, before anything is touched, the replay looks on the topic's other partitions for what it
//! would lose or revert — for a rebuild, any record of the named users; otherwise a later write
//! of a seq its range writes — and refuses (`user_on_other_partition`) when one is there, naming the
//! partitions and the order that is safe: the lowest partition holding the user first (rebuilt,
//! or replayed, with `--allow-other-partitions`), then each higher one for the user without
//! `--reset-mailboxes` — a write from another partition applies, so the newest record ends last,
//! as the daemon's order has it.
//!
//! What it reads: nothing on a one-partition topic, in a dry run, or with
//! `--allow-other-partitions`. For a rebuild, every other partition from its log start (the
//! user's history anywhere in the log counts). Otherwise the range itself once (its seqs, at
//! most [`MAX_SEQS`] of them), then every higher partition from the time of the range's first
//! record (a record older than the range cannot be newer than it). A user whose records merely
//! spread over partitions (a producer without keys) is not refused unless the same seq is
//! written twice.

use std::collections::BTreeSet;

use super::range::{Clients, Range};
use super::{Refusal, ReplayRequest};
use crate::config::Config;
use crate::ingest::decode;
use crate::model::UserId;

/// Bound on the seqs of a range kept to look for on the other partitions (about 100 bytes
/// each: 10 MB at most). A range that writes more is refused with the way out (name the users,
/// or pass `--allow-other-partitions`).
pub(super) const MAX_SEQS: usize = 100_000;

/// Where the log holds a record of a replayed user outside the replayed partition.
struct Elsewhere {
    partition: i32,
    offset: i64,
    user: UserId,
}

/// The refusal of a replay whose users have records on other partitions, or `None` when the
/// replay may go on. `Err` is an unreachable broker.
pub(super) async fn check(
    clients: &Clients,
    config: &Config,
    request: &ReplayRequest,
    range: &Range,
) -> Result<Option<Refusal>, String> {
    if request.dry_run || request.allow_other_partitions {
        return Ok(None);
    }
    let others: Vec<i32> = clients
        .partitions()?
        .into_iter()
        .filter(|q| *q != request.partition)
        .filter(|q| request.reset_mailboxes || *q > request.partition)
        .collect();
    if others.is_empty() {
        return Ok(None);
    }
    let options = config.decode_options();
    // Each delivery of a record: its user, epoch and seq (`None` for a `truncate_before`).
    let writes_of = |payload: &[u8]| -> Vec<(UserId, u32, Option<u64>)> {
        decode(payload, &options)
            .map(|d| {
                d.record
                    .deliveries()
                    .iter()
                    .map(|delivery| {
                        let mailbox = delivery.mailbox();
                        (
                            mailbox.user_id.clone(),
                            mailbox.epoch,
                            delivery.mailbox_seq(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };

    // What another partition may hold that the replay would lose or revert. A rebuild: any
    // record of the named users (the whole history is rebuilt). Otherwise: a later write of a
    // seq the range writes (writing the range again reverts only those), so the range is read
    // once to learn its seqs, and with them the time of its first record.
    let users: BTreeSet<UserId> = request.users.iter().cloned().collect();
    let mut seqs: BTreeSet<(UserId, u32, u64)> = BTreeSet::new();
    let mut since_ms: Option<i64> = None;
    let mut too_many = false;
    if !request.reset_mailboxes {
        clients
            .read_partition(
                request.partition,
                range.from,
                range.end,
                |_, ts, payload| {
                    if since_ms.is_none() {
                        since_ms = Some(ts.unwrap_or(0));
                    }
                    for (user, epoch, seq) in writes_of(payload) {
                        if let Some(seq) = seq.filter(|_| users.is_empty() || users.contains(&user))
                        {
                            seqs.insert((user, epoch, seq));
                        }
                    }
                    too_many = seqs.len() > MAX_SEQS;
                    too_many
                },
            )
            .await
            .map_err(|(reason, _)| reason)?;
        if too_many {
            return Ok(Some(Refusal {
                reason: "other_partitions_unchecked",
                detail: format!(
                    "the range writes more than {MAX_SEQS} seqs, too many to look for on the topic's other partitions (a growth of the topic may have moved some of its users there, SPEC 7.2); name the users with --user, or pass --allow-other-partitions when the topic did not grow during the range"
                ),
            }));
        }
        if seqs.is_empty() {
            return Ok(None);
        }
    }
    let elsewhere = |payload: &[u8]| -> Option<UserId> {
        writes_of(payload)
            .into_iter()
            .find(|(user, epoch, seq)| {
                if request.reset_mailboxes {
                    users.contains(user)
                } else {
                    seq.is_some_and(|seq| seqs.contains(&(user.clone(), *epoch, seq)))
                }
            })
            .map(|(user, _, _)| user)
    };

    let mut found: Vec<Elsewhere> = Vec::new();
    for partition in others {
        let (low, high) = clients.watermarks(partition)?;
        let from = if request.reset_mailboxes {
            low
        } else {
            match clients.offset_at(partition, since_ms.unwrap_or(0))? {
                Some(offset) => offset.max(low),
                None => continue,
            }
        };
        let mut hit = None;
        clients
            .read_partition(partition, from, high, |offset, _, payload| {
                hit = elsewhere(payload).map(|user| Elsewhere {
                    partition,
                    offset,
                    user,
                });
                hit.is_some()
            })
            .await
            .map_err(|(reason, _)| reason)?;
        found.extend(hit);
    }
    Ok((!found.is_empty()).then(|| refusal(request, &found)))
}

/// The `user_on_other_partition` refusal: where, and the order that is safe.
fn refusal(request: &ReplayRequest, found: &[Elsewhere]) -> Refusal {
    let p = request.partition;
    let places: Vec<String> = found
        .iter()
        .map(|e| {
            format!(
                "{} on partition {} (offset {})",
                e.user.as_str(),
                e.partition,
                e.offset
            )
        })
        .collect();
    let places = places.join(", ");
    let detail = if request.reset_mailboxes {
        let mut partitions: BTreeSet<i32> = found.iter().map(|e| e.partition).collect();
        partitions.insert(p);
        let order: Vec<String> = partitions.iter().map(i32::to_string).collect();
        format!(
            "the log holds records of {places}, not only on partition {p}: the topic's partitions grew (SPEC 7.2) or its producers moved the user, so a rebuild from partition {p} alone would lose what the others hold. Go through partitions {} in this order: rebuild from the first with --allow-other-partitions, then replay each next one for the user without --reset-mailboxes",
            order.join(", ")
        )
    } else {
        let first = &found[0];
        format!(
            "the log holds newer records of {places}: the topic's partitions grew (SPEC 7.2) or its producers moved the user, so this range would put the user's older records over them. Replay this range with --allow-other-partitions and then partition {} from offset {} with --user {}, or leave the user out with --user",
            first.partition,
            first.offset,
            first.user.as_str()
        )
    };
    Refusal {
        reason: "user_on_other_partition",
        detail,
    }
}
