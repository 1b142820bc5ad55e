//! Applying one decoded record to a store, delivery by delivery, in record order.

use crate::model::{AppendOutcome, StoreError};
use crate::store::MailboxStore;

use super::decode::DispatchRecord;

/// The final, successful outcome of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// A group delivery's append outcome.
    Append(AppendOutcome),
    /// A `truncate_before` record moved the trim to `user_trim_seq`.
    Truncated { user_trim_seq: u64 },
    /// A `truncate_before` record for an epoch older than the user's current one: nothing done,
    /// like a stale append.
    TruncateStale,
}

impl DeliveryOutcome {
    /// The outcome word of SPEC 8.1.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Append(outcome) => outcome.as_str(),
            Self::Truncated { .. } => "truncated",
            Self::TruncateStale => "stale_epoch",
        }
    }
}

/// One delivery of a record and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryResult {
    pub mailbox: crate::model::MailboxId,
    /// `None` for a `truncate_before` record.
    pub mailbox_seq: Option<u64>,
    pub result: Result<DeliveryOutcome, StoreError>,
}

/// Applies every delivery of `record` in order.
///
/// Stops at the first transient error (`StoreError::Unavailable`): the deliveries after it were not
/// attempted and the caller must retry the whole record, which replay makes idempotent. Every
/// other error is final for its delivery and the next delivery is attempted.
pub async fn apply_record(
    store: &dyn MailboxStore,
    record: &DispatchRecord,
) -> Vec<DeliveryResult> {
    match record {
        DispatchRecord::GroupDispatch(dispatch) => {
            let mut results = Vec::with_capacity(dispatch.deliveries.len());
            for group in &dispatch.deliveries {
                let result = store.append(group).await.map(DeliveryOutcome::Append);
                let transient = matches!(result, Err(StoreError::Unavailable { .. }));
                results.push(DeliveryResult {
                    mailbox: group.mailbox.clone(),
                    mailbox_seq: Some(group.mailbox_seq),
                    result,
                });
                if transient {
                    break;
                }
            }
            results
        }
        DispatchRecord::TruncateBefore(truncate) => {
            let result = match store
                .truncate_before(&truncate.mailbox, truncate.before_seq)
                .await
            {
                Ok(outcome) => Ok(DeliveryOutcome::Truncated {
                    user_trim_seq: outcome.user_trim_seq,
                }),
                Err(StoreError::EpochMismatch {
                    current: Some(current),
                }) if truncate.mailbox.epoch < current => Ok(DeliveryOutcome::TruncateStale),
                Err(e) => Err(e),
            };
            vec![DeliveryResult {
                mailbox: truncate.mailbox.clone(),
                mailbox_seq: None,
                result,
            }]
        }
    }
}
