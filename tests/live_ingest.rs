//! Live ingest end to end over real websockets: the test Jetstream server replays events on both
//! wires, plain and compressed, with disconnects, server errors and an instance that dies; the
//! index must end up answering exactly what a reference model fed each event once answers.

mod support;

use backlinks::base::clock::Clock;
use backlinks::base::rng::splitmix64;
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::frames::EventKind;
use backlinks::ingest::live::{Instance, LiveIngest, LiveOptions};
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::query::{Cursor, ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::writer::{Writer, WriterOptions};
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::Server;
use support::jetstream_server::{Faults, JetstreamServer};
use support::model::{Model, RecordKey};

const DIDS: usize = 40;
const COLLECTIONS: [&str; 3] = ["app.bsky.feed.like", "app.bsky.feed.post", "app.bsky.graph.follow"];
const RKEYS: usize = 60;
const TARGETS: usize = 30;
const FIRST_TIME_US: i64 = 1_725_000_000_000_000;

fn did(i: usize) -> String {
    format!("did:plc:{:0>24}", format!("{i}x"))
}

fn rkey(i: usize) -> String {
    format!("3l3qo2vuowo{i:02}")
}

/// Targets: half posts, half bare DIDs.
fn target(i: usize) -> String {
    if i.is_multiple_of(2) { format!("at://{}/app.bsky.feed.post/{}", did(i), rkey(i)) } else { did(i) }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn system_clock() -> Clock {
    Arc::new(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64)
}

fn open_index(dir: &Path) -> Arc<Index> {
    let options = IndexOptions {
        memtable_bytes: 256 << 10,
        compaction: CompactionOptions { fan_in: 4, max_bytes_per_sec: None, ..CompactionOptions::default() },
        ..IndexOptions::default()
    };
    let store = Arc::new(DirStore::new(dir.join("bucket")));
    Arc::new(Index::open(dir, store, options, 3).unwrap())
}

fn fast_options(instances: &[String]) -> LiveOptions {
    let instances = instances.iter().map(|url| Instance::parse(url).unwrap()).collect();
    let mut options = LiveOptions::new(instances, 11);
    options.backoff_min = Duration::from_millis(5);
    options.backoff_max = Duration::from_millis(50);
    options.rewind_us = 2_000;
    options.idle_timeout = Duration::from_secs(10);
    options.max_unflushed_ms = 500;
    options
}

/// The writer live ingest writes through: no lease (the bucket is the test's alone), a manifest
/// every second on `clock`.
fn writer(index: &Arc<Index>, clock: Clock, runtime: &tokio::runtime::Runtime) -> Writer {
    let options = WriterOptions { publish_every_ms: Some(1_000), ..WriterOptions::default() };
    runtime.block_on(Writer::start(index.clone(), None, clock, options, runtime.handle().clone())).unwrap()
}

/// A record of this test's universe as an at-uri.
fn record_uri(&(d, c, r): &RecordKey) -> String {
    format!("at://{}/{}/{}", did(d), COLLECTIONS[c], rkey(r))
}

/// Seeded events: creates of absent records, updates and deletes of present ones, account
/// deletions, deactivations and reactivations; times advance by 0..3 µs (so some repeat).
struct Generator {
    state: u64,
    time_us: i64,
    step_us: i64,
    model: Model,
}

impl Generator {
    fn next(&mut self, bound: usize) -> usize {
        (splitmix64(&mut self.state) % bound as u64) as usize
    }

    fn record(&mut self) -> (serde_json::Value, BTreeSet<(String, String)>) {
        let (subject, other) = (target(self.next(TARGETS)), target(self.next(TARGETS)));
        let mut links = BTreeSet::from([(subject.clone(), "$.subject".to_string())]);
        let mut record = json!({"$type": "com.example.record", "subject": subject});
        if self.next(3) == 0 {
            record["other"] =
                json!({"uri": other, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"});
            links.insert((other, "$.other".to_string()));
        }
        (record, links)
    }

    fn event(&mut self) -> String {
        self.time_us += self.next(3) as i64 * self.step_us;
        let d = self.next(DIDS);
        let time_us = self.time_us;
        if self.next(100) < 2 {
            return self.account_event(d, time_us);
        }
        let key = (d, self.next(COLLECTIONS.len()), self.next(RKEYS));
        let (operation, record) = match self.model.records.contains_key(&key) {
            true if self.next(3) == 0 => {
                self.model.records.remove(&key);
                ("delete", None)
            }
            present => {
                let (record, links) = self.record();
                self.model.records.insert(key, links);
                (if present { "update" } else { "create" }, Some(record))
            }
        };
        let mut commit = json!({"rev": "3l3qo2vutsw2b", "operation": operation, "collection": COLLECTIONS[key.1], "rkey": rkey(key.2)});
        if let Some(record) = record {
            commit["record"] = record;
        }
        json!({"did": did(d), "time_us": time_us, "kind": "commit", "commit": commit}).to_string()
    }

    fn account_event(&mut self, d: usize, time_us: i64) -> String {
        let (active, status) = match self.next(3) {
            0 => {
                self.model.delete_account(d);
                (false, Some("deleted"))
            }
            1 => {
                self.model.hidden.insert(d);
                (false, Some("deactivated"))
            }
            _ => {
                self.model.hidden.remove(&d);
                (true, None)
            }
        };
        let mut account = json!({"active": active, "did": did(d), "seq": 1, "time": "2024-09-09T19:46:02.329Z"});
        if let Some(status) = status {
            account["status"] = status.into();
        }
        json!({"did": did(d), "time_us": time_us, "kind": "account", "account": account}).to_string()
    }
}

/// `count` events and the model fed each of them once. The last event is a create (so it moves
/// the durable cursor, which the tests wait for).
fn generate(count: usize, seed: u64) -> (Vec<String>, Model) {
    generate_spaced(count, seed, 1)
}

/// `generate` with times advancing by 0, 1 or 2 times `step_us`.
fn generate_spaced(count: usize, seed: u64, step_us: i64) -> (Vec<String>, Model) {
    let mut generator = Generator { state: seed, time_us: FIRST_TIME_US, step_us, model: Model::default() };
    let mut lines: Vec<String> = (0..count - 1).map(|_| generator.event()).collect();
    let key = (0, 0, RKEYS); // a record key no other event uses: always a create
    generator.time_us += 1;
    let last = json!({"did": did(0), "time_us": generator.time_us, "kind": "commit", "commit": {"rev": "3l3qo2vutsw2b", "operation": "create", "collection": COLLECTIONS[0], "rkey": rkey(key.2), "record": {"subject": target(0)}}});
    generator.model.records.insert(key, BTreeSet::from([(target(0), "$.subject".to_string())]));
    lines.push(last.to_string());
    (lines, generator.model)
}

fn last_time_us(lines: &[String]) -> i64 {
    serde_json::from_str::<serde_json::Value>(lines.last().unwrap()).unwrap()["time_us"].as_i64().unwrap()
}

/// Waits (bounded) until the index has applied the event at `time_us`.
fn wait_for_cursor(index: &Index, ingest: &LiveIngest, time_us: i64, limit: Duration) {
    let start = Instant::now();
    while index.position().cursor != Some(time_us) {
        assert!(!ingest.is_finished(), "the ingest engine stopped early");
        assert!(start.elapsed() < limit, "ingest stalled at {:?} (want {time_us})", index.position());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every backlink of `target`, all pages, sorted as (source uri, location).
fn answers(runtime: &tokio::runtime::Runtime, index: &Index, target: &str) -> Vec<(String, String)> {
    let mut got = Vec::new();
    let mut cursor = None;
    for _page in 0..10_000 {
        let params = ListParams { limit: 100, cursor, ..ListParams::new(target) };
        let page = runtime.block_on(list_backlinks(index, &params)).unwrap();
        got.extend(page.items.into_iter().map(|(location, uri)| (uri, location)));
        match page.cursor {
            Some(c) => cursor = Some(Cursor::decode(&c).unwrap()),
            None => break,
        }
    }
    got.sort();
    got
}

fn assert_matches_model(runtime: &tokio::runtime::Runtime, index: &Index, model: &Model) {
    let mut total = 0;
    for t in 0..TARGETS {
        let expected = model.backlinks(&target(t), record_uri);
        total += expected.len();
        assert_eq!(answers(runtime, index, &target(t)), expected, "target {}", target(t));
    }
    assert!(total > 0, "the model has no backlinks at all: the test would prove nothing");
}

#[test]
fn golden_capture_over_every_wire_matches_import() {
    let lines: Vec<String> = std::fs::read_to_string(support::CAPTURE).unwrap().lines().map(str::to_string).collect();
    let runtime = runtime();
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = open_index(reference_dir.path());
    backlinks::ingest::import_lines(&reference, std::io::Cursor::new(lines.join("\n"))).unwrap();
    let server = runtime.block_on(JetstreamServer::start(lines.clone(), Faults::default()));
    let last = last_time_us(&lines);
    let subjects: Vec<String> = lines
        .iter()
        .filter_map(|l| {
            let subject = &serde_json::from_str::<serde_json::Value>(l).unwrap()["commit"]["record"]["subject"];
            subject["uri"].as_str().or(subject.as_str()).map(String::from)
        })
        .collect();
    assert!(!subjects.is_empty());
    let identity_events: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|event| event["kind"] == "identity")
        .map(|event| event["did"].as_str().unwrap().to_string())
        .collect();
    assert!(!identity_events.is_empty(), "the capture has an identity event");
    for (url, compress) in
        [(server.v1_url(), false), (server.v1_url(), true), (server.v2_url(), false), (server.v2_url(), true)]
    {
        let dir = tempfile::tempdir().unwrap();
        let index = open_index(dir.path());
        let mut options = fast_options(std::slice::from_ref(&url));
        options.compress = compress;
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook = told.clone();
        options.on_identity = Some(backlinks::ingest::live::IdentityHook(Arc::new(move |did: &str| {
            hook.lock().unwrap().push(did.to_string());
        })));
        let ingest = start_ingest(&index, options, &runtime);
        wait_for_cursor(&index, &ingest, last, Duration::from_secs(30));
        let status = ingest.status.clone();
        ingest.stop().unwrap();
        assert_eq!(*told.lock().unwrap(), identity_events, "{url} compress={compress}: identity events are told");
        assert_eq!(status.applied(), lines.len() as u64, "{url} compress={compress}");
        assert_eq!(status.decode_errors.load(Ordering::Relaxed), 0);
        for subject in &subjects {
            assert_eq!(answers(&runtime, &index, subject), answers(&runtime, &reference, subject), "{url} {compress}");
        }
    }
    let queries = server.stats.queries.lock().unwrap().clone();
    assert_eq!(queries, ["", "compress=true", "", "zstdDictionary=20260811"]);
    assert_eq!(server.stats.dictionary_fetches.load(Ordering::Relaxed), 1, "only the compressed v2 client fetches");
}

/// Live ingest into `index` on the system clock, no writer lease.
fn start_ingest(index: &Arc<Index>, options: LiveOptions, runtime: &tokio::runtime::Runtime) -> LiveIngest {
    let writer = writer(index, system_clock(), runtime);
    LiveIngest::start(writer, options, system_clock(), runtime.handle().clone()).unwrap()
}

#[test]
fn a_rotated_dictionary_is_fetched_and_used() {
    let (lines, model) = generate(1_000, 3);
    let runtime = runtime();
    let server =
        runtime.block_on(JetstreamServer::start(lines.clone(), Faults { dictionary_id: Some(7), ..Faults::default() }));
    let dir = tempfile::tempdir().unwrap();
    let index = open_index(dir.path());
    let ingest = start_ingest(&index, fast_options(&[server.v2_url()]), &runtime);
    wait_for_cursor(&index, &ingest, last_time_us(&lines), Duration::from_secs(30));
    let status = ingest.status.clone();
    ingest.stop().unwrap();
    assert_eq!(server.stats.queries.lock().unwrap().clone(), ["zstdDictionary=7"]);
    assert_eq!((status.applied(), status.decode_errors.load(Ordering::Relaxed)), (1_000, 0));
    assert_matches_model(&runtime, &index, &model);
}

#[test]
fn server_errors_resume_from_the_cursor_and_lose_nothing() {
    let (lines, model) = generate(3_000, 5);
    let runtime = runtime();
    // A retired dictionary (refused pre-upgrade), a slow-consumer error and a drop.
    let faults = Faults {
        dictionary_id: Some(7),
        dictionary_unavailable: true,
        slow_consumer_after: Some(1_000),
        disconnect_after: vec![2_000],
        ..Faults::default()
    };
    let server = runtime.block_on(JetstreamServer::start(lines.clone(), faults));
    let dir = tempfile::tempdir().unwrap();
    let index = open_index(dir.path());
    let ingest = start_ingest(&index, fast_options(&[server.v2_url()]), &runtime);
    wait_for_cursor(&index, &ingest, last_time_us(&lines), Duration::from_secs(60));
    let status = ingest.status.clone();
    ingest.stop().unwrap();
    let queries = server.stats.queries.lock().unwrap().clone();
    assert_eq!(queries[0], "zstdDictionary=20260811", "no dictionary fetched: the embedded one");
    assert_eq!(queries[1], "", "refused, and no other to fetch: uncompressed, from the start");
    assert_eq!(server.stats.dictionary_fetches.load(Ordering::Relaxed), 2, "fetched at start and after the refusal");
    assert_eq!(queries[2], "cursor=1000", "resumes inclusively from the last seq it delivered");
    assert_eq!(queries[3], "cursor=1999");
    assert_eq!(server.sent(), 3_002, "two events re-sent, one per resume");
    assert_eq!(status.applied(), 3_000, "the same-instance resume dedups by seq");
    assert_eq!(status.server_errors.load(Ordering::Relaxed), 2);
    assert_matches_model(&runtime, &index, &model);
}

#[test]
fn too_old_cursor_is_refused_and_the_client_carries_on() {
    let (lines, model) = generate(500, 9);
    let runtime = runtime();
    let faults = Faults { floor_seq: 300, disconnect_after: vec![100], ..Faults::default() };
    let server = runtime.block_on(JetstreamServer::start(lines.clone(), faults));
    let dir = tempfile::tempdir().unwrap();
    let index = open_index(dir.path());
    let ingest = start_ingest(&index, fast_options(&[server.v2_url()]), &runtime);
    wait_for_cursor(&index, &ingest, last_time_us(&lines), Duration::from_secs(30));
    ingest.stop().unwrap();
    let queries = server.stats.queries.lock().unwrap().clone();
    let rewound = serde_json::from_str::<serde_json::Value>(&lines[99]).unwrap()["time_us"].as_i64().unwrap() - 2_000;
    let by_time = format!("cursor={rewound}&zstdDictionary=20260811");
    assert_eq!(&queries[..3], ["zstdDictionary=20260811", "cursor=100&zstdDictionary=20260811", &by_time]);
    assert_matches_model(&runtime, &index, &model);
}

#[test]
fn hundred_thousand_events_with_disconnects_and_a_switch_match_the_model() {
    let count: usize = std::env::var("LIVE_INGEST_EVENTS").ok().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let (lines, model) = generate(count, 42);
    let mut seed = 77;
    let mut threshold = |range: usize| (splitmix64(&mut seed) % range as u64) as u64 + 1;
    let runtime = runtime();
    // The preferred instance (v2, compressed) drops three times and then dies; the second (v1,
    // compressed) takes over from a rewound time cursor and drops twice more.
    let mut first_drops: Vec<u64> = (0..3).map(|_| threshold(count / 2)).collect();
    first_drops.sort();
    let first = Faults { disconnect_after: first_drops, refuse_after_connections: Some(3), ..Faults::default() };
    let second = Faults { disconnect_after: (0..2).map(|_| threshold(count / 2)).collect(), ..Faults::default() };
    let primary = runtime.block_on(JetstreamServer::start(lines.clone(), first));
    let fallback = runtime.block_on(JetstreamServer::start(lines.clone(), second));
    let dir = tempfile::tempdir().unwrap();
    let index = open_index(dir.path());
    let options = fast_options(&[primary.v2_url(), fallback.v1_url()]);
    let started = Instant::now();
    let ingest = start_ingest(&index, options, &runtime);
    wait_for_cursor(&index, &ingest, last_time_us(&lines), Duration::from_secs(600));
    let elapsed = started.elapsed();
    let status = ingest.status.clone();
    ingest.stop().unwrap();
    let delivered = primary.sent() + fallback.sent();
    eprintln!(
        "{count} events ({delivered} frames with replays) in {elapsed:?}: {:.0} frames/s",
        delivered as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(status.instance_switches.load(Ordering::Relaxed), 1);
    assert_eq!(primary.stats.refused.load(Ordering::Relaxed), 3, "three refusals, then the switch");
    assert!(fallback.stats.queries.lock().unwrap()[0].starts_with("cursor=1725"), "the switch resumes by time");
    assert!(status.reconnects.load(Ordering::Relaxed) >= 8);
    assert!(status.flushes.load(Ordering::Relaxed) > 1);
    assert!(status.events_of(EventKind::Delete) > 0 && status.events_of(EventKind::Account) > 0);
    assert!(status.applied() >= count as u64);
    assert_matches_model(&runtime, &index, &model);
}

#[test]
fn sigkill_at_random_moments_loses_and_resurrects_nothing() {
    const KILLS: usize = 22;
    // Times 0..10 ms apart, so the 10 s restart rewind replays about two thousand events.
    let (lines, model) = generate_spaced(60_000, 17, 5_000);
    let runtime = runtime();
    let pace = Faults { pause_every: Some((20, Duration::from_millis(5))), ..Faults::default() };
    let server = runtime.block_on(JetstreamServer::start(lines.clone(), pace));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("backlinks.toml");
    std::fs::write(&config, "memtable_bytes = 65536\nmax_unflushed_secs = 1\npublish_interval_secs = 1\n").unwrap();
    let data_dir = dir.path().join("data");
    let mut seed = 99;
    let mut progress = vec![0];
    let mut replays = Vec::new();
    for _ in 0..KILLS {
        let started = Instant::now();
        let writer = Server::start_live(&data_dir, &config, &server.v2_url());
        let uptime = Duration::from_millis(300 + splitmix64(&mut seed) % 2_500);
        let mut replayed = None;
        while started.elapsed() < uptime {
            // Replay time: until ingest is back where the killed process was.
            if replayed.is_none() && writer.cursor().unwrap_or(0) >= *progress.last().unwrap() {
                replayed = Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        replays.extend(replayed);
        progress.push(writer.cursor().unwrap_or(0));
        writer.kill();
    }
    let last = last_time_us(&lines);
    let during_ingest = progress[1..].iter().filter(|c| **c < last).count();
    assert!(during_ingest >= 20, "only {during_ingest} kills hit a running ingest: pace the server slower");
    let writer = Server::start_live(&data_dir, &config, &server.v2_url());
    let started = Instant::now();
    while writer.cursor() != Some(last) {
        assert!(started.elapsed() < Duration::from_secs(300), "stalled at {:?}", writer.cursor());
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.terminate();
    eprintln!("cursors at each kill: {progress:?}");
    eprintln!("caught up after a restart within: {replays:?} (worst {:?})", replays.iter().max());
    let index = open_index(&data_dir);
    assert_eq!(index.position().cursor, Some(last));
    assert_matches_model(&runtime, &index, &model);
}

#[test]
fn unflushed_events_are_flushed_by_age_on_the_injected_clock() {
    let (lines, model) = generate(300, 21);
    let runtime = runtime();
    let server = runtime.block_on(JetstreamServer::start(lines.clone(), Faults::default()));
    let dir = tempfile::tempdir().unwrap();
    let index = open_index(dir.path());
    let now_ms = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
    let clock: Clock = {
        let now_ms = now_ms.clone();
        Arc::new(move || now_ms.load(Ordering::SeqCst))
    };
    let mut options = fast_options(&[server.v1_url()]);
    options.queue_events = 4; // a tiny queue: the socket waits on the engine all the time
    let ingest =
        LiveIngest::start(writer(&index, clock.clone(), &runtime), options, clock, runtime.handle().clone()).unwrap();
    let last = last_time_us(&lines);
    wait_for_cursor(&index, &ingest, last, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(index.catalog.position().unwrap().cursor, None, "nothing is old enough to flush yet");
    assert_eq!(ingest.status.flushes.load(Ordering::Relaxed), 0);
    now_ms.fetch_add(500, Ordering::SeqCst); // the oldest unflushed event is now max_unflushed_ms old
    let started = Instant::now();
    // (The counter moves just after the catalog commit: wait for it, then check the commit.)
    while ingest.status.flushes.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no flush by age");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(index.catalog.position().unwrap().cursor, Some(last));
    assert_eq!(ingest.status.flushes.load(Ordering::Relaxed), 1);
    assert_eq!(ingest.status.applied(), 300, "a tiny queue slows reading down but drops nothing");
    ingest.stop().unwrap();
    assert_matches_model(&runtime, &index, &model);
}
