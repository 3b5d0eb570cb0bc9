//! Import throughput: Jetstream v1 lines through parse, extract, intern and memtable, with flushes
//! to real table files; compared with a bare serde_json parse of the same lines.

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::model::tid::format_tid;
use backlinks::store::dir::DirStore;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::sync::Arc;

const EVENTS: usize = 20_000;

/// Likes, replies and follows over a few thousand authors and posts (a small seeded workload).
fn workload() -> Vec<u8> {
    let mut out = Vec::new();
    let mut state = 42u64;
    let mut next = |n: u64| backlinks::base::rng::splitmix64(&mut state) % n;
    for i in 0..EVENTS {
        let author = format!("did:plc:{:024}", next(5_000));
        let target_author = format!("did:plc:{:024}", next(500));
        let rkey = format_tid(1_700_000_000_000_000 + i as u64 * 1000);
        let post = format!(
            "at://{target_author}/app.bsky.feed.post/{}",
            format_tid(1_690_000_000_000_000 + next(2_000) * 7919)
        );
        let (collection, record) = match next(10) {
            0..=5 => (
                "app.bsky.feed.like",
                format!(
                    r#"{{"$type":"app.bsky.feed.like","createdAt":"2024-01-01T00:00:00Z","subject":{{"cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em","uri":"{post}"}}}}"#
                ),
            ),
            6..=7 => (
                "app.bsky.feed.post",
                format!(
                    r#"{{"$type":"app.bsky.feed.post","createdAt":"2024-01-01T00:00:00Z","text":"hello there","langs":["en"],"reply":{{"parent":{{"cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em","uri":"{post}"}},"root":{{"cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em","uri":"{post}"}}}}}}"#
                ),
            ),
            _ => (
                "app.bsky.graph.follow",
                format!(
                    r#"{{"$type":"app.bsky.graph.follow","createdAt":"2024-01-01T00:00:00Z","subject":"{target_author}"}}"#
                ),
            ),
        };
        out.extend_from_slice(format!(r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"rev":"{rkey}","operation":"create","collection":"{collection}","rkey":"{rkey}","record":{record},"cid":"bafyreidqpc7si3dbimffi64lz3xsx2qt45ip7rpna2qpslcddp23itjjzm"}}}}"#).as_bytes());
        out.push(b'\n');
    }
    out
}

fn bench_import(c: &mut Criterion) {
    let input = workload();
    let mut group = c.benchmark_group("import");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.sample_size(10);
    group.bench_function("serde_json_parse_only", |b| {
        b.iter(|| {
            for line in input.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let value: serde_json::Value = serde_json::from_slice(line).unwrap();
                std::hint::black_box(value);
            }
        })
    });
    group.bench_function("import_lines", |b| {
        b.iter_with_setup(
            || {
                let dir = tempfile::tempdir().unwrap();
                let store = Arc::new(DirStore::new(dir.path().join("bucket")));
                let index = Index::open(dir.path(), store, IndexOptions::default(), 1).unwrap();
                (dir, index)
            },
            |(dir, index)| {
                let report = import_lines(&index, input.as_slice()).unwrap();
                assert_eq!(report.applied as usize, EVENTS);
                drop(index);
                drop(dir);
            },
        )
    });
    group.finish();
}

criterion_group!(benches, bench_import);
criterion_main!(benches);
