//! Cold listBacklinks: a new machine restored from the bucket (metas and outlines only), every
//! object-store request delayed by a fixed round trip, no decoded-frame cache; one query at a
//! time, each counted in serial rounds of requests (`store::faulty::serial_rounds`).
//!
//! Invariants:
//! - The data directory it reads from is not modified: the reader is a new directory next to it
//!   (removed at the end), and the bucket is only read.
//! - Every query is measured alone (the request log is cleared before it), so its rounds are its
//!   own.

use backlinks::index::{Index, IndexOptions};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::faulty::{Fault, FaultRule, FaultyStore, Operation, serial_rounds};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest injected round trip accepted.
const MAX_RTT_MS: u64 = 1_000;

pub fn run(data_dir: &Path, targets: &[String], rtt_ms: u64, queries: usize) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!((1..=MAX_RTT_MS).contains(&rtt_ms), "--rtt-ms must be 1..={MAX_RTT_MS}");
    let rtt = Duration::from_millis(rtt_ms);
    let latency =
        FaultRule::new(Fault::Latency { min: rtt, max: rtt }).operations(&[Operation::Get, Operation::GetRange]);
    let store = Arc::new(FaultyStore::new(DirStore::new(data_dir.join("bucket")), 1, vec![latency]));
    let reader_dir =
        tempfile::Builder::new().prefix("cold-reader-").tempdir_in(data_dir.parent().unwrap_or(data_dir))?;
    // No frame cache and no local data: every page reads the bucket.
    let options = IndexOptions { frame_cache_bytes: 0, cache_bytes: 0, ..IndexOptions::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let reader = Index::open(reader_dir.path(), store.clone(), options, 7)?;
        let restore_started = Instant::now();
        anyhow::ensure!(reader.restore_if_empty(1).await?, "the bucket has no manifest");
        let restore_seconds = restore_started.elapsed().as_secs_f64();
        let mut samples = Vec::new();
        for target in targets.iter().take(queries) {
            store.clear_log();
            let started = Instant::now();
            let page = list_backlinks(&reader, &ListParams::new(target.as_str())).await?;
            let elapsed = started.elapsed();
            let log = store.log();
            samples.push((elapsed, serial_rounds(&log), log.len(), page.items.len()));
        }
        Ok(summarize(rtt, restore_seconds, samples))
    })
}

fn summarize(
    rtt: Duration,
    restore_seconds: f64,
    mut samples: Vec<(Duration, usize, usize, usize)>,
) -> serde_json::Value {
    let mut rounds_histogram = [0usize; 5];
    for (_, rounds, _, _) in &samples {
        rounds_histogram[(*rounds).min(4)] += 1;
    }
    let requests: usize = samples.iter().map(|s| s.2).sum();
    let links: usize = samples.iter().map(|s| s.3).sum();
    let max_rounds = samples.iter().map(|s| s.1).max().unwrap_or(0);
    samples.sort_by_key(|s| s.0);
    let quantile =
        |q: f64| samples.get(((samples.len().max(1) - 1) as f64 * q) as usize).map_or(0.0, |s| s.0.as_secs_f64() * 1e3);
    let n = samples.len().max(1) as f64;
    serde_json::json!({
        "rtt_ms": rtt.as_secs_f64() * 1e3, "queries": samples.len(), "restore_seconds": restore_seconds,
        "p50_ms": quantile(0.5), "p99_ms": quantile(0.99), "max_ms": quantile(1.0),
        "p50_over_rtt": quantile(0.5) / (rtt.as_secs_f64() * 1e3),
        "max_serial_rounds": max_rounds, "rounds_histogram_0_1_2_3_4plus": rounds_histogram,
        "mean_requests_per_query": requests as f64 / n, "mean_links_per_page": links as f64 / n,
    })
}
