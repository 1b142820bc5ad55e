//! The drive loop against the memory store: each verdict, each dead-letter answer, a closed
//! source, and the read-ahead rule at its boundaries.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::*;
use crate::ingest::decode::{decode_record, DEFAULT_MAX_RECORD_BYTES};
use crate::model::{AppendOutcome, EventGroup, MailboxId, RetentionPolicy, ScanRequest};
use crate::store::memory::MemoryStore;
use crate::store::wrapper::Wrapper;
use crate::store::SystemClock;

/// The memory store answering `unavailable` to its first `failures` appends, and once to the
/// first append of the seq `fail_seq` names (0: none).
struct Flaky {
    inner: MemoryStore,
    failures: AtomicU32,
    fail_seq: std::sync::atomic::AtomicU64,
    appends: AtomicU32,
}

#[async_trait]
impl Wrapper for Flaky {
    fn inner(&self) -> &dyn MailboxStore {
        &self.inner
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
            || self
                .fail_seq
                .compare_exchange(group.mailbox_seq, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
        if failing {
            return Err(StoreError::Unavailable {
                backend: "memory",
                detail: "injected".to_owned(),
            });
        }
        self.inner.append(group).await
    }
}

fn flaky(failures: u32) -> Arc<Flaky> {
    Arc::new(Flaky {
        inner: MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock)),
        failures: AtomicU32::new(failures),
        fail_seq: std::sync::atomic::AtomicU64::new(0),
        appends: AtomicU32::new(0),
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A dispatch of one group to each of `users`, at `seq` in their mailboxes.
fn record(users: &[&str], seq: u64) -> Result<DispatchRecord, DecodeError> {
    let deliveries: Vec<String> = users
        .iter()
        .map(|u| {
            format!(
                r#"{{"user_id": "{u}", "epoch": 1, "mailbox_seq": {seq},
                    "events": [{{"event_ordinal": 0, "payload": {{"seq": {seq}}}}}]}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"dispatch_id": "g/{seq}", "group_id": "g", "committed_at": {}, "deliveries": [{}]}}"#,
        now_ms(),
        deliveries.join(",")
    );
    decode_record(json.as_bytes(), DEFAULT_MAX_RECORD_BYTES)
}

/// A policy that answers every not-final result with `verdict`, counting what it is told.
struct Fixed {
    verdict: fn(u32) -> Verdict<String>,
    not_final: Vec<(DeliveryRef, u32, Disposition)>,
    finals: Vec<DeliveryRef>,
    letters: Vec<i64>,
    done_at_once: bool,
}

impl Fixed {
    fn new(verdict: fn(u32) -> Verdict<String>) -> Self {
        Self {
            verdict,
            not_final: Vec::new(),
            finals: Vec::new(),
            letters: Vec::new(),
            done_at_once: true,
        }
    }
}

impl Policy<u8, ()> for Fixed {
    type Stop = String;

    fn not_final(
        &mut self,
        step: Step<'_, u8>,
        _state: &mut (),
        _result: &Result<DeliveryOutcome, StoreError>,
        disposition: Disposition,
    ) -> Verdict<String> {
        self.not_final.push((step.at, step.attempt, disposition));
        (self.verdict)(step.attempt)
    }

    fn delivery_final(
        &mut self,
        step: Step<'_, u8>,
        _state: &mut (),
        _result: &Result<DeliveryOutcome, StoreError>,
    ) {
        self.finals.push(step.at);
    }

    fn dead_letter(&mut self, _source: &u8, settled: Settled) -> bool {
        self.letters.push(settled.offset);
        self.done_at_once
    }
}

/// The window's meta is the record's offset.
type TestDriver = Driver<u8, (), i64, ()>;

fn driver(store: Arc<Flaky>) -> TestDriver {
    let mut driver = Driver::new(store);
    assert!(driver.open(0, 16, ()));
    assert!(!driver.open(0, 16, ()), "a source opens once");
    driver
}

/// Handles answers until every window is empty or the policy stops the run.
async fn drain(driver: &mut TestDriver, policy: &mut Fixed) -> Result<Vec<i64>, String> {
    let mut finals = Vec::new();
    loop {
        for (_, window) in driver.windows_mut() {
            finals.extend(window.pipeline.pop_final().into_iter().map(|r| r.meta));
        }
        if driver.is_empty() {
            return Ok(finals);
        }
        let attempt = driver.next().await;
        driver.handle(attempt, policy)?;
    }
}

#[tokio::test]
async fn a_retry_verdict_tries_again_and_the_lane_waits_behind_it() {
    let store = flaky(2);
    let mut driver = driver(store.clone());
    let mut policy = Fixed::new(|_| Verdict::Retry(Duration::from_millis(1)));
    assert!(driver.admit(0, 10, (), 1, 10, record(&["u-1"], 1), &mut policy));
    assert!(driver.admit(0, 11, (), 1, 11, record(&["u-1"], 2), &mut policy));
    assert!(
        !driver.admit(0, 11, (), 1, 11, record(&["u-1"], 2), &mut policy),
        "a redelivered offset is ignored"
    );
    let finals = drain(&mut driver, &mut policy).await.expect("no stop");
    assert_eq!(finals, vec![10, 11], "final in source order");
    let first = DeliveryRef {
        offset: 10,
        index: 0,
    };
    assert_eq!(
        policy.not_final,
        vec![
            (
                first,
                0,
                Disposition::Retry {
                    under_repair: false
                }
            ),
            (
                first,
                1,
                Disposition::Retry {
                    under_repair: false
                }
            ),
        ],
        "the two failures were the head's; the second record never started before it was final"
    );
    assert_eq!(store.appends.load(Ordering::SeqCst), 4);
    assert_eq!(driver.window(&0).map(|w| w.calls()), Some(0));
}

#[tokio::test]
async fn a_final_verdict_reports_the_result_and_the_lane_moves_on() {
    let store = flaky(1);
    let mut driver = driver(store.clone());
    let mut policy = Fixed::new(|_| Verdict::Final);
    assert!(driver.admit(0, 1, (), 1, 1, record(&["u-1"], 1), &mut policy));
    assert!(driver.admit(0, 2, (), 1, 2, record(&["u-1"], 2), &mut policy));
    let mut window = Vec::new();
    while window.len() < 2 {
        let attempt = driver.next().await;
        driver.handle(attempt, &mut policy).expect("no stop");
        window.extend(driver.window_mut(&0).expect("open").pipeline.pop_final());
    }
    assert!(matches!(
        window[0].deliveries[0].1,
        Err(StoreError::Unavailable { .. })
    ));
    assert!(window[1].deliveries[0].1.is_ok());
    assert_eq!(policy.finals.len(), 2);
    assert_eq!(store.appends.load(Ordering::SeqCst), 2, "no retry");
}

#[tokio::test]
async fn a_stop_verdict_ends_the_run_with_the_policys_reason() {
    let mut driver = driver(flaky(5));
    let mut policy = Fixed::new(|attempt| {
        if attempt + 1 >= 3 {
            Verdict::Stop(format!("gave up after {} attempts", attempt + 1))
        } else {
            Verdict::Retry(Duration::from_millis(1))
        }
    });
    assert!(driver.admit(0, 1, (), 1, 1, record(&["u-1"], 1), &mut policy));
    let stop = drain(&mut driver, &mut policy).await;
    assert_eq!(stop, Err("gave up after 3 attempts".to_owned()));
    assert!(policy.finals.is_empty());
}

#[tokio::test]
async fn a_refused_record_is_final_only_once_its_dead_letter_is_done() {
    let mut driver = driver(flaky(0));
    let mut policy = Fixed::new(|_| Verdict::Retry(Duration::ZERO));
    policy.done_at_once = false;
    let malformed = decode_record(b"{\"not\": \"a record\"}", DEFAULT_MAX_RECORD_BYTES);
    assert!(malformed.is_err());
    assert!(driver.admit(0, 7, (), 1, 7, malformed, &mut policy));
    assert_eq!(policy.letters, vec![7]);
    let pipeline = &mut driver.window_mut(&0).expect("open").pipeline;
    assert!(pipeline.pop_final().is_empty(), "waits for its letter");
    driver.dead_lettered(&0, 7);
    let pipeline = &mut driver.window_mut(&0).expect("open").pipeline;
    assert_eq!(pipeline.pop_final().len(), 1);
    assert!(driver.is_empty());

    // A policy that reports refusals itself: final at once.
    policy.done_at_once = true;
    let malformed = decode_record(b"[]", DEFAULT_MAX_RECORD_BYTES);
    assert!(driver.admit(0, 8, (), 1, 8, malformed, &mut policy));
    let pipeline = &mut driver.window_mut(&0).expect("open").pipeline;
    assert_eq!(pipeline.pop_final().len(), 1);
}

#[tokio::test]
async fn a_closed_source_starts_nothing_and_its_late_answers_are_ignored() {
    let store = flaky(1);
    let mut driver = driver(store.clone());
    let mut policy = Fixed::new(|_| Verdict::Retry(Duration::from_millis(1)));
    assert!(driver.admit(0, 1, (), 1, 1, record(&["u-1"], 1), &mut policy));
    driver.begin_close(&0);
    assert!(
        !driver.admit(0, 2, (), 1, 2, record(&["u-2"], 1), &mut policy),
        "a closing source admits nothing"
    );
    assert!(!driver.room_for_more(&0, 0));
    // The call already started comes back (cancelled or answered) and is not retried.
    let attempt = driver.next().await;
    driver.handle(attempt, &mut policy).expect("no stop");
    assert_eq!(driver.window(&0).map(|w| w.calls()), Some(0));
    let closed = driver.close(&0).expect("was open");
    assert!(closed.is_closing());
    assert!(store.appends.load(Ordering::SeqCst) <= 1, "never retried");

    // Reopened: a new generation, and answers of the old one would be ignored.
    assert!(driver.open(0, 16, ()));
    assert_ne!(
        driver.window(&0).map(|w| w.generation()),
        Some(closed.generation())
    );
}

#[tokio::test]
async fn the_read_ahead_stops_at_a_batch_and_at_a_full_window() {
    let mut driver: TestDriver = Driver::new(flaky(0));
    let mut policy = Fixed::new(|_| Verdict::Final);
    assert!(!driver.room_for_more(&0, 0), "no window, no reading");
    driver.open(0, 3, ());
    assert!(driver.room_for_more(&0, MAX_BATCH - 1));
    assert!(!driver.room_for_more(&0, MAX_BATCH));
    for offset in 0..3 {
        assert!(
            driver.room_for_more(&0, 0),
            "{offset} records in a window of 3"
        );
        let user = format!("u-{offset}");
        assert!(driver.admit(0, offset, (), 1, offset, record(&[&user], 1), &mut policy));
    }
    assert!(!driver.room_for_more(&0, 0), "full");
}

#[tokio::test]
async fn a_run_stopped_by_a_retry_goes_on_after_it_in_source_order() {
    let store = flaky(0);
    store.fail_seq.store(3, Ordering::SeqCst);
    let mut driver = driver(store.clone());
    let mut policy = Fixed::new(|_| Verdict::Retry(Duration::from_millis(1)));
    for seq in 1..=5 {
        let offset = seq as i64;
        assert!(driver.admit(0, offset, (), 1, offset, record(&["u-1"], seq), &mut policy));
    }
    let finals = drain(&mut driver, &mut policy).await.expect("no stop");
    assert_eq!(finals, vec![1, 2, 3, 4, 5], "final in source order");
    let third = DeliveryRef {
        offset: 3,
        index: 0,
    };
    assert_eq!(
        policy.not_final,
        vec![(
            third,
            0,
            Disposition::Retry {
                under_repair: false
            }
        )],
        "only seq 3 failed; 4 and 5 were not reached, not failed"
    );
    // 1 alone; the run 2, 3 (stopped there); 3 again; the run 4, 5.
    assert_eq!(store.appends.load(Ordering::SeqCst), 6);
    let mailbox = MailboxId::new(crate::model::UserId::parse("u-1").expect("id"), 1);
    let page = store
        .inner
        .range_scan(
            &mailbox,
            ScanRequest {
                after_seq: 0,
                until_seq: None,
                limit_groups: 10,
            },
        )
        .await
        .expect("scan");
    let seqs: Vec<u64> = page.groups.iter().map(|g| g.mailbox_seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    assert_eq!(driver.window(&0).map(|w| w.calls()), Some(0));
}

/// The memory store answering `corrupt` to every append of `user`.
struct CorruptUser {
    inner: MemoryStore,
    user: &'static str,
    appends: AtomicU32,
}

#[async_trait]
impl Wrapper for CorruptUser {
    fn inner(&self) -> &dyn MailboxStore {
        &self.inner
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        if group.mailbox.user_id.as_str() == self.user {
            self.appends.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::corrupt(crate::model::CorruptKind::IndexLost));
        }
        self.inner.append(group).await
    }
}

#[tokio::test]
async fn a_corrupt_answer_taken_as_final_holds_the_mailbox_for_the_rest_of_the_run() {
    let store = Arc::new(CorruptUser {
        inner: MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock)),
        user: "u-bad",
        appends: AtomicU32::new(0),
    });
    let mut driver: TestDriver = Driver::new(store.clone());
    assert!(driver.open(0, 16, ()));
    let mut policy = Fixed::new(|_| Verdict::Final);
    // The bad user's later records come both before its first answer (already in the window)
    // and after it (admitted once the answer is in).
    assert!(driver.admit(0, 1, (), 1, 1, record(&["u-bad", "u-ok"], 1), &mut policy));
    assert!(driver.admit(0, 2, (), 1, 2, record(&["u-bad"], 2), &mut policy));
    let mut finals = Vec::new();
    while driver.window(&0).is_some_and(|w| w.calls() > 0) {
        let attempt = driver.next().await;
        driver.handle(attempt, &mut policy).expect("no stop");
        if let Some(window) = driver.window_mut(&0) {
            finals.extend(window.pipeline.pop_final());
        }
    }
    assert!(driver.admit(0, 3, (), 1, 3, record(&["u-bad", "u-ok"], 3), &mut policy));
    loop {
        if let Some(window) = driver.window_mut(&0) {
            finals.extend(window.pipeline.pop_final());
        }
        if driver.is_empty() {
            break;
        }
        let attempt = driver.next().await;
        driver.handle(attempt, &mut policy).expect("no stop");
    }
    let summary: Vec<(i64, Vec<&str>, Vec<&str>)> = finals
        .iter()
        .map(|r| {
            let answered = r
                .deliveries
                .iter()
                .map(|(d, result)| match result {
                    Err(StoreError::Corrupt { .. }) => "corrupt",
                    Ok(_) if d.mailbox().user_id.as_str() == "u-ok" => "u-ok applied",
                    _ => "other",
                })
                .collect();
            let held = r
                .held
                .iter()
                .map(|d| d.mailbox().user_id.as_str())
                .collect();
            (r.meta, answered, held)
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, vec!["corrupt", "u-ok applied"], vec![]),
            (2, vec![], vec!["u-bad"]),
            (3, vec!["u-ok applied"], vec!["u-bad"]),
        ],
        "the corrupt mailbox answers once; its later deliveries are held, the others flow"
    );
    assert_eq!(
        store.appends.load(Ordering::SeqCst),
        1,
        "nothing more is written to a mailbox that answered corrupt"
    );
}
