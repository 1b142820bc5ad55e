//! The conformance suite, the Redis-only regressions and the memory-vs-Redis randomized
//! comparison, on real `redis-server` processes whose clock libfaketime moves.
//!
//! Every fixture starts its own server on a private unix socket, so tests that move time never
//! disturb each other.

use crate::conformance;
use crate::conformance_tests;
use crate::support;

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
    // The next write that looks the index up without finding the seq repairs it: here an insert
    // into an older day, whose own expiry must not become the key's.
    assert_eq!(
        s.append(&group(&mb, 4, TODAY0 - 3, 1, "d")).await,
        Ok(AppendOutcome::Inserted)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "a TTL-less key is repaired to its max score, not now + N"
    );
    let _: i64 = f.cmd(redis::cmd("PERSIST").arg(&keys.seqbucket)).await;
    s.truncate_before(&mb, 2).await.unwrap();
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "a truncate repairs it too"
    );
    // SPEC 10 (added with 7.2): the lean identical-replay path repairs it as well.
    let _: i64 = f.cmd(redis::cmd("PERSIST").arg(&keys.seqbucket)).await;
    assert_eq!(
        s.append(&group(&mb, 4, TODAY0 - 3, 1, "d")).await,
        Ok(AppendOutcome::Unchanged)
    );
    assert_eq!(
        pexpiretime(&f, &keys.seqbucket).await,
        ms(TODAY0),
        "an identical replay repairs a TTL-less identity key to its max score"
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
    // 8 scalar fields (the 7 of SPEC 5 and next_expires_at) + 2 proof fields for each of at
    // most 31 active days.
    assert!(max_hlen <= 8 + 2 * 31, "HLEN reached {max_hlen}");
    let days: i64 = f.cmd(redis::cmd("ZCARD").arg(&keys.days)).await;
    assert_eq!(days, 31);
}

/// The meta's `pos:<seq>` fields (SPEC 7.2).
async fn position_fields(f: &RedisFixture, keys: &MailboxKeys) -> Vec<String> {
    let fields: Vec<String> = f.cmd(redis::cmd("HKEYS").arg(&keys.meta)).await;
    let mut positions: Vec<String> = fields
        .into_iter()
        .filter(|field| field.starts_with("pos:"))
        .collect();
    positions.sort();
    positions
}

/// SPEC 7.2 and 4.6: a seq's source position lives and dies with its stored version. Over 32
/// consecutive days the meta holds exactly one position per live identity (expired days take
/// theirs away with promote); a trim takes the trimmed seqs' away; a replace without a position
/// takes the seq's away. A mailbox an older release wrote, with one `source_position` for the
/// whole mailbox, keeps working: its field fences nothing and the next write deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_positions_live_and_die_with_their_seqs() {
    use mailbox_materializer::model::{LogId, SourcePosition};
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-pos", 1);
    let keys = MailboxKeys::new("mm", &mb);
    let log = LogId::topic_id("pos-log").expect("log");
    let at = |offset: u64| Some(SourcePosition::new(log.clone(), 0, offset as i64));
    for i in 0..32u64 {
        f.set_now_sync(NOW0 + i * DAY_SECS);
        let mut g = group(&mb, i + 1, TODAY0 + i, 1, "d");
        g.source = at(100 + i);
        assert_eq!(s.append(&g).await, Ok(AppendOutcome::Inserted));
        let identities: i64 = f.cmd(redis::cmd("ZCARD").arg(&keys.seqbucket)).await;
        let positions = position_fields(&f, &keys).await;
        assert_eq!(positions.len() as i64, identities, "day {i}: {positions:?}");
    }
    // Day 31's write promoted day 0 away, and its seq's position with it.
    assert!(!position_fields(&f, &keys)
        .await
        .contains(&"pos:1".to_owned()));
    let held: Option<String> = f
        .cmd(redis::cmd("HGET").arg(&keys.meta).arg("pos:32"))
        .await;
    assert_eq!(held.as_deref(), Some("0:131@id:pos-log"));

    // A trim below seq 20 takes the positions of the seqs it removes.
    s.truncate_before(&mb, 20).await.expect("truncate");
    let positions = position_fields(&f, &keys).await;
    assert_eq!(positions.len(), 13, "seqs 20..=32: {positions:?}");
    assert!(positions
        .iter()
        .all(|p| p["pos:".len()..].parse::<u64>().expect("seq") >= 20));

    // A replace without a position (`apply`) leaves the seq without one.
    let mut g = group(&mb, 32, TODAY0 + 31, 2, "applied");
    g.source = None;
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Replaced));
    assert!(!position_fields(&f, &keys)
        .await
        .contains(&"pos:32".to_owned()));

    // An older release's mailbox-level position (a bare partition:offset): fences nothing, and
    // the next write that changes the mailbox deletes it.
    let _: i64 = f
        .cmd(
            redis::cmd("HSET")
                .arg(&keys.meta)
                .arg("source_position")
                .arg("0:999999"),
        )
        .await;
    // Offset 200 is newer than seq 31's version (offset 130) and older than the field says.
    let mut g31 = group(&mb, 31, TODAY0 + 30, 3, "newer");
    g31.source = at(200);
    assert_eq!(s.append(&g31).await, Ok(AppendOutcome::Replaced));
    let legacy: Option<String> = f
        .cmd(redis::cmd("HGET").arg(&keys.meta).arg("source_position"))
        .await;
    assert_eq!(legacy, None, "the older release's field is gone");
    // The seq's own position fences an older offset of the same log.
    let mut g = group(&mb, 31, TODAY0 + 30, 2, "older");
    g.source = at(199);
    assert_eq!(s.append(&g).await, Ok(AppendOutcome::Superseded));
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
/// Every key on the server with its `DUMP`, sorted.
async fn all_keys(f: &RedisFixture) -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<String> = f.cmd(redis::cmd("KEYS").arg("*")).await;
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = f.cmd(redis::cmd("DUMP").arg(&key)).await;
        if let Some(dump) = dump {
            out.push((key, dump));
        }
    }
    out
}

/// `(prefix, kind)` of a key: the text before its first `{` is `<prefix>:<kind>:`, because a
/// prefix never holds a `{`.
fn prefix_and_kind(key: &str) -> (String, String) {
    let head = &key[..key.find('{').expect("every key carries a hash tag")];
    let (prefix, kind) = head
        .strip_suffix(':')
        .and_then(|h| h.rsplit_once(':'))
        .expect("<prefix>:<kind>:");
    (prefix.to_owned(), kind.to_owned())
}

/// A repair's staging copy, fence, swap, abort and garbage collection under prefix `mm` never
/// read, match or touch the keys of deployments on the same server whose prefixes look like a
/// staging namespace (`mm:stg`, `mm:stgepoch`), even for the same user id; the patrol and the
/// garbage collection of `mm` neither visit nor count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_keys_never_match_another_prefixs_keys() {
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use std::time::Duration;

    let p = policy();
    let f = RedisFixture::start(p, NOW0).await;
    let url = f.server.as_ref().expect("own server").url();
    let open = |prefix: &'static str| {
        let url = url.clone();
        async move {
            RedisStore::connect(RedisSettings::new(url, prefix), p)
                .await
                .expect("connect")
        }
    };
    let a = f.store.clone();
    let b = open("mm:stg").await;
    let c = open("mm:stgepoch").await;
    let mb = mailbox("u-shared", 1);
    let lease = Duration::from_secs(60);

    // Neighbours: live data for the same user, and a crashed repair of `mm:stg` whose staging
    // copy is garbage once its fence lapses.
    for seq in 1..=2 {
        b.append(&group(&mb, seq, TODAY0, 1, "b")).await.unwrap();
        c.append(&group(&mb, seq, TODAY0, 1, "c")).await.unwrap();
    }
    let crashed = b.repair_begin(&mb.user_id, lease).await.unwrap();
    b.repair_append(&crashed, &group(&mb, 5, TODAY0, 1, "b-staged"))
        .await
        .unwrap();
    f.set_now_sync(NOW0 + 120);
    let neighbours = all_keys(&f).await;
    assert!(neighbours.len() >= 10, "{neighbours:?}");

    let check = |stage: &'static str| {
        let neighbours = neighbours.clone();
        let f = &f;
        async move {
            let now = all_keys(f).await;
            for kept in &neighbours {
                assert!(now.contains(kept), "{stage}: {} was touched", kept.0);
            }
            for (key, _) in now.iter().filter(|k| !neighbours.contains(k)) {
                assert_eq!(
                    prefix_and_kind(key).0,
                    "mm",
                    "{stage}: {key} is not a key of prefix mm"
                );
            }
        }
    };

    // Prefix `mm`: live data, an aborted repair, a swapped repair, a crashed repair.
    for seq in 1..=3 {
        a.append(&group(&mb, seq, TODAY0, 1, "a")).await.unwrap();
    }
    check("live writes").await;
    let token = a.repair_begin(&mb.user_id, lease).await.unwrap();
    a.repair_append(&token, &group(&mb, 1, TODAY0, 1, "x"))
        .await
        .unwrap();
    check("staged write").await;
    a.repair_abort(&token).await.unwrap();
    check("abort").await;
    let token = a.repair_begin(&mb.user_id, lease).await.unwrap();
    a.repair_append(&token, &group(&mb, 1, TODAY0, 1, "y"))
        .await
        .unwrap();
    let report = a.repair_swap(&token).await.unwrap();
    assert_eq!(report.staged_groups, 1);
    check("swap").await;
    let token = a.repair_begin(&mb.user_id, lease).await.unwrap();
    a.repair_append(&token, &group(&mb, 2, TODAY0, 1, "z"))
        .await
        .unwrap();
    drop(token);
    f.set_now_sync(NOW0 + 240);
    assert_eq!(
        a.repair_collect_garbage(false).await,
        Ok(1),
        "only mm's own crashed repair is garbage of mm"
    );
    check("garbage collection").await;
    let patrol = a.patrol(1000).await.unwrap();
    assert_eq!(
        patrol.visited, 1,
        "the patrol of mm visits mm's mailbox only"
    );
    assert_eq!(patrol.staging_collected, 0);
    check("patrol").await;
    for (key, _, _) in a.dump_user(&mb.user_id, &[0, 1, 2]).await.unwrap() {
        assert_eq!(prefix_and_kind(&key).0, "mm", "{key} in mm's fingerprint");
    }

    // The neighbour's garbage was there all along, for its own collection.
    assert_eq!(b.repair_collect_garbage(false).await, Ok(1));
    assert_eq!(c.repair_collect_garbage(false).await, Ok(0));
}

/// A live mailbox whose day set and proofs were lost still holds a bucket no metadata names. The
/// swap deletes it anyway (every day of the retention window is a candidate), so a later append
/// into that day cannot bring the orphaned events back to life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swap_deletes_buckets_that_no_metadata_names() {
    use std::time::Duration;
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-orphan", 1);
    let keys = MailboxKeys::new("mm", &mb);
    let old_day = TODAY0 - 3;
    s.append(&group(&mb, 1, old_day, 2, "orphan"))
        .await
        .unwrap();
    s.append(&group(&mb, 2, TODAY0, 1, "kept")).await.unwrap();
    let _: i64 = f.cmd(redis::cmd("DEL").arg(&keys.days)).await;
    let _: i64 = f
        .cmd(
            redis::cmd("HDEL")
                .arg(&keys.meta)
                .arg(format!("bucket_max_seq:{old_day}"))
                .arg(format!("bucket_expires_at:{old_day}")),
        )
        .await;

    let token = s
        .repair_begin(&mb.user_id, Duration::from_secs(60))
        .await
        .unwrap();
    s.repair_append(&token, &group(&mb, 2, TODAY0, 1, "kept"))
        .await
        .unwrap();
    s.repair_swap(&token).await.unwrap();
    let exists: i64 = f.cmd(redis::cmd("EXISTS").arg(keys.day(old_day))).await;
    assert_eq!(exists, 0, "the orphan bucket went with the swap");
    assert_eq!(
        s.append(&group(&mb, 3, old_day, 1, "new")).await,
        Ok(AppendOutcome::Inserted)
    );
    let page = s
        .range_scan(
            &mb,
            mailbox_materializer::model::ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .unwrap();
    let seqs: Vec<u64> = page.groups.iter().map(|g| g.mailbox_seq).collect();
    assert_eq!(seqs, vec![2, 3], "seq 1 stays gone");
}

/// A repair that crashed leaves a staging copy; once its fence lapsed, the next repair of the
/// user starts from nothing (its begin removes the leftovers by their exact names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_repair_starts_from_nothing_after_a_crash() {
    use std::time::Duration;
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-rerun", 1);
    let lease = Duration::from_secs(60);
    s.append(&group(&mb, 1, TODAY0, 1, "live")).await.unwrap();
    let crashed = s.repair_begin(&mb.user_id, lease).await.unwrap();
    for seq in [7, 8] {
        s.repair_append(&crashed, &group(&mb, seq, TODAY0, 1, "old"))
            .await
            .unwrap();
    }
    s.repair_truncate(&crashed, &mb, 7).await.unwrap();
    drop(crashed);
    f.set_now_sync(NOW0 + 61);
    let token = s.repair_begin(&mb.user_id, lease).await.unwrap();
    assert_eq!(
        s.repair_append(&token, &group(&mb, 5, TODAY0, 1, "new"))
            .await,
        Ok(AppendOutcome::Inserted),
        "no trim or seqbucket_max_seq of the crashed repair survives"
    );
    let report = s.repair_swap(&token).await.unwrap();
    assert_eq!(report.staged_groups, 1);
    let inspected = s.inspect(&mb).await.unwrap();
    assert_eq!(inspected.user_trim_seq, 0);
    assert_eq!(inspected.seqbucket_max_seq, 5);
    let names = s.user_key_names(&mb.user_id, &[]).await.unwrap();
    let mut leftovers = Vec::new();
    for name in names.iter().filter(|n| n.contains(":stg")) {
        let exists: i64 = f.cmd(redis::cmd("EXISTS").arg(name)).await;
        if exists == 1 {
            leftovers.push(name.clone());
        }
    }
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

// ---- error classes (SPEC 7): every Redis error goes through `store::classify::redis` ----

/// SPEC 7, error classes, on a real server: a Lua runtime error of the record's own making is
/// deterministic (`Refused`, dead-lettered as `store_refused`, never retried forever); a stored
/// value of the wrong type or shape is damage to the mailbox (`Corrupt`, fail closed): here an
/// epoch key that holds no number, and a command on a key of the wrong type inside a script; and
/// an ACL denial inside a script is the server's configuration (transient), never a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_errors_are_classified_by_their_cause() {
    use mailbox_materializer::model::error::CorruptKind;
    use mailbox_materializer::model::StoreError;
    use mailbox_materializer::store::classify;
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let mb = mailbox("u-damaged-epoch", 1);
    let keys = MailboxKeys::new("mm", &mb);
    let _: () = f.cmd(redis::cmd("SET").arg(&keys.epoch).arg("x")).await;
    let result = s.append(&group(&mb, 1, TODAY0, 1, "a")).await;
    assert!(
        matches!(&result, Err(StoreError::Corrupt { kind: CorruptKind::BadProof { detail } }) if detail.contains("epoch key")),
        "{result:?}"
    );
    let truncated = s.truncate_before(&mb, 3).await;
    assert!(
        matches!(&truncated, Err(StoreError::Corrupt { .. })),
        "{truncated:?}"
    );

    let mut conn = s.conn();
    let raised = redis::cmd("EVAL")
        .arg("error('refused by design')")
        .arg(0)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(matches!(
        classify::redis::classify(&raised),
        StoreError::Refused { .. }
    ));
    let _: () = f.cmd(redis::cmd("HSET").arg("h").arg("f").arg("v")).await;
    let wrong_type = redis::cmd("EVAL")
        .arg("return redis.call('INCR', KEYS[1])")
        .arg(1)
        .arg("h")
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        matches!(
            classify::redis::classify(&wrong_type),
            StoreError::Corrupt { .. }
        ),
        "{wrong_type}"
    );

    // An ACL user that may run scripts but not the commands inside them.
    let _: () = f
        .cmd(
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("scripts-only")
                .arg("on")
                .arg(">pw")
                .arg("~*")
                .arg("+@all")
                .arg("-set"),
        )
        .await;
    let mut limited = redis::Client::open(format!(
        "redis+unix://{}?user=scripts-only&pass=pw",
        f.server.as_ref().expect("standalone").socket().display()
    ))
    .expect("client")
    .get_multiplexed_async_connection()
    .await
    .expect("connect as the limited user");
    let denied = redis::cmd("EVAL")
        .arg("return redis.call('SET', KEYS[1], 'x')")
        .arg(1)
        .arg("k")
        .query_async::<redis::Value>(&mut limited)
        .await
        .unwrap_err();
    assert!(
        matches!(
            classify::redis::classify(&denied),
            StoreError::Unavailable { .. }
        ),
        "{denied}"
    );
}

/// Writes `command` on a fresh unix socket and leaves the reply unread (the connection stays
/// busy with it).
fn send_and_leave(
    server: &support::redis_server::RedisServer,
    command: &str,
) -> std::os::unix::net::UnixStream {
    use std::io::Write;
    let mut stream = std::os::unix::net::UnixStream::connect(server.socket()).expect("connect");
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .expect("write");
    stream
}

fn is_transient<T: std::fmt::Debug>(
    result: &Result<T, mailbox_materializer::model::StoreError>,
) -> bool {
    matches!(
        result,
        Err(mailbox_materializer::model::StoreError::Unavailable {
            backend: "redis",
            ..
        })
    )
}

/// A server busy with a long script answers `BUSY`: transient, and the same append goes through
/// once the script is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_server_is_transient() {
    use mailbox_materializer::model::RetentionPolicy;
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use support::redis_server::{Clock, Listen, RedisServer};
    let server = tokio::task::spawn_blocking(|| {
        RedisServer::start(Clock::Real, Listen::Unix, &["--busy-reply-threshold", "50"])
    })
    .await
    .unwrap();
    let s = RedisStore::connect(
        RedisSettings::new(server.url(), "mm"),
        RetentionPolicy::default(),
    )
    .await
    .unwrap();
    let mb = mailbox("u-busy", 1);
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / DAY_SECS;
    let g = group(&mb, 1, today, 1, "a");
    let _spinner = send_and_leave(&server, "EVAL \"while true do end\" 0");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let result = s.append(&g).await;
    assert!(is_transient(&result), "{result:?}");
    assert!(format!("{result:?}").contains("BUSY"), "{result:?}");
    assert!(server.raw("SCRIPT KILL").starts_with("+OK"));
    // The kill lands at the script's next interrupt check: retry as the daemon would.
    let mut outcome = s.append(&g).await;
    for _ in 0..50 {
        if !is_transient(&outcome) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        outcome = s.append(&g).await;
    }
    assert_eq!(outcome, Ok(AppendOutcome::Inserted));
}

/// A server loading its dataset answers `LOADING`: transient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_server_is_transient() {
    use mailbox_materializer::model::RetentionPolicy;
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use support::redis_server::{Clock, Listen, RedisServer};
    let server = tokio::task::spawn_blocking(|| {
        RedisServer::start(
            Clock::Real,
            Listen::Unix,
            &[
                "--enable-debug-command",
                "yes",
                "--key-load-delay",
                "100",
                "--loading-process-events-interval-bytes",
                "1024",
            ],
        )
    })
    .await
    .unwrap();
    let s = RedisStore::connect(
        RedisSettings::new(server.url(), "mm"),
        RetentionPolicy::default(),
    )
    .await
    .unwrap();
    assert!(server.raw("DEBUG POPULATE 30000").starts_with("+OK"));
    // 30,000 keys at 100 µs each: the reload keeps the server loading for about 3 s.
    let _reload = send_and_leave(&server, "DEBUG RELOAD");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mb = mailbox("u-loading", 1);
    let result = s.append(&group(&mb, 1, TODAY0, 1, "a")).await;
    assert!(is_transient(&result), "{result:?}");
    assert!(
        format!("{result:?}").to_lowercase().contains("loading"),
        "{result:?}"
    );
}

/// A server that is gone refuses connections: transient, for a connected store and for a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_transient() {
    use mailbox_materializer::model::RetentionPolicy;
    use mailbox_materializer::store::redis::{RedisSettings, RedisStore};
    use support::redis_server::{Clock, Listen, RedisServer};
    let port = support::redis_server::free_port();
    let mut server = tokio::task::spawn_blocking(move || {
        RedisServer::start(Clock::Real, Listen::Tcp(port), &[])
    })
    .await
    .unwrap();
    let s = RedisStore::connect(
        RedisSettings::new(server.url(), "mm"),
        RetentionPolicy::default(),
    )
    .await
    .unwrap();
    server.stop();
    let mb = mailbox("u-gone", 1);
    let result = s.append(&group(&mb, 1, TODAY0, 1, "a")).await;
    assert!(is_transient(&result), "{result:?}");
    assert!(is_transient(&s.ping().await));
    let fresh = RedisStore::connect(
        RedisSettings::new(server.url(), "mm"),
        RetentionPolicy::default(),
    )
    .await;
    assert!(is_transient(&fresh), "{fresh:?}");
}

/// SPEC 4.2 and 4.4 as amended, the Redis keys one by one: a new seq written into a live day
/// whose bucket was lost is `corrupt` (it would make the bucket look whole again), and so is a
/// scan of a mailbox whose day set was lost (its page would claim coverage up to
/// `seqbucket_max_seq` of groups it never looked for); a bucket emptied by a truncate is no
/// damage, and a new seq goes into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bucket_or_day_set_is_corrupt_and_a_truncated_day_is_not() {
    use mailbox_materializer::model::{ScanRequest, StoreError};
    let f = RedisFixture::start(policy(), NOW0).await;
    let s = f.store.clone();
    let all = ScanRequest {
        after_seq: 0,
        until_seq: None,
        limit_groups: 100,
    };
    fn corrupt<T>(r: &Result<T, StoreError>) -> bool {
        matches!(r, Err(StoreError::Corrupt { .. }))
    }

    let lost = mailbox("u-lost-bucket", 1);
    let keys = MailboxKeys::new("mm", &lost);
    for seq in 1..=3 {
        assert_eq!(
            s.append(&group(&lost, seq, TODAY0, 1, "a")).await,
            Ok(AppendOutcome::Inserted)
        );
    }
    let _: i64 = f.cmd(redis::cmd("DEL").arg(keys.day(TODAY0))).await;
    let inserted = s.append(&group(&lost, 4, TODAY0, 1, "a")).await;
    assert!(corrupt(&inserted), "{inserted:?}");
    let exists: i64 = f.cmd(redis::cmd("EXISTS").arg(keys.day(TODAY0))).await;
    assert_eq!(exists, 0, "the lost bucket was not written anew");

    let no_days = mailbox("u-lost-days", 1);
    let keys = MailboxKeys::new("mm", &no_days);
    for seq in 1..=3 {
        s.append(&group(&no_days, seq, TODAY0, 1, "a"))
            .await
            .expect("append");
    }
    let _: i64 = f.cmd(redis::cmd("DEL").arg(&keys.days)).await;
    let scanned = s.range_scan(&no_days, all).await;
    assert!(corrupt(&scanned), "{scanned:?}");

    let trimmed = mailbox("u-trimmed-day", 1);
    for seq in 1..=3 {
        s.append(&group(&trimmed, seq, TODAY0 - 1, 1, "a"))
            .await
            .expect("append");
    }
    s.truncate_before(&trimmed, 4).await.expect("truncate");
    let after_trim = ScanRequest {
        after_seq: 3,
        ..all
    };
    let page = s.range_scan(&trimmed, after_trim).await.expect("no damage");
    assert!(page.groups.is_empty());
    assert_eq!(
        s.append(&group(&trimmed, 4, TODAY0 - 1, 1, "a")).await,
        Ok(AppendOutcome::Inserted),
        "a day emptied by a truncate takes new seqs"
    );
}
