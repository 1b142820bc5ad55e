//! Key building for the V4 layout (SPEC 5), in one place. Every key of a mailbox carries the
//! user's hash tag `{user_id}`, so all of them live in one Redis Cluster slot and every script is
//! Cluster-safe.

use crate::model::{MailboxId, UserId};

/// The keys of one `(user, epoch)`, in the order the scripts take them as `KEYS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxKeys {
    /// `P:epoch:{user}`
    pub epoch: String,
    /// `P:mbmeta:{user}:<epoch>`
    pub meta: String,
    /// `P:mbseqbucket:{user}:<epoch>`
    pub seqbucket: String,
    /// `P:mbdays:{user}:<epoch>`
    pub days: String,
    /// `P:mbday:{user}:<epoch>:` (a day number is appended)
    pub day_prefix: String,
    /// `P:repair:{user}`: the fence of `replay --reset-mailboxes` (the rebuilding writer's id,
    /// with a lease TTL); absent in normal operation.
    pub repair: String,
}

/// `{user_id}`: the hash tag shared by every key of a user.
pub fn tag(user: &UserId) -> String {
    format!("{{{}}}", user.as_str())
}

impl MailboxKeys {
    pub fn new(prefix: &str, mailbox: &MailboxId) -> Self {
        let tag = tag(&mailbox.user_id);
        let epoch = mailbox.epoch;
        Self {
            epoch: format!("{prefix}:epoch:{tag}"),
            meta: format!("{prefix}:mbmeta:{tag}:{epoch}"),
            seqbucket: format!("{prefix}:mbseqbucket:{tag}:{epoch}"),
            days: format!("{prefix}:mbdays:{tag}:{epoch}"),
            day_prefix: format!("{prefix}:mbday:{tag}:{epoch}:"),
            repair: repair_key(prefix, &mailbox.user_id),
        }
    }

    /// Passes the six keys to a script, as `KEYS[1..6]` in this order. Every script takes the
    /// same six (some use fewer), so the order is written down once.
    pub fn bind(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        invocation
            .key(&self.epoch)
            .key(&self.meta)
            .key(&self.seqbucket)
            .key(&self.days)
            .key(&self.day_prefix)
            .key(&self.repair);
    }

    /// `P:mbday:{user}:<epoch>:<day>`
    pub fn day(&self, day: u64) -> String {
        format!("{}{day}", self.day_prefix)
    }
}

/// `P:repair:{user}`: the repair fence of a user.
pub fn repair_key(prefix: &str, user: &UserId) -> String {
    format!("{prefix}:repair:{}", tag(user))
}

/// The pattern matching every meta key (for the patrol's SCAN).
pub fn meta_pattern(prefix: &str) -> String {
    format!("{prefix}:mbmeta:*")
}

/// The pattern matching every key of one user (for dumps and tests).
pub fn user_pattern(prefix: &str, user: &UserId) -> String {
    // The tag's braces are glob-literal; escape them for SCAN MATCH.
    format!("{prefix}:*\\{{{}\\}}*", user.as_str())
}

/// Parses `P:mbmeta:{user}:<epoch>` back into its mailbox.
pub fn parse_meta_key(prefix: &str, key: &str) -> Option<MailboxId> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":mbmeta:{")?;
    let (user, epoch) = rest.rsplit_once("}:")?;
    Some(MailboxId::new(
        UserId::parse(user).ok()?,
        epoch.parse().ok()?,
    ))
}

/// The member of a day bucket for one event: `seq16|ordinal10|created_at|payload`.
///
/// The zero-padded seq and ordinal make Redis's lexicographic order among equal scores the order
/// of (seq, ordinal), and a prefix test on 17 bytes finds a seq's members exactly even where two
/// seqs above 2^53 share a floating-point score.
pub fn event_member(seq: u64, ordinal: u32, created_at: u64, payload: &str) -> String {
    format!("{seq:016}|{ordinal:010}|{created_at}|{payload}")
}

/// The parts of a day bucket member.
pub fn parse_event_member(member: &str) -> Option<(u64, u32, u64, &str)> {
    let mut parts = member.splitn(4, '|');
    let seq = parts.next()?.parse().ok()?;
    let ordinal = parts.next()?.parse().ok()?;
    let created_at = parts.next()?.parse().ok()?;
    let payload = parts.next()?;
    Some((seq, ordinal, created_at, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mb(user: &str, epoch: u32) -> MailboxId {
        MailboxId::new(UserId::parse(user).unwrap(), epoch)
    }

    #[test]
    fn keys_follow_the_v4_layout() {
        let k = MailboxKeys::new("mm", &mb("u-17", 3));
        assert_eq!(k.epoch, "mm:epoch:{u-17}");
        assert_eq!(k.meta, "mm:mbmeta:{u-17}:3");
        assert_eq!(k.seqbucket, "mm:mbseqbucket:{u-17}:3");
        assert_eq!(k.days, "mm:mbdays:{u-17}:3");
        assert_eq!(k.day(20424), "mm:mbday:{u-17}:3:20424");
    }

    #[test]
    fn meta_keys_parse_back() {
        assert_eq!(
            parse_meta_key("mm", "mm:mbmeta:{u:1}:7"),
            Some(mb("u:1", 7))
        );
        assert_eq!(parse_meta_key("mm", "mm:mbdays:{u}:7"), None);
        assert_eq!(parse_meta_key("mm", "xx:mbmeta:{u}:7"), None);
    }

    #[test]
    fn members_sort_by_seq_then_ordinal_and_parse_back() {
        let a = event_member(9, 2, 5, "{\"a\":\"x|y\"}");
        let b = event_member(10, 0, 5, "1");
        assert!(a < b);
        assert_eq!(parse_event_member(&a), Some((9, 2, 5, "{\"a\":\"x|y\"}")));
    }
}
