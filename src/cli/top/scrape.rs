//! One replica's `/metrics` and `/readyz`, fetched over plain HTTP and parsed from the
//! Prometheus text format (the daemon serves nothing else; no HTTP client crate needed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// `GET path` on `host`: the status and the body.
pub(crate) async fn get(
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(host).await.map_err(|e| format!("{e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("{e}"))?;
        let mut response = Vec::new();
        let mut chunk = [0u8; 16 << 10];
        loop {
            let n = stream.read(&mut chunk).await.map_err(|e| format!("{e}"))?;
            if n == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..n]);
            if response.len() > MAX_RESPONSE_BYTES {
                return Err(format!("{path} is larger than {MAX_RESPONSE_BYTES} bytes"));
            }
        }
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{path}: not an HTTP response"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{path}: no status"))?;
        Ok((status, body.to_owned()))
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

    #[test]
    fn an_address_may_be_a_url() {
        assert_eq!(authority("127.0.0.1:9898"), "127.0.0.1:9898");
        assert_eq!(authority("http://pod-a:9898/metrics"), "pod-a:9898");
    }
}
