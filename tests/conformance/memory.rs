//! The memory store as a conformance harness: the reference other backends are compared with.

use std::sync::Arc;

use super::{Fixture, Harness};
use async_trait::async_trait;
use mailbox_materializer::model::{MailboxId, RetentionPolicy, UserId};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::{MailboxStore, ManualClock};

/// Makes memory stores on a [`ManualClock`].
#[derive(Debug, Clone, Copy)]
pub struct MemoryHarness;

struct MemoryFixture {
    store: Arc<MemoryStore>,
    clock: ManualClock,
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn fixture(&self, policy: RetentionPolicy, now_secs: u64) -> Box<dyn Fixture> {
        let clock = ManualClock::new(now_secs);
        let store = Arc::new(MemoryStore::new(policy, Arc::new(clock.clone())));
        Box::new(MemoryFixture { store, clock })
    }
}

#[async_trait]
impl Fixture for MemoryFixture {
    fn store(&self) -> Arc<dyn MailboxStore> {
        self.store.clone()
    }

    async fn set_now(&self, now_secs: u64) {
        self.clock.set(now_secs);
    }

    async fn jump_during_next_scan(&self, now_secs: u64) {
        let clock = self.clock.clone();
        let store = Arc::downgrade(&self.store);
        self.store
            .set_after_scan_read_hook(Some(super::one_shot_hook(
                move || clock.set(now_secs),
                move || {
                    if let Some(store) = store.upgrade() {
                        store.set_after_scan_read_hook(None);
                    }
                },
            )));
    }

    async fn corrupt(&self, mailbox: &MailboxId, corruption: Corruption) -> bool {
        self.store.inject(mailbox, &corruption)
    }

    async fn fingerprint(&self, user: &UserId) -> String {
        self.store.debug_dump(user)
    }
}
