//! Live push under load: the real binary follows the test Jetstream server at full speed (a
//! network-shaped workload, no pacing) twice, without subscribers and with `SUBSCRIBERS` websocket
//! subscribers whose filters are drawn at random (targets of every popularity, target accounts,
//! target prefixes, collections), and reports:
//! - ingest events/s without and with the subscribers (the goal: within 10 %);
//! - events delivered per second over all subscribers, and cut-offs;
//! - the server's memory per subscriber (RSS with them connected and idle, minus without);
//! - the CPU seconds each thread (by name) of the server and of this process used while ingest
//!   ran: where the subscribers' cost goes.
//!
//! `cargo bench --bench push` (EVENTS=N SUBSCRIBERS=N to change the size; RATE=N to pace the
//! stream at N events/s instead of full speed, which reports how far ingest ends behind the
//! stream and the server's CPU; ROUNDS=N to repeat the three runs and report the median change
//! and its range, as one run on a shared VM is noise). Subscribers run in this process, on the same two cores as the
//! server: the figures include their cost.

#[path = "../tests/support/jetstream_server.rs"]
#[allow(dead_code)]
mod jetstream_server;

use futures::StreamExt;
use jetstream_server::{Faults, JetstreamServer};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BACKLINKS: &str = env!("CARGO_BIN_EXE_backlinks");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_backlinks-workload");
const SUBSCRIBE: &str = "/xrpc/blue.cerulea.backlinks.subscribeBacklinks";

/// Makes the calling thread yield the CPU to every other (Linux's per-thread nice 19).
fn lowest_priority() {
    backlinks::base::priority::lower_this_thread(19);
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Serve {
    child: Child,
    addr: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn start(dir: &std::path::Path, jetstream: &str, push: bool) -> Serve {
        let config = dir.join("backlinks.toml");
        let settings = "max_connections = 4096\nmax_connections_per_address = 4096\npush_max_subscribers = 4096\n";
        std::fs::write(&config, format!("{settings}no_push = {}\n", !push)).unwrap();
        let mut child = Command::new(BACKLINKS)
            .args(["serve", "--listen", "127.0.0.1:0", "--jetstream", jetstream, "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on http://").unwrap().to_string();
        Serve { child, addr }
    }

    fn get(&self, path: &str) -> String {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
    }

    fn cursor(&self) -> Option<i64> {
        serde_json::from_str::<Value>(&self.get("/xrpc/_health")).ok()?["cursor"].as_i64()
    }

    /// CPU seconds the server has used (user + system).
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        stat_cpu(&stat).1
    }

    /// SIGTERM, and wait for the clean stop.
    fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        assert!(self.child.wait().unwrap().success(), "serve stops cleanly");
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Seconds until ingest reaches `last` (from the server's start).
    fn wait_for(&self, last: i64, started: Instant) -> f64 {
        while self.cursor() != Some(last) {
            assert!(started.elapsed() < Duration::from_secs(1800), "ingest stalled at {:?}", self.cursor());
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed().as_secs_f64()
    }
}

/// CPU seconds used so far by a process's threads, summed by thread name (digits cut off).
fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(Result::ok) {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (name, seconds) = stat_cpu(&stat);
        let name = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
        *by_name.entry(name.to_string()).or_insert(0.0) += seconds;
    }
    by_name
}

/// The name and the CPU seconds (user + system) in a `/proc` stat line of a process or thread.
fn stat_cpu(stat: &str) -> (&str, f64) {
    let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (&stat[open + 1..close], ticks as f64 / 100.0)
}

/// What each thread name used between two readings, as "name seconds, ...".
fn cpu_used(
    before: &std::collections::BTreeMap<String, f64>,
    after: std::collections::BTreeMap<String, f64>,
) -> String {
    let used = after.into_iter().map(|(name, seconds)| (seconds - before.get(&name).copied().unwrap_or(0.0), name));
    used.filter(|(seconds, _)| *seconds > 0.0)
        .map(|(seconds, name)| format!("{name} {seconds:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A random filter, shaped like notification clients: half follow a few records (one to five
/// targets), a third an account (`targetDid`), the rest a prefix, likes of one record, or, one in
/// a hundred, a whole collection or location (a firehose of its kind).
fn random_filter(seed: &mut u64, targets: &[String], dids: &[String]) -> String {
    let mut pick = |n: usize| (backlinks::base::rng::splitmix64(seed) % n as u64) as usize;
    let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    match pick(100) {
        0..=49 => (0..1 + pick(5))
            .map(|_| format!("target={}", encode(&targets[pick(targets.len())])))
            .collect::<Vec<_>>()
            .join("&"),
        50..=84 => format!("targetDid={}", encode(&dids[pick(dids.len())])),
        85..=94 => format!("targetPrefix={}", encode(&format!("at://{}/", dids[pick(dids.len())]))),
        95..=98 => format!("target={}&collection=app.bsky.feed.like", encode(&targets[pick(targets.len())])),
        _ => ["collection=app.bsky.graph.follow", "collection=app.bsky.graph.block", "location=%24.embed.record"]
            [pick(3)]
        .to_string(),
    }
}

fn main() {
    let events = setting("EVENTS", 300_000);
    let subscribers = setting("SUBSCRIBERS", 1_000);
    let output = Command::new(WORKLOAD).args(["--seed", "3", "--events", &events.to_string()]).output().unwrap();
    let lines: Vec<String> = String::from_utf8(output.stdout).unwrap().lines().map(str::to_string).collect();
    let last = serde_json::from_str::<Value>(lines.last().unwrap()).unwrap()["time_us"].as_i64().unwrap();
    // Targets and accounts to filter on, drawn from the stream itself (popular ones come often).
    let (mut targets, mut dids) = (vec![], vec![]);
    for line in lines.iter().step_by(97) {
        let event: Value = serde_json::from_str(line).unwrap();
        if let Some(uri) = event["commit"]["record"]["subject"]["uri"].as_str() {
            targets.push(uri.to_string());
        }
        if let Some(did) = event["did"].as_str() {
            dids.push(did.to_string());
        }
    }
    // The stream's server, and the subscribers' clients: on the same two cores as the server
    // here, elsewhere in practice. The clients run at the lowest priority, so that the figures
    // are the server's cost.
    let runtimes = Runtimes {
        stream: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("test-jetstream")
            .enable_all()
            .build()
            .unwrap(),
        clients: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-client")
            .on_thread_start(lowest_priority)
            .enable_all()
            .build()
            .unwrap(),
    };
    let runtime = &runtimes;
    let rounds = setting("ROUNDS", 1).max(1);
    println!("push bench: {} events, {subscribers} subscribers, {rounds} rounds", lines.len());
    let change = |rate: f64, base: f64| (rate / base - 1.0) * 100.0;
    let (mut push_changes, mut subscriber_changes, mut subscriber_cpu_changes) = (vec![], vec![], vec![]);
    for round in 1..=rounds {
        // The three runs of a round follow each other, so that a drift of the machine's speed
        // (a shared VM) touches the comparisons within a round least.
        let off = run(runtime, &lines, last, None, &targets, &dids);
        let alone = run(runtime, &lines, last, Some(0), &targets, &dids);
        let with = run(runtime, &lines, last, Some(subscribers), &targets, &dids);
        push_changes.push(change(alone.events_per_second, off.events_per_second));
        subscriber_changes.push(change(with.events_per_second, alone.events_per_second));
        subscriber_cpu_changes.push(change(with.server_cpu_per_event, alone.server_cpu_per_event));
        println!(
            "round {round}: events/s push off {:.0}, push on {:.0}, {subscribers} subscribers {:.0}: push on {:+.1} % against off, subscribers {:+.1} % against none (server CPU per event {:+.1} %); {}",
            off.events_per_second,
            alone.events_per_second,
            with.events_per_second,
            push_changes[round - 1],
            subscriber_changes[round - 1],
            subscriber_cpu_changes[round - 1],
            with.memory,
        );
    }
    println!("push on, no subscribers: {} % events/s against push off", summary(&mut push_changes));
    println!("{subscribers} subscribers: {} % events/s against none", summary(&mut subscriber_changes));
    println!("{subscribers} subscribers: {} % server CPU per event against none", summary(&mut subscriber_cpu_changes));
}

/// What one run measured.
struct Outcome {
    events_per_second: f64,
    /// The server's CPU seconds while it ingested, per event: steadier than the rate on a shared
    /// VM, and blind to the bench's own clients and stream, which share these cores.
    server_cpu_per_event: f64,
    /// The server's memory before and after its subscribers connected (empty without any).
    memory: String,
}

/// "median (lowest .. highest)" of the rounds' figures.
fn summary(figures: &mut [f64]) -> String {
    figures.sort_by(f64::total_cmp);
    let median = match figures.len() % 2 {
        1 => figures[figures.len() / 2],
        _ => (figures[figures.len() / 2 - 1] + figures[figures.len() / 2]) / 2.0,
    };
    format!("median {median:+.1} ({:+.1} .. {:+.1})", figures[0], figures[figures.len() - 1])
}

struct Runtimes {
    stream: tokio::runtime::Runtime,
    clients: tokio::runtime::Runtime,
}

/// One run: serve follows a held stream, `subscribers` connect (`None`: push off), the stream is
/// let go; returns what it measured.
fn run(
    runtime: &Runtimes,
    lines: &[String],
    last: i64,
    subscribers: Option<usize>,
    targets: &[String],
    dids: &[String],
) -> Outcome {
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rate = setting("RATE", 0);
    let pause_every = (rate > 0).then(|| (100, Duration::from_secs_f64(100.0 / rate as f64)));
    let faults = Faults { hold_until: Some(go.clone()), pause_every, ..Faults::default() };
    let jetstream = runtime.stream.block_on(JetstreamServer::start(lines.to_vec(), faults));
    let dir = tempfile::tempdir().unwrap();
    let mut serve = Serve::start(dir.path(), &jetstream.v2_url(), subscribers.is_some());
    let subscribers = subscribers.unwrap_or(0);
    std::thread::sleep(Duration::from_secs(1));
    let before = serve.rss_kib();
    let delivered = Arc::new(AtomicU64::new(0));
    let cut = Arc::new(AtomicU64::new(0));
    // Frames of account events (hide, show): every subscriber gets every one.
    let accounts = Arc::new(AtomicU64::new(0));
    let mut seed = 42;
    for _ in 0..subscribers {
        let url = format!("ws://{}{SUBSCRIBE}?{}", serve.addr, random_filter(&mut seed, targets, dids));
        let (socket, _) = runtime.clients.block_on(tokio_tungstenite::connect_async(url)).unwrap();
        let (delivered, cut, accounts) = (delivered.clone(), cut.clone(), accounts.clone());
        runtime.clients.spawn(async move {
            let (_, mut read) = socket.split();
            while let Some(Ok(message)) = read.next().await {
                if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
                    if text.contains("\"op\":\"error\"") {
                        cut.fetch_add(1, Ordering::Relaxed);
                    }
                    if text.starts_with("{\"op\":\"hide\"") || text.starts_with("{\"op\":\"show\"") {
                        accounts.fetch_add(1, Ordering::Relaxed);
                    }
                    delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    std::thread::sleep(Duration::from_secs(1));
    let idle = serve.rss_kib();
    let memory = match subscribers {
        0 => String::new(),
        n => format!(
            "server RSS {before} KiB, {idle} KiB with {n} idle subscribers: {:.1} KiB each",
            idle.saturating_sub(before) as f64 / n as f64
        ),
    };
    let started = Instant::now();
    let cpu_before = serve.cpu_seconds();
    let (server_before, bench_before) = (cpu_by_thread(serve.child.id()), cpu_by_thread(std::process::id()));
    go.store(true, Ordering::Relaxed);
    let seconds = serve.wait_for(last, started);
    let cpu = serve.cpu_seconds() - cpu_before;
    let server_threads = cpu_used(&server_before, cpu_by_thread(serve.child.id()));
    let bench_threads = cpu_used(&bench_before, cpu_by_thread(std::process::id()));
    std::thread::sleep(Duration::from_millis(500));
    let events_per_second = lines.len() as f64 / seconds;
    let sent = delivered.load(Ordering::Relaxed);
    let behind = match rate {
        0 => String::new(),
        rate => format!(", ends {:.2} s after the stream", seconds - lines.len() as f64 / rate as f64),
    };
    println!(
        "{subscribers} subscribers: {seconds:.1} s, {events_per_second:.0} events/s{behind}; server CPU {cpu:.1} s ({:.0} µs per event); {sent} frames delivered ({:.0}/s, {} of them hide or show), {} cut off; RSS after {} KiB",
        cpu * 1e6 / lines.len() as f64,
        sent as f64 / seconds,
        accounts.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed),
        serve.rss_kib()
    );
    println!("  CPU seconds while ingesting, server: {server_threads}; bench: {bench_threads}");
    let bytes_in = |path: &str| -> u64 {
        std::fs::read_dir(dir.path().join(path))
            .map(|entries| entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    };
    let metrics = serve.get("/metrics");
    // A clean stop writes the recent-links table out: then its blocks on disk mean something.
    serve.terminate();
    let log_bytes = bytes_in("data/push/log");
    let recent = std::fs::metadata(dir.path().join("data/push/recent.table")).ok();
    let recent_len = recent.as_ref().map_or(0, |m| m.len());
    let recent_disk = recent.as_ref().map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(m) * 512);
    let figure =
        |name: &str| metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0);
    let (entries, logged) = (figure("backlinks_push_log_entries_total"), figure("backlinks_push_log_events_total"));
    println!(
        "change log: {log_bytes} bytes, {entries} entries, {logged} events: {:.0} bytes per event, {:.2} events per ingested event; recent.table {} bytes, {recent_disk} on disk, {} slots displaced",
        log_bytes as f64 / logged.max(1.0),
        logged / lines.len() as f64,
        recent_len,
        figure("backlinks_push_recent_displaced_total"),
    );
    if subscribers > 0 {
        for line in metrics.lines().filter(|l| l.starts_with("backlinks_push") && !l.starts_with("# ")) {
            println!("  {line}");
        }
    }
    Outcome { events_per_second, server_cpu_per_event: cpu / lines.len() as f64, memory }
}
