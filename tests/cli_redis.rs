//! The store commands of SPEC 8.1 against a real redis-server (`--store redis`).

mod support;

use std::process::Output;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::cli::{json_lines, run_materializer};
use support::redis_server::{Clock, Listen, RedisServer};

fn run(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = vec!["--store", "redis", "--redis-url", url];
    all.extend_from_slice(args);
    run_materializer(&all, stdin)
}

fn lines(out: &Output) -> Vec<Value> {
    json_lines(out)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn dispatch(seq: u64, committed_at: u64) -> String {
    json!({"dispatch_id": format!("d-{seq}"), "group_id": "g", "committed_at": committed_at,
        "deliveries": [{"user_id": "u-17", "epoch": 3, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]})
    .to_string()
}

#[test]
fn apply_scan_inspect_truncate_patrol_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let url = server.url();
    let now = now_ms();
    let input = [
        dispatch(1, now),
        dispatch(1, now),
        dispatch(2, now - 86_400_000),
        dispatch(3, now - 40 * 86_400_000),
        r#"{"type": "truncate_before", "user_id": "u-17", "epoch": 3, "before_seq": 2}"#.to_owned(),
    ]
    .join("\n");
    let out = run(&url, &["apply", "-"], Some(&input));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcomes: Vec<_> = lines(&out)
        .iter()
        .map(|l| l["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        [
            "inserted",
            "unchanged",
            "inserted",
            "expired_merged",
            "truncated"
        ]
    );

    let out = run(
        &url,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "3"],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        lines(&out)[0],
        json!({"groups": [], "up_to": 3, "has_more": false})
    );
    let out = run(
        &url,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        lines(&out)[0],
        json!({"error": {"kind": "cursor_expired", "reason": "expired_gap", "boundary": 3}})
    );

    let out = run(&url, &["inspect", "--user", "u-17", "--epoch", "3"], None);
    let i = &lines(&out)[0];
    assert_eq!(i["format_version"], 4);
    assert_eq!(i["current_epoch"], 3);
    assert_eq!(i["user_trim_seq"], 2);
    assert_eq!(i["expired_gap_boundary"], 3);
    assert_eq!(i["seqbucket_max_seq"], 2);
    assert_eq!(i["active_day_count"], 2);

    let out = run(
        &url,
        &[
            "truncate", "--user", "u-17", "--epoch", "3", "--before", "3",
        ],
        None,
    );
    assert_eq!(lines(&out)[0], json!({"user_trim_seq": 3}));

    let out = run(&url, &["patrol", "--rate", "1000"], None);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lines(&out)[0]["visited"], 1);
}

#[test]
fn unreachable_redis_exits_2() {
    let out = run(
        "redis://127.0.0.1:1",
        &["scan", "--user", "u", "--epoch", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis"));
}
