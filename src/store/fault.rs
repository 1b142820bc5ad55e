//! Corruptions a test (or a drill) can inject into a mailbox, named for what the store must then
//! detect. Each backend maps them onto its own layout; the conformance suite uses one vocabulary.

/// A way a mailbox's stored state can be damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// Overwrite `retention_format_version` with another value (e.g. 3 for a V3 mailbox).
    FormatVersion(u32),
    /// Delete the whole identity index.
    LoseIdentityIndex,
    /// Remove one seq from the identity index (its events stay).
    LoseIdentity(u64),
    /// Delete the meta (identity index and buckets stay).
    LoseMeta,
    /// Remove the `bucket_max_seq` proof of one day (the day stays in the day set).
    BreakProof(u64),
    /// Take the expiry off the identity index (SPEC 5: its TTL is its largest score), as a
    /// `PERSIST` or a restore without TTL would: the index would outlive every group it names.
    /// Only a layout whose index is one key with one expiry can lose it (Redis); memory and
    /// Scylla keep each identity's expiry with the identity itself and answer false.
    LoseIdentityTtl,
    /// Lose every event of one live day, as an evicted or deleted Redis day bucket, lost Scylla
    /// rows or a partial restore would; the meta's proof, the day set and the identities stay.
    /// The memory store keeps a mailbox in one structure, which cannot lose a part of itself:
    /// it answers false.
    LoseDayEvents(u64),
    /// Delete the user's epoch record (Redis `P:epoch:{user}`; Scylla the user's slot pointer
    /// row), as a stray `DEL`, an eviction or a partial restore would. The memory store keeps a
    /// user in one structure: it answers false.
    LoseEpochKey,
    /// Delete the mailbox's day set (Redis `P:mbdays:{user}:<epoch>`). On Scylla the days are a
    /// column of the meta row, lost only with it (`LoseMeta`); memory keeps one structure: both
    /// answer false.
    LoseDaySet,
}
