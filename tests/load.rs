//! Load: 200 concurrent HTTP clients against the real `serve` binary while it ingests a live
//! Jetstream stream (tests/support/jetstream_server.rs), flushing, compacting and publishing as
//! it goes. Every answer must be a 200 with a well-formed body: zero errors. The latency of every
//! request is recorded; p50, p99, max and queries per second are printed.
//!
//! Short in CI (`DEFAULT_SECS`); `BACKLINKS_LOAD_SECS=60` runs the full minute.
//!
//! Admission: the server admits `max_concurrent_queries` queries at once and answers the next one
//! with an immediate 503 (src/server.rs). An operator expecting 200 concurrent clients sizes that
//! limit to them (here 256) rather than turning clients away: a query's memory is bounded by its
//! page (at most 1,000 backlinks), so 256 in flight cost little, and the request timeout still
//! bounds each one. The test records the server's peak resident memory to show it.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::Server;
use support::jetstream_server::{Faults, JetstreamServer};

const CLIENTS: usize = 200;
const DEFAULT_SECS: u64 = 4;
/// Events per second the test Jetstream sends (paced), so ingest runs for the whole test.
const EVENTS_PER_SEC: u64 = 2_000;
const POSTERS: usize = 20;
const POSTS_PER_POSTER: usize = 5;
const AUTHORS: usize = 5_000;
const FIRST_TIME_US: i64 = 1_700_000_000_000_000;
/// Largest response accepted by the client.
const MAX_BODY_BYTES: usize = 4 << 20;

fn poster(p: usize) -> String {
    format!("did:plc:poster{p:018}")
}

fn post(p: usize, r: usize) -> String {
    format!("at://{}/app.bsky.feed.post/3kabcdefgh{r:03}", poster(p))
}

/// Likes, reposts and follows of a few popular posts and accounts by many authors.
fn events(count: usize) -> Vec<String> {
    let mut state = 7u64;
    (0..count)
        .map(|i| {
            let roll = backlinks::base::rng::splitmix64(&mut state);
            let author = format!("did:plc:author{:018}", roll as usize % AUTHORS);
            let rkey = backlinks::model::tid::format_tid(1_710_000_000_000_000 + i as u64 * 13);
            let (p, r) = ((roll >> 20) as usize % POSTERS, (roll >> 40) as usize % POSTS_PER_POSTER);
            let strong = serde_json::json!({"uri": post(p, r), "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"});
            let (collection, record) = match i % 10 {
                0..=5 => ("app.bsky.feed.like", serde_json::json!({"subject": strong})),
                6 | 7 => ("app.bsky.feed.repost", serde_json::json!({"subject": strong})),
                _ => ("app.bsky.graph.follow", serde_json::json!({"subject": poster(p)})),
            };
            let commit = serde_json::json!({"rev": "3l3qo2vutsw2b", "operation": "create", "collection": collection, "rkey": rkey, "record": record});
            let time_us = FIRST_TIME_US + i as i64 * 100;
            serde_json::json!({"did": author, "time_us": time_us, "kind": "commit", "commit": commit}).to_string()
        })
        .collect()
}

/// One keep-alive HTTP/1.1 connection; reconnects when the server closes it.
struct Client {
    addr: String,
    stream: Option<BufReader<TcpStream>>,
}

impl Client {
    fn new(addr: &str) -> Self {
        Client { addr: addr.to_string(), stream: None }
    }

    /// GET `path`: (status, body).
    fn get(&mut self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => BufReader::new(TcpStream::connect(&self.addr)?),
        };
        write!(stream.get_mut(), "GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.addr)?;
        let (status, body, keep_alive) = read_response(&mut stream)?;
        if keep_alive {
            self.stream = Some(stream);
        }
        Ok((status, body))
    }
}

/// Reads one response: (status, body, whether the connection stays open).
fn read_response(stream: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    stream.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
    let (mut length, mut chunked, mut keep_alive) = (None, false, true);
    loop {
        line.clear();
        stream.read_line(&mut line)?;
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if let Some(value) = header.strip_prefix("content-length:") {
            length = Some(value.trim().parse::<usize>().map_err(|_| bad(&header))?);
        }
        chunked |= header == "transfer-encoding: chunked";
        keep_alive &= header != "connection: close";
    }
    let body = match (length, chunked) {
        (Some(length), _) if length <= MAX_BODY_BYTES => {
            let mut body = vec![0; length];
            stream.read_exact(&mut body)?;
            body
        }
        (None, true) => read_chunked(stream)?,
        _ => return Err(bad("no usable body length")),
    };
    Ok((status, body, keep_alive))
}

fn read_chunked(stream: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk");
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim_end(), 16).map_err(|_| bad())?;
        if body.len() + size > MAX_BODY_BYTES {
            return Err(bad());
        }
        let mut chunk = vec![0; size + 2];
        stream.read_exact(&mut chunk)?;
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

/// The query a client sends next, and the JSON field its answer must have.
fn next_query(state: &mut u64) -> (String, &'static str) {
    let roll = backlinks::base::rng::splitmix64(state);
    let (p, r) = (roll as usize % POSTERS, (roll >> 16) as usize % POSTS_PER_POSTER);
    let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let limit = 1 + (roll >> 32) % 100;
    match (roll >> 48) % 10 {
        0..=4 => (
            format!("/xrpc/blue.cerulea.backlinks.listBacklinks?target={}&limit={limit}", encode(&post(p, r))),
            "backlinks",
        ),
        5 => (
            format!("/xrpc/blue.cerulea.backlinks.listBacklinks?target={}&reverse=true", encode(&poster(p))),
            "backlinks",
        ),
        6 | 7 => (format!("/xrpc/blue.cerulea.backlinks.countBacklinks?target={}", encode(&post(p, r))), "total"),
        8 => (
            format!(
                "/xrpc/blue.microcosm.links.getBacklinks?subject={}&source=app.bsky.feed.like:subject.uri&limit={limit}",
                encode(&post(p, r))
            ),
            "records",
        ),
        _ => ("/xrpc/_health".to_string(), "status"),
    }
}

/// What one client saw.
#[derive(Default)]
struct ClientResult {
    latencies: Vec<Duration>,
    errors: Vec<String>,
}

fn run_client(addr: String, seed: u64, stop: Arc<AtomicBool>) -> ClientResult {
    let mut result = ClientResult::default();
    let (mut client, mut state) = (Client::new(&addr), seed);
    while !stop.load(Ordering::Relaxed) {
        let (path, field) = next_query(&mut state);
        let started = Instant::now();
        let answer = client.get(&path);
        result.latencies.push(started.elapsed());
        let problem = match answer {
            Ok((200, body)) => match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(json) if json.get(field).is_some() => None,
                _ => Some(format!("{path}: malformed body {}", String::from_utf8_lossy(&body))),
            },
            Ok((status, body)) => Some(format!("{path}: {status} {}", String::from_utf8_lossy(&body))),
            Err(e) => Some(format!("{path}: {e}")),
        };
        result.errors.extend(problem);
    }
    result
}

/// The server's ingest cursor, from `/xrpc/_health`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn two_hundred_clients_get_answers_while_the_server_ingests() {
    let secs: u64 = std::env::var("BACKLINKS_LOAD_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_SECS);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    // Enough events for the whole run plus warm-up, paced at EVENTS_PER_SEC.
    let lines = events(((secs + 10) * EVENTS_PER_SEC) as usize);
    let pace =
        Faults { pause_every: Some((20, Duration::from_millis(1_000 * 20 / EVENTS_PER_SEC))), ..Faults::default() };
    let jetstream = runtime.block_on(JetstreamServer::start(lines, pace));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("backlinks.toml");
    let settings = "max_concurrent_queries = 256\nmemtable_bytes = 1048576\nmax_unflushed_secs = 1\n\
                    publish_interval_secs = 2\ncompaction_fan_in = 4\n";
    std::fs::write(&config, settings).unwrap();
    let server = Server::start_live(&dir.path().join("data"), &config, &jetstream.v2_url());

    // Warm up until some events are in, so queries have something to find.
    let warm = Instant::now();
    while server.cursor().is_none_or(|c| c < FIRST_TIME_US + 2_000 * 100) {
        assert!(warm.elapsed() < Duration::from_secs(30), "ingest did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cursor_before = server.cursor().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (addr, stop) = (server.addr.clone(), stop.clone());
            std::thread::spawn(move || run_client(addr, i as u64 + 1, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let results: Vec<ClientResult> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let elapsed = started.elapsed();
    let cursor_after = server.cursor().unwrap();

    let mut latencies: Vec<Duration> = results.iter().flat_map(|r| r.latencies.iter().copied()).collect();
    latencies.sort_unstable();
    let errors: Vec<&String> = results.iter().flat_map(|r| &r.errors).collect();
    let ingested = (cursor_after - cursor_before) / 100;
    eprintln!(
        "load: {CLIENTS} clients, {:.1} s: {} requests, {:.0} q/s, p50 {:?}, p99 {:?}, max {:?}, errors {}; \
         ingested {ingested} events meanwhile ({:.0}/s); server peak RSS {} MiB",
        elapsed.as_secs_f64(),
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().unwrap(),
        errors.len(),
        ingested as f64 / elapsed.as_secs_f64(),
        server.peak_rss_kib().map_or("?".to_string(), |k| (k / 1024).to_string()),
    );
    assert!(errors.is_empty(), "{} errors, the first: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert!(results.iter().all(|r| !r.latencies.is_empty()), "a client got no answer at all");
    assert!(ingested as u64 >= secs * EVENTS_PER_SEC / 4, "ingest stalled under load: {ingested} events");
}
