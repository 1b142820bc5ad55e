//! The crate's layers, lowest first, and the test that keeps every `crate::` path pointing down.
//!
//! | layer | may use |
//! |---|---|
//! | leaves: `model`, `locks`, `wall_clock`, `url_redact`, `retry`, `allocator`, `splitmix` | nothing else of the crate |
//! | `demo` (the synthetic workload), `disposition` | `model` |
//! | `store` | the leaves |
//! | `ingest` | `store`, `disposition`, the leaves |
//! | `config` | `ingest`, `store`, the leaves |
//! | `daemon` | `config`, `demo` and everything below them |
//! | `operator` (`replay`, `verify`, the dead-letter reader) | `daemon` and everything below it |
//! | `cli` | everything |
//!
//! A module's own paths (`crate::store::..` inside `store`) are always allowed. Doc comments may
//! name anything: only code is checked.
//!
//! Inside `daemon` and `operator`, one more rule: metrics are written by events
//! (`daemon::events`), so only `metrics` itself, `events`, `telemetry` (the outcome counts) and
//! the HTTP side (`/metrics`, the readiness gauge) call `metrics::`. The commands (`cli`) write
//! none either: they emit events, and name of `metrics` only the recorder's installation and
//! metric names (the demo's table reads what was counted).

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    const LEAVES: [&str; 7] = [
        "model",
        "locks",
        "wall_clock",
        "url_redact",
        "retry",
        "allocator",
        "splitmix",
    ];

    /// Which top-level modules each may use (besides itself).
    fn allowed() -> BTreeMap<&'static str, Vec<&'static str>> {
        let mut rules: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for leaf in LEAVES {
            rules.insert(leaf, vec![]);
        }
        rules.insert("demo", vec!["model", "splitmix"]);
        rules.insert("disposition", vec!["model"]);
        rules.insert("store", LEAVES.to_vec());
        let mut ingest = LEAVES.to_vec();
        ingest.extend(["store", "disposition"]);
        rules.insert("ingest", ingest.clone());
        let mut config = ingest.clone();
        config.push("ingest");
        rules.insert("config", config.clone());
        let mut daemon = config;
        daemon.extend(["config", "demo"]);
        rules.insert("daemon", daemon.clone());
        let mut operator = daemon;
        operator.push("daemon");
        rules.insert("operator", operator.clone());
        let mut cli = operator;
        cli.extend(["operator", "cli"]);
        rules.insert("cli", cli);
        rules
    }

    /// Every `crate::<module>` a line of code names (comments left out).
    fn crate_paths(line: &str) -> Vec<&str> {
        let code = line.split("//").next().unwrap_or_default();
        code.match_indices("crate::")
            .filter(|(at, _)| {
                // `$crate::` and `mailbox_materializer::crate` are not this crate's paths.
                !code[..*at].ends_with('$')
                    && !code[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            })
            .filter_map(|(at, _)| {
                let rest = &code[at + "crate::".len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                (end > 0).then(|| &rest[..end])
            })
            .collect()
    }

    fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }

    #[test]
    fn every_crate_path_points_down_a_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src, &mut files);
        let rules = allowed();
        let mut violations = Vec::new();
        for file in files {
            let relative = file.strip_prefix(&src).expect("under src");
            let top = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .map(|c| c.trim_end_matches(".rs"))
                .unwrap_or_default();
            // This file names paths in its own test strings; `bin/` is another crate.
            if matches!(top, "lib" | "main" | "layers" | "bin") {
                continue;
            }
            let Some(may) = rules.get(top) else {
                violations.push(format!("{}: module {top} has no layer", relative.display()));
                continue;
            };
            let text = std::fs::read_to_string(&file).expect("read");
            for (n, line) in text.lines().enumerate() {
                for target in crate_paths(line) {
                    if target != top && !may.contains(&target) {
                        violations.push(format!(
                            "{}:{}: {top} uses crate::{target}",
                            relative.display(),
                            n + 1
                        ));
                    }
                }
            }
        }
        assert!(
            violations.is_empty(),
            "arrows pointing up:\n{}",
            violations.join("\n")
        );
    }

    #[test]
    fn the_path_reader_sees_code_not_comments() {
        assert_eq!(crate_paths("use crate::model::{A, B};"), ["model"]);
        assert_eq!(
            crate_paths("x(crate::store::open()) // crate::cli"),
            ["store"]
        );
        assert_eq!(
            crate_paths("/// [`x`](crate::daemon::y)"),
            Vec::<&str>::new()
        );
        assert_eq!(crate_paths("$crate::model"), Vec::<&str>::new());
    }

    /// The daemon's files that may call `metrics` directly.
    const MAY_CALL_METRICS: &[&str] = &[
        "daemon/metrics.rs",
        "daemon/metrics/",
        "daemon/events.rs",
        "daemon/telemetry.rs",
        "daemon/http/",
    ];

    #[test]
    fn the_daemon_reports_through_events_never_metrics_directly() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src.join("daemon"), &mut files);
        assert!(files.len() > 20, "the daemon's sources were not found");
        walk(&src.join("operator"), &mut files);
        let mut offenders = Vec::new();
        for path in files {
            let relative = path
                .strip_prefix(&src)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            if MAY_CALL_METRICS.iter().any(|p| relative.starts_with(p)) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if code.contains("metrics::") && !code.trim_start().starts_with("use ") {
                    offenders.push(format!("{relative}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "emit an event (daemon::events) instead: {offenders:#?}"
        );
    }

    #[test]
    fn the_commands_write_no_metric_themselves() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src.join("cli"), &mut files);
        assert!(files.len() > 10, "the commands' sources were not found");
        let mut offenders = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if code.trim_start().starts_with("use ") {
                    continue;
                }
                for (at, _) in code.match_indices("metrics::") {
                    let rest = &code[at + "metrics::".len()..];
                    // The recorder's installation and metric names (constants) only.
                    let allowed = rest.starts_with("install(")
                        || rest.starts_with(|c: char| c.is_ascii_uppercase());
                    if !allowed {
                        offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "emit an event (daemon::events) instead: {offenders:#?}"
        );
    }
}
