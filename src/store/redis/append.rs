//! The write paths shared by the live copy and a repair's staging copy: the same scripts, bound
//! to the copy's keys, with the fence check of `fence_verdict` (`lua/includes/common.lua`).

use super::*;

/// The reply code of a write refused after its promote compacted days (`after_promote`).
const REFUSED_AFTER_PROMOTE: i64 = 7;

/// The ARGV entries of `lua/append.lua` before a group's members (ARGV[1..15]).
const APPEND_FIXED_ARGS: usize = 15;

/// The script error codes whose refusal is a delivery's final answer, as `lua/append_run.lua`
/// reads them (`,-1,-2,-3,`): derived from [`StoreError::is_final`] through the one mapping
/// of codes to errors, so the script holds no classification of its own.
fn final_codes() -> &'static str {
    static CODES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CODES.get_or_init(|| {
        let mut codes = String::from(",");
        for code in -100..0 {
            if ScriptCode::from_code(code).is_some()
                && super::invoke::reply_error(&[Value::Int(code)], &RetentionPolicy::default())
                    .is_final()
            {
                codes.push_str(&format!("{code},"));
            }
        }
        codes
    })
}

impl RedisStore {
    /// The invocation of `lua/append.lua` that appends `group` to `copy` (as `holder`): exactly
    /// what [`MailboxStore::append`] sends. Benchmarks pipe the very same commands to the server
    /// raw, as the baseline of the daemon's rate.
    pub fn append_invocation(
        &self,
        copy: KeySet,
        holder: &str,
        group: &EventGroup,
    ) -> redis::ScriptInvocation<'_> {
        let keys = self.keys_of(&group.mailbox, copy);
        let mut invocation = self.scripts.append.prepare_invoke();
        keys.bind(&mut invocation);
        self.push_append_args(&mut invocation, &keys, holder, group, false);
        invocation
    }

    /// The invocation of `lua/append_run.lua` for a run of valid groups of ONE mailbox (the
    /// caller checks both), each followed by its `lua/append.lua` ARGV.
    pub(super) fn append_run_invocation(
        &self,
        copy: KeySet,
        holder: &str,
        run: &[&EventGroup],
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.append_run.prepare_invoke();
        let Some(first) = run.first() else {
            return invocation;
        };
        let keys = self.keys_of(&first.mailbox, copy);
        keys.bind(&mut invocation);
        invocation.arg(final_codes());
        for group in run {
            self.push_append_args(&mut invocation, &keys, holder, group, true);
        }
        invocation
    }

    /// Pushes `lua/append.lua`'s ARGV for `group` on `keys`' copy, as its header lists them,
    /// straight onto `invocation` (no copy of the payloads on the way); `counted`: preceded by
    /// their number, as each group of `lua/append_run.lua`.
    fn push_append_args(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        keys: &MailboxKeys,
        holder: &str,
        group: &EventGroup,
        counted: bool,
    ) {
        let day = group.day();
        let mut events: Vec<&Event> = group.events.iter().collect();
        events.sort_by_key(|e| e.event_ordinal);
        if counted {
            invocation.arg(APPEND_FIXED_ARGS + events.len());
        }
        invocation
            .arg(&keys.stem)
            .arg(keys::tag(&group.mailbox.user_id))
            .arg(group.mailbox.epoch)
            .arg(group.mailbox_seq)
            .arg(format!("{:016}", group.mailbox_seq))
            .arg(day)
            .arg(self.policy.expires_at(day))
            .arg(
                day.saturating_sub(u64::from(self.policy.future_window_days))
                    .saturating_mul(crate::model::DAY_SECS),
            )
            .arg(self.policy.max_active_span_days)
            .arg(self.policy.retention_days)
            .arg(holder)
            .arg(self.wait_flag())
            .arg(events.len() + 1)
            .arg(
                group
                    .source
                    .as_ref()
                    .map(|s| s.encode())
                    .unwrap_or_default(),
            )
            .arg(group.token.map(|t| t.hex()).unwrap_or_default());
        for event in events {
            invocation.arg(event_member(
                group.mailbox_seq,
                event.event_ordinal,
                group.created_at,
                event.payload.as_str(),
            ));
        }
    }

    /// The answers of `lua/append_run.lua`'s reply for `run`: one per reply, a prefix of the
    /// run (the script stops after an answer that is not final).
    pub(super) fn append_run_reply(
        &self,
        reply: Vec<Value>,
        run: &[&EventGroup],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
        if reply.is_empty() || reply.len() > run.len() {
            return vec![Err(protocol(format!(
                "a run of {} groups answered {} replies",
                run.len(),
                reply.len()
            )))];
        }
        let mut answers = Vec::with_capacity(reply.len());
        for (item, group) in reply.into_iter().zip(run) {
            let answer = match item {
                Value::Array(items) => self.append_reply(items, group),
                other => Err(protocol(format!("{other:?}"))),
            };
            let stop = crate::store::ends_run(&answer);
            answers.push(answer);
            if stop {
                break;
            }
        }
        answers
    }

    /// Appends `group` to one copy. `holder` is empty for a live write (refused under any fence)
    /// or the repair's holder id for a staged write (refused unless that repair holds the fence).
    pub(super) async fn append_to(
        &self,
        copy: KeySet,
        holder: &str,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        validate_group(group)?;
        let invocation = self.append_invocation(copy, holder, group);
        let reply = self.invoke_durable(invocation).await?;
        self.append_reply(reply, group)
    }

    /// A write refused after its promote compacted days answers `{7, days, refusal...}`
    /// (`after_promote` in `lua/includes/promote.lua`): counts the days, which are applied, and
    /// leaves the refusal to be read as usual.
    fn unwrap_refusal_after_promote(&self, reply: &mut Vec<Value>) {
        if reply.first().and_then(int) == Some(REFUSED_AFTER_PROMOTE) {
            self.promoted.add(num(reply.get(1)));
            reply.drain(..2.min(reply.len()));
        }
    }

    /// The outcome of `lua/append.lua`'s reply for `group`.
    pub(super) fn append_reply(
        &self,
        reply: Vec<Value>,
        group: &EventGroup,
    ) -> Result<AppendOutcome, StoreError> {
        let mut reply = reply;
        self.unwrap_refusal_after_promote(&mut reply);
        if matches!(reply.first().and_then(int), Some(1..=5 | 8)) {
            self.promoted.add(num(reply.get(1)));
        }
        if matches!(reply.first().and_then(int), Some(1..=6 | 8)) {
            self.note_data(&group.mailbox.user_id);
        }
        match reply.first().and_then(int) {
            Some(1) => Ok(AppendOutcome::Inserted),
            Some(2) => Ok(AppendOutcome::Unchanged),
            Some(3) => Ok(AppendOutcome::Replaced),
            Some(4) => Ok(AppendOutcome::ExpiredMerged),
            Some(5) => Ok(AppendOutcome::Trimmed),
            Some(6) => Ok(AppendOutcome::StaleEpoch),
            Some(8) => {
                let held = reply.get(2).map(text).unwrap_or_default();
                let held = crate::model::SourcePosition::decode(&held);
                crate::model::rules::note_superseded(group, held.as_ref());
                Ok(AppendOutcome::Superseded)
            }
            _ => {
                // Cross-day and identity-missing replies name one side; add the other.
                match reply.first().and_then(int).and_then(ScriptCode::from_code) {
                    Some(ScriptCode::CrossDay) => reply.push(Value::Int(group.day() as i64)),
                    Some(ScriptCode::IdentityMissing) => {
                        reply.push(Value::Int(group.mailbox_seq as i64))
                    }
                    _ => {}
                }
                Err(self.script_error(&reply))
            }
        }
    }

    /// `truncate_before` on one copy; `holder` as in [`RedisStore::append_to`].
    pub(super) async fn truncate_in(
        &self,
        copy: KeySet,
        holder: &str,
        mailbox: &MailboxId,
        before_seq: u64,
    ) -> Result<TruncateOutcome, StoreError> {
        validate_before_seq(before_seq)?;
        let keys = self.keys_of(mailbox, copy);
        let mut invocation = self.scripts.truncate.prepare_invoke();
        keys.bind(&mut invocation);
        invocation
            .arg(mailbox.epoch)
            .arg(before_seq)
            .arg(holder)
            .arg(self.wait_flag());
        let mut reply = self.invoke_durable(invocation).await?;
        self.unwrap_refusal_after_promote(&mut reply);
        match reply.first().and_then(int) {
            Some(0) => {
                self.promoted.add(num(reply.get(3)));
                self.note_data(&mailbox.user_id);
                Ok(TruncateOutcome {
                    user_trim_seq: num(reply.get(1)),
                    removed_groups: num(reply.get(2)),
                })
            }
            _ => Err(self.script_error(&reply)),
        }
    }
}
