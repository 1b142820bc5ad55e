//! The JSON printed by the store commands (SPEC 8.1): a stable interface that scripts parse.
//!
//! Structs rather than `json!` so the field order is the one SPEC shows.

use serde::Serialize;

use crate::ingest::{DecodeError, DeliveryResult};
use crate::model::{CursorExpired, StoreError};

/// One line of `materializer apply`.
#[derive(Debug, Serialize)]
pub(crate) struct ApplyLine<'a> {
    /// The input line (`apply`); none in `dlq redrive`, whose record line names its letter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mailbox_seq: Option<u64>,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_trim_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<LineError>,
}

/// The `error` object of an apply line.
#[derive(Debug, Serialize)]
pub(crate) struct LineError {
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub detail: String,
}

impl<'a> ApplyLine<'a> {
    pub(super) fn delivery(line: Option<u64>, delivery: &'a DeliveryResult) -> Self {
        let (outcome, user_trim_seq, error) = match &delivery.result {
            Ok(outcome) => {
                let trim = match outcome {
                    crate::ingest::DeliveryOutcome::Truncated { user_trim_seq } => {
                        Some(*user_trim_seq)
                    }
                    _ => None,
                };
                (outcome.as_str(), trim, None)
            }
            Err(e) => (
                e.outcome(),
                None,
                Some(LineError {
                    kind: e.kind(),
                    field: None,
                    detail: e.detail(),
                }),
            ),
        };
        Self {
            line,
            user_id: Some(delivery.mailbox.user_id.as_str()),
            epoch: Some(delivery.mailbox.epoch),
            mailbox_seq: delivery.mailbox_seq,
            outcome,
            user_trim_seq,
            error,
        }
    }

    /// A delivery not applied because an earlier delivery of its mailbox in this run answered
    /// `corrupt` (SPEC 8.1's `held`): the mailbox is held as the daemon holds it.
    pub(super) fn held(line: Option<u64>, delivery: &'a crate::ingest::Delivery) -> Self {
        Self {
            line,
            user_id: Some(delivery.mailbox().user_id.as_str()),
            epoch: Some(delivery.mailbox().epoch),
            mailbox_seq: delivery.mailbox_seq(),
            outcome: "held",
            user_trim_seq: None,
            error: Some(LineError {
                kind: "held",
                field: None,
                detail: "not applied: an earlier delivery of this mailbox in this run answered corrupt; rebuild the mailbox from the log (replay --reset-mailboxes), then apply again".to_owned(),
            }),
        }
    }

    pub(super) fn malformed(line: Option<u64>, error: &DecodeError) -> Self {
        Self {
            line,
            user_id: None,
            epoch: None,
            mailbox_seq: None,
            outcome: "malformed",
            user_trim_seq: None,
            error: Some(LineError {
                kind: error.kind.as_str(),
                field: (!error.field.is_empty()).then(|| error.field.clone()),
                detail: error.detail.clone(),
            }),
        }
    }
}

/// `{"error": {...}}` of scan, inspect and truncate: SPEC 8.2's `kind` and `detail`, except the
/// two shapes SPEC 8.1 fixes to the field (`cursor_expired` with its reason and boundary or
/// resume point, `epoch_mismatch` with the current epoch), which scripts compare whole.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorEnvelope {
    pub error: CommandError,
}

#[derive(Debug, Serialize)]
pub(crate) struct CommandError {
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_after: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Option<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl From<&StoreError> for ErrorEnvelope {
    fn from(e: &StoreError) -> Self {
        let mut error = CommandError {
            kind: e.outcome(),
            reason: None,
            boundary: None,
            resume_after: None,
            current: None,
            detail: Some(e.detail()),
        };
        match e {
            StoreError::CursorExpired { cursor } => {
                error.kind = "cursor_expired";
                error.reason = Some(cursor.reason());
                error.detail = None;
                match *cursor {
                    CursorExpired::Trimmed { resume_after } => {
                        error.resume_after = Some(resume_after)
                    }
                    CursorExpired::ExpiredGap { boundary } => error.boundary = Some(boundary),
                }
            }
            StoreError::EpochMismatch { current } => {
                error.kind = "epoch_mismatch";
                error.current = Some(*current);
                error.detail = None;
            }
            other => error.reason = Some(other.kind()),
        }
        Self { error }
    }
}

/// `{"user_trim_seq": S}` of truncate.
#[derive(Debug, Serialize)]
pub(crate) struct TruncateLine {
    pub user_trim_seq: u64,
}
