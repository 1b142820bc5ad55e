//! Time authority for backends that have no server clock of their own (memory, Scylla).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Gives the store "now" in whole seconds since the Unix epoch.
///
/// Retention works in whole days, so second resolution is exact enough, and it is what Redis
/// `TIME` gives the Lua scripts.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_secs(&self) -> u64;
}

/// The machine's wall clock; production.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_secs(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// A clock tests move by hand. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(now_secs: u64) -> Self {
        Self(Arc::new(AtomicU64::new(now_secs)))
    }

    pub fn set(&self, now_secs: u64) {
        self.0.store(now_secs, Ordering::SeqCst);
    }

    pub fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_secs(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
