//! The engine over an object store it does not control: every listBacklinks page of a machine
//! that reads tables from the bucket needs at most two serially dependent rounds of requests, and
//! a writer killed in the middle of uploading loses nothing, publishes no manifest naming a
//! missing object, and collects the orphans a crash leaves.

mod support;

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::lsm::table::TableOptions;
use backlinks::manifest::Manifest;
use backlinks::query::{Cursor, ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::faulty::{Fault, FaultRule, FaultyStore, Operation, serial_rounds};
use backlinks::store::object::Store;
use backlinks::store::s3::{S3Settings, S3Store};
use backlinks::writer::{Writer, WriterOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where the bucket lives: a local directory, or a fresh prefix of the Garage that
/// scripts/test.sh starts (the `_on_garage` tests).
trait Bucket {
    type S: Store + 'static;
    fn open(&self) -> Self::S;
}

struct Dir(std::path::PathBuf);

impl Bucket for Dir {
    type S = DirStore;
    fn open(&self) -> DirStore {
        DirStore::new(self.0.clone())
    }
}

struct Garage(S3Settings);

impl Bucket for Garage {
    type S = S3Store;
    fn open(&self) -> S3Store {
        S3Store::new(self.0.clone()).unwrap()
    }
}

fn options() -> IndexOptions {
    IndexOptions {
        memtable_bytes: 64 * 80,
        table: TableOptions { frame_bytes: 512, ..TableOptions::default() },
        compaction: CompactionOptions {
            fan_in: 3,
            min_run_bytes: 256,
            shard_bytes: 2048,
            max_bytes_per_sec: None,
            ..CompactionOptions::default()
        },
        ..IndexOptions::default()
    }
}

/// Likes, follows, reposts, deletes and updates over a few authors and popular posts.
fn events(count: usize) -> String {
    let mut out = String::new();
    for i in 0..count {
        // A delete (every 13th event) removes the like its author made just before; an update
        // (13th after 7) moves the like made just before to another post: its source is revoked
        // and linked again at once, so a page that lists it must read its revocation.
        let author_of = |n: usize| format!("did:plc:writer{:018}", n % 31);
        let rewrites_previous = i % 13 == 12 || i % 13 == 7;
        let author = if rewrites_previous { author_of(i - 1) } else { author_of(i) };
        let post = format!("at://did:plc:popular{:017}/app.bsky.feed.post/3kpopular{:04}", i % 5, i % 9);
        let rkey = backlinks::model::tid::format_tid(1_710_000_000_000_000 + i as u64 * 977);
        let strong =
            format!(r#"{{"uri":"{post}","cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}}"#);
        let (operation, collection, record) = match i % 13 {
            12 => ("delete", "app.bsky.feed.like", String::new()),
            7 => {
                let moved = format!(
                    r#"{{"uri":"{}","cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}}"#,
                    moved_to(i)
                );
                ("update", "app.bsky.feed.like", format!(r#","record":{{"subject":{moved}}}"#))
            }
            9 => (
                "create",
                "app.bsky.graph.follow",
                format!(r#","record":{{"subject":"did:plc:popular{:017}"}}"#, i % 5),
            ),
            5 => ("create", "app.bsky.feed.repost", format!(r#","record":{{"subject":{strong}}}"#)),
            _ => ("create", "app.bsky.feed.like", format!(r#","record":{{"subject":{strong}}}"#)),
        };
        let rkey = if rewrites_previous {
            backlinks::model::tid::format_tid(1_710_000_000_000_000 + (i as u64 - 1) * 977)
        } else {
            rkey
        };
        out.push_str(&format!(
            r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"operation":"{operation}","collection":"{collection}","rkey":"{rkey}"{record}}}}}"#
        ));
        out.push('\n');
    }
    out
}

/// The reference model of `events(count)`: every target's live (location, source URI) pairs,
/// derived from the generator's rules alone (a create links its subject at `$.subject`; the
/// 13th event deletes the like before it, the 8th moves it to `moved_to`).
fn model(count: usize) -> Vec<std::collections::BTreeSet<(String, String)>> {
    let mut live: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for i in 0..count {
        let rkey = |n: usize| backlinks::model::tid::format_tid(1_710_000_000_000_000 + n as u64 * 977);
        let author = |n: usize| format!("did:plc:writer{:018}", n % 31);
        if i % 13 == 12 {
            live.remove(&format!("at://{}/app.bsky.feed.like/{}", author(i - 1), rkey(i - 1)));
            continue;
        }
        if i % 13 == 7 {
            live.insert(format!("at://{}/app.bsky.feed.like/{}", author(i - 1), rkey(i - 1)), moved_to(i));
            continue;
        }
        let (collection, target) = match i % 13 {
            9 => ("app.bsky.graph.follow", format!("did:plc:popular{:017}", i % 5)),
            5 => (
                "app.bsky.feed.repost",
                format!("at://did:plc:popular{:017}/app.bsky.feed.post/3kpopular{:04}", i % 5, i % 9),
            ),
            _ => (
                "app.bsky.feed.like",
                format!("at://did:plc:popular{:017}/app.bsky.feed.post/3kpopular{:04}", i % 5, i % 9),
            ),
        };
        live.insert(format!("at://{}/{collection}/{}", author(i), rkey(i)), target);
    }
    targets()
        .iter()
        .map(|t| {
            live.iter()
                .filter(|(_, target)| *target == t)
                .map(|(source, _)| ("$.subject".to_string(), source.clone()))
                .collect()
        })
        .collect()
}

/// The post that the update at event `i` moves a like to.
fn moved_to(i: usize) -> String {
    format!("at://did:plc:popular{:017}/app.bsky.feed.post/3kpopular{:04}", i % 5, (i + 4) % 9)
}

/// Answers as sets (the model knows no page order; the engine's order is checked elsewhere).
fn as_sets(answers: Vec<Vec<(String, String)>>) -> Vec<std::collections::BTreeSet<(String, String)>> {
    answers.into_iter().map(|a| a.into_iter().collect()).collect()
}

fn targets() -> Vec<String> {
    let mut targets: Vec<String> = (0..5)
        .flat_map(|p| (0..9).map(move |r| format!("at://did:plc:popular{p:017}/app.bsky.feed.post/3kpopular{r:04}")))
        .collect();
    targets.extend((0..5).map(|p| format!("did:plc:popular{p:017}")));
    targets
}

/// Builds an index in `dir` over `store` (several flushes, two generations of compaction).
fn build(dir: &Path, store: Arc<dyn Store>, runtime: &tokio::runtime::Handle) -> Arc<Index> {
    let index = Arc::new(Index::open(dir, store, options(), 9).unwrap());
    let text = events(1500);
    let (writer, handle) = (index.clone(), runtime.clone());
    std::thread::spawn(move || {
        import_lines(&writer, text.as_bytes()).unwrap();
        while writer.compact_once(&handle, &|| 1).unwrap() {}
    })
    .join()
    .unwrap();
    index
}

async fn all_pages(index: &Index, target: &str, limit: usize) -> Vec<(String, String)> {
    let mut items = Vec::new();
    let mut params = ListParams { limit, ..ListParams::new(target) };
    loop {
        let page = list_backlinks(index, &params).await.unwrap();
        items.extend(page.items);
        match page.cursor {
            Some(c) => params.cursor = Some(Cursor::decode(&c).unwrap()),
            None => return items,
        }
    }
}

/// Every target's pages after `build` (a plain import, compacted between flushes) in a
/// directory bucket of its own.
async fn plain_import_answers(runtime: &tokio::runtime::Handle) -> Vec<Vec<(String, String)>> {
    let root = tempfile::tempdir().unwrap();
    answers(&build(root.path(), Arc::new(DirStore::new(root.path().join("bucket"))), runtime)).await
}

async fn answers(index: &Index) -> Vec<Vec<(String, String)>> {
    let mut all = Vec::new();
    for target in targets() {
        all.push(all_pages(index, &target, 10).await);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_from_the_bucket_takes_at_most_two_serial_rounds() {
    let root = tempfile::tempdir().unwrap();
    at_most_two_rounds(Dir(root.path().join("bucket")), root.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_from_garage_takes_at_most_two_serial_rounds() {
    let root = tempfile::tempdir().unwrap();
    at_most_two_rounds(Garage(support::garage_settings("rounds")), root.path()).await;
}

/// A multi-flush workload compacted through two generations, published; then a reader with
/// metas only pages through every target, and each page's requests form at most two rounds.
async fn at_most_two_rounds(bucket: impl Bucket, root: &Path) {
    let writer = build(&root.join("writer"), Arc::new(bucket.open()), &tokio::runtime::Handle::current());
    assert!(
        writer.counters.compactions.load(std::sync::atomic::Ordering::Relaxed) >= 4,
        "two generations need 4+ compactions with fan-in 3"
    );
    writer.publish_manifest().await.unwrap();

    // Latency makes the requests of one round overlap in time, so `serial_rounds` sees them as
    // one round (over the network they overlap anyway).
    let latency = FaultRule::new(Fault::Latency { min: Duration::from_millis(15), max: Duration::from_millis(15) })
        .operations(&[Operation::GetRange]);
    let faulty = Arc::new(FaultyStore::new(bucket.open(), 1, vec![latency]));
    // No frame cache: this test counts what a page asks of the bucket.
    let reader_options = IndexOptions { frame_cache_bytes: 0, ..options() };
    let reader = Index::open(&root.join("reader"), faulty.clone(), reader_options, 3).unwrap();
    assert!(reader.restore_if_empty(2).await.unwrap());
    let mut two_round_pages = 0;
    for target in targets() {
        let mut params = ListParams { limit: 25, ..ListParams::new(&target) };
        loop {
            faulty.clear_log();
            let page = list_backlinks(&reader, &params).await.unwrap();
            let log = faulty.log();
            let rounds = serial_rounds(&log);
            assert!(rounds <= 2, "{target}: a page took {rounds} serial rounds ({} requests)", log.len());
            two_round_pages += usize::from(rounds == 2);
            match page.cursor {
                Some(c) => params.cursor = Some(Cursor::decode(&c).unwrap()),
                None => break,
            }
        }
    }
    // Few: a page reads only the revocation tables newer than its candidates' stamps, and merges
    // settle those to the clock they knew every revocation through.
    assert!(two_round_pages > 0, "{two_round_pages} pages read both backlinks and revocations from the bucket");
    let reader_answers = answers(&reader).await;
    assert_eq!(as_sets(reader_answers.clone()), model(1500), "answers differ from the reference model");
    assert_eq!(reader_answers, answers(&writer).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_upload_loses_nothing() {
    let runtime = tokio::runtime::Handle::current();
    // The reference: the same events, never interrupted.
    let expected = plain_import_answers(&runtime).await;
    assert_eq!(as_sets(expected.clone()), model(1500), "the uninterrupted writer differs from the model");
    for crash_after in [1u64, 4, 9, 17, 30] {
        let root = tempfile::tempdir().unwrap();
        let (data, bucket) = (root.path().join("data"), root.path().join("bucket"));
        let dying = Arc::new(FaultyStore::new(
            DirStore::new(bucket.clone()),
            crash_after,
            vec![FaultRule::new(Fault::CrashAfterPuts(crash_after))],
        ));
        let writer = build(&data, dying, &runtime);
        assert!(writer.publish_manifest().await.is_err(), "the store died after {crash_after} puts");
        drop(writer); // killed: whatever was uploaded stays, the rest is pending in the catalog

        // Debris a crash can leave: an object and a local file no catalog names.
        let healthy: Arc<dyn Store> = Arc::new(DirStore::new(bucket.clone()));
        healthy.put("tables/links/00000000000000ff00000000.data", vec![1u8; 10].into()).await.unwrap();
        std::fs::write(data.join("state/tables/links/00000000000000fe00000000.data"), b"partial").unwrap();

        let writer = Index::open(&data, healthy.clone(), options(), 10).unwrap();
        assert!(
            !data.join("state/tables/links/00000000000000fe00000000.data").exists(),
            "local orphan removed at open"
        );
        let name = writer.publish_manifest().await.unwrap();
        let manifest = Manifest::decode(&name, &healthy.get(&format!("manifests/{name}")).await.unwrap()).unwrap();
        for table in &manifest.tables {
            for (ext, len) in [("data", table.data_len), ("meta", table.meta_len)] {
                let key = format!("tables/{}/{}.{ext}", table.tree, table.id);
                let object = healthy.get(&key).await.unwrap_or_else(|e| panic!("manifest names {key}: {e}"));
                assert_eq!(object.len() as u64, len, "{key}");
            }
        }
        for range in &manifest.outlines {
            healthy.get(&range.key()).await.unwrap();
        }
        assert_eq!(answers(&writer).await, expected, "answers after a crash after {crash_after} puts");
        let (_, orphans) = writer.collect_garbage(u64::MAX / 2, 0).await.unwrap();
        assert!(orphans >= 1, "the planted orphan object is collected");
        assert!(healthy.get("tables/links/00000000000000ff00000000.data").await.is_err());

        // And a machine restored from that bucket alone agrees.
        let restored = Index::open(&root.path().join("restored"), healthy.clone(), options(), 11).unwrap();
        assert!(restored.restore_if_empty(5).await.unwrap());
        assert_eq!(answers(&restored).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_data_cache_keeps_to_its_budget_and_never_evicts_unuploaded_tables() {
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    let dir = root.path().join("data");
    let writer = build(&dir, store.clone(), &tokio::runtime::Handle::current());
    let expected = answers(&writer).await;
    drop(writer);
    let budget = 4096;
    let index = Index::open(&dir, store, IndexOptions { cache_bytes: budget, ..options() }, 12).unwrap();
    let local_data = || {
        std::fs::read_dir(dir.join("state/tables/links"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "data"))
            .count()
    };
    let before = local_data();
    assert_eq!(index.enforce_cache_budget().unwrap(), 0, "nothing is uploaded yet, so nothing may be evicted");
    assert_eq!(local_data(), before);
    index.publish_manifest().await.unwrap();
    let cached = index.links.tables().iter().map(|t| t.cached_bytes()).sum::<u64>()
        + index.thresholds.tables().iter().map(|t| t.cached_bytes()).sum::<u64>();
    assert!(cached <= budget, "{cached} cached bytes over a {budget}-byte budget");
    assert!(local_data() < before, "cold tables were evicted");
    let counter = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert!(counter(&index.counters.upload_bytes) > 0, "the publish uploaded the tables");
    assert!(counter(&index.counters.cache_evicted_bytes) > 0);
    assert_eq!(answers(&index).await, expected, "evicted tables are read by range from the bucket");
}

/// Compaction on its own thread while the import goes on gives the same answers as compacting
/// between flushes, and still merges through the tiers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_compaction_during_ingest_keeps_answers() {
    let runtime = tokio::runtime::Handle::current();
    let expected = plain_import_answers(&runtime).await;
    let root = tempfile::tempdir().unwrap();
    let index =
        Arc::new(Index::open(root.path(), Arc::new(DirStore::new(root.path().join("bucket"))), options(), 9).unwrap());
    let clock: backlinks::base::clock::Clock = Arc::new(|| 1);
    let compactor = backlinks::writer::compactor::Compactor::spawn(index.clone(), runtime.clone(), clock);
    let writer = index.clone();
    let merges = std::thread::spawn(move || {
        let text = events(1500);
        let progress = backlinks::ingest::import_progress::ImportProgress::default();
        let nudge = &mut |_: &Index| {
            compactor.nudge();
            Ok(())
        };
        backlinks::ingest::import_lines_with(&writer, text.as_bytes(), nudge, &progress).unwrap();
        assert_eq!(progress.events.load(std::sync::atomic::Ordering::Relaxed), 1500, "every event counted");
        compactor.finish().unwrap()
    })
    .join()
    .unwrap();
    assert!(merges >= 4, "only {merges} merges in the background");
    let counter = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert!(counter(&index.counters.flush_bytes) > 0 && counter(&index.counters.flush_micros) > 0);
    assert!(counter(&index.counters.compaction_bytes_in) > counter(&index.counters.compaction_bytes_out) / 4);
    assert!(counter(&index.counters.compaction_micros) > 0);
    assert_eq!(answers(&index).await, expected);
}

/// A merge that retires tables while a publish uploads them does not fail the publish: their
/// local files wait for it to end, its manifest names only tables that are in the bucket, and
/// the files are gone once it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_during_a_publish_does_not_fail_it() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    // Each table object takes 50 ms to put, so the merge below lands mid-upload.
    let slow_tables = FaultRule::new(Fault::Latency { min: Duration::from_millis(50), max: Duration::from_millis(50) })
        .operations(&[Operation::Put])
        .key_prefix("tables/");
    let slow: Arc<dyn Store> =
        Arc::new(FaultyStore::new(DirStore::new(root.path().join("bucket")), 1, vec![slow_tables]));
    let index = Arc::new(Index::open(&root.path().join("data"), slow, options(), 9).unwrap());
    let (writer, text) = (index.clone(), events(1500));
    std::thread::spawn(move || import_lines(&writer, text.as_bytes()).unwrap()).join().unwrap();
    let ids = |index: &Index| index.links.tables().iter().map(|t| t.record.id.clone()).collect::<Vec<_>>();
    let before = ids(&index);
    let publisher = index.clone();
    let publish = tokio::spawn(async move { publisher.publish_manifest().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (compactor, handle) = (index.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || while compactor.compact_once(&handle, &|| 1).unwrap() {}).await.unwrap();
    let after = ids(&index);
    assert!(before.iter().any(|id| !after.contains(id)), "the merges retired tables: {before:?} {after:?}");
    let name = publish.await.unwrap().expect("the publish survives the merge");
    let kept = index.counters.retired_files_kept_for_publish.load(std::sync::atomic::Ordering::Relaxed);
    assert!(kept >= 1, "the merges overtook the uploads, and left their inputs' files to the publish");
    let tables_dir = root.path().join("data").join("state").join("tables");
    for id in before.iter().filter(|id| !after.contains(id)) {
        let left: Vec<_> = ["links", "thresholds", "forward"]
            .iter()
            .flat_map(|tree| ["data", "meta"].map(|ext| tables_dir.join(tree).join(format!("{id}.{ext}"))))
            .filter(|path| path.exists())
            .collect();
        assert!(left.is_empty(), "a retired table's files outlived the publish: {left:?}");
    }
    let manifest = Manifest::decode(&name, &bucket.get(&format!("manifests/{name}")).await.unwrap()).unwrap();
    for table in &manifest.tables {
        let key = format!("tables/{}/{}.data", table.tree, table.id);
        assert_eq!(bucket.get(&key).await.unwrap().len() as u64, table.data_len, "{key}");
    }
    assert_eq!(as_sets(answers(&index).await), model(1500));
}

/// A writer settles its trees after a window in which it flushed little (a live writer) or
/// nothing (an import gone quiet), not after one in which it flushed more than tier 0 holds, and
/// again when it finishes: each tree's tier 0 ends as one run, with the answers of a plain import.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_quiet_or_finishing_writer_settles_tier_zero() {
    use std::sync::atomic::Ordering::Relaxed;
    let runtime = tokio::runtime::Handle::current();
    let expected = plain_import_answers(&runtime).await;
    let root = tempfile::tempdir().unwrap();
    let mut small_tier_zero = options();
    // Tier 0 holds runs under 16 KiB (every flushed delta here) and a full tier is out of
    // reach: only settling merges.
    small_tier_zero.compaction.min_run_bytes = 16;
    small_tier_zero.compaction.fan_in = 1 << 10;
    let store = Arc::new(DirStore::new(root.path().join("bucket")));
    let index = Arc::new(Index::open(root.path(), store, small_tier_zero, 9).unwrap());
    let now = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
    let clock_now = now.clone();
    let clock: backlinks::base::clock::Clock = Arc::new(move || clock_now.load(Relaxed));
    let options = WriterOptions { publish_every_ms: None, settle_window_ms: Some(60_000), ..WriterOptions::default() };
    let mut writer = Writer::start(index.clone(), None, clock, options, runtime.clone()).await.unwrap();
    let text = events(1500);
    let lines = text.lines().collect::<Vec<_>>();
    let import = |writer: &Writer, lines: &[&str]| {
        let progress = backlinks::ingest::import_progress::ImportProgress::default();
        let flushed = &mut |_: &Index| {
            writer.flushed();
            Ok(())
        };
        tokio::task::block_in_place(|| {
            let text = lines.join("\n");
            backlinks::ingest::import_lines_with(writer.index(), text.as_bytes(), flushed, &progress).unwrap();
            writer.index().flush().unwrap();
            writer.flushed();
        });
    };
    let runs = |index: &Index| (index.links.runs().len(), index.thresholds.runs().len());
    let settled_within_30_s = async |index: &Index| {
        for _ in 0..600 {
            if runs(index) == (1, 1) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    import(&writer, &lines[..700]);
    let before = runs(&index);
    assert!(before.0 >= 4 && before.1 >= 4, "deltas before settling: {before:?}");
    assert!(index.counters.flush_bytes.load(Relaxed) > index.tier_zero_bytes(), "a fast window");
    now.fetch_add(59_999, Relaxed);
    writer.tick().await.unwrap();
    now.fetch_add(1, Relaxed);
    writer.tick().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&index), before, "no settle while the window is open, nor after a fast one");
    now.fetch_add(60_000, Relaxed);
    writer.tick().await.unwrap();
    assert!(settled_within_30_s(&index).await, "a writer gone quiet settled its trees: {:?}", runs(&index));
    import(&writer, &lines[700..720]);
    assert_eq!(runs(&index).0, 2, "one small flush: {:?}", runs(&index));
    now.fetch_add(60_000, Relaxed);
    writer.tick().await.unwrap();
    assert!(settled_within_30_s(&index).await, "a slow writer settled its trees: {:?}", runs(&index));
    import(&writer, &lines[720..]);
    assert!(runs(&index).0 >= 3, "new deltas after the settle: {:?}", runs(&index));
    let finished = writer.finish().await.unwrap();
    assert!(finished.merges >= 3);
    assert_eq!(runs(&index), (1, 1), "a finishing writer settled its trees");
    assert!(index.forward.runs().len() <= 1);
    assert_eq!(answers(&index).await, expected);
}
