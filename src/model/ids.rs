//! Identifiers of a mailbox: `user_id`, `epoch`, `mailbox_seq` (SPEC section 2).

use std::fmt;
use std::sync::Arc;

/// Largest valid `mailbox_seq`: 16 decimal digits, so a seq always fits the zero-padded
/// 16-character member of the Redis identity index.
pub const MAX_MAILBOX_SEQ: u64 = 9_999_999_999_999_999;

/// Longest valid `user_id`, in bytes.
pub(crate) const MAX_USER_ID_LEN: usize = 128;

/// Why a string is not a valid `user_id`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserIdError {
    #[error("user_id is empty")]
    Empty,
    #[error("user_id is {0} bytes long; at most {MAX_USER_ID_LEN} are allowed")]
    TooLong(usize),
    #[error("user_id contains {0:?} at byte {1}; only [A-Za-z0-9._:@-] are allowed")]
    BadCharacter(char, usize),
}

/// A validated user id: 1..=128 bytes of `[A-Za-z0-9._:@-]`.
///
/// `{` and `}` are excluded because the user id becomes a Redis hash tag; the other excluded
/// characters keep it safe in keys, CQL and log lines. Cheap to clone (shared string).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(Arc<str>);

impl UserId {
    /// Validates `raw` and wraps it.
    pub fn parse(raw: &str) -> Result<Self, UserIdError> {
        if raw.is_empty() {
            return Err(UserIdError::Empty);
        }
        if raw.len() > MAX_USER_ID_LEN {
            return Err(UserIdError::TooLong(raw.len()));
        }
        if let Some((at, ch)) = raw
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')))
        {
            return Err(UserIdError::BadCharacter(ch, at));
        }
        Ok(Self(Arc::from(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for UserId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for UserId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserId({:?})", &*self.0)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One mailbox: the ordered event store of one `(user_id, epoch)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MailboxId {
    pub user_id: UserId,
    pub epoch: u32,
}

impl MailboxId {
    pub fn new(user_id: UserId, epoch: u32) -> Self {
        Self { user_id, epoch }
    }
}

impl fmt::Display for MailboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.user_id, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_id_accepts_the_documented_alphabet() {
        assert!(UserId::parse("u-17").is_ok());
        assert!(UserId::parse("A.b_c:d@e-0").is_ok());
        assert!(UserId::parse(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn user_id_rejects_hash_tag_braces_and_bounds() {
        assert_eq!(UserId::parse(""), Err(UserIdError::Empty));
        assert_eq!(
            UserId::parse(&"x".repeat(129)),
            Err(UserIdError::TooLong(129))
        );
        assert_eq!(
            UserId::parse("a{b}"),
            Err(UserIdError::BadCharacter('{', 1))
        );
        assert_eq!(UserId::parse("a b"), Err(UserIdError::BadCharacter(' ', 1)));
        assert_eq!(UserId::parse("é"), Err(UserIdError::BadCharacter('é', 0)));
    }
}
