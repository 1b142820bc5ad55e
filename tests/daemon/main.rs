//! The daemon (`materializer run`) against a real Kafka broker, redis-server and CQL server:
//! SPEC 7 and 9. The expected state is always the memory reference fed the same records in the
//! same per-partition order.
//!
//! - `kafka`: end to end, kill -9, rebalances, pauses, dead letters, memory during a catch-up.
//! - `failures` and `faults`: inputs and server faults that must never hold a partition forever
//!   or commit what was not final.
//! - `blocked`: SPEC 7, a corrupt mailbox that receives thousands of records holds only itself.
//! - `cluster_changes`: SPEC 7.2, a Redis Cluster resharded under load.
//! - `fleet`: SPEC 7.2, zombies fenced on every topology and three replicas per rebalance
//!   protocol under churn.
//! - `order`: per-mailbox source order under the batched core (the daemon in this process).
//! - `partition_growth`: SPEC 7.2, a topic grown under a backlog never lets an older record win.
//! - `store_lost`: SPEC 7.3, a wiped or restarted-empty Redis is found before a write lands.
//! - `scylla`: a CQL server stopped mid-stream, a repair while the daemon runs.
//! - `dashboard_metrics`, `demo_serve`: every metric the dashboard and rules name is scraped live.
//! - `kafka_codecs`, `unknown_fields`, `log_colour`: what real producers and log shippers see.
//! - `http`: keep-alive, `HEAD`, the connection limit and silent clients of the endpoints.
//! - `verify`: the scrub finds injected damage exactly and verifies generated histories as
//!   `match` on every backend.
//! - `liveness`: `/healthz` fails when the engine loop or the poll thread is wedged.
//! - `subscription`: readiness of a replica that consumes nothing (a missing topic, an idle
//!   replica) and the committed offset of a transactional partition.
//!
//! Two daemon tests change their process and have binaries of their own:
//! `daemon_promote_metric.rs` installs the process's metrics recorder, and
//! `daemon_broker_restart.rs` points the Kafka helpers at a broker of its own.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

mod blocked;
mod cluster_changes;
mod cql_cluster;
mod dashboard_metrics;
mod demo_serve;
mod docs;
mod explain;
mod failures;
mod faults;
mod fleet;
mod grants;
mod http;
mod kafka;
mod kafka_acl;
mod kafka_codecs;
mod liveness;
mod log_colour;
mod order;
mod partition_growth;
mod records_lost;
mod redis_full;
mod scylla;
mod store_lost;
mod subscription;
mod tap;
mod unknown_fields;
mod verify;
