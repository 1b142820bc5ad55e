//! Shared validation of an event group (SPEC 4.1), run by every backend before it touches state.
//!
//! The decoder already refuses most of this as malformed input; the store checks again because the
//! library is also called directly (backfills, tests), and a backend must never accept a
//! non-deterministic group whichever door it came through.

use std::collections::HashSet;

use super::error::{RejectKind, StoreError};
use super::group::EventGroup;
use super::ids::MAX_MAILBOX_SEQ;
use super::outcome::{ScanRequest, MAX_SCAN_LIMIT};

/// Largest canonical payload of one event, in bytes. Matches the default record size limit, so
/// a payload that fits a record always fits here.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// Most events in one group: bounds the work of one append and one replacement.
pub const MAX_EVENTS_PER_GROUP: usize = 10_000;

/// Largest `created_at` accepted (year 9999): keeps day and expiry arithmetic far from overflow.
pub(crate) const MAX_CREATED_AT_MS: u64 = 253_402_300_799_999;

/// Checks a group against SPEC 4.1: field ranges, non-empty, unique ordinals.
///
/// "All events in one day" holds by construction: an [`EventGroup`] carries one `created_at`
/// (the dispatch's `committed_at`), so `CrossBucketGroup` cannot arise from a decoded record.
pub(crate) fn validate_group(group: &EventGroup) -> Result<(), StoreError> {
    let invalid = |detail: String| StoreError::rejected(RejectKind::InvalidField, detail);
    if group.mailbox_seq == 0 || group.mailbox_seq > MAX_MAILBOX_SEQ {
        return Err(invalid(format!(
            "mailbox_seq {} is outside 1..={MAX_MAILBOX_SEQ}",
            group.mailbox_seq
        )));
    }
    if group.created_at > MAX_CREATED_AT_MS {
        return Err(invalid(format!(
            "created_at {} is beyond {MAX_CREATED_AT_MS}",
            group.created_at
        )));
    }
    if group.events.is_empty() {
        return Err(invalid("events is empty".to_owned()));
    }
    if group.events.len() > MAX_EVENTS_PER_GROUP {
        return Err(invalid(format!(
            "events has {} entries; at most {MAX_EVENTS_PER_GROUP} are allowed",
            group.events.len()
        )));
    }
    for (i, event) in group.events.iter().enumerate() {
        if event.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(invalid(format!(
                "events[{i}].payload is {} bytes; at most {MAX_PAYLOAD_BYTES} are allowed",
                event.payload.len()
            )));
        }
    }
    if let Some(i) = first_duplicate_ordinal(group) {
        return Err(StoreError::rejected(
            RejectKind::DuplicateOrdinal,
            format!(
                "events[{i}].event_ordinal {} appears twice in the group",
                group.events[i].event_ordinal
            ),
        ));
    }
    Ok(())
}

/// Index of the first event whose ordinal an earlier event already has.
fn first_duplicate_ordinal(group: &EventGroup) -> Option<usize> {
    let events = &group.events;
    // Groups are small; a quadratic scan beats hashing below a few dozen events.
    if events.len() <= 32 {
        return (1..events.len()).find(|&i| {
            events[..i]
                .iter()
                .any(|e| e.event_ordinal == events[i].event_ordinal)
        });
    }
    let mut seen = HashSet::with_capacity(events.len());
    events.iter().position(|e| !seen.insert(e.event_ordinal))
}

/// `before_seq` of a truncate: a valid mailbox seq.
pub(crate) fn validate_before_seq(before_seq: u64) -> Result<(), StoreError> {
    if before_seq == 0 || before_seq > MAX_MAILBOX_SEQ {
        return Err(StoreError::rejected(
            RejectKind::InvalidField,
            format!("before_seq {before_seq} is outside 1..={MAX_MAILBOX_SEQ}"),
        ));
    }
    Ok(())
}

/// `limit_groups` of a scan: `1..=MAX_SCAN_LIMIT`.
pub(crate) fn validate_scan(request: &ScanRequest) -> Result<(), StoreError> {
    if request.limit_groups == 0 || request.limit_groups > MAX_SCAN_LIMIT {
        return Err(StoreError::rejected(
            RejectKind::InvalidField,
            format!(
                "limit {} is outside 1..={MAX_SCAN_LIMIT}",
                request.limit_groups
            ),
        ));
    }
    Ok(())
}
