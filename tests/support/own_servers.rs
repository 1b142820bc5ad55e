//! Servers a test starts for itself with one of the project's scripts (`scripts/kafka`,
//! `scripts/kafka-cluster`, `scripts/cassandra-cluster`) on ports and a directory of its own, so
//! it can crash and restart them without touching what other tests share: each verb is the
//! script's, run with the test's environment, and the servers are stopped (their data deleted)
//! when the value is dropped, a failing test included.

use std::path::PathBuf;
use std::process::Command;

pub struct OwnServers {
    script: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl OwnServers {
    /// `script` (a file of `scripts/`) with `env`; nothing is started yet.
    pub fn new(script: &str, env: Vec<(&'static str, String)>) -> Self {
        Self {
            script: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("scripts")
                .join(script),
            env,
        }
    }

    /// Runs the script with `args`; its stdout, trimmed. A failure fails the test with what the
    /// script said.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.script)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.script.display()));
        assert!(
            out.status.success(),
            "{} {args:?}: {}",
            self.script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for OwnServers {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output();
    }
}
