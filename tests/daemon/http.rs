//! The daemon's HTTP endpoints as real clients use them: a scraper that keeps its connection
//! (two requests, two answers), `HEAD` (headers and no body), a method the daemon does not serve,
//! a client that connects and says nothing (closed, never held), and more clients at once than the
//! connection limit (the one past it waits for a slot, and gets it when one frees).

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::kafka::{create_topic, Daemon, DaemonSetup};

/// The daemon's `MAX_CONNECTIONS`.
const MAX_CONNECTIONS: usize = 64;

/// Reads one response of known length from a kept-alive connection: `(head, body)`.
fn read_response(stream: &mut TcpStream, with_body: bool) -> (String, String) {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("a response head");
        assert_eq!(n, 1, "the connection closed mid-head: {bytes:?}");
        bytes.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&bytes).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().expect("a length"))
        })
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; if with_body { length } else { 0 }];
    stream.read_exact(&mut body).expect("the body");
    (head, String::from_utf8_lossy(&body).into_owned())
}

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream
}

#[tokio::test(flavor = "multi_thread")]
async fn the_endpoints_keep_connections_answer_head_and_bound_their_clients() {
    let setup = DaemonSetup::new("http-stack", None);
    create_topic(&setup.topic, 1).await;
    let daemon = Daemon::start(&setup);
    let port = daemon.http_port;

    // Keep-alive: a GET, a HEAD and another GET on one connection.
    let mut kept = connect(port);
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let (head, body) = read_response(&mut kept, true);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("materializer_"), "{body}");
    kept.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let (head, _) = read_response(&mut kept, false);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Had HEAD sent a body, its first bytes would be read here instead of a status line.
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let (head, body) = read_response(&mut kept, true);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "ok\n");

    let mut post = connect(port);
    post.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .expect("send");
    let (head, _) = read_response(&mut post, true);
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");

    // A client that connects and says nothing is closed by the daemon (slowloris holds nothing).
    let mut silent = connect(port);
    let mut rest = Vec::new();
    let closed = silent.read_to_end(&mut rest);
    assert!(
        matches!(closed, Ok(0)),
        "a silent client is closed by the daemon: {closed:?}"
    );

    // The connection limit: with every slot held by an idle kept-alive connection, one more
    // client is not answered; it is as soon as a slot frees.
    drop((kept, post));
    let mut held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut c = connect(port);
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("send");
            read_response(&mut c, true);
            c
        })
        .collect();
    let mut waiting = connect(port);
    waiting
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut first = [0u8; 1];
    let early = waiting.read(&mut first);
    assert!(
        early.is_err(),
        "a client past the limit waits while every slot is held: {early:?}"
    );
    held.pop();
    waiting
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut response = String::new();
    waiting.read_to_string(&mut response).expect("an answer");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
