//! Backfill, end to end: every fixture CAR indexes exactly the links the JSON rules give for the
//! same records (offline, structure checked; with its DID document, signature verified); a relay
//! backfill of the same records re-signed under test identities, through a test relay, PLC
//! directory and PDSes that inject 429s, 500s, cut bodies and dropped connections, killed in the
//! middle and resumed, ends identical to an uninterrupted one; `--repo` is fetched from the PDS
//! its DID document names.

mod support;

use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::ingest::backfill::repos::{RepoStatus, ReposDb};
use backlinks::ingest::repo::Repo;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::pds_server::{SyncServer, SyncServerBuilder, mixed_faults, no_faults};
use support::world::*;
use support::{BIN, run};

/// A PLC directory nobody can reach (public-only addresses refuse loopback): CAR files are
/// checked offline, structure only, whatever the machine's network.
const NO_DIRECTORY: &str = "http://127.0.0.1:9";

fn fixture_cars() -> Vec<Vec<u8>> {
    CARS.iter().map(|name| car_bytes(name)).collect()
}

#[test]
fn every_fixture_car_indexes_the_links_the_json_rules_give() {
    let scratch = tempfile::tempdir().unwrap();
    let cars = fixture_cars();
    let targets = targets(&cars);
    let expected = json_rule_answers(&cars, scratch.path(), &targets);
    assert!(link_count(&expected) > 500, "the fixtures hold hundreds of links, got {}", link_count(&expected));

    let dir = scratch.path().join("cars");
    let mut args = vec!["backfill".to_string(), "--plc-url".into(), NO_DIRECTORY.into()];
    args.extend(["--data-dir".to_string(), dir.to_str().unwrap().into()]);
    for name in CARS {
        args.extend(["--car".to_string(), car_path(name)]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "backfill failed: {stderr}");
    let first = summary(&stdout);
    assert_eq!(first["indexed"], CARS.len(), "{first}");
    assert_eq!(first["repos"]["done"], CARS.len(), "{first}");
    assert_eq!(first["structurallyChecked"], CARS.len(), "no document at hand: {first}");
    assert_eq!(first["verified"], 0, "{first}");
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

#[test]
fn a_car_file_with_its_did_document_is_verified_and_a_bad_signature_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let backfill = |name: &str, document: &str, dir: &str| {
        let dir = scratch.path().join(dir);
        run(&[
            "backfill",
            "--plc-url",
            NO_DIRECTORY,
            "--data-dir",
            dir.to_str().unwrap(),
            "--car",
            &car_path(name),
            "--did-doc",
            &car_path(document),
        ])
    };
    let (ok, stdout, stderr) = backfill("indigo/paul_staging.repo.car", "indigo/paul_staging.didDoc.json", "paul");
    assert!(ok, "backfill failed: {stderr}");
    let report = summary(&stdout);
    assert_eq!((report["verified"].as_u64(), report["structurallyChecked"].as_u64()), (Some(1), Some(0)), "{report}");

    // fakermaker's P-256 signature is high-S: the document's key refuses it, nothing is indexed.
    let (ok, stdout, stderr) = backfill("indigo/fakermaker.repo.car", "indigo/fakermaker.didDoc.json", "faker");
    assert!(!ok, "a high-S signature was accepted: {stdout}");
    assert!(stderr.contains("signature"), "{stderr}");
}

/// Two PDSes holding the re-signed fixtures between them, a PLC directory placing each identity
/// on its PDS, and a relay listing both, all on loopback.
async fn network(world: &World, faults: bool, delay: Duration) -> (SyncServer, SyncServer, Vec<SyncServer>) {
    let mut pdses = Vec::new();
    for part in 0..2 {
        let mut builder = SyncServerBuilder::new().delay(delay).fail_first_listing();
        builder = builder.faults(if faults { mixed_faults(7 + part as u64) } else { no_faults() });
        for car in world.cars.iter().skip(part).step_by(2) {
            builder = builder.repo(car.clone());
        }
        pdses.push(builder.start().await);
    }
    let urls: Vec<String> = pdses.iter().map(|p| p.url.clone()).collect();
    let directory = world.directory(|i| urls[i % 2].clone()).await;
    let hosts = urls.iter().map(|url| url.trim_start_matches("http://").to_string()).collect();
    let relay = SyncServerBuilder::new().hosts(hosts).start().await;
    (relay, directory, pdses)
}

fn backfill_command(relay: &str, directory: &str, dir: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["backfill", "--relay", relay, "--concurrency", "3", "--per-host-per-second", "50"])
        .args(["--plc-url", directory, "--allow-private", "127.0.0.1", "--data-dir"])
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
    let world = World::new(CARS);
    let targets = targets(&world.cars);
    let expected = json_rule_answers(&world.cars, scratch.path(), &targets);
    let count = world.cars.len();

    // Uninterrupted, through every fault kind.
    let (relay, directory, pdses) = runtime.block_on(network(&world, true, Duration::ZERO));
    let whole = scratch.path().join("whole");
    let report = run_to_end(backfill_command(&relay.url, &directory.url, &whole));
    assert_eq!(report["indexed"], count, "{report}");
    assert_eq!(report["verified"], count, "every snapshot's signature was checked: {report}");
    assert!(report["retries"].as_u64().unwrap() >= 4, "faults were retried: {report}");
    assert!(report["rateLimited"].as_u64().unwrap() >= 1, "a 429 was seen: {report}");
    let faults: u64 = pdses.iter().map(|p| p.counters.faults.load(Ordering::Relaxed)).sum();
    assert!(faults >= 6, "the plan injected faults: {faults}");
    let waited = pdses.iter().map(|p| p.counters.min_wait_after_429_ms.load(Ordering::Relaxed)).min().unwrap();
    assert!((1_000..u64::MAX).contains(&waited), "Retry-After: 1 was honoured: {waited} ms");
    assert_eq!(answers(&whole, &targets), expected, "uninterrupted backfill differs from the JSON rules");

    // Killed after a few repositories, then resumed.
    let (relay, directory, pdses) = runtime.block_on(network(&world, true, Duration::from_millis(250)));
    let resumed = scratch.path().join("resumed");
    let mut child = backfill_command(&relay.url, &directory.url, &resumed)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
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
    assert!(done < count as u64, "killed mid-way, yet every repository was done: {counts:?}");
    let report = run_to_end(backfill_command(&relay.url, &directory.url, &resumed));
    assert_eq!(report["repos"]["done"], count, "{report}");
    assert_eq!(answers(&resumed, &targets), expected, "resumed backfill differs from the uninterrupted one");
}

#[test]
fn one_repo_is_fetched_from_the_pds_its_did_document_names() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let world = World::new(&["jetstream/repo.car"]);
    let pds = runtime.block_on(SyncServerBuilder::new().repo(world.cars[0].clone()).start());
    let directory = runtime.block_on(world.directory(|_| pds.url.clone()));
    let dir = scratch.path().join("one");
    let (ok, stdout, stderr) = run(&[
        "backfill",
        "--data-dir",
        dir.to_str().unwrap(),
        "--plc-url",
        &directory.url,
        "--allow-private",
        "127.0.0.1",
        "--repo",
        &world.identities[0].did,
        "--repo",
        "did:plc:nobodyknowsthisoneyet",
    ]);
    assert!(ok, "backfill failed: {stderr}");
    let report = summary(&stdout);
    assert_eq!(report["indexed"], 1, "{report}");
    assert_eq!(report["verified"], 1, "{report}");
    assert_eq!(report["repos"]["not_found"], 1, "the unknown DID is recorded as not found: {report}");
    let targets = targets(&world.cars);
    let expected = json_rule_answers(&world.cars, scratch.path(), &targets);
    assert!(!expected.is_empty());
    assert_eq!(answers(&dir, &targets), expected);
}

#[test]
fn identities_come_from_the_local_copy_of_the_plc_directory_when_it_is_kept() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let world = World::new(&CARS[..4]);
    let mut builder = SyncServerBuilder::new();
    for car in &world.cars {
        builder = builder.repo(car.clone());
    }
    let pds = runtime.block_on(builder.start());
    // The directory answers no per-DID log: every identity must come from the export.
    let directory = runtime.block_on(world.export_only_directory(|_| pds.url.clone()));
    let dir = scratch.path().join("synced");
    let mut command = Command::new(BIN);
    command.args(["backfill", "--pds", &pds.url, "--plc-url", &directory.url, "--allow-private", "127.0.0.1"]);
    command.arg("--data-dir").arg(&dir).env("BACKLINKS_PLC_SYNC", "true").env_remove("NOTIFY_SOCKET");
    let report = run_to_end(command);
    assert_eq!(report["verified"], world.cars.len(), "{report}");
    let operations = 2 * world.identities.len(); // a genesis and a move each
    assert_eq!(report["plcDirectory"]["dids"], world.identities.len(), "{report}");
    assert_eq!(report["plcDirectory"]["exportPosition"], operations, "{report}");
    let targets = targets(&world.cars);
    assert_eq!(answers(&dir, &targets), json_rule_answers(&world.cars, scratch.path(), &targets));
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
    let world = World::new(CARS);
    let Repo { commit, records, .. } = read_car(&world.cars[0]);
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
    for car in &world.cars {
        builder = builder.repo(car.clone());
    }
    let pds = runtime.block_on(builder.start());
    let directory = runtime.block_on(world.directory(|_| pds.url.clone()));

    let dir = scratch.path().join("serve");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jetstream", &jetstream.v1_url(), "--backfill-pds", &pds.url])
        .arg("--data-dir")
        .arg(&dir)
        .env("BACKLINKS_PLC_URL", &directory.url)
        .env("BACKLINKS_BACKFILL_ALLOW_PRIVATE", "127.0.0.1")
        .env("RUST_LOG", "warn");
    let (mut child, addr) = support::spawn_listening(&mut command);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&addr, "backlinks_backfill_repos_settled") != Some(world.cars.len() as f64)
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
    let mut targets = targets(&world.cars);
    targets.insert(like_target.to_string());
    let lines = scratch.path().join("all.jsonl");
    std::fs::write(&lines, json_lines(&world.cars) + &live.join("\n") + "\n").unwrap();
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
        let mut args =
            vec!["backfill", "--plc-url", NO_DIRECTORY, "--store", &bucket, "--data-dir", dir.to_str().unwrap()];
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
    let targets = targets(&fixture_cars());
    let bucket = scratch.path().join("bucket");
    let restored = answers_with_bucket(&second, &bucket, &targets);
    assert!(link_count(&restored) > 500);
    assert_eq!(restored, answers_with_bucket(&first, &bucket, &targets));
}
