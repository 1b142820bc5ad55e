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
    let text = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|t| EnvFilter::try_new(t).is_ok())
        .unwrap_or_else(|| config.filter.clone());
    let mut filter = EnvFilter::try_new(&text).unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in quiet_cluster_clients(&text) {
        filter = filter.add_directive(directive);
    }
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

/// The store clients log their own reconnects: the redis crate's cluster client a WARN for every
/// reconnect attempt to a node that is down (thousands in the seconds of a failover) and for
/// every slot-map refresh; the scylla driver an ERROR and two WARN a second while a node is away
/// (its control connection and topology fetch). The daemon says what matters itself, once per
/// change (the store's outage and its end, slots that moved, redirections summed up every 10 s,
/// readiness). So the redis cluster client's lines are kept at ERROR, and the scylla driver's
/// control-connection lines off, unless the filter names the crate.
fn quiet_cluster_clients(filter: &str) -> Vec<tracing_subscriber::filter::Directive> {
    let names = |krate: &str| {
        filter.contains(&format!("{krate}::"))
            || filter
                .split(',')
                .any(|d| d.starts_with(&format!("{krate}=")))
    };
    let mut quiet = Vec::new();
    if !names("redis") {
        quiet.extend("redis::cluster_handling=error".parse().ok());
    }
    if !names("scylla") {
        quiet.extend("scylla::cluster::metadata=off".parse().ok());
    }
    quiet
}

#[cfg(test)]
mod tests {
    use super::{colour, quiet_cluster_clients};

    #[test]
    fn the_cluster_clients_reconnect_lines_are_quiet_unless_asked_for() {
        assert_eq!(quiet_cluster_clients("info").len(), 2);
        assert_eq!(
            quiet_cluster_clients("debug,mailbox_materializer=trace").len(),
            2
        );
        assert_eq!(
            quiet_cluster_clients("info,redis::cluster_handling=warn").len(),
            1
        );
        assert_eq!(quiet_cluster_clients("info,redis=debug").len(), 1);
        assert_eq!(quiet_cluster_clients("info,scylla=warn").len(), 1);
        assert!(quiet_cluster_clients("redis=info,scylla::cluster=debug").is_empty());
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("")));
        assert!(!colour(true, Some("1")));
        assert!(!colour(false, None));
        assert!(!colour(false, Some("")));
    }
}
