//! The public listener of the real binary: no route changes anything (every method but GET/HEAD
//! gets a 405 XRPC error, and the index and bucket are untouched afterwards), request size limits
//! (a 414 for a huge request target, a 413 for a body, hyper's bound on the head), and time and
//! count limits on connections (an idle or trickling connection is closed; connections over
//! `max_connections` wait until one closes).

mod support;

use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{BIN, CAPTURE, Server};

const TARGET: &str = "at%3A%2F%2Fdid%3Aplc%3Avfnmgxg2yscfliemmcxzyfyh%2Fapp.bsky.feed.post%2F3mmoodizfwc2j";

/// Every route the router serves, with parameters that make GET succeed.
fn routes() -> Vec<String> {
    vec![
        "/".to_string(),
        "/xrpc/_health".to_string(),
        "/metrics".to_string(),
        "/lexicons".to_string(),
        "/lexicons/blue.cerulea.backlinks.listBacklinks.json".to_string(),
        format!("/xrpc/blue.cerulea.backlinks.listBacklinks?target={TARGET}"),
        format!("/xrpc/blue.cerulea.backlinks.countBacklinks?target={TARGET}"),
        format!("/xrpc/blue.microcosm.links.getBacklinks?subject={TARGET}&source=app.bsky.feed.like:subject.uri"),
        format!("/xrpc/blue.microcosm.links.getBacklinksCount?subject={TARGET}&source=app.bsky.feed.like:subject.uri"),
        format!("/xrpc/blue.microcosm.links.getBacklinkDids?subject={TARGET}&source=app.bsky.feed.like:subject.uri"),
        format!("/ui/backlinks?target={TARGET}"),
    ]
}

/// A data directory with the capture imported and published.
fn imported() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ok, _, stderr) = support::run(&["import", "--data-dir", data.to_str().unwrap(), CAPTURE]);
    assert!(ok, "{stderr}");
    (dir, data)
}

/// Sends `request` as is and reads the whole answer (the request asks the server to close).
fn exchange(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

fn request(method: &str, path: &str, addr: &str, extra_headers: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra_headers}\r\n").into_bytes()
}

/// (status, headers, body) of a response.
fn parse(response: &str) -> (u16, String, String) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not HTTP: {response:?}"));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// Every file under `dir` with its bytes, to prove nothing changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn no_route_answers_a_mutating_method_and_nothing_changes() {
    let (_dir, data) = imported();
    let server = Server::start(&data);
    let bucket_before = snapshot(&data.join("bucket"));
    let (_, health_before) = server.get("/xrpc/_health");
    let (_, answer_before) = server.get(&routes()[5]);
    assert_eq!(answer_before["backlinks"]["$.subject"].as_array().map(Vec::len), Some(1));
    for path in routes() {
        let (status, _, _) = parse(&exchange(&server.addr, &request("GET", &path, &server.addr, "")));
        assert_eq!(status, 200, "GET {path}");
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let response = exchange(&server.addr, &request(method, &path, &server.addr, "Content-Length: 0\r\n"));
            let (status, head, body) = parse(&response);
            assert_eq!(status, 405, "{method} {path}: {response}");
            assert!(head.contains("cache-control: no-store"), "{method} {path}: {head}");
            let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
            assert_eq!(body["error"], "MethodNotAllowed", "{method} {path}");
        }
    }
    for method in ["POST", "PUT", "DELETE", "PATCH", "GET"] {
        let response =
            exchange(&server.addr, &request(method, "/xrpc/com.example.write", &server.addr, "Content-Length: 0\r\n"));
        assert_eq!(parse(&response).0, 404, "{method} of an unknown route");
    }
    // CORS preflights offer reading only.
    let preflight = "Origin: https://example.com\r\nAccess-Control-Request-Method: POST\r\n";
    let (_, head, _) = parse(&exchange(&server.addr, &request("OPTIONS", &routes()[5], &server.addr, preflight)));
    let allowed = head.lines().find(|l| l.starts_with("access-control-allow-methods:")).unwrap_or_default().to_string();
    assert!(allowed.contains("get") && !allowed.contains("post") && !allowed.contains("delete"), "{head}");
    assert_eq!(server.get("/xrpc/_health").1["clock"], health_before["clock"]);
    assert_eq!(server.get(&routes()[5]).1, answer_before);
    assert!(snapshot(&data.join("bucket")) == bucket_before, "the bucket changed");
}

#[test]
fn oversized_requests_are_refused_and_the_server_carries_on() {
    let (_dir, data) = imported();
    let server = Server::start(&data);
    let long_target = format!("/xrpc/blue.cerulea.backlinks.listBacklinks?target={TARGET}&x={}", "a".repeat(40_000));
    let (status, head, body) = parse(&exchange(&server.addr, &request("GET", &long_target, &server.addr, "")));
    assert_eq!(status, 414);
    assert!(head.contains("cache-control: no-store") && head.contains("content-type: application/json"), "{head}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"], "UriTooLong");
    let with_body = [request("GET", &routes()[5], &server.addr, "Content-Length: 5\r\n"), b"hello".to_vec()].concat();
    let (status, _, body) = parse(&exchange(&server.addr, &with_body));
    assert_eq!(status, 413);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"], "PayloadTooLarge");
    let chunked = request("GET", &routes()[5], &server.addr, "Transfer-Encoding: chunked\r\n");
    assert_eq!(parse(&exchange(&server.addr, &[chunked, b"5\r\nhello\r\n0\r\n\r\n".to_vec()].concat())).0, 413);
    let many: String = (0..300).map(|i| format!("&p{i}=1")).collect();
    let (status, _, body) =
        parse(&exchange(&server.addr, &request("GET", &format!("{}{many}", routes()[5]), &server.addr, "")));
    assert_eq!(status, 400, "{body}");
    // A head far past hyper's bound (about 400 KiB): refused or dropped, never buffered whole.
    let huge_header = format!("X-Filler: {}\r\n", "b".repeat(1 << 20));
    let response = exchange(&server.addr, &request("GET", "/xrpc/_health", &server.addr, &huge_header));
    assert!(response.is_empty() || parse(&response).0 == 431, "{}", &response[..response.len().min(200)]);
    assert_eq!(server.get("/xrpc/_health").0, 200, "the server still answers");
}

/// `serve --no-ingest` with a config file holding `settings`.
fn server_with(data: &Path, settings: &str) -> Server {
    let config = data.parent().unwrap().join("limits.toml");
    std::fs::write(&config, settings).unwrap();
    Server::start_with(data, &["--config", config.to_str().unwrap()])
}

/// How long until the server closes a connection that sent `sent` and then nothing.
fn time_to_close(addr: &str, sent: &[u8]) -> Duration {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    stream.write_all(sent).unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the server answered an incomplete request: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server kept the connection open: {e}"),
    }
    started.elapsed()
}

#[test]
fn silent_and_trickling_connections_are_closed() {
    let (_dir, data) = imported();
    // Idle timeout: twice the request timeout, at least one second.
    let server = server_with(&data, "request_timeout_ms = 300\n");
    for sent in [&b""[..], b"GET /xrpc/_health HTTP/1.1\r\nHost: x\r\n"] {
        let waited = time_to_close(&server.addr, sent);
        assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5), "closed after {waited:?}");
    }
    // A kept-alive connection is closed once idle too, after its answers.
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(stream, "GET /xrpc/_health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = [0u8; 4096];
    let n = stream.read(&mut answer).unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    assert_eq!(stream.read(&mut answer).unwrap_or(0), 0, "closed, not answered");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn connections_over_the_limit_wait_for_a_free_place() {
    let (_dir, data) = imported();
    let server = server_with(&data, "max_connections = 3\n");
    let holders: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&server.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut waiting = TcpStream::connect(&server.addr).unwrap();
    waiting.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    write!(waiting, "GET /xrpc/_health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = Vec::new();
    let early = waiting.read_to_end(&mut response);
    assert!(early.is_err() && response.is_empty(), "answered over the limit: {early:?}");
    drop(holders);
    waiting.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    waiting.read_to_end(&mut response).unwrap();
    assert!(String::from_utf8_lossy(&response).starts_with("HTTP/1.1 200"), "{response:?}");
}

#[test]
fn print_config_shows_the_connection_limit_and_threads() {
    let output = std::process::Command::new(BIN)
        .args(["serve", "--print-config"])
        .env("BACKLINKS_MAX_CONNECTIONS", "77")
        .env("BACKLINKS_HTTP_THREADS", "3")
        .env_remove("BACKLINKS_CONFIG")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table: toml::Table = String::from_utf8(output.stdout).unwrap().parse().unwrap();
    assert_eq!(table["max_connections"].as_integer(), Some(77));
    assert_eq!(table["http_threads"].as_integer(), Some(3));
    let no_threads = std::process::Command::new(BIN)
        .args(["serve", "--print-config"])
        .env("BACKLINKS_HTTP_THREADS", "0")
        .output()
        .unwrap();
    assert!(!no_threads.status.success());
    assert!(String::from_utf8_lossy(&no_threads.stderr).contains("http_threads must be between 1 and 256"));
    let bad = std::process::Command::new(BIN)
        .args(["serve", "--print-config"])
        .env("BACKLINKS_MAX_CONNECTIONS", "0")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("max_connections must be between 1 and 65536"));
}

/// Opens `count` connections from `from` (another loopback address than the normal client's)
/// that send a request head one byte a second, for at most `patience`; returns how many the
/// server cut off (closed) before then.
async fn slowloris(server: std::net::SocketAddr, from: std::net::IpAddr, count: usize, patience: Duration) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut connections = tokio::task::JoinSet::new();
    for _ in 0..count {
        connections.spawn(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(std::net::SocketAddr::new(from, 0)).unwrap();
            let Ok(mut stream) = socket.connect(server).await else { return true };
            let head = b"GET /xrpc/_health HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
            let started = tokio::time::Instant::now();
            for byte in head.iter().cycle() {
                if started.elapsed() > patience {
                    return false;
                }
                if stream.write_all(&[*byte]).await.is_err() {
                    return true;
                }
                let mut answer = [0u8; 64];
                match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut answer)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return true,
                    Ok(Ok(_)) => panic!("a head sent a byte a second was answered"),
                    Err(_) => {} // still open: the next byte
                }
            }
            unreachable!("the head cycles forever")
        });
    }
    let mut cut_off = 0;
    while let Some(done) = connections.join_next().await {
        cut_off += usize::from(done.unwrap());
    }
    cut_off
}

#[test]
fn a_thousand_slow_request_heads_do_not_stop_a_normal_client() {
    let (_dir, data) = imported();
    // Room for 512 connections, and a header deadline longer than the test: only the
    // per-address limit stands between the attacker and every place.
    let server = server_with(&data, "header_read_timeout_secs = 60\nmax_connections = 512\n");
    let address: std::net::SocketAddr = server.addr.parse().unwrap();
    let attacker = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(slowloris(address, "127.0.0.2".parse().unwrap(), 1_000, Duration::from_secs(4)))
    });
    std::thread::sleep(Duration::from_millis(500));
    // While the attack holds its connections, a normal client (from 127.0.0.1) is answered.
    let health = || parse(&exchange(&server.addr, &request("GET", "/xrpc/_health", &server.addr, ""))).0;
    for _ in 0..4 {
        assert_eq!(health(), 200, "the normal client was not served");
        std::thread::sleep(Duration::from_millis(500));
    }
    let default_per_address = 256;
    assert_eq!(attacker.join().unwrap(), 1_000 - default_per_address, "one address held more than its share");
}

#[test]
fn slow_request_heads_are_cut_off_at_the_header_deadline() {
    let (_dir, data) = imported();
    let server = server_with(&data, "header_read_timeout_secs = 2\n");
    let address: std::net::SocketAddr = server.addr.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cut_off = runtime.block_on(slowloris(address, "127.0.0.3".parse().unwrap(), 100, Duration::from_secs(8)));
    assert_eq!(cut_off, 100, "a head sent a byte a second outlived the deadline");
    assert_eq!(server.get("/xrpc/_health").0, 200);
}
