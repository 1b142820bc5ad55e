//! Unit tests of `decode`.

use super::*;

const VALID: &str = r#"{"type": "group_dispatch",
 "dispatch_id": "grp-42/msg-9001", "group_id": "grp-42", "committed_at": 1764633600123,
 "deliveries": [
   {"user_id": "u-17", "epoch": 3, "mailbox_seq": 1042,
"events": [{"event_ordinal": 0, "payload": {"kind": "message", "body": "hi"}},
           {"event_ordinal": 1, "payload": {"kind": "reaction", "emoji": "+1"}}]}]}"#;

fn decode(s: &str) -> Result<DispatchRecord, DecodeError> {
    decode_record(s.as_bytes(), DEFAULT_MAX_RECORD_BYTES)
}

fn err(s: &str) -> DecodeError {
    decode(s).expect_err("expected a malformed record")
}

#[test]
fn decodes_the_spec_example() {
    let DispatchRecord::GroupDispatch(g) = decode(VALID).unwrap() else {
        panic!("expected a group dispatch");
    };
    assert_eq!(g.dispatch_id, "grp-42/msg-9001");
    assert_eq!(g.deliveries.len(), 1);
    let d = &g.deliveries[0];
    assert_eq!(d.mailbox.user_id.as_str(), "u-17");
    assert_eq!(d.mailbox.epoch, 3);
    assert_eq!(d.mailbox_seq, 1042);
    assert_eq!(d.created_at, 1_764_633_600_123);
    assert_eq!(
        d.events[0].payload.as_str(),
        r#"{"body":"hi","kind":"message"}"#
    );
}

#[test]
fn type_may_be_omitted() {
    let without = VALID.replacen(r#""type": "group_dispatch","#, "", 1);
    assert!(matches!(
        decode(&without),
        Ok(DispatchRecord::GroupDispatch(_))
    ));
}

#[test]
fn decodes_truncate_before() {
    let r =
        decode(r#"{"type": "truncate_before", "user_id": "u-17", "epoch": 3, "before_seq": 900}"#)
            .unwrap();
    let DispatchRecord::TruncateBefore(t) = r else {
        panic!("expected a truncate");
    };
    assert_eq!(t.before_seq, 900);
    assert_eq!(t.mailbox.epoch, 3);
}

#[test]
fn every_malformation_names_its_field() {
    let cases: &[(&str, MalformedKind, &str)] = &[
        ("[1]", MalformedKind::WrongType, ""),
        ("{\"a\":", MalformedKind::InvalidJson, ""),
        (r#"{"type":"nope"}"#, MalformedKind::UnknownType, "type"),
        (r#"{"type":7}"#, MalformedKind::WrongType, "type"),
        (
            &VALID.replacen("\"committed_at\": 1764633600123,", "", 1),
            MalformedKind::MissingField,
            "committed_at",
        ),
        (
            &VALID.replacen("1764633600123", "-5", 1),
            MalformedKind::OutOfRange,
            "committed_at",
        ),
        (
            &VALID.replacen("1764633600123", "\"x\"", 1),
            MalformedKind::WrongType,
            "committed_at",
        ),
        (
            &VALID.replacen("1042", "0", 1),
            MalformedKind::OutOfRange,
            "deliveries[0].mailbox_seq",
        ),
        (
            &VALID.replacen("1042", "10000000000000000", 1),
            MalformedKind::OutOfRange,
            "deliveries[0].mailbox_seq",
        ),
        (
            &VALID.replacen("1042", "1.5", 1),
            MalformedKind::WrongType,
            "deliveries[0].mailbox_seq",
        ),
        (
            &VALID.replacen("\"epoch\": 3", "\"epoch\": 4294967296", 1),
            MalformedKind::OutOfRange,
            "deliveries[0].epoch",
        ),
        (
            &VALID.replacen("u-17", "u{17}", 1),
            MalformedKind::InvalidUserId,
            "deliveries[0].user_id",
        ),
        (
            &VALID.replacen("\"event_ordinal\": 1", "\"event_ordinal\": -1", 1),
            MalformedKind::OutOfRange,
            "deliveries[0].events[1].event_ordinal",
        ),
        (
            &VALID.replacen(
                ", \"payload\": {\"kind\": \"reaction\", \"emoji\": \"+1\"}",
                "",
                1,
            ),
            MalformedKind::MissingField,
            "deliveries[0].events[1].payload",
        ),
        (
            r#"{"dispatch_id":"d","group_id":"g","committed_at":1,"deliveries":[]}"#,
            MalformedKind::Empty,
            "deliveries",
        ),
        (
            r#"{"dispatch_id":"d","group_id":"g","committed_at":1,"deliveries":[{"user_id":"u","epoch":1,"mailbox_seq":1,"events":[]}]}"#,
            MalformedKind::Empty,
            "deliveries[0].events",
        ),
        (
            r#"{"dispatch_id":"","group_id":"g","committed_at":1,"deliveries":[1]}"#,
            MalformedKind::Empty,
            "dispatch_id",
        ),
        (
            r#"{"dispatch_id":"d","group_id":"g","committed_at":1,"deliveries":[1]}"#,
            MalformedKind::WrongType,
            "deliveries[0]",
        ),
        (
            r#"{"type":"truncate_before","user_id":"u","epoch":1,"before_seq":0}"#,
            MalformedKind::OutOfRange,
            "before_seq",
        ),
    ];
    for (input, kind, field) in cases {
        let e = err(input);
        assert_eq!(
            (e.kind, e.field.as_str()),
            (*kind, *field),
            "input {input}: {e}"
        );
        assert!(!e.detail.is_empty());
    }
}

fn strict(s: &str) -> Result<Decoded, DecodeError> {
    super::decode(
        s.as_bytes(),
        &DecodeOptions {
            strict_fields: true,
            ..DecodeOptions::default()
        },
    )
}

fn lenient(s: &str) -> Decoded {
    super::decode(s.as_bytes(), &DecodeOptions::default()).expect("a valid record")
}

/// The spec example with an unknown field at every level of the record, and inside payloads.
fn with_unknown_fields() -> String {
    VALID
        .replacen("\"type\"", "\"trace_id\": \"t-1\", \"type\"", 1)
        .replacen("\"user_id\"", "\"region\": \"eu\", \"user_id\"", 1)
        .replacen(
            "\"event_ordinal\": 0",
            "\"source\": {\"app\": \"x\"}, \"event_ordinal\": 0",
            1,
        )
        .replacen(
            "\"event_ordinal\": 1",
            "\"source\": null, \"event_ordinal\": 1",
            1,
        )
}

#[test]
fn unknown_fields_are_ignored_and_reported_at_every_level() {
    let decoded = lenient(&with_unknown_fields());
    assert_eq!(
        decoded.record,
        decode(VALID).unwrap(),
        "the extra fields change nothing"
    );
    assert_eq!(
        decoded.unknown_fields,
        [
            "trace_id",
            "deliveries[].region",
            "deliveries[].events[].source"
        ],
        "each distinct path once, without indices"
    );
    // Payloads are opaque: their fields are data, not unknown fields.
    assert!(lenient(VALID).unknown_fields.is_empty());
    let truncate =
        lenient(r#"{"type":"truncate_before","user_id":"u","epoch":1,"before_seq":5,"x":1}"#);
    assert_eq!(truncate.unknown_fields, ["x"]);
    assert!(matches!(truncate.record, DispatchRecord::TruncateBefore(_)));
}

#[test]
fn strict_fields_make_the_first_unknown_field_malformed_with_its_exact_path() {
    let cases: &[(String, &str)] = &[
        (VALID.replacen("\"group_id\"", "\"grop_id\"", 1), "grop_id"),
        (with_unknown_fields(), "trace_id"),
        (
            VALID.replacen("\"user_id\"", "\"region\": 1, \"user_id\"", 1),
            "deliveries[0].region",
        ),
        (
            VALID.replacen("\"event_ordinal\": 1", "\"x\": 1, \"event_ordinal\": 1", 1),
            "deliveries[0].events[1].x",
        ),
        (
            r#"{"type":"truncate_before","user_id":"u","epoch":1,"before_seq":5,"x":1}"#.to_owned(),
            "x",
        ),
    ];
    for (input, field) in cases {
        let e = strict(input).expect_err("strict refuses unknown fields");
        assert_eq!(
            (e.kind, e.field.as_str()),
            (MalformedKind::UnknownField, *field)
        );
        assert_eq!(e.kind.as_str(), "unknown_field");
    }
    assert!(strict(VALID).is_ok_and(|d| d.unknown_fields.is_empty()));
}

#[test]
fn the_unknown_field_report_is_bounded() {
    let extra: String = (0..100).map(|i| format!("\"x{i}\": {i}, ")).collect();
    let input = VALID.replacen("{\"type\"", &format!("{{{extra}\"type\""), 1);
    let decoded = lenient(&input);
    assert_eq!(
        decoded.unknown_fields.len(),
        MAX_UNKNOWN_FIELDS_PER_RECORD + 1
    );
    assert_eq!(
        decoded.unknown_fields.last().map(String::as_str),
        Some(OTHER_UNKNOWN_FIELDS)
    );
}

#[test]
fn other_malformations_win_over_ignored_fields() {
    let input = with_unknown_fields().replacen("1042", "0", 1);
    let e = super::decode(input.as_bytes(), &DecodeOptions::default()).unwrap_err();
    assert_eq!(e.kind, MalformedKind::OutOfRange);
}

#[test]
fn oversized_records_are_refused_before_parsing() {
    let e = decode_record(VALID.as_bytes(), 100).unwrap_err();
    assert_eq!(e.kind, MalformedKind::Oversized);
}
