//! The conformance suite on the memory store, the executable reference.

use crate::conformance;
use crate::conformance_tests;

use conformance::memory::MemoryHarness;

conformance_tests!(MemoryHarness);
