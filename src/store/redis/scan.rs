//! The bucket reads of a scan page (SPEC 4.4 step 6), between its pre- and post-read scripts.

use super::*;

impl RedisStore {
    /// Reads the groups of every active day with seqs in `(after, until]` (SPEC 4.4 step 6),
    /// and names the days whose read found nothing: their buckets may be gone (SPEC 4.4 step 7,
    /// checked by `scan_end.lua`), while a day that answered members had its bucket when read.
    ///
    /// Each day is read with `ZRANGE BYSCORE ... LIMIT` so a page's memory stays bounded. A day
    /// whose read was cut by the limit is complete only below its last seq; the page then covers
    /// up to the smallest such bound, and never claims more.
    pub(super) async fn read_days(
        &self,
        keys: &MailboxKeys,
        days: &[u64],
        request: &ScanRequest,
    ) -> Result<(BTreeMap<u64, ScannedGroup>, Option<u64>, Vec<u64>), StoreError> {
        let chunk = (request.limit_groups as usize).saturating_mul(4).max(64);
        let mut groups: BTreeMap<u64, (u64, Vec<Event>)> = BTreeMap::new();
        let mut covered: Option<u64> = None;
        let mut empty_days = Vec::new();
        let max = request
            .until_seq
            .map_or_else(|| "+inf".to_owned(), |u| u.to_string());
        let mut pending: Vec<(u64, usize)> = days.iter().map(|&d| (d, chunk)).collect();
        while !pending.is_empty() {
            let mut pipe = redis::pipe();
            for (day, count) in &pending {
                pipe.cmd("ZRANGE")
                    .arg(keys.day(*day))
                    .arg(request.after_seq.min(MAX_MAILBOX_SEQ))
                    .arg(&max)
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(*count);
            }
            let replies: Vec<Vec<String>> = pipe
                .query_async(&mut self.conn())
                .await
                .map_err(classified)?;
            let mut again = Vec::new();
            for ((day, count), members) in pending.iter().zip(replies) {
                if members.is_empty() {
                    empty_days.push(*day);
                }
                let truncated = members.len() >= *count;
                let mut parsed = Vec::with_capacity(members.len());
                for member in &members {
                    let (seq, ordinal, created_at, payload) = parse_event_member(member)
                        .ok_or_else(|| {
                            StoreError::corrupt(CorruptKind::BadProof {
                                detail: format!("day {day}: unreadable bucket member"),
                            })
                        })?;
                    if seq <= request.after_seq || request.until_seq.is_some_and(|u| seq > u) {
                        continue;
                    }
                    let payload = Payload::from_canonical(payload).map_err(|e| {
                        StoreError::corrupt(CorruptKind::BadProof {
                            detail: format!("day {day}, seq {seq}: payload is not JSON: {e}"),
                        })
                    })?;
                    parsed.push((
                        seq,
                        created_at,
                        Event {
                            event_ordinal: ordinal,
                            payload,
                        },
                    ));
                }
                if truncated {
                    let last = parsed.last().map_or(request.after_seq, |p| p.0);
                    let complete_below = last.saturating_sub(1);
                    let no_whole_group = parsed.first().is_none_or(|p| p.0 == last);
                    if no_whole_group && *count <= MAX_EVENTS_PER_GROUP {
                        // Not one whole group fit: read this day again with room for the
                        // largest group there can be.
                        again.push((*day, MAX_EVENTS_PER_GROUP + chunk));
                        continue;
                    }
                    parsed.retain(|p| p.0 < last);
                    covered = Some(covered.map_or(complete_below, |c: u64| c.min(complete_below)));
                }
                for (seq, created_at, event) in parsed {
                    groups
                        .entry(seq)
                        .or_insert_with(|| (created_at, Vec::new()))
                        .1
                        .push(event);
                }
            }
            pending = again;
        }
        let groups = groups
            .into_iter()
            .filter(|(seq, _)| covered.is_none_or(|c| *seq <= c))
            .map(|(seq, (created_at, events))| {
                (
                    seq,
                    ScannedGroup {
                        mailbox_seq: seq,
                        created_at,
                        events: events.into(),
                    },
                )
            })
            .collect();
        Ok((groups, covered, empty_days))
    }
}
