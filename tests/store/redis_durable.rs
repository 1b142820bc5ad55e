//! Durable before commit on Redis (SPEC 7, `store.redis.wait_replicas`), against a real master and
//! a real replica (`redis-server --replicaof`) on loopback, both started here.
//!
//! An append answers `Ok` only after `wait_replicas` replicas acknowledged it; a replica that does
//! not answer turns every write into a transient `Unavailable`, also an identical replay on a
//! fresh connection; and after the master dies (`kill -9`) and the replica is promoted, every
//! append that answered `Ok` is there.

use crate::conformance;
use crate::support;

use std::io::Write;
use std::time::{Duration, Instant};

use conformance::{group, mailbox};
use mailbox_materializer::model::{
    AppendOutcome, EventGroup, RetentionPolicy, ScanRequest, StoreError, DAY_SECS,
};
use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
use mailbox_materializer::store::MailboxStore;
use support::redis_server::{free_port, Clock, Listen, RedisServer};

/// How long a write waits for its replica: long enough that a healthy replica on a loaded
/// machine (the suite runs its binaries side by side) always acknowledges in time (300 ms did
/// not, once), short enough that every write a test makes while its replica sleeps fits in the
/// sleep.
const WAIT_MS: u64 = 1_000;

/// A master and its replica, replication link up.
async fn master_and_replica() -> (RedisServer, RedisServer) {
    tokio::task::spawn_blocking(|| {
        let master = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
        let master_port = master.port().expect("tcp").to_string();
        let replica = RedisServer::start(
            Clock::Real,
            Listen::Tcp(free_port()),
            &[
                "--replicaof",
                "127.0.0.1",
                &master_port,
                "--enable-debug-command",
                "yes",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .raw("INFO replication")
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        (master, replica)
    })
    .await
    .expect("servers start")
}

async fn store(server: &RedisServer, wait_replicas: u32) -> RedisStore {
    let mut settings = RedisSettings::new(server.url(), "mm");
    settings.wait_replicas = wait_replicas;
    settings.wait_timeout = Duration::from_millis(WAIT_MS);
    RedisStore::connect(settings, RetentionPolicy::default())
        .await
        .expect("connect")
}

fn today() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        / DAY_SECS
}

/// Sends `command` to a TCP server without reading the reply (the server may block on it).
fn send_and_leave(server: &RedisServer, command: &str) -> std::net::TcpStream {
    let port = server.port().expect("tcp");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .expect("write");
    stream
}

fn unavailable<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Unavailable { .. }))
}

/// While the only replica sleeps, no write is acknowledged: appends, truncates and identical
/// replays (also through a fresh connection, which has written nothing itself) are `Unavailable`,
/// never `Ok`. Once the replica is back, the same calls succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_holds_every_write() {
    let (master, replica) = master_and_replica().await;
    let s = store(&master, 1).await;
    let mb = mailbox("u-durable", 1);
    let day = today();
    let first = group(&mb, 1, day, 2, "a");
    assert_eq!(s.append(&first).await, Ok(AppendOutcome::Inserted));

    // Eight writes wait WAIT_MS each below while the replica sleeps.
    let _sleeper = send_and_leave(&replica, "DEBUG SLEEP 15");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = group(&mb, 2, day, 1, "b");
    let result = s.append(&second).await;
    assert!(
        unavailable(&result),
        "a write no replica acknowledged: {result:?}"
    );
    assert!(
        unavailable(&s.append(&second).await),
        "its replay, same connection"
    );
    let fresh = store(&master, 1).await;
    let replay = fresh.append(&second).await;
    assert!(
        unavailable(&replay),
        "an identical replay on a new connection must not vouch for an unacknowledged write: {replay:?}"
    );
    assert!(unavailable(&fresh.append(&first).await));
    assert!(unavailable(&fresh.truncate_before(&mb, 1).await));
    // A pipelined batch (the daemon's path) waits once for all of its writes: none is vouched
    // for while the replica sleeps.
    let other = group(&mailbox("u-durable-b", 1), 1, day, 1, "x");
    for result in fresh.append_many(&[&second, &other]).await {
        assert!(unavailable(&result), "a batched write: {result:?}");
    }
    // Nor is a verdict read from that state final, batched or not: it may come from a master
    // that restarted empty and is about to be demoted (a forced failover), so it is retried
    // until a replica acknowledges (regression: the batch answered `corrupt` here).
    let damaged = mailbox("u-durable-damaged", 1);
    master.raw(&format!(
        "SET {} x",
        mailbox_materializer::store::redis::keys::MailboxKeys::new("mm", &damaged).epoch
    ));
    let damaged_group = group(&damaged, 1, day, 1, "d");
    let alone = fresh.append(&damaged_group).await;
    assert!(unavailable(&alone), "a verdict alone: {alone:?}");
    for result in fresh.append_many(&[&damaged_group, &other]).await {
        assert!(unavailable(&result), "a batched verdict: {result:?}");
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    let outcome = loop {
        let outcome = fresh.append(&second).await;
        if !unavailable(&outcome) || Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(outcome, Ok(AppendOutcome::Unchanged));
    assert_eq!(
        fresh.append_many(&[&second, &other]).await,
        vec![Ok(AppendOutcome::Unchanged), Ok(AppendOutcome::Unchanged)],
        "the unacknowledged writes had landed on the master: their retry is an identical replay"
    );
    let unwaited = store(&master, 0).await;
    assert_eq!(
        unwaited.append(&group(&mb, 3, day, 1, "c")).await,
        Ok(AppendOutcome::Inserted),
        "wait_replicas = 0 never waits"
    );
}

/// A write the master applied and no replica acknowledged is a write whose answer was lost (as
/// in a failover): the daemon retries it. Once a replica acknowledges, the retry of that
/// delivery (its write token, `model::written`) answers what the write did, `inserted` or
/// `replaced`, alone and in a batch; another reading of the same records answers `unchanged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_no_replica_acknowledged_is_answered_with_its_true_outcome() {
    use conformance::from_log;
    let (master, replica) = master_and_replica().await;
    let s = store(&master, 1).await;
    let day = today();
    let mb = mailbox("u-lost-answer", 1);
    let other = mailbox("u-lost-answer-b", 1);
    assert_eq!(
        s.append(&from_log(group(&mb, 1, day, 1, "v1"), 1, 1)).await,
        Ok(AppendOutcome::Inserted)
    );

    let _sleeper = send_and_leave(&replica, "DEBUG SLEEP 8");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let replace = from_log(group(&mb, 1, day, 2, "v2"), 2, 2);
    let insert = from_log(group(&other, 1, day, 1, "x"), 3, 3);
    assert!(
        unavailable(&s.append(&replace).await),
        "no replica acknowledged"
    );
    assert!(
        unavailable(&s.append(&insert).await),
        "no replica acknowledged"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    let retried = loop {
        let answers = s.append_many(&[&replace, &insert]).await;
        if !answers.iter().any(unavailable) || Instant::now() > deadline {
            break answers;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        retried,
        vec![Ok(AppendOutcome::Replaced), Ok(AppendOutcome::Inserted)],
        "the retries of the writes whose answers were lost"
    );
    assert_eq!(
        s.append(&replace).await,
        Ok(AppendOutcome::Replaced),
        "and alone"
    );
    let read_again = [
        from_log(group(&mb, 1, day, 2, "v2"), 2, 4),
        from_log(group(&other, 1, day, 1, "x"), 3, 5),
    ];
    assert_eq!(
        s.append_many(&[&read_again[0], &read_again[1]]).await,
        vec![Ok(AppendOutcome::Unchanged), Ok(AppendOutcome::Unchanged)],
        "another reading of the same records"
    );
}

/// Appends run while the replica is healthy, then while it is cut off (asleep, its link killed
/// by the master); the master is killed with SIGKILL and the replica promoted. Every append that
/// answered `Ok` is on the promoted replica with its content; the cut-off ones answered
/// `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_append_survives_a_failover() {
    let (mut master, replica) = master_and_replica().await;
    let s = std::sync::Arc::new(store(&master, 1).await);
    let day = today();
    let mut acknowledged: Vec<EventGroup> = Vec::new();

    // Healthy: many mailboxes in flight at once on the one multiplexed connection.
    let mut tasks = Vec::new();
    for u in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            for seq in 1..=5 {
                let g = group(&mailbox(&format!("u-fail-{u}"), 1), seq, day, 2, "healthy");
                if s.append(&g).await == Ok(AppendOutcome::Inserted) {
                    done.push(g);
                }
            }
            done
        }));
    }
    for task in tasks {
        acknowledged.extend(task.await.expect("task"));
    }
    assert_eq!(acknowledged.len(), 80, "a healthy replica acknowledges all");

    // Cut off: the replica sleeps and its link is dropped, so what follows never reaches it.
    let _sleeper = send_and_leave(&replica, "DEBUG SLEEP 8");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(master.raw("CLIENT KILL TYPE replica").starts_with(':'));
    let mut refused = 0;
    for u in 0..3 {
        let g = group(&mailbox(&format!("u-fail-{u}"), 1), 6, day, 1, "cut-off");
        match s.append(&g).await {
            Ok(outcome) => {
                assert_eq!(outcome, AppendOutcome::Inserted);
                acknowledged.push(g);
            }
            Err(StoreError::Unavailable { .. }) => refused += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(refused, 3, "no replica acknowledged the cut-off appends");

    master.stop(); // SIGKILL
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica.raw("PING").starts_with("+PONG") {
        assert!(Instant::now() < deadline, "the replica never woke");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(replica.raw("REPLICAOF NO ONE").starts_with("+OK"));
    let promoted = store(&replica, 0).await;
    for g in &acknowledged {
        let page = promoted
            .range_scan(
                &g.mailbox,
                ScanRequest {
                    after_seq: g.mailbox_seq - 1,
                    until_seq: Some(g.mailbox_seq),
                    limit_groups: 1,
                },
            )
            .await
            .expect("scan the promoted replica");
        assert_eq!(
            page.groups.len(),
            1,
            "{} seq {} lost",
            g.mailbox,
            g.mailbox_seq
        );
        assert_eq!(&*page.groups[0].events, &g.events[..]);
    }
}

/// SPEC 7: the class of an error never depends on `wait_replicas`. A damaged epoch key is
/// corrupt, a refused record refused, whether the write is followed by a `WAIT` or not, alone
/// or in a batch.
#[tokio::test(flavor = "multi_thread")]
async fn error_classes_do_not_depend_on_wait_replicas() {
    use mailbox_materializer::store::redis::keys::MailboxKeys;
    let (master, _replica) = master_and_replica().await;
    let class = |r: &Result<AppendOutcome, StoreError>| match r {
        Ok(_) => "ok",
        Err(StoreError::Corrupt { .. }) => "corrupt",
        Err(StoreError::Rejected { .. }) => "rejected",
        Err(StoreError::Refused { .. }) => "refused",
        Err(StoreError::Unavailable { .. }) => "transient",
        Err(_) => "other",
    };
    for wait in [0, 1] {
        let s = store(&master, wait).await;
        let damaged = mailbox(&format!("damaged-{wait}"), 1);
        master.raw(&format!("SET {} x", MailboxKeys::new("mm", &damaged).epoch));
        let mut future = group(&mailbox(&format!("future-{wait}"), 1), 1, today(), 1, "f");
        future.created_at += 400 * 86_400_000;
        let damaged_group = group(&damaged, 1, today(), 1, "d");
        assert_eq!(
            class(&s.append(&damaged_group).await),
            "corrupt",
            "wait {wait}"
        );
        assert_eq!(class(&s.append(&future).await), "rejected", "wait {wait}");
        let batch = s.append_many(&[&damaged_group, &future]).await;
        assert_eq!(
            batch.iter().map(class).collect::<Vec<_>>(),
            vec!["corrupt", "rejected"],
            "wait {wait}, batched"
        );
    }
}

/// SPEC 7.3: a master with a replica while no write waits for it is named (the daemon logs the
/// warning at start); with `wait_replicas` set, or without a replica, there is nothing to say.
#[tokio::test(flavor = "multi_thread")]
async fn a_master_with_replicas_and_no_wait_is_named_in_a_warning() {
    let (master, _replica) = master_and_replica().await;
    let warning = store(&master, 0)
        .await
        .unreplicated_writes_warning()
        .await
        .expect("a warning");
    assert!(
        warning.contains("(1 replica(s))") && warning.contains("wait_replicas = 0"),
        "{warning}"
    );
    assert_eq!(
        store(&master, 1).await.unreplicated_writes_warning().await,
        None
    );
    let alone = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    assert_eq!(
        store(&alone, 0).await.unreplicated_writes_warning().await,
        None
    );
}
