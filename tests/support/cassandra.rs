//! A Cassandra of a test's own, on ports no other instance uses, through `scripts/cassandra`
//! (the shared instance at `SCYLLA_NODES` is never stopped by a test). For tests that stop and
//! start their server or need a server configured differently (TLS). Failing to start is a loud
//! failure, never a skip.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A private single-node Cassandra; stopped (and its data deleted) when dropped.
pub struct PrivateCassandra {
    dir: PathBuf,
    native_port: u16,
    storage_port: u16,
    jmx_port: u16,
    yaml_extra: String,
    /// `batch`: every acknowledged write is on disk before the answer (tests that restart it).
    commitlog_sync: &'static str,
}

impl PrivateCassandra {
    /// Starts an instance named `name` with native, storage and JMX ports `ports`, a small heap,
    /// and `yaml_extra` appended to its `cassandra.yaml`.
    pub fn start(name: &str, ports: (u16, u16, u16), yaml_extra: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("cassandra-{name}"));
        let instance = Self {
            dir,
            native_port: ports.0,
            storage_port: ports.1,
            jmx_port: ports.2,
            yaml_extra: yaml_extra.to_owned(),
            commitlog_sync: "periodic",
        };
        // A run killed earlier may have left one behind on the same ports.
        instance.stop();
        instance.start_again();
        instance
    }

    /// Like [`PrivateCassandra::start`], with every acknowledged write synced to disk first, for
    /// tests that restart the server and count what survived.
    pub fn start_durable(name: &str, ports: (u16, u16, u16)) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("cassandra-{name}"));
        let instance = Self {
            dir,
            native_port: ports.0,
            storage_port: ports.1,
            jmx_port: ports.2,
            yaml_extra: String::new(),
            commitlog_sync: "batch",
        };
        instance.stop();
        instance.start_again();
        instance
    }

    /// Stops it and starts it again on the same data; returns once it serves CQL again.
    pub fn restart(&self) {
        let out = self.script("restart");
        assert!(
            out.status.success(),
            "scripts/cassandra restart failed for {}:\n{}",
            self.dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `host:port` of its native transport.
    pub fn contact_point(&self) -> String {
        format!("127.0.0.1:{}", self.native_port)
    }

    /// Starts it (again) with the same ports and configuration; returns once it serves CQL.
    pub fn start_again(&self) {
        let out = self.script("start");
        assert!(
            out.status.success(),
            "scripts/cassandra start failed for {}:\n{}\n{}",
            self.dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops it and deletes its data.
    pub fn stop(&self) {
        let _ = self.script("stop");
    }

    fn script(&self, verb: &str) -> std::process::Output {
        Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/cassandra"))
            .arg(verb)
            .env("CASSANDRA_DIR", &self.dir)
            .env("CASSANDRA_NATIVE_PORT", self.native_port.to_string())
            .env("CASSANDRA_STORAGE_PORT", self.storage_port.to_string())
            .env("CASSANDRA_JMX_PORT", self.jmx_port.to_string())
            .env("CASSANDRA_HEAP", "768m")
            .env("CASSANDRA_YAML_EXTRA", &self.yaml_extra)
            .env("CASSANDRA_COMMITLOG_SYNC", self.commitlog_sync)
            .output()
            .expect("scripts/cassandra runs")
    }
}

impl Drop for PrivateCassandra {
    fn drop(&mut self) {
        self.stop();
    }
}
