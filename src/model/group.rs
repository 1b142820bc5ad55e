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
    pub fn from_canonical(text: &str) -> Result<Self, serde_json::Error> {
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
}

impl EventGroup {
    /// The retention day of the group.
    pub fn day(&self) -> u64 {
        day_of_ms(self.created_at)
    }

    /// True when both groups carry the same `created_at` and the same events in the same order.
    ///
    /// This is the "identical content" test of a same-day replay (SPEC 4.2.8).
    pub fn same_content(&self, created_at: u64, events: &[Event]) -> bool {
        self.created_at == created_at && self.events == events
    }
}
