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
//! - [`store`]: the [`store::MailboxStore`] trait (the contract of SPEC section 4), the
//!   [`store::Clock`], and one module per backend: [`store::memory`] (the executable reference).
//! - [`ingest`]: decoding dispatch records ([`ingest::decode`]) and applying them to a store
//!   ([`ingest::apply`]); reaches a store only through the trait.
//! - [`demo`]: the synthetic dispatch log of `materializer demo`.
//! - [`config`]: the TOML configuration with environment overrides and validation.
//! - [`cli`]: the `materializer` commands; wires config, stores and ingest together.
//!
//! `src/bin/materializer.rs` only parses the command line and calls [`cli::main`].

pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod disposition;
pub mod ingest;
pub mod model;
pub mod retry;
pub mod store;
