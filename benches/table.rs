//! Table benchmarks: building a 1M-backlink table, decoding all of its frames (with column models,
//! payload encoding 4, and without, zstd), decoding its column models, point lookups (filter, frame search, decode) on a
//! built in-memory table, and the key filter alone.
//!
//! Run: `cargo bench --bench table -- --warm-up-time 1 --measurement-time 3`.
//! The data is synthetic but shaped like the firehose (see `realistic_backlinks`) and seeded, so
//! runs are comparable.

use backlinks::lsm::coder::ColumnModels;
use backlinks::lsm::filter::KeyHash;
use backlinks::lsm::table::{TableMeta, TableOptions, decode_frames, write_table};
use backlinks::model::ids::{Backlink, OUTLINED_BIT, RecordId};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const LINKS: usize = 1_000_000;
const TARGETS: usize = 30_000;
const USERS: u64 = 500_000;

/// SplitMix64: a seeded generator so every run benchmarks the same table.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        backlinks::base::rng::splitmix64(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn tid(micros: u64, clock: u64) -> u64 {
    (micros << 10) | (clock & 0x3FF)
}

/// Posts and accounts with Zipf-ish popularity (exponent 1.1), linked by likes, reposts,
/// replies and follows from `USERS` accounts over a few hours; one ingest stamp per link.
fn realistic_backlinks(seed: u64) -> (Vec<Backlink>, Vec<RecordId>) {
    let mut rng = SplitMix(seed);
    let start = 1_730_000_000_000_000u64;
    let user = |rng: &mut SplitMix| OUTLINED_BIT | (1 + rng.below(USERS));
    let targets: Vec<RecordId> = (0..TARGETS)
        .map(|i| match i % 5 {
            0 => RecordId::repo(user(&mut rng)),
            _ => RecordId {
                rkey: tid(start - rng.below(86_400_000_000), rng.below(1024)),
                collection: 3,
                did: user(&mut rng),
            },
        })
        .collect();
    let cumulative: Vec<f64> = (1..=TARGETS)
        .scan(0.0, |sum, rank| {
            *sum += 1.0 / (rank as f64).powf(1.1);
            Some(*sum)
        })
        .collect();
    let total = cumulative[TARGETS - 1];
    let mut links: Vec<Backlink> = (0..LINKS as u64)
        .map(|i| {
            let pick = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let target = targets[cumulative.partition_point(|&c| c < pick).min(TARGETS - 1)];
            let (collection, location) = if target.is_repo() { (4, 3) } else { (1 + rng.below(3), 1 + rng.below(2)) };
            let micros = start + i * 10_000 + rng.below(10_000);
            let source = RecordId { rkey: tid(micros, rng.below(1024)), collection, did: user(&mut rng) };
            Backlink { target, source, location, source_rev: 1_000_000 + i }
        })
        .collect();
    links.sort_unstable();
    links.dedup();
    (links, targets)
}

/// Builds the table with a filter sized for the number of distinct targets.
fn build(links: &[Backlink], options: &TableOptions) -> (Vec<u8>, Vec<u8>) {
    let (data, meta, _) = write_table(Vec::new(), links, options).expect("sorted input, in memory");
    (data, meta)
}

/// Everything a query does for one target against one table, minus the network.
fn lookup(meta: &TableMeta<Backlink>, data: &[u8], target: RecordId, out: &mut Vec<Backlink>) -> usize {
    out.clear();
    if !meta.may_contain(KeyHash::of_record(&target)) {
        return 0;
    }
    let frames = meta.frames_for_key(target);
    let (start, end) = meta.byte_range(frames.clone());
    decode_frames(meta, frames, &data[start as usize..end as usize], out).expect("valid table");
    out.iter().filter(|link| link.target == target).count()
}

fn benches(c: &mut Criterion) {
    let (links, targets) = realistic_backlinks(7);
    let defaults = TableOptions::default();
    let without_models = TableOptions { model_min_entries: u64::MAX, ..TableOptions::default() };
    let (data, meta_bytes) = build(&links, &defaults);
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).expect("valid meta");
    println!(
        "table: {} links, {} frames, {:.2} data bytes/link, {} meta bytes, filter k = {}, {} blocks",
        links.len(),
        meta.frames.len(),
        data.len() as f64 / links.len() as f64,
        meta_bytes.len(),
        meta.filter.shape().k,
        meta.filter.shape().blocks
    );

    let mut group = c.benchmark_group("table");
    group.sample_size(10);
    group.throughput(Throughput::Elements(links.len() as u64));
    group.bench_function("build_1m_backlinks", |b| b.iter(|| build(black_box(&links), &defaults)));
    group.bench_function("build_1m_backlinks_without_models", |b| b.iter(|| build(black_box(&links), &without_models)));
    let (zstd_data, zstd_meta) = build(&links, &without_models);
    let zstd_meta = TableMeta::<Backlink>::decode(&zstd_meta).expect("valid meta");
    println!("without models: {:.2} data bytes/link", zstd_data.len() as f64 / links.len() as f64);
    let mut decoded = Vec::with_capacity(links.len());
    for (name, meta, data) in
        [("decode_all_frames", &meta, &data), ("decode_all_frames_without_models", &zstd_meta, &zstd_data)]
    {
        group.bench_function(name, |b| {
            b.iter(|| {
                decoded.clear();
                decode_frames(meta, 0..meta.frames.len(), data, &mut decoded).expect("valid table");
                decoded.len()
            })
        });
    }
    group.finish();

    // What a query pays when a table's models fell out of the meta cache: decoding them again.
    let models = meta.models.as_ref().expect("a 1M-link table has column models");
    let (layout, encoded) = (models.layout(), models.encode());
    println!("column models: {} bytes encoded, {} bytes decoded", encoded.len(), models.memory_bytes());
    c.bench_function("decode_column_models", |b| {
        b.iter(|| ColumnModels::decode(layout, black_box(&encoded)).expect("valid models"))
    });

    // Targets in popularity-independent order: most are rare, a few span many frames.
    let mut out = Vec::new();
    let mut next = 0usize;
    c.bench_function("point_lookup_present_target", |b| {
        b.iter(|| {
            next = (next + 7919) % targets.len();
            lookup(&meta, &data, black_box(targets[next]), &mut out)
        })
    });
    let mut rng = SplitMix(99);
    c.bench_function("point_lookup_absent_target", |b| {
        b.iter_batched(
            || RecordId { rkey: rng.next() >> 1, collection: 3, did: OUTLINED_BIT | rng.below(USERS) },
            |target| lookup(&meta, &data, target, &mut out),
            BatchSize::SmallInput,
        )
    });

    let hashes: Vec<KeyHash> = (0..4096).map(|i| KeyHash::of_record(&targets[i % targets.len()])).collect();
    let mut index = 0usize;
    c.bench_function("filter_may_contain_prehashed", |b| {
        b.iter(|| {
            index = (index + 1) & 4095;
            meta.may_contain(black_box(hashes[index]))
        })
    });
    c.bench_function("filter_hash_and_may_contain", |b| {
        b.iter(|| {
            index = (index + 1) & 4095;
            meta.may_contain(KeyHash::of_record(black_box(&targets[index])))
        })
    });
}

criterion_group!(table_benches, benches);
criterion_main!(table_benches);
