//! One replica's `/metrics` and `/readyz`, fetched with hyper's HTTP/1 client (the crate the
//! replicas serve with: chunked bodies, keep-alive and the rest of HTTP are its business) and
//! parsed from the Prometheus text format.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use tokio::net::TcpStream;

/// Most bytes read from one response (a scrape is a few tens of KiB).
const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// One sample: a metric name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub(super) fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// What one replica answered.
#[derive(Debug, Clone)]
pub(super) struct Scrape {
    pub at: Instant,
    pub samples: Vec<Sample>,
    /// `/readyz`: ready, and the conditions that are not `ok` (`store: unreachable`, ...).
    pub ready: bool,
    pub not_ready: Vec<String>,
    /// `/debug/blocked`: the mailboxes the replica holds failing closed (empty when it does not
    /// serve the debug endpoints).
    pub blocked: Vec<crate::daemon::http::Blocked>,
}

/// `host:port`, `http://host:port` or `http://host:port/metrics`: the `host:port`.
pub(crate) fn authority(address: &str) -> &str {
    let rest = address.strip_prefix("http://").unwrap_or(address);
    rest.split('/').next().unwrap_or(rest)
}

/// Scrapes `address` within `timeout`.
pub(super) async fn scrape(address: &str, timeout: Duration) -> Result<Scrape, String> {
    let at = Instant::now();
    let host = authority(address);
    let (status, body) = get(host, "/metrics", timeout).await?;
    if status != 200 {
        return Err(format!("/metrics answered {status}"));
    }
    let samples = parse(&body);
    let (status, readyz) = get(host, "/readyz", timeout).await?;
    let not_ready: Vec<String> = readyz
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_end().ends_with(": ok"))
        .map(str::to_owned)
        .collect();
    // Only a replica with blocked mailboxes is asked why (and answers only with
    // `http.debug_endpoints`).
    let any_blocked = samples
        .iter()
        .any(|s| s.name == "materializer_partition_blocked" && s.value > 0.0);
    let blocked = match any_blocked {
        true => match get(host, "/debug/blocked", timeout).await {
            Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| serde_json::from_value(v["blocked"].clone()).ok())
                .unwrap_or_default(),
            _ => Vec::new(),
        },
        false => Vec::new(),
    };
    Ok(Scrape {
        at,
        samples,
        ready: status == 200,
        not_ready,
        blocked,
    })
}

/// Sends `GET path` to `host` over one HTTP/1 connection (hyper's client): the response, its
/// body still to read, and the task driving the connection, to abort once the body is read.
/// `top`, `explain`, `verify` and `tap` all reach replicas through it.
pub(crate) async fn send_get(
    host: &str,
    path: &str,
) -> Result<
    (
        hyper::Response<hyper::body::Incoming>,
        tokio::task::JoinHandle<Result<(), hyper::Error>>,
    ),
    String,
> {
    let stream = TcpStream::connect(host).await.map_err(|e| format!("{e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("{e}"))?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{path}: {e}"))?;
    match sender.send_request(request).await {
        Ok(response) => Ok((response, driver)),
        Err(e) => {
            driver.abort();
            Err(format!("{path}: {e}"))
        }
    }
}

/// `GET path` on `host`: the status and the body (at most [`MAX_RESPONSE_BYTES`]).
pub(crate) async fn get(
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let exchange = async {
        let (response, driver) = send_get(host, path).await?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{path}: {e}"))?
            .to_bytes();
        driver.abort();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

/// The samples of a Prometheus text exposition (comments and malformed lines are skipped).
pub(super) fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y\"z"` into a map (escapes `\\`, `\"`, `\n` undone).
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        labels.insert(name.trim().to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exposition_format() {
        let text = "# HELP x y\n# TYPE materializer_records_total counter\nmaterializer_records_total{outcome=\"applied\"} 12\nmaterializer_ready 1\nmaterializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"+Inf\"} 3\nweird{a=\"q\\\"uote,d\"} 1.5e3\nbroken{a=\"x\" 1\n";
        let samples = parse(text);
        assert_eq!(samples.len(), 4, "{samples:?}");
        assert_eq!(samples[0].name, "materializer_records_total");
        assert_eq!(samples[0].label("outcome"), Some("applied"));
        assert_eq!(samples[0].value, 12.0);
        assert_eq!(samples[1].name, "materializer_ready");
        assert!(samples[1].labels.is_empty());
        assert_eq!(samples[2].label("le"), Some("+Inf"));
        assert_eq!(samples[3].label("a"), Some("q\"uote,d"));
        assert_eq!(samples[3].value, 1500.0);
    }

    /// A body sent in chunks (what a proxy or a later server may do) reads as the whole body;
    /// the raw client this replaced returned the chunk sizes inside the text.
    #[tokio::test]
    async fn a_chunked_answer_is_read_whole() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let response = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                            12\r\nmaterializer_ready\r\n2\r\n 1\r\n0\r\n\r\n";
            socket.write_all(response.as_bytes()).await.expect("write");
        });
        let (status, body) = get(&address, "/metrics", Duration::from_secs(5))
            .await
            .expect("answered");
        assert_eq!(status, 200);
        assert_eq!(body, "materializer_ready 1");
        assert_eq!(parse(&body)[0].value, 1.0);
    }

    #[test]
    fn an_address_may_be_a_url() {
        assert_eq!(authority("127.0.0.1:9898"), "127.0.0.1:9898");
        assert_eq!(authority("http://pod-a:9898/metrics"), "pod-a:9898");
    }
}
