//! Test machinery, compiled only with the `failpoints` feature (the crate's own tests turn it on
//! through a dev-dependency; a release build never has it):
//!
//! - an injected failure after the `n`-th write of the store, as if the process died there, for
//!   the crash-convergence tests;
//! - a hook run just before every commit, after the operation decided on its snapshot, so a test
//!   can race another writer into that window;
//! - a hook run once between a scan's identity read and its event read, so a test can commit a
//!   replace (and its deletion of the old rows) exactly there;
//! - a hook run once between a replace's commit and its deletion of the old version's rows, so
//!   a test can freeze a writer there (a zombie) while a newer owner writes.
//!
//! Without the feature, [`Failpoints`] is empty and its checks compile to nothing.

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Mutex;

    use crate::model::StoreError;
    use crate::store::scylla::{lock, ScyllaStore, BACKEND};
    use crate::store::PhaseHook;

    pub(in crate::store::scylla) struct Failpoints {
        /// Writes left before an injected failure; negative when disarmed.
        left: AtomicI64,
        before_commit: Mutex<Option<PhaseHook>>,
        between_scan_reads: Mutex<Option<PhaseHook>>,
        after_replace_commit: Mutex<Option<PhaseHook>>,
    }

    impl Default for Failpoints {
        fn default() -> Self {
            Self {
                left: AtomicI64::new(-1),
                before_commit: Mutex::new(None),
                between_scan_reads: Mutex::new(None),
                after_replace_commit: Mutex::new(None),
            }
        }
    }

    impl Failpoints {
        /// Counts one write; fails the operation there when it was the armed one.
        pub(crate) fn after_write(&self) -> Result<(), StoreError> {
            if self.left.load(Ordering::SeqCst) < 0 {
                return Ok(());
            }
            if self.left.fetch_sub(1, Ordering::SeqCst) - 1 == 0 {
                self.left.store(-1, Ordering::SeqCst);
                return Err(StoreError::Unavailable {
                    backend: BACKEND,
                    detail: "injected failure after a write (failpoint)".to_owned(),
                });
            }
            Ok(())
        }

        pub(crate) async fn before_commit(&self) {
            let hook = lock(&self.before_commit).clone();
            if let Some(hook) = hook {
                hook().await;
            }
        }

        /// Runs (and removes) the hook between a replace's commit and its clean-up.
        pub(crate) async fn after_replace_commit(&self) {
            let hook = lock(&self.after_replace_commit).take();
            if let Some(hook) = hook {
                hook().await;
            }
        }

        /// Runs (and removes) the hook between a scan's identity and event reads.
        pub(crate) async fn between_scan_reads(&self) {
            let hook = lock(&self.between_scan_reads).take();
            if let Some(hook) = hook {
                hook().await;
            }
        }
    }

    impl ScyllaStore {
        /// Makes the `n`-th write from now fail after it has been executed (n >= 1), aborting
        /// the operation there as a crash would; `None` disarms.
        pub fn arm_failpoint(&self, n: Option<u32>) {
            self.failpoints
                .left
                .store(n.map_or(-1, i64::from), Ordering::SeqCst);
        }

        /// Installs (or clears) the hook run just before every commit.
        pub fn set_before_commit_hook(&self, hook: Option<PhaseHook>) {
            *lock(&self.failpoints.before_commit) = hook;
        }

        /// Installs the hook run once, by the next replace, between its commit and its
        /// deletion of the old version's rows.
        pub fn set_after_replace_commit_hook(&self, hook: Option<PhaseHook>) {
            *lock(&self.failpoints.after_replace_commit) = hook;
        }

        /// Installs the hook run once, by the next scan, between its identity read and its
        /// event read.
        pub fn set_between_scan_reads_hook(&self, hook: Option<PhaseHook>) {
            *lock(&self.failpoints.between_scan_reads) = hook;
        }
    }
}

#[cfg(feature = "failpoints")]
pub(super) use armed::Failpoints;

#[cfg(not(feature = "failpoints"))]
#[derive(Default)]
pub(super) struct Failpoints {
    _off: (),
}

#[cfg(not(feature = "failpoints"))]
impl Failpoints {
    #[inline(always)]
    pub(crate) fn after_write(&self) -> Result<(), crate::model::StoreError> {
        Ok(())
    }

    #[inline(always)]
    pub(crate) async fn before_commit(&self) {}

    #[inline(always)]
    pub(crate) async fn between_scan_reads(&self) {}

    #[inline(always)]
    pub(crate) async fn after_replace_commit(&self) {}
}
