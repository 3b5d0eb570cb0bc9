//! The outline miss path: the id of a DID the outline cache has forgotten (2,000,000 stored, a
//! 1,024-entry cache), found through the fingerprint table (`Outlines::lookup`, which also caches
//! what it finds) and, for comparison, through a SQLite index on (kind, value) built on the same
//! `outlines.db` for the purpose, which is how such a miss was answered before the table (since
//! version 2, `outlines.db` has that index for collections and locations only).

use backlinks::base::rng::splitmix64;
use backlinks::outline::{OutlineKind, OutlineOptions, Outlines};
use criterion::{Criterion, criterion_group, criterion_main};
use std::path::Path;

const STORED: usize = 2_000_000;
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A did:plc of 24 random base32 characters, as on the network.
fn did(state: &mut u64) -> String {
    let (high, low) = (splitmix64(state), splitmix64(state));
    let bits = (u128::from(high) << 64) | u128::from(low);
    let tail: String = (0..24).map(|i| BASE32[((bits >> (5 * i)) & 31) as usize] as char).collect();
    format!("did:plc:{tail}")
}

fn stored_dids(path: &Path) -> Vec<String> {
    let outlines = Outlines::open(path, OutlineOptions { cache_entries: 1024, map_bytes: 0 }).unwrap();
    let mut state = 1;
    let names: Vec<String> = (0..STORED).map(|_| did(&mut state)).collect();
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
    let names = stored_dids(&path);
    let mut group = c.benchmark_group("outline_miss");
    {
        let outlines = Outlines::open(&path, OutlineOptions { cache_entries: 1024, map_bytes: 0 }).unwrap();
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

criterion_group!(benches, bench_miss_path);
criterion_main!(benches);
