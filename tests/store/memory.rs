//! The conformance suite on the memory store, the executable reference.

// Test harness items are shared between this crate's modules, not exported.
#![allow(unreachable_pub)]

mod conformance;
mod support;

use conformance::memory::MemoryHarness;

conformance_tests!(MemoryHarness);
