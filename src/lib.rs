//! # mailbox-materializer
//!
//! Consumes a dispatch log of `GroupDispatch` records and materializes them into per-user
//! mailboxes on Redis, ScyllaDB or an in-memory store. A log replay is idempotent, a replay into
//! another day bucket is a conflict, natural retention expiry becomes a gap boundary (never a
//! trim), and corruption fails closed until an operator replays the mailbox from the log.
//!
//! # Layout (lowest layer first; `layers` holds the rule and the test that keeps it)
//!
//! - Leaves, which import nothing else of the crate: [`model`] (identifiers, event groups,
//!   retention arithmetic, outcomes, errors and their one classification), [`retry`] (the one
//!   backoff), [`allocator`] (how the binary returns memory), and the helpers `locks`,
//!   `wall_clock` and `url_redact`.
//! - [`demo`] (the synthetic dispatch log of `materializer demo`) and `disposition` (a delivery's
//!   result to an action: advance, dead-letter, block, retry), on [`model`].
//! - [`store`]: the [`store::MailboxStore`] trait (the contract of SPEC section 4, and the repair
//!   of 7.1 in [`store::repair`]), the [`store::Clock`], one module per backend
//!   ([`store::memory`], the executable reference; [`store::redis`]; [`store::scylla`]), and
//!   [`store::classify`], the one place native store errors get their class. It never reads the
//!   configuration.
//! - [`ingest`]: decoding records, the ordering core (windows, lanes, watermark) and the store
//!   calls in flight; reaches a store only through the trait.
//! - [`config`]: the TOML configuration with environment overrides and validation.
//! - [`daemon`]: `materializer run` (Kafka intake, engine, dead letters, offsets, telemetry,
//!   health).
//! - [`operator`]: what the operator commands do over a range of the log with the daemon's
//!   Kafka clients: `replay`, `verify` and the dead-letter reader.
//! - [`cli`]: the `materializer` commands; loads the configuration, opens the store once
//!   ([`cli::open_store::open`], the one place a configuration becomes a store) and hands both on.
//!
//! `src/bin/materializer.rs` only parses the command line and calls [`cli::main`].

pub mod allocator;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub(crate) mod disposition;
pub mod ingest;
mod layers;
pub(crate) mod locks;
pub mod model;
pub mod operator;
pub mod retry;
pub(crate) mod splitmix;
pub mod store;
pub(crate) mod url_redact;
pub(crate) mod wall_clock;
