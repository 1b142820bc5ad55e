//! The conformance cases that keep the clock still, and the patrol, on a real 3-master Redis
//! Cluster on loopback (`redis-cli --cluster create`). Every key of a mailbox shares the user's
//! hash tag, so every script runs on one node whichever master owns the user.

use crate::conformance;

use std::sync::Arc;

use conformance::redis::ClusterHarness;
use conformance::{cases, mailbox, Harness, NOW0, TODAY0};
use mailbox_materializer::model::RetentionPolicy;
use mailbox_materializer::store::redis::keys::MailboxKeys;
use mailbox_materializer::store::MailboxStore;

macro_rules! run_cases {
    ($harness:expr; $($case:ident),* $(,)?) => {
        $(
            eprintln!("cluster case: {}", stringify!($case));
            cases::$case(&$harness).await;
        )*
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_cases_on_a_three_master_cluster() {
    let cluster = tokio::task::spawn_blocking(|| ClusterHarness::start(NOW0))
        .await
        .expect("cluster start");
    let harness: Arc<dyn Harness> = Arc::new(cluster);
    run_cases!(harness;
        memory_epoch_check_and_reverse_range,
        epoch_move_deletes_the_old_epoch,
        stale_epoch_writes_nothing,
        duplicate_ordinal_rejected,
        same_day_replacement_of_the_whole_group,
        identical_replay_is_unchanged,
        largest_group_inserts_replaces_and_scans_whole,
        cross_day_conflict,
        cross_day_conflict_for_expired_input,
        expired_replay_merges_the_gap,
        future_window_rejects_and_leaves_no_key,
        span_exceeded_rejects_and_changes_nothing,
        v3_meta_rejected_with_nothing_modified,
        index_lost_is_corrupt,
        meta_lost_is_corrupt,
        identity_missing_below_seqbucket_max_seq_is_corrupt,
        scan_reads_buckets_older_than_max_day_minus_retention,
        scan_pages_whole_groups_in_seq_order,
        payload_round_trips_as_canonical_json,
        trim_outcome_and_trim_never_lowers,
        truncate_on_unknown_user_is_durable,
        concurrent_appends_to_one_mailbox,
        repair_fence_holds_live_writes_and_swap_replaces,
        repair_abort_leaves_the_live_mailbox_untouched,
        repair_second_repair_is_refused,
        repair_heals_a_corrupt_mailbox,
        repair_rebuilds_epoch_moves_and_replaces_every_epoch,
        repair_staging_follows_the_append_rules,
        append_many_answers_each_group_like_append,
        append_many_spread_over_many_users_answers_each,
        append_run_answers_each_group_like_append,
        append_runs_spread_over_many_users_answer_each,
        late_write_of_an_older_position_is_superseded,
        seq_positions_name_each_live_seqs_stored_version,
        a_later_write_of_another_seq_never_fences_a_replace,
        a_cut_over_to_a_new_log_replaces_same_day_content,
        scans_beside_same_day_replaces_never_skip_a_group,
        every_lost_piece_answers_the_truth_or_corrupt_at_a_fixed_clock,
    );
}

/// Cold mailboxes spread over every master: each carries one expired day (the state a mailbox
/// written 40 days ago and never touched since is in), and the patrol must find and compact all
/// of them, on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patrol_walks_every_master() {
    let cluster = tokio::task::spawn_blocking(|| ClusterHarness::start(NOW0))
        .await
        .expect("cluster start");
    let policy = RetentionPolicy::default();
    let f = cluster.fixture_with_prefix(policy).await;
    let old_day = TODAY0 - 40;
    assert!(
        policy.expires_at(old_day) <= NOW0,
        "the crafted day must be expired"
    );
    let users = 24;
    for i in 0..users {
        let mb = mailbox(&format!("cold-{i}"), 1);
        let k = MailboxKeys::new(&f.prefix, &mb);
        let expires = policy.expires_at(old_day);
        let _: () = f.cmd(redis::cmd("SET").arg(&k.epoch).arg(1)).await;
        let _: () = f
            .cmd(
                redis::cmd("HSET")
                    .arg(&k.meta)
                    .arg("retention_format_version")
                    .arg(4)
                    .arg("active_day_count")
                    .arg(1)
                    .arg("min_day")
                    .arg(old_day)
                    .arg("max_day")
                    .arg(old_day)
                    .arg("expired_gap_boundary")
                    .arg(0)
                    .arg("seqbucket_max_seq")
                    .arg(5)
                    .arg("user_trim_seq")
                    .arg(0)
                    .arg(format!("bucket_max_seq:{old_day}"))
                    .arg(5)
                    .arg(format!("bucket_expires_at:{old_day}"))
                    .arg(expires),
            )
            .await;
        let _: () = f
            .cmd(redis::cmd("ZADD").arg(&k.days).arg(expires).arg(old_day))
            .await;
    }
    let masters: Vec<usize> = cluster
        .cluster
        .nodes
        .iter()
        .map(|n| {
            let reply = n.raw(&format!("KEYS {}:mbmeta:*", f.prefix));
            reply.matches("mbmeta").count()
        })
        .collect();
    assert!(
        masters.iter().filter(|&&n| n > 0).count() >= 2,
        "the users should spread over several masters: {masters:?}"
    );

    let report = f.store.patrol(10_000).await.unwrap();
    assert_eq!(report.visited, users);
    assert_eq!(report.expired_days, users);
    for i in 0..users {
        let inspected = f
            .store
            .inspect(&mailbox(&format!("cold-{i}"), 1))
            .await
            .unwrap();
        assert!(inspected.active_days.is_empty());
        assert_eq!(inspected.expired_gap_boundary, 5);
    }
}

/// Crashed repairs of users spread over every master: once their (short) leases lapse, one
/// garbage collection finds and removes every staging copy, on every master, and the live
/// mailboxes are as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_garbage_is_collected_on_every_master() {
    use conformance::group;
    use mailbox_materializer::model::AppendOutcome;
    use std::time::Duration;

    let cluster = tokio::task::spawn_blocking(|| ClusterHarness::start(NOW0))
        .await
        .expect("cluster start");
    let f = cluster
        .fixture_with_prefix(RetentionPolicy::default())
        .await;
    let users = 24;
    for i in 0..users {
        let mb = mailbox(&format!("crashed-{i}"), 1);
        assert_eq!(
            f.store.append(&group(&mb, 1, TODAY0, 1, "live")).await,
            Ok(AppendOutcome::Inserted)
        );
        // The cluster's clock ticks in real time from its start: a 300 ms lease lapses soon.
        let token = f
            .store
            .repair_begin(&mb.user_id, Duration::from_millis(300))
            .await
            .expect("fence");
        f.store
            .repair_append(&token, &group(&mb, 9, TODAY0, 1, "staged"))
            .await
            .expect("staged");
    }
    let staged: Vec<usize> = cluster
        .cluster
        .nodes
        .iter()
        .map(|n| {
            n.raw(&format!("KEYS {}:stgepoch:*", f.prefix))
                .matches("stgepoch")
                .count()
        })
        .collect();
    assert!(
        staged.iter().filter(|&&n| n > 0).count() >= 2,
        "the staging copies should spread over several masters: {staged:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(f.store.repair_collect_garbage(true).await, Ok(users));
    assert_eq!(f.store.repair_collect_garbage(false).await, Ok(users));
    for node in &cluster.cluster.nodes {
        let left = node.raw(&format!("KEYS {}:stg*", f.prefix));
        assert!(left.starts_with("*0"), "staging keys left: {left}");
    }
    for i in 0..users {
        let page = f
            .store
            .range_scan(
                &mailbox(&format!("crashed-{i}"), 1),
                mailbox_materializer::model::ScanRequest {
                    after_seq: 0,
                    until_seq: None,
                    limit_groups: 10,
                },
            )
            .await
            .expect("scan");
        assert_eq!(
            page.groups
                .iter()
                .map(|g| g.mailbox_seq)
                .collect::<Vec<_>>(),
            vec![1]
        );
    }
}

/// SPEC 7.2 "a stale slot map": a mailbox's slot is moved to another master behind the
/// store's back (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT ... NODE`, as
/// `redis-cli --cluster reshard` does it). The store's table still names the old master: the
/// next batched append is answered `MOVED`, sent again to the new master alone, and answers
/// what the mailbox's state says (`inserted`; its replay `unchanged`), with the redirection
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_behind_the_stores_back_is_answered_right() {
    use conformance::group;
    use mailbox_materializer::model::AppendOutcome;

    let cluster = tokio::task::spawn_blocking(|| ClusterHarness::start(NOW0))
        .await
        .expect("cluster start");
    let f = cluster
        .fixture_with_prefix(RetentionPolicy::default())
        .await;
    let mb = mailbox("moved-behind", 1);
    let first = group(&mb, 1, TODAY0, 1, "one");
    assert_eq!(
        f.store.append_many(&[&first]).await,
        vec![Ok(AppendOutcome::Inserted)]
    );
    let before = f.store.cluster_redirects().expect("a cluster store");

    let nodes = &cluster.cluster.nodes;
    let epoch_key = MailboxKeys::new(&f.prefix, &mb).epoch;
    use crate::support::redis_server::resp_value;
    let slot = resp_value(&nodes[0].raw(&format!("CLUSTER KEYSLOT {epoch_key}")));
    let holds =
        |n: &usize| resp_value(&nodes[*n].raw(&format!("CLUSTER COUNTKEYSINSLOT {slot}"))) != "0";
    let source = (0..nodes.len())
        .find(holds)
        .expect("the owner holds the keys");
    let target = (source + 1) % nodes.len();
    let id = |n: usize| resp_value(&nodes[n].raw("CLUSTER MYID"));
    let target_port = nodes[target].port().expect("tcp");
    assert!(nodes[target]
        .raw(&format!("CLUSTER SETSLOT {slot} IMPORTING {}", id(source)))
        .starts_with("+OK"));
    assert!(nodes[source]
        .raw(&format!("CLUSTER SETSLOT {slot} MIGRATING {}", id(target)))
        .starts_with("+OK"));
    let keys: Vec<String> = nodes[source]
        .raw(&format!("CLUSTER GETKEYSINSLOT {slot} 100"))
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$') && !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty());
    let migrated = nodes[source].raw(&format!(
        "MIGRATE 127.0.0.1 {target_port} \"\" 0 5000 KEYS {}",
        keys.join(" ")
    ));
    assert!(migrated.starts_with("+OK"), "{migrated}");
    for n in [target, source, (source + 2) % nodes.len()] {
        assert!(nodes[n]
            .raw(&format!("CLUSTER SETSLOT {slot} NODE {}", id(target)))
            .starts_with("+OK"));
    }

    let second = group(&mb, 2, TODAY0, 1, "two");
    assert_eq!(
        f.store.append_many(&[&second]).await,
        vec![Ok(AppendOutcome::Inserted)],
        "answered by the new master, as the mailbox's state says"
    );
    let after = f.store.cluster_redirects().expect("a cluster store");
    assert!(after[0] > before[0], "the MOVED was counted: {after:?}");
    assert_eq!(
        f.store.append_many(&[&first, &second]).await,
        vec![Ok(AppendOutcome::Unchanged), Ok(AppendOutcome::Unchanged)]
    );
    assert!(holds(&target) && !holds(&source));
}
