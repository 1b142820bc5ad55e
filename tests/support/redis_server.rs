//! Real `redis-server` processes for tests, on loopback or a private unix socket, optionally
//! under libfaketime so expiry is Redis's own TTL machinery on a clock the test moves.
//!
//! Debian's redis-server uses jemalloc, which deadlocks under libfaketime at start-up; a tiny shim
//! (built here with gcc, once per test process) routes the allocator to glibc first.
//! A missing `redis-server`, `gcc` or libfaketime is a loud failure, never a skip: the test
//! command (`scripts/test`) installs them.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <stddef.h>
#include <errno.h>
#include <dlfcn.h>
extern void *__libc_malloc(size_t); extern void *__libc_calloc(size_t,size_t);
extern void *__libc_realloc(void*,size_t); extern void __libc_free(void*);
extern void *__libc_memalign(size_t,size_t);
void *malloc(size_t n){return __libc_malloc(n);}
void *calloc(size_t a,size_t b){return __libc_calloc(a,b);}
void *realloc(void*p,size_t n){return __libc_realloc(p,n);}
void free(void*p){__libc_free(p);}
void *memalign(size_t a,size_t n){return __libc_memalign(a,n);}
void *aligned_alloc(size_t a,size_t n){return __libc_memalign(a,n);}
int posix_memalign(void**r,size_t a,size_t n){void*p=__libc_memalign(a,n); if(!p) return ENOMEM; *r=p; return 0;}
static size_t (*libc_mus)(void*);
size_t malloc_usable_size(void*p){ if(!libc_mus){void*h=dlopen("libc.so.6",RTLD_NOW|RTLD_NOLOAD); libc_mus=dlsym(h,"malloc_usable_size");} return libc_mus(p);}
"#;

/// How a test server keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The machine's clock.
    Real,
    /// libfaketime starting at this Unix second; `FAKETIME_NO_CACHE=1`, so a jump written with
    /// [`RedisServer::set_now`] is exact at once (Redis runs ~5x slower).
    Fake(u64),
}

/// Where a test server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket in the server's own folder: no port can collide.
    Unix,
    /// A loopback TCP port (cluster nodes need one; the bus uses port + 10000).
    Tcp(u16),
}

/// One running `redis-server`, stopped when dropped.
pub struct RedisServer {
    dir: PathBuf,
    child: Child,
    listen: Listen,
    clock_file: Option<PathBuf>,
    /// The program and arguments it was started with, for [`RedisServer::restart`].
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
}

fn scratch_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("redis-servers")
}

/// Builds the allocator shim once per test process.
fn shim() -> &'static Path {
    static SHIM_PATH: OnceLock<PathBuf> = OnceLock::new();
    SHIM_PATH.get_or_init(|| {
        let dir = scratch_root().join(format!("shim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        let source = dir.join("glibcmalloc.c");
        let library = dir.join("glibcmalloc.so");
        std::fs::write(&source, SHIM).expect("write shim source");
        let status = Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("gcc is required to build the libfaketime allocator shim (scripts/test installs it)");
        assert!(status.success(), "building the allocator shim failed");
        library
    })
}

/// `@YYYY-MM-DD HH:MM:SS` for libfaketime.
pub fn faketime_spec(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "@{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The value of a RESP bulk or integer reply of [`RedisServer::raw`] (`$3\r\nabc` or `:42`).
pub fn resp_value(reply: &str) -> String {
    reply
        .lines()
        .find(|l| !l.starts_with('$') && !l.is_empty())
        .unwrap_or_default()
        .trim_start_matches(':')
        .trim()
        .to_owned()
}

/// A loopback port that is free now, with `port + 10000` free too (the cluster bus).
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start(clock: Clock, listen: Listen, extra_args: &[&str]) -> Self {
        let redis = which("redis-server").unwrap_or_else(|| {
            panic!("redis-server is not installed (scripts/test installs it with apt-get)")
        });
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = scratch_root().join(format!("r-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");

        let mut command = Command::new(redis);
        command
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        match listen {
            Listen::Unix => {
                command
                    .arg("--port")
                    .arg("0")
                    .arg("--unixsocket")
                    .arg(dir.join("redis.sock"))
                    .arg("--unixsocketperm")
                    .arg("700");
            }
            Listen::Tcp(port) => {
                command.arg("--port").arg(port.to_string());
            }
        }
        command.args(extra_args);
        let mut clock_file = None;
        if let Clock::Fake(start) = clock {
            assert!(
                Path::new(LIBFAKETIME).exists(),
                "libfaketime is not installed at {LIBFAKETIME} (scripts/test installs it with apt-get)"
            );
            let file = dir.join("faketime.rc");
            write_atomically(&file, &faketime_spec(start));
            command
                .env("LD_PRELOAD", format!("{}:{LIBFAKETIME}", shim().display()))
                .env("FAKETIME_TIMESTAMP_FILE", &file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            clock_file = Some(file);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start redis-server");
        let program = PathBuf::from(command.get_program());
        let args = command.get_args().map(|a| a.to_owned()).collect();
        let mut server = Self {
            dir,
            child,
            listen,
            clock_file,
            program,
            args,
        };
        server.wait_ready();
        server
    }

    /// The URL the store connects with.
    pub fn url(&self) -> String {
        match self.listen {
            Listen::Unix => format!("redis+unix://{}", self.socket().display()),
            Listen::Tcp(port) => format!("redis://127.0.0.1:{port}"),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    /// The server's process id (to read its CPU time, or to signal it).
    /// The server's folder (`--dir`: where `SAVE` writes `dump.rdb` and a start reads it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn port(&self) -> Option<u16> {
        match self.listen {
            Listen::Tcp(port) => Some(port),
            Listen::Unix => None,
        }
    }

    /// Moves the server's clock to `unix_secs` (it keeps ticking from there).
    pub fn set_now(&self, unix_secs: u64) {
        let file = self
            .clock_file
            .as_ref()
            .expect("this server runs on the real clock and cannot be moved");
        write_atomically(file, &faketime_spec(unix_secs));
    }

    /// Sends one inline command and returns the raw reply (for readiness and admin steps that
    /// must not depend on the code under test).
    pub fn raw(&self, command: &str) -> String {
        let mut reply = vec![0u8; 65_536];
        match self.listen {
            Listen::Unix => {
                let mut s = UnixStream::connect(self.socket()).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                s.write_all(format!("{command}\r\n").as_bytes())
                    .expect("write");
                let n = s.read(&mut reply).expect("read");
                String::from_utf8_lossy(&reply[..n]).into_owned()
            }
            Listen::Tcp(port) => {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                s.write_all(format!("{command}\r\n").as_bytes())
                    .expect("write");
                let n = s.read(&mut reply).expect("read");
                String::from_utf8_lossy(&reply[..n]).into_owned()
            }
        }
    }

    /// Kills the server (SIGKILL) and waits for it: clients see connection errors.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again with the same arguments and folder (so an append-only file, if
    /// enabled with `--appendonly yes`, brings the data back). Real-clock servers only.
    pub fn restart(&mut self) {
        assert!(
            self.clock_file.is_none(),
            "restart is for real-clock servers"
        );
        self.stop();
        self.child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("restart redis-server");
        self.wait_ready();
    }

    fn try_ping(&self) -> bool {
        let attempt = || -> std::io::Result<bool> {
            let mut buf = [0u8; 16];
            let n = match self.listen {
                Listen::Unix => {
                    let mut s = UnixStream::connect(self.socket())?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.write_all(b"PING\r\n")?;
                    s.read(&mut buf)?
                }
                Listen::Tcp(port) => {
                    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.write_all(b"PING\r\n")?;
                    s.read(&mut buf)?
                }
            };
            // A server that requires authentication answers too: it is up.
            Ok(buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
        };
        attempt().unwrap_or(false)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.try_ping() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server exited ({status}) during start-up; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        panic!("redis-server did not answer PING within 20 s; its log:\n{log}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write clock file");
    std::fs::rename(&tmp, path).expect("replace clock file");
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .chain([
            Path::new("/usr/bin").join(program),
            Path::new("/usr/sbin").join(program),
        ])
        .find(|p| p.is_file())
}

#[test]
fn faketime_spec_formats_civil_dates() {
    assert_eq!(faketime_spec(1_805_112_000), "@2027-03-15 12:00:00");
    assert_eq!(faketime_spec(0), "@1970-01-01 00:00:00");
    assert_eq!(faketime_spec(951_782_400), "@2000-02-29 00:00:00");
}

/// A node's view of who serves which slots, from its `CLUSTER NODES` reply: every line's
/// address and slot ranges, sorted, without the per-node fields (flags such as `myself`, ping
/// times, link state) that legitimately differ between nodes.
fn slot_map(cluster_nodes: &str) -> String {
    let mut lines: Vec<String> = cluster_nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8).then(|| format!("{} {}", fields[1], fields[8..].join(" ")))
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

/// A 3-master Redis Cluster on loopback (`redis-cli --cluster create`), stopped when dropped.
pub struct RedisCluster {
    pub nodes: Vec<std::sync::Arc<RedisServer>>,
}

impl RedisCluster {
    /// One cluster-enabled server on a loopback port, not joined yet.
    fn node(clock: Clock) -> std::sync::Arc<RedisServer> {
        Self::node_with_timeout(clock, "15000")
    }

    fn node_with_timeout(clock: Clock, node_timeout_ms: &str) -> std::sync::Arc<RedisServer> {
        std::sync::Arc::new(RedisServer::start(
            clock,
            Listen::Tcp(free_port()),
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                node_timeout_ms,
            ],
        ))
    }

    /// Starts three cluster-enabled servers on `clock`, joins them, and waits for
    /// `cluster_state:ok`.
    pub fn start(clock: Clock) -> Self {
        Self::create((0..3).map(|_| Self::node(clock)).collect(), 0)
    }

    /// Three masters, each with one replica (`--cluster-replicas 1`), and a node timeout of 2 s
    /// so that a master killed with SIGKILL is replaced by its replica within seconds.
    pub fn start_with_replicas(clock: Clock) -> Self {
        Self::create(
            (0..6)
                .map(|_| Self::node_with_timeout(clock, "2000"))
                .collect(),
            1,
        )
    }

    /// Which nodes are masters now (`ROLE`), by index in [`nodes`](Self::nodes), leaving out
    /// `skip` (a node that was stopped).
    pub fn masters(&self, skip: Option<usize>) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| Some(*i) != skip && self.nodes[*i].raw("ROLE").contains("master"))
            .collect()
    }

    /// Waits until every node that answers says `cluster_state:ok` with every slot served.
    pub fn wait_ok(&self, skip: Option<usize>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !(0..self.nodes.len()).filter(|i| Some(*i) != skip).all(|i| {
            let info = self.nodes[i].raw("CLUSTER INFO");
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster never became ok"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn create(nodes: Vec<std::sync::Arc<RedisServer>>, replicas: u32) -> Self {
        let known = format!("cluster_known_nodes:{}", nodes.len());
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port().expect("tcp")))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli is required (scripts/install-services installs redis-tools)");
        assert!(status.success(), "redis-cli --cluster create failed");
        // `cluster_state:ok` on every node is not enough: a node can report it before it knows
        // every other node's address, and a client routed by its slot map then waits on a
        // node it cannot reach yet. Wait until every node knows all three, covers every slot,
        // and hands out the same slot map.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let agreed = |nodes: &[std::sync::Arc<RedisServer>]| {
            let ok = nodes.iter().all(|n| {
                let info = n.raw("CLUSTER INFO");
                info.contains("cluster_state:ok")
                    && info.contains(&known)
                    && info.contains("cluster_slots_ok:16384")
            });
            let maps: Vec<String> = nodes
                .iter()
                .map(|n| slot_map(&n.raw("CLUSTER NODES")))
                .collect();
            ok && maps.windows(2).all(|w| w[0] == w[1])
        };
        while !agreed(&nodes) {
            assert!(
                std::time::Instant::now() < deadline,
                "cluster never became ok"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Self { nodes }
    }

    /// Adds an empty master (`redis-cli --cluster add-node`) and waits until every node knows
    /// it. Its slots come with [`rebalance_onto_empty_masters`](Self::rebalance_onto_empty_masters).
    pub fn add_master(&mut self, clock: Clock) {
        let node = Self::node(clock);
        let port = node.port().expect("tcp");
        let first = format!("127.0.0.1:{}", self.nodes[0].port().expect("tcp"));
        let status = Command::new("redis-cli")
            .args([
                "--cluster",
                "add-node",
                &format!("127.0.0.1:{port}"),
                &first,
            ])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster add-node failed");
        self.nodes.push(node);
        let count = format!("cluster_known_nodes:{}", self.nodes.len());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // Known by all, and ok on all: a node that still thinks the cluster is down refuses the
        // keys a rebalance migrates to it (CLUSTERDOWN).
        while !self.nodes.iter().all(|n| {
            let info = n.raw("CLUSTER INFO");
            info.contains(&count) && info.contains("cluster_state:ok")
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "the new master never became known"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// `redis-cli --cluster rebalance --cluster-use-empty-masters`: moves slots (and their keys)
    /// onto masters that have none, while clients go on. Blocks until it is done.
    pub fn rebalance_onto_empty_masters(&self) {
        let first = format!("127.0.0.1:{}", self.nodes[0].port().expect("tcp"));
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "rebalance",
                &first,
                "--cluster-use-empty-masters",
            ])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster rebalance failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every node's URL (each a seed).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// A cluster store on these nodes with the default key prefix.
    pub async fn store(&self) -> mailbox_materializer::store::redis::RedisStore {
        let urls = self.seed_urls();
        let mut settings = mailbox_materializer::store::redis::RedisSettings::new(
            urls[0].clone(),
            mailbox_materializer::config::RedisConfig::default().key_prefix,
        );
        settings.cluster = true;
        settings.extra_nodes = urls[1..].to_vec();
        mailbox_materializer::store::redis::RedisStore::connect(
            settings,
            mailbox_materializer::model::RetentionPolicy::default(),
        )
        .await
        .expect("connect to the test cluster")
    }
}
