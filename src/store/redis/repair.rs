//! The repair's housekeeping on Redis: fence leases and the staging copies of crashed repairs.

use super::*;

impl RedisStore {
    /// Lease of a fence in whole milliseconds, at least one.
    pub(super) fn lease_ms(lease: Duration) -> u64 {
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Removes the staging copies of users without a fence, walking `P:stgepoch:{*` with SCAN on
    /// every master; one script per user decides atomically (`lua/repair_collect.lua`).
    /// The patrol's collection (`dry_run`: the script decides the same and removes nothing).
    pub(super) async fn collect_staging_garbage(&self, dry_run: bool) -> Result<u64, StoreError> {
        let prefix = &self.settings.key_prefix;
        let pattern = keys::staging_epoch_pattern(prefix);
        let mut collected = 0;
        for mut node in self.scan_targets().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = scan_batch(&mut node, cursor, &pattern).await?;
                for key in batch {
                    let Some(user) = keys::parse_staging_epoch_key(prefix, &key) else {
                        continue;
                    };
                    let keys = keys::UserKeys::new(prefix, &user);
                    let mut invocation = self.scripts.repair_collect.prepare_invoke();
                    invocation
                        .key(&keys.repair)
                        .key(&keys.staging_epoch)
                        .arg(&keys.staging_stem)
                        .arg(keys::tag(&user))
                        .arg(self.policy.retention_days)
                        .arg(self.policy.future_window_days)
                        .arg(u8::from(dry_run));
                    let reply = self.invoke(invocation).await?;
                    if reply.first().and_then(int) == Some(1) && dry_run {
                        collected += 1;
                    } else if reply.first().and_then(int) == Some(1) {
                        tracing::info!(user = %user.as_str(), removed_keys = num(reply.get(1)), "removed the staging copy of a crashed repair");
                        collected += 1;
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(collected)
    }
}
