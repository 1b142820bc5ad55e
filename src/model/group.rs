//! Event groups: what one `GroupDispatch` delivers to one mailbox under one `mailbox_seq`.

use std::fmt;
use std::sync::Arc;

use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ids::MailboxId;
use super::retention::day_of_ms;

/// Opaque event payload, held as the canonical JSON text of the value.
///
/// Canonical means `serde_json`'s rendering of the parsed value: object keys sorted, no
/// insignificant whitespace, numbers as parsed. Two deliveries whose payloads are equal JSON values
/// therefore compare equal byte for byte, which is what replay detection relies on. The text is
/// shared, so handing a page of groups to a reader copies no payload bytes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Payload(Arc<str>);

impl Payload {
    /// Canonicalizes a JSON value.
    pub fn from_value(value: &serde_json::Value) -> Self {
        // Serializing a `Value` cannot fail: its map keys are strings.
        Self(Arc::from(value.to_string()))
    }

    /// Wraps text that is already canonical JSON (as written by [`Payload::from_value`]).
    ///
    /// Backends use this for payloads they stored themselves; the text is re-checked for being
    /// JSON so a corrupt stored value cannot be served as if it were valid.
    pub(crate) fn from_canonical(text: &str) -> Result<Self, serde_json::Error> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        Ok(Self::from_value(&value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the payload back into a JSON value.
    pub fn to_value(&self) -> serde_json::Value {
        // The text was produced by serde_json from a value, so it parses.
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// Size of the canonical text in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({})", &*self.0)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(&self.0).map_err(S::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(|v| Self::from_value(&v))
    }
}

/// One event of a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Event {
    pub event_ordinal: u32,
    pub payload: Payload,
}

/// The unit of [`append`](crate::store::MailboxStore::append): every event one dispatch delivers
/// to one mailbox under one `mailbox_seq`, all with the dispatch's `committed_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventGroup {
    pub mailbox: MailboxId,
    pub mailbox_seq: u64,
    /// Milliseconds since the Unix epoch; the same for every event of the group.
    pub created_at: u64,
    pub events: Vec<Event>,
    /// Where in the dispatch log the group was read (the daemon and `replay`); `None` for
    /// input without a log position (`apply`). Not part of the content: it fences zombies.
    pub source: Option<SourcePosition>,
    /// Names this reading of the record (`model::written`): the store keeps it with the
    /// version the group writes, so a retry whose earlier attempt applied although its answer
    /// was lost is answered as that attempt was. `None` without a position.
    pub token: Option<super::WriteToken>,
}

/// The identity of a dispatch log (SPEC 7.2): the topic's ID as the broker reports it (KIP-516),
/// or, where the broker reports none, the cluster ID and the topic name.
///
/// Offsets order records only within one log: a topic deleted and recreated, a new topic or a
/// mirror on another cluster is another log, whose offsets start again and say nothing about the
/// old one's. The text never holds `@`, `|` or whitespace, so it can end an encoded position.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogId(Arc<str>);

impl LogId {
    /// A log named by its topic ID (the broker's base64 text of the UUID).
    pub fn topic_id(id: &str) -> Option<Self> {
        Self::checked(&format!("id:{id}"))
    }

    /// The fallback for a broker that reports no topic ID: the cluster and the topic name.
    pub fn cluster_topic(cluster_id: &str, topic: &str) -> Option<Self> {
        Self::checked(&format!("name:{cluster_id}/{topic}"))
    }

    /// A log id as [`as_str`](Self::as_str) wrote it (read back from a dead letter's header).
    pub fn parse(text: &str) -> Option<Self> {
        (text.starts_with("id:") || text.starts_with("name:"))
            .then(|| Self::checked(text))
            .flatten()
    }

    fn checked(text: &str) -> Option<Self> {
        let valid = !text.is_empty()
            && text.len() <= 512
            && text
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'@' && b != b'|');
        valid.then(|| Self(Arc::from(text)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A record's place in the dispatch log: the log, its partition and the offset (SPEC 7.2).
///
/// Zombie fencing (docs/decisions.md): each seq's stored version keeps the position it was
/// written from; a same-day replace of that seq from an older offset of the same log and
/// partition is a write decided under an assignment that has moved on (or a replay of a record
/// the log has since superseded), and changes nothing (see
/// [`crate::model::rules::superseded`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourcePosition {
    pub log: LogId,
    pub partition: i32,
    pub offset: i64,
}

impl SourcePosition {
    pub fn new(log: LogId, partition: i32, offset: i64) -> Self {
        Self {
            log,
            partition,
            offset,
        }
    }

    /// `partition:offset@log`, as Redis's meta and Scylla's identity rows keep it: the numbers
    /// first, so Lua reads them with one pattern.
    pub(crate) fn encode(&self) -> String {
        format!("{}:{}@{}", self.partition, self.offset, self.log)
    }

    /// The inverse of [`encode`](Self::encode); `None` for anything else (a position an older
    /// release kept as a bare `partition:offset` names no log and fences nothing).
    pub fn decode(text: &str) -> Option<Self> {
        // A stored position may carry its write's mark after a `|` (`model::written`).
        let text = text.split_once('|').map_or(text, |(position, _)| position);
        let (numbers, log) = text.split_once('@')?;
        let (partition, offset) = numbers.split_once(':')?;
        Some(Self {
            log: LogId::checked(log)?,
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }
}

impl EventGroup {
    /// The retention day of the group.
    pub fn day(&self) -> u64 {
        day_of_ms(self.created_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_as_written_and_an_older_release_bare_position_names_no_log() {
        let log = LogId::topic_id("dlBrrJzJRhCCROWDuUG5EQ").expect("log");
        let at = SourcePosition::new(log, 3, 1_234);
        assert_eq!(at.encode(), "3:1234@id:dlBrrJzJRhCCROWDuUG5EQ");
        assert_eq!(SourcePosition::decode(&at.encode()), Some(at));
        let named = LogId::cluster_topic("Xq1", "dispatch.v2").expect("log");
        let at = SourcePosition::new(named, 0, 0);
        assert_eq!(SourcePosition::decode(&at.encode()), Some(at));
        // What an older release kept: no log, so nothing to compare with.
        assert_eq!(SourcePosition::decode("3:1234"), None);
        assert_eq!(SourcePosition::decode("x:1@id:a"), None);
        assert_eq!(SourcePosition::decode("1:2@"), None);
    }

    #[test]
    fn a_log_id_never_holds_the_separators_of_a_position() {
        assert!(LogId::topic_id("a@b").is_none());
        assert!(LogId::topic_id("a|b").is_none());
        assert!(LogId::topic_id("a b").is_none());
        assert!(LogId::parse("id:abc").is_some());
        assert!(LogId::parse("name:c/t").is_some());
        assert!(
            LogId::parse("abc").is_none(),
            "a header value of another kind"
        );
    }
}
