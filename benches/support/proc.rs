//! What the benches read about processes from `/proc`: the CPU a process has used (so each
//! figure names the busy process) and which process listens on a port (to find a server the
//! bench did not start, such as Cassandra).

#![allow(dead_code)] // each bench uses what it needs
use std::sync::OnceLock;

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux).
fn ticks_per_sec() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU seconds (user + system) a process (a pid, or `"self"`) has used so far; `None` once it
/// is gone.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_sec())
}

/// The pid of the process listening on TCP `port` on this machine, if it can be found.
pub fn listener_pid(port: u16) -> Option<String> {
    let wanted = format!(":{port:04X}");
    let mut inode = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[1].ends_with(&wanted) && f[3] == "0A" {
                inode = Some(f[9].to_owned());
            }
        }
    }
    let socket = format!("socket:[{}]", inode?);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == socket) {
                return Some(pid);
            }
        }
    }
    None
}
