//! Dead letters: the original record with headers saying what failed, built to always fit.
//!
//! A record is final only once its dead letter is acknowledged (acks=all, idempotent producer),
//! so a dead letter that can never be sent would hold its partition forever. Two things could
//! make one unsendable, and both are bounded here (SPEC 7, "dead letters always fit"):
//!
//! - the headers: `failed_deliveries` lists every refused delivery of the record (a record may
//!   carry thousands) — it keeps at most [`MAX_LISTED_FAILURES`] entries and
//!   [`MAX_FAILURES_HEADER_BYTES`] bytes, with `failed_deliveries_total` giving the full count;
//!   `error_detail` keeps at most [`MAX_DETAIL_BYTES`];
//! - the value: a record near `max_record_bytes` plus headers can exceed the producer's
//!   `message.max.bytes`. Then the value is replaced by its first [`EXCERPT_BYTES`] bytes, with
//!   the headers `dlq_truncated: true` and `dlq_original_bytes` (the source coordinates are in
//!   every dead letter's headers, so the full record can be read back from the source topic).
//!
//! If the producer still refuses the size (a limit lower than configured), the next attempt is
//! forced into the truncated form.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::ingest::pipeline::DeadLetter;

/// Most failures listed in `failed_deliveries`.
pub(crate) const MAX_LISTED_FAILURES: usize = 100;
/// Most bytes of the `failed_deliveries` header.
pub(crate) const MAX_FAILURES_HEADER_BYTES: usize = 32 << 10;
/// Most bytes of `error_detail`.
pub(crate) const MAX_DETAIL_BYTES: usize = 4 << 10;
/// Bytes of the original value kept by a truncated dead letter.
pub(crate) const EXCERPT_BYTES: usize = 64 << 10;
/// What librdkafka adds to a message beyond key, value and header bytes (record batch framing,
/// per-header varints), with a wide margin.
const FRAMING_BYTES: usize = 4 << 10;

/// Where a dead letter's record came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The identity of the log the record was read from (`source_log`), when known: a re-drive
    /// applies the record with its source position (SPEC 7.2).
    pub log: Option<&'a crate::model::LogId>,
    pub dispatch_id: Option<&'a str>,
}

/// A dead letter ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Letter {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    pub truncated: bool,
}

impl Letter {
    /// Bytes the message takes, framing included (an upper estimate).
    pub(crate) fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
            + FRAMING_BYTES
    }
}

/// Cuts `text` to at most `max` bytes on a char boundary.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The headers of a dead letter: what failed, why, and where the record came from.
pub(crate) fn headers(source: Source<'_>, dead_letter: &DeadLetter) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    match dead_letter {
        DeadLetter::Malformed(error) => {
            headers.push(("error_outcome", "malformed".to_owned()));
            headers.push(("error_kind", error.kind.as_str().to_owned()));
            headers.push(("error_detail", cut(&error.to_string(), MAX_DETAIL_BYTES)));
        }
        DeadLetter::Failed(failures) => {
            if let Some(first) = failures.first() {
                headers.push(("error_outcome", first.error.outcome().to_owned()));
                headers.push(("error_kind", first.error.kind().to_owned()));
                headers.push(("error_detail", cut(&first.error.detail(), MAX_DETAIL_BYTES)));
            }
            let mut list = String::from("[");
            for (listed, failure) in failures.iter().take(MAX_LISTED_FAILURES).enumerate() {
                let entry = serde_json::json!({
                    "delivery": failure.index,
                    "user_id": failure.delivery.mailbox().user_id.as_str(),
                    "epoch": failure.delivery.mailbox().epoch,
                    "mailbox_seq": failure.delivery.mailbox_seq(),
                    "outcome": failure.error.outcome(),
                    "kind": failure.error.kind(),
                    "detail": cut(&failure.error.detail(), 512),
                })
                .to_string();
                if list.len() + entry.len() + 2 > MAX_FAILURES_HEADER_BYTES {
                    break;
                }
                if listed > 0 {
                    list.push(',');
                }
                list.push_str(&entry);
            }
            list.push(']');
            headers.push(("failed_deliveries", list));
            headers.push(("failed_deliveries_total", failures.len().to_string()));
        }
    }
    headers.push(("source_topic", source.topic.to_owned()));
    headers.push(("source_partition", source.partition.to_string()));
    headers.push(("source_offset", source.offset.to_string()));
    if let Some(log) = source.log {
        headers.push(("source_log", log.to_string()));
    }
    if let Some(id) = source.dispatch_id {
        headers.push(("dispatch_id", cut(id, MAX_DETAIL_BYTES)));
    }
    headers
}

/// Builds the dead letter of a record: the original key and value unless that would exceed
/// `max_message_bytes` (or `force_truncate`), else a bounded excerpt marked `dlq_truncated`.
pub(crate) fn build(
    source: Source<'_>,
    dead_letter: &DeadLetter,
    key: Option<&[u8]>,
    value: &[u8],
    max_message_bytes: usize,
    force_truncate: bool,
) -> Letter {
    let headers = headers(source, dead_letter);
    let whole = Letter {
        key: key.map(<[u8]>::to_vec),
        value: value.to_vec(),
        headers,
        truncated: false,
    };
    if !force_truncate && whole.size() <= max_message_bytes {
        return whole;
    }
    truncate(whole, max_message_bytes)
}

/// The same dead letter with its value replaced by a bounded excerpt, marked `dlq_truncated`,
/// cut further if even that exceeds `max_message_bytes` (the headers are bounded above).
pub(crate) fn truncate(letter: Letter, max_message_bytes: usize) -> Letter {
    if letter.truncated {
        return letter;
    }
    let mut headers = letter.headers;
    headers.push(("dlq_truncated", "true".to_owned()));
    headers.push(("dlq_original_bytes", letter.value.len().to_string()));
    // The key is the shard key (small by nature); an absurd one is cut too.
    let key = letter.key.map(|k| k.into_iter().take(1024).collect());
    let mut value = letter.value;
    value.truncate(EXCERPT_BYTES);
    let mut letter = Letter {
        key,
        value,
        headers,
        truncated: true,
    };
    let over = letter.size().saturating_sub(max_message_bytes);
    if over > 0 {
        let keep = letter.value.len().saturating_sub(over);
        letter.value.truncate(keep);
    }
    letter
}

/// Whether a send failed because the message is too large (retrying the same bytes never helps).
pub(crate) fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}

/// The reason, when `error` (or the producer's state) is fatal: the producer cannot send again.
pub(crate) fn fatal(producer: &crate::daemon::DlqProducer, error: &KafkaError) -> Option<String> {
    if let Some((code, reason)) = producer.client().fatal_error() {
        return Some(format!("{code:?}: {reason}"));
    }
    matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)).then(|| error.to_string())
}

/// Sends one dead letter and waits for the broker's acknowledgement.
pub(crate) async fn send(
    producer: &crate::daemon::DlqProducer,
    topic: &str,
    letter: &Letter,
) -> Result<(), KafkaError> {
    let mut owned = OwnedHeaders::new_with_capacity(letter.headers.len());
    for (name, value) in &letter.headers {
        owned = owned.insert(Header {
            key: name,
            value: Some(value.as_str()),
        });
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
        .payload(&letter.value[..])
        .headers(owned);
    if let Some(key) = &letter.key {
        record = record.key(&key[..]);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::pipeline::DeliveryFailure;
    use crate::ingest::Delivery;
    use crate::model::error::RejectKind;
    use crate::model::{Event, EventGroup, MailboxId, Payload, StoreError, UserId};
    use std::sync::Arc;

    fn failures(n: usize) -> DeadLetter {
        DeadLetter::Failed(
            (0..n)
                .map(|i| DeliveryFailure {
                    index: i,
                    delivery: Arc::new(Delivery::Append(EventGroup {
                        mailbox: MailboxId::new(
                            UserId::parse(&format!("user-{i}")).expect("id"),
                            1,
                        ),
                        mailbox_seq: i as u64 + 1,
                        created_at: 0,
                        events: vec![Event {
                            event_ordinal: 0,
                            payload: Payload::from_value(&serde_json::json!({"i": i})),
                        }],
                        source: None,
                        token: None,
                    })),
                    error: StoreError::rejected(RejectKind::FutureCreatedAt, "x".repeat(300)),
                })
                .collect(),
        )
    }

    const SOURCE: Source<'static> = Source {
        topic: "dispatch",
        partition: 2,
        offset: 41,
        log: None,
        dispatch_id: Some("d"),
    };

    #[test]
    fn five_thousand_failures_keep_a_bounded_header_and_the_whole_value() {
        let value = vec![b'x'; 450_000];
        let letter = build(
            SOURCE,
            &failures(5000),
            Some(b"k"),
            &value,
            1_000_000,
            false,
        );
        assert!(!letter.truncated);
        assert_eq!(letter.value.len(), 450_000);
        assert!(letter.size() <= 1_000_000);
        let header = |name| {
            letter
                .headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
                .expect("header present")
        };
        assert_eq!(header("failed_deliveries_total"), "5000");
        let listed: serde_json::Value =
            serde_json::from_str(&header("failed_deliveries")).expect("JSON list");
        let listed = listed.as_array().expect("array").len();
        assert!((1..=MAX_LISTED_FAILURES).contains(&listed), "{listed}");
    }

    #[test]
    fn a_value_that_cannot_fit_becomes_a_marked_excerpt_with_its_coordinates() {
        let value = vec![b'y'; 1_048_576];
        let letter = build(SOURCE, &failures(1), None, &value, 1_000_000, false);
        assert!(letter.truncated);
        assert_eq!(letter.value.len(), EXCERPT_BYTES);
        assert!(letter.size() <= 1_000_000);
        for (name, expected) in [
            ("dlq_truncated", "true"),
            ("dlq_original_bytes", "1048576"),
            ("source_topic", "dispatch"),
            ("source_partition", "2"),
            ("source_offset", "41"),
        ] {
            assert!(
                letter
                    .headers
                    .iter()
                    .any(|(k, v)| *k == name && v == expected),
                "{name}={expected} in {:?}",
                letter.headers
            );
        }
        let tiny = build(SOURCE, &failures(1), None, &value, 70_000, true);
        assert!(tiny.size() <= 70_000, "{}", tiny.size());
    }
}
