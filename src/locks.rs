//! One way to take a `std::sync::Mutex` outside the memory store: recovering from poisoning.
//!
//! What these mutexes guard is replaced whole or only counted (telemetry counters, the consumer's
//! hand-over slot, a store's connection and script caches), so a panic on another thread cannot
//! have left a half-made value behind; taking the daemon down with it would turn one bug into an
//! outage. (The memory store keeps its own helper, whose reason is its own: every operation
//! validates before it mutates.)

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, using its data even when another thread panicked while holding it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
