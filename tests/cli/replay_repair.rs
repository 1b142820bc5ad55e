//! `replay --reset-mailboxes` (SPEC 7.1) against a real broker and redis-server, with the daemon
//! running: every refusal leaves the store byte-identical, a repair killed at any step leaves the
//! live mailbox as it was and a rerun converges to the log, a lost lease aborts without swapping,
//! and `apply` on a fenced user exits 2 without printing a success for it.

use crate::support;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mailbox_materializer::model::{MailboxId, UserId};
use mailbox_materializer::store::redis::RedisStore;
use support::in_process::InProcessDaemon;
use support::kafka::{committed, create_topic, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{now_ms, redis_store, reference, scan_seqs};

fn group_record(user: &str, seq: u64, body: &str) -> Vec<u8> {
    serde_json::json!({
        "dispatch_id": format!("{user}/{seq}/{body}"), "group_id": "g", "committed_at": now_ms(),
        "deliveries": [{"user_id": user, "epoch": 1, "mailbox_seq": seq,
            "events": [{"event_ordinal": 0, "payload": {"body": body}}]}]
    })
    .to_string()
    .into_bytes()
}

/// A daemon on Redis over a one-partition topic, with the records produced so far.
struct Stand {
    redis: RedisServer,
    setup: DaemonSetup,
    daemon: Daemon,
    store: RedisStore,
    records: Vec<(i32, Vec<u8>)>,
    offsets: Vec<i64>,
}

impl Stand {
    async fn start(name: &str, records: Vec<(i32, Vec<u8>)>) -> Self {
        let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
        let setup = DaemonSetup::new(name, Some(redis.url()));
        create_topic(&setup.topic, 1).await;
        create_topic(&setup.dlq_topic, 1).await;
        let daemon = Daemon::start(&setup);
        let store = redis_store(&redis.url()).await;
        let mut stand = Self {
            redis,
            setup,
            daemon,
            store,
            records: Vec::new(),
            offsets: Vec::new(),
        };
        stand.produce(records).await;
        stand.wait_all_committed();
        stand
    }

    async fn produce(&mut self, records: Vec<(i32, Vec<u8>)>) {
        let offsets = produce(&self.setup.topic, &records).await;
        self.records.extend(records);
        self.offsets.extend(offsets);
    }

    fn end(&self) -> i64 {
        self.offsets.iter().max().map_or(0, |o| o + 1)
    }

    fn wait_all_committed(&self) {
        let end = self.end();
        wait_for(
            "every record committed",
            Duration::from_secs(90),
            || committed(&self.setup.group, &self.setup.topic, 1) == [end],
            || self.daemon.log(),
        );
    }

    /// `replay` of partition 0 with this stand's config and no progress output, then `args`.
    fn replay_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
        [&["--partition", "0", "--progress", "off"], args].concat()
    }

    fn replay_command(&self, args: &[&str]) -> Command {
        let config = self.setup.config_file(free_port());
        support::cli::replay_command(&config, &Self::replay_args(args))
    }

    fn replay(&self, args: &[&str]) -> (Output, serde_json::Value) {
        let config = self.setup.config_file(free_port());
        support::cli::replay(&config, &Self::replay_args(args))
    }

    /// A replay paused at `point` (see `MATERIALIZER_PAUSE_AT`), once it says it got there.
    fn replay_paused_at(&self, point: &str, args: &[&str]) -> Child {
        let log = self.setup.dir.join(format!("replay-{}.err", now_ms()));
        let mut child = self
            .replay_command(args)
            .env("MATERIALIZER_PAUSE_AT", point)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start replay");
        let reached = format!("paused at {}", point.split(':').next().unwrap_or(point));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(&reached) {
                return child;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("replay exited ({status}) before {reached}: {text}");
            }
            assert!(Instant::now() < deadline, "replay never {reached}: {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A repair of `victim` holding its fence (paused right after taking it).
    fn victim_fenced(&self) -> Child {
        self.replay_paused_at(
            "replay.fenced",
            &[
                "--from-offset",
                "0",
                "--user",
                "victim",
                "--reset-mailboxes",
            ],
        )
    }

    /// Every key of `user`, with its bytes and expiry.
    async fn fingerprint(&self, user: &str) -> Vec<(String, Vec<u8>, i64)> {
        self.store
            .dump_user(&UserId::parse(user).expect("user"), &[1])
            .await
            .expect("dump")
    }

    async fn seqs(&self, user: &str) -> Vec<u64> {
        scan_seqs(&self.store, user).await
    }
}

fn history(victim_seqs: u64) -> Vec<(i32, Vec<u8>)> {
    let mut records = Vec::new();
    for seq in 1..=victim_seqs {
        records.push((0, group_record("victim", seq, "v")));
        records.push((0, group_record("bystander", seq, "b")));
    }
    records
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .expect("time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_leaves_the_store_byte_identical() {
    let stand = Stand::start("refusals", history(3)).await;
    // Let the producer's timestamps fall behind "now" for the past-the-end case.
    std::thread::sleep(Duration::from_millis(1500));
    let before = stand.fingerprint("victim").await;
    assert!(!before.is_empty());
    let future = rfc3339(now_ms() + 86_400_000);
    let past_the_end = rfc3339(now_ms() - 500);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--from-offset", "999999"], "empty_range"),
        (vec!["--from-time", &future], "from_time_in_future"),
        (vec!["--from-time", &past_the_end], "from_time_past_end"),
        (
            vec!["--from-offset", "0", "--to-offset", "1"],
            "end_below_committed",
        ),
        (
            vec!["--from-offset", "0", "--user", "nobody"],
            "user_not_in_range",
        ),
        (vec!["--from-offset", "4"], "user_before_start"),
    ];
    for (args, reason) in cases {
        let mut all = args.clone();
        if !all.contains(&"--user") {
            all.extend(["--user", "victim"]);
        }
        all.push("--reset-mailboxes");
        let (out, summary) = stand.replay(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {summary}");
        assert_eq!(summary["refused"]["reason"], reason, "{all:?}: {summary}");
        assert!(summary["swapped_users"]
            .as_array()
            .is_some_and(|a| a.is_empty()));
        assert_eq!(
            stand.fingerprint("victim").await,
            before,
            "{all:?} left the store byte-identical"
        );
    }
    assert!(stand.fingerprint("nobody").await.is_empty());
    assert_eq!(stand.seqs("victim").await, vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_deleted_by_retention_is_refused_unless_partial_history_is_allowed() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::{Offset, TopicPartitionList};

    let stand = Stand::start("logstart", history(3)).await;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", support::kafka::bootstrap())
        .create()
        .expect("admin");
    let mut upto = TopicPartitionList::new();
    upto.add_partition_offset(&stand.setup.topic, 0, Offset::Offset(2))
        .expect("offset");
    admin
        .delete_records(&upto, &AdminOptions::new())
        .await
        .expect("delete records before offset 2");
    let before = stand.fingerprint("victim").await;
    let (out, summary) = stand.replay(&[
        "--from-offset",
        "0",
        "--user",
        "victim",
        "--reset-mailboxes",
    ]);
    assert_eq!(out.status.code(), Some(1), "{summary}");
    assert_eq!(summary["refused"]["reason"], "log_start_above_start");
    assert_eq!(stand.fingerprint("victim").await, before);

    let (out, summary) = stand.replay(&[
        "--from-offset",
        "0",
        "--user",
        "victim",
        "--reset-mailboxes",
        "--allow-partial-history",
    ]);
    assert!(out.status.success(), "{summary}");
    assert_eq!(summary["from_offset"], 2);
    assert_eq!(summary["swapped_users"], serde_json::json!(["victim"]));
    assert_eq!(
        stand.seqs("victim").await,
        vec![2, 3],
        "what the log still holds"
    );
}

/// Killed (-9) right after the fences, in the middle of the rebuild, and just before the swap —
/// with the daemon running, the victim corrupt and new records arriving — the live mailbox is as
/// it was each time; a final rerun heals it, and it then holds exactly the whole log.
#[tokio::test(flavor = "multi_thread")]
async fn a_repair_killed_at_any_step_changes_nothing_and_a_rerun_converges() {
    let mut stand = Stand::start("killed", history(20)).await;
    // Corrupt the victim: the daemon fails closed on its next record.
    let lost = stand.redis.raw("DEL mm:mbseqbucket:{victim}:1");
    assert!(lost.contains(":1"), "{lost}");
    stand
        .produce(vec![
            (0, group_record("victim", 21, "v")),
            (0, group_record("bystander", 21, "b")),
        ])
        .await;
    wait_for(
        "the victim to fail closed",
        Duration::from_secs(60),
        || {
            stand
                .daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"0\"}")
                == 1.0
        },
        || stand.daemon.log(),
    );
    let args = [
        "--from-offset",
        "0",
        "--user",
        "victim",
        "--reset-mailboxes",
        "--fence-lease-secs",
        "3",
    ];
    for (round, point) in ["replay.fenced", "replay.rebuilding", "replay.before_swap"]
        .into_iter()
        .enumerate()
    {
        let before = stand.fingerprint("victim").await;
        let live_keys: Vec<String> = before
            .iter()
            .map(|(k, _, _)| k.clone())
            .filter(|k| !k.contains("repair") && !k.contains("stg"))
            .collect();
        let mut child = stand.replay_paused_at(point, &args);
        // More of the log arrives while the repair runs: the daemon must hold the victim's.
        let seq = 22 + round as u64;
        stand
            .produce(vec![
                (0, group_record("victim", seq, "v")),
                (0, group_record("bystander", seq, "b")),
            ])
            .await;
        child.kill().expect("kill -9");
        let _ = child.wait();
        let after = stand.fingerprint("victim").await;
        let live_after: Vec<(String, Vec<u8>, i64)> = after
            .into_iter()
            .filter(|(k, _, _)| live_keys.contains(k))
            .collect();
        let live_before: Vec<(String, Vec<u8>, i64)> = before
            .into_iter()
            .filter(|(k, _, _)| live_keys.contains(k))
            .collect();
        assert_eq!(
            live_after, live_before,
            "killed at {point}: the live mailbox is untouched"
        );
        // The fence of the dead repair lapses by itself.
        std::thread::sleep(Duration::from_secs(4));
    }
    // The rerun heals the victim; the daemon catches up behind it.
    let (out, summary) = stand.replay(&args);
    assert!(
        out.status.success(),
        "{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["swapped_users"], serde_json::json!(["victim"]));
    stand.wait_all_committed();
    let expected = reference(&stand.records, &stand.offsets).await;
    for user in ["victim", "bystander"] {
        assert_eq!(
            stand.seqs(user).await,
            scan_seqs(&expected.store, user).await,
            "{user} holds exactly the log"
        );
    }
    assert_eq!(stand.seqs("victim").await, (1..=24).collect::<Vec<u64>>());
    // Nothing of the killed repairs is left once the patrol ran.
    let patrol = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--store", "redis", "--redis-url"])
        .arg(stand.redis.url())
        .arg("patrol")
        .output()
        .expect("patrol");
    assert!(
        patrol.status.success(),
        "{}",
        String::from_utf8_lossy(&patrol.stderr)
    );
    let keys = stand.fingerprint("victim").await;
    assert!(
        keys.iter()
            .all(|(k, _, _)| !k.contains("stg") && !k.contains("repair")),
        "no staging or fence key left: {:?}",
        keys.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
}

/// A repair frozen (SIGSTOP) longer than its lease loses its fence: when it wakes up it aborts
/// without swapping, and the live mailbox is exactly as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_repair_that_loses_its_lease_aborts_without_swapping() {
    let stand = Stand::start("lease", history(5)).await;
    let before = stand.fingerprint("victim").await;
    let mut child = stand.replay_paused_at(
        "replay.before_swap:3000",
        &[
            "--from-offset",
            "0",
            "--user",
            "victim",
            "--reset-mailboxes",
            "--fence-lease-secs",
            "3",
        ],
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill")
        .success());
    std::thread::sleep(Duration::from_secs(5));
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .expect("kill")
        .success());
    let status = child.wait().expect("wait");
    // Aborted, worth running again (SPEC 8.2: 2); 4 is for a signal.
    assert_eq!(status.code(), Some(2), "aborted");
    assert_eq!(
        stand.fingerprint("victim").await,
        before,
        "nothing swapped, nothing left"
    );
}

/// `apply` on a fenced user exits 2 (retry later) and prints no success for it; the lines before
/// it are printed. `truncate` on it exits 2 as well.
#[tokio::test(flavor = "multi_thread")]
async fn apply_on_a_fenced_user_exits_2_without_a_success_line() {
    let stand = Stand::start("applyfenced", history(2)).await;
    let mut repair = stand.victim_fenced();
    let input = stand.setup.dir.join("apply.jsonl");
    let lines = [
        String::from_utf8(group_record("free", 1, "x")).expect("utf8"),
        String::from_utf8(group_record("victim", 3, "x")).expect("utf8"),
    ];
    std::fs::write(&input, lines.join("\n") + "\n").expect("input");
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--store", "redis", "--redis-url"])
        .arg(stand.redis.url())
        .arg("apply")
        .arg(&input)
        .output()
        .expect("apply");
    // `truncate` on the fenced user: the same class, the same status (it used to exit 1).
    let truncate = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--store", "redis", "--redis-url"])
        .arg(stand.redis.url())
        .args([
            "truncate", "--user", "victim", "--epoch", "1", "--before", "2",
        ])
        .output()
        .expect("truncate");
    let _ = repair.kill();
    let _ = repair.wait();
    assert_eq!(
        truncate.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&truncate.stdout)
    );
    assert!(String::from_utf8_lossy(&truncate.stdout).contains("under_repair"));
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    // The free user's line, then why the run stopped (SPEC 8.2's error object).
    assert_eq!(printed.len(), 2, "only the free user's line: {stdout}");
    assert_eq!(printed[0]["user_id"], "free");
    assert_eq!(printed[1]["error"]["kind"], "unavailable", "{stdout}");
    let detail = printed[1]["error"]["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("line 2: "), "{detail}");
    assert!(!stdout.contains("\"user_id\":\"victim\""));
}

/// `dlq redrive` of a fenced user's record exits 2 (retry later), writes nothing for it and
/// commits no progress past it, so the re-drive after the repair still finds the letter.
#[tokio::test(flavor = "multi_thread")]
async fn a_redrive_on_a_fenced_user_exits_2_and_commits_nothing_past_it() {
    let mut stand = Stand::start("redrivefenced", history(2)).await;
    // 40 days ahead: beyond the future window, so the daemon dead-letters it.
    let ahead = now_ms() + 40 * 86_400_000;
    let future = serde_json::json!({
        "dispatch_id": "victim/3/future", "group_id": "g", "committed_at": ahead,
        "deliveries": [{"user_id": "victim", "epoch": 1, "mailbox_seq": 3,
            "events": [{"event_ordinal": 0, "payload": {"body": "f"}}]}]
    })
    .to_string()
    .into_bytes();
    stand.produce(vec![(0, future)]).await;
    stand.wait_all_committed();
    let mut repair = stand.victim_fenced();
    let before = stand.fingerprint("victim").await;
    let config = stand.setup.config_file(free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .arg("--config")
        .arg(&config)
        .args(["dlq", "redrive", "--kind", "future_created_at"])
        .output()
        .expect("dlq redrive");
    let _ = repair.kill();
    let _ = repair.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    // No line for the fenced record: the one line is why the run stopped.
    let error: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(error["error"]["kind"], "unavailable", "{error}");
    assert!(stdout.contains("being rebuilt"), "{stdout}");
    assert_eq!(stand.fingerprint("victim").await, before, "nothing written");
    let group = format!("{}-dlq-redrive-future_created_at", stand.setup.group);
    // The letter is the topic's first (offset 0): the progress stays before it, or is none.
    let progress = committed(&group, &stand.setup.dlq_topic, 1);
    assert!(
        progress[0] <= 0,
        "progress past the fenced letter: {progress:?}"
    );
}

/// The memory store's repair (an in-process fence) heals a corrupt mailbox while the daemon runs
/// on the same store: the daemon's blocked delivery waits for the swap while the records behind
/// it flow, then the partition is whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_memory_repair_heals_a_corrupt_mailbox_while_the_daemon_runs() {
    use std::sync::Arc;

    use mailbox_materializer::model::RetentionPolicy;
    use mailbox_materializer::operator::replay::{self, ProgressMode, ReplayRequest, ReplayStart};
    use mailbox_materializer::store::fault::Corruption;
    use mailbox_materializer::store::memory::MemoryStore;
    use mailbox_materializer::store::SystemClock;

    let setup = DaemonSetup::new("memrepair", None);
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut config = setup.config();
    config.kafka.retry_initial_ms = 20;
    config.kafka.retry_max_ms = 200;
    let store = Arc::new(MemoryStore::new(
        RetentionPolicy::default(),
        Arc::new(SystemClock),
    ));
    let daemon = InProcessDaemon::spawn(&config, store.clone());
    produce(
        &setup.topic,
        &[
            (0, group_record("victim", 1, "v")),
            (0, group_record("bystander", 1, "b")),
        ],
    )
    .await;
    daemon.wait_final(2, Duration::from_secs(60)).await;
    assert!(store.inject(
        &MailboxId::new(UserId::parse("victim").expect("user"), 1),
        &Corruption::LoseIdentityIndex
    ));
    produce(
        &setup.topic,
        &[
            (0, group_record("victim", 2, "v")),
            (0, group_record("bystander", 2, "b")),
            (0, group_record("bystander", 3, "b")),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while scan_seqs(store.as_ref(), "bystander").await != vec![1, 2, 3] {
        assert!(
            Instant::now() < deadline,
            "the bystander flows past the blocked victim"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The victim's record stays (its delivery is retried in place); the bystander's records
    // behind it are final and leave the window: a blocked mailbox holds only itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.progress.snapshot().final_records != 4 {
        assert!(
            Instant::now() < deadline,
            "the records behind the victim's are final: {:?}",
            daemon.progress.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (_interrupt_tx, interrupt) = tokio::sync::watch::channel(false);
    let request = ReplayRequest {
        partition: 0,
        start: ReplayStart::Offset(0),
        to_offset: None,
        users: vec![UserId::parse("victim").expect("user")],
        reset_mailboxes: true,
        dry_run: false,
        allow_partial_history: false,
        allow_empty: false,
        allow_other_partitions: false,
        progress: ProgressMode::Off,
        lease: Duration::from_secs(10),
        take_over: Vec::new(),
    };
    let summary = replay::replay(&config, store.clone(), &request, interrupt).await;
    assert_eq!(summary.exit_status().code(), 0, "{summary:?}");
    assert_eq!(summary.swapped_users, vec!["victim".to_owned()]);
    daemon.wait_final(5, Duration::from_secs(60)).await;
    assert_eq!(scan_seqs(store.as_ref(), "victim").await, vec![1, 2]);
    daemon.stop().await;
}

/// SIGINT or SIGTERM during a repair (in the rebuild, or with everything staged and the swap
/// next) stops it: exit 4, the live mailbox exactly as it was, no staging copy or fence left.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_stops_a_repair_before_the_swap_and_changes_nothing() {
    let stand = Stand::start("signals", history(5)).await;
    let before = stand.fingerprint("victim").await;
    for (point, signal) in [
        ("replay.rebuilding:3000", "-INT"),
        ("replay.before_swap:3000", "-TERM"),
    ] {
        let mut child = stand.replay_paused_at(
            point,
            &[
                "--from-offset",
                "0",
                "--user",
                "victim",
                "--reset-mailboxes",
            ],
        );
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill")
            .success());
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(4), "{signal} at {point}: aborted");
        assert_eq!(
            stand.fingerprint("victim").await,
            before,
            "{signal} at {point}: nothing swapped, nothing left"
        );
    }
}

/// A repair killed with its fence up (60 s lease): a rerun is refused with who holds the fence
/// and what to do, not as if a repair were running; `--take-over-fence` with that holder (its
/// process is provably gone: this host, no such pid) lifts the dead repair's fence and staging
/// copy and rebuilds at once. A take-over of a holder that is still running is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_repairs_fence_is_explained_and_can_be_taken_over() {
    let stand = Stand::start("takeover", history(3)).await;
    stand.wait_all_committed();
    let args = [
        "--from-offset",
        "0",
        "--user",
        "victim",
        "--reset-mailboxes",
    ];
    let mut running = stand.replay_paused_at("replay.fenced", &args);
    let (out, summary) = stand.replay(&args);
    assert_eq!(out.status.code(), Some(2), "{summary}");
    let detail = summary["aborted"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.contains("another repair (repair-") && detail.contains("holds the user's fence"),
        "{summary}"
    );
    let holder = detail
        .split("another repair (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the refusal names the holder")
        .to_owned();
    // Still running: a take-over is refused and changes nothing.
    let (out, summary) = stand.replay(&[&args[..], &["--take-over-fence", &holder]].concat());
    assert_ne!(out.status.code(), Some(0), "{summary}");
    assert!(
        summary["aborted"]
            .as_str()
            .unwrap_or_default()
            .contains("is still running"),
        "{summary}"
    );

    running.kill().expect("kill -9");
    let _ = running.wait();
    let (out, summary) = stand.replay(&args);
    assert_eq!(out.status.code(), Some(2), "{summary}");
    assert!(
        summary["aborted"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(
                "is gone, so it can be taken over safely: rerun with --take-over-fence {holder}"
            )),
        "{summary}"
    );
    let (out, summary) = stand.replay(&[&args[..], &["--take-over-fence", &holder]].concat());
    assert!(
        out.status.success(),
        "{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary["swapped_users"], serde_json::json!(["victim"]));
    assert_eq!(stand.seqs("victim").await, vec![1, 2, 3]);
}
