//! Count latency (issue 23): countBacklinks of targets with 10, 10 k and 1 M live backlinks, warm,
//! one request at a time, p50 / p99 / max over `REQUESTS` requests each; then the same targets'
//! distinct accounts (what `/links/count/distinct-dids` reads) and a count filtered by 10
//! accounts (`did`), and the pages of their linking DIDs (getBacklinkDids, 100 a page, walked
//! from the first page to the last: each account must come once). Every 20th record is
//! deleted again, so the counts are of live links among dead ones. Run twice: with the default
//! `hot_target_entries` (the 1 M target is hot, counted from its tallies) and with promotion off
//! (it is estimated from a sample, as before tallies), to show what tallies change.
//!
//! Run: `cargo bench --bench count`.

use backlinks::constellation::get_backlink_dids;
use backlinks::count::{Count, CountOptions, count_backlinks, count_backlinks_named};
use backlinks::index::{Index, IndexOptions};
use backlinks::model::operation::{Operation, RecordOp, RecordRef};
use backlinks::model::tid::format_tid;
use backlinks::query::{Cursor, ListParams};
use backlinks::store::dir::DirStore;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const REQUESTS: usize = 2_000;
const SIZES: [usize; 3] = [10, 10_000, 1_000_000];
const ACCOUNTS: usize = 20_000;

fn target(size: usize) -> String {
    format!(
        "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/{}",
        format_tid(1_600_000_000_000_000 + size as u64)
    )
}

fn like(size: usize, n: usize) -> RecordRef<'static> {
    let account = n % ACCOUNTS;
    let did = format!("did:plc:{:0>24}", format!("{account:x}"));
    let rkey = format_tid(1_700_000_000_000_000 + (size * 3 + n) as u64);
    RecordRef { did: did.into(), collection: "app.bsky.feed.like".into(), rkey: rkey.into() }
}

fn build(dir: &std::path::Path, hot_target_entries: u64, runtime: &tokio::runtime::Runtime) -> Index {
    let store = Arc::new(DirStore::new(dir.join("bucket")));
    let options = IndexOptions { hot_target_entries, ..IndexOptions::default() };
    let index = Index::open(&dir.join("data"), store, options, 1).unwrap();
    let mut now_ms = 0;
    for size in SIZES {
        let subject = serde_json::json!({"subject": {"uri": target(size), "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}});
        // A twentieth more records than the size, of which every 20th is deleted again.
        let records = size + size / 19;
        for n in 0..records {
            let create = RecordOp { record_ref: like(size, n), record: subject.clone() };
            index.apply(&Operation::Create(create), None).unwrap();
            if n % 20 == 19 {
                index.apply(&Operation::Delete(like(size, n)), None).unwrap();
            }
            if index.wants_flush() {
                index.flush().unwrap();
                now_ms += 1;
                while index.compact_once(runtime.handle(), &|| now_ms).unwrap() {}
            }
        }
    }
    index.flush().unwrap();
    while index.compact_once(runtime.handle(), &|| now_ms + 1).unwrap() {}
    while index.settle_once(runtime.handle(), &|| now_ms + 2).unwrap() {}
    index
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// The accounts of the `did` filter measured: spread over all of them.
fn some_dids() -> Vec<String> {
    (0..10).map(|i| like(0, i * ACCOUNTS / 10).did.to_string()).collect()
}

fn measure(index: &Index, runtime: &tokio::runtime::Runtime, label: &str) {
    for size in SIZES {
        let params = ListParams::new(target(size));
        let records = || runtime.block_on(count_backlinks(index, &params, CountOptions::default())).unwrap();
        // Warm: a first count asks for a promotion, which the next flush makes.
        records();
        index.flush().unwrap();
        let name = |location: &str| Some(location.to_string());
        let accounts =
            || runtime.block_on(count_backlinks_named(index, &params, CountOptions::default(), &name)).unwrap();
        let by_dids = ListParams { dids: some_dids(), ..params.clone() };
        let of_dids = || runtime.block_on(count_backlinks(index, &by_dids, CountOptions::default())).unwrap();
        measure_one(&records, label, size, "records");
        measure_one(&accounts, label, size, "accounts");
        measure_one(&of_dids, label, size, "10 dids");
        measure_did_pages(index, runtime, (label, size), &params);
    }
}

/// Walks every page of the target's linking DIDs (100 a page) until `REQUESTS` pages are timed;
/// each walk must give every account once.
fn measure_did_pages(
    index: &Index,
    runtime: &tokio::runtime::Runtime,
    (label, size): (&str, usize),
    params: &ListParams,
) {
    let mut times = Vec::new();
    let (mut accounts, mut approximate) = (0, false);
    while times.len() < REQUESTS {
        let (mut seen, mut cursor) = (HashSet::new(), None);
        loop {
            let page_params = ListParams { limit: 100, cursor, ..params.clone() };
            let started = Instant::now();
            let page = runtime.block_on(get_backlink_dids(index, &page_params, CountOptions::default())).unwrap();
            times.push(started.elapsed());
            approximate |= page.get("approximate").is_some();
            for did in page["linking_dids"].as_array().unwrap() {
                assert!(seen.insert(did.as_str().unwrap().to_string()) || approximate, "{did} twice");
            }
            match page["cursor"].as_str() {
                Some(next) => cursor = Some(Cursor::decode(next).unwrap()),
                None => break,
            }
        }
        accounts = seen.len();
    }
    let flag = if approximate { "repeats " } else { "once    " };
    print_row((label, size, "DID pages"), (accounts as u64, flag), times);
}

fn measure_one(count: &dyn Fn() -> Count, label: &str, size: usize, what: &str) {
    let first = count();
    let times: Vec<Duration> = (0..REQUESTS)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(count());
            started.elapsed()
        })
        .collect();
    let (figure, approximate) = match what {
        "accounts" => (first.distinct_dids, first.distinct_approximate),
        _ => (first.total, first.approximate),
    };
    print_row((label, size, what), (figure, if approximate { "estimate" } else { "exact   " }), times);
}

/// One line of figures: what was measured, its answer, and its latencies.
fn print_row((label, size, what): (&str, usize, &str), (figure, flag): (u64, &str), mut times: Vec<Duration>) {
    times.sort_unstable();
    println!(
        "{label:>12} {size:>9} backlinks, {what:>8}: {figure:>9} {flag}  p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        percentile(&times, 1.0),
    );
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: nothing to measure then.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (label, hot_target_entries) in
        [("tallies", backlinks::index::DEFAULT_HOT_TARGET_ENTRIES), ("no tallies", u64::MAX)]
    {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let index = build(dir.path(), hot_target_entries, &runtime);
        eprintln!("{label}: built in {:.1} s", started.elapsed().as_secs_f64());
        measure(&index, &runtime, label);
    }
}
