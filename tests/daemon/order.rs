//! Per-mailbox order under the batched core: many users interleaved in each partition, their
//! deliveries sent to the store in batches, and one user's lane stalled by transient errors — every
//! user's groups still reach the store in source order, each exactly once.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use mailbox_materializer::model::{AppendOutcome, EventGroup, RetentionPolicy, StoreError};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::wrapper::Wrapper;
use mailbox_materializer::store::{MailboxStore, SystemClock};
use support::in_process::InProcessDaemon;
use support::kafka::{create_topic, produce, DaemonSetup};

/// The memory store, recording the order in which each user's appends succeed, and refusing
/// one user's first appends with a transient error (a stalled lane).
struct Recording {
    inner: MemoryStore,
    written: Mutex<BTreeMap<String, Vec<u64>>>,
    stall: Mutex<HashMap<String, u32>>,
}

#[async_trait]
impl Wrapper for Recording {
    fn inner(&self) -> &dyn MailboxStore {
        &self.inner
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        let user = group.mailbox.user_id.as_str().to_owned();
        {
            let mut stall = self.stall.lock().expect("lock");
            if let Some(left) = stall.get_mut(&user).filter(|left| **left > 0) {
                *left -= 1;
                return Err(StoreError::Unavailable {
                    backend: "memory",
                    detail: "stalled on purpose".to_owned(),
                });
            }
        }
        let outcome = self.inner.append(group).await;
        if outcome == Ok(AppendOutcome::Inserted) {
            self.written
                .lock()
                .expect("lock")
                .entry(user)
                .or_default()
                .push(group.mailbox_seq);
        }
        outcome
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_users_groups_reach_the_store_in_source_order_with_a_stalled_lane() {
    const USERS: u64 = 40;
    const SEQS: u64 = 60;
    let setup = DaemonSetup::new("order", None);
    create_topic(&setup.topic, 3).await;
    create_topic(&setup.dlq_topic, 1).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .expect("clock");
    // Round-robin over the users, so every batch mixes many lanes.
    let mut records = Vec::new();
    for seq in 1..=SEQS {
        for user in 0..USERS {
            let record = serde_json::json!({
                "dispatch_id": format!("{user}/{seq}"), "group_id": "g", "committed_at": now,
                "deliveries": [{"user_id": format!("o-{user}"), "epoch": 1, "mailbox_seq": seq,
                    "events": [{"event_ordinal": 0, "payload": {"n": seq}}]}]
            });
            records.push(((user % 3) as i32, record.to_string().into_bytes()));
        }
    }
    produce(&setup.topic, &records).await;

    let store = Arc::new(Recording {
        inner: MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock)),
        written: Mutex::default(),
        stall: Mutex::new(HashMap::from([("o-7".to_owned(), 25)])),
    });
    let mut config = setup.config();
    config.kafka.max_in_flight_records = 200;
    config.kafka.retry_initial_ms = 5;
    config.kafka.retry_max_ms = 20;
    let daemon = InProcessDaemon::spawn(&config, store.clone());
    daemon
        .wait_final(USERS * SEQS, Duration::from_secs(120))
        .await;
    daemon.stop().await;

    assert_eq!(
        store.stall.lock().expect("lock")["o-7"],
        0,
        "the lane was stalled"
    );
    let written = store.written.lock().expect("lock");
    assert_eq!(written.len() as u64, USERS);
    let expected: Vec<u64> = (1..=SEQS).collect();
    for (user, seqs) in written.iter() {
        assert_eq!(seqs, &expected, "{user}: in source order, each once");
    }
}
