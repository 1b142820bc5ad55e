//! # mailbox-materializer
//!
//! Consumes a dispatch log of `GroupDispatch` records and materializes them into per-user
//! mailboxes on Redis, ScyllaDB or an in-memory store. A log replay is idempotent, a replay into
//! another day bucket is a conflict, natural retention expiry becomes a gap boundary (never a
//! trim), and corruption fails closed until an operator replays the mailbox from the log.
//!
//! # Layout
//!
//! - [`model`]: identifiers, event groups, retention arithmetic, outcomes and errors. Imports
//!   nothing else of the crate.
//! - [`store`]: the [`store::MailboxStore`] trait (the contract of SPEC section 4, and the repair
//!   of 7.1 in [`store::repair`]), the [`store::Clock`], one module per backend
//!   ([`store::memory`], the executable reference; [`store::redis`]; [`store::scylla`]), and
//!   [`store::classify`], the one place native store errors get their class, and
//!   [`store::open`], the one place a configuration becomes a store.
//! - [`ingest`]: decoding records, the ordering core (windows, lanes, watermark) and the store
//!   calls in flight; reaches a store only through the trait.
//! - [`disposition`]: the one table from a delivery's result to an action (advance, dead-letter,
//!   block, retry).
//! - [`retry`]: the one backoff (capped exponential with jitter).
//! - [`daemon`]: `materializer run` (Kafka intake, engine, dead letters, offsets, telemetry,
//!   health) and `materializer replay`.
//! - [`demo`]: the synthetic dispatch log of `materializer demo`.
//! - [`config`]: the TOML configuration with environment overrides and validation.
//! - [`cli`]: the `materializer` commands; loads the configuration, opens the store once and
//!   hands both on.
//! - [`allocator`]: how the binary's allocator returns memory (part of the memory bound).
//!
//! `src/bin/materializer.rs` only parses the command line and calls [`cli::main`].

pub mod allocator;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub(crate) mod disposition;
pub mod ingest;
pub mod model;
pub mod retry;
pub mod store;
