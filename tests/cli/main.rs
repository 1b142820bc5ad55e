//! The operator commands as a user runs them (SPEC 7.1 and 8): the built binary, JSON on stdout,
//! exit statuses, against real servers.
//!
//! - `memory`, `redis`, `scylla`: the store commands of SPEC 8.1 on each backend.
//! - `batches`: `apply`, `replay` and the daemon at their batch and run boundaries on every
//!   topology (SPEC 7.2 "Batches are invisible").
//! - `replay_repair`: `replay --reset-mailboxes`, every refusal, kill -9 at each step.
//! - `dlq`: dead letters listed, shown and re-driven after their cause is fixed.
//! - `top`: the live view of running replicas, `--once --json` and the UI under tmux.
//! - `check_config`: `check-config --connect` against the real servers.
//! - `readme`: the README's walk on Redis, run as written.
//! - `contract`: SPEC 8.2's one exit table and error object, every command in its failure modes.
//! - `eviction`: a Redis that evicts keys refused, and scans that never claim what they did not read.
//! - `compacted_repair`: a repair refused on a compacted topic whose cleaner ran (SPEC 7.1).
//! - `log_positions`: a cut-over to a new topic, a replay and a re-drive decided by the log's
//!   positions (SPEC 7.2).

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "../conformance/mod.rs"]
mod conformance;
#[path = "../support/mod.rs"]
mod support;

mod batches;
mod check_config;
mod compacted_repair;
mod contract;
mod dlq;
mod docs;
mod eviction;
mod log_positions;
mod memory;
mod readme;
mod redis;
mod replay_repair;
mod scylla;
mod top;
