//! The conformance suite, the crash-convergence and concurrency tests, and the memory-vs-Scylla
//! randomized comparison, on a real CQL server (`SCYLLA_NODES`; `scripts/test` starts Apache
//! Cassandra when no ScyllaDB is given).

mod conformance;
mod support;

use std::sync::Arc;

use conformance::memory::MemoryHarness;
use conformance::scylla::{ScyllaFixture, ScyllaHarness};

conformance_tests!(ScyllaHarness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_histories_match_the_memory_reference() {
    conformance::history::compare_backends(Arc::new(MemoryHarness), Arc::new(ScyllaHarness), 16)
        .await;
    let _ = std::mem::size_of::<ScyllaFixture>();
}
