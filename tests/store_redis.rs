//! The conformance suite, the Redis-only regressions and the memory-vs-Redis randomized
//! comparison, on real `redis-server` processes whose clock libfaketime moves.
//!
//! Every fixture starts its own server on a private unix socket, so tests that move time never
//! disturb each other.

mod conformance;
mod support;

use std::sync::Arc;

use conformance::memory::MemoryHarness;
use conformance::redis::{RedisFixture, RedisHarness};
use conformance::{group, mailbox, policy, Fixture, NOW0, TODAY0};
use mailbox_materializer::model::{AppendOutcome, DAY_SECS};
use mailbox_materializer::store::redis::keys::MailboxKeys;
use mailbox_materializer::store::MailboxStore;

conformance_tests!(RedisHarness);

// ---- Redis-only regressions ----

async fn pexpiretime(f: &RedisFixture, key: &str) -> i64 {
    f.cmd(redis::cmd("PEXPIRETIME").arg(key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_ttl_is_the_max_live_expiry_never_extended_and_repaired() {
    let p = policy();
    let f = RedisFixture::start(p, NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-ttl-index", 1);
    let keys = MailboxKeys::new("mm", &mb);
    let ms = |day: u64| (p.expires_at(day) * 1000) as i64;

    assert_eq!(
        s.append(&group(&mb, 1, TODAY0 - 2, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0 - 2),
        "a new key gets its max score"
    );
    assert_eq!(
        s.append(&group(&mb, 2, TODAY0, 1, "b")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "raised with GT"
    );
    assert_eq!(
        s.append(&group(&mb, 3, TODAY0 - 5, 1, "c")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "never lowered"
    );
    assert_eq!(
        s.append(&group(&mb, 1, TODAY0 - 2, 1, "a")).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "an old replay extends nothing"
    );
    assert_eq!(
        pexpiretime(&f, &keys.day(TODAY0 - 5)).await,
        ms(TODAY0 - 5),
        "bucket TTL is its day's expiry"
    );

    let _: i64 = f.cmd(redis::cmd("PERSIST").arg(&keys.seqbucket)).await;
    assert_eq!(pexpiretime(&f, &keys.seqbucket).await, -1);
    assert_eq!(
        s.append(&group(&mb, 1, TODAY0 - 2, 1, "a")).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "a TTL-less key is repaired to its max score, not now + N"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_hash_stays_bounded_over_32_consecutive_days() {
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-hlen", 1);
    let keys = MailboxKeys::new("mm", &mb);
    let mut max_hlen = 0;
    for i in 0..32u64 {
        f.set_now_sync(NOW0 + i * DAY_SECS);
        assert_eq!(
            s.append(&group(&mb, i + 1, TODAY0 + i, 1, "d")).await,
            Ok(AppendOutcome::Inserted)
        );
        let hlen: i64 = f.cmd(redis::cmd("HLEN").arg(&keys.meta)).await;
        max_hlen = max_hlen.max(hlen);
    }
    // 7 scalar fields + 2 proof fields for each of at most 31 active days.
    assert!(max_hlen <= 7 + 2 * 31, "HLEN reached {max_hlen}");
    let days: i64 = f.cmd(redis::cmd("ZCARD").arg(&keys.days)).await;
    assert_eq!(days, 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_cold_user_leaves_no_key_at_all() {
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-cold", 1);
    let r = s.append(&group(&mb, 1, TODAY0 + 40, 1, "x")).await;
    assert!(r.is_err());
    let keys: Vec<String> = f.cmd(redis::cmd("KEYS").arg("*")).await;
    assert!(keys.is_empty(), "keys left behind: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-noscript", 1);
    assert_eq!(
        s.append(&group(&mb, 1, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    let _: () = f.cmd(&redis::cmd("SCRIPT").arg("FLUSH").to_owned()).await;
    assert_eq!(
        s.append(&group(&mb, 2, TODAY0, 1, "b")).await,
        Ok(AppendOutcome::Inserted)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqs_beyond_two_to_the_53_stay_exact() {
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-big", 1);
    // 2^53 + 1 and 2^53 + 2 share one double score; the members still tell them apart.
    let a = 9_007_199_254_740_993u64;
    let b = a + 1;
    assert_eq!(
        s.append(&group(&mb, a, TODAY0, 2, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        s.append(&group(&mb, b, TODAY0, 3, "b")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        s.append(&group(&mb, a, TODAY0, 2, "a")).await,
        Ok(AppendOutcome::Unchanged)
    );
    let page = s
        .range_scan(
            &mb,
            mailbox_materializer::model::ScanRequest {
                after_seq: a,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(page.groups.len(), 1);
    assert_eq!(page.groups[0].mailbox_seq, b);
    assert_eq!(page.groups[0].events.len(), 3);
    let max = mailbox_materializer::model::MAX_MAILBOX_SEQ;
    assert_eq!(
        s.append(&group(&mb, max, TODAY0, 1, "m")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(s.truncate_before(&mb, max).await.unwrap().removed_groups, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patrol_compacts_cold_mailboxes_and_touches_nothing_else() {
    let p = policy();
    let f = RedisFixture::start(p, NOW0).await;
    let s = f.store.clone();
    let cold = mailbox("u-patrol-cold", 1);
    let warm = mailbox("u-patrol-warm", 1);
    for (seq, back) in [(1, 20), (2, 10)] {
        assert_eq!(
            s.append(&group(&cold, seq, TODAY0 - back, 1, "c")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    assert_eq!(
        s.append(&group(&warm, 1, TODAY0, 1, "w")).await,
        Ok(AppendOutcome::Inserted)
    );
    f.set_now_sync(p.expires_at(TODAY0 - 10));
    let warm_before = f.fingerprint(&warm.user_id).await;
    assert_eq!(
        s.inspect(&cold).await.unwrap().active_days.len(),
        2,
        "cold proofs still there"
    );

    let report = s.patrol(1000).await.unwrap();
    assert_eq!(report.visited, 2);
    assert_eq!(report.expired_days, 2);
    let inspected = s.inspect(&cold).await.unwrap();
    assert!(inspected.active_days.is_empty());
    assert_eq!(inspected.expired_gap_boundary, 2);
    assert_eq!(
        f.fingerprint(&warm.user_id).await,
        warm_before,
        "nothing else touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_histories_match_the_memory_reference() {
    conformance::history::compare_backends(Arc::new(MemoryHarness), Arc::new(RedisHarness), 40)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_and_password_from_the_url() {
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use support::redis_server::{Clock, Listen, RedisServer};
    let server = tokio::task::spawn_blocking(|| {
        RedisServer::start(
            Clock::Real,
            Listen::Tcp(support::redis_server::free_port()),
            &[
                "--user",
                "default",
                "off",
                "--user",
                "materializer",
                "on",
                ">s3cret",
                "~mm:*",
                "+@all",
            ],
        )
    })
    .await
    .unwrap();
    let port = server.port().unwrap();
    let denied = RedisStore::connect(
        RedisSettings::new(format!("redis://127.0.0.1:{port}"), "mm"),
        policy(),
    )
    .await;
    assert!(denied.is_err(), "the disabled default user must not get in");
    let store = RedisStore::connect(
        RedisSettings::new(
            format!("redis://materializer:s3cret@127.0.0.1:{port}"),
            "mm",
        ),
        policy(),
    )
    .await
    .expect("the ACL user connects");
    let mb = mailbox("u-acl", 1);
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / DAY_SECS;
    assert_eq!(
        store.append(&group(&mb, 1, today, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
}

/// The repair fence of `replay --reset-mailboxes`: while one handle holds it, another handle's
/// appends and truncates of that user are refused with nothing written; the holder writes,
/// resets the user, and lifting the fence lets the others through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_fence_holds_off_other_writers_until_lifted() {
    use mailbox_materializer::model::{RetentionPolicy, StoreError};
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};

    let f = RedisFixture::start(policy(), NOW0).await;
    let daemon = f.store.clone();
    let url = f.server.as_ref().expect("own server").url();
    let repairer = RedisStore::connect(RedisSettings::new(url, "mm"), RetentionPolicy::default())
        .await
        .expect("second handle");
    let mb = mailbox("u-fenced", 1);
    let other = mailbox("u-free", 1);
    assert_eq!(
        daemon.append(&group(&mb, 1, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );

    repairer
        .begin_repair(&mb.user_id, 60)
        .await
        .expect("fence taken");
    let before: Vec<String> = f.cmd(redis::cmd("KEYS").arg("*u-fenced*")).await;
    let refused = daemon.append(&group(&mb, 2, TODAY0, 1, "b")).await;
    assert!(
        matches!(refused, Err(StoreError::UnderRepair { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        daemon.truncate_before(&mb, 2).await,
        Err(StoreError::UnderRepair { .. })
    ));
    let mut after: Vec<String> = f.cmd(redis::cmd("KEYS").arg("*u-fenced*")).await;
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "a refused write leaves nothing behind");
    // Another user is not affected; a second fence on the same user is refused.
    assert_eq!(
        daemon.append(&group(&other, 1, TODAY0, 1, "x")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert!(matches!(
        daemon.begin_repair(&mb.user_id, 60).await,
        Err(StoreError::UnderRepair { .. })
    ));

    // The holder resets and rebuilds.
    let removed = repairer.reset_user(&mb.user_id).await.expect("reset");
    assert!(
        removed >= 3,
        "meta, identity index, days and buckets removed: {removed}"
    );
    assert_eq!(
        repairer.append(&group(&mb, 1, TODAY0, 1, "a")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert!(matches!(
        daemon.reset_user(&mb.user_id).await,
        Err(StoreError::UnderRepair { .. })
    ));

    repairer.end_repair(&mb.user_id).await.expect("lifted");
    assert_eq!(
        daemon.append(&group(&mb, 2, TODAY0, 1, "b")).await,
        Ok(AppendOutcome::Inserted)
    );
    let fence: i64 = f
        .cmd(redis::cmd("EXISTS").arg("mm:repair:{u-fenced}"))
        .await;
    assert_eq!(fence, 0);
}
