//! Serves the daemon's endpoints on hyper's HTTP/1.1 server: keep-alive (a Prometheus scraper
//! reuses its connection), `HEAD` on every route (hyper sends the headers and no body), at most
//! [`MAX_CONNECTIONS`] connections at once (the rest wait in the listen backlog), a slow client
//! bounded by [`CLIENT_TIMEOUT`] for its request head and for every stalled write.
//!
//! Routes: `/metrics`, `/healthz`, `/readyz`, and with `http.debug_endpoints` `/debug/blocked`
//! and the streamed `/debug/tap`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use super::write_deadline::WriteDeadline;
use super::Health;

/// Most connections served at once. Each costs a task and two small buffers; Prometheus, the
/// kubelet's probes, `top` and a few taps need a handful. Beyond it, connections wait in the
/// kernel's backlog until one closes (a slow client is closed within [`CLIENT_TIMEOUT`]).
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send a request head (also how long an idle kept-alive
/// connection stays open), and how long one write to it may stall: a slow or stuck client gets a
/// bounded amount of our time, a tap's stream included.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most events one write of `/debug/tap` carries.
const TAP_BURST: usize = 512;

/// Bursts of `/debug/tap` waiting for a client's socket; past it the tap's own buffer fills
/// and the client is told how many events it dropped.
const TAP_BURSTS_QUEUED: usize = 4;

type Body = BoxBody<Bytes, Infallible>;

/// Binds `listen` and serves until the process exits. Returns the bound address (port 0 picks
/// one) or the bind error.
pub async fn serve(listen: &str, health: Arc<Health>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let health = health.clone();
            tokio::spawn(async move {
                let io = TokioIo::new(WriteDeadline::new(stream, CLIENT_TIMEOUT));
                let service = hyper::service::service_fn(move |request| {
                    let health = health.clone();
                    async move { Ok::<_, Infallible>(route(&health, &request)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(CLIENT_TIMEOUT)
                    .keep_alive(true)
                    .serve_connection(io, service)
                    .await;
                drop(slot);
            });
        }
    });
    Ok(addr)
}

/// The response to one request. `HEAD` is routed as `GET`; hyper leaves the body out.
fn route(health: &Health, request: &Request<Incoming>) -> Response<Body> {
    let method = request.method();
    if request.uri().path() == "/records-lost/accept" {
        return accept_records_lost(health, request);
    }
    if method != Method::GET && method != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".to_owned(),
        );
    }
    match request.uri().path() {
        "/metrics" => match super::super::metrics::handle() {
            Some(handle) => respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                handle.render(),
            ),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "metrics recorder not installed\n".to_owned(),
            ),
        },
        "/healthz" => match health.liveness.check(super::now_ms()) {
            Ok(()) => text(StatusCode::OK, "ok\n".to_owned()),
            Err(line) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{line}\n")),
        },
        "/readyz" => {
            let status = if health.ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, health.describe())
        }
        "/debug/blocked" | "/debug/tap" if !health.debug_endpoints() => text(
            StatusCode::NOT_FOUND,
            "not served: it names users; set http.debug_endpoints = true to serve it\n".to_owned(),
        ),
        "/debug/blocked" => respond(StatusCode::OK, "application/json", health.blocked_json()),
        "/debug/tap" if method == Method::HEAD => {
            respond(StatusCode::OK, "application/x-ndjson", String::new())
        }
        "/debug/tap" => tap(health, request.uri().query().unwrap_or("")),
        _ => text(StatusCode::NOT_FOUND, "not found\n".to_owned()),
    }
}

/// `POST /records-lost/accept?partition=N` (SPEC 7.3, `kafka.on_records_lost = "hold"`): the
/// operator accepts that the log deleted records of a held partition before they were read; the
/// partition carries on from the log's start. Only a partition held on this replica is accepted.
fn accept_records_lost(health: &Health, request: &Request<Incoming>) -> Response<Body> {
    if request.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only POST: /records-lost/accept?partition=N\n".to_owned(),
        );
    }
    let partition = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("partition="))
        .and_then(|value| value.parse::<i32>().ok())
        .filter(|p| *p >= 0);
    let Some(partition) = partition else {
        return text(
            StatusCode::BAD_REQUEST,
            "partition: a dispatch-topic partition number is required: /records-lost/accept?partition=N\n"
                .to_owned(),
        );
    };
    match health.accept_records_lost(partition) {
        Ok((from, to)) => text(
            StatusCode::OK,
            format!(
                "accepted: partition {partition} carries on past the lost offsets {from}..{to}\n"
            ),
        ),
        Err(why) => text(StatusCode::CONFLICT, format!("{why}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", body)
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// `/debug/tap`: one JSON line per final delivery the filter admits, until the client goes;
/// `{"dropped": N}` when the client fell [`super::super::tap::TAP_BUFFER`] events behind.
fn tap(health: &Health, query: &str) -> Response<Body> {
    let filter = match super::super::tap::TapFilter::parse(query) {
        Ok(filter) => filter,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let Some(events) = health.tap.subscribe() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "at most {} taps at once\n",
                super::super::tap::MAX_TAP_CLIENTS
            ),
        );
    };
    let (tx, rx) = mpsc::channel(TAP_BURSTS_QUEUED);
    tokio::spawn(feed_tap(events, filter, tx));
    let mut response = Response::new(TapBody(rx).boxed());
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

/// Moves a tap's events into its response in bursts: one write per burst, not per event, since
/// at tens of thousands of decisions a second a write each would cost the daemon's runtime more
/// than the decisions themselves. Ends when the client goes (its body is dropped) or the tap
/// closes.
async fn feed_tap(
    mut events: tokio::sync::broadcast::Receiver<Arc<super::super::tap::TapEvent>>,
    filter: super::super::tap::TapFilter,
    tx: mpsc::Sender<Bytes>,
) {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    loop {
        let first = tokio::select! {
            received = events.recv() => received,
            () = tx.closed() => return,
        };
        let mut batch = String::new();
        let mut next = Some(first);
        let mut taken = 0;
        let mut closed = false;
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
                Err(RecvError::Closed) => closed = true,
            }
            taken += 1;
            if taken < TAP_BURST && !closed {
                next = match events.try_recv() {
                    Ok(event) => Some(Ok(event)),
                    Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
                    Err(_) => None,
                };
            }
        }
        if !batch.is_empty() && tx.send(Bytes::from(batch)).await.is_err() {
            return;
        }
        if closed {
            return;
        }
    }
}

/// A streamed response body fed by [`feed_tap`]; it ends when the feeder does.
struct TapBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for TapBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|burst| burst.map(|bytes| Ok(Frame::data(bytes))))
    }
}
