//! RangeScan (SPEC 4.4) over the live slot: check, read, check again.

use std::collections::{BTreeMap, BTreeSet};

use super::commit::Commit;
use super::schema::event_bucket;
use super::state::{stored, unsigned, Meta, ReadAt, Snapshot};
use super::{lock, Attempt, ScyllaStore};
use crate::model::error::CorruptKind;
use crate::model::rules;
use crate::model::validate::validate_scan;
use crate::model::{Event, MailboxId, Payload, ScanPage, ScanRequest, ScannedGroup, StoreError};
use crate::store::classify::cql;

/// Seconds before its expiry in which a group whose rows are gone counts as expired, not torn.
const EXPIRY_MARGIN_SECS: u64 = 60;

/// What one read of a page found.
enum PageRead {
    /// The groups, and whether more follow.
    Page(Vec<ScannedGroup>, bool),
    /// Identities whose event rows were not there (a replace committed in between).
    Torn(Vec<u64>),
}

/// The live copy of the mailbox a scan reads: its slot, generation and meta.
struct View {
    slot: i32,
    generation: i64,
    meta: Meta,
}

/// The live mailbox of `epoch` in `snapshot`, in the order of SPEC 4.4: the epoch first, then a
/// `reverse` range (nothing to read, whatever the mailbox holds), then the format. `None` when
/// there is nothing to read.
fn view(snapshot: &Snapshot, epoch: u32, reverse: bool) -> Result<Option<View>, StoreError> {
    let slot = snapshot.live_slot;
    let current = snapshot.slot(slot);
    if !rules::check_epoch(current.epoch.map(unsigned), u64::from(epoch))? || reverse {
        return Ok(None);
    }
    current.meta.check_format()?;
    if !current.meta.exists() {
        // SPEC 7.3: the slot's epoch and its meta are written together; an epoch that matched
        // without its meta lost it, and an empty page would say the mailbox is empty.
        return Err(StoreError::corrupt(CorruptKind::MetaLost));
    }
    Ok(Some(View {
        slot,
        generation: current.generation.unwrap_or(0),
        meta: current.meta.clone(),
    }))
}

/// SPEC 7.3: the highest seq of every live day (its proof) at or above the trim is a live group
/// with an identity row. A page that reached past such a seq without reading it lost its identity
/// rows (deleted, not restored), and must not claim coverage over it. Costs no query: it checks
/// the page against the meta both were read with.
fn check_live_days_read(
    meta: &Meta,
    request: &ScanRequest,
    groups: &[ScannedGroup],
    more_than_limit: bool,
    now: u64,
) -> Result<(), StoreError> {
    let reached = if more_than_limit {
        groups.last().map_or(request.after_seq, |g| g.mailbox_seq)
    } else {
        request.until_seq.unwrap_or(u64::MAX)
    };
    for (day, expires_at) in &meta.days {
        if *expires_at <= now.saturating_add(EXPIRY_MARGIN_SECS) {
            continue;
        }
        let Some(max_seq) = meta.proof_max_seq.get(day).copied() else {
            continue;
        };
        let in_page = max_seq > request.after_seq && max_seq <= reached;
        if in_page
            && max_seq >= meta.user_trim_seq
            && !groups.iter().any(|g| g.mailbox_seq == max_seq)
        {
            return Err(StoreError::corrupt(CorruptKind::IndexLost));
        }
    }
    Ok(())
}

impl ScyllaStore {
    pub(super) async fn scan_live(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        validate_scan(&request)?;
        self.settle(ReadAt::Quorum, |now, read| {
            self.try_scan(mailbox, &request, now, read)
        })
        .await
    }

    /// Commits promote's changes to the live meta of `view`. `Ok(false)`: a concurrent commit
    /// won; the scan starts over.
    async fn commit_promoted(
        &self,
        user: &str,
        expected: Option<i64>,
        epoch: u32,
        view: &View,
    ) -> Result<bool, StoreError> {
        let mut commit = Commit::new(&self.statements, user, expected);
        commit.write_meta(view.slot, view.generation, i64::from(epoch), &view.meta);
        self.commit(commit).await
    }

    async fn try_scan(
        &self,
        mb: &MailboxId,
        request: &ScanRequest,
        now: u64,
        read_at: ReadAt,
    ) -> Result<Attempt<ScanPage>, StoreError> {
        let user = mb.user_id.as_str();
        let epoch = mb.epoch;
        let before = self.read_snapshot(user, &[], read_at).await?;
        let reverse = request.until_seq.is_some_and(|u| u <= request.after_seq);
        let Some(mut read) = view(&before, epoch, reverse)? else {
            return Ok(Attempt::Done(Ok(ScanPage::empty(request.after_seq))));
        };
        if !read.meta.promote(now)?.is_empty()
            && !self
                .commit_promoted(user, before.version, epoch, &read)
                .await?
        {
            return Ok(Attempt::Retry);
        }
        read.meta.check_cursor(request.after_seq)?;
        let (groups, more_than_limit) = match self.read_page(user, &read, request, now).await? {
            PageRead::Page(groups, more) => (groups, more),
            // SPEC 7.2 "Readers never see a torn step": an identity read before a replace's
            // commit names rows the replace deleted after it. Read again, never skip; when
            // nothing committed since the snapshot, the identity names rows that never
            // existed: damage.
            PageRead::Torn(seqs) => {
                if self.unchanged_since(user, before.version).await? {
                    return Ok(Attempt::Done(Err(StoreError::corrupt(
                        CorruptKind::BadProof {
                            detail: format!(
                                "identities of seqs {seqs:?} name event rows that do not exist"
                            ),
                        },
                    ))));
                }
                return Ok(Attempt::Retry);
            }
        };

        let hook = lock(&self.after_scan_read).clone();
        if let Some(hook) = hook {
            hook().await;
        }

        // Check again after the read (SPEC 4.4 step 7), on a fresh snapshot.
        let after = self.read_snapshot(user, &[], read_at).await?;
        let same_copy = after.live_slot == read.slot
            && after.slot(read.slot).generation == Some(read.generation);
        if !same_copy {
            // A swap or an epoch move replaced the copy the page was read from.
            return match after.slot(after.live_slot).epoch {
                Some(c) if c == i64::from(epoch) => Ok(Attempt::Retry),
                other => Ok(Attempt::Done(Err(StoreError::EpochMismatch {
                    current: other.and_then(|c| u32::try_from(c).ok()),
                }))),
            };
        }
        let Some(mut check) = view(&after, epoch, false)? else {
            return Ok(Attempt::Done(Err(rules::meta_vanished_during_scan())));
        };
        if !check.meta.promote(self.now())?.is_empty()
            && !self
                .commit_promoted(user, after.version, epoch, &check)
                .await?
        {
            return Ok(Attempt::Retry);
        }
        check.meta.check_cursor(request.after_seq)?;

        check_live_days_read(&read.meta, request, &groups, more_than_limit, now)?;
        let up_to = rules::page_up_to(
            request.after_seq,
            request.until_seq,
            read.meta.seqbucket_max_seq,
            groups.last().map(|g| g.mailbox_seq),
            more_than_limit,
        );
        Ok(Attempt::Done(Ok(ScanPage {
            groups,
            up_to,
            has_more: more_than_limit,
        })))
    }

    /// SPEC 4.4 step 6 over the identity index: live identities in `(after, until]` whose day is
    /// active, then their committed copies' event rows, all days of the page in one query.
    async fn read_page(
        &self,
        user: &str,
        view: &View,
        request: &ScanRequest,
        now: u64,
    ) -> Result<PageRead, StoreError> {
        let limit = request.limit_groups as usize;
        let until = request
            .until_seq
            .map_or(i64::MAX, |u| u.min(i64::MAX as u64) as i64);
        let mut cursor = request.after_seq.min(i64::MAX as u64) as i64;
        // One row past the limit tells `has_more`; rows skipped (expired, inactive day) make
        // the next chunk larger.
        let mut chunk = (limit as i32).saturating_add(1);
        let mut selected: Vec<(i64, u64, i64)> = Vec::new(); // (seq, day, digest)
        'paging: loop {
            let rows = self
                .identity_chunk(user, view.slot, cursor, until, chunk)
                .await?;
            let seen = rows.len();
            for (seq, expires_at, digest) in rows {
                cursor = seq;
                let Some(expires_at) = expires_at.map(unsigned).filter(|e| *e > now) else {
                    continue;
                };
                let day = self.policy.day_of_expiry(expires_at);
                if !view.meta.days.contains_key(&day) {
                    continue;
                }
                selected.push((seq, day, digest.unwrap_or(0)));
                if selected.len() > limit {
                    break 'paging;
                }
            }
            if seen < chunk as usize {
                break;
            }
            chunk = chunk.saturating_mul(2).min(5_000);
        }
        let has_more = selected.len() > limit;
        selected.truncate(limit);
        self.failpoints.between_scan_reads().await;

        // One read for every day of the page: their buckets' partitions, the page's seq range;
        // rows of digests no identity names are skipped.
        let mut groups: BTreeMap<i64, (i64, Vec<Event>)> = BTreeMap::new();
        if !selected.is_empty() {
            let buckets: Vec<i64> = selected
                .iter()
                .map(|s| event_bucket(stored(s.1)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let low = selected.first().map_or(0, |s| s.0);
            let high = selected.last().map_or(0, |s| s.0);
            let wanted: BTreeSet<(i64, i64)> = selected.iter().map(|s| (s.0, s.2)).collect();
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.read_events_range,
                    (user, view.generation, buckets, low, high),
                )
                .await
                .map_err(cql::from)?;
            let rows = result.into_rows_result().map_err(cql::from)?;
            for row in rows
                .rows::<(i64, i64, i64, Option<i64>, Option<String>)>()
                .map_err(cql::from)?
            {
                let (seq, digest, ordinal, created_at, payload) = row.map_err(cql::from)?;
                if !wanted.contains(&(seq, digest)) {
                    continue;
                }
                let event_ordinal = u32::try_from(ordinal).map_err(|_| {
                    StoreError::corrupt(CorruptKind::BadProof {
                        detail: format!("seq {seq}: event ordinal {ordinal} is outside u32"),
                    })
                })?;
                let payload = Payload::from_canonical(payload.as_deref().unwrap_or("null"))
                    .map_err(|e| {
                        StoreError::corrupt(CorruptKind::BadProof {
                            detail: format!("seq {seq}: payload is not JSON: {e}"),
                        })
                    })?;
                groups
                    .entry(seq)
                    .or_insert_with(|| (created_at.unwrap_or(0), Vec::new()))
                    .1
                    .push(Event {
                        event_ordinal,
                        payload,
                    });
            }
        }
        let mut page = Vec::with_capacity(selected.len());
        let mut missing = Vec::new();
        for (seq, day, _) in &selected {
            match groups.remove(seq) {
                Some((created_at, events)) => page.push(ScannedGroup {
                    mailbox_seq: *seq as u64,
                    created_at: created_at as u64,
                    events: events.into(),
                }),
                // Rows whose TTL ran out a moment before their identity's (the identity is
                // written after the rows, with the same TTL): expiring, not torn.
                None if self.policy.expires_at(*day) <= now + EXPIRY_MARGIN_SECS => {}
                None => missing.push(*seq as u64),
            }
        }
        if !missing.is_empty() {
            return Ok(PageRead::Torn(missing));
        }
        Ok(PageRead::Page(page, has_more))
    }
}
