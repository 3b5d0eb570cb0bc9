//! Deterministic simulation of the whole write path under store faults, crashes and restarts,
//! checked against the reference model.
//!
//! One seed drives everything: the workload (creates, updates, deletes and account events over a
//! small universe of records and targets), the engine steps (flush, compaction, upload, publish,
//! GC), the crashes (the index dropped without a flush, sometimes with the whole local data
//! directory lost, so the next life restores from the bucket) and the faults of the store
//! (`store::faulty`: errors, latency, truncated bodies, dropped connections, a store that dies
//! after N puts). The wall clock is a counter advanced by the seed; the only real time is the
//! injected latency, which changes no outcome. Fault decisions depend only on (seed, rule, n-th
//! matching call), and calls are made in a seeded order, so a seed takes the same path every time:
//! the test `a_seed_replays_exactly` compares a hash of every step, result and answer.
//!
//! The firehose is the log: every generated event stays in `World::firehose`, and a restarted
//! index replays it from its durable cursor (rewound by a few events, as live ingest rewinds), so
//! after every restart the index must answer exactly as the model of the whole log: every target's
//! listBacklinks pages (both directions, random limits: no skip, no repeat, in order) and its count.
//! After every publish and every garbage collection the bucket must be restorable: CURRENT names
//! a manifest whose every object exists, and a new CURRENT has a newer generation.
//!
//! `BACKLINKS_SIM_SEEDS=N` runs seeds 1..=N (default `DEFAULT_SEEDS`), `BACKLINKS_SIM_SEED=S`
//! replays seed S alone, `BACKLINKS_SIM_STEPS` changes the steps per seed, `BACKLINKS_SIM_VERBOSE`
//! prints every step. A failure names its seed.

mod support;

use backlinks::base::rng::splitmix64;
use backlinks::count::{Count, CountOptions, count_backlinks};
use backlinks::index::{Index, IndexError, IndexOptions};
use backlinks::ingest::jetstream::parse_event;
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::lsm::table::TableOptions;
use backlinks::manifest::Manifest;
use backlinks::model::syntax::parse_target;
use backlinks::model::tid::format_tid;
use backlinks::outline::OutlineKind;
use backlinks::query::{Cursor, ListPage, ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::faulty::{Fault, FaultRule, FaultyStore, Operation};
use backlinks::store::object::Store;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use support::model::{Model, RecordKey};

/// Seeds run by `cargo test` (CI): a few seconds each.
const DEFAULT_SEEDS: u64 = 5;
const DEFAULT_STEPS: usize = 160;
/// Attempts of one step that fails only because of injected faults, before the test gives up.
const MAX_ATTEMPTS: usize = 500;
/// Pages one listing may take (the universe has far fewer backlinks per target).
const MAX_PAGES: usize = 1000;

const DIDS: usize = 6;
const RKEYS: usize = 9;
const COLLECTIONS: [&str; 3] = ["app.bsky.feed.like", "app.bsky.feed.post", "com.example.thing"];
const FIELDS: [&str; 3] = ["subject", "other", "list"];
const TARGETS: usize = 10;
const URL_TARGETS_FROM: usize = 8;

/// A small deterministic generator (splitmix64), the only source of randomness.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0);
        ((splitmix64(&mut self.0) as u128 * n as u128) >> 64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

fn did(i: usize) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz234567";
    let name: String = (0..24).map(|k| alphabet[(i * 7 + k * 3) % 32] as char).collect();
    format!("did:plc:{name}")
}

/// Mostly TIDs (stored inline); the last one is an outlined record key.
fn rkey(i: usize) -> String {
    if i == RKEYS - 1 { "self".to_string() } else { format_tid(1_700_000_000_000_000 + i as u64 * 1_000_003) }
}

/// Targets: bare DIDs and posts (some of them records of the universe itself), and two URLs.
fn target(i: usize) -> String {
    match i % 3 {
        _ if i >= URL_TARGETS_FROM => format!("https://example.com/page/{i}"),
        0 => did(i % DIDS),
        _ => format!("at://{}/app.bsky.feed.post/{}", did(i % DIDS), rkey(i % RKEYS)),
    }
}

fn record_uri(&(d, c, r): &RecordKey) -> String {
    format!("at://{}/{}/{}", did(d), COLLECTIONS[c], rkey(r))
}

/// A record holding `links` (target, field) and the (target, location) pairs it yields. `list`
/// is an array; the other fields hold a strong reference or a plain string, first one wins.
fn record_json(links: &[(usize, usize)]) -> (serde_json::Value, BTreeSet<(String, String)>) {
    let mut record = serde_json::Map::new();
    let mut expected = BTreeSet::new();
    for (i, &(t, f)) in links.iter().enumerate() {
        let uri = target(t);
        match FIELDS[f] {
            "list" => {
                let list = record.entry("list").or_insert_with(|| serde_json::json!([]));
                list.as_array_mut().expect("list is an array").push(uri.clone().into());
                expected.insert((uri, "$.list[]".to_string()));
            }
            field if record.contains_key(field) => {}
            field if i % 2 == 0 && uri.starts_with("at://") => {
                let cid = "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em";
                record.insert(field.into(), serde_json::json!({ "uri": uri, "cid": cid }));
                expected.insert((uri, format!("$.{field}")));
            }
            field => {
                record.insert(field.into(), uri.clone().into());
                expected.insert((uri, format!("$.{field}")));
            }
        }
    }
    record.insert("$type".into(), "com.example.record".into());
    (serde_json::Value::Object(record), expected)
}

/// The Jetstream v1 line of one event; `time_us` is unique and increasing (the durable cursor).
fn commit_line(time_us: i64, (d, c, r): RecordKey, operation: &str, record: Option<serde_json::Value>) -> String {
    let mut commit = serde_json::json!({ "rev": "3l3qo2vutsw2b", "operation": operation, "collection": COLLECTIONS[c], "rkey": rkey(r) });
    if let Some(record) = record {
        commit["record"] = record;
    }
    serde_json::json!({ "did": did(d), "time_us": time_us, "kind": "commit", "commit": commit }).to_string()
}

fn account_line(time_us: i64, d: usize, active: bool, status: Option<&str>) -> String {
    let mut account = serde_json::json!({ "active": active, "did": did(d), "seq": 1, "time": "2024-01-01T00:00:00Z" });
    if let Some(status) = status {
        account["status"] = status.into();
    }
    serde_json::json!({ "did": did(d), "time_us": time_us, "kind": "account", "account": account }).to_string()
}

/// Engine options that make a short run flush often, span frames, compact through tiers into
/// sharded runs and read most tables from the bucket.
fn index_options(rng: &mut Rng) -> IndexOptions {
    IndexOptions {
        memtable_bytes: 64 * (30 + rng.below(90)),
        table: TableOptions { frame_bytes: 128 + 64 * rng.below(8), ..TableOptions::default() },
        compaction: CompactionOptions {
            fan_in: 2 + rng.below(3),
            // Up to 2 KiB: a tier 0 that holds some flushed deltas, for settling to merge.
            min_run_bytes: 64 << rng.below(6),
            shard_bytes: 200 + 100 * rng.below(6) as u64,
            frames_per_read: 1 + rng.below(3),
            max_bytes_per_sec: None,
            // Often fewer than the run's revocations: merges keep only the newest.
            max_thresholds: [2, 16, 1 << 20][rng.below(3)],
        },
        // Small: most uploaded tables lose their local copy and are read by range.
        cache_bytes: [0, 1024, 8192, 1 << 20][rng.below(4)],
        // Off: a query that fails on a fault drops its sibling reads at whatever point the
        // threads reached, so what they had cached would depend on timing, not on the seed.
        frame_cache_bytes: 0,
        ..IndexOptions::default()
    }
}

/// The faults of one life of the store, drawn from the seed: writes fail rarely in a calm life
/// and often in a stormy one; reads always fail rarely (what gets past the S3 client's own
/// retries), since a query or a restore makes dozens of them and any failure fails it whole (it is
/// then retried, up to `MAX_ATTEMPTS` times).
fn fault_rules(rng: &mut Rng) -> Vec<FaultRule> {
    let percent = |rng: &mut Rng, max: usize| rng.below(max + 1) as f64 / 100.0;
    let storm = if rng.chance(50) { 5 } else { 1 };
    let writes = [Operation::Put, Operation::Delete, Operation::List];
    let reads = [Operation::Get, Operation::GetRange];
    let mut rules = vec![
        FaultRule::new(Fault::Error).operations(&writes).probability(percent(rng, 3 * storm)),
        FaultRule::new(Fault::DropBefore).operations(&writes).probability(percent(rng, storm)),
        FaultRule::new(Fault::DropAfter).operations(&writes).probability(percent(rng, 2 * storm)),
        FaultRule::new(Fault::Error).operations(&reads).probability(percent(rng, 1)),
        FaultRule::new(Fault::DropBefore).operations(&reads).probability(percent(rng, 1)),
        FaultRule::new(Fault::TruncatedBody).probability(percent(rng, 1)),
        FaultRule::new(Fault::Latency { min: Duration::ZERO, max: Duration::from_millis(2) })
            .probability(percent(rng, 10)),
    ];
    if rng.chance(30) {
        // The process dies in the middle of an upload or a publish (the store refuses everything).
        rules.push(FaultRule::new(Fault::CrashAfterPuts(1 + rng.below(40) as u64)));
    }
    rules
}

/// An error that only injected faults explain (the operation may be tried again).
fn is_injected(error: &dyn std::fmt::Display) -> bool {
    let text = error.to_string();
    text.contains("injected:") || text.contains("short read")
}

fn is_store_crash(error: &dyn std::fmt::Display) -> bool {
    error.to_string().contains("the store crashed")
}

/// One merge step of the index: `compact_once` or `settle_once`.
type MergeStep = fn(&Index, &tokio::runtime::Handle, &dyn Fn() -> u64) -> Result<bool, IndexError>;

/// What happened in a run, for the report and the replay check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    events: usize,
    restarts: usize,
    restores: usize,
    replayed: usize,
    publishes: usize,
    compactions: usize,
    /// Merges of tier 0 (`Index::settle_once`).
    settles: usize,
    checks: usize,
    injected: usize,
    store_crashes: usize,
    /// A hash of every step, engine result and answer, in order: equal for equal seeds.
    trace: u64,
}

struct World {
    rng: Rng,
    options: IndexOptions,
    data_dir: tempfile::TempDir,
    bucket_dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    firehose: Vec<String>,
    model: Model,
    /// Simulated wall clock (unix ms) for retirement and GC.
    now_ms: u64,
    /// The running process's index (over a faulty view of the bucket); `None` between lives.
    life: Option<Index>,
    lives: u64,
    /// Print every step (`BACKLINKS_SIM_VERBOSE`), to follow a failing seed.
    verbose: bool,
    /// The last CURRENT seen and its manifest's generation (a new CURRENT needs a newer one).
    last_current: String,
    last_generation: u64,
    tally: Tally,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
        let options = index_options(&mut rng);
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let mut world = World {
            rng,
            options,
            data_dir: tempfile::tempdir().expect("data dir"),
            bucket_dir: tempfile::tempdir().expect("bucket dir"),
            runtime,
            firehose: Vec::new(),
            model: Model::default(),
            now_ms: 1_000_000,
            life: None,
            lives: 0,
            verbose: std::env::var_os("BACKLINKS_SIM_VERBOSE").is_some(),
            last_current: String::new(),
            last_generation: 0,
            tally: Tally::default(),
        };
        world.start_life();
        world
    }

    fn data_path(&self) -> PathBuf {
        self.data_dir.path().join("data")
    }

    fn index(&self) -> &Index {
        self.life.as_ref().expect("a running life")
    }

    /// Opens the index (restoring it from the bucket when its directory is empty) and replays
    /// the firehose from its durable cursor, rewound by a few events. A store that dies during
    /// the restore takes this life with it: the next one starts over.
    fn start_life(&mut self) {
        loop {
            self.lives += 1;
            let rules = fault_rules(&mut self.rng);
            let store_seed = splitmix64(&mut self.rng.0);
            let bucket = DirStore::new(self.bucket_dir.path().to_path_buf());
            let store = Arc::new(FaultyStore::new(bucket, store_seed, rules));
            let entropy = splitmix64(&mut self.rng.0);
            let index = Index::open(&self.data_path(), store, self.options.clone(), entropy)
                .unwrap_or_else(|e| panic!("opening the index: {e}"));
            self.life = Some(index);
            if self.restore() {
                break;
            }
            self.tally.store_crashes += 1;
            self.end_life();
        }
        self.replay();
    }

    /// `restore_if_empty`, tried again while only injected faults stop it. False when the store
    /// died.
    fn restore(&mut self) -> bool {
        for _ in 0..MAX_ATTEMPTS {
            let now = self.now_ms;
            match self.runtime.block_on(self.index().restore_if_empty(now)) {
                Ok(restored) => {
                    self.tally.restores += restored as usize;
                    self.note(&format!("restored: {restored}"));
                    return true;
                }
                Err(e) if is_store_crash(&e) => return false,
                Err(e) if is_injected(&e) => self.injected("restore"),
                Err(e) => panic!("restore failed: {e}"),
            }
        }
        panic!("restore kept failing");
    }

    /// A store that died (CrashAfterPuts) takes the process with it: start again.
    fn restart_with_fresh_store(&mut self) {
        self.tally.store_crashes += 1;
        self.note("the store crashed");
        self.crash(false);
    }

    /// Drops the index without a flush.
    fn end_life(&mut self) {
        self.note("end of life");
        self.life = None;
    }

    /// Folds one fact about the path taken into the trace: equal seeds must leave equal traces.
    fn note(&mut self, fact: &str) {
        if self.verbose {
            eprintln!("[life {}] {fact}", self.lives);
        }
        self.tally.trace = xxhash_rust::xxh3::xxh3_64_with_seed(fact.as_bytes(), self.tally.trace);
    }

    /// Notes and counts an operation that failed only because of injected faults.
    fn injected(&mut self, what: &str) {
        self.tally.injected += 1;
        self.note(&format!("{what}: injected fault"));
    }

    /// Applies the firehose from the index's durable cursor, rewound by a few events, many, or
    /// all the way to the start (a replay of events the tables already hold must change nothing:
    /// live ingest rewinds by time, and a lost cursor replays everything).
    fn replay(&mut self) {
        let cursor = self.index().position().cursor;
        let first_new =
            cursor.map_or(0, |c| self.firehose.iter().position(|l| time_of(l) > c).unwrap_or(self.firehose.len()));
        let rewind = [0, 1, 3, 20, usize::MAX][self.rng.below(5)];
        let from = first_new.saturating_sub(rewind);
        for i in from..self.firehose.len() {
            self.apply(i);
        }
        self.tally.replayed += self.firehose.len() - from;
        self.note(&format!("replayed {from}..{}", self.firehose.len()));
    }

    fn apply(&mut self, i: usize) {
        let line = &self.firehose[i];
        let event = parse_event(line.as_bytes()).unwrap_or_else(|e| panic!("generated event {i}: {e}"));
        let index = self.life.as_ref().expect("a running life");
        index.apply(&event.operation, Some(event.time_us)).unwrap_or_else(|e| panic!("apply: {e}"));
        if index.wants_flush() {
            index.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        }
    }

    /// Drops the index without flushing (its memtables are lost); with `lose_dir`, the whole data
    /// directory too. Then a new life.
    fn crash(&mut self, lose_dir: bool) {
        self.tally.restarts += 1;
        self.note(&format!("crash; the data directory is lost: {lose_dir}"));
        self.end_life();
        if lose_dir {
            std::fs::remove_dir_all(self.data_path()).expect("remove the data dir");
        }
        self.start_life();
        self.check_all();
    }

    /// Generates one event, adds it to the firehose and the model, and ingests it.
    fn ingest_one(&mut self) {
        let time_us = 1_000 + self.firehose.len() as i64;
        let key = (self.rng.below(DIDS), self.rng.below(COLLECTIONS.len()), self.rng.below(RKEYS));
        let line = match self.rng.below(20) {
            0..=11 => self.write(time_us, key),
            12..=15 => {
                self.model.records.remove(&key);
                commit_line(time_us, key, "delete", None)
            }
            16 => {
                self.model.delete_account(key.0);
                account_line(time_us, key.0, false, Some("deleted"))
            }
            17 => {
                self.model.hidden.insert(key.0);
                let status = ["deactivated", "suspended", "takendown"][self.rng.below(3)];
                account_line(time_us, key.0, false, Some(status))
            }
            _ => {
                self.model.hidden.remove(&key.0);
                account_line(time_us, key.0, true, None)
            }
        };
        self.firehose.push(line);
        self.tally.events += 1;
        self.apply(self.firehose.len() - 1);
    }

    /// A create of a new record, or an update (all links replaced) of a live one.
    fn write(&mut self, time_us: i64, key: RecordKey) -> String {
        let count = self.rng.below(4);
        let links: Vec<(usize, usize)> =
            (0..count).map(|_| (self.rng.below(TARGETS), self.rng.below(FIELDS.len()))).collect();
        let (record, expected) = record_json(&links);
        let operation = if self.model.records.contains_key(&key) { "update" } else { "create" };
        self.model.records.insert(key, expected);
        commit_line(time_us, key, operation, Some(record))
    }

    fn step(&mut self) {
        self.now_ms += 1 + self.rng.below(2_000) as u64;
        let choice = self.rng.below(100);
        self.note(&format!("step {choice}"));
        match choice {
            0..=59 => {
                for _ in 0..1 + self.rng.below(8) {
                    self.ingest_one();
                }
            }
            60..=67 => {
                self.index().flush().unwrap_or_else(|e| panic!("flush: {e}"));
            }
            68..=75 => self.compact(),
            76..=83 => self.publish(),
            84..=87 => self.collect_garbage(),
            88..=91 => self.check_all(),
            92..=96 => self.crash(false),
            _ => self.crash(true),
        }
    }

    /// Compacts until no tier is full, and one time in three then settles tier 0 (as a quiet
    /// writer does); an injected read failure leaves the inputs in place.
    fn compact(&mut self) {
        let settle = self.rng.below(3) == 0;
        if let Some(merged) = self.merge_while(Index::compact_once) {
            self.tally.compactions += merged;
            if settle && let Some(settled) = self.merge_while(Index::settle_once) {
                self.tally.settles += settled;
            }
        }
    }

    /// Runs `merge` until it has nothing to merge: how many merges it made, or `None` if a fault
    /// stopped it.
    fn merge_while(&mut self, merge: MergeStep) -> Option<usize> {
        let handle = self.runtime.handle().clone();
        let mut merged = 0;
        loop {
            let now_ms = self.now_ms;
            match merge(self.index(), &handle, &|| now_ms) {
                Ok(true) => {
                    merged += 1;
                    self.note("compacted");
                }
                Ok(false) => return Some(merged),
                Err(e) if is_store_crash(&e) => {
                    self.restart_with_fresh_store();
                    return None;
                }
                Err(e) if is_injected(&e) => {
                    self.injected("compaction");
                    return None;
                }
                Err(e) => panic!("compaction failed: {e}"),
            }
        }
    }

    /// Upload and publish (a fault fails it; live ingest simply tries again later), then the
    /// bucket must be restorable.
    fn publish(&mut self) {
        match self.runtime.block_on(self.index().publish_manifest()) {
            Ok(name) => {
                self.tally.publishes += 1;
                self.note(&format!("published {name}"));
            }
            Err(e) if is_store_crash(&e) => return self.restart_with_fresh_store(),
            Err(e) if is_injected(&e) => self.injected("publish"),
            Err(e) => panic!("publish failed: {e}"),
        }
        self.check_bucket_restorable();
    }

    /// Garbage collection, whether or not the last publish went through (live ingest runs it
    /// after every attempt); the bucket must stay restorable.
    fn collect_garbage(&mut self) {
        let (now, grace) = (self.now_ms, [0, 1_000, 60_000][self.rng.below(3)]);
        match self.runtime.block_on(self.index().collect_garbage(now, grace)) {
            Ok((tables, orphans)) => self.note(&format!("collected {tables} tables, {orphans} orphans")),
            Err(e) if is_store_crash(&e) => return self.restart_with_fresh_store(),
            Err(e) if is_injected(&e) => self.injected("garbage collection"),
            Err(e) => panic!("garbage collection failed: {e}"),
        }
        self.check_bucket_restorable();
    }

    /// CURRENT names a manifest whose every table and outline range is in the bucket, and its
    /// generation never went back.
    fn check_bucket_restorable(&mut self) {
        let bucket = DirStore::new(self.bucket_dir.path().to_path_buf());
        self.runtime.block_on(async {
            let Ok(name) = bucket.get("CURRENT").await else { return };
            let name = String::from_utf8(name.to_vec()).expect("CURRENT is ASCII");
            let body = bucket.get(&format!("manifests/{name}")).await.expect("CURRENT's manifest exists");
            let manifest = Manifest::decode(&name, &body).expect("CURRENT's manifest decodes");
            if name != self.last_current {
                let generation = manifest.generation;
                assert!(generation > self.last_generation, "CURRENT moved to {name} without a newer generation");
                (self.last_generation, self.last_current) = (generation, name.clone());
            }
            for table in &manifest.tables {
                for ext in ["meta", "data"] {
                    let key = format!("tables/{}/{}.{ext}", table.tree, table.id);
                    let object = bucket.get(&key).await.unwrap_or_else(|e| panic!("manifest {name} names {key}: {e}"));
                    let expected = if ext == "meta" { table.meta_len } else { table.data_len };
                    assert_eq!(object.len() as u64, expected, "{key} has the size the manifest says");
                }
            }
            for range in &manifest.outlines {
                bucket.get(&range.key()).await.unwrap_or_else(|e| panic!("manifest {name} names {}: {e}", range.key()));
            }
        });
    }

    /// Every target: listBacklinks (paged) and countBacklinks equal the model.
    fn check_all(&mut self) {
        self.tally.checks += 1;
        for t in 0..TARGETS {
            let (limit, reverse) = (1 + self.rng.below(5), self.rng.chance(50));
            self.check_target(&target(t), limit, reverse);
        }
    }

    fn check_target(&mut self, target: &str, limit: usize, reverse: bool) {
        let expected: BTreeSet<(String, String)> = self.model.backlinks(target, record_uri).into_iter().collect();
        let got = self.list_all(target, limit, reverse);
        let got_set: BTreeSet<(String, String)> = got.iter().cloned().collect();
        assert_eq!(got.len(), got_set.len(), "a backlink repeated for {target}: {got:?}");
        assert_eq!(got_set, expected, "listBacklinks of {target} (limit {limit}, reverse {reverse})");
        self.check_order(&got, reverse, target);
        let Answer::Count(count) = self.with_retries(&Query::Count(target.to_string())) else { unreachable!() };
        assert_eq!(count.total, expected.len() as u64, "countBacklinks of {target}");
        assert!(!count.approximate);
    }

    /// Every page of listBacklinks, in page order, as (source URI, location).
    fn list_all(&mut self, target: &str, limit: usize, reverse: bool) -> Vec<(String, String)> {
        let mut got = Vec::new();
        let mut cursor: Option<Cursor> = None;
        for _ in 0..MAX_PAGES {
            let params = ListParams { limit, reverse, cursor, ..ListParams::new(target) };
            let Answer::Page(page) = self.with_retries(&Query::Page(params)) else { unreachable!() };
            assert!(page.items.len() <= limit);
            got.extend(page.items.into_iter().map(|(location, uri)| (uri, location)));
            match page.cursor {
                Some(c) => cursor = Some(Cursor::decode(&c).expect("the engine's cursor decodes")),
                None => return got,
            }
        }
        panic!("listing {target} did not end after {MAX_PAGES} pages");
    }

    /// Newest first is descending (source id, location id); `reverse` ascending.
    fn check_order(&self, got: &[(String, String)], reverse: bool, target: &str) {
        let index = self.index();
        let position = |(uri, location): &(String, String)| {
            let source = index.lookup_target(&parse_target(uri).expect("a URI")).expect("lookup").expect("known");
            let location = index.outlines.lookup(OutlineKind::Location, location).expect("lookup").expect("known");
            (source, location)
        };
        let positions: Vec<_> = got.iter().map(position).collect();
        let ordered = positions.windows(2).all(|w| if reverse { w[0] < w[1] } else { w[0] > w[1] });
        assert!(ordered, "pages of {target} out of order (reverse {reverse}): {got:?}");
    }

    /// Runs a query, again while it fails only on injected faults (a failed query is an error
    /// answer, never wrong data); a dead store restarts the process first.
    fn with_retries(&mut self, query: &Query) -> Answer {
        let mut last_error = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let index = self.index();
            let answer = self.runtime.block_on(async {
                match query {
                    Query::Page(params) => list_backlinks(index, params).await.map(Answer::Page),
                    Query::Count(target) => {
                        count_backlinks(index, &ListParams::new(target.as_str()), CountOptions::default())
                            .await
                            .map(Answer::Count)
                    }
                }
            });
            match answer {
                Ok(answer) => {
                    self.note("answered");
                    return answer;
                }
                Err(e) if is_store_crash(&e) => self.restart_with_fresh_store(),
                Err(e) if is_injected(&e) => {
                    self.injected("query");
                    last_error = e.to_string();
                }
                Err(e) => panic!("query failed: {e}"),
            }
        }
        panic!("a query kept failing; last error: {last_error}");
    }

    fn finish(mut self) -> Tally {
        let lose_dir = self.rng.chance(50);
        self.crash(lose_dir);
        self.end_life();
        self.tally.clone()
    }
}

enum Query {
    Page(ListParams),
    Count(String),
}

enum Answer {
    Page(ListPage),
    Count(Count),
}

fn time_of(line: &str) -> i64 {
    parse_event(line.as_bytes()).expect("generated events parse").time_us
}

/// Runs one seed; a panic inside names the seed and how to replay it.
fn run_seed(seed: u64, steps: usize) -> Tally {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut world = World::new(seed);
        for _ in 0..steps {
            world.step();
        }
        world.finish()
    }));
    outcome.unwrap_or_else(|panic| {
        eprintln!(
            "simulation seed {seed} failed; replay it with BACKLINKS_SIM_SEED={seed} BACKLINKS_SIM_STEPS={steps}"
        );
        std::panic::resume_unwind(panic)
    })
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")))
}

#[test]
fn seeded_workloads_with_faults_and_crashes_match_the_model() {
    let steps = env_number("BACKLINKS_SIM_STEPS").map_or(DEFAULT_STEPS, |s| s as usize);
    let seeds: Vec<u64> = match env_number("BACKLINKS_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_number("BACKLINKS_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    let mut total = Tally::default();
    for &seed in &seeds {
        let tally = run_seed(seed, steps);
        total.events += tally.events;
        total.restarts += tally.restarts;
        total.restores += tally.restores;
        total.replayed += tally.replayed;
        total.publishes += tally.publishes;
        total.compactions += tally.compactions;
        total.settles += tally.settles;
        total.checks += tally.checks;
        total.injected += tally.injected;
        total.store_crashes += tally.store_crashes;
    }
    eprintln!("simulated {} seeds x {steps} steps: {total:?}", seeds.len());
    // The workload must really exercise what it claims to.
    assert!(total.restarts >= seeds.len() && total.checks >= total.restarts);
    if seeds.len() >= DEFAULT_SEEDS as usize {
        assert!(
            total.restores > 0
                && total.compactions > 0
                && total.settles > 0
                && total.publishes > 0
                && total.injected > 0,
            "{total:?}"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    let first = run_seed(3, 60);
    let second = run_seed(3, 60);
    assert_eq!(first, second, "the same seed took another path");
    assert_ne!(first.trace, run_seed(4, 60).trace);
}
