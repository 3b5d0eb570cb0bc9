//! Verified backfill against hostile hosts, through the real binary: an honest world (test
//! identities in a PLC directory, their repositories on an honest PDS) is backfilled, then one
//! attack at a time is aimed at it. Each attack is refused or contained; the index answers exactly
//! as before it (no link lost, none forged), and repos.db and the summary say what was rejected
//! and why.

mod support;

use backlinks::ingest::backfill::repos::{RepoRow, RepoStatus, ReposDb};
use ipld_core::ipld::Ipld;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::car_writer::{block, build_mst, commit_block, encode_car, map, records_of, repo_blocks, signing_key};
use support::pds_server::{AcceptCounter, Fault, SyncServer, SyncServerBuilder};
use support::world::*;
use support::{BIN, spawn_listening};

/// The repositories of the honest world.
const HONEST: &[&str] = &["jetstream/repo.car", "repo-stream/tiny.car", "rsky/valid_repo.car", "repo-stream/empty.car"];

/// The honest world, backfilled.
struct Honest {
    _runtime: tokio::runtime::Runtime,
    _scratch: tempfile::TempDir,
    world: World,
    pds: SyncServer,
    dir: PathBuf,
    targets: std::collections::BTreeSet<String>,
    baseline: Answers,
}

impl Honest {
    fn new() -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let world = World::new(HONEST);
        let mut builder = SyncServerBuilder::new();
        for car in &world.cars {
            builder = builder.repo(car.clone());
        }
        let pds = runtime.block_on(builder.start());
        let directory = runtime.block_on(world.directory(|_| pds.url.clone()));
        let dir = scratch.path().join("index");
        let targets = targets(&world.cars);
        let expected = json_rule_answers(&world.cars, scratch.path(), &targets);
        let report = backfill(&dir, &directory.url, &["--pds", &pds.url], &[]);
        assert_eq!(report["verified"], HONEST.len(), "{report}");
        let baseline = answers(&dir, &targets);
        assert_eq!(baseline, expected, "the honest backfill gives the JSON rules' answers");
        Honest { _runtime: runtime, _scratch: scratch, world, pds, dir, targets, baseline }
    }

    fn start(&self, builder: SyncServerBuilder) -> SyncServer {
        self._runtime.block_on(builder.start())
    }

    /// A directory where identity 0 (the victim) lives on `pds` and the others on the honest PDS.
    fn directory_placing_victim_on(&self, pds: &str) -> SyncServer {
        self.directory_placing(0, pds)
    }

    /// A directory where identity `moved` lives on `pds` and the others on the honest PDS.
    fn directory_placing(&self, moved: usize, pds: &str) -> SyncServer {
        let honest = self.pds.url.clone();
        let pds = pds.to_string();
        self._runtime.block_on(self.world.directory(|i| if i == moved { pds.clone() } else { honest.clone() }))
    }

    fn victim(&self) -> &str {
        &self.world.identities[0].did
    }

    /// The victim's records, as its honest repository holds them.
    fn victim_records(&self) -> Vec<(String, Ipld)> {
        records_of(&self.world.cars[0])
    }

    fn row(&self, did: &str) -> RepoRow {
        ReposDb::open(&self.dir.join("repos.db")).unwrap().get(did).unwrap().expect("a row")
    }

    /// The index answers exactly as it did before the attack.
    fn assert_unchanged(&self) {
        assert_eq!(answers(&self.dir, &self.targets), self.baseline, "the attack changed the index");
    }

    /// The victim is recorded rejected for `reason`, in repos.db and the summary.
    fn assert_rejected(&self, report: &serde_json::Value, reason: &str, words: &str) {
        assert_eq!(report["rejected"][reason], 1, "{report}");
        let row = self.row(self.victim());
        assert_eq!(row.status, RepoStatus::Rejected, "{row:?}");
        assert!(row.last_error.as_deref().unwrap_or_default().contains(words), "{row:?}");
        assert!(report["rejectedRepos"].to_string().contains(self.victim()), "{report}");
        self.assert_unchanged();
    }
}

/// Runs `backfill` on `dir` with a PLC directory and loopback allowed (tests live there), plus
/// `args` and `env`; returns its summary.
fn backfill(dir: &Path, directory: &str, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let mut command = Command::new(BIN);
    command.args(["backfill", "--plc-url", directory, "--allow-private", "127.0.0.1", "--data-dir"]).arg(dir);
    command.args(args).env_remove("NOTIFY_SOCKET").env("BACKLINKS_BACKFILL_MAX_ATTEMPTS", "2");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "backfill failed: {}", String::from_utf8_lossy(&out.stderr));
    summary(&String::from_utf8_lossy(&out.stdout))
}

/// A like of `target`: a link the index must never hold if it comes from a forgery.
fn forged_like(target: &str) -> (String, Ipld) {
    let record = map([
        ("$type", Ipld::String("app.bsky.feed.like".into())),
        ("createdAt", Ipld::String("2024-06-01T00:00:00.000Z".into())),
        (
            "subject",
            map([
                ("uri", Ipld::String(target.into())),
                ("cid", Ipld::String("bafyreib2rxk3rh6kzwqqlrwyodnwulkyt3wctg6dqdjgeqfqfxfgbl4l7y".into())),
            ]),
        ),
    ]);
    ("app.bsky.feed.like/3kznmn7xqxl2z".into(), record)
}

const FORGED_TARGET: &str = "at://did:plc:forgedtargetforgedtarget/app.bsky.feed.post/3kznmn7xqxl22";

/// A newer revision than the honest one (so only verification stands in the way).
const NEWER_REV: &str = "3kznmn7xqxl33";

/// The victim's repository at `rev` with a forged like added, signed by `key`.
fn victim_repo_with_like(
    honest: &Honest,
    rev: &str,
    key: &k256::ecdsa::SigningKey,
) -> Vec<(ipld_core::cid::Cid, Ipld)> {
    let mut records = honest.victim_records();
    records.push(forged_like(FORGED_TARGET));
    repo_blocks(&records, honest.victim(), rev, Some(key)).1
}

fn car_of(blocks: Vec<(ipld_core::cid::Cid, Ipld)>) -> Vec<u8> {
    encode_car(&[blocks[0].0], &blocks)
}

/// Serves `car` as the victim's repository from a PDS of its own, which the directory names.
fn victim_served(honest: &Honest, car: Vec<u8>) -> (SyncServer, SyncServer) {
    let pds = honest.start(SyncServerBuilder::new().repo_as(honest.victim(), NEWER_REV, car));
    let directory = honest.directory_placing_victim_on(&pds.url);
    (pds, directory)
}

#[test]
fn a_commit_signed_by_another_key_is_rejected() {
    let honest = Honest::new();
    let car = car_of(victim_repo_with_like(&honest, NEWER_REV, &signing_key(200)));
    let (_pds, directory) = victim_served(&honest, car);
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    honest.assert_rejected(&report, "bad_signature", "signature");
    assert!(!answers(&honest.dir, &[FORGED_TARGET.to_string()].into()).contains_key(FORGED_TARGET));
}

#[test]
fn a_record_block_that_does_not_match_its_cid_is_rejected() {
    let honest = Honest::new();
    let key = &honest.world.identities[0].key;
    let mut blocks = victim_repo_with_like(&honest, NEWER_REV, key);
    // Swap the bytes of the forged like's block for another record, keeping its CID.
    let forged_cid = support::car_writer::cid_of(&forged_like(FORGED_TARGET).1);
    let slot = blocks.iter().position(|(cid, _)| *cid == forged_cid).unwrap();
    blocks[slot].1 = forged_like("at://did:plc:someoneelsesomeoneelseso/app.bsky.feed.post/3kznmn7xqxl22").1;
    let (_pds, directory) = victim_served(&honest, car_of(blocks));
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    honest.assert_rejected(&report, "bad_cid", "hash");
}

#[test]
fn a_record_not_reachable_from_the_signed_root_is_never_indexed() {
    let honest = Honest::new();
    let key = &honest.world.identities[0].key;
    // An honest repository at a newer revision, with a forged like riding along outside the tree.
    let (_, mut blocks) = repo_blocks(&honest.victim_records(), honest.victim(), NEWER_REV, Some(key));
    blocks.push(block(forged_like(FORGED_TARGET).1));
    let (_pds, directory) = victim_served(&honest, car_of(blocks));
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    assert_eq!(report["indexed"], 1, "the signed repository itself is good: {report}");
    assert_eq!(honest.row(honest.victim()).status, RepoStatus::Done);
    honest.assert_unchanged();
    assert!(!answers(&honest.dir, &[FORGED_TARGET.to_string()].into()).contains_key(FORGED_TARGET));
}

#[test]
fn a_rev_far_in_the_future_is_rejected() {
    let honest = Honest::new();
    let future_us = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64)
        + 365 * 86_400 * 1_000_000;
    let rev = backlinks::model::tid::format_tid(future_us << 10);
    let key = &honest.world.identities[0].key;
    let car = car_of(victim_repo_with_like(&honest, &rev, key));
    let (_pds, directory) = victim_served(&honest, car);
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    honest.assert_rejected(&report, "rev_in_future", "future");
}

#[test]
fn a_did_listed_by_a_host_that_is_not_its_pds_is_fetched_from_its_own_pds() {
    let honest = Honest::new();
    // A host lists the victim and would serve a forgery for it; the directory says otherwise.
    let forged = car_of(victim_repo_with_like(&honest, NEWER_REV, &signing_key(201)));
    let impostor = honest.start(SyncServerBuilder::new().repo_as(honest.victim(), NEWER_REV, forged));
    let directory = honest.directory_placing_victim_on(&honest.pds.url);
    let served_before = honest.pds.counters.get_repo_calls.load(Ordering::Relaxed);
    let report = backfill(&honest.dir, &directory.url, &["--pds", &impostor.url], &[]);
    assert_eq!(impostor.counters.get_repo_calls.load(Ordering::Relaxed), 0, "the impostor was never asked: {report}");
    assert!(honest.pds.counters.get_repo_calls.load(Ordering::Relaxed) > served_before, "its own PDS was");
    assert_eq!(honest.row(honest.victim()).status, RepoStatus::Done);
    honest.assert_unchanged();
}

#[test]
fn an_identity_moved_by_a_forged_plc_operation_is_rejected() {
    let honest = Honest::new();
    let forged = car_of(victim_repo_with_like(&honest, NEWER_REV, &signing_key(202)));
    let thief = honest.start(SyncServerBuilder::new().repo_as(honest.victim(), NEWER_REV, forged));
    // The victim's log with an update to the thief's PDS signed by a key that may not sign it.
    let log = honest.world.identities[0].audit_log_signed_by(&thief.url, &signing_key(203));
    let directory = honest.start(SyncServerBuilder::new().plc_log(honest.victim(), log));
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    honest.assert_rejected(&report, "identity", "no allowed rotation key signed it");
    assert_eq!(thief.counters.get_repo_calls.load(Ordering::Relaxed), 0);
}

#[test]
fn the_amplification_car_is_rejected_in_bounded_time() {
    let honest = Honest::new();
    let key = &honest.world.identities[0].key;
    // One 512 KiB record under 20,000 keys: ten gigabytes of records from a 1 MB CAR.
    let big =
        map([("$type", Ipld::String("app.bsky.feed.post".into())), ("text", Ipld::String("x".repeat(512 << 10)))]);
    let (record, value) = block(big);
    let mut keys: Vec<(String, ipld_core::cid::Cid)> = (0..20_000u64)
        .map(|i| (format!("app.bsky.feed.post/{}", backlinks::model::tid::format_tid(i << 10)), record))
        .collect();
    keys.sort();
    let mut blocks = vec![(record, value)];
    let root = build_mst(&keys, &mut blocks);
    let commit = block(commit_block(honest.victim(), NEWER_REV, root, Some(key)));
    blocks.insert(0, commit);
    let (_pds, directory) = victim_served(&honest, car_of(blocks));
    let started = Instant::now();
    let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &[]);
    honest.assert_rejected(&report, "too_large", "references more than");
    eprintln!("amplification CAR rejected in {:?}", started.elapsed());
}

#[test]
fn an_endless_error_body_and_a_byte_a_second_body_cost_bounded_time() {
    let honest = Honest::new();
    for (fault, words) in [(Fault::EndlessErrorBody, "HTTP 500"), (Fault::Trickle, "too slow")] {
        let car = car_of(victim_repo_with_like(&honest, NEWER_REV, &honest.world.identities[0].key));
        let pds = honest.start(
            SyncServerBuilder::new()
                .repo_as(honest.victim(), NEWER_REV, car)
                .faults(std::sync::Arc::new(move |_, _| Some(fault))),
        );
        let directory = honest.directory_placing_victim_on(&pds.url);
        let started = Instant::now();
        let env = [("BACKLINKS_BACKFILL_MAX_ATTEMPTS", "1")];
        let report = backfill(&honest.dir, &directory.url, &["--repo", honest.victim()], &env);
        assert!(started.elapsed() < Duration::from_secs(60), "{fault:?} held the backfill {:?}", started.elapsed());
        let row = honest.row(honest.victim());
        assert_eq!(row.status, RepoStatus::Failed, "{fault:?}: {row:?} {report}");
        assert!(row.last_error.as_deref().unwrap_or_default().contains(words), "{fault:?}: {row:?}");
        honest.assert_unchanged();
    }
}

#[test]
fn a_listing_that_never_ends_is_cut_off_and_does_not_stall_other_hosts() {
    let honest = Honest::new();
    let endless = honest.start(SyncServerBuilder::new().endless_listing());
    let directory = honest.directory_placing_victim_on(&honest.pds.url);
    let env = [("BACKLINKS_BACKFILL_MAX_PAGES_PER_HOST", "5")];
    let report = backfill(&honest.dir, &directory.url, &["--pds", &endless.url, "--pds", &honest.pds.url], &env);
    assert_eq!(report["listingsCapped"], 1, "{report}");
    assert!(endless.counters.listings.load(Ordering::Relaxed) <= 5, "{report}");
    // The endless host's made-up DIDs resolve to nothing; the honest host's are all settled.
    assert_eq!(report["repos"]["not_found"], 15, "{report}");
    assert_eq!(report["repos"]["done"], HONEST.len(), "{report}");
    honest.assert_unchanged();
}

#[test]
fn did_documents_pointing_at_internal_addresses_are_refused_without_a_connection() {
    let honest = Honest::new();
    let victim_server = honest._runtime.block_on(AcceptCounter::start());
    let port = victim_server.address.port();
    let endpoints = [
        format!("https://127.0.0.1:{port}"),
        format!("https://localhost:{port}"),
        "https://169.254.169.254".to_string(),
        format!("https://[::ffff:127.0.0.1]:{port}"),
    ];
    // Each endpoint moves another identity, so each is a first attempt.
    for (moved, endpoint) in endpoints.iter().enumerate() {
        let directory = honest.directory_placing(moved, endpoint);
        // Loopback is allowed for the directory's own port only, as an operator would list it.
        let allowed = directory.url.trim_start_matches("http://").to_string();
        let did = &honest.world.identities[moved].did;
        let mut command = Command::new(BIN);
        command.args(["backfill", "--plc-url", &directory.url, "--allow-private", &allowed, "--data-dir"]);
        command.arg(&honest.dir).args(["--repo", did]).env_remove("NOTIFY_SOCKET");
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report = summary(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(report["rejected"]["forbidden_address"], 1, "{endpoint}: {report}");
        let row = honest.row(did);
        assert_eq!(row.status, RepoStatus::Rejected, "{endpoint}: {row:?}");
        assert!(row.last_error.as_deref().unwrap_or_default().contains("refused"), "{endpoint}: {row:?}");
    }
    assert_eq!(victim_server.accepted.load(Ordering::Relaxed), 0, "nothing connected to the internal address");
    honest.assert_unchanged();
}

/// Reads `/metrics` from a running `serve`.
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_reports_rejections_in_its_metrics() {
    let honest = Honest::new();
    let car = car_of(victim_repo_with_like(&honest, NEWER_REV, &signing_key(204)));
    let (_pds, directory) = victim_served(&honest, car);
    // Backfill runs beside live ingest: a stream with a few real events.
    let events: Vec<String> =
        std::fs::read_to_string(support::CAPTURE).unwrap().lines().take(5).map(String::from).collect();
    let jetstream =
        honest._runtime.block_on(support::jetstream_server::JetstreamServer::start(events, Default::default()));
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jetstream", &jetstream.v1_url()])
        .args(["--backfill-repo", honest.victim(), "--data-dir"])
        .arg(&honest.dir)
        .env("BACKLINKS_PLC_URL", &directory.url)
        .env("BACKLINKS_BACKFILL_ALLOW_PRIVATE", "127.0.0.1")
        .env("RUST_LOG", "warn");
    let (mut child, addr) = spawn_listening(&mut command);
    let series = "backlinks_backfill_repos_rejected_total{reason=\"bad_signature\"} 1";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !metrics(&addr).contains(series) {
        assert!(Instant::now() < deadline, "no rejection in the metrics:\n{}", metrics(&addr));
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let row = honest.row(honest.victim());
    assert_eq!(row.status, RepoStatus::Rejected, "{row:?}");
}
