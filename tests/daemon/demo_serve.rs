//! `materializer demo` prints a metrics address only when it keeps serving it (`--serve`), and
//! that address answers with a valid Prometheus scrape.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::cli::run_materializer;
use support::kafka::{http_get, promtool_check, Metrics};

#[test]
fn demo_without_serve_prints_no_dead_address() {
    let out = run_materializer(
        &["demo", "--users", "20", "--rounds", "2", "--output", "text"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("delivery outcome"), "{stdout}");
    assert!(!stdout.contains("http://"), "{stdout}");
    assert!(stdout.contains("--serve keeps"), "{stdout}");
    // Off a terminal the default is one JSON object with the table's numbers.
    let out = run_materializer(&["demo", "--users", "20", "--rounds", "2"], None);
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(report["records"], report["final"], "{report}");
    assert!(
        report["delivery_outcomes"]["inserted"].as_u64() > Some(0),
        "{report}"
    );
}

/// Runs `demo --serve`, returns the served port once the address line is printed.
struct Serving {
    child: std::process::Child,
    port: u16,
}

impl Serving {
    fn start(config: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .args([
                "demo", "--users", "20", "--rounds", "2", "--serve", "--output", "text", "--config",
            ])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("demo --serve");
        let stdout = child.stdout.take().expect("stdout");
        // Lines are read on their own thread so a demo that never prints the
        // address fails the test after the deadline instead of blocking it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("serving http://127.0.0.1:") {
                    let _ = tx.send(rest.split('/').next().and_then(|p| p.parse().ok()));
                    return;
                }
            }
            let _ = tx.send(None);
        });
        let port = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("demo --serve printed no serving line within 120 s");
            }
        };
        Self {
            child,
            port: port.expect("demo --serve prints the address it serves"),
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn demo_serve_keeps_the_printed_address_alive_with_a_valid_scrape() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(support::kafka::unique("demo-serve"));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("demo.toml");
    let port = support::redis_server::free_port();
    std::fs::write(&config, format!("[http]\nlisten = \"127.0.0.1:{port}\"\n")).expect("config");
    let mut serving = Serving::start(&config);
    assert_eq!(serving.port, port);
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = http_get(serving.port, "/metrics").expect("the address answers");
    assert_eq!(status, 200);
    promtool_check(&body);
    let metrics = Metrics::parse(&body);
    assert_eq!(
        metrics.get(&format!(
            "materializer_build_info{{version=\"{}\",revision=\"{}\",backend=\"memory\"}}",
            env!("CARGO_PKG_VERSION"),
            env!("MATERIALIZER_REVISION")
        )),
        1.0,
        "{body}"
    );
    assert!(metrics.get("materializer_records_total{outcome=\"applied\"}") > 0.0);
    assert!(metrics
        .samples
        .contains_key("materializer_replay_records_total{outcome=\"applied\"}"));
    assert_eq!(http_get(serving.port, "/healthz").map(|r| r.0), Some(200));
    // Still up a moment later: --serve keeps it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(serving.child.try_wait().expect("wait").is_none());
    assert!(http_get(serving.port, "/metrics").is_some());
}
