//! Logs carry ANSI colour only on a terminal: a daemon whose output is redirected to a file (a
//! container runtime, systemd, `> daemon.log`) writes plain text that log shippers and `grep` can
//! read. The pseudo-terminal case (`script`) shows the check can see colour at all.

use crate::support;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::kafka::{create_topic, Daemon, DaemonSetup};

const ESC: &[u8] = b"\x1b[";

fn has_escape(bytes: &[u8]) -> bool {
    bytes.windows(ESC.len()).any(|w| w == ESC)
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(support::kafka::unique(name));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A config whose `http.listen` is taken, so `run` logs an error and exits at once.
fn busy_port_config(dir: &Path, listener: &TcpListener) -> std::path::PathBuf {
    let port = listener.local_addr().expect("addr").port();
    let path = dir.join("busy.toml");
    std::fs::write(&path, format!("[http]\nlisten = \"127.0.0.1:{port}\"\n")).expect("config");
    path
}

#[test]
fn run_redirected_to_files_writes_no_escape_sequences() {
    let dir = scratch("plain-run");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let config = busy_port_config(&dir, &listener);
    let stdout = dir.join("stdout");
    let stderr = dir.join("stderr");
    let status = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .status()
        .expect("run materializer");
    assert!(!status.success(), "a taken http.listen fails the start");
    let log = std::fs::read(&stderr).expect("stderr");
    assert!(
        String::from_utf8_lossy(&log).contains("cannot bind http.listen"),
        "{}",
        String::from_utf8_lossy(&log)
    );
    assert!(!has_escape(&log), "{:?}", String::from_utf8_lossy(&log));
    assert!(!has_escape(&std::fs::read(&stdout).expect("stdout")));
}

#[test]
fn the_same_run_on_a_terminal_is_coloured_unless_no_color() {
    let dir = scratch("tty-run");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let config = busy_port_config(&dir, &listener);
    let command = format!(
        "{} run --config {}",
        env!("CARGO_BIN_EXE_materializer"),
        config.display()
    );
    // `script` runs the command on a pseudo-terminal and copies what it wrote to our stdout.
    let on_tty = |no_color: Option<&str>| {
        let mut script = Command::new("script");
        script
            .args(["-q", "-e", "-c", &command, "/dev/null"])
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null());
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        let out = script
            .output()
            .expect("script(1) from util-linux is required");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("cannot bind http.listen"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        out.stdout
    };
    assert!(has_escape(&on_tty(None)), "a terminal gets colour");
    assert!(!has_escape(&on_tty(Some("1"))), "NO_COLOR turns it off");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_consuming_with_its_log_in_a_file_writes_plain_text() {
    let setup = DaemonSetup::new("plain-daemon", None);
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut daemon = Daemon::start(&setup);
    let status = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let log = daemon.log();
    assert!(log.contains("serving"), "{log}");
    assert!(!has_escape(log.as_bytes()), "{log:?}");
}

#[test]
fn demo_redirected_to_files_writes_no_escape_sequences() {
    let dir = scratch("plain-demo");
    let stdout = dir.join("stdout");
    let stderr = dir.join("stderr");
    let status = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["demo", "--users", "20", "--rounds", "2", "--output", "text"])
        .env_remove("NO_COLOR")
        // Every log line the demo can write, so a coloured one would show.
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .status()
        .expect("run materializer demo");
    assert!(status.success(), "{status:?}");
    let out = std::fs::read(&stdout).expect("stdout");
    let err = std::fs::read(&stderr).expect("stderr");
    assert!(String::from_utf8_lossy(&out).contains("delivery outcome"));
    assert!(!err.is_empty(), "RUST_LOG=debug logs something");
    assert!(!has_escape(&out), "{:?}", String::from_utf8_lossy(&out));
    assert!(!has_escape(&err), "{:?}", String::from_utf8_lossy(&err));
}
