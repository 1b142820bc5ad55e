//! Key building for the V4 layout (SPEC 5), in one place. Every key of a user carries the user's
//! hash tag `{user_id}`, so all of them live in one Redis Cluster slot and every script is
//! Cluster-safe.
//!
//! # Two copies of a user, one fence
//!
//! A user has a **live** copy (the SPEC 5 keys) and, only while `replay --reset-mailboxes`
//! rebuilds it, a **staging** copy with the same shape under other kind words, plus the repair
//! **fence** (SPEC 7.1):
//!
//! | live | staging |
//! |---|---|
//! | `P:epoch:{U}` | `P:stgepoch:{U}` |
//! | `P:mbmeta:{U}:E` | `P:stgmbmeta:{U}:E` |
//! | `P:mbseqbucket:{U}:E` | `P:stgmbseqbucket:{U}:E` |
//! | `P:mbdays:{U}:E` | `P:stgmbdays:{U}:E` |
//! | `P:mbday:{U}:E:D` | `P:stgmbday:{U}:E:D` |
//! | `P:repair:{U}` (the fence, shared) | |
//!
//! Why the staging kinds are one word (`stgmbmeta`) and not a second segment (`stg:mbmeta`): a
//! prefix may contain `:` but never `{`, so the text before a key's first `{` is always
//! `<prefix>:<kind>:`, and the kind is its last segment. `P:stg:mbmeta:{U}:E` would read as the
//! live meta of a deployment whose prefix is `P:stg`; `P:stgmbmeta:{U}:E` reads only as a staging
//! key of prefix `P`, because no live kind is called `stgmbmeta`. SCAN patterns follow the same
//! rule and end the kind with `:{` (`P:stgepoch:\{*`), so they never match another prefix's keys.

use crate::model::{MailboxId, UserId};

/// Which copy of a user a set of keys names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySet {
    /// The SPEC 5 keys every reader sees.
    Live,
    /// A repair's rebuild, swapped in as a whole by `lua/repair_swap.lua`.
    Staging,
}

impl KeySet {
    /// The text every key of this copy starts with, up to the kind word: `P:` or `P:stg`.
    /// The scripts append the kind (`epoch:`, `mbmeta:`, ...) to it.
    pub fn stem(self, prefix: &str) -> String {
        match self {
            Self::Live => format!("{prefix}:"),
            Self::Staging => format!("{prefix}:stg"),
        }
    }
}

/// The keys of one `(user, epoch)` in one copy, in the order the write scripts take them as
/// `KEYS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxKeys {
    /// `P:` (live) or `P:stg` (staging): passed to the scripts to name other epochs' keys.
    pub stem: String,
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
    /// `P:repair:{user}`: the fence of `replay --reset-mailboxes` (the repair's holder id, with
    /// a lease TTL); absent in normal operation. The same key for both copies.
    pub repair: String,
    /// `KEYS[7]`: the store marker of the user's slot (`P:store:{T}`, see `store_marker`) when
    /// the store is known to hold data there, else `repair` again (nothing to check).
    pub marker: String,
}

/// `{user_id}`: the hash tag shared by every key of a user.
pub fn tag(user: &UserId) -> String {
    format!("{{{}}}", user.as_str())
}

impl MailboxKeys {
    /// The live keys of a mailbox.
    pub fn new(prefix: &str, mailbox: &MailboxId) -> Self {
        Self::of(prefix, mailbox, KeySet::Live)
    }

    /// The staging keys of a mailbox.
    pub fn staging(prefix: &str, mailbox: &MailboxId) -> Self {
        Self::of(prefix, mailbox, KeySet::Staging)
    }

    pub fn of(prefix: &str, mailbox: &MailboxId, copy: KeySet) -> Self {
        let stem = copy.stem(prefix);
        let tag = tag(&mailbox.user_id);
        let epoch = mailbox.epoch;
        Self {
            epoch: format!("{stem}epoch:{tag}"),
            meta: format!("{stem}mbmeta:{tag}:{epoch}"),
            seqbucket: format!("{stem}mbseqbucket:{tag}:{epoch}"),
            days: format!("{stem}mbdays:{tag}:{epoch}"),
            day_prefix: format!("{stem}mbday:{tag}:{epoch}:"),
            repair: repair_key(prefix, &mailbox.user_id),
            marker: repair_key(prefix, &mailbox.user_id),
            stem,
        }
    }

    /// Passes the seven keys to a script, as `KEYS[1..7]` in this order. Every mailbox script
    /// takes the same seven (some use fewer), so the order is written down once.
    pub fn bind(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        invocation
            .key(&self.epoch)
            .key(&self.meta)
            .key(&self.seqbucket)
            .key(&self.days)
            .key(&self.day_prefix)
            .key(&self.repair)
            .key(&self.marker);
    }

    /// `P:mbday:{user}:<epoch>:<day>`
    pub fn day(&self, day: u64) -> String {
        format!("{}{day}", self.day_prefix)
    }
}

/// The keys of a user that do not depend on an epoch: the live and staging epoch keys and the
/// fence. Everything else of the user is named from the epochs they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserKeys {
    pub live_stem: String,
    pub staging_stem: String,
    /// `P:epoch:{user}`
    pub live_epoch: String,
    /// `P:stgepoch:{user}`
    pub staging_epoch: String,
    /// `P:repair:{user}`
    pub repair: String,
}

impl UserKeys {
    pub(crate) fn new(prefix: &str, user: &UserId) -> Self {
        let tag = tag(user);
        let live_stem = KeySet::Live.stem(prefix);
        let staging_stem = KeySet::Staging.stem(prefix);
        Self {
            live_epoch: format!("{live_stem}epoch:{tag}"),
            staging_epoch: format!("{staging_stem}epoch:{tag}"),
            repair: repair_key(prefix, user),
            live_stem,
            staging_stem,
        }
    }
}

/// `P:repair:{user}`: the repair fence of a user.
pub(crate) fn repair_key(prefix: &str, user: &UserId) -> String {
    format!("{prefix}:repair:{}", tag(user))
}

/// The pattern matching every live meta key of prefix `P` (for the patrol's SCAN), and no key
/// of a deployment whose prefix merely starts with `P:mbmeta`.
pub(crate) fn meta_pattern(prefix: &str) -> String {
    format!("{prefix}:mbmeta:\\{{*")
}

/// The pattern matching every staging epoch key of prefix `P`: one per user with a staging copy
/// (for the garbage collection of crashed repairs).
pub(crate) fn staging_epoch_pattern(prefix: &str) -> String {
    format!("{}epoch:\\{{*", KeySet::Staging.stem(prefix))
}

/// Parses `P:mbmeta:{user}:<epoch>` back into its mailbox.
pub(crate) fn parse_meta_key(prefix: &str, key: &str) -> Option<MailboxId> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":mbmeta:{")?;
    let (user, epoch) = rest.rsplit_once("}:")?;
    Some(MailboxId::new(
        UserId::parse(user).ok()?,
        epoch.parse().ok()?,
    ))
}

/// Parses `P:stgepoch:{user}` back into its user.
pub(crate) fn parse_staging_epoch_key(prefix: &str, key: &str) -> Option<UserId> {
    let user = key
        .strip_prefix(&KeySet::Staging.stem(prefix))?
        .strip_prefix("epoch:{")?
        .strip_suffix('}')?;
    UserId::parse(user).ok()
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
pub(crate) fn parse_event_member(member: &str) -> Option<(u64, u32, u64, &str)> {
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
        assert_eq!(parse_meta_key("mm", "mm:stgmbmeta:{u}:7"), None);
    }

    #[test]
    fn staging_keys_mirror_the_live_ones_under_their_own_kinds() {
        let k = MailboxKeys::staging("mm", &mb("u-17", 3));
        assert_eq!(k.stem, "mm:stg");
        assert_eq!(k.epoch, "mm:stgepoch:{u-17}");
        assert_eq!(k.meta, "mm:stgmbmeta:{u-17}:3");
        assert_eq!(k.seqbucket, "mm:stgmbseqbucket:{u-17}:3");
        assert_eq!(k.days, "mm:stgmbdays:{u-17}:3");
        assert_eq!(k.day(20424), "mm:stgmbday:{u-17}:3:20424");
        assert_eq!(k.repair, "mm:repair:{u-17}");
        let u = UserKeys::new("mm", &mb("u-17", 3).user_id);
        assert_eq!(u.live_epoch, "mm:epoch:{u-17}");
        assert_eq!(u.staging_epoch, k.epoch);
        assert_eq!(
            parse_staging_epoch_key("mm", &k.epoch),
            Some(mb("u-17", 3).user_id)
        );
        assert_eq!(parse_staging_epoch_key("mm", "mm:epoch:{u-17}"), None);
        assert_eq!(parse_staging_epoch_key("m", "mm:stgepoch:{u-17}"), None);
    }

    /// The text before a key's first `{` is `<prefix>:<kind>:`; split it back.
    fn prefix_and_kind(key: &str) -> (&str, &str) {
        let head = &key[..key.find('{').expect("tagged")];
        let head = head.strip_suffix(':').expect("kind ends with ':'");
        head.rsplit_once(':').expect("prefix:kind")
    }

    #[test]
    fn no_key_of_one_prefix_reads_as_a_key_of_another() {
        // Prefixes that a naive `P:stg:` layout would confuse with `mm`'s staging keys.
        for prefix in ["mm", "mm:stg", "mm:stgmbmeta", "a.b:c"] {
            for copy in [KeySet::Live, KeySet::Staging] {
                let k = MailboxKeys::of(prefix, &mb("u-17", 3), copy);
                for key in [
                    &k.epoch,
                    &k.meta,
                    &k.seqbucket,
                    &k.days,
                    &k.day(9),
                    &k.repair,
                ] {
                    let (p, kind) = prefix_and_kind(key);
                    assert_eq!(p, prefix, "{key}");
                    let staged = kind.starts_with("stg");
                    assert_eq!(staged, copy == KeySet::Staging && kind != "repair", "{key}");
                }
            }
        }
        assert_eq!(meta_pattern("mm"), "mm:mbmeta:\\{*");
        assert_eq!(staging_epoch_pattern("mm"), "mm:stgepoch:\\{*");
    }

    #[test]
    fn members_sort_by_seq_then_ordinal_and_parse_back() {
        let a = event_member(9, 2, 5, "{\"a\":\"x|y\"}");
        let b = event_member(10, 0, 5, "1");
        assert!(a < b);
        assert_eq!(parse_event_member(&a), Some((9, 2, 5, "{\"a\":\"x|y\"}")));
    }
}
