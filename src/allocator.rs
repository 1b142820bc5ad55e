//! How the `materializer` binary's allocator (mimalloc) gives memory back to the system.
//!
//! The daemon's memory bound (docs/operations.md "Memory") is fixed overhead + 1.25 × (in-flight
//! budget + prefetch); what the process holds beyond its live heap counts against it as much as
//! the heap.
//! With mimalloc's defaults a catch-up of 64 KB records into Redis peaked at 172-203 MiB of RSS
//! for 56-67 MiB of charged bytes (bound 164): its arena was backed by transparent huge pages
//! (it asks for them), so a 2 MiB page stays resident while any 4 KiB of it is live, and freed
//! memory is returned only after a one-second delay (ten for whole arenas). With huge pages off
//! and a 10 ms delay the same run peaks at 130-137 MiB (BENCHMARKS.md, "Memory during a
//! catch-up"); a delay of 0 peaked the same but cost the memory store's path a sixth of its rate.

/// mimalloc's `mi_option_purge_delay` (the position in the vendored v3 `mimalloc.h`'s
/// `mi_option_e`; the Rust bindings do not name it). The unit test below checks its default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with mimalloc before it goes back to the system (mimalloc's
/// default is 1,000 ms, and ten times that for whole arenas).
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Returns freed memory within `PURGE_DELAY_MS` and keeps the process off transparent huge
/// pages. Called first thing in `main`; harmless (and without effect on the heap) when another
/// allocator is global.
#[allow(unsafe_code)] // each unsafe block below says why it is sound
pub fn return_memory_promptly() {
    // An operator's `MIMALLOC_PURGE_DELAY` (read by mimalloc at start) wins.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` only stores an integer in mimalloc's option table, which
        // mimalloc reads atomically; any thread may call it at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and sets a flag of this
        // process (new faults use small pages; inherited by children, of which there are none).
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            // Old kernels (< 3.15) lack it; the bound then needs THP off on the node.
            eprintln!(
                "note: cannot turn transparent huge pages off for this process: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)] // each unsafe block below says why it is sound
    fn the_purge_delay_option_is_the_one_the_vendored_mimalloc_defaults_to_a_second() {
        // A different position would set some other option: fail here, not in production.
        // SAFETY: reads mimalloc's option table.
        let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        // mimalloc reads `MIMALLOC_PURGE_DELAY` at start: with it set, the option holds its value.
        let expected = std::env::var("MIMALLOC_PURGE_DELAY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        assert_eq!(
            delay, expected,
            "mi_option_purge_delay moved in this mimalloc version"
        );
    }
}
