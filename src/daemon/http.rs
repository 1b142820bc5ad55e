//! The daemon's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the engine loop and
//! the poll thread make progress: `liveness`),
//! `/debug/tap` (every final delivery as a JSON line, streamed; with `http.debug_endpoints`),
//! `/debug/blocked` (the mailboxes this replica holds failing closed, JSON; only with
//! `http.debug_endpoints`, since it names users),
//! `/readyz` (every readiness condition of [`Health::describe`] holds: the store and the broker
//! answer, writes and dead letters succeed, partitions are readable, ...).
//!
//! A deliberately tiny HTTP/1.1 responder on tokio: three GET routes, one response per connection,
//! no request body. A full HTTP stack would add minutes of build and attack surface for nothing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What `/readyz` reports, updated by the daemon's health checks.
#[derive(Debug, Default)]
pub struct Health {
    store_ok: AtomicBool,
    broker_ok: AtomicBool,
    /// True while an assigned partition is stalled (records waiting that cannot be read), and
    /// for good once the consumer failed fatally (the run is draining to exit).
    consumer_stalled: AtomicBool,
    /// True while dead letters keep failing (their records' offsets wait).
    dead_letters_failing: AtomicBool,
    /// When a store write last failed transiently (ms since the Unix epoch; 0: never). A store
    /// that answers pings but refuses writes (too few replica acknowledgements) is not ready.
    write_failed_at_ms: std::sync::atomic::AtomicU64,
    /// Failing while the subscribed topic cannot be consumed (missing, unauthorized, without
    /// partitions) or no assignment arrived in time (`health::subscription`); its line also says
    /// why a ready replica is idle.
    subscription: Condition,
    /// Failing while a Redis master evicts keys without `store.redis.allow_eviction`
    /// (`health::watch_redis_masters`).
    store_policy: Condition,
    /// Failing while a Redis Cluster slot stays migrating or importing (an interrupted reshard;
    /// `health::watch_redis_masters`).
    store_slots: Condition,
    /// Failing while more mailboxes fail closed than `kafka.max_blocked_mailboxes` (the
    /// engine's housekeeping).
    blocked: Condition,
    /// Failing while the broker says the daemon lacks an ACL records need (`health::spawn`).
    kafka_grants: Condition,
    /// Why the store did not open yet at start (unreachable, a missing grant, an incomplete
    /// schema): the `store:` line of `/readyz` until it opens.
    store_waiting: std::sync::Mutex<Option<String>>,
    /// The mailboxes failing closed, as the engine's housekeeping last listed them
    /// (`/debug/blocked`): how many, and the first [`BLOCKED_SHOWN`].
    blocked_list: std::sync::Mutex<(usize, Vec<Blocked>)>,
    /// Serve `/debug/blocked` (`http.debug_endpoints`): it names users, so it is off unless asked.
    debug_endpoints: AtomicBool,
    /// The engine loop's and the poll thread's heartbeats (`/healthz`).
    pub(crate) liveness: super::liveness::Liveness,
    /// The live decisions `/debug/tap` streams.
    pub(crate) tap: super::tap::Tap,
}

/// A readiness condition that a probe decides as a whole: whether it fails, and its `/readyz`
/// line when that is not plain `ok` (the problem, or a note on a condition that holds).
#[derive(Debug, Default)]
struct Condition {
    failing: AtomicBool,
    line: std::sync::Mutex<Option<String>>,
}

impl Condition {
    fn set(&self, failing: bool, line: Option<String>) {
        self.failing.store(failing, Ordering::Relaxed);
        *self.line.lock().unwrap_or_else(|p| p.into_inner()) = line;
    }

    fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    fn line(&self) -> String {
        self.line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "ok".to_owned())
    }
}

/// Most blocked mailboxes `/debug/blocked` lists (it also says how many there are).
pub(crate) const BLOCKED_SHOWN: usize = 100;

/// One mailbox a replica holds failing closed (`/debug/blocked`, `materializer explain`): the
/// delivery it stopped at and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub partition: i32,
    pub user_id: String,
    pub epoch: u32,
    /// The offset of the record whose delivery failed closed: the committed offset stays at or
    /// before it until the mailbox is repaired.
    pub offset: i64,
    /// The error kind (`index_lost`, `identity_missing`, ...).
    pub kind: String,
    pub detail: String,
    /// When it started failing closed, ms since the Unix epoch.
    pub since_ms: u64,
}

/// How long after a transient write failure the store counts as not ready.
pub(crate) const WRITE_FAILURE_WINDOW_MS: u64 = 5_000;

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Health {
    pub(crate) fn set_store(&self, ok: bool) {
        self.store_ok.store(ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Why the store is not open yet (`None` once it is).
    pub(crate) fn set_store_waiting(&self, why: Option<String>) {
        *self.store_waiting.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    pub(crate) fn set_broker(&self, ok: bool) {
        self.broker_ok.store(ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Whether every assigned partition can be read (see the engine's stall detection).
    pub(crate) fn set_consumer(&self, ok: bool) {
        self.consumer_stalled.store(!ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// Whether dead letters are being acknowledged.
    pub(crate) fn set_dead_letters(&self, ok: bool) {
        self.dead_letters_failing.store(!ok, Ordering::Relaxed);
        super::metrics::ready(self.ready());
    }

    /// The subscription's state: `failing` turns readiness false; `line` (the problem, or a
    /// note such as idle) replaces `ok` on `/readyz`.
    pub(crate) fn set_subscription(&self, failing: bool, line: Option<String>) {
        self.subscription.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The store's eviction policy as the periodic re-check found it (`health::watch_redis_masters`).
    pub(crate) fn set_store_policy(&self, failing: bool, line: Option<String>) {
        self.store_policy.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The cluster's open slots as the periodic check found them (`health::watch_redis_masters`).
    pub(crate) fn set_store_slots(&self, failing: bool, line: Option<String>) {
        self.store_slots.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// The Kafka ACLs the daemon lacks, as the broker last said.
    pub(crate) fn set_kafka_grants(&self, failing: bool, line: Option<String>) {
        self.kafka_grants.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// Turns `/debug/blocked` on (`http.debug_endpoints`).
    pub fn serve_debug_endpoints(&self, on: bool) {
        self.debug_endpoints.store(on, Ordering::Relaxed);
    }

    /// The mailboxes failing closed: how many, and the first [`BLOCKED_SHOWN`] of them.
    pub(crate) fn set_blocked_list(&self, total: usize, shown: Vec<Blocked>) {
        *self.blocked_list.lock().unwrap_or_else(|p| p.into_inner()) = (total, shown);
    }

    /// `/debug/blocked`'s body.
    fn blocked_json(&self) -> String {
        let (total, shown) = self
            .blocked_list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        serde_json::json!({"total": total, "shown": shown.len(), "blocked": shown}).to_string()
    }

    /// The mailboxes this replica holds failing closed, against its limit.
    pub(crate) fn set_blocked(&self, failing: bool, line: Option<String>) {
        self.blocked.set(failing, line);
        super::metrics::ready(self.ready());
    }

    /// A store write failed transiently just now.
    pub(crate) fn write_failed(&self) {
        self.write_failed_at_ms.store(now_ms(), Ordering::Relaxed);
        super::metrics::ready(false);
    }

    /// Sets the `ready` gauge from the current state (a write failure ages out of the window).
    pub fn refresh(&self) {
        super::metrics::ready(self.ready());
    }

    pub(crate) fn store_ok(&self) -> bool {
        self.store_ok.load(Ordering::Relaxed)
    }

    pub(crate) fn broker_ok(&self) -> bool {
        self.broker_ok.load(Ordering::Relaxed)
    }

    /// One line per readiness condition, for `/readyz`'s body.
    pub(crate) fn describe(&self) -> String {
        let word = |ok: bool, bad: &'static str| if ok { "ok" } else { bad };
        let recent_write_failure = now_ms()
            .saturating_sub(self.write_failed_at_ms.load(Ordering::Relaxed))
            < WRITE_FAILURE_WINDOW_MS;
        format!(
            "store: {}\nstore writes: {}\nstore policy: {}\nstore slots: {}\nbroker: {}\nkafka grants: {}\nsubscription: {}\npartitions: {}\nblocked mailboxes: {}\ndead letters: {}\n",
            if self.store_ok() {
                "ok".to_owned()
            } else {
                self.store_waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_else(|| "unreachable".to_owned())
            },
            word(!recent_write_failure, "failing"),
            self.store_policy.line(),
            self.store_slots.line(),
            word(self.broker_ok(), "unreachable"),
            self.kafka_grants.line(),
            self.subscription.line(),
            word(!self.consumer_stalled.load(Ordering::Relaxed), "stalled"),
            self.blocked.line(),
            word(
                !self.dead_letters_failing.load(Ordering::Relaxed),
                "failing"
            ),
        )
    }

    pub fn ready(&self) -> bool {
        let recent_write_failure = now_ms()
            .saturating_sub(self.write_failed_at_ms.load(Ordering::Relaxed))
            < WRITE_FAILURE_WINDOW_MS;
        self.store_ok()
            && self.broker_ok()
            && !self.consumer_stalled.load(Ordering::Relaxed)
            && !self.dead_letters_failing.load(Ordering::Relaxed)
            && !recent_write_failure
            && !self.subscription.failing()
            && !self.store_policy.failing()
            && !self.store_slots.failing()
            && !self.blocked.failing()
            && !self.kafka_grants.failing()
    }
}

/// Binds `listen` and serves until the process exits. Returns the bound address (port 0 picks
/// one) or the bind error.
pub async fn serve(listen: &str, health: Arc<Health>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let health = health.clone();
                    tokio::spawn(async move {
                        let _ = respond(stream, health).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(addr)
}

/// How long a client may take to send its request, and to take a response: a slow or stuck
/// client gets a bounded amount of our time (`/debug/tap`'s stream excepted).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

async fn respond(mut stream: TcpStream, health: Arc<Health>) -> std::io::Result<()> {
    let request = tokio::time::timeout(CLIENT_TIMEOUT, read_request(&mut stream))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let mut parts = request.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if (method, path) == ("GET", "/debug/tap") && health.debug_endpoints.load(Ordering::Relaxed) {
        return stream_tap(stream, &health, query).await;
    }
    tokio::time::timeout(CLIENT_TIMEOUT, answer(stream, &health, method, path))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// `/debug/tap`: one JSON line per final delivery the filter admits, until the client goes;
/// `{"dropped": N}` when the client fell [`super::tap::TAP_BUFFER`] events behind.
async fn stream_tap(mut stream: TcpStream, health: &Health, query: &str) -> std::io::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
    let filter = match super::tap::TapFilter::parse(query) {
        Ok(filter) => filter,
        Err(e) => {
            let body = format!("{e}\n");
            let head = format!("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
            return stream.shutdown().await;
        }
    };
    let Some(mut events) = health.tap.subscribe() else {
        let body = format!("at most {} taps at once\n", super::tap::MAX_TAP_CLIENTS);
        let head = format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        return stream.shutdown().await;
    };
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n",
        )
        .await?;
    // One write per burst, not per event: at tens of thousands of decisions a second, a
    // syscall each would cost the daemon's runtime more than the decisions themselves.
    let mut batch = String::new();
    loop {
        batch.clear();
        let first = events.recv().await;
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(received) = next.take() {
            match received {
                Ok(event) if filter.admits(&event) => {
                    if let Ok(line) = serde_json::to_string(&*event) {
                        batch.push_str(&line);
                        batch.push('\n');
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(n)) => batch.push_str(&format!("{{\"dropped\":{n}}}\n")),
                Err(RecvError::Closed) => {
                    stream.write_all(batch.as_bytes()).await?;
                    return stream.shutdown().await;
                }
            }
            taken += 1;
            if taken < TAP_BURST {
                next = match events.try_recv() {
                    Ok(event) => Some(Ok(event)),
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                        Some(Err(RecvError::Lagged(n)))
                    }
                    Err(_) => None,
                };
            }
        }
        // A client gone is found at the next write.
        if !batch.is_empty() {
            stream.write_all(batch.as_bytes()).await?;
        }
    }
}

/// Most events one write of `/debug/tap` carries.
const TAP_BURST: usize = 512;

/// Reads the request head (bounded); only the request line matters.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<String> {
    // Only the request line matters; headers are read up to a bounded size and ignored.
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || len == buf.len() {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// Every response but the tap's: one body, then the connection closes.
async fn answer(
    mut stream: TcpStream,
    health: &Health,
    method: &str,
    path: &str,
) -> std::io::Result<()> {
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => match super::metrics::handle() {
            Some(handle) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                handle.render(),
            ),
            None => (
                "503 Service Unavailable",
                "text/plain",
                "metrics recorder not installed\n".to_owned(),
            ),
        },
        ("GET", "/healthz") => match health.liveness.check(now_ms()) {
            Ok(()) => ("200 OK", "text/plain", "ok\n".to_owned()),
            Err(line) => ("503 Service Unavailable", "text/plain", format!("{line}\n")),
        },
        ("GET", "/readyz") => {
            let body = health.describe();
            if health.ready() {
                ("200 OK", "text/plain", body)
            } else {
                ("503 Service Unavailable", "text/plain", body)
            }
        }
        ("GET", "/debug/blocked") if health.debug_endpoints.load(Ordering::Relaxed) => {
            ("200 OK", "application/json", health.blocked_json())
        }
        ("GET", "/debug/blocked" | "/debug/tap") => (
            "404 Not Found",
            "text/plain",
            "not served: it names users; set http.debug_endpoints = true to serve it\n".to_owned(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
