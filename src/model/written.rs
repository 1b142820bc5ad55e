//! What a seq's stored version keeps of the write that made it, beside its log position: the
//! token of the delivery that wrote it and whether that write inserted or replaced.
//!
//! Why: a store call whose answer is lost (a failover, a client time-out, a Paxos round that
//! timed out with an unknown outcome) may have applied. Its retry then finds its own version
//! stored, identical, and the store alone would answer `unchanged`, where the write's true
//! outcome was `inserted` or `replaced` (what the log applied once says, and what
//! `groups_total` must count). Every delivery read from the log carries a [`WriteToken`] of its
//! own, unique to that reading of the record in that process; the store keeps the token and the
//! answer with the position, and an identical write that brings the **same** token is the very
//! delivery whose earlier attempt wrote the version: it is answered as that attempt was
//! ([`rules::identical_answer`](super::rules::identical_answer)). Anything else identical —
//! another replica, a re-read after a rebalance or a crash, an operator's `replay` — reads the
//! record anew, with a new token, and is `unchanged`, as SPEC 4.2 says.
//!
//! Stored form (Redis's `pos:<seq>` meta field, Scylla's `source_position` column, memory's
//! snapshot): the position, then `|i<token>` or `|r<token>` (16 hex digits), as
//! [`encode`] writes it. A position without the suffix (a write of an older release, or of a
//! delivery without a token) is still read as the same position and fences as before; it only
//! never matches a token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::group::SourcePosition;

/// Names every attempt of one delivery (see the module docs). Unique in a process (a counter)
/// and, with the counter's random start, across processes: two processes collide only if their
/// starts lie within the number of deliveries either reads, one chance in about 2^64 / that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct WriteToken(u64);

impl WriteToken {
    /// The next token of this process.
    pub fn next() -> Self {
        static NEXT: OnceLock<AtomicU64> = OnceLock::new();
        let next = NEXT.get_or_init(|| AtomicU64::new(random_start()));
        Self(next.fetch_add(1, Ordering::Relaxed))
    }

    /// A token with this value (tests, the simulator).
    pub fn from_raw(value: u64) -> Self {
        Self(value)
    }

    /// 16 lower-case hex digits: the form stored and sent to the Redis scripts.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// A random start for the counter, from the standard library's per-process hash keys, the
/// time and the process id (no crate of ours: the model imports nothing).
fn random_start() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.finish()
}

/// The write that made a seq's stored version: its delivery's token and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct WriteMark {
    pub token: WriteToken,
    /// `true`: the write replaced an older version (`replaced`); `false`: it inserted the seq.
    pub replaced: bool,
}

impl WriteMark {
    pub fn inserted(token: WriteToken) -> Self {
        Self {
            token,
            replaced: false,
        }
    }

    pub fn replaced(token: WriteToken) -> Self {
        Self {
            token,
            replaced: true,
        }
    }
}

/// The stored form of a version's position and mark (see the module docs).
pub(crate) fn encode(position: &SourcePosition, mark: Option<WriteMark>) -> String {
    match mark {
        None => position.encode(),
        Some(mark) => format!(
            "{}|{}{}",
            position.encode(),
            if mark.replaced { 'r' } else { 'i' },
            mark.token.hex()
        ),
    }
}

/// The position and mark of a stored form; the position `None` for anything that is not one
/// (an older release's bare `partition:offset`), the mark `None` where the suffix is absent or
/// unreadable.
pub(crate) fn decode(text: &str) -> (Option<SourcePosition>, Option<WriteMark>) {
    let (position, suffix) = match text.split_once('|') {
        Some((position, suffix)) => (position, Some(suffix)),
        None => (text, None),
    };
    let mark = suffix.and_then(|suffix| {
        let replaced = match suffix.as_bytes().first()? {
            b'i' => false,
            b'r' => true,
            _ => return None,
        };
        let hex = suffix.get(1..)?;
        (hex.len() == 16)
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
            .map(|token| WriteMark {
                token: WriteToken(token),
                replaced,
            })
    });
    (SourcePosition::decode(position), mark)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LogId;

    #[test]
    fn a_stored_position_reads_back_with_its_mark_and_an_older_one_without() {
        let log = LogId::topic_id("dlBrrJzJRhCCROWDuUG5EQ").expect("log");
        let at = SourcePosition::new(log, 3, 1_234);
        let token = WriteToken::from_raw(0x00ab_cdef_0123_4567);
        let text = encode(&at, Some(WriteMark::replaced(token)));
        assert_eq!(text, "3:1234@id:dlBrrJzJRhCCROWDuUG5EQ|r00abcdef01234567");
        assert_eq!(
            decode(&text),
            (Some(at.clone()), Some(WriteMark::replaced(token)))
        );
        let text = encode(&at, Some(WriteMark::inserted(token)));
        assert_eq!(
            decode(&text),
            (Some(at.clone()), Some(WriteMark::inserted(token)))
        );
        // An older release's form, and damaged suffixes: the position still fences.
        assert_eq!(decode(&at.encode()), (Some(at.clone()), None));
        assert_eq!(
            decode(&format!("{}|x0", at.encode())),
            (Some(at.clone()), None)
        );
        assert_eq!(decode(&format!("{}|i12", at.encode())), (Some(at), None));
        assert_eq!(decode("3:1234"), (None, None));
    }

    #[test]
    fn tokens_of_one_process_never_repeat() {
        let a = WriteToken::next();
        let b = WriteToken::next();
        assert_ne!(a, b);
        assert_eq!(a.hex().len(), 16);
    }
}
