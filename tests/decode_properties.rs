//! Property tests of the dispatch decoder: whatever the bytes, it returns a record or a typed error
//! that names the problem; it never panics, and a valid record mutated anywhere is either still
//! valid or refused with a field path.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

use mailbox_materializer::ingest::decode::{decode_record, DEFAULT_MAX_RECORD_BYTES};
use mailbox_materializer::ingest::{DispatchRecord, MalformedKind};
use proptest::prelude::*;
use serde_json::{json, Value};

fn valid_record() -> Value {
    json!({"type": "group_dispatch",
        "dispatch_id": "grp-42/msg-9001", "group_id": "grp-42", "committed_at": 1_764_633_600_123u64,
        "deliveries": [
            {"user_id": "u-17", "epoch": 3, "mailbox_seq": 1042,
             "events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hi"}},
                        {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]},
            {"user_id": "u-18", "epoch": 1, "mailbox_seq": 7,
             "events": [{"event_ordinal": 0, "payload": null}]}]})
}

/// Every path to a scalar or container inside the record (payload interiors included).
fn paths(value: &Value, prefix: Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let mut p = prefix.clone();
                p.push(PathStep::Key(k.clone()));
                paths(v, p, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let mut p = prefix.clone();
                p.push(PathStep::Index(i));
                paths(v, p, out);
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn at<'a>(value: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match step {
        PathStep::Key(k) => &mut v[k.as_str()],
        PathStep::Index(i) => &mut v[*i],
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(Value),
    Remove,
    AddField(String),
}

fn replacement() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z{} ]{0,8}".prop_map(Value::String),
        Just(json!([])),
        Just(json!({})),
        Just(json!(4_294_967_296u64)),
        Just(json!(10_000_000_000_000_000u64)),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        replacement().prop_map(Mutation::Replace),
        Just(Mutation::Remove),
        "[a-z_]{1,10}".prop_map(Mutation::AddField),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_record(&bytes, DEFAULT_MAX_RECORD_BYTES);
    }

    #[test]
    fn arbitrary_json_never_panics(text in "[\\[\\]{}\":,0-9a-z_ .-]{0,200}") {
        let _ = decode_record(text.as_bytes(), DEFAULT_MAX_RECORD_BYTES);
    }

    #[test]
    fn mutated_valid_records_are_valid_or_name_the_field(pick in any::<prop::sample::Index>(), m in mutation()) {
        let mut record = valid_record();
        let mut all = Vec::new();
        paths(&record, Vec::new(), &mut all);
        let path = all[pick.index(all.len())].clone();
        let inside_payload = path.iter().any(|s| matches!(s, PathStep::Key(k) if k == "payload"));
        match &m {
            Mutation::Replace(v) => *at(&mut record, &path) = v.clone(),
            Mutation::Remove => {
                let Some((last, parent)) = path.split_last() else { return Ok(()) };
                match (at(&mut record, parent), last) {
                    (Value::Object(map), PathStep::Key(k)) => { map.remove(k); }
                    (Value::Array(items), PathStep::Index(i)) => { items.remove(*i); }
                    _ => {}
                }
            }
            Mutation::AddField(name) => {
                if let Value::Object(map) = at(&mut record, &path) {
                    map.insert(format!("x_{name}"), json!(1));
                }
            }
        }
        let bytes = serde_json::to_vec(&record).unwrap();
        match decode_record(&bytes, DEFAULT_MAX_RECORD_BYTES) {
            Ok(DispatchRecord::GroupDispatch(g)) => {
                // Still valid: every delivery keeps the invariants the decoder promises.
                prop_assert!(!g.deliveries.is_empty());
                for d in &g.deliveries {
                    prop_assert!(!d.events.is_empty());
                    prop_assert!(d.mailbox_seq >= 1);
                    prop_assert_eq!(d.created_at, g.committed_at);
                }
            }
            Ok(DispatchRecord::TruncateBefore(_)) => {}
            Err(e) => {
                prop_assert!(!inside_payload || e.kind == MalformedKind::MissingField,
                    "payload content is opaque, yet {e}");
                prop_assert!(!e.detail.is_empty());
                let whole_record = matches!(e.kind, MalformedKind::InvalidJson | MalformedKind::Oversized)
                    || (e.kind == MalformedKind::WrongType && path.is_empty());
                prop_assert!(whole_record || !e.field.is_empty(), "{e}");
            }
        }
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = decode_record(deep.as_bytes(), usize::MAX).unwrap_err();
    assert_eq!(e.kind, MalformedKind::InvalidJson);
}
