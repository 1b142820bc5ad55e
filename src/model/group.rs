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
}

/// A record's place in the dispatch log: its partition and offset.
///
/// Zombie fencing (SPEC 7.2, docs/decisions.md): every write that changes a mailbox keeps the
/// position it came from; a same-day replace from an older position of the same partition is a
/// write decided under an assignment that has moved on (or a replay of a superseded record),
/// and changes nothing (see [`crate::model::rules::superseded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourcePosition {
    pub partition: i32,
    pub offset: i64,
}

impl SourcePosition {
    /// `partition:offset`, as the Redis meta and the Scylla meta row keep it.
    pub(crate) fn encode(self) -> String {
        format!("{}:{}", self.partition, self.offset)
    }

    /// The inverse of [`encode`](Self::encode); `None` for anything else.
    pub fn decode(text: &str) -> Option<Self> {
        let (partition, offset) = text.split_once(':')?;
        Some(Self {
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }

    /// The position a mailbox keeps after a write from `incoming` when it held `held`: the
    /// later of the two within one partition, the incoming one otherwise.
    pub(crate) fn after_write(held: Option<Self>, incoming: Option<Self>) -> Option<Self> {
        match (held, incoming) {
            (Some(h), Some(i)) if h.partition == i.partition => {
                Some(if i.offset > h.offset { i } else { h })
            }
            (held, None) => held,
            (_, incoming) => incoming,
        }
    }
}

impl EventGroup {
    /// The retention day of the group.
    pub fn day(&self) -> u64 {
        day_of_ms(self.created_at)
    }
}
