//! Applying one decoded record to a store, delivery by delivery, in record order.

use crate::disposition::Disposition;
use crate::model::StoreError;
use crate::store::MailboxStore;

use super::decode::DispatchRecord;

pub use crate::model::DeliveryOutcome;

/// One delivery of a record and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryResult {
    pub mailbox: crate::model::MailboxId,
    /// `None` for a `truncate_before` record.
    pub mailbox_seq: Option<u64>,
    pub result: Result<DeliveryOutcome, StoreError>,
}

/// One store operation a record asks for: the unit the daemon orders per mailbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Append(crate::model::EventGroup),
    Truncate {
        mailbox: crate::model::MailboxId,
        before_seq: u64,
    },
}

impl Delivery {
    pub fn mailbox(&self) -> &crate::model::MailboxId {
        match self {
            Self::Append(group) => &group.mailbox,
            Self::Truncate { mailbox, .. } => mailbox,
        }
    }

    pub fn mailbox_seq(&self) -> Option<u64> {
        match self {
            Self::Append(group) => Some(group.mailbox_seq),
            Self::Truncate { .. } => None,
        }
    }
}

impl DispatchRecord {
    /// The record's deliveries, in record order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        match self {
            Self::GroupDispatch(dispatch) => dispatch
                .deliveries
                .iter()
                .cloned()
                .map(Delivery::Append)
                .collect(),
            Self::TruncateBefore(truncate) => vec![Delivery::Truncate {
                mailbox: truncate.mailbox.clone(),
                before_seq: truncate.before_seq,
            }],
        }
    }
}

impl DispatchRecord {
    /// The record with only the deliveries at the indexes `keep` holds (a group dispatch's
    /// deliveries in record order); the record as it is when none of them is kept, or for a
    /// `truncate_before` record (one delivery).
    pub(crate) fn retain_deliveries(self, keep: &std::collections::BTreeSet<usize>) -> Self {
        match self {
            Self::GroupDispatch(mut dispatch)
                if (0..dispatch.deliveries.len()).any(|i| keep.contains(&i)) =>
            {
                let mut index = 0;
                dispatch.deliveries.retain(|_| {
                    let kept = keep.contains(&index);
                    index += 1;
                    kept
                });
                Self::GroupDispatch(dispatch)
            }
            other => other,
        }
    }

    /// The record with only the deliveries of the users `keep` accepts; `None` when none is left
    /// (a `truncate_before` record is one delivery).
    pub(crate) fn retain_users(self, keep: impl Fn(&crate::model::UserId) -> bool) -> Option<Self> {
        match self {
            Self::GroupDispatch(mut dispatch) => {
                dispatch.deliveries.retain(|g| keep(&g.mailbox.user_id));
                (!dispatch.deliveries.is_empty()).then_some(Self::GroupDispatch(dispatch))
            }
            Self::TruncateBefore(truncate) => {
                keep(&truncate.mailbox.user_id).then_some(Self::TruncateBefore(truncate))
            }
        }
    }
}

/// Applies one delivery once. A `truncate_before` for an epoch older than the user's current one
/// is `TruncateStale`, like a stale append.
pub async fn apply_delivery(
    store: &dyn MailboxStore,
    delivery: &Delivery,
) -> Result<DeliveryOutcome, StoreError> {
    match delivery {
        Delivery::Append(group) => store.append(group).await.map(DeliveryOutcome::Append),
        Delivery::Truncate {
            mailbox,
            before_seq,
        } => match store.truncate_before(mailbox, *before_seq).await {
            Ok(outcome) => Ok(DeliveryOutcome::Truncated {
                user_trim_seq: outcome.user_trim_seq,
            }),
            Err(StoreError::EpochMismatch {
                current: Some(current),
            }) if mailbox.epoch < current => Ok(DeliveryOutcome::TruncateStale),
            Err(e) => Err(e),
        },
    }
}

/// Applies every delivery of `record` in order.
///
/// Stops at the first result [`Disposition`](crate::disposition::Disposition) says to retry (an
/// unavailable store, a mailbox under repair): the deliveries after it were not attempted and the
/// caller must retry the whole record, which replay makes idempotent. Every other result (a
/// corrupt mailbox's block included) concerns its own mailbox only, and the next delivery is
/// attempted.
pub async fn apply_record(
    store: &dyn MailboxStore,
    record: &DispatchRecord,
) -> Vec<DeliveryResult> {
    let deliveries = record.deliveries();
    let mut results = Vec::with_capacity(deliveries.len());
    for delivery in &deliveries {
        let result = apply_delivery(store, delivery).await;
        let transient = matches!(Disposition::of(&result), Disposition::Retry { .. });
        results.push(DeliveryResult {
            mailbox: delivery.mailbox().clone(),
            mailbox_seq: delivery.mailbox_seq(),
            result,
        });
        if transient {
            break;
        }
    }
    results
}
