//! A store that hands every call to an inner store except the few it changes: what a wrapper
//! that injects a fault, records the calls or fences a test implements, instead of forwarding
//! every method of [`MailboxStore`] by hand (and again each time the trait grows).
//!
//! A [`Wrapper`] names its inner store and overrides only what it watches: one group's
//! append, the appends in flight, taking and lifting a repair fence. Every other call goes to the
//! inner store unchanged, and a run is answered group by group through the wrapper's own
//! [`Wrapper::append`] unless the wrapper takes the run whole ([`Wrapper::append_run`]).

use async_trait::async_trait;

use super::{FenceView, MailboxStore, RepairToken, SeqPosition, SwapReport};
use crate::model::{
    AppendOutcome, EventGroup, MailboxId, MailboxInspection, PromoteOutcome, ScanPage, ScanRequest,
    StoreError, TruncateOutcome, UserId,
};

/// The calls a wrapper may change; every [`MailboxStore`] method not here goes to
/// [`inner`](Wrapper::inner).
#[async_trait]
pub trait Wrapper: Send + Sync {
    /// The store every call goes to.
    fn inner(&self) -> &dyn MailboxStore;

    /// One group's append (a run's groups come here one by one).
    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        self.inner().append(group).await
    }

    /// A run of one mailbox: by default its groups one by one through [`Wrapper::append`], so
    /// the wrapper sees each group; a wrapper that must see the run as the one call a backend
    /// makes of it (a fault that loses a whole call's answers) overrides it.
    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        super::each_in_order(run, |group| Wrapper::append(self, group)).await
    }

    fn max_appends_in_flight(&self) -> Option<usize> {
        self.inner().max_appends_in_flight()
    }

    async fn repair_fence(
        &self,
        token: &RepairToken,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.inner().repair_fence(token, lease).await
    }

    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        self.inner().repair_abort(token).await
    }
}

#[async_trait]
impl<W: Wrapper> MailboxStore for W {
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }

    fn max_appends_in_flight(&self) -> Option<usize> {
        Wrapper::max_appends_in_flight(self)
    }

    fn promoted_buckets_total(&self) -> u64 {
        self.inner().promoted_buckets_total()
    }

    async fn append(&self, group: &EventGroup) -> Result<AppendOutcome, StoreError> {
        Wrapper::append(self, group).await
    }

    async fn append_run(&self, run: &[&EventGroup]) -> Vec<Result<AppendOutcome, StoreError>> {
        Wrapper::append_run(self, run).await
    }

    async fn truncate_before(
        &self,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.inner().truncate_before(mailbox, before_seq).await
    }

    async fn range_scan(
        &self,
        mailbox: &MailboxId,
        request: ScanRequest,
    ) -> Result<ScanPage, StoreError> {
        self.inner().range_scan(mailbox, request).await
    }

    async fn promote(&self, mailbox: &MailboxId) -> Result<PromoteOutcome, StoreError> {
        self.inner().promote(mailbox).await
    }

    async fn inspect(&self, mailbox: &MailboxId) -> Result<MailboxInspection, StoreError> {
        self.inner().inspect(mailbox).await
    }

    async fn repair_fence(
        &self,
        token: &RepairToken,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        Wrapper::repair_fence(self, token, lease).await
    }

    async fn repair_renew(
        &self,
        token: &RepairToken,
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.inner().repair_renew(token, lease).await
    }

    async fn repair_append_run(
        &self,
        token: &RepairToken,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        self.inner().repair_append_run(token, run).await
    }

    async fn repair_truncate(
        &self,
        token: &RepairToken,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        self.inner()
            .repair_truncate(token, mailbox, before_seq)
            .await
    }

    async fn repair_swap(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        self.inner().repair_swap(token).await
    }

    async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
        Wrapper::repair_abort(self, token).await
    }

    async fn repair_collect_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        self.inner().repair_collect_garbage(dry_run).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner().ping().await
    }

    async fn fence_of(&self, user: &UserId) -> Result<Option<FenceView>, StoreError> {
        self.inner().fence_of(user).await
    }

    async fn seq_positions(&self, mailbox: &MailboxId) -> Result<Vec<SeqPosition>, StoreError> {
        self.inner().seq_positions(mailbox).await
    }
}
