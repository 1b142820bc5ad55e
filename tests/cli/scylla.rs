//! The store commands of SPEC 8.1 against a real CQL server (`--store scylla`, `SCYLLA_NODES`).

use crate::conformance;
use crate::support;

use std::process::Output;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::cli::{json_lines, run_materializer};

fn run(nodes: &str, keyspace: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = vec![
        "--store",
        "scylla",
        "--scylla-nodes",
        nodes,
        "--scylla-keyspace",
        keyspace,
    ];
    all.extend_from_slice(args);
    run_materializer(&all, stdin)
}

fn lines(out: &Output) -> Vec<Value> {
    json_lines(out)
}

#[test]
fn apply_scan_inspect_truncate_on_scylla() {
    let nodes = conformance::scylla::nodes().join(",");
    let keyspace = format!("mm_cli_{}", std::process::id());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let record = |seq: u64, at: u64| {
        json!({"dispatch_id": format!("d-{seq}"), "group_id": "g", "committed_at": at,
            "deliveries": [{"user_id": "u-17", "epoch": 3, "mailbox_seq": seq,
                "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]})
        .to_string()
    };
    let input = [
        record(1, now),
        record(1, now),
        record(1, now - 86_400_000),
        record(2, now),
        r#"{"type": "truncate_before", "user_id": "u-17", "epoch": 3, "before_seq": 2}"#.to_owned(),
    ]
    .join("\n");
    let out = run(&nodes, &keyspace, &["apply"], Some(&input));
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
        ["inserted", "unchanged", "conflict", "inserted", "truncated"]
    );

    let out = run(
        &nodes,
        &keyspace,
        &["scan", "--user", "u-17", "--epoch", "3", "--after", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let page = &lines(&out)[0];
    assert_eq!(page["groups"][0]["mailbox_seq"], 2);
    assert_eq!(page["groups"][0]["events"][0]["payload"], json!({"n": 2}));
    assert_eq!(page["up_to"], 2);

    let out = run(
        &nodes,
        &keyspace,
        &["inspect", "--user", "u-17", "--epoch", "3"],
        None,
    );
    let i = &lines(&out)[0];
    assert_eq!(
        (i["format_version"].clone(), i["user_trim_seq"].clone()),
        (json!(4), json!(2))
    );
    let out = run(
        &nodes,
        &keyspace,
        &[
            "truncate", "--user", "u-17", "--epoch", "3", "--before", "3",
        ],
        None,
    );
    assert_eq!(lines(&out)[0], json!({"user_trim_seq": 3}));
    let out = run(
        &nodes,
        &keyspace,
        &["scan", "--user", "u-17", "--epoch", "4"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        lines(&out)[0],
        json!({"error": {"kind": "epoch_mismatch", "current": 3}})
    );
}

#[test]
fn a_mismatched_schema_is_refused() {
    let nodes = conformance::scylla::nodes().join(",");
    let keyspace = format!("mm_bad_{}", std::process::id());
    let out = run(
        &nodes,
        &keyspace,
        &["inspect", "--user", "u", "--epoch", "1"],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Change a column's type behind the store's back: the next start must refuse the keyspace.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = scylla::client::session_builder::SessionBuilder::new()
            .known_nodes(conformance::scylla::nodes())
            .build()
            .await
            .unwrap();
        session
            .query_unpaged(
                format!("ALTER TABLE {keyspace}.mailbox_events DROP payload"),
                (),
            )
            .await
            .unwrap();
        session
            .query_unpaged(
                format!("ALTER TABLE {keyspace}.mailbox_events ADD payload blob"),
                (),
            )
            .await
            .unwrap();
    });
    let out = run(
        &nodes,
        &keyspace,
        &["inspect", "--user", "u", "--epoch", "1"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("schema mismatch") && stdout.contains("payload"),
        "{stdout}"
    );
}

/// `check-config` refuses what the Scylla backend cannot make durable or hold, naming the key.
#[test]
fn check_config_refuses_weak_consistency_and_ttls_beyond_the_limit() {
    let dir = std::env::temp_dir().join(format!("mm-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "[store]\nbackend = \"scylla\"\n[store.scylla]\nconsistency = \"ONE\"\n",
            "store.scylla.consistency",
        ),
        (
            "[store]\nbackend = \"scylla\"\n[store.scylla]\nconsistency = \"LOCAL_ONE\"\n",
            "store.scylla.consistency",
        ),
        (
            "[store]\nbackend = \"scylla\"\n[store.scylla]\nserial_consistency = \"QUORUM\"\n",
            "store.scylla.serial_consistency",
        ),
        // No backend can hold rows of 3650 + 3650 + 1 days: refused even for memory.
        (
            "[retention]\ndays = 3650\nfuture_window_days = 3650\n",
            "retention.future_window_days",
        ),
        (
            "[store]\nbackend = \"scylla\"\n[retention]\ndays = 3650\nfuture_window_days = 3650\n",
            "retention.future_window_days",
        ),
    ];
    for (i, (toml, key)) in cases.iter().enumerate() {
        let path = dir.join(format!("case-{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        let out = run_materializer(&["--config", path.to_str().unwrap(), "check-config"], None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(64), "{toml}");
        assert!(stdout.contains(key), "{toml}: {stdout}");
    }
    let path = dir.join("ok.toml");
    std::fs::write(
        &path,
        "[store]\nbackend = \"scylla\"\n[store.scylla]\nconsistency = \"QUORUM\"\nserial_consistency = \"LOCAL_SERIAL\"\n[retention]\ndays = 3650\nfuture_window_days = 3649\n",
    )
    .unwrap();
    let out = run_materializer(&["--config", path.to_str().unwrap(), "check-config"], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
