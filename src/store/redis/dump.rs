//! A user's keys by name, for `inspect --dump` and the repair's clean-up.

use super::*;

impl RedisStore {
    /// Every key name `user` may hold (fence, both epoch keys, and every key of the epoch each
    /// copy names plus `extra_epochs`), named exactly (`lua/user_keys.lua`), never by a pattern
    /// that could match another deployment's keys. Some names may not exist.
    pub async fn user_key_names(
        &self,
        user: &UserId,
        extra_epochs: &[u32],
    ) -> Result<Vec<String>, StoreError> {
        let keys = keys::UserKeys::new(&self.settings.key_prefix, user);
        let mut invocation = self.scripts.user_keys.prepare_invoke();
        invocation
            .key(&keys.repair)
            .key(&keys.live_epoch)
            .key(&keys.staging_epoch)
            .arg(&keys.live_stem)
            .arg(&keys.staging_stem)
            .arg(keys::tag(user))
            .arg(self.policy.retention_days)
            .arg(self.policy.future_window_days);
        for epoch in extra_epochs {
            invocation.arg(*epoch);
        }
        let names: Vec<String> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(classified)?;
        Ok(names)
    }

    /// Every existing key of `user` (see [`RedisStore::user_key_names`]) with its serialized value
    /// (`DUMP`) and absolute expiry in ms (`PEXPIRETIME`), sorted by key: a byte-exact fingerprint
    /// of the user's state in both copies, fence included.
    pub async fn dump_user(
        &self,
        user: &UserId,
        extra_epochs: &[u32],
    ) -> Result<Vec<(String, Vec<u8>, i64)>, StoreError> {
        let mut names = self.user_key_names(user, extra_epochs).await?;
        names.sort();
        names.dedup();
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("DUMP").arg(name).cmd("PEXPIRETIME").arg(name);
        }
        let replies: Vec<Value> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(classified)?;
        let mut out = Vec::new();
        for (name, pair) in names.into_iter().zip(replies.chunks(2)) {
            if let [Value::BulkString(dump), expire] = pair {
                out.push((name, dump.clone(), int(expire).unwrap_or(-2)));
            }
        }
        Ok(out)
    }
}
