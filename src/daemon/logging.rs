//! Structured logs with `tracing`: human text by default, one JSON object a line with
//! `[log] format = "json"` (or `MATERIALIZER_LOG_FORMAT=json`). Logs go to stderr so stdout stays
//! the commands' machine-readable output. `RUST_LOG` overrides the configured filter.
//!
//! Text logs are coloured only when stderr (where they go) is a terminal and `NO_COLOR` is unset
//! or empty: a log redirected to a file, a pipe, `kubectl logs` or journald gets plain text, with
//! no escape sequences for a log shipper or `grep` to trip over. JSON logs never carry colour.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Whether text logs get ANSI colour: only on a terminal, and never under `NO_COLOR`
/// (<https://no-color.org>).
pub(crate) fn colour(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber once; later calls are no-ops.
pub(crate) fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = colour(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if config.format == "json" {
        builder.with_ansi(false).json().try_init()
    } else {
        builder.with_ansi(ansi).try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("")));
        assert!(!colour(true, Some("1")));
        assert!(!colour(false, None));
        assert!(!colour(false, Some("")));
    }
}
