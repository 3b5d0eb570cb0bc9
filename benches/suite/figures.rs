//! One-shot figures: the bare parse rate of the workload, bucket bytes per live link and write
//! amplification, the key filter's lookup time and false-positive rate on the index's own
//! tables, and an answer check of backlinks against the SQLite baseline.
//!
//! Invariants:
//! - `parse_rate`, `filter` and `check` only read; `bucket` collects garbage first (what a
//!   running writer does after its grace period) and changes nothing else.
//! - Filter probes are keys no table can hold (a did id beyond any allocated one), so every
//!   positive is a false positive.

use crate::{cpu, sqlite};
use backlinks::base::rng::splitmix64;
use backlinks::index::{Index, IndexOptions};
use backlinks::lsm::filter::KeyHash;
use backlinks::lsm::handle::{FilterProbe, TableHandle};
use backlinks::model::ids::Backlink;
use backlinks::model::ids::{OUTLINED_BIT, RecordId};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::object::Store;
use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Most filter probes per run.
const MAX_PROBES: usize = 100_000_000;

/// A `serde_json::Value` parse of every line, on one thread: what the importer cannot beat.
pub fn parse_rate(file: &Path) -> anyhow::Result<serde_json::Value> {
    let mut reader = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?);
    let (mut line, mut events, mut bytes) = (Vec::new(), 0u64, 0u64);
    let started = Instant::now();
    while reader.read_until(b'\n', &mut line)? > 0 {
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        std::hint::black_box(value);
        events += 1;
        bytes += line.len() as u64;
        line.clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "events": events, "bytes": bytes, "seconds": seconds,
        "events_per_sec": events as f64 / seconds, "mib_per_sec": bytes as f64 / seconds / (1 << 20) as f64,
    }))
}

fn open_index(data_dir: &Path, read_only: bool) -> anyhow::Result<(Index, Arc<DirStore>)> {
    let store = Arc::new(DirStore::new(data_dir.join("bucket")));
    let options = IndexOptions { read_only, ..IndexOptions::default() };
    Ok((Index::open(data_dir, store.clone(), options, 3)?, store))
}

/// Bytes per live link in the bucket after garbage collection, by kind of object, and write
/// amplification two ways: table bytes ever written (flushes and compaction outputs, still in
/// the catalog until collected) over live table bytes, and bytes the import wrote to the
/// filesystem (if given) over the bucket's bytes.
pub fn bucket(data_dir: &Path, db: &Path, fs_written: Option<u64>) -> anyhow::Result<serde_json::Value> {
    let live_links: i64 = sqlite::open_read_only(db)?.query_row("SELECT count(*) FROM links", [], |r| r.get(0))?;
    let (index, store) = open_index(data_dir, false)?;
    let table_bytes = |records: &[backlinks::lsm::record::TableRecord]| -> u64 {
        records.iter().map(|t| t.data_len + t.meta_len).sum()
    };
    let live_tables = index.catalog.tables()?;
    let retired: Vec<_> = index.catalog.obsolete_tables(u64::MAX / 2)?.into_iter().map(|(t, _)| t).collect();
    let written = table_bytes(&live_tables) + table_bytes(&retired);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (collected, orphans) = runtime.block_on(index.collect_garbage(u64::MAX / 2, 0))?;
    let objects = runtime.block_on(store.list(""))?;
    let by_prefix = |prefix: &str| objects.iter().filter(|o| o.key.starts_with(prefix)).map(|o| o.size).sum::<u64>();
    let bucket_bytes: u64 = objects.iter().map(|o| o.size).sum();
    let per_link = |bytes: u64| bytes as f64 / live_links.max(1) as f64;
    Ok(serde_json::json!({
        "live_links": live_links, "bucket_bytes": bucket_bytes, "bytes_per_live_link": per_link(bucket_bytes),
        "link_tables_per_live_link": per_link(by_prefix("tables/links/")),
        "revocation_tables_per_live_link": per_link(by_prefix("tables/thresholds/")),
        "outlines_per_live_link": per_link(by_prefix("outlines/")),
        "manifests_per_live_link": per_link(by_prefix("manifests/")),
        "link_runs": index.links.runs().len(), "link_tables": index.links.tables().len(),
        "revocation_runs": index.thresholds.runs().len(),
        "tables_collected": collected, "orphans_collected": orphans,
        "table_bytes_written": written, "live_table_bytes": table_bytes(&live_tables),
        "lsm_write_amplification": written as f64 / table_bytes(&live_tables).max(1) as f64,
        "fs_bytes_written": fs_written,
        "fs_write_amplification": fs_written.map(|w| w as f64 / bucket_bytes.max(1) as f64),
    }))
}

/// A key no table holds: a did id past every allocated one (counters are far below 2^40).
fn absent_key(state: &mut u64) -> RecordId {
    let did = OUTLINED_BIT | (1 << 44) | (splitmix64(state) >> 24);
    match splitmix64(state) % 5 {
        0 => RecordId::repo(did),
        _ => RecordId { rkey: splitmix64(state) >> 2, collection: 1 + splitmix64(state) % 8, did },
    }
}

/// Keys whose filter lines are requested together (a page's sources are about this many).
const PREFETCH_BATCH: usize = 16;

/// Lookup time (as queries look up: a batch prefetched, then tested; one at a time, hash
/// precomputed; and including the xxh3-128 of the key) over every link table's filter, and the
/// measured false-positive rate against the configured target.
pub fn filter(data_dir: &Path, probes: usize) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!((1..=MAX_PROBES).contains(&probes), "--probes must be 1..={MAX_PROBES}");
    let (index, _) = open_index(data_dir, true)?;
    let tables = index.links.tables();
    anyhow::ensure!(!tables.is_empty(), "the index has no link tables");
    let mut state = 11;
    let keys: Vec<[u8; 24]> = (0..probes).map(|_| absent_key(&mut state).to_bytes()).collect();
    let of_hash = |key: KeyHash| FilterProbe { key, prefix: None };
    let hashes: Vec<FilterProbe> = keys.iter().map(|k| of_hash(KeyHash::of(k))).collect();
    let prehashed = |table: &TableHandle<Backlink>| hashes.iter().filter(|h| table.may_contain(**h)).count();
    let hashing =
        |table: &TableHandle<Backlink>| keys.iter().filter(|k| table.may_contain(of_hash(KeyHash::of(&k[..])))).count();
    // As a query probes its keys: a batch's filter lines all requested first, then tested.
    let prefetched = |table: &TableHandle<Backlink>| {
        let batch = |hashes: &[FilterProbe]| {
            hashes.iter().for_each(|h| table.prefetch(*h));
            hashes.iter().filter(|h| table.may_contain(**h)).count()
        };
        hashes.chunks(PREFETCH_BATCH).map(batch).sum::<usize>()
    };
    let lookups = (probes * tables.len()) as f64;
    let _warm: usize = tables.iter().map(|t| prehashed(t)).sum();
    let ((positives, prehashed_ns), (again, hashed_ns), (batched, prefetched_ns)) = (
        timed(|| tables.iter().map(|t| prehashed(t)).sum::<usize>()),
        timed(|| tables.iter().map(|t| hashing(t)).sum::<usize>()),
        timed(|| tables.iter().map(|t| prefetched(t)).sum::<usize>()),
    );
    assert_eq!((positives, positives), (again, batched), "the same probes give the same answers");
    let per_lookup = |(wall, cpu): (f64, Option<f64>)| (wall / lookups, cpu.map(|cpu| cpu / lookups));
    let ((prehashed_ns, prehashed_cpu_ns), (hashed_ns, hashed_cpu_ns)) =
        (per_lookup(prehashed_ns), per_lookup(hashed_ns));
    let (prefetched_ns, prefetched_cpu_ns) = per_lookup(prefetched_ns);
    let target = IndexOptions::default().table.filter_fpr;
    let measured = positives as f64 / (probes * tables.len()) as f64;
    let filter_bytes: usize = tables.iter().map(|t| t.filter_bytes()).sum();
    let entries: u64 = tables.iter().map(|t| t.record.entries).sum();
    Ok(serde_json::json!({
        "tables": tables.len(), "probes_per_table": probes, "filter_bytes": filter_bytes, "entries": entries,
        "ns_per_lookup_prehashed": prehashed_ns, "ns_per_lookup_with_hash": hashed_ns,
        "cpu_ns_per_lookup_prehashed": prehashed_cpu_ns, "cpu_ns_per_lookup_with_hash": hashed_cpu_ns,
        "ns_per_lookup_prefetched": prefetched_ns, "cpu_ns_per_lookup_prefetched": prefetched_cpu_ns,
        "prefetch_batch": PREFETCH_BATCH,
        "load_average": cpu::load_average(),
        "fpr_target": target, "fpr_measured": measured, "fpr_ratio": measured / target,
    }))
}

/// Runs `work`, returning its result and its (wall, thread CPU) nanoseconds.
fn timed<T>(work: impl FnOnce() -> T) -> (T, (f64, Option<f64>)) {
    let (started, cpu_before) = (Instant::now(), cpu::thread_nanos());
    let result = work();
    let cpu = cpu::thread_nanos().zip(cpu_before).map(|(after, before)| (after - before) as f64);
    (result, (started.elapsed().as_nanos() as f64, cpu))
}

/// Compares the first `count` targets' pages (as sets of (location, source)) between the index
/// and the baseline; reports how many differ, with the first few.
pub fn check(data_dir: &Path, db: &Path, targets: &[String], count: usize) -> anyhow::Result<serde_json::Value> {
    let (index, _) = open_index(data_dir, true)?;
    let conn = sqlite::open_read_only(db)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut compared, mut differing, mut examples) = (0usize, 0usize, Vec::new());
    for target in targets.iter().take(count) {
        let page = runtime.block_on(list_backlinks(&index, &ListParams::new(target.as_str())))?;
        let ours: BTreeSet<(String, String)> = page.items.into_iter().collect();
        let theirs: BTreeSet<(String, String)> = sqlite::page(&conn, target)?.into_iter().collect();
        compared += 1;
        if ours != theirs {
            differing += 1;
            if examples.len() < 5 {
                examples.push(serde_json::json!({
                    "target": target, "backlinks": ours.len(), "sqlite": theirs.len(),
                    "only_backlinks": ours.difference(&theirs).take(3).collect::<Vec<_>>(),
                    "only_sqlite": theirs.difference(&ours).take(3).collect::<Vec<_>>(),
                }));
            }
        }
    }
    Ok(serde_json::json!({ "compared": compared, "differing": differing, "examples": examples }))
}
