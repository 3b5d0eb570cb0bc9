//! Backfill throughput: repositories and links per second through the real path (CAR parse and
//! checks, MST walk, DAG-CBOR to JSON, link extraction, the gate, the index), on every whole
//! fixture CAR and on a generated repository of 100,000 records; then what verification itself
//! costs (signatures and CIDs per second, its share of reading a repository) and how the
//! amplification CAR is refused (time, peak memory). One measured run, not criterion: the figures
//! are rates over whole repositories.
//!
//! `cargo bench --bench backfill -- [RECORDS]` (default 100,000; 2,000 and one fixture pass when
//! `cargo test` runs it as a smoke test).

#[path = "../tests/support/car_writer.rs"]
mod car_writer;

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::backfill::gate::{GateLimits, SnapshotGate, SnapshotOutcome};
use backlinks::ingest::backfill::repos::ReposDb;
use backlinks::ingest::repo::{CarLimits, Expect, read_repo_bytes};
use backlinks::store::dir::DirStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car");

fn fixture_cars() -> Vec<Vec<u8>> {
    let mut cars = Vec::new();
    for folder in ["indigo", "jetstream", "repo-stream", "rsky"] {
        for entry in std::fs::read_dir(format!("{FIXTURES}/{folder}")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            // The partial slice is not a whole repository: it is refused (MissingBlock).
            if (name.ends_with(".car") || name.ends_with(".repo")) && name != "repo_slice.car" {
                cars.push(std::fs::read(&path).unwrap());
            }
        }
    }
    cars
}

/// A fresh index and gate in a temporary directory.
fn fresh() -> (tempfile::TempDir, SnapshotGate) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DirStore::new(dir.path().join("bucket")));
    let index = Arc::new(Index::open(dir.path(), store, IndexOptions::default(), 5).unwrap());
    let repos = Arc::new(ReposDb::open(&dir.path().join("repos.db")).unwrap());
    (dir, SnapshotGate::new(index, repos, GateLimits::default()))
}

/// Parses and writes every CAR once; returns (records, links, elapsed).
fn backfill(gate: &SnapshotGate, cars: &[Vec<u8>]) -> (u64, u64, Duration) {
    let started = Instant::now();
    let (mut records, mut links) = (0, 0);
    for car in cars {
        let any = Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };
        let parsed = read_repo_bytes(car, &CarLimits::default(), &any).unwrap();
        let (commit, repo) = (parsed.commit, parsed.records);
        assert!(gate.begin(&commit.did));
        match gate.finish(&commit, &repo).unwrap() {
            SnapshotOutcome::Written { links: written, .. } => links += written,
            other => panic!("unexpected {other:?}"),
        }
        records += repo.len() as u64;
    }
    (records, links, started.elapsed())
}

fn report(label: &str, repos: usize, bytes: usize, (records, links, elapsed): (u64, u64, Duration)) {
    let secs = elapsed.as_secs_f64();
    println!(
        "{label}: {repos} repos, {records} records, {links} links, {:.1} MiB in {:.3} s = {:.1} repos/s, {:.0} records/s, {:.0} links/s",
        bytes as f64 / (1 << 20) as f64,
        secs,
        repos as f64 / secs,
        records as f64 / secs,
        links as f64 / secs,
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this as a quick smoke test.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let default_records = if benchmarking { 100_000 } else { 2_000 };
    let records: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(default_records);
    let rounds = if benchmarking { 20 } else { 1 };

    let cars = fixture_cars();
    let bytes = cars.iter().map(Vec::len).sum::<usize>() * rounds;
    let (_dir, gate) = fresh();
    // Each round is a fresh index: the same revision twice would be skipped as already indexed.
    let mut total = (0, 0, Duration::ZERO);
    for _ in 0..rounds {
        let (_round_dir, round_gate) = fresh();
        let (r, l, e) = backfill(&round_gate, &cars);
        total = (total.0 + r, total.1 + l, total.2 + e);
    }
    report("fixture CARs", cars.len() * rounds, bytes, total);

    let generated = car_writer::generated_repo("did:plc:generatedgeneratedgener", records);
    let measured = backfill(&gate, std::slice::from_ref(&generated));
    assert_eq!(measured.0, records as u64);
    assert_eq!(measured.1, records as u64, "one link per like");
    report(&format!("generated repo of {records} records"), 1, generated.len(), measured);

    verification(&generated, records, measured.2);
    amplification();
}

/// Verification's own costs: signatures and CIDs checked per second, and the share of a whole
/// repository's read that checking takes.
fn verification(generated: &[u8], records: usize, backfill: Duration) {
    use backlinks::identity::keys::PublicKey;
    use k256::ecdsa::signature::Signer;
    let message = b"a commit's unsigned DAG-CBOR, about this long or a little longer than this";
    let k256_key = k256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
    let k256_sig: k256::ecdsa::Signature = k256_key.sign(message);
    let k256_public = PublicKey::K256(*k256_key.verifying_key());
    let p256_key = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
    let p256_sig: p256::ecdsa::Signature = p256_key.sign(message);
    let p256_sig = p256_sig.normalize_s();
    let p256_public = PublicKey::P256(*p256_key.verifying_key());
    for (label, key, sig) in [
        ("secp256k1", &k256_public, k256_sig.to_bytes().to_vec()),
        ("P-256", &p256_public, p256_sig.to_bytes().to_vec()),
    ] {
        let rounds = 2_000;
        let started = Instant::now();
        for _ in 0..rounds {
            key.verify(message, &sig).unwrap();
        }
        println!("signatures, {label}: {:.0} verified/s", rounds as f64 / started.elapsed().as_secs_f64());
    }

    let blocks = car_writer::raw_blocks(generated);
    let bytes: usize = blocks.values().map(Vec::len).sum();
    let started = Instant::now();
    for (cid, block) in &blocks {
        backlinks::ingest::repo::check_block(cid, block).unwrap();
    }
    let hashing = started.elapsed();
    println!(
        "CIDs: {} blocks, {:.1} MiB checked in {:.3} s = {:.0} blocks/s, {:.0} MiB/s",
        blocks.len(),
        bytes as f64 / (1 << 20) as f64,
        hashing.as_secs_f64(),
        blocks.len() as f64 / hashing.as_secs_f64(),
        bytes as f64 / (1 << 20) as f64 / hashing.as_secs_f64()
    );

    let key = car_writer::signing_key(9);
    let signed = car_writer::signed_repo("did:plc:generatedgeneratedgener", "3kznmn7xqxl22", records, Some(&key));
    let public = PublicKey::K256(*key.verifying_key());
    let time = |key: Option<&PublicKey>| {
        let expect = Expect { did: Some("did:plc:generatedgeneratedgener"), key, now_us: i64::MAX / 2, deadline: None };
        let started = Instant::now();
        let repo = read_repo_bytes(&signed, &CarLimits::default(), &expect).unwrap();
        assert_eq!(repo.signed, key.is_some());
        started.elapsed()
    };
    let (verified, unsigned) = (time(Some(&public)), time(None));
    println!(
        "read of a {records}-record repository: {:.3} s with its signature checked, {:.3} s without; hashing its blocks alone takes {:.3} s = {:.1} % of the read, {:.1} % of its whole backfill ({:.3} s)",
        verified.as_secs_f64(),
        unsigned.as_secs_f64(),
        hashing.as_secs_f64(),
        hashing.as_secs_f64() * 100.0 / verified.as_secs_f64(),
        hashing.as_secs_f64() * 100.0 / backfill.as_secs_f64(),
        backfill.as_secs_f64()
    );
}

/// The amplification CAR: one 512 KiB record under 20,000 keys (10 GiB of records referenced by
/// a CAR of about 1 MiB) is refused, in how long and with how much memory.
fn amplification() {
    use ipld_core::ipld::Ipld;
    let big = car_writer::map([
        ("$type", Ipld::String("app.bsky.feed.post".into())),
        ("text", Ipld::String("x".repeat(512 << 10))),
    ]);
    let (record, value) = car_writer::block(big);
    let keys: Vec<(String, ipld_core::cid::Cid)> = {
        let mut keys: Vec<_> = (0..20_000u64)
            .map(|i| (format!("app.bsky.feed.post/{}", backlinks::model::tid::format_tid(i << 10)), record))
            .collect();
        keys.sort();
        keys
    };
    let mut blocks = vec![(record, value)];
    let root = car_writer::build_mst(&keys, &mut blocks);
    let commit =
        car_writer::block(car_writer::commit_block("did:plc:amplificationamplificati", "3kznmn7xqxl22", root, None));
    blocks.insert(0, commit);
    let car = car_writer::encode_car(&[blocks[0].0], &blocks);
    drop(blocks);
    let baseline = ALLOCATED.current();
    ALLOCATED.reset_peak();
    let started = Instant::now();
    let any = Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };
    let error = read_repo_bytes(&car, &CarLimits::default(), &any).unwrap_err();
    let elapsed = started.elapsed();
    let peak = ALLOCATED.peak().saturating_sub(baseline);
    assert!(matches!(error, backlinks::ingest::repo::CarError::TooMuchReferenced { .. }), "{error}");
    println!(
        "amplification CAR ({:.2} MiB, 20,000 keys on one 512 KiB record, 10 GiB referenced): refused in {:.4} s, at most {:.2} MiB allocated while reading ({error})",
        car.len() as f64 / (1 << 20) as f64,
        elapsed.as_secs_f64(),
        peak as f64 / (1 << 20) as f64,
    );
}

/// The system allocator, counting the bytes live now and their peak (for the amplification
/// figure: what reading a hostile CAR makes the process hold).
struct Counting {
    current: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

#[global_allocator]
static ALLOCATED: Counting =
    Counting { current: std::sync::atomic::AtomicUsize::new(0), peak: std::sync::atomic::AtomicUsize::new(0) };

impl Counting {
    fn current(&self) -> usize {
        self.current.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn reset_peak(&self) {
        self.peak.store(self.current(), std::sync::atomic::Ordering::Relaxed);
    }
}

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let now = self.current.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed) + layout.size();
        self.peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the layout is the caller's, passed on unchanged.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        self.current.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}
