//! `materializer explain` and `/debug/blocked`, on a real Redis and broker: a mailbox whose
//! identity index was deleted is blocked by a running daemon; `explain` names the replica, the
//! partition, the offset and the error, and prints the command that fixes it; running that
//! command makes `explain` say there is nothing to do and the partition's blocked gauge clear.
//! A healthy mailbox, a user never written and an unreachable store each get their own answer.
//! The same block, fix and stored source positions on a Redis Cluster and on Scylla.

use crate::support;

use std::process::Output;
use std::time::Duration;

use support::cli::run_materializer;
use support::kafka::{create_topic, http_get, produce, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::group_record;

fn explain(config: &str, args: &[&str]) -> (Output, String) {
    let mut all = vec!["--config", config, "explain"];
    all.extend_from_slice(args);
    // The screen unless the test asks for JSON (`--json`, the old spelling, still accepted).
    if !args.contains(&"--json") {
        all.extend_from_slice(&["--output", "text"]);
    }
    let out = run_materializer(&all, None);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocked_mailbox_is_explained_with_the_command_that_fixes_it() {
    let server = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let mut setup = DaemonSetup::new("explain", Some(server.url()));
    setup.http_extra = vec!["debug_endpoints = true".to_owned()];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records: Vec<(i32, Vec<u8>)> = (1..=5)
        .map(|seq| (0, group_record("hot", seq, "h")))
        .collect();
    records.extend((1..=3).map(|seq| (0, group_record("cool", seq, "c"))));
    let first = produce(&setup.topic, &records).await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "every record applied",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_groups_total{outcome=\"inserted\"}")
                == 8.0
        },
        || daemon.log(),
    );
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("utf-8 path").to_owned();
    let address = format!("127.0.0.1:{}", daemon.http_port);

    // Healthy, and never written.
    let (out, stdout) = explain(&config, &["--user", "cool", "--daemon", &address]);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("readable:  yes"), "{stdout}");
    assert!(stdout.contains("not blocked there"), "{stdout}");
    assert!(stdout.trim_end().ends_with("nothing to do"), "{stdout}");
    // Where cool's seqs were written from: the log's own positions.
    assert!(
        stdout.contains(&format!(
            "positions: 3 live seq(s); newest seq 3 @ partition 0 offset {}, seq 2 @ partition 0 offset {}, seq 1 @ partition 0 offset {}; oldest seq 1 @ partition 0 offset {} (log ",
            first[7], first[6], first[5], first[5]
        )),
        "{stdout}"
    );
    let (out, stdout) = explain(&config, &["--user", "nobody", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["verdict"], "absent", "{report}");

    // hot loses its identity index; its next record fails closed and the daemon blocks it.
    let deleted = server.raw("DEL mm:mbseqbucket:{hot}:1");
    assert!(deleted.contains(":1"), "{deleted}");
    let offsets = produce(&setup.topic, &[(0, group_record("hot", 6, "h6"))]).await;
    wait_for(
        "/debug/blocked lists hot",
        Duration::from_secs(30),
        || {
            http_get(daemon.http_port, "/debug/blocked")
                .is_some_and(|(code, body)| code == 200 && body.contains("\"user_id\":\"hot\""))
        },
        || daemon.log(),
    );
    let (out, stdout) = explain(&config, &["--user", "hot", "--daemon", &address]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "blocked:   by {address} on partition 0 at offset {} since",
            offsets[0]
        )),
        "{stdout}"
    );
    assert!(stdout.contains("index_lost"), "{stdout}");
    let fix = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fix: "))
        .unwrap_or_else(|| panic!("no fix line: {stdout}"))
        .to_owned();
    assert!(
        fix.starts_with("materializer replay --partition 0 --from-time ")
            && fix.ends_with(" --user hot --reset-mailboxes"),
        "{fix}"
    );
    // top's partition table says why, from the same list.
    let top = support::cli::top_once("hot blocked", std::slice::from_ref(&address));
    let partition = &top["partitions"][0];
    assert_eq!(
        partition["why"],
        format!("index_lost hot @{}", offsets[0]),
        "{top}"
    );
    let (out, json) = explain(&config, &["--user", "hot", "--daemon", &address, "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["verdict"], "corrupt", "{report}");
    assert_eq!(report["fix"], fix.as_str());
    assert_eq!(report["daemons"][0]["blocked"]["offset"], offsets[0]);

    // The operator runs exactly that command.
    let words: Vec<&str> = fix.split_whitespace().skip(1).collect();
    let mut args = vec!["--config", config.as_str()];
    args.extend(words);
    args.extend(["--progress", "off"]);
    let out = run_materializer(&args, None);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the daemon flows again",
        Duration::from_secs(60),
        || {
            let metrics = daemon.metrics();
            metrics.get("materializer_partition_blocked{partition=\"0\"}") == 0.0
                && http_get(daemon.http_port, "/debug/blocked")
                    .is_some_and(|(_, body)| body.contains("\"total\":0"))
        },
        || daemon.log(),
    );
    let (out, stdout) = explain(&config, &["--user", "hot", "--daemon", &address]);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.trim_end().ends_with("nothing to do"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "positions: 6 live seq(s); newest seq 6 @ partition 0 offset {},",
            offsets[0]
        )),
        "the repair rewrote each seq with its record's position: {stdout}"
    );

    // Damage that leaves the positions (a day's bucket lost): without any replica to ask, the
    // stored positions name the partition of the fix.
    let day_keys = server.raw("KEYS mm:mbday:{hot}:1:*");
    let day_key = day_keys
        .lines()
        .find(|l| l.starts_with("mm:"))
        .unwrap_or_else(|| panic!("a day key of hot: {day_keys}"))
        .to_owned();
    server.raw(&format!("DEL {day_key}"));
    let (out, stdout) = explain(&config, &["--user", "hot"]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("\nfix: materializer replay --partition 0 --from-time "),
        "{stdout}"
    );
    let repaired = run_materializer(
        &[
            "--config",
            config.as_str(),
            "replay",
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--user",
            "hot",
            "--reset-mailboxes",
            "--progress",
            "off",
        ],
        None,
    );
    assert!(repaired.status.success(), "{repaired:?}");

    // A repair of another host holds cool's fence: shown, and the answer is to wait.
    let reply = server.raw("SET mm:repair:{cool} repair-otherhost-4242-1-1 PX 60000");
    assert!(reply.starts_with("+OK"), "{reply}");
    let (out, stdout) = explain(&config, &["--user", "cool"]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("fence:     held by repair-otherhost-4242-1-1, ")
            && stdout.contains("it runs as process 4242 on host otherhost"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("wait: a repair (repair-otherhost-4242-1-1)")),
        "{stdout}"
    );
    // One of this host whose process is gone: the fix takes it over.
    let mut gone = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = gone.id();
    gone.wait().expect("true exits");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let holder = format!("repair-{}-{pid}-1-1", host.trim());
    let reply = server.raw(&format!("SET mm:repair:{{cool}} {holder} PX 60000"));
    assert!(reply.starts_with("+OK"), "{reply}");
    let (_, stdout) = explain(&config, &["--user", "cool"]);
    assert!(
        stdout.contains(&format!("its process {pid} on this host is gone")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("--reset-mailboxes --take-over-fence {holder}")),
        "{stdout}"
    );
    server.raw("DEL mm:repair:{cool}");

    // An unreachable store: exit 2.
    let out = run_materializer(
        &[
            "--store",
            "redis",
            "--redis-url",
            &format!("redis://127.0.0.1:{}", free_port()),
            "explain",
            "--user",
            "hot",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
}

/// How a backend's test loses hot's identity index.
enum Damage {
    RedisCluster(support::redis_server::RedisCluster),
    Scylla { nodes: String, keyspace: String },
}

impl Damage {
    async fn lose_hot_identities(&self) {
        match self {
            Self::RedisCluster(cluster) => {
                // Only the master owning hot's slot holds the key; the others answer MOVED.
                let deleted: Vec<String> = cluster
                    .nodes
                    .iter()
                    .map(|node| node.raw("DEL mm:mbseqbucket:{hot}:1"))
                    .collect();
                assert!(deleted.iter().any(|r| r.starts_with(":1")), "{deleted:?}");
            }
            Self::Scylla { nodes, keyspace } => {
                let store = support::reference::scylla_store(nodes, keyspace).await;
                support::reference::lose_scylla_identity_rows(&store, "hot").await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_on_a_redis_cluster_names_the_block_and_the_fix() {
    let cluster =
        tokio::task::spawn_blocking(|| support::redis_server::RedisCluster::start(Clock::Real))
            .await
            .expect("cluster start");
    let mut setup = DaemonSetup::new("explain-cluster", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    explained_and_fixed_on(setup, Damage::RedisCluster(cluster)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_on_scylla_names_the_block_and_the_fix() {
    let nodes = std::env::var("SCYLLA_NODES").unwrap_or_else(|_| {
        panic!("SCYLLA_NODES is not set: run the tests with scripts/test, which starts Cassandra")
    });
    let keyspace = format!("mmd_explain_{}", std::process::id());
    let mut setup = DaemonSetup::new("explain-scylla", None);
    setup.scylla = Some((nodes.clone(), keyspace.clone()));
    explained_and_fixed_on(setup, Damage::Scylla { nodes, keyspace }).await;
}

/// hot's records on partition 1, cool's on partition 0: the positions and the block name the
/// right partition, and the printed fix repairs hot on every backend.
async fn explained_and_fixed_on(mut setup: DaemonSetup, damage: Damage) {
    setup.http_extra = vec!["debug_endpoints = true".to_owned()];
    create_topic(&setup.topic, 2).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records: Vec<(i32, Vec<u8>)> = (1..=3)
        .map(|seq| (1, group_record("hot", seq, "h")))
        .collect();
    records.extend((1..=2).map(|seq| (0, group_record("cool", seq, "c"))));
    let first = produce(&setup.topic, &records).await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "every record applied",
        Duration::from_secs(120),
        || {
            daemon
                .metrics()
                .get("materializer_groups_total{outcome=\"inserted\"}")
                == 5.0
        },
        || daemon.log(),
    );
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("utf-8 path").to_owned();
    let address = format!("127.0.0.1:{}", daemon.http_port);

    let (out, stdout) = explain(&config, &["--user", "cool", "--daemon", &address]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "positions: 2 live seq(s); newest seq 2 @ partition 0 offset {}, seq 1 @ partition 0 offset {};",
            first[4], first[3]
        )),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("nothing to do"), "{stdout}");

    damage.lose_hot_identities().await;
    let blocked_at = produce(&setup.topic, &[(1, group_record("hot", 4, "h4"))]).await[0];
    wait_for(
        "/debug/blocked lists hot",
        Duration::from_secs(60),
        || {
            http_get(daemon.http_port, "/debug/blocked")
                .is_some_and(|(code, body)| code == 200 && body.contains("\"user_id\":\"hot\""))
        },
        || daemon.log(),
    );
    let (out, stdout) = explain(&config, &["--user", "hot", "--daemon", &address]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "blocked:   by {address} on partition 1 at offset {blocked_at} since"
        )),
        "{stdout}"
    );
    let fix = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fix: "))
        .unwrap_or_else(|| panic!("no fix line: {stdout}"))
        .to_owned();
    assert!(
        fix.starts_with("materializer replay --partition 1 --from-time ")
            && fix.ends_with(" --user hot --reset-mailboxes"),
        "{fix}"
    );
    let mut args = vec!["--config", config.as_str()];
    args.extend(fix.split_whitespace().skip(1));
    args.extend(["--progress", "off"]);
    let out = run_materializer(&args, None);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the daemon flows again",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_partition_blocked{partition=\"1\"}")
                == 0.0
                && http_get(daemon.http_port, "/debug/blocked")
                    .is_some_and(|(_, body)| body.contains("\"total\":0"))
        },
        || daemon.log(),
    );
    let (out, stdout) = explain(&config, &["--user", "hot", "--daemon", &address]);
    println!("{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "positions: 4 live seq(s); newest seq 4 @ partition 1 offset {blocked_at}, seq 3 @ partition 1 offset {},",
            first[2]
        )),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("nothing to do"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_blocked_is_not_served_unless_asked() {
    let setup = DaemonSetup::new("explain-off", None);
    create_topic(&setup.topic, 1).await;
    let daemon = Daemon::start(&setup);
    let (code, body) = http_get(daemon.http_port, "/debug/blocked").expect("an answer");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("http.debug_endpoints"), "{body}");
}
