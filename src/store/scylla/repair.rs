//! Repair on Scylla (SPEC 7.1): the fence on the user row, the staging slot, the swap.
//!
//! - **Fence**: `fence_holder` and `fence_until` (seconds of the store's clock) on the user row,
//!   written `USING TTL` (lease plus [`FENCE_TTL_MARGIN`]) so a fence nobody renews also vanishes
//!   server-side. Taking, renewing and lifting it are commits on the user's version like any
//!   other write, and every live write reads the fence in the snapshot its commit is conditioned
//!   on: a live write and a fence change are therefore totally ordered.
//! - **Staging**: the slot that is not live. `repair_begin` resets it in the same commit that
//!   takes the fence; staged writes are ordinary appends and truncates on that slot, admitted only
//!   while the token holds a fence that has not lapsed.
//! - **Swap**: one commit that flips `live_slot` to the staging slot, lifts the fence and deletes
//!   the replaced slot; the replaced generation's event partitions are deleted after it.
//! - **Garbage**: every repair registers itself in `repair_registry` before it takes the fence;
//!   abort and garbage collection remove the staging slot of a repair whose fence is gone or
//!   lapsed, then its registration.

use std::time::Duration;

use super::commit::Commit;
use super::state::{fence_lost, unsigned, ReadAt, Slot};
use super::{Attempt, ScyllaStore};
use crate::model::StoreError;
use crate::store::classify::cql;
use crate::store::{RepairToken, SwapReport};

/// How much longer than its lease the server keeps a fence: the lease itself is judged by the
/// store's clock; the server's TTL only removes fences of repairs that died. The margin absorbs
/// clock differences between the repair's process and the server.
const FENCE_TTL_MARGIN: u64 = 60;

fn lease_secs(lease: Duration) -> u64 {
    lease.as_secs().clamp(1, i32::MAX as u64 / 2)
}

fn fence_ttl(lease: u64) -> i32 {
    (lease + FENCE_TTL_MARGIN).min(i32::MAX as u64) as i32
}

/// What garbage collection found for one registered repair.
enum Garbage {
    /// Its fence is live: the repair runs.
    Running,
    /// Its staging slot (and lapsed fence) were removed.
    Removed(Slot),
    /// Nothing of it is left (or its slot now belongs to another repair): only the registration.
    Stale,
}

impl ScyllaStore {
    pub(super) async fn begin_repair(
        &self,
        token: &RepairToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let u = token.user.as_str();
        // Registered before the fence is taken: a repair that dies holding it is always found.
        self.write(&self.statements.registry_insert, (u, token.holder.as_str()))
            .await?;
        match self
            .settle(ReadAt::Serial, |now, _| self.try_begin(token, lease, now))
            .await
        {
            Ok(previous) => {
                // The previous staging copy's slot was reset by the commit; its event rows and
                // the registrations of repairs that can no longer swap go now.
                self.drop_generation(u, &previous).await?;
                self.forget_other_repairs(u, &token.holder).await?;
                Ok(())
            }
            Err(e) => {
                let _ = self
                    .write(&self.statements.registry_delete, (u, token.holder.as_str()))
                    .await;
                Err(e)
            }
        }
    }

    async fn try_begin(
        &self,
        token: &RepairToken,
        lease: Duration,
        now: u64,
    ) -> Result<Attempt<Slot>, StoreError> {
        let u = token.user.as_str();
        let snapshot = self.read_snapshot(u, &[], ReadAt::Serial).await?;
        if let Some(fence) = snapshot.fence.as_ref().filter(|f| f.live(now)) {
            return Ok(Attempt::Done(Err(StoreError::UnderRepair {
                holder: fence.holder.clone(),
            })));
        }
        let staging = snapshot.staging_slot();
        let lease = lease_secs(lease);
        let mut commit = Commit::new(&self.statements, u, snapshot.version);
        commit.set_fence(&token.holder, now + lease, fence_ttl(lease));
        commit.delete_slot(staging);
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        Ok(Attempt::Done(Ok(snapshot.slot(staging).clone())))
    }

    pub(super) async fn renew_repair(
        &self,
        token: &RepairToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let u = token.user.as_str();
        self.settle(ReadAt::Serial, |now, read| async move {
            let snapshot = self.read_snapshot(u, &[], read).await?;
            match &snapshot.fence {
                // Only the holder renews, and only a fence that has not lapsed: live writes may
                // have passed a lapsed one.
                Some(fence) if fence.holder == token.holder && fence.live(now) => {
                    let lease = lease_secs(lease);
                    let mut commit = Commit::new(&self.statements, u, snapshot.version);
                    commit.set_fence(&token.holder, now + lease, fence_ttl(lease));
                    if self.commit(commit).await? {
                        Ok(Attempt::Done(Ok(())))
                    } else {
                        Ok(Attempt::Retry)
                    }
                }
                _ => Ok(Attempt::Done(Err(fence_lost(token)))),
            }
        })
        .await
    }

    pub(super) async fn swap_repair(&self, token: &RepairToken) -> Result<SwapReport, StoreError> {
        let u = token.user.as_str();
        let (report, replaced) = self
            .settle(ReadAt::Serial, |now, _| self.try_swap(token, now))
            .await?;
        // The swap is committed: the rebuilt copy is live and the fence lifted. What follows is
        // clean-up of unreachable rows; its failure leaves garbage for the patrol, never a
        // failed repair (a rerun would rebuild a mailbox that is already right).
        let partitions = match self.drop_generation(u, &replaced).await {
            Ok(partitions) => partitions,
            Err(e) => {
                tracing::warn!(user = u, error = %e, "swap committed; the replaced copy's rows are left for the patrol");
                0
            }
        };
        if let Err(e) = self
            .write(&self.statements.registry_delete, (u, token.holder.as_str()))
            .await
        {
            tracing::warn!(user = u, error = %e, "swap committed; the repair's registration is left for the patrol");
        }
        Ok(SwapReport {
            replaced: report.replaced + partitions,
            ..report
        })
    }

    async fn try_swap(
        &self,
        token: &RepairToken,
        now: u64,
    ) -> Result<Attempt<(SwapReport, Slot)>, StoreError> {
        let u = token.user.as_str();
        let snapshot = self.read_snapshot(u, &[], ReadAt::Serial).await?;
        match &snapshot.fence {
            Some(fence) if fence.holder == token.holder && fence.live(now) => {}
            _ => return Ok(Attempt::Done(Err(fence_lost(token)))),
        }
        let staging = snapshot.staging_slot();
        let live = snapshot.live_slot;
        let staged_groups = self
            .slot_identities(u, staging, 0, i64::MAX)
            .await?
            .iter()
            .filter(|(_, e, _)| unsigned(*e) > now)
            .count() as u64;
        let replaced_rows = self.slot_identities(u, live, 0, i64::MAX).await?.len() as u64
            + u64::from(snapshot.slot(live).generation.is_some());
        let mut commit = Commit::new(&self.statements, u, snapshot.version);
        commit.set_live_slot(staging);
        commit.clear_fence();
        commit.delete_slot(live);
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        Ok(Attempt::Done(Ok((
            SwapReport {
                staged_groups,
                replaced: replaced_rows,
            },
            snapshot.slot(live).clone(),
        ))))
    }

    pub(super) async fn abort_repair(&self, token: &RepairToken) -> Result<(), StoreError> {
        let u = token.user.as_str();
        let garbage = self
            .settle(ReadAt::Serial, |now, _| {
                self.try_collect(u, &token.holder, true, false, now)
            })
            .await?;
        if let Garbage::Removed(slot) = &garbage {
            self.drop_generation(u, slot).await?;
        }
        self.write(&self.statements.registry_delete, (u, token.holder.as_str()))
            .await?;
        Ok(())
    }

    /// Removes the staging copy of a repair of `user` by `holder` if no repair can swap it any
    /// more: the fence is gone or lapsed (or, for `own`, held by `holder` itself, which is
    /// aborting). A live fence of another repair means the staging slot is that repair's.
    /// `dry_run` decides the same and changes nothing (`patrol --dry-run`).
    async fn try_collect(
        &self,
        user: &str,
        holder: &str,
        own: bool,
        dry_run: bool,
        now: u64,
    ) -> Result<Attempt<Garbage>, StoreError> {
        let snapshot = self.read_snapshot(user, &[], ReadAt::Serial).await?;
        if let Some(fence) = snapshot.fence.as_ref().filter(|f| f.live(now)) {
            if fence.holder != holder {
                return Ok(Attempt::Done(Ok(Garbage::Stale)));
            }
            if !own {
                return Ok(Attempt::Done(Ok(Garbage::Running)));
            }
        }
        let staging = snapshot.staging_slot();
        let slot = snapshot.slot(staging).clone();
        if snapshot.fence.is_none() && slot.generation.is_none() {
            return Ok(Attempt::Done(Ok(Garbage::Stale)));
        }
        if dry_run {
            return Ok(Attempt::Done(Ok(Garbage::Removed(slot))));
        }
        let mut commit = Commit::new(&self.statements, user, snapshot.version);
        if snapshot.fence.is_some() {
            commit.clear_fence();
        }
        commit.delete_slot(staging);
        if !self.commit(commit).await? {
            return Ok(Attempt::Retry);
        }
        Ok(Attempt::Done(Ok(Garbage::Removed(slot))))
    }

    /// The patrol's collection (`dry_run`: counts what it would remove, changes nothing).
    pub(super) async fn collect_repair_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        let result = self
            .session
            .execute_unpaged(&self.statements.registry_all, ())
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let entries = rows
            .rows::<(String, String)>()
            .map_err(cql::from)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(cql::from)?;
        let mut removed = 0;
        for (user, holder) in entries {
            match self
                .settle(ReadAt::Serial, |now, _| {
                    self.try_collect(&user, &holder, false, dry_run, now)
                })
                .await?
            {
                Garbage::Running => continue,
                Garbage::Removed(_) if dry_run => {
                    removed += 1;
                    continue;
                }
                Garbage::Removed(slot) => {
                    self.drop_generation(&user, &slot).await?;
                    removed += 1;
                }
                Garbage::Stale if dry_run => continue,
                Garbage::Stale => {}
            }
            self.write(
                &self.statements.registry_delete,
                (user.as_str(), holder.as_str()),
            )
            .await?;
        }
        Ok(removed)
    }

    /// Deletes the registrations of `user`'s repairs other than `holder`'s: their staging copies
    /// were replaced when `holder` took the fence.
    async fn forget_other_repairs(&self, user: &str, holder: &str) -> Result<(), StoreError> {
        let result = self
            .session
            .execute_unpaged(&self.statements.registry_of_user, (user,))
            .await
            .map_err(cql::from)?;
        let rows = result.into_rows_result().map_err(cql::from)?;
        let others: Vec<String> = rows
            .rows::<(String,)>()
            .map_err(cql::from)?
            .filter_map(|r| r.ok().map(|(h,)| h))
            .filter(|h| h != holder)
            .collect();
        for other in others {
            self.write(&self.statements.registry_delete, (user, other.as_str()))
                .await?;
        }
        Ok(())
    }
}
