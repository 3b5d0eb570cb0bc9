//! What a merge pays per entry to know whether a revocation kills it: `KnownRevocations::settle`
//! over 512 Ki revocations (the default `compaction_max_revocations`), for backlinks whose
//! sources come at random, most of them never revoked (as in a merge: deletes are a few percent
//! of the network's events).
//!
//! Run: `cargo bench --bench liveness -- --warm-up-time 1 --measurement-time 3`.

use backlinks::base::rng::splitmix64;
use backlinks::liveness::KnownRevocations;
use backlinks::model::ids::{Backlink, RecordId, Revocation};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const REVOCATIONS: usize = 512 << 10;
const LINKS: usize = 1 << 20;
/// One link in this many has a revoked source.
const REVOKED_ONE_IN: u64 = 20;

fn source(seed: &mut u64) -> RecordId {
    RecordId { rkey: splitmix64(seed) >> 1, collection: 1 + splitmix64(seed) % 8, did: splitmix64(seed) % 2_000_000 }
}

fn benches(c: &mut Criterion) {
    let mut seed = 7;
    let revoked: Vec<RecordId> = (0..REVOCATIONS).map(|_| source(&mut seed)).collect();
    let revocations = revoked.iter().map(|&source| Revocation { source, rev: 1_000 }).collect();
    let known = KnownRevocations::of_flush(revocations);
    let links: Vec<Backlink> = (0..LINKS as u64)
        .map(|i| {
            let source = if i % REVOKED_ONE_IN == 0 { revoked[i as usize % REVOCATIONS] } else { source(&mut seed) };
            Backlink { target: RecordId::repo(i % 50_000), source, location: 1, source_rev: 10 + i % 2_000 }
        })
        .collect();
    let mut group = c.benchmark_group("liveness");
    group.throughput(Throughput::Elements(LINKS as u64));
    group.bench_function("settle_1m_links_512ki_revocations", |b| {
        b.iter(|| links.iter().filter(|link| known.settle(**link).is_some()).count())
    });
    group.finish();
    black_box(&known);
}

criterion_group!(liveness_benches, benches);
criterion_main!(liveness_benches);
