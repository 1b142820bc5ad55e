//! `materializer dlq` end to end on a real broker and redis-server: a store whose clock is 40
//! days behind (beyond the 30-day future window) dead-letters every record as `future_created_at`; `list` and `show` read the
//! letters back, a re-drive before the fix is refused again and commits nothing, the clock is
//! fixed, the re-drive lands every record (the mailboxes equal the memory reference), a second
//! re-drive finds nothing new, and one from the beginning answers `unchanged` throughout.

use crate::support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::cli::{json_lines, numbered_dispatches, run_materializer};
use support::kafka::{create_topic, produce, read_all, unique, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{assert_same_state, now_ms, redis_store, reference, scan_seqs};

const RECORDS: usize = 40;

fn now_secs() -> u64 {
    now_ms() / 1000
}

/// `materializer --config <config> dlq <args>`: its output and its JSON lines.
pub(crate) fn dlq(config: &Path, args: &[&str]) -> (Output, Vec<Value>) {
    let config = config.to_str().expect("utf-8 path");
    let mut all = vec!["--config", config, "dlq"];
    all.extend_from_slice(args);
    let out = run_materializer(&all, None);
    let lines = json_lines(&out);
    (out, lines)
}

/// What a command said: its stderr, and its stdout, where SPEC 8.2 puts a failure's JSON
/// object off a terminal.
pub(crate) fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_shown_and_redriven_once_the_cause_is_fixed() {
    let redis = RedisServer::start(Clock::Fake(now_secs() - 40 * 86_400), Listen::Unix, &[]);
    let setup = DaemonSetup::new("dlqredrive", Some(redis.url()));
    create_topic(&setup.topic, 2).await;
    create_topic(&setup.dlq_topic, 1).await;
    let tag = unique("dlq");
    // Line n goes to user n % 37: each user stays on one partition (its source order).
    let mut records: Vec<(i32, Vec<u8>)> = numbered_dispatches(&tag, RECORDS, now_ms())
        .lines()
        .enumerate()
        .map(|(i, line)| (((i + 1) % 37 % 2) as i32, line.as_bytes().to_vec()))
        .collect();
    records.push((1, b"{not json".to_vec()));
    let offsets = produce(&setup.topic, &records).await;

    // The daemon dead-letters every record: the store's clock says they are from the future.
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "every record dead-lettered",
        Duration::from_secs(60),
        || read_all(&setup.dlq_topic).len() > RECORDS,
        || daemon.log(),
    );
    daemon.terminate(Duration::from_secs(20));
    let config = setup.config_file(free_port());

    // list: one line per letter, filtered by kind or outcome.
    let (out, letters) = dlq(&config, &["list", "--kind", "future_created_at"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(letters.len(), RECORDS);
    let mut sources: Vec<(i64, i64)> = letters
        .iter()
        .map(|l| {
            assert_eq!(l["kind"], "future_created_at");
            assert_eq!(l["outcome"], "rejected");
            assert_eq!(l["source_topic"], setup.topic.as_str());
            assert_eq!(l["truncated"], false);
            (
                l["source_partition"].as_i64().expect("partition"),
                l["source_offset"].as_i64().expect("offset"),
            )
        })
        .collect();
    sources.sort_unstable();
    let mut want: Vec<(i64, i64)> = records[..RECORDS]
        .iter()
        .zip(&offsets)
        .map(|((p, _), o)| (i64::from(*p), *o))
        .collect();
    want.sort_unstable();
    assert_eq!(sources, want, "every refused record listed once");
    let (_, malformed) = dlq(&config, &["list", "--kind", "malformed"]);
    assert_eq!(malformed.len(), 1);
    let (_, limited) = dlq(&config, &["list", "--limit", "3"]);
    assert_eq!(limited.len(), 3);

    // show: the headers decoded and the original record as JSON.
    let first = &letters[0];
    let (partition, offset) = (first["partition"].to_string(), first["offset"].to_string());
    let (out, shown) = dlq(
        &config,
        &["show", "--dlq-partition", &partition, "--offset", &offset],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(shown.len(), 1);
    let shown = &shown[0];
    assert_eq!(shown["headers"]["error_kind"], "future_created_at");
    assert!(shown["headers"]["failed_deliveries"].is_array());
    assert!(shown["payload"]["dispatch_id"]
        .as_str()
        .is_some_and(|id| id.starts_with(&tag)));
    let (out, _) = dlq(
        &config,
        &["show", "--dlq-partition", "0", "--offset", "999999"],
    );
    assert_eq!(out.status.code(), Some(1), "no such letter");

    // A dry run prints the plan and writes nothing.
    let (out, planned) = dlq(
        &config,
        &["redrive", "--kind", "future_created_at", "--dry-run"],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(planned.len(), RECORDS);
    let store = redis_store(&redis.url()).await;
    assert!(scan_seqs(&store, &format!("{tag}-u1")).await.is_empty());

    // Before the fix: refused again (exit 1), not dead-lettered again, nothing committed.
    let (out, again) = dlq(&config, &["redrive", "--kind", "future_created_at"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(again.len(), RECORDS);
    assert!(again.iter().all(|l| l["result"] == "refused_again"));
    assert_eq!(
        read_all(&setup.dlq_topic).len(),
        RECORDS + 1,
        "no new letter"
    );

    // The cause is fixed: the store's clock is right again.
    redis.set_now(now_secs());
    let (out, landed) = dlq(&config, &["redrive", "--kind", "future_created_at"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        landed.len(),
        RECORDS,
        "the refused ones are re-driven again"
    );
    for line in &landed {
        assert_eq!(line["result"], "applied", "{line}");
        assert_eq!(line["deliveries"][0]["outcome"], "inserted", "{line}");
    }
    let reference = reference(&records, &offsets).await;
    assert_same_state(&reference, &store).await;

    // Progress was committed: nothing new; from the beginning, every record is unchanged.
    let (out, none) = dlq(&config, &["redrive", "--kind", "future_created_at"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(none.is_empty(), "{none:?}");
    let (out, replayed) = dlq(
        &config,
        &["redrive", "--kind", "future_created_at", "--from-beginning"],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(replayed.len(), RECORDS);
    assert!(replayed
        .iter()
        .all(|l| l["deliveries"][0]["outcome"] == "unchanged"));
    assert_same_state(&reference, &store).await;

    // The malformed letter stays malformed: reported, exit 1.
    let (out, bad) = dlq(&config, &["redrive", "--kind", "malformed"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0]["result"], "malformed");
}

#[test]
fn wrong_arguments_are_refused_before_anything_is_read() {
    // Usage errors (SPEC 8.2): 64, never worth retrying.
    let out = run_materializer(&["dlq", "show", "--dlq-partition", "0"], None);
    assert_eq!(out.status.code(), Some(64), "missing --offset");
    let out = run_materializer(&["dlq", "list", "--since", "yesterday"], None);
    assert_eq!(out.status.code(), Some(64), "a time that does not parse");
    let out = run_materializer(&["dlq", "redrive", "--limit", "3"], None);
    assert_eq!(out.status.code(), Some(64), "redrive takes no --limit");
}

/// The letter a daemon writes for a record too large to carry whole: the first 20 bytes of
/// `record` as an excerpt, and the coordinates of its source (partition 0, offset 0 of the
/// setup's topic), with the source's log when `source_log` names one.
async fn produce_truncated_letter(setup: &DaemonSetup, record: &str, source_log: Option<&str>) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", support::kafka::bootstrap())
        .create()
        .expect("producer");
    let mut headers = vec![
        ("error_outcome", "rejected"),
        ("error_kind", "future_created_at"),
        ("error_detail", "created_at beyond the future window"),
        ("source_topic", setup.topic.as_str()),
        ("source_partition", "0"),
        ("source_offset", "0"),
    ];
    if let Some(log) = source_log {
        headers.push(("source_log", log));
    }
    headers.push(("dlq_truncated", "true"));
    let headers = headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(*value),
        })
    });
    producer
        .send(
            FutureRecord::<(), _>::to(&setup.dlq_topic)
                .partition(0)
                .payload(&record.as_bytes()[..20])
                .headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("letter produced");
}

/// A truncated letter (an excerpt: the record is re-read from its source) whose source cannot be
/// read — its topic is gone for now — stops the re-drive with exit 2 and commits nothing past
/// it; once the source is back, a rerun re-drives it, and a third run finds nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_truncated_letter_is_never_committed_past() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("dlq-unreadable", Some(redis.url()));
    create_topic(&setup.dlq_topic, 1).await;
    let record = numbered_dispatches(&unique("src"), 1, now_ms());
    let record = record.lines().next().expect("one record").to_owned();

    // The letter a daemon writes for a record too large to carry whole: an excerpt, and the
    // source's coordinates. The source topic does not exist yet.
    produce_truncated_letter(&setup, &record, None).await;

    let config = setup.config_file(free_port());
    let group = format!("{}-dlq-redrive-all", setup.group);
    let (out, _) = dlq(&config, &["redrive"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("its source could not be read"),
        "{}",
        said(&out)
    );
    let progress = support::kafka::committed(&group, &setup.dlq_topic, 1);
    assert!(
        progress[0] <= 0,
        "committed past the unreadable letter: {progress:?}"
    );

    // The source is back: the rerun re-drives the letter.
    create_topic(&setup.topic, 1).await;
    produce(&setup.topic, &[(0, record.as_bytes().to_vec())]).await;
    let (out, lines) = dlq(&config, &["redrive"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["result"], "applied", "{lines:?}");
    assert_eq!(support::kafka::committed(&group, &setup.dlq_topic, 1), [1]);
    let (out, lines) = dlq(&config, &["redrive"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(lines.is_empty(), "{lines:?}");
}

/// SPEC 7.3: a re-drive that fetches a truncated letter's original checks that the source is
/// still the log the record was read from. Here the topic was deleted and recreated under the
/// same name, and its offset 0 now holds an unrelated record: the letter is `source_gone` (exit
/// 1, not committed past), and the unrelated record is not applied. Before, it was applied with
/// the old log's position and reported `applied`.
#[tokio::test(flavor = "multi_thread")]
async fn a_letter_from_a_recreated_topic_is_source_gone_never_an_unrelated_record() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;

    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("dlq-recreated", Some(redis.url()));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let tag = unique("orig");
    let original = numbered_dispatches(&tag, 1, now_ms());
    let original = original.lines().next().expect("one record").to_owned();
    produce(&setup.topic, &[(0, original.as_bytes().to_vec())]).await;

    // The log's identity as the daemon reads it: the letter's `source_log`.
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the daemon to name the log",
        Duration::from_secs(60),
        || daemon.log().contains("dispatch log identity"),
        || daemon.log(),
    );
    let log_line = daemon.log();
    let old_log = log_line
        .lines()
        .find(|l| l.contains("dispatch log identity"))
        .and_then(|l| l.split("log=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("log=<id> in the identity line")
        .trim_matches('"')
        .to_owned();
    assert!(daemon.terminate(Duration::from_secs(30)).success());

    produce_truncated_letter(&setup, &original, Some(&old_log)).await;

    // The topic is deleted and recreated under the same name; offset 0 is another record now.
    let admin: AdminClient<DefaultClientContext> = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", support::kafka::bootstrap())
        .create()
        .expect("admin");
    let deleted = admin
        .delete_topics(&[setup.topic.as_str()], &AdminOptions::new())
        .await
        .expect("delete topic");
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let unrelated_user = format!("{tag}-unrelated");
    let unrelated = serde_json::json!({
        "dispatch_id": "unrelated", "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": unrelated_user, "epoch": 1, "mailbox_seq": 1,
            "events": [{"event_ordinal": 0, "payload": {"x": 1}}]}]
    })
    .to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let created = admin
            .create_topics(
                &[rdkafka::admin::NewTopic::new(
                    &setup.topic,
                    1,
                    rdkafka::admin::TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            )
            .await
            .expect("create topic");
        if created.iter().all(Result::is_ok) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the topic was not recreated: {created:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        produce(&setup.topic, &[(0, unrelated.into_bytes())]).await,
        [0]
    );

    let config = setup.config_file(free_port());
    let group = format!("{}-dlq-redrive-all", setup.group);
    let (out, lines) = dlq(&config, &["redrive"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["result"], "source_gone", "{lines:?}");
    assert!(
        lines[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("deleted and recreated, or cut over")),
        "{lines:?}"
    );
    let store = redis_store(&redis.url()).await;
    assert!(
        scan_seqs(&store, &unrelated_user).await.is_empty(),
        "the unrelated record at the letter's coordinates was applied"
    );
    let progress = support::kafka::committed(&group, &setup.dlq_topic, 1);
    assert!(progress[0] <= 0, "committed past the letter: {progress:?}");
}
