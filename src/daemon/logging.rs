//! Structured logs with `tracing`: human text by default, one JSON object a line with
//! `[log] format = "json"` (or `MATERIALIZER_LOG_FORMAT=json`). Logs go to stderr so stdout stays
//! the commands' machine-readable output. `RUST_LOG` overrides the configured filter.

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Installs the global subscriber once; later calls are no-ops.
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if config.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
