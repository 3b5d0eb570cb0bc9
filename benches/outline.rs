//! The outline miss path: the id of a DID the outline cache has forgotten (2,000,000 stored, a
//! 1,024-entry cache), found through the fingerprint table (`Outlines::lookup`, which also caches
//! what it finds) and, for comparison, through a SQLite index on (kind, value) built on the same
//! `outlines.db` for the purpose, which is how such a miss was answered before the table (since
//! version 2, `outlines.db` has that index for collections and locations only).
//!
//! The hit path at the import's scale: a cache of 1,048,576 DIDs (the default), interned in
//! batches of `BATCH` drawn at random from them, one at a time as an import's writer interns a
//! batch's DIDs, with and without warming the batch first (`Outlines::warm`).

use backlinks::base::rng::splitmix64;
use backlinks::outline::{OutlineKind, OutlineOptions, Outlines};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

const STORED: usize = 2_000_000;
/// DIDs of one import batch: about two for each of its 1,024 operations.
const BATCH: usize = 2_048;
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A did:plc of 24 random base32 characters, as on the network.
fn did(state: &mut u64) -> String {
    let (high, low) = (splitmix64(state), splitmix64(state));
    let bits = (u128::from(high) << 64) | u128::from(low);
    let tail: String = (0..24).map(|i| BASE32[((bits >> (5 * i)) & 31) as usize] as char).collect();
    format!("did:plc:{tail}")
}

/// `count` random DIDs (from `seed`), interned and persisted in `outlines`.
fn stored_dids(outlines: &Outlines, count: usize, seed: u64) -> Vec<String> {
    let mut state = seed;
    let names: Vec<String> = (0..count).map(|_| did(&mut state)).collect();
    for chunk in names.chunks(100_000) {
        for name in chunk {
            outlines.intern(OutlineKind::Did, name, 0).unwrap();
        }
        outlines.persist().unwrap();
    }
    names
}

fn bench_miss_path(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outlines.db");
    let options = OutlineOptions { cache_entries: 1024, map_bytes: 0 };
    let names = stored_dids(&Outlines::open(&path, options).unwrap(), STORED, 1);
    let mut group = c.benchmark_group("outline_miss");
    {
        let outlines = Outlines::open(&path, options).unwrap();
        let mut state = 9;
        group.bench_function("by_fingerprint", |b| {
            b.iter(|| {
                let name = &names[splitmix64(&mut state) as usize % STORED];
                outlines.lookup(OutlineKind::Did, name).unwrap().expect("stored")
            })
        });
    } // closed: outlines.db is opened by one connection at a time
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch("CREATE UNIQUE INDEX bench_values ON outlines (kind, value)").unwrap();
    let mut query =
        db.prepare("SELECT id FROM outlines INDEXED BY bench_values WHERE kind = 1 AND value = ?1").unwrap();
    let mut state = 9;
    group.bench_function("by_sqlite_index", |b| {
        b.iter(|| {
            let name = &names[splitmix64(&mut state) as usize % STORED];
            query.query_row([name], |row| row.get::<_, i64>(0)).unwrap()
        })
    });
    group.finish();
}

fn bench_hit_path(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let cached = OutlineOptions::default().cache_entries;
    let outlines = Outlines::open(&dir.path().join("outlines.db"), OutlineOptions::default()).unwrap();
    let names = stored_dids(&outlines, cached, 3);
    let mut group = c.benchmark_group("outline_hit");
    group.throughput(Throughput::Elements(BATCH as u64));
    for warm in [false, true] {
        let mut state = 5;
        // A batch's DIDs lie back to back in one buffer, as an import batch's text holds them.
        let mut batch = || {
            let text: String = (0..BATCH).map(|_| names[splitmix64(&mut state) as usize % cached].as_str()).collect();
            let len = text.len() / BATCH;
            (text, len)
        };
        group.bench_function(if warm { "warmed_batch" } else { "one_by_one" }, |b| {
            b.iter_batched(
                &mut batch,
                |(text, len)| {
                    let dids = || (0..BATCH).map(|i| &text[i * len..(i + 1) * len]);
                    if warm {
                        outlines.warm(OutlineKind::Did, dids()).unwrap();
                    }
                    dids().map(|did| outlines.intern(OutlineKind::Did, did, 0).unwrap()).fold(0, u64::wrapping_add)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench_miss_path, bench_hit_path);
criterion_main!(benches);
