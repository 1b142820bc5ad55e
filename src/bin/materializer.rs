//! The `materializer` binary: everything lives in the library's `cli` module.

/// Every delivery allocates small, short-lived buffers (script arguments, replies, decoded
/// payloads) across threads; mimalloc's thread-local free lists serve that pattern at a fraction of
/// glibc malloc's cost (measured in BENCHMARKS.md). A heap profile (heaptrack, which sees only
/// the C allocator) is taken on a build with the `system-allocator` feature.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    #[cfg(not(feature = "system-allocator"))]
    mailbox_materializer::allocator::return_memory_promptly();
    mailbox_materializer::cli::main()
}
