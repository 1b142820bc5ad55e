//! `materializer verify` (the scrub) on real servers: damage injected through the store's own
//! layout is found exactly, the damaged mailboxes and no other, while a daemon keeps writing;
//! the store is byte-for-byte the same before and after a verify; history before the range is
//! never a difference; the generated histories (replaces, expired input, a truncate, conflicts,
//! stale epochs, malformed records) verify as `match` on memory, Redis, a Redis Cluster and Scylla.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use support::cli::run_materializer;
use support::kafka::{committed, create_topic, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{end_offsets, group_record, stream, PARTITIONS};

/// Runs `verify` with `args`: its exit status, the mailbox lines by user, and the summary.
fn verify(config: &str, args: &[&str]) -> (Option<i32>, BTreeMap<String, Value>, Value) {
    let mut all = vec!["--config", config, "verify", "--progress", "off"];
    all.extend_from_slice(args);
    let out = run_materializer(&all, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = BTreeMap::new();
    let mut summary = Value::Null;
    for line in stdout.lines() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{stdout}"));
        if let Some(s) = value.get("summary") {
            summary = s.clone();
        } else {
            let user = value["user_id"].as_str().expect("user_id").to_owned();
            lines.insert(user, value);
        }
    }
    assert!(
        summary.is_object(),
        "no summary line: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), lines, summary)
}

/// Every key of the prefix with its serialized value: equal before and after a read-only run.
fn redis_dump(url: &str) -> BTreeMap<String, Vec<u8>> {
    let client = redis::Client::open(url).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("mm:*")
        .query(&mut conn)
        .expect("keys");
    keys.into_iter()
        .map(|key| {
            let dumped: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).expect("dump");
            (key, dumped)
        })
        .collect()
}

fn redis_conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("client")
        .get_connection()
        .expect("connection")
}

/// The one day key of `user` (every record of the test is from today).
fn day_key(conn: &mut redis::Connection, user: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("mm:mbday:{{{user}}}:1:*"))
        .query(conn)
        .expect("keys");
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_finds_exactly_the_damaged_mailboxes_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    let url = server.url();
    let mut setup = DaemonSetup::new("verify", Some(url.clone()));
    setup.http_extra = vec!["debug_endpoints = true".to_owned()];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let users: Vec<String> = (0..8).map(|u| format!("u{u}")).collect();
    let mut records = Vec::new();
    for seq in 1..=4 {
        for user in &users {
            records.push((0, group_record(user, seq, &format!("{user}-{seq}"))));
        }
    }
    // A same-day replace: the range's last version is the one to hold.
    records.push((0, group_record("u0", 2, "u0-2-replaced")));
    let offsets = produce(&setup.topic, &records).await;
    let end = offsets.last().expect("offsets") + 1;
    let daemon = Daemon::start(&setup);
    wait_for(
        "every record committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == [end],
        || daemon.log(),
    );
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("utf-8").to_owned();

    // Untouched: every mailbox matches, and the store is not changed by looking.
    let before = redis_dump(&url);
    let (code, lines, summary) = verify(
        &config,
        &["--partition", "0", "--from-offset", "0", "--all"],
    );
    assert_eq!(code, Some(0), "{summary}");
    assert_eq!(lines.len(), 8, "{lines:?}");
    assert!(lines.values().all(|l| l["verdict"] == "match"), "{lines:?}");
    assert_eq!(summary["verdicts"]["match"], 8, "{summary}");
    assert_eq!(summary["records"], records.len(), "{summary}");
    assert_eq!(summary["end_offset"], end, "{summary}");
    assert_eq!(redis_dump(&url), before, "verify wrote to the store");

    // Damage through the layout.
    let mut conn = redis_conn(&url);
    // u1: seq 2's payload changed in its day bucket.
    let key = day_key(&mut conn, "u1");
    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut conn)
        .expect("zrange");
    let (member, score) = members
        .iter()
        .find(|(m, _)| m.starts_with("0000000000000002|"))
        .expect("seq 2")
        .clone();
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(&key)
        .arg(&member)
        .cmd("ZADD")
        .arg(&key)
        .arg(score)
        .arg(member.replace("u1-2", "u1-2-tampered"))
        .query(&mut conn)
        .expect("tamper");
    // u2: its day bucket deleted.
    let key = day_key(&mut conn, "u2");
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).expect("del");
    // u3: one identity member removed.
    let _: () = redis::cmd("ZREM")
        .arg("mm:mbseqbucket:{u3}:1")
        .arg("0000000000000003")
        .query(&mut conn)
        .expect("zrem");
    // u4: a meta field changed (the day's proof lowered below what the day holds).
    let key = day_key(&mut conn, "u4");
    let day = key.rsplit(':').next().expect("day").to_owned();
    let _: () = redis::cmd("HSET")
        .arg("mm:mbmeta:{u4}:1")
        .arg(format!("bucket_max_seq:{day}"))
        .arg(2)
        .query(&mut conn)
        .expect("hset");

    let damaged = ["u1", "u2", "u3", "u4"];
    let check = |lines: &BTreeMap<String, Value>, summary: &Value| {
        let found: Vec<&str> = lines
            .iter()
            .filter(|(_, l)| l["verdict"] == "differs" || l["verdict"] == "corrupt")
            .map(|(u, _)| u.as_str())
            .collect();
        assert_eq!(found, damaged, "{lines:#?}\n{summary}");
        assert_eq!(lines["u1"]["verdict"], "differs", "{}", lines["u1"]);
        assert_eq!(
            lines["u1"]["other_content"],
            serde_json::json!([2]),
            "{}",
            lines["u1"]
        );
        for user in damaged {
            let fix = lines[user]["fix"].as_str().unwrap_or_default();
            assert!(
                fix.starts_with("materializer replay --partition 0 --from-time ")
                    && fix.ends_with(&format!(" --user {user} --reset-mailboxes")),
                "{}",
                lines[user]
            );
        }
    };
    let before = redis_dump(&url);
    let (code, lines, summary) = verify(&config, &["--partition", "0", "--from-offset", "0"]);
    println!("{lines:#?}\n{summary}");
    // SPEC 8.2: 3 when a corrupt mailbox was met, else 1 for one that differs.
    let corrupt = lines.values().any(|l| l["verdict"] == "corrupt");
    assert_eq!(code, Some(if corrupt { 3 } else { 1 }), "{summary}");
    check(&lines, &summary);
    assert_eq!(redis_dump(&url), before, "verify wrote to the store");

    // The same while the daemon keeps writing, to other users and to the damaged ones (after
    // the range end: not a difference, whatever it changes).
    let more: Vec<(i32, Vec<u8>)> = (5..=60)
        .flat_map(|seq| {
            ["u0", "u6", "u7", "u5", "u1"]
                .iter()
                .map(move |u| (0, group_record(u, seq, "later")))
        })
        .collect();
    let producing = tokio::spawn({
        let topic = setup.topic.clone();
        async move { produce(&topic, &more).await }
    });
    let (code, lines, summary) = verify(&config, &["--partition", "0", "--from-offset", "0"]);
    producing.await.expect("produced");
    // SPEC 8.2: 3 when a corrupt mailbox was met, else 1 for one that differs.
    let corrupt = lines.values().any(|l| l["verdict"] == "corrupt");
    assert_eq!(code, Some(if corrupt { 3 } else { 1 }), "{summary}");
    check(&lines, &summary);

    // History before the range is never a difference: the undamaged users verify from the
    // middle of their history.
    let (_, lines, summary) = verify(
        &config,
        &[
            "--partition",
            "0",
            "--from-offset",
            &offsets[17].to_string(),
        ],
    );
    for (user, line) in &lines {
        if !damaged.contains(&user.as_str()) {
            assert_ne!(line["verdict"], "differs", "{line}\n{summary}");
            assert_ne!(line["verdict"], "corrupt", "{line}\n{summary}");
        }
    }
    // A batch bound smaller than the range: many batches, the same verdicts.
    let (code, lines, summary) = verify(
        &config,
        &[
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--to-offset",
            &(end - 1).to_string(),
            "--batch-bytes",
            "1024",
        ],
    );
    // SPEC 8.2: 3 when a corrupt mailbox was met, else 1 for one that differs.
    let corrupt = lines.values().any(|l| l["verdict"] == "corrupt");
    assert_eq!(code, Some(if corrupt { 3 } else { 1 }), "{summary}");
    assert!(summary["batches"].as_u64().unwrap_or(0) > 2, "{summary}");
    check(&lines, &summary);
}

/// The generated histories verify as `match` everywhere (every partition, from the log start).
async fn generated_histories_match(setup: DaemonSetup, stop_first: bool) {
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(40, 4, 11);
    let offsets = produce(&setup.topic, &records).await;
    let ends = end_offsets(&records, &offsets);
    let mut daemon = Daemon::start(&setup);
    if stop_first {
        // The memory store commits nothing (its content dies with the process): wait for every
        // record to be final instead.
        wait_for(
            "every record final",
            Duration::from_secs(120),
            || daemon.metrics().sum("materializer_records_total") >= records.len() as f64,
            || daemon.log(),
        );
    } else {
        wait_for(
            "every record committed",
            Duration::from_secs(120),
            || committed(&setup.group, &setup.topic, PARTITIONS) == ends,
            || daemon.log(),
        );
    }
    if stop_first {
        // The memory store: its snapshot is what a separate process can read.
        assert!(daemon.terminate(Duration::from_secs(30)).success());
    }
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("utf-8").to_owned();
    let mut verdicts: BTreeMap<String, u64> = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let (code, lines, summary) = verify(
            &config,
            &["--partition", &partition.to_string(), "--from-offset", "0"],
        );
        assert_eq!(code, Some(0), "{lines:#?}\n{summary}");
        assert!(lines.is_empty(), "{lines:#?}");
        for (verdict, n) in summary["verdicts"].as_object().expect("verdicts") {
            *verdicts.entry(verdict.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
    }
    assert_eq!(
        verdicts.keys().collect::<Vec<_>>(),
        ["match"],
        "{verdicts:?}"
    );
    assert!(verdicts["match"] >= 40, "{verdicts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_histories_verify_as_match_on_memory() {
    generated_histories_match(DaemonSetup::new("verify-gen-memory", None), true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_histories_verify_as_match_on_redis() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    generated_histories_match(
        DaemonSetup::new("verify-gen-redis", Some(server.url())),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_histories_verify_as_match_on_a_redis_cluster() {
    let cluster =
        tokio::task::spawn_blocking(|| support::redis_server::RedisCluster::start(Clock::Real))
            .await
            .expect("cluster start");
    let mut setup = DaemonSetup::new("verify-gen-cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    generated_histories_match(setup, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_histories_verify_as_match_on_scylla() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let mut setup = DaemonSetup::new("verify-gen-scylla", None);
    setup.scylla = Some((nodes, format!("mmd_verify_{}", std::process::id())));
    generated_histories_match(setup, false).await;
}

/// Eight users, four seqs each, applied by a daemon that keeps running: `(daemon, config)`.
async fn seeded(setup: &DaemonSetup) -> (Daemon, String) {
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records = Vec::new();
    for seq in 1..=4 {
        for u in 0..8 {
            records.push((
                0,
                group_record(&format!("u{u}"), seq, &format!("u{u}-{seq}")),
            ));
        }
    }
    let offsets = produce(&setup.topic, &records).await;
    let end = offsets.last().expect("offsets") + 1;
    let daemon = Daemon::start(setup);
    wait_for(
        "every record committed",
        Duration::from_secs(120),
        || committed(&setup.group, &setup.topic, 1) == [end],
        || daemon.log(),
    );
    let config = setup.config_file(free_port());
    (daemon, config.to_str().expect("utf-8").to_owned())
}

/// Exactly `damaged` are reported (differs or corrupt), each with its fix.
fn found_exactly(config: &str, damaged: &[&str]) -> BTreeMap<String, Value> {
    let (code, lines, summary) = verify(config, &["--partition", "0", "--from-offset", "0"]);
    println!("{lines:#?}\n{summary}");
    // SPEC 8.2: 3 when a corrupt mailbox was met, else 1 for one that differs.
    let corrupt = lines.values().any(|l| l["verdict"] == "corrupt");
    assert_eq!(code, Some(if corrupt { 3 } else { 1 }), "{summary}");
    let found: Vec<&str> = lines
        .iter()
        .filter(|(_, l)| l["verdict"] == "differs" || l["verdict"] == "corrupt")
        .map(|(u, _)| u.as_str())
        .collect();
    assert_eq!(found, damaged, "{lines:#?}");
    assert_eq!(summary["verdicts"]["match"], 8 - damaged.len(), "{summary}");
    for user in damaged {
        assert!(lines[*user]["fix"].as_str().is_some(), "{}", lines[*user]);
    }
    lines
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_finds_exactly_the_damaged_mailboxes_on_scylla() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmd_verify_dmg_{}", std::process::id());
    let mut setup = DaemonSetup::new("verify-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    let (_daemon, config) = seeded(&setup).await;
    let store = support::reference::scylla_store(&nodes, &keyspace).await;
    let session = store.session();
    async fn cql(
        session: &scylla::client::session::Session,
        q: String,
    ) -> scylla::response::query_result::QueryResult {
        session
            .query_unpaged(q.clone(), ())
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
    }
    // One event row of a user: its primary key.
    async fn event_row(
        session: &scylla::client::session::Session,
        keyspace: &str,
        user: &str,
        seq: i64,
    ) -> (i64, i64, i64, i64) {
        cql(
            session,
            format!(
                "SELECT generation, bucket, digest, ordinal FROM {keyspace}.mailbox_events \
                 WHERE user_id = '{user}' AND seq = {seq} ALLOW FILTERING"
            ),
        )
        .await
        .into_rows_result()
        .expect("rows")
        .first_row::<(i64, i64, i64, i64)>()
        .expect("an event row")
    }
    // u1: a payload changed.
    let (generation, bucket, digest, ordinal) = event_row(session, &keyspace, "u1", 2).await;
    cql(session, format!(
        "UPDATE {keyspace}.mailbox_events SET payload = '{{\"body\":\"tampered\"}}' WHERE user_id = 'u1' \
         AND generation = {generation} AND bucket = {bucket} AND seq = 2 AND digest = {digest} AND ordinal = {ordinal}"
    ))
    .await;
    // u2: an event row deleted.
    let (generation, bucket, digest, ordinal) = event_row(session, &keyspace, "u2", 3).await;
    cql(
        session,
        format!(
        "DELETE FROM {keyspace}.mailbox_events WHERE user_id = 'u2' AND generation = {generation} \
         AND bucket = {bucket} AND seq = 3 AND digest = {digest} AND ordinal = {ordinal}"
    ),
    )
    .await;
    // u3: its identity rows lost.
    support::reference::lose_scylla_identity_rows(&store, "u3").await;
    // u4: a meta field changed (the newest seq the meta knows lowered).
    cql(
        session,
        format!(
            "UPDATE {keyspace}.user_mailbox SET seqbucket_max_seq = 1 WHERE user_id = 'u4' \
         AND slot IN (0, 1) AND seq = 0"
        ),
    )
    .await;
    let lines = found_exactly(&config, &["u1", "u2", "u3", "u4"]);
    assert_eq!(
        lines["u1"]["other_content"],
        serde_json::json!([2]),
        "{}",
        lines["u1"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_finds_exactly_the_damaged_mailboxes_on_a_redis_cluster() {
    let cluster =
        tokio::task::spawn_blocking(|| support::redis_server::RedisCluster::start(Clock::Real))
            .await
            .expect("cluster start");
    let mut setup = DaemonSetup::new("verify-cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    let (_daemon, config) = seeded(&setup).await;
    // Each key lives on the master owning its slot; the others answer MOVED.
    let on_owner = |command: &redis::Cmd| {
        let mut done = 0;
        for node in &cluster.nodes {
            let mut conn = redis_conn(&node.url());
            if command.query::<redis::Value>(&mut conn).is_ok() {
                done += 1;
            }
        }
        assert_eq!(done, 1, "{command:?} ran on one master");
    };
    // u1: its identity member of seq 2 removed; u2: its meta lost.
    on_owner(
        redis::cmd("ZREM")
            .arg("mm:mbseqbucket:{u1}:1")
            .arg("0000000000000002"),
    );
    on_owner(redis::cmd("DEL").arg("mm:mbmeta:{u2}:1"));
    found_exactly(&config, &["u1", "u2"]);
}
