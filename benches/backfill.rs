//! Backfill throughput: repositories and links per second through the real path (CAR parse, MST
//! walk, DAG-CBOR to JSON, link extraction, the gate, the index), on every fixture CAR and on a
//! generated repository of 100,000 records. One measured run, not criterion: the figures are
//! rates over whole repositories.
//!
//! `cargo bench --bench backfill -- [RECORDS]` (default 100,000; 2,000 and one fixture pass when
//! `cargo test` runs it as a smoke test).

#[path = "../tests/support/car_writer.rs"]
mod car_writer;

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::backfill::gate::{GateLimits, SnapshotGate, SnapshotOutcome};
use backlinks::ingest::backfill::repos::ReposDb;
use backlinks::ingest::car::{CarLimits, read_repo_bytes};
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
            if name.ends_with(".car") || name.ends_with(".repo") {
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
        let (commit, repo, _) = read_repo_bytes(car, &CarLimits::default()).unwrap();
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
}
