//! The shape of the LSM at scale, on one machine (not criterion: one long measured run).
//!
//! `cargo bench --bench lsm_shape -- [LINKS]` (default 5,000,000; 20,000 when `cargo test` runs
//! it as a smoke test) applies that many backlinks
//! (likes of Zipf-popular posts, follows, 3 % deletes) into delta runs without compacting, then
//! measures listBacklinks latency idle, then again while the runs are compacted in the
//! background, and finally reports bucket bytes per live link and write amplification (bytes
//! uploaded / bytes in the bucket at the end).

use backlinks::base::rng::splitmix64;
use backlinks::index::{Index, IndexOptions};
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::model::operation::{Operation, RecordOp, RecordRef};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::object::{ObjectInfo, Store, StoreError};
use bytes::Bytes;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts the bytes every put uploads.
#[derive(Debug)]
struct CountingStore {
    inner: DirStore,
    put_bytes: AtomicU64,
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        self.put_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        self.inner.put(key, body).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        self.inner.get_range(key, offset, len).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
}

const POSTS: u64 = 200_000;
const AUTHORS: u64 = 300_000;

/// A Zipf-ish popular post index: squaring a uniform draw skews towards small indexes.
fn popular(state: &mut u64, n: u64) -> u64 {
    let u = (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64;
    ((u * u * u) * n as f64) as u64
}

fn did(n: u64) -> String {
    format!("did:plc:{n:024}")
}

/// The `p` quantile of sorted latencies (zero when there are none: nothing ran meanwhile).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * p) as usize],
    }
}

async fn measure(index: &Index, targets: &[String], stop: Option<&AtomicBool>) -> Vec<Duration> {
    // Idle: one pass over the targets. During compaction: only queries that finished while it
    // was still running count (the loop stops as soon as it is done).
    let mut latencies = Vec::new();
    'rounds: for _ in 0..10_000 {
        for target in targets {
            let started = Instant::now();
            let page = list_backlinks(index, &ListParams::new(target.as_str())).await.unwrap();
            let elapsed = started.elapsed();
            std::hint::black_box(page);
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                break 'rounds;
            }
            latencies.push(elapsed);
        }
        if stop.is_none() {
            break;
        }
    }
    latencies.sort();
    latencies
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this as a quick smoke test.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let default_links = if benchmarking { 5_000_000 } else { 20_000 };
    let links: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(default_links);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store =
        Arc::new(CountingStore { inner: DirStore::new(root.path().join("bucket")), put_bytes: AtomicU64::new(0) });
    let options = IndexOptions {
        memtable_bytes: 16 << 20,
        compaction: CompactionOptions { fan_in: 1_000_000, ..CompactionOptions::default() },
        ..IndexOptions::default()
    };
    let index = Arc::new(Index::open(root.path(), store.clone(), options, 1).unwrap());
    let started = Instant::now();
    let mut state = 7u64;
    let mut live = 0u64;
    for i in 0..links {
        let author = did(splitmix64(&mut state) % AUTHORS);
        let rkey = backlinks::model::tid::format_tid(1_700_000_000_000_000 + i * 1_000);
        let record_ref = RecordRef {
            did: Cow::Owned(author.clone()),
            collection: Cow::Borrowed("app.bsky.feed.like"),
            rkey: Cow::Owned(rkey),
        };
        let operation = match i % 100 {
            0..=2 if i > 100 => {
                let old = backlinks::model::tid::format_tid(1_700_000_000_000_000 + (i - 50) * 1_000);
                live -= 1; // approximately: the deleted like may belong to another author (then it stays)
                Operation::Delete(RecordRef { rkey: Cow::Owned(old), ..record_ref })
            }
            3..=12 => {
                live += 1;
                let subject = did(popular(&mut state, AUTHORS));
                let record = serde_json::json!({"subject": subject});
                Operation::Create(RecordOp {
                    record_ref: RecordRef { collection: Cow::Borrowed("app.bsky.graph.follow"), ..record_ref },
                    record,
                })
            }
            _ => {
                live += 1;
                let post = popular(&mut state, POSTS);
                let uri = format!(
                    "at://{}/app.bsky.feed.post/{}",
                    did(post % 5_000),
                    backlinks::model::tid::format_tid(1_690_000_000_000_000 + post * 7_919)
                );
                let record = serde_json::json!({"subject": {"uri": uri, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}});
                Operation::Create(RecordOp { record_ref, record })
            }
        };
        index.apply(&operation, Some(i as i64)).unwrap();
        if index.wants_flush() {
            index.flush().unwrap();
        }
    }
    index.flush().unwrap();
    runtime.block_on(index.publish_manifest()).unwrap();
    let runs = index.links.runs().len();
    println!("applied {links} operations in {:.1}s into {runs} delta runs", started.elapsed().as_secs_f64());

    let targets: Vec<String> = (0..500u64)
        .map(|i| {
            let post = popular(&mut state, POSTS);
            if i % 5 == 0 {
                did(popular(&mut state, AUTHORS))
            } else {
                format!(
                    "at://{}/app.bsky.feed.post/{}",
                    did(post % 5_000),
                    backlinks::model::tid::format_tid(1_690_000_000_000_000 + post * 7_919)
                )
            }
        })
        .collect();
    let idle = runtime.block_on(measure(&index, &targets, None));

    // Compact in the background (fan-in 8, paced) while the same queries run.
    let compacting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (worker_index, handle, flag, finished) =
        (index.clone(), runtime.handle().clone(), compacting.clone(), done.clone());
    let compaction_started = Instant::now();
    let worker = std::thread::spawn(move || {
        let mut merges = 0;
        flag.store(true, Ordering::Relaxed);
        while worker_index
            .compact_once_with(&handle, &|| 1, &CompactionOptions { fan_in: 8, ..CompactionOptions::default() })
            .unwrap()
        {
            merges += 1;
        }
        finished.store(true, Ordering::Relaxed);
        merges
    });
    while !compacting.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let during = runtime.block_on(measure(&index, &targets, Some(&done)));
    let merges = worker.join().unwrap();
    let compaction_secs = compaction_started.elapsed().as_secs_f64();
    runtime.block_on(index.publish_manifest()).unwrap();
    runtime.block_on(index.collect_garbage(u64::MAX / 2, 0)).unwrap();
    let bucket_bytes: u64 = runtime.block_on(store.list("")).unwrap().iter().map(|o| o.size).sum();
    let uploaded = store.put_bytes.load(Ordering::Relaxed);
    println!("compaction: {merges} merges in {compaction_secs:.1}s; runs now {}", index.links.runs().len());
    for (name, lat) in [("idle", &idle), ("during compaction", &during)] {
        println!(
            "listBacklinks {name}: {} queries, p50 {:?}, p99 {:?}",
            lat.len(),
            percentile(lat, 0.50),
            percentile(lat, 0.99)
        );
    }
    println!(
        "live links about {live}; bucket {bucket_bytes} bytes = {:.2} bytes per live link",
        bucket_bytes as f64 / live as f64
    );
    println!("uploaded {uploaded} bytes; write amplification {:.2}", uploaded as f64 / bucket_bytes as f64);
}
