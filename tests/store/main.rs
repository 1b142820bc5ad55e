//! The store tests: the conformance suite (`tests/conformance/`, SPEC 4 and the repair of 7.1,
//! written once against the `MailboxStore` trait) on every backend and topology, and each
//! backend's own regressions.
//!
//! - `memory`: the suite on the memory store, the executable reference.
//! - `redis`: the suite, the Redis layout of SPEC 5 and identity TTLs, the memory-vs-Redis
//!   randomized comparison, on `redis-server` processes whose clock libfaketime moves.
//! - `redis_cluster`: the clock-still cases and the patrol on a 3-master Redis Cluster.
//! - `redis_durable`: durable before commit (`store.redis.wait_replicas`) with a real replica.
//! - `scylla`: the suite, crash convergence, concurrency and Paxos rounds on a real CQL server.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "../conformance/mod.rs"]
mod conformance;
#[path = "../support/mod.rs"]
mod support;

mod memory;
mod redis;
mod redis_cluster;
mod redis_durable;
mod scylla;
