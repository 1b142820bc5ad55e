//! SPEC 7.2 as amended, "The cluster may change under load": a 3-master Redis Cluster grows to
//! 4 masters (`redis-cli --cluster add-node`, then `rebalance --cluster-use-empty-masters`
//! moving a quarter of the slots and their keys) while the daemon writes. Every outcome the
//! daemon counts is the one of the single execution that changed the store: the outcome counts
//! equal the memory reference's (before, a pipeline re-sent whole after one redirected command
//! ran its other scripts twice and counted `unchanged` for what it had `inserted`), the state
//! equals the reference, and the log does not repeat the routine redirection per delivery.
//!
//! The appends' own routing (`store/redis/slot_router.rs`) answers each redirection for its
//! request alone, so the counts are exact on every run; the redirections are counted by kind
//! (`materializer_store_redirects_total`) and summed up in the log, not logged per delivery.

use crate::support;

use std::time::Duration;

use support::kafka::{create_topic, produce, Daemon, DaemonSetup};
use support::redis_server::{resp_value, Clock, RedisCluster};
use support::reference::{
    assert_counters_match, assert_dead_letters_are_the_references, assert_same_state, end_offsets,
    group_record, reference, stream, wait_committed, PARTITIONS,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_rebalance_onto_a_fourth_master_under_load_reports_every_outcome_once() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster start");
    let mut setup = DaemonSetup::new("reshard", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(400, 12, 31);
    let third = records.len() / 3;
    let mut offsets = produce(&setup.topic, &records[..third]).await;

    let mut daemon = Daemon::start(&setup);
    // The fourth master joins empty; the rebalance moves slots onto it while the daemon writes
    // and the rest of the stream arrives.
    cluster = tokio::task::spawn_blocking(move || {
        cluster.add_master(Clock::Real);
        cluster
    })
    .await
    .expect("add a master");
    let cluster = std::sync::Arc::new(cluster);
    let rebalance = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.rebalance_onto_empty_masters())
    };
    for chunk in records[third..].chunks(200) {
        offsets.extend(produce(&setup.topic, chunk).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rebalance.await.expect("rebalance");
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(180));
    let metrics = daemon.metrics();
    let log = daemon.log();
    assert!(daemon.terminate(Duration::from_secs(30)).success());

    let reference = reference(&records, &offsets).await;
    let redirects = |kind: &str| {
        metrics.get(&format!(
            "materializer_store_redirects_total{{kind=\"{kind}\"}}"
        ))
    };
    let moved_lines = log.matches("Redis Cluster slots moved:").count();
    let summaries = log
        .matches("Redis Cluster redirections in the last")
        .count();
    eprintln!(
        "rebalance under load: redirects moved {} ask {} tryagain {}; {moved_lines} 'slots moved' lines, {summaries} summaries",
        redirects("moved"),
        redirects("ask"),
        redirects("tryagain"),
    );
    for line in log
        .lines()
        .filter(|l| l.contains("slots moved") || l.contains("redirections in"))
        .take(3)
    {
        eprintln!("  {line}");
    }
    // Every outcome is the one of the single execution that changed the store.
    assert_counters_match(&reference, &metrics);
    assert_dead_letters_are_the_references(&reference, &setup.dlq_topic);
    assert_same_state(&reference, &cluster.store().await).await;
    let retries = log.matches("store unavailable; retrying").count();
    eprintln!(
        "rebalance under load: {} records, {retries} 'store unavailable' lines",
        records.len()
    );
    // A redirection is routine: it never reaches the daemon's retry log.
    assert!(
        retries <= 10,
        "a routine redirection logged per delivery ({retries} lines)"
    );
}

/// SPEC 7.2: a slot left migrating by an interrupted reshard holds only the users of that slot,
/// turns readiness false with the slot named, and resumes by itself once the operator runs
/// `redis-cli --cluster fix`.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_left_migrating_holds_only_its_users_and_readiness_names_it() {
    use support::kafka::{committed, http_get, wait_for};
    use support::reference::scan_seqs;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(Clock::Real))
        .await
        .expect("cluster start");
    let mut setup = DaemonSetup::new("openslot", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let stuck = "openslot-stuck";
    let slot: u16 = resp_value(&cluster.nodes[0].raw(&format!("CLUSTER KEYSLOT {stuck}")))
        .parse()
        .expect("slot");
    let others: Vec<String> = (0..30)
        .map(|i| format!("openslot-u{i}"))
        .filter(|u| {
            resp_value(&cluster.nodes[0].raw(&format!("CLUSTER KEYSLOT {u}"))) != slot.to_string()
        })
        .collect();

    // The stuck user's mailbox exists before the reshard starts.
    let mut offsets = produce(&setup.topic, &[(0, group_record(stuck, 1, "b"))]).await;
    let mut daemon = Daemon::start(&setup);
    wait_for(
        "the first record committed",
        Duration::from_secs(60),
        || committed(&setup.group, &setup.topic, 1) == vec![1],
        || daemon.log(),
    );

    // A reshard interrupted half-way: the slot MIGRATING on its master, IMPORTING on another.
    let owner = cluster
        .nodes
        .iter()
        .position(|n| !n.raw(&format!("GET {{{stuck}}}x")).starts_with("-MOVED"))
        .expect("the slot's master");
    let target = (owner + 1) % cluster.nodes.len();
    let id = |i: usize| resp_value(&cluster.nodes[i].raw("CLUSTER MYID"));
    let (owner_id, target_id) = (id(owner), id(target));
    assert!(cluster.nodes[target]
        .raw(&format!("CLUSTER SETSLOT {slot} IMPORTING {owner_id}"))
        .starts_with("+OK"));
    assert!(cluster.nodes[owner]
        .raw(&format!("CLUSTER SETSLOT {slot} MIGRATING {target_id}"))
        .starts_with("+OK"));

    // The stuck user's next record waits; every other user's records land.
    let mut records = vec![(0, group_record(stuck, 2, "b"))];
    records.extend(others.iter().map(|u| (0, group_record(u, 1, "b"))));
    offsets.extend(produce(&setup.topic, &records).await);
    wait_for(
        "readiness false with the slot named",
        Duration::from_secs(60),
        || {
            http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                // Both ends of the slot are named (in the order of their nodes' addresses).
                status == 503
                    && body.contains(&format!("store slots: slot {slot} "))
                    && body.contains(&format!("slot {slot} migrating on"))
                    && body.contains(&format!("slot {slot} importing on"))
            })
        },
        || daemon.log(),
    );
    let metrics = daemon.metrics();
    assert_eq!(metrics.get("materializer_store_open_slots"), 1.0);
    assert!(
        metrics.get("materializer_store_redirects_total{kind=\"tryagain\"}") > 0.0,
        "the stuck user's script is answered TRYAGAIN (its keys would be split): counted"
    );
    let store = cluster.store().await;
    for user in &others {
        assert_eq!(scan_seqs(&store, user).await, vec![1], "{user} flows");
    }
    assert_eq!(
        committed(&setup.group, &setup.topic, 1),
        vec![1],
        "the committed offset stays before the stuck user's record"
    );

    // The operator fixes the cluster: the slot closes and the stuck user's record lands.
    let any = format!("127.0.0.1:{}", cluster.nodes[0].port().expect("tcp"));
    let fixed = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(["--cluster", "fix", &any, "--cluster-yes"])
            .output()
            .expect("redis-cli")
    })
    .await
    .expect("fix");
    assert!(
        fixed.status.success(),
        "{}",
        String::from_utf8_lossy(&fixed.stdout)
    );
    let end = offsets.last().copied().unwrap_or(0) + 1;
    wait_for(
        "every record committed and readiness back",
        Duration::from_secs(120),
        || {
            committed(&setup.group, &setup.topic, 1) == vec![end]
                && daemon.ready_status() == Some(200)
        },
        || daemon.log(),
    );
    assert_eq!(scan_seqs(&store, stuck).await, vec![1, 2]);
    assert_eq!(daemon.metrics().get("materializer_store_open_slots"), 0.0);
    assert!(daemon.terminate(Duration::from_secs(30)).success());
}

/// SPEC 7.2 "a graceful or forced failover": 3 masters with a replica each, writes acknowledged
/// by one replica (`wait_replicas = 1`). Under load, a replica takes over with `CLUSTER
/// FAILOVER`, then another master is killed with SIGKILL (its replica is promoted after the
/// node timeout), then the killed node is started again (it rejoins as a replica). The state
/// equals the reference: nothing acknowledged is lost. Every outcome count is the reference's:
/// a write the killed master ran and replicated but never answered, and every write the
/// promoted replica ran while it had no replica of its own to acknowledge it, is retried, finds
/// itself already there, and is answered as it was by its write token (`model::written`).
#[tokio::test(flavor = "multi_thread")]
async fn a_forced_failover_under_load_keeps_every_acknowledged_write() {
    let mut cluster =
        tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(Clock::Real))
            .await
            .expect("cluster start");
    let mut setup = DaemonSetup::new("failover", None);
    setup.redis_cluster = Some(cluster.seed_urls());
    setup.store_extra = vec![
        "wait_replicas = 1".to_owned(),
        "wait_timeout_ms = 500".to_owned(),
    ];
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(300, 10, 47);
    let quarter = records.len() / 4;
    let mut offsets = produce(&setup.topic, &records[..quarter]).await;
    let mut daemon = Daemon::start(&setup);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A graceful failover: a replica takes over its master's slots.
    let masters = cluster.masters(None);
    let promoted = (0..cluster.nodes.len())
        .find(|i| !masters.contains(i))
        .expect("a replica");
    assert!(cluster.nodes[promoted]
        .raw("CLUSTER FAILOVER")
        .starts_with("+OK"));
    offsets.extend(produce(&setup.topic, &records[quarter..2 * quarter]).await);

    // A forced one: another master dies; its replica is promoted after the node timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cluster.masters(None).contains(&promoted) {
        assert!(
            std::time::Instant::now() < deadline,
            "the failover never finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed = cluster
        .masters(None)
        .into_iter()
        .find(|m| *m != promoted)
        .expect("another master");
    std::sync::Arc::get_mut(&mut cluster.nodes[killed])
        .expect("the node is not shared")
        .stop();
    offsets.extend(produce(&setup.topic, &records[2 * quarter..3 * quarter]).await);
    // The replica takes over once the others mark the master failed (the node timeout, 2 s).
    // Only then may the killed node come back: a master without persistence that restarts
    // before its replica took over is an empty master, and its replica syncs to that emptiness
    // (the daemon then finds damaged mailboxes and fails them closed, as it should).
    // Redis elects the replica by the votes of the other masters; on a loaded machine an
    // election can stall (the voters' cluster bus starved). After 20 s the replica takes over
    // as an operator would (`CLUSTER FAILOVER TAKEOVER`, no votes needed): how Redis promoted
    // it is not what this test is about.
    let killed_port = format!("{}", cluster.nodes[killed].port().expect("tcp"));
    let started = std::time::Instant::now();
    let mut took_over = false;
    while cluster.masters(Some(killed)).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no replica took over"
        );
        if !took_over && started.elapsed() > Duration::from_secs(20) {
            took_over = true;
            for (i, node) in cluster.nodes.iter().enumerate() {
                if i != killed {
                    let role = node.raw("ROLE");
                    if role.contains("slave") && role.contains(&killed_port) {
                        eprintln!("the election stalled: CLUSTER FAILOVER TAKEOVER on node {i}");
                        let _ = node.raw("CLUSTER FAILOVER TAKEOVER");
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_ok(Some(killed));
        cluster
    })
    .await
    .expect("failover");

    // The killed node comes back and rejoins as a replica (its writes can be acknowledged
    // again by a replica of the promoted master).
    std::sync::Arc::get_mut(&mut cluster.nodes[killed])
        .expect("the node is not shared")
        .restart();
    offsets.extend(produce(&setup.topic, &records[3 * quarter..]).await);
    let ends = end_offsets(&records, &offsets);
    wait_committed(&setup, &ends, &[&daemon], Duration::from_secs(180));
    let metrics = daemon.metrics();
    assert!(daemon.terminate(Duration::from_secs(30)).success());

    let reference = reference(&records, &offsets).await;
    assert_same_state(&reference, &cluster.store().await).await;
    assert_dead_letters_are_the_references(&reference, &setup.dlq_topic);
    let count =
        |word: &str| metrics.get(&format!("materializer_groups_total{{outcome=\"{word}\"}}"));
    let expected = |word: &str| reference.groups.get(word).copied().unwrap_or(0) as f64;
    for word in [
        "inserted",
        "replaced",
        "unchanged",
        "superseded",
        "conflict",
        "rejected",
        "expired_merged",
        "trimmed",
        "stale_epoch",
    ] {
        assert_eq!(count(word), expected(word), "{word}");
    }
}

/// SPEC 7.2 and 8.1: `apply` while the cluster is resharded prints the outcomes of the
/// reference. Inputs of distinct users are applied again and again while `rebalance` moves
/// slots onto a fourth master: each first `apply` prints `inserted` for every line, the second
/// `unchanged` for every line (a request re-sent whole after one redirected command would print
/// `unchanged` the first time; a lost one `inserted` the second time).
#[tokio::test(flavor = "multi_thread")]
async fn apply_during_a_rebalance_prints_the_references_outcomes() {
    use support::cli::{assert_one_outcome_per_line, numbered_dispatches_for, run_materializer};

    let cluster = tokio::task::spawn_blocking(|| {
        let mut cluster = RedisCluster::start(Clock::Real);
        cluster.add_master(Clock::Real);
        std::sync::Arc::new(cluster)
    })
    .await
    .expect("cluster start");
    let urls = cluster.seed_urls();
    let dir = std::env::temp_dir().join(format!("mm-apply-reshard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("cluster.toml");
    let nodes: Vec<String> = urls[1..].iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\ncluster = true\ncluster_nodes = [{}]\n",
            urls[0],
            nodes.join(", ")
        ),
    )
    .expect("write config");
    let config = config.to_str().expect("utf-8 path").to_owned();

    let rebalance = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.rebalance_onto_empty_masters())
    };
    let lines = 1_500;
    let mut rounds = 0;
    let mut during = 0;
    let mut inputs = Vec::new();
    loop {
        let moving = !rebalance.is_finished();
        let input = numbered_dispatches_for(
            &format!("a{rounds}"),
            lines,
            support::reference::now_ms(),
            lines,
        );
        let config = config.clone();
        let (first, second) = tokio::task::spawn_blocking(move || {
            let first = run_materializer(&["--config", &config, "apply", "-"], Some(&input));
            let second = run_materializer(&["--config", &config, "apply", "-"], Some(&input));
            (first, (second, input))
        })
        .await
        .expect("apply");
        assert_one_outcome_per_line(&first, lines, "inserted");
        assert_one_outcome_per_line(&second.0, lines, "unchanged");
        inputs.push(second.1);
        rounds += 1;
        if moving && !rebalance.is_finished() {
            during += 1;
        }
        if !moving {
            break;
        }
    }
    rebalance.await.expect("rebalance");
    eprintln!("apply during a rebalance: {rounds} rounds of {lines} lines, {during} wholly while slots moved");
    assert!(during >= 1, "no apply ran while slots moved");
    // Every input is stored: applied once more after the rebalance, every line is unchanged.
    for input in &inputs {
        let config = config.clone();
        let input = input.clone();
        let again = tokio::task::spawn_blocking(move || {
            run_materializer(&["--config", &config, "apply", "-"], Some(&input))
        })
        .await
        .expect("apply");
        assert_one_outcome_per_line(&again, lines, "unchanged");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
