//! The `materializer` binary: everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    mailbox_materializer::cli::main()
}
