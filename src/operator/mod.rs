//! What the operator commands do beyond one store call, each over a range of the dispatch log:
//! `replay` (re-apply or rebuild mailboxes from a partition's records, `replay/`), `verify` (the
//! scrub that compares a range with the store, `verify/`) and the dead-letter topic's reader
//! behind `dlq` (`dlq_reader`). They reach Kafka with the daemon's clients (`daemon::kafka`,
//! `daemon::log_identity`, `daemon::topic_policy`) and the store through the drive loop every front
//! end shares (`ingest::drive`), and nothing of the daemon reaches them: a layer of their own
//! between the daemon and the command line (`layers.rs`).

pub(crate) mod dlq_reader;
pub mod replay;
pub mod verify;
