//! Decoding of dispatch records (SPEC section 3).
//!
//! The decoder walks a `serde_json::Value` by hand instead of deriving `Deserialize`, so every
//! error names the exact field path (`deliveries[0].events[2].event_ordinal`) and says what was
//! wrong. It never panics, whatever the bytes, and its work is bounded by the record size.
//!
//! Decisions where SPEC leaves a choice:
//! - Unknown fields of a known record type (top level, deliveries, events; never inside the
//!   opaque `payload`) are **ignored** by default and returned in [`Decoded::unknown_fields`] as
//!   index-free paths (`trace_id`, `deliveries[].events[].source`), each distinct path once per
//!   record and at most [`MAX_UNKNOWN_FIELDS_PER_RECORD`] of them. The decoder stays pure: the
//!   caller counts them (`metrics::unknown_fields`). An upstream producer that adds a field
//!   must not send the whole stream to the dead-letter topic.
//! - With [`DecodeOptions::strict_fields`] (`ingest.strict_fields = true`) the first unknown
//!   field makes the record malformed (`unknown_field`, naming the exact path): for a pipeline
//!   whose schema changes are coordinated and where a typo must not be dropped silently.
//! - `type` may be omitted (means `group_dispatch`); an unknown `type` is malformed.
//! - `dispatch_id` and `group_id` are required, non-empty strings of at most 1,024 bytes.

use std::fmt;

use serde_json::{Map, Value};

use crate::model::validate::MAX_CREATED_AT_MS;
use crate::model::{Event, EventGroup, MailboxId, Payload, UserId, MAX_MAILBOX_SEQ};

/// Default ceiling on one record's size, in bytes (SPEC: 1 MiB, configurable).
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1 << 20;

/// Longest `dispatch_id` / `group_id`, in bytes.
pub(crate) const MAX_ID_BYTES: usize = 1024;

/// What kind of malformation a record has. The words are the `error.kind` of a `malformed` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MalformedKind {
    Oversized,
    InvalidJson,
    UnknownType,
    UnknownField,
    MissingField,
    WrongType,
    OutOfRange,
    Empty,
    InvalidUserId,
}

impl MalformedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oversized => "oversized",
            Self::InvalidJson => "invalid_json",
            Self::UnknownType => "unknown_type",
            Self::UnknownField => "unknown_field",
            Self::MissingField => "missing_field",
            Self::WrongType => "wrong_type",
            Self::OutOfRange => "out_of_range",
            Self::Empty => "empty",
            Self::InvalidUserId => "invalid_user_id",
        }
    }
}

/// A malformed record: the kind, the field path (empty for the whole record) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DecodeError {
    pub kind: MalformedKind,
    pub field: String,
    pub detail: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.kind.as_str(), self.detail)
        } else {
            write!(
                f,
                "{}: field `{}`: {}",
                self.kind.as_str(),
                self.field,
                self.detail
            )
        }
    }
}

impl DecodeError {
    fn new(kind: MalformedKind, field: &str, detail: impl Into<String>) -> Self {
        Self {
            kind,
            field: field.to_owned(),
            detail: detail.into(),
        }
    }
}

/// One decoded record of the dispatch topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchRecord {
    GroupDispatch(GroupDispatch),
    TruncateBefore(TruncateBefore),
}

impl DispatchRecord {
    /// Marks every group of the record with its place in the dispatch log (zombie fencing,
    /// [`crate::model::SourcePosition`]). Without a known log identity the groups carry no
    /// position: they apply as `apply`'s do, and fence nothing (SPEC 7.2).
    pub(crate) fn at_position(
        mut self,
        log: Option<&crate::model::LogId>,
        partition: i32,
        offset: i64,
    ) -> Self {
        if let (Self::GroupDispatch(dispatch), Some(log)) = (&mut self, log) {
            let source = crate::model::SourcePosition::new(log.clone(), partition, offset);
            for group in &mut dispatch.deliveries {
                group.source = Some(source.clone());
                group.token = Some(crate::model::WriteToken::next());
            }
        }
        self
    }
}

/// A group message's deliveries to the mailboxes of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDispatch {
    pub dispatch_id: String,
    pub group_id: String,
    /// Milliseconds since the Unix epoch; every event's `created_at`.
    pub committed_at: u64,
    /// One group per delivery, in record order.
    pub deliveries: Vec<EventGroup>,
}

/// An explicit trim of one mailbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncateBefore {
    pub mailbox: MailboxId,
    pub before_seq: u64,
}

impl DispatchRecord {
    /// `dispatch_id` of a group dispatch, for dead-letter headers.
    pub fn dispatch_id(&self) -> Option<&str> {
        match self {
            Self::GroupDispatch(g) => Some(&g.dispatch_id),
            Self::TruncateBefore(_) => None,
        }
    }

    /// The memory this record costs while in flight, beside its raw bytes: its decoded form
    /// (payload texts, ids and the structures around them, [`RECORD_OVERHEAD_BYTES`] per record
    /// and [`EVENT_OVERHEAD_BYTES`] per event) plus the store request built from it, which holds
    /// each payload once more (a Redis script call's arguments, a CQL statement's values).
    ///
    /// The daemon charges raw bytes + this against `kafka.max_in_flight_bytes`, so the budget
    /// bounds what records really hold, not only what they weighed on the wire (measured by
    /// `benches/catchup_memory.rs`, BENCHMARKS.md "Memory during a catch-up").
    pub(crate) fn in_flight_bytes(&self) -> usize {
        match self {
            Self::GroupDispatch(g) => {
                let events: usize = g
                    .deliveries
                    .iter()
                    .map(|d| {
                        d.mailbox.user_id.as_str().len()
                            + d.events
                                .iter()
                                .map(|e| 2 * e.payload.len() + EVENT_OVERHEAD_BYTES)
                                .sum::<usize>()
                    })
                    .sum();
                RECORD_OVERHEAD_BYTES + g.dispatch_id.len() + g.group_id.len() + events
            }
            Self::TruncateBefore(t) => RECORD_OVERHEAD_BYTES + t.mailbox.user_id.as_str().len(),
        }
    }
}

/// Memory a record holds in flight besides its texts: its window slot, lane entry, delivery,
/// result, its share of a store call (script arguments, keys, reply) and of the allocator's
/// slack. Measured: shrinking the window by 24,000 records of 100 bytes lowered the peak RSS by
/// 78 MiB, about 3.3 KiB a record (BENCHMARKS.md "Memory during a catch-up").
pub(crate) const RECORD_OVERHEAD_BYTES: usize = 3 * 1024;
/// Memory an event holds besides its payload text (its struct, the shared text's header, the
/// key the store request builds for it).
pub(crate) const EVENT_OVERHEAD_BYTES: usize = 128;

/// Most distinct unknown field paths reported for one record; further ones are reported once
/// as [`OTHER_UNKNOWN_FIELDS`]. Keeps the list (and the caller's counting) bounded whatever
/// the record holds.
pub(crate) const MAX_UNKNOWN_FIELDS_PER_RECORD: usize = 16;
/// The path reported for every unknown field beyond [`MAX_UNKNOWN_FIELDS_PER_RECORD`].
pub(crate) const OTHER_UNKNOWN_FIELDS: &str = "other";

/// How records are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Largest record accepted, in bytes; a larger one is malformed (`oversized`).
    pub max_record_bytes: usize,
    /// `true`: an unknown field is malformed (`unknown_field`); `false` (the default): it is
    /// ignored and reported in [`Decoded::unknown_fields`].
    pub strict_fields: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            strict_fields: false,
        }
    }
}

/// A decoded record and the unknown fields it carried (empty in strict mode, where one is an
/// error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub record: DispatchRecord,
    /// Distinct index-free paths of ignored fields, in the order met; at most
    /// [`MAX_UNKNOWN_FIELDS_PER_RECORD`] plus one [`OTHER_UNKNOWN_FIELDS`].
    pub unknown_fields: Vec<String>,
}

/// Decodes one record with the default options but `max_record_bytes`: unknown fields are
/// ignored and not reported. Prefer [`decode`], whose caller can count them.
pub fn decode_record(bytes: &[u8], max_record_bytes: usize) -> Result<DispatchRecord, DecodeError> {
    decode(
        bytes,
        &DecodeOptions {
            max_record_bytes,
            strict_fields: false,
        },
    )
    .map(|decoded| decoded.record)
}

/// What the walk carries: the mode and the unknown fields met so far.
struct Walk {
    strict: bool,
    unknown: Vec<String>,
}

impl Walk {
    /// Refuses (strict) or notes (lenient) every key of `object` outside `known`. `path` is the
    /// exact path for an error, `shape` the index-free one for the report.
    fn check_fields(
        &mut self,
        object: &Map<String, Value>,
        known: &[&str],
        path: &str,
        shape: &str,
    ) -> Result<(), DecodeError> {
        for key in object.keys().filter(|k| !known.contains(&k.as_str())) {
            if self.strict {
                return Err(DecodeError::new(
                    MalformedKind::UnknownField,
                    &join(path, key),
                    format!("unknown field; expected one of {}", known.join(", ")),
                ));
            }
            self.note(join(shape, key));
        }
        Ok(())
    }

    fn note(&mut self, shape: String) {
        if self.unknown.contains(&shape) {
            return;
        }
        if self.unknown.len() < MAX_UNKNOWN_FIELDS_PER_RECORD {
            self.unknown.push(shape);
        } else if self.unknown.len() == MAX_UNKNOWN_FIELDS_PER_RECORD {
            self.unknown.push(OTHER_UNKNOWN_FIELDS.to_owned());
        }
    }
}

/// Decodes one record, refusing anything over `options.max_record_bytes`.
pub fn decode(bytes: &[u8], options: &DecodeOptions) -> Result<Decoded, DecodeError> {
    let max_record_bytes = options.max_record_bytes;
    if bytes.len() > max_record_bytes {
        return Err(DecodeError::new(
            MalformedKind::Oversized,
            "",
            format!(
                "record is {} bytes; at most {max_record_bytes} are allowed",
                bytes.len()
            ),
        ));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        DecodeError::new(
            MalformedKind::InvalidJson,
            "",
            format!("not valid JSON: {e}"),
        )
    })?;
    let Value::Object(object) = value else {
        return Err(DecodeError::new(
            MalformedKind::WrongType,
            "",
            format!("expected a JSON object, got {}", type_name(&value)),
        ));
    };
    let record_type = match object.get("type") {
        None => "group_dispatch",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(DecodeError::new(
                MalformedKind::WrongType,
                "type",
                format!("expected a string, got {}", type_name(other)),
            ))
        }
    };
    let mut walk = Walk {
        strict: options.strict_fields,
        unknown: Vec::new(),
    };
    let record = match record_type {
        "group_dispatch" => {
            decode_group_dispatch(&object, &mut walk).map(DispatchRecord::GroupDispatch)
        }
        "truncate_before" => {
            decode_truncate(&object, &mut walk).map(DispatchRecord::TruncateBefore)
        }
        other => Err(DecodeError::new(
            MalformedKind::UnknownType,
            "type",
            format!(
                "unknown record type {other:?}; expected \"group_dispatch\" or \"truncate_before\""
            ),
        )),
    }?;
    Ok(Decoded {
        record,
        unknown_fields: walk.unknown,
    })
}

const GROUP_FIELDS: &[&str] = &[
    "type",
    "dispatch_id",
    "group_id",
    "committed_at",
    "deliveries",
];
const DELIVERY_FIELDS: &[&str] = &["user_id", "epoch", "mailbox_seq", "events"];
const EVENT_FIELDS: &[&str] = &["event_ordinal", "payload"];
const TRUNCATE_FIELDS: &[&str] = &["type", "user_id", "epoch", "before_seq"];

fn decode_group_dispatch(
    object: &Map<String, Value>,
    walk: &mut Walk,
) -> Result<GroupDispatch, DecodeError> {
    walk.check_fields(object, GROUP_FIELDS, "", "")?;
    let dispatch_id = bounded_string(object, "dispatch_id", "dispatch_id")?;
    let group_id = bounded_string(object, "group_id", "group_id")?;
    let committed_at = integer(object, "committed_at", "committed_at", 0, MAX_CREATED_AT_MS)?;
    let deliveries = non_empty_array(object, "deliveries", "deliveries")?;
    let deliveries = deliveries
        .iter()
        .enumerate()
        .map(|(i, d)| decode_delivery(d, &format!("deliveries[{i}]"), committed_at, walk))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GroupDispatch {
        dispatch_id,
        group_id,
        committed_at,
        deliveries,
    })
}

fn decode_delivery(
    value: &Value,
    path: &str,
    committed_at: u64,
    walk: &mut Walk,
) -> Result<EventGroup, DecodeError> {
    let object = as_object(value, path)?;
    walk.check_fields(object, DELIVERY_FIELDS, path, "deliveries[]")?;
    let mailbox = mailbox(object, path)?;
    let mailbox_seq = integer(
        object,
        "mailbox_seq",
        &join(path, "mailbox_seq"),
        1,
        MAX_MAILBOX_SEQ,
    )?;
    let events_path = join(path, "events");
    let events = non_empty_array(object, "events", &events_path)?;
    let events = events
        .iter()
        .enumerate()
        .map(|(i, e)| decode_event(e, &format!("{events_path}[{i}]"), walk))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EventGroup {
        mailbox,
        mailbox_seq,
        created_at: committed_at,
        events,
        source: None,
        token: None,
    })
}

fn decode_event(value: &Value, path: &str, walk: &mut Walk) -> Result<Event, DecodeError> {
    let object = as_object(value, path)?;
    walk.check_fields(object, EVENT_FIELDS, path, "deliveries[].events[]")?;
    let event_ordinal = integer(
        object,
        "event_ordinal",
        &join(path, "event_ordinal"),
        0,
        u64::from(u32::MAX),
    )? as u32;
    let payload = object
        .get("payload")
        .ok_or_else(|| missing(&join(path, "payload")))?;
    Ok(Event {
        event_ordinal,
        payload: Payload::from_value(payload),
    })
}

fn decode_truncate(
    object: &Map<String, Value>,
    walk: &mut Walk,
) -> Result<TruncateBefore, DecodeError> {
    walk.check_fields(object, TRUNCATE_FIELDS, "", "")?;
    let mailbox = mailbox(object, "")?;
    let before_seq = integer(object, "before_seq", "before_seq", 1, MAX_MAILBOX_SEQ)?;
    Ok(TruncateBefore {
        mailbox,
        before_seq,
    })
}

fn mailbox(object: &Map<String, Value>, path: &str) -> Result<MailboxId, DecodeError> {
    let user_path = join(path, "user_id");
    let user_id = match object.get("user_id") {
        None => return Err(missing(&user_path)),
        Some(Value::String(s)) => UserId::parse(s).map_err(|e| {
            DecodeError::new(MalformedKind::InvalidUserId, &user_path, e.to_string())
        })?,
        Some(other) => return Err(wrong_type(&user_path, "a string", other)),
    };
    let epoch = integer(
        object,
        "epoch",
        &join(path, "epoch"),
        0,
        u64::from(u32::MAX),
    )? as u32;
    Ok(MailboxId::new(user_id, epoch))
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn as_object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, DecodeError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(path, "an object", value))
}

fn missing(path: &str) -> DecodeError {
    DecodeError::new(
        MalformedKind::MissingField,
        path,
        "required field is missing",
    )
}

fn wrong_type(path: &str, expected: &str, got: &Value) -> DecodeError {
    DecodeError::new(
        MalformedKind::WrongType,
        path,
        format!("expected {expected}, got {}", type_name(got)),
    )
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn integer(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
    min: u64,
    max: u64,
) -> Result<u64, DecodeError> {
    let value = object.get(key).ok_or_else(|| missing(path))?;
    let out_of_range = |shown: String| {
        DecodeError::new(
            MalformedKind::OutOfRange,
            path,
            format!("{shown} is outside {min}..={max}"),
        )
    };
    match value {
        Value::Number(n) => {
            if let Some(v) = n.as_u64() {
                if v < min || v > max {
                    return Err(out_of_range(v.to_string()));
                }
                Ok(v)
            } else if let Some(v) = n.as_i64() {
                Err(out_of_range(v.to_string()))
            } else if n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                Err(out_of_range(n.to_string()))
            } else {
                Err(wrong_type(path, "an integer", value))
            }
        }
        other => Err(wrong_type(path, "an integer", other)),
    }
}

fn bounded_string(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<String, DecodeError> {
    match object.get(key) {
        None => Err(missing(path)),
        Some(Value::String(s)) if s.is_empty() => Err(DecodeError::new(
            MalformedKind::Empty,
            path,
            "must not be empty",
        )),
        Some(Value::String(s)) if s.len() > MAX_ID_BYTES => Err(DecodeError::new(
            MalformedKind::OutOfRange,
            path,
            format!("{} bytes long; at most {MAX_ID_BYTES} are allowed", s.len()),
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(wrong_type(path, "a string", other)),
    }
}

fn non_empty_array<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a [Value], DecodeError> {
    match object.get(key) {
        None => Err(missing(path)),
        Some(Value::Array(items)) if items.is_empty() => Err(DecodeError::new(
            MalformedKind::Empty,
            path,
            "must hold at least one entry",
        )),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(wrong_type(path, "an array", other)),
    }
}

#[cfg(test)]
mod tests;
