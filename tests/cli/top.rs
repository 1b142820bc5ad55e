//! `materializer top` against live replicas on a real broker: `--once --json` agrees with the
//! replicas' own metrics, and the terminal UI, driven under tmux as a person would (keys in,
//! the screen read back), shows every replica and partition, answers its keys, and shows a
//! frozen replica as down instead of dropping it; a name resolving to three local replicas stands
//! for the three, in `--once` and in the live view as the name changes.

use crate::support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::cli::run_materializer;
use support::kafka::{create_topic, produce, unique, wait_for, Daemon, DaemonSetup};
use support::redis_server::{Clock, Listen, RedisServer};
use support::reference::{end_offsets, stream, wait_committed, PARTITIONS};

/// A tmux server of its own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(command: &str) -> Self {
        let tmux = Self {
            socket: unique("top"),
        };
        let status = tmux
            .cmd(&[
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "200",
                "-y",
                "40",
                command,
            ])
            .status()
            .expect("tmux is required (scripts/install-services installs it)");
        assert!(status.success(), "tmux new-session");
        tmux
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket]).args(args);
        command
    }

    fn screen(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-t", "top"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        let status = self
            .cmd(&["send-keys", "-t", "top", keys])
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn alive(&self) -> bool {
        self.cmd(&["has-session", "-t", "top"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Waits until the screen satisfies `check`.
    fn wait_screen(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        wait_for(
            what,
            Duration::from_secs(20),
            || {
                last = self.screen();
                check(&last)
            },
            || self.screen(),
        );
        last
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn top_shows_live_replicas_their_partitions_and_a_frozen_one_as_down() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("top", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records = stream(30, 3, 7);
    let offsets = produce(&setup.topic, &records).await;
    let a = Daemon::start(&setup);
    let b = Daemon::start(&setup);
    wait_committed(
        &setup,
        &end_offsets(&records, &offsets),
        &[&a, &b],
        Duration::from_secs(60),
    );
    let addr = |d: &Daemon| format!("127.0.0.1:{}", d.http_port);
    let (addr_a, addr_b) = (addr(&a), addr(&b));

    // --once --json: one snapshot that agrees with each replica's metrics. The second replica's
    // join may still be moving a partition when the records are committed: take snapshots until
    // every partition is served (the group settles within a few seconds).
    let snapshot_once = || {
        let out = run_materializer(
            &[
                "top",
                "--once",
                "--output",
                "json",
                "--interval-ms",
                "300",
                "--daemon",
                &addr_a,
                "--daemon",
                &addr_b,
            ],
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let snapshot: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        snapshot
    };
    let served = |snapshot: &Value| {
        snapshot["partitions"].as_array().map_or(0, |p| p.len()) == PARTITIONS as usize
    };
    let mut snapshot = snapshot_once();
    let settle = std::time::Instant::now() + Duration::from_secs(30);
    while !served(&snapshot) && std::time::Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(300));
        snapshot = snapshot_once();
    }
    let replicas = snapshot["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 2);
    for replica in replicas {
        assert_eq!(replica["state"], "ready", "{replica}");
        assert_eq!(replica["backend"], "redis");
        assert!(replica["records_per_second"].is_object());
    }
    let partitions = snapshot["partitions"].as_array().expect("partitions");
    let mut seen: Vec<i64> = partitions
        .iter()
        .map(|p| p["partition"].as_i64().expect("partition"))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..i64::from(PARTITIONS)).collect::<Vec<_>>(),
        "every partition once"
    );
    for p in partitions {
        let daemon = if p["replica"] == addr_a.as_str() {
            &a
        } else {
            &b
        };
        let key = format!(
            "materializer_consumer_lag{{partition=\"{}\"}}",
            p["partition"]
        );
        assert_eq!(
            p["lag_records"].as_f64(),
            Some(daemon.metrics().get(&key)),
            "{p}"
        );
    }

    // The terminal UI under tmux.
    let command = format!(
        "{} top --interval-ms 300 --daemon {addr_a} --daemon {addr_b}",
        env!("CARGO_BIN_EXE_materializer")
    );
    let tmux = Tmux::start(&command);
    let screen = tmux.wait_screen("both replicas on screen", |s| {
        s.contains("2 replica(s), 0 not ready, 0 down")
            && s.contains(&addr_a)
            && s.contains(&addr_b)
    });
    assert!(
        screen.contains("PARTITION") && screen.contains("LAG"),
        "{screen}"
    );
    assert!(screen.contains("sort: lag (s)"), "{screen}");
    tmux.keys("s");
    tmux.wait_screen("sorted by lag seconds", |s| s.contains("sort: lag seconds"));
    tmux.keys("f");
    tmux.wait_screen("filtered to partitions behind", |s| {
        s.contains("filter: behind")
    });
    tmux.keys("f");
    tmux.keys("f");
    tmux.keys("f");
    tmux.wait_screen("every partition again", |s| s.contains("filter: all"));

    // A frozen replica answers nothing: shown down, not dropped.
    b.freeze();
    let screen = tmux.wait_screen("the frozen replica shown down", |s| {
        s.contains("1 down") && s.lines().any(|l| l.contains(&addr_b) && l.contains("DOWN"))
    });
    assert!(screen.contains(&addr_a), "{screen}");
    b.thaw();
    tmux.wait_screen("the replica back", |s| s.contains("0 down"));

    tmux.keys("q");
    wait_for(
        "top to quit on q",
        Duration::from_secs(10),
        || !tmux.alive(),
        || tmux.screen(),
    );
}

#[test]
fn off_a_terminal_top_prints_one_snapshot() {
    // Nothing listens there: the snapshot says so, and the exit status too (2: look again
    // later), with SPEC 8.2's error object in the one JSON object.
    for args in [
        &["top", "--interval-ms", "100", "--daemon", "127.0.0.1:1"][..],
        &[
            "top",
            "--once",
            "--interval-ms",
            "100",
            "--daemon",
            "127.0.0.1:1",
        ],
        &[
            "top",
            "--once",
            "--output",
            "json",
            "--interval-ms",
            "100",
            "--daemon",
            "127.0.0.1:1",
        ],
    ] {
        let out = run_materializer(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let snapshot: Value = serde_json::from_slice(&out.stdout).expect("still a snapshot");
        assert_eq!(snapshot["replicas"][0]["state"], "down");
        assert_eq!(snapshot["error"]["kind"], "unavailable", "{snapshot}");
    }
    // The old spellings, --json and addresses as arguments, still work for one release, and
    // say so.
    let out = run_materializer(
        &[
            "top",
            "--once",
            "--json",
            "--interval-ms",
            "100",
            "127.0.0.1:1",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let snapshot: Value = serde_json::from_slice(&out.stdout).expect("a snapshot");
    assert_eq!(snapshot["replicas"][0]["state"], "down");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--output json"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--daemon ADDR"));
    // Text on request: the screen's text, the error on stderr.
    let out = run_materializer(
        &[
            "top",
            "--once",
            "--output",
            "text",
            "--interval-ms",
            "100",
            "--daemon",
            "127.0.0.1:1",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("down"));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: replicas did not answer"));
}

/// `/etc/hosts` lines naming the fleet, removed when dropped (the file is restored as found).
struct HostsEntries {
    original: String,
}

impl HostsEntries {
    const FILE: &'static str = "/etc/hosts";

    fn add(name: &str, ips: &[&str]) -> Self {
        let original = std::fs::read_to_string(Self::FILE).expect("read /etc/hosts");
        let guard = Self { original };
        guard.set(name, ips);
        guard
    }

    /// The original file plus one line per address of `name`.
    fn set(&self, name: &str, ips: &[&str]) {
        let mut text = self.original.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        for ip in ips {
            text.push_str(&format!("{ip} {name}\n"));
        }
        Self::replace(&text)
            .expect("write /etc/hosts (the test resolves a name to three local replicas)");
    }

    /// Replaces the file in one rename, so that a test resolving `localhost` meanwhile never
    /// reads it half written; in place where it is a mount point (a container's).
    fn replace(text: &str) -> std::io::Result<()> {
        let staged = format!("{}.mm-{}", Self::FILE, std::process::id());
        std::fs::write(&staged, text)?;
        std::fs::set_permissions(&staged, std::fs::metadata(Self::FILE)?.permissions())?;
        std::fs::rename(&staged, Self::FILE).or_else(|_| {
            let _ = std::fs::remove_file(&staged);
            std::fs::write(Self::FILE, text)
        })
    }
}

impl Drop for HostsEntries {
    fn drop(&mut self) {
        let _ = Self::replace(&self.original);
    }
}

/// A replica listening on one loopback address (all of them on one port, as pods behind a
/// headless Service), killed when dropped.
struct Replica(std::process::Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A name resolving to three local replicas (a headless Service's shape) stands for the three of
/// them in `top --once`; the live view resolves it again, so a replica whose address appears
/// later (a rolled pod) shows up without restarting `top`.
#[tokio::test(flavor = "multi_thread")]
async fn top_finds_every_replica_a_name_resolves_to() {
    let redis = RedisServer::start(Clock::Real, Listen::Unix, &[]);
    let setup = DaemonSetup::new("top-dns", Some(redis.url()));
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let port = support::redis_server::free_port();
    let config = setup.config_file(port);
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    let _replicas: Vec<Replica> = ips
        .iter()
        .map(|ip| {
            let log = std::fs::File::create(setup.dir.join(format!("replica-{ip}.log")))
                .expect("log file");
            Replica(
                Command::new(env!("CARGO_BIN_EXE_materializer"))
                    .args(["run", "--config"])
                    .arg(&config)
                    .env("MATERIALIZER_HTTP_LISTEN", format!("{ip}:{port}"))
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("start a replica"),
            )
        })
        .collect();
    let name = format!("mm-fleet-{}", std::process::id());
    let hosts = HostsEntries::add(&name, &ips);
    let fleet = format!("{name}:{port}");
    let expected: Vec<String> = ips.iter().map(|ip| format!("{ip}:{port}")).collect();

    let snapshot = || {
        let out = run_materializer(
            &[
                "top",
                "--once",
                "--output",
                "json",
                "--interval-ms",
                "300",
                "--daemon",
                &fleet,
            ],
            None,
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
    };
    let addresses = |snapshot: &Value| {
        let mut seen: Vec<String> = snapshot["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["state"] == "ready")
            .filter_map(|r| r["replica"].as_str().map(str::to_owned))
            .collect();
        seen.sort();
        seen
    };
    let last = std::cell::RefCell::new(Value::Null);
    wait_for(
        "top --once to show the three replicas ready",
        Duration::from_secs(60),
        || {
            *last.borrow_mut() = snapshot();
            addresses(&last.borrow()) == expected
        },
        || last.borrow().to_string(),
    );

    // The live view: the name first resolves to two of them; the third appears when it does.
    hosts.set(&name, &ips[..2]);
    let command = format!(
        "{} top --interval-ms 300 --daemon {fleet}",
        env!("CARGO_BIN_EXE_materializer")
    );
    let tmux = Tmux::start(&command);
    tmux.wait_screen("two replicas on screen", |s| {
        s.contains("2 replica(s)") && s.contains(&expected[0]) && s.contains(&expected[1])
    });
    hosts.set(&name, &ips);
    tmux.wait_screen("the third replica once the name resolves to it", |s| {
        s.contains("3 replica(s), 0 not ready, 0 down") && s.contains(&expected[2])
    });
    tmux.keys("q");
}
