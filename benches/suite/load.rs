//! Warm listBacklinks under concurrent load: `connections` clients, each asking for uniformly
//! drawn targets back to back for `seconds` after `warmup` seconds whose answers are not
//! counted. Three drivers share the target list and the report: HTTP against `backlinks serve`,
//! the index in-process, and the SQLite baseline.
//!
//! Invariants:
//! - Each client draws from its own seeded generator: runs are repeatable and clients differ.
//! - Every answer is checked (HTTP 200, a parsed page); a failure is counted, never ignored.
//! - Memory is bounded: one latency (u32 microseconds) per answered query, and queries are
//!   bounded by the duration (at most `MAX_QUERIES` per client).

use crate::{cpu, sqlite};
use backlinks::base::rng::splitmix64;
use backlinks::index::{Index, IndexOptions};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::server::LIST_BACKLINKS;
use backlinks::store::dir::DirStore;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Most queries one client makes in one phase (a bound on the latency vector).
const MAX_QUERIES: usize = 50_000_000;
/// Longest HTTP response head or body accepted.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Concurrent clients (HTTP connections, tasks or SQLite connections).
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Seconds of the same load before measuring (answers not counted).
    #[arg(long, default_value_t = 5.0)]
    pub warmup: f64,
    /// The server's process id (HTTP only): its CPU time is added to the client's.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

/// CPU seconds used by this process (the clients, or everything when in-process) and by the
/// server (when its pid is known) during the measured phase.
struct CpuMeter {
    own: Option<f64>,
    server: Option<f64>,
    server_pid: Option<u32>,
}

impl CpuMeter {
    fn start(server_pid: Option<u32>) -> Self {
        let own = cpu::process_seconds(std::process::id());
        CpuMeter { own, server: server_pid.and_then(cpu::process_seconds), server_pid }
    }

    /// (own, server) CPU seconds since `start`.
    fn stop(&self) -> (Option<f64>, Option<f64>) {
        let since = |before: Option<f64>, now: Option<f64>| Some(now? - before?);
        let server = self.server_pid.and_then(cpu::process_seconds);
        (since(self.own, cpu::process_seconds(std::process::id())), since(self.server, server))
    }
}

/// The targets file: one target per line.
pub fn read_targets(path: &Path) -> anyhow::Result<Vec<String>> {
    let targets: Vec<String> = std::fs::read_to_string(path)?.lines().map(str::to_string).collect();
    anyhow::ensure!(!targets.is_empty(), "{} holds no targets", path.display());
    Ok(targets)
}

/// What one client saw in the measured phase.
#[derive(Debug, Default)]
struct ClientReport {
    latencies_us: Vec<u32>,
    errors: u64,
    links: u64,
}

impl ClientReport {
    fn record(&mut self, started: Instant, links: anyhow::Result<usize>) {
        match links {
            Ok(links) => {
                self.latencies_us.push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
                self.links += links as u64;
            }
            Err(_) => self.errors += 1,
        }
    }
}

/// The summary of all clients: rate and latency percentiles, and the CPU the phase used. The
/// CPU-bound rate (2 cores over CPU seconds per query) is what the machine would sustain with
/// nothing else running; on a shared machine the measured rate is lower.
fn summarize(
    driver: &str,
    args: &LoadArgs,
    reports: Vec<ClientReport>,
    elapsed: Duration,
    (own_cpu, server_cpu): (Option<f64>, Option<f64>),
) -> serde_json::Value {
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    let links: u64 = reports.iter().map(|r| r.links).sum();
    let mut latencies: Vec<u32> = reports.into_iter().flat_map(|r| r.latencies_us).collect();
    latencies.sort_unstable();
    let quantile = |q: f64| latencies.get(((latencies.len().max(1) - 1) as f64 * q) as usize).copied().unwrap_or(0);
    let queries = latencies.len();
    let cpu_seconds = own_cpu.map(|own| own + server_cpu.unwrap_or(0.0));
    serde_json::json!({
        "own_cpu_seconds": own_cpu, "server_cpu_seconds": server_cpu, "cpu_seconds": cpu_seconds,
        "cpu_us_per_query": cpu_seconds.map(|cpu| cpu * 1e6 / queries.max(1) as f64),
        "cpu_bound_queries_per_sec_2_cores": cpu_seconds.map(|cpu| 2.0 * queries as f64 / cpu.max(1e-9)),
        "load_average": cpu::load_average(),
        "driver": driver, "connections": args.connections, "seconds": elapsed.as_secs_f64(),
        "queries": queries, "errors": errors, "queries_per_sec": queries as f64 / elapsed.as_secs_f64(),
        "mean_links_per_page": links as f64 / queries.max(1) as f64,
        "p50_us": quantile(0.50), "p90_us": quantile(0.90), "p99_us": quantile(0.99), "max_us": quantile(1.0),
    })
}

/// Client `client`'s generator.
fn client_rng(client: usize) -> u64 {
    0x5eed_0000 + client as u64
}

fn pick<'a, T>(items: &'a [T], state: &mut u64) -> &'a T {
    &items[(splitmix64(state) % items.len() as u64) as usize]
}

// ---- HTTP against `backlinks serve` ----

/// HTTP/1.1 keep-alive clients on one thread of their own (so the server keeps both cores as far
/// as the client lets it).
pub fn http(addr: &str, targets: &[String], args: &LoadArgs) -> anyhow::Result<serde_json::Value> {
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(targets.iter().map(|t| request_bytes(addr, t)).collect());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let phase = |seconds: f64| {
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let clients = (0..args.connections).map(|client| {
                let requests = requests.clone();
                let addr = addr.to_string();
                tokio::spawn(async move { http_client(&addr, &requests, client, deadline).await })
            });
            futures::future::join_all(clients)
        };
        phase(args.warmup).await;
        let (started, meter) = (Instant::now(), CpuMeter::start(args.server_pid));
        let reports = phase(args.seconds).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let (elapsed, cpu) = (started.elapsed(), meter.stop());
        Ok(summarize("http", args, reports.into_iter().collect::<anyhow::Result<Vec<_>>>()?, elapsed, cpu))
    })
}

fn request_bytes(addr: &str, target: &str) -> Vec<u8> {
    let target: String = form_urlencoded::byte_serialize(target.as_bytes()).collect();
    format!("GET {LIST_BACKLINKS}?target={target}&limit={} HTTP/1.1\r\nHost: {addr}\r\n\r\n", sqlite::PAGE).into_bytes()
}

async fn http_client(
    addr: &str,
    requests: &[Vec<u8>],
    client: usize,
    deadline: Instant,
) -> anyhow::Result<ClientReport> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut state, mut buffer, mut report) =
        (client_rng(client), Vec::with_capacity(64 << 10), ClientReport::default());
    while Instant::now() < deadline && report.latencies_us.len() < MAX_QUERIES {
        let request = pick(requests, &mut state);
        let started = Instant::now();
        stream.write_all(request).await?;
        let body = read_response(&mut stream, &mut buffer).await;
        report.record(started, body.map(|body| count_links(&body)));
    }
    Ok(report)
}

/// Links in a listBacklinks body: one URI per `"at://` after the `backlinks` key (cheaper than a
/// full parse, so the client leaves the cores to the server).
fn count_links(body: &[u8]) -> usize {
    body.windows(6).filter(|w| w == b"\"at://").count()
}

/// Reads one response (Content-Length or chunked) and returns its body; an error for anything
/// but a 200.
async fn read_response(stream: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        fill(stream, buffer).await?;
    };
    let head = std::str::from_utf8(&buffer[..head_end])?.to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse::<usize>());
    let body = match length {
        Some(length) => {
            let length = length?;
            anyhow::ensure!(length <= MAX_RESPONSE_BYTES, "body of {length} bytes");
            while buffer.len() < head_end + length {
                fill(stream, buffer).await?;
            }
            let body = buffer[head_end..head_end + length].to_vec();
            buffer.drain(..head_end + length);
            body
        }
        None => read_chunked(stream, buffer, head_end).await?,
    };
    anyhow::ensure!(status == "200", "HTTP status {status}");
    Ok(body)
}

async fn read_chunked(
    stream: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
    mut at: usize,
) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(end) = buffer[at..].windows(2).position(|w| w == b"\r\n") {
                break at + end;
            }
            fill(stream, buffer).await?;
        };
        let size = usize::from_str_radix(std::str::from_utf8(&buffer[at..line_end])?.trim(), 16)?;
        anyhow::ensure!(body.len() + size <= MAX_RESPONSE_BYTES, "chunked body too long");
        while buffer.len() < line_end + 2 + size + 2 {
            fill(stream, buffer).await?;
        }
        body.extend_from_slice(&buffer[line_end + 2..line_end + 2 + size]);
        at = line_end + 2 + size + 2;
        if size == 0 {
            buffer.drain(..at);
            return Ok(body);
        }
    }
}

async fn fill(stream: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> anyhow::Result<()> {
    anyhow::ensure!(buffer.len() < MAX_RESPONSE_BYTES, "response too long");
    // Straight into the buffer's spare room: zeroing and copying a 16 KiB chunk per read was
    // 4 % of the client's CPU, taken from the cores the server is measured on.
    buffer.reserve(16 << 10);
    let read = stream.read_buf(buffer).await?;
    anyhow::ensure!(read > 0, "connection closed");
    Ok(())
}

// ---- the index in-process ----

/// The index opened read-only next to nothing else, queried by `connections` tasks on a
/// two-worker runtime; each answer is rendered to its JSON body, as the server would.
pub fn inproc(data_dir: &Path, targets: &[String], args: &LoadArgs) -> anyhow::Result<serde_json::Value> {
    let store = Arc::new(DirStore::new(data_dir.join("bucket")));
    let options = IndexOptions { read_only: true, ..IndexOptions::default() };
    let index = Arc::new(Index::open(data_dir, store, options, 1)?);
    let targets = Arc::new(targets.to_vec());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let phase = |seconds: f64| {
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let clients = (0..args.connections).map(|client| {
                let (index, targets) = (index.clone(), targets.clone());
                tokio::spawn(async move { inproc_client(&index, &targets, client, deadline).await })
            });
            futures::future::join_all(clients)
        };
        phase(args.warmup).await;
        let (started, meter) = (Instant::now(), CpuMeter::start(None));
        let reports = phase(args.seconds).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let (elapsed, cpu) = (started.elapsed(), meter.stop());
        Ok(summarize("in-process", args, reports, elapsed, cpu))
    })
}

async fn inproc_client(index: &Index, targets: &[String], client: usize, deadline: Instant) -> ClientReport {
    let (mut state, mut report) = (client_rng(client), ClientReport::default());
    while Instant::now() < deadline && report.latencies_us.len() < MAX_QUERIES {
        let target = pick(targets, &mut state);
        let started = Instant::now();
        let answer = list_backlinks(index, &ListParams::new(target.as_str())).await;
        let links = answer.map_err(anyhow::Error::from).and_then(|page| {
            let body = serde_json::to_vec(&page.to_json())?;
            std::hint::black_box(body);
            Ok(page.items.len())
        });
        report.record(started, links);
        tokio::task::yield_now().await;
    }
    report
}

// ---- the SQLite baseline ----

/// One thread and one read-only connection per client; each page is rendered to the same JSON
/// shape as listBacklinks.
pub fn sqlite(db: &Path, targets: &[String], args: &LoadArgs) -> anyhow::Result<serde_json::Value> {
    let phase = |seconds: f64| -> anyhow::Result<Vec<ClientReport>> {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        std::thread::scope(|scope| {
            let clients: Vec<_> = (0..args.connections)
                .map(|client| scope.spawn(move || sqlite_client(db, targets, client, deadline)))
                .collect();
            clients.into_iter().map(|c| c.join().map_err(|_| anyhow::anyhow!("client panicked"))?).collect()
        })
    };
    phase(args.warmup)?;
    let (started, meter) = (Instant::now(), CpuMeter::start(None));
    let reports = phase(args.seconds)?;
    let (elapsed, cpu) = (started.elapsed(), meter.stop());
    Ok(summarize("sqlite", args, reports, elapsed, cpu))
}

fn sqlite_client(db: &Path, targets: &[String], client: usize, deadline: Instant) -> anyhow::Result<ClientReport> {
    let conn = sqlite::open_read_only(db)?;
    let (mut state, mut report) = (client_rng(client), ClientReport::default());
    while Instant::now() < deadline && report.latencies_us.len() < MAX_QUERIES {
        let target = pick(targets, &mut state);
        let started = Instant::now();
        let links = sqlite::page(&conn, target).map_err(anyhow::Error::from).and_then(|items| {
            let body = serde_json::to_vec(&grouped_json(&items))?;
            std::hint::black_box(body);
            Ok(items.len())
        });
        report.record(started, links);
    }
    Ok(report)
}

/// `{"backlinks": {location: [uri, ...]}, "cursor": null}`, like `ListPage::to_json`.
fn grouped_json(items: &[(String, String)]) -> serde_json::Value {
    let mut groups = serde_json::Map::new();
    for (location, uri) in items {
        let group = groups.entry(location.clone()).or_insert_with(|| serde_json::Value::Array(vec![]));
        if let serde_json::Value::Array(uris) = group {
            uris.push(uri.clone().into());
        }
    }
    serde_json::json!({ "backlinks": groups, "cursor": null })
}
