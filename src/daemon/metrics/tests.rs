//! Unit tests of `metrics`.

use super::*;
use crate::model::{
    ConflictKind, CorruptKind, CursorExpired, RejectKind, StoreError, MAX_MAILBOX_SEQ,
};

/// The tests share the process-wide recorder and partition table: one test drives them all
/// in order, so no other test's partition shows up mid-assertion.
#[test]
fn exported_series_follow_the_lifecycle_of_spec_9() {
    let handle = install().expect("recorder");
    backend("memory");
    let text = handle.render();

    // Build info and counters at 0 from the start.
    assert!(
        text.contains(&format!(
            "materializer_build_info{{version=\"{VERSION}\",revision=\"{REVISION}\",backend=\"memory\"}} 1"
        )),
        "{text}"
    );
    for outcome in RECORD_OUTCOMES {
        assert!(
            text.contains(&format!("{RECORDS_TOTAL}{{outcome=\"{outcome}\"}} 0")),
            "{outcome}: {text}"
        );
    }
    for outcome in GROUP_OUTCOMES {
        assert!(text.contains(&format!("{GROUPS_TOTAL}{{outcome=\"{outcome}\"}} 0")));
    }
    for reason in DLQ_REASONS {
        assert!(text.contains(&format!("{DLQ_TOTAL}{{reason=\"{reason}\"}} 0")));
    }
    for outcome in REPLAY_OUTCOMES {
        assert!(text.contains(&format!(
            "{REPLAY_RECORDS_TOTAL}{{outcome=\"{outcome}\"}} 0"
        )));
    }
    for kind in STORE_ERROR_KINDS {
        assert!(text.contains(&format!(
            "{STORE_ERRORS_TOTAL}{{backend=\"memory\",kind=\"{kind}\"}} 0"
        )));
    }
    assert!(text.contains(&format!("{PROMOTE_EXPIRED_BUCKETS_TOTAL} 0")));

    // A partition's gauges exist from its assignment and vanish with its revocation.
    assert!(!text.contains(&format!("{CONSUMER_LAG}{{partition=\"7\"}}")));
    partition_assigned(7, 42);
    let text = handle.render();
    assert!(text.contains(&format!("{CONSUMER_LAG}{{partition=\"7\"}} 42")));
    assert!(text.contains(&format!("{PARTITION_BLOCKED}{{partition=\"7\"}} 0")));
    assert!(text.contains(&format!("{PARTITION_UNREADABLE}{{partition=\"7\"}} 0")));

    // The newest final record's timestamp, never moved back by an older one.
    last_record_timestamp(7, 1_764_633_600_123);
    last_record_timestamp(7, 1_764_633_500_000);
    committed_offset(7, 10);
    partition_unreadable(7, true);
    partition_assigned(8, -3);
    let text = handle.render();
    assert!(
        text.contains(&format!(
            "{LAST_RECORD_TIMESTAMP}{{partition=\"7\"}} 1764633600.123"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("{COMMITTED_OFFSET}{{partition=\"7\"}} 10")));
    assert!(text.contains(&format!("{PARTITION_UNREADABLE}{{partition=\"7\"}} 1")));
    assert!(text.contains(&format!("{CONSUMER_LAG}{{partition=\"8\"}} 0")));

    partition_revoked(7);
    let text = handle.render();
    // Gauges vanish; the records-lost counter stays, zero from the assignment on, so the first
    // loss is an increase an alert sees (SPEC 7.3), and a loss stays visible after the move.
    assert!(
        text.lines()
            .filter(|l| l.contains("partition=\"7\""))
            .all(|l| l.starts_with(RECORDS_LOST_TOTAL)),
        "{text}"
    );
    assert!(text.contains(&format!(
        "{RECORDS_LOST_TOTAL}{{partition=\"7\",reason=\"committed_below_log_start\"}} 0"
    )));
    assert!(text.contains(&format!("{CONSUMER_LAG}{{partition=\"8\"}} 0")));
    partition_revoked(8);
    let text = handle.render();
    assert!(!text.contains(CONSUMER_LAG), "{text}");
    assert!(!text.contains(LAST_RECORD_TIMESTAMP), "{text}");

    // Unknown fields: counted per path, the path set bounded.
    unknown_fields(&["trace_id", "deliveries[].trace_id", "trace_id"]);
    let text = handle.render();
    assert!(text.contains(&format!("{UNKNOWN_FIELDS_TOTAL}{{field=\"trace_id\"}} 2")));
    assert!(text.contains(&format!(
        "{UNKNOWN_FIELDS_TOTAL}{{field=\"deliveries[].trace_id\"}} 1"
    )));
    let many: Vec<String> = (0..MAX_UNKNOWN_FIELD_LABELS + 10)
        .map(|i| format!("f{i}"))
        .collect();
    unknown_fields(&many);
    unknown_fields(&["with\"quote", "with\nnewline", &"x".repeat(200)]);
    let text = handle.render();
    let labels = text
        .lines()
        .filter(|l| l.starts_with(&format!("{UNKNOWN_FIELDS_TOTAL}{{")))
        .count();
    assert_eq!(labels, MAX_UNKNOWN_FIELD_LABELS + 1, "{text}");
    // 2 seen before plus 64 - 2 new labels: 12 new paths and 3 odd ones are `other`.
    assert!(text.contains(&format!("{UNKNOWN_FIELDS_TOTAL}{{field=\"other\"}} 15")));
    // A path already labelled keeps its label after the bound is reached.
    unknown_fields(&["trace_id"]);
    assert!(handle
        .render()
        .contains(&format!("{UNKNOWN_FIELDS_TOTAL}{{field=\"trace_id\"}} 3")));

    // Every store error kind has a zero-initialised series.
    let errors = [
        StoreError::Rejected {
            kind: RejectKind::DuplicateOrdinal,
            detail: String::new(),
        },
        StoreError::Rejected {
            kind: RejectKind::CrossBucketGroup,
            detail: String::new(),
        },
        StoreError::Rejected {
            kind: RejectKind::FutureCreatedAt,
            detail: String::new(),
        },
        StoreError::Rejected {
            kind: RejectKind::SpanExceeded,
            detail: String::new(),
        },
        StoreError::Rejected {
            kind: RejectKind::InvalidField,
            detail: String::new(),
        },
        StoreError::Conflict {
            kind: ConflictKind::CrossDay {
                existing_day: 1,
                incoming_day: 2,
            },
        },
        StoreError::Corrupt {
            kind: CorruptKind::UnsupportedFormat {
                found: "3".to_owned(),
            },
        },
        StoreError::Corrupt {
            kind: CorruptKind::IndexLost,
        },
        StoreError::Corrupt {
            kind: CorruptKind::MetaLost,
        },
        StoreError::Corrupt {
            kind: CorruptKind::IdentityMissing {
                seq: 1,
                seqbucket_max_seq: MAX_MAILBOX_SEQ,
            },
        },
        StoreError::Corrupt {
            kind: CorruptKind::BadProof {
                detail: String::new(),
            },
        },
        StoreError::EpochMismatch { current: None },
        StoreError::CursorExpired {
            cursor: CursorExpired::ExpiredGap { boundary: 1 },
        },
        StoreError::Unavailable {
            backend: "memory",
            detail: String::new(),
        },
        StoreError::UnderRepair {
            holder: String::new(),
        },
        StoreError::Refused {
            backend: "memory",
            detail: String::new(),
        },
        StoreError::FenceLost {
            detail: String::new(),
        },
        StoreError::Unsupported {
            backend: "memory",
            operation: "x",
        },
    ];
    for e in &errors {
        assert!(STORE_ERROR_KINDS.contains(&e.kind()), "{}", e.kind());
    }
    assert_eq!(errors.len(), STORE_ERROR_KINDS.len());

    // The whole scrape is valid exposition text.
    let text = handle.render();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (_, value) = line.rsplit_once(' ').expect("name value");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
}

#[test]
fn values_are_spelled_as_prometheus_expects() {
    assert_eq!(format_value(3.0), "3");
    assert_eq!(format_value(0.5), "0.5");
    assert_eq!(format_value(f64::INFINITY), "+Inf");
    assert_eq!(format_value(f64::NAN), "NaN");
}
