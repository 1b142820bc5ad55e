//! The conformance suite on the memory store, the executable reference.

mod conformance;
mod support;

use conformance::memory::MemoryHarness;

conformance_tests!(MemoryHarness);
