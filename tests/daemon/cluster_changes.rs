//! SPEC 7.2 as amended, "The cluster may change under load": a 3-master Redis Cluster grows to
//! 4 masters (`redis-cli --cluster add-node`, then `rebalance --cluster-use-empty-masters`
//! moving a quarter of the slots and their keys) while the daemon writes. Every outcome the
//! daemon counts is the one of the single execution that changed the store: the outcome counts
//! equal the memory reference's (before, a pipeline re-sent whole after one redirected command
//! ran its other scripts twice and counted `unchanged` for what it had `inserted`), the state
//! equals the reference, and the log does not repeat the routine redirection per delivery.
//!
//! One exception is measured, not hidden: the redis crate's cluster client (1.8.1) sometimes
//! stalls in a slot-map refresh that never finishes; the store's watch replaces the connection
//! within seconds (`store/redis/cluster_watch.rs`), but requests the stalled client ran without
//! delivering their answers time out, and their retries answer `unchanged`. The test tells
//! the two cases apart by the watch's log line.

use crate::support;

use std::time::Duration;

use support::kafka::{create_topic, produce, Daemon, DaemonSetup};
use support::redis_server::{Clock, RedisCluster};
use support::reference::{
    assert_counters_match, assert_dead_letters_are_the_references, assert_same_state, end_offsets,
    reference, stream, wait_committed, PARTITIONS,
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
    let timed_out = log
        .matches("error=store unavailable (redis): timed out")
        .count();
    let replaced = log.matches("a fresh connection replaced it").count();
    eprintln!(
        "rebalance under load: {timed_out} 'timed out' retries logged, {} slot refreshes, {replaced} fresh connections",
        log.matches("beginning slot refresh").count(),
    );
    if replaced == 0 {
        // The client answered throughout: every outcome is the one of the single execution.
        assert_counters_match(&reference, &metrics);
    } else {
        // The client stalled (a slot-map refresh that never finished) and the watch replaced
        // it. A request whose answer the stalled client never delivered timed out: its outcome
        // is unknown, and the retry of one that had run answers `unchanged`. Only those may
        // differ, and they may only have moved from `inserted`/`replaced` to `unchanged`.
        let count =
            |word: &str| metrics.get(&format!("materializer_groups_total{{outcome=\"{word}\"}}"));
        let expected = |word: &str| reference.groups.get(word).copied().unwrap_or(0) as f64;
        let moved = count("unchanged") - expected("unchanged");
        assert!(moved >= 0.0, "fewer unchanged than the reference");
        assert_eq!(
            count("inserted") + count("replaced") + moved,
            expected("inserted") + expected("replaced"),
            "only written outcomes can have been answered again"
        );
        for word in [
            "conflict",
            "rejected",
            "expired_merged",
            "trimmed",
            "stale_epoch",
        ] {
            assert_eq!(count(word), expected(word), "{word}");
        }
    }
    assert_dead_letters_are_the_references(&reference, &setup.dlq_topic);
    assert_same_state(&reference, &cluster.store().await).await;
    let retries = log.matches("store unavailable; retrying").count();
    eprintln!(
        "rebalance under load: {} records, {retries} 'store unavailable' lines",
        records.len()
    );
    // A redirection is routine: it never reaches the daemon's retry log (a stall does).
    assert!(
        replaced > 0 || retries <= 10,
        "a routine redirection logged per delivery ({retries} lines)"
    );
}
