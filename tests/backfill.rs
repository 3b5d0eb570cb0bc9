//! Backfill, end to end: every fixture CAR indexes exactly the links the JSON rules give for the
//! same records; a relay backfill through a test relay and PDSes that inject 429s, 500s, cut
//! bodies and dropped connections, killed in the middle and resumed, ends identical to an
//! uninterrupted one; `--repo` resolves its PDS through a PLC directory.

mod support;

use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::backfill::repos::{RepoStatus, ReposDb};
use backlinks::ingest::car::{CarLimits, read_repo_bytes};
use backlinks::model::syntax::LinkTarget;
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::pds_server::{SyncServer, SyncServerBuilder, mixed_faults, no_faults};
use support::{BIN, run};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car");

/// Every real repository CAR in the fixtures (each a different DID).
const CARS: &[&str] = &[
    "jetstream/repo.car",
    "indigo/fakermaker.repo.car",
    "indigo/paul_staging.repo.car",
    "indigo/greenground.repo.car",
    "indigo/divy.repo",
    "indigo/repo_slice.car",
    "indigo/bafyreieovfuizojpw3zresz7sx3nk4trm2by23pt5rxbey3jme4uo5ogiu.car",
    "repo-stream/little.car",
    "repo-stream/tiny.car",
    "repo-stream/empty.car",
    "rsky/valid_repo.car",
];

fn car_path(name: &str) -> String {
    format!("{DATA}/{name}")
}

fn car_bytes(name: &str) -> Vec<u8> {
    std::fs::read(car_path(name)).unwrap()
}

/// Every record of every CAR as a Jetstream v1 create, the input of the JSON rules.
fn json_lines(cars: &[&str]) -> String {
    let mut out = String::new();
    let mut time_us = 1_700_000_000_000_000i64;
    for name in cars {
        let (commit, records, _) = read_repo_bytes(&car_bytes(name), &CarLimits::default()).unwrap();
        for record in records {
            time_us += 1;
            let event = serde_json::json!({
                "did": commit.did, "time_us": time_us, "kind": "commit",
                "commit": { "rev": commit.rev, "operation": "create", "collection": record.collection,
                            "rkey": record.rkey, "record": record.record, "cid": record.cid },
            });
            out.push_str(&event.to_string());
            out.push('\n');
        }
    }
    out
}

/// Every link target the records of `cars` name, as query targets.
fn targets(cars: &[&str]) -> BTreeSet<String> {
    let mut targets = BTreeSet::new();
    for name in cars {
        let (_, records, _) = read_repo_bytes(&car_bytes(name), &CarLimits::default()).unwrap();
        for record in &records {
            for link in extract_links(&record.record, &ExtractLimits::default()).links {
                targets.insert(match link.target {
                    LinkTarget::Record { did, collection, rkey } => format!("at://{did}/{collection}/{rkey}"),
                    LinkTarget::Did(did) => did.to_string(),
                });
            }
        }
    }
    targets
}

type Answers = BTreeMap<String, Vec<(String, String)>>;

/// Every (location, source) backlink of every target, paged through, from the index in `dir`
/// (whose bucket is `dir/bucket`).
fn answers(dir: &Path, targets: &BTreeSet<String>) -> Answers {
    answers_with_bucket(dir, &dir.join("bucket"), targets)
}

fn answers_with_bucket(dir: &Path, bucket: &Path, targets: &BTreeSet<String>) -> Answers {
    let store = Arc::new(DirStore::new(bucket.to_path_buf()));
    let options = IndexOptions { read_only: true, ..IndexOptions::default() };
    let index = Index::open(dir, store, options, 1).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out = Answers::new();
    for target in targets {
        let mut params = ListParams::new(target.clone());
        params.limit = 7;
        let mut all = Vec::new();
        loop {
            let page = runtime.block_on(list_backlinks(&index, &params)).unwrap();
            all.extend(page.items);
            match page.cursor {
                Some(cursor) => params.cursor = Some(backlinks::query::Cursor::decode(&cursor).unwrap()),
                None => break,
            }
        }
        all.sort();
        if !all.is_empty() {
            out.insert(target.clone(), all);
        }
    }
    out
}

/// Imports the JSON rendering of `cars` into a fresh index; returns its answers.
fn json_rule_answers(cars: &[&str], scratch: &Path, targets: &BTreeSet<String>) -> Answers {
    let lines = scratch.join("records.jsonl");
    std::fs::write(&lines, json_lines(cars)).unwrap();
    let dir = scratch.join("json");
    let (ok, _, stderr) = run(&["import", "--data-dir", dir.to_str().unwrap(), lines.to_str().unwrap()]);
    assert!(ok, "import failed: {stderr}");
    answers(&dir, targets)
}

fn summary(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{stdout:?}: {e}"))
}

fn link_count(answers: &Answers) -> usize {
    answers.values().map(Vec::len).sum()
}

#[test]
fn every_fixture_car_indexes_the_links_the_json_rules_give() {
    let scratch = tempfile::tempdir().unwrap();
    let targets = targets(CARS);
    let expected = json_rule_answers(CARS, scratch.path(), &targets);
    assert!(link_count(&expected) > 500, "the fixtures hold hundreds of links, got {}", link_count(&expected));

    let dir = scratch.path().join("cars");
    let mut args = vec!["backfill".to_string(), "--data-dir".into(), dir.to_str().unwrap().into()];
    for name in CARS {
        args.extend(["--car".to_string(), car_path(name)]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "backfill failed: {stderr}");
    let first = summary(&stdout);
    assert_eq!(first["indexed"], CARS.len(), "{first}");
    assert_eq!(first["repos"]["done"], CARS.len(), "{first}");
    let got = answers(&dir, &targets);
    assert_eq!(got, expected, "CAR and JSON give different links");

    // The same files again: every repository is already indexed at that revision.
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "second backfill failed: {stderr}");
    let second = summary(&stdout);
    assert_eq!(second["indexed"], 0, "{second}");
    assert_eq!(second["repos"]["done"], CARS.len(), "{second}");
    assert_eq!(answers(&dir, &targets), expected);
}

/// Two PDSes holding the fixtures between them and a relay listing both, all on loopback.
async fn network(faults: bool, delay: Duration) -> (SyncServer, Vec<SyncServer>) {
    let mut pdses = Vec::new();
    for part in 0..2 {
        let mut builder = SyncServerBuilder::new().delay(delay).fail_first_listing();
        builder = builder.faults(if faults { mixed_faults(7 + part as u64) } else { no_faults() });
        for name in CARS.iter().skip(part).step_by(2) {
            builder = builder.repo(car_bytes(name));
        }
        pdses.push(builder.start().await);
    }
    let hosts = pdses.iter().map(|p| p.url.trim_start_matches("http://").to_string()).collect();
    let relay = SyncServerBuilder::new().hosts(hosts).start().await;
    (relay, pdses)
}

fn backfill_command(relay: &str, dir: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["backfill", "--relay", relay, "--concurrency", "3", "--per-host-per-second", "50", "--data-dir"])
        .arg(dir)
        // Small memtables: flushes (and so durable marks) happen in the middle of the backfill.
        .env("BACKLINKS_MEMTABLE_BYTES", "65536")
        .env_remove("NOTIFY_SOCKET");
    command
}

fn run_to_end(mut command: Command) -> serde_json::Value {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "backfill failed: {stderr}");
    summary(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn a_relay_backfill_with_faults_killed_and_resumed_equals_an_uninterrupted_one() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let targets = targets(CARS);
    let expected = json_rule_answers(CARS, scratch.path(), &targets);

    // Uninterrupted, through every fault kind.
    let (relay, pdses) = runtime.block_on(network(true, Duration::ZERO));
    let whole = scratch.path().join("whole");
    let report = run_to_end(backfill_command(&relay.url, &whole));
    assert_eq!(report["indexed"], CARS.len(), "{report}");
    assert!(report["retries"].as_u64().unwrap() >= 4, "faults were retried: {report}");
    assert!(report["rateLimited"].as_u64().unwrap() >= 1, "a 429 was seen: {report}");
    let faults: u64 = pdses.iter().map(|p| p.counters.faults.load(Ordering::Relaxed)).sum();
    assert!(faults >= 6, "the plan injected faults: {faults}");
    let waited = pdses.iter().map(|p| p.counters.min_wait_after_429_ms.load(Ordering::Relaxed)).min().unwrap();
    assert!((1_000..u64::MAX).contains(&waited), "Retry-After: 1 was honoured: {waited} ms");
    assert_eq!(answers(&whole, &targets), expected, "uninterrupted backfill differs from the JSON rules");

    // Killed after a few repositories, then resumed.
    let (relay, pdses) = runtime.block_on(network(true, Duration::from_millis(250)));
    let resumed = scratch.path().join("resumed");
    let mut child = backfill_command(&relay.url, &resumed).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let served = || pdses.iter().map(|p| p.counters.repos_served.load(Ordering::Relaxed)).sum::<u64>();
    let deadline = Instant::now() + Duration::from_secs(60);
    while served() < 4 {
        assert!(Instant::now() < deadline, "the backfill never got going");
        assert!(child.try_wait().unwrap().is_none(), "the backfill ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let counts = ReposDb::open(&resumed.join("repos.db")).unwrap().counts().unwrap();
    let done = counts.get(&RepoStatus::Done).copied().unwrap_or(0);
    assert!(done < CARS.len() as u64, "killed mid-way, yet every repository was done: {counts:?}");
    let report = run_to_end(backfill_command(&relay.url, &resumed));
    assert_eq!(report["repos"]["done"], CARS.len(), "{report}");
    assert_eq!(answers(&resumed, &targets), expected, "resumed backfill differs from the uninterrupted one");
}

#[test]
fn one_repo_is_fetched_from_the_pds_its_did_document_names() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let name = "jetstream/repo.car";
    let (commit, _, _) = read_repo_bytes(&car_bytes(name), &CarLimits::default()).unwrap();
    let pds = runtime.block_on(SyncServerBuilder::new().repo(car_bytes(name)).start());
    let plc = runtime.block_on(SyncServerBuilder::new().plc(&commit.did, &pds.url).start());
    let dir = scratch.path().join("one");
    let (ok, stdout, stderr) = run(&[
        "backfill",
        "--data-dir",
        dir.to_str().unwrap(),
        "--plc-url",
        &plc.url,
        "--repo",
        &commit.did,
        "--repo",
        "did:plc:nobodyknowsthisone",
    ]);
    assert!(ok, "backfill failed: {stderr}");
    let report = summary(&stdout);
    assert_eq!(report["indexed"], 1, "{report}");
    assert_eq!(report["repos"]["failed"], 1, "the unknown DID is recorded as failed: {report}");
    let targets = targets(&[name]);
    let expected = json_rule_answers(&[name], scratch.path(), &targets);
    assert!(!expected.is_empty());
    assert_eq!(answers(&dir, &targets), expected);
}

/// Reads `/metrics` from a running `serve` and returns the value of one unlabelled series.
fn metric(addr: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let line = response.lines().find(|l| l.split_whitespace().next() == Some(name))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn serve_backfills_a_pds_while_it_follows_the_live_stream() {
    use support::jetstream_server::{Faults, JetstreamServer};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // Live: a few real events from the capture, a pause (the backfill finishes meanwhile), then
    // commits to a backfilled repository newer than its snapshot: a new like and a delete.
    let filler: Vec<String> =
        std::fs::read_to_string(support::CAPTURE).unwrap().lines().take(40).map(String::from).collect();
    let name = "jetstream/repo.car";
    let (commit, records, _) = read_repo_bytes(&car_bytes(name), &CarLimits::default()).unwrap();
    let newer = backlinks::model::tid::parse_tid(&commit.rev).unwrap() + 1_000;
    let linked =
        records.iter().find(|r| !extract_links(&r.record, &ExtractLimits::default()).links.is_empty()).unwrap();
    let last_time: i64 =
        serde_json::from_str::<serde_json::Value>(filler.last().unwrap()).unwrap()["time_us"].as_i64().unwrap();
    let like_target = "at://did:plc:53iucmf5ldftgqyf2ac7hmhd/app.bsky.feed.post/3l3qo2vutsw2b";
    let commits = [
        serde_json::json!({ "did": commit.did, "time_us": last_time + 1, "kind": "commit", "commit": {
            "rev": backlinks::model::tid::format_tid(newer), "operation": "create", "collection": "app.bsky.feed.like",
            "rkey": backlinks::model::tid::format_tid(newer), "record": {
                "$type": "app.bsky.feed.like", "createdAt": "2026-11-30T00:00:00Z",
                "subject": { "uri": like_target, "cid": "bafyreib2rxk3rh6kzwq" } } } }),
        serde_json::json!({ "did": commit.did, "time_us": last_time + 2, "kind": "commit", "commit": {
            "rev": backlinks::model::tid::format_tid(newer + 1), "operation": "delete",
            "collection": linked.collection, "rkey": linked.rkey } }),
    ];
    let mut live = filler.clone();
    live.extend(commits.iter().map(|c| c.to_string()));
    let pause = Faults { pause_every: Some((filler.len() as u64, Duration::from_secs(4))), ..Faults::default() };
    let jetstream = runtime.block_on(JetstreamServer::start(live.clone(), pause));
    let mut builder = SyncServerBuilder::new();
    for name in CARS {
        builder = builder.repo(car_bytes(name));
    }
    let pds = runtime.block_on(builder.start());

    let dir = scratch.path().join("serve");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jetstream", &jetstream.v1_url(), "--backfill-pds", &pds.url])
        .arg("--data-dir")
        .arg(&dir)
        .env("RUST_LOG", "warn");
    let (mut child, addr) = support::spawn_listening(&mut command);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&addr, "backlinks_backfill_repos_settled") != Some(CARS.len() as f64)
        || jetstream.sent() < live.len() as u64
    {
        assert!(Instant::now() < deadline, "backfill or live ingest never finished");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(child.wait().unwrap().success());

    // The same records and events through the JSON rules, in the same order.
    let mut targets = targets(CARS);
    targets.insert(like_target.to_string());
    let lines = scratch.path().join("all.jsonl");
    std::fs::write(&lines, json_lines(CARS) + &live.join("\n") + "\n").unwrap();
    let json_dir = scratch.path().join("json-all");
    let (ok, _, stderr) = run(&["import", "--data-dir", json_dir.to_str().unwrap(), lines.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let expected = answers(&json_dir, &targets);
    assert!(expected.contains_key(like_target), "the live like is there");
    assert_eq!(answers(&dir, &targets), expected);
}

#[test]
fn a_machine_restored_from_the_bucket_resumes_backfill_from_the_checkpoint() {
    let scratch = tempfile::tempdir().unwrap();
    let bucket = format!("file://{}", scratch.path().join("bucket").display());
    let first = scratch.path().join("first");
    let cars: Vec<String> = CARS.iter().flat_map(|name| ["--car".to_string(), car_path(name)]).collect();
    let backfill = |dir: &Path| {
        let mut args = vec!["backfill", "--store", &bucket, "--data-dir", dir.to_str().unwrap()];
        args.extend(cars.iter().map(String::as_str));
        let (ok, stdout, stderr) = run(&args);
        assert!(ok, "backfill failed: {stderr}");
        summary(&stdout)
    };
    let report = backfill(&first);
    assert_eq!(report["indexed"], CARS.len(), "{report}");
    assert!(report["checkpoint"].as_str().unwrap().starts_with("checkpoints/"), "{report}");

    // A new machine with only the bucket: the index and repos.db come back, nothing is redone.
    let second = scratch.path().join("second");
    let report = backfill(&second);
    assert_eq!(report["indexed"], 0, "every repository was already indexed: {report}");
    assert_eq!(report["repos"]["done"], CARS.len(), "{report}");
    let targets = targets(CARS);
    let bucket = scratch.path().join("bucket");
    let restored = answers_with_bucket(&second, &bucket, &targets);
    assert!(link_count(&restored) > 500);
    assert_eq!(restored, answers_with_bucket(&first, &bucket, &targets));
}
