//! The patrol: promote every mailbox, then collect crashed repairs' staging copies.

use super::*;

impl RedisStore {
    /// Promotes every mailbox whose meta key matches, walking every master with SCAN, at most
    /// `per_second` mailboxes a second, then removes the staging copies of crashed repairs
    /// ([`MailboxStore::repair_collect_garbage`]).
    pub async fn patrol(&self, per_second: u32) -> Result<PatrolReport, StoreError> {
        self.patrol_with(per_second, false, |_| {}).await
    }

    /// [`Self::patrol`], telling `on_visit` the report so far after each mailbox (the command's
    /// progress: a pass over millions of mailboxes runs for hours). With `dry_run` each mailbox
    /// is inspected and what its promote would compact at this machine's clock is counted
    /// ([`MailboxStore::promote_preview`]); nothing is changed.
    pub async fn patrol_with(
        &self,
        per_second: u32,
        dry_run: bool,
        mut on_visit: impl FnMut(&PatrolReport) + Send,
    ) -> Result<PatrolReport, StoreError> {
        let pattern = keys::meta_pattern(&self.settings.key_prefix);
        let mut report = PatrolReport {
            dry_run,
            ..PatrolReport::default()
        };
        let interval = Duration::from_secs_f64(1.0 / f64::from(per_second.max(1)));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for mut node in self.scan_targets().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = scan_batch(&mut node, cursor, &pattern).await?;
                for key in batch {
                    let Some(mailbox) = keys::parse_meta_key(&self.settings.key_prefix, &key)
                    else {
                        continue;
                    };
                    ticker.tick().await;
                    report.visited += 1;
                    let promoted = if dry_run {
                        self.promote_preview(&mailbox).await
                    } else {
                        self.promote(&mailbox).await
                    };
                    match promoted {
                        Ok(outcome) => report.expired_days += u64::from(outcome.expired_days),
                        Err(StoreError::Unavailable { .. }) => report.unavailable += 1,
                        Err(_) => report.corrupt += 1,
                    }
                    on_visit(&report);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        report.staging_collected = self.collect_staging_garbage(dry_run).await?;
        Ok(report)
    }
}

/// What one patrol pass did (with `dry_run`: would do; the counts mean the same).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PatrolReport {
    /// Present (true) only for `patrol --dry-run`: nothing was changed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    pub visited: u64,
    pub expired_days: u64,
    pub corrupt: u64,
    pub unavailable: u64,
    /// Staging copies of crashed repairs (no fence left) removed by this pass.
    pub staging_collected: u64,
}
