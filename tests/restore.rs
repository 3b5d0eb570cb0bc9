//! A machine rebuilt from the bucket alone answers exactly like the writer, and a replica that
//! follows CURRENT sees what the writer publishes next. Table data is read by range from the
//! bucket (the restored machines have metas only), and a server that only reads fetches metas a
//! piece at a time as its queries need them.

mod support;

use backlinks::constellation::many;
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::lsm::table::TableOptions;
use backlinks::model::ids::TreeKind;
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::store::faulty::{FaultyStore, Operation};
use backlinks::store::object::Store;
use std::path::Path;
use std::sync::Arc;

const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";

fn options() -> IndexOptions {
    IndexOptions {
        memtable_bytes: 64 * 64,
        table: TableOptions { frame_bytes: 512, ..TableOptions::default() },
        compaction: CompactionOptions {
            fan_in: 3,
            min_run_bytes: 256,
            shard_bytes: 1024,
            max_bytes_per_sec: None,
            ..CompactionOptions::default()
        },
        ..IndexOptions::default()
    }
}

/// Likes, follows, deletes and an account deletion over a few authors and posts.
fn events(from: usize, to: usize) -> String {
    let mut out = String::new();
    for i in from..to {
        let author = format!("did:plc:author{:018}", i % 23);
        let post = format!("at://did:plc:poster{:018}/app.bsky.feed.post/3kabcdefgh{:03}", i % 7, i % 5);
        let rkey = backlinks::model::tid::format_tid(1_700_000_000_000_000 + i as u64 * 1_000);
        let line = match i % 11 {
            10 => format!(
                r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"operation":"delete","collection":"app.bsky.feed.like","rkey":"{}"}}}}"#,
                backlinks::model::tid::format_tid(1_700_000_000_000_000 + (i as u64 - 3) * 1_000)
            ),
            7 => format!(
                r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"operation":"create","collection":"app.bsky.graph.follow","rkey":"{rkey}","record":{{"subject":"did:plc:poster{:018}"}}}}}}"#,
                i % 7
            ),
            // A reply: two links, so the forward tree has tables to restore too.
            9 => {
                let root = format!("at://did:plc:poster{:018}/app.bsky.feed.post/3kabcdefgh000", i % 7);
                let cid = "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em";
                format!(
                    r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"operation":"create","collection":"app.bsky.feed.post","rkey":"{rkey}","record":{{"text":"re","reply":{{"root":{{"uri":"{root}","cid":"{cid}"}},"parent":{{"uri":"{post}","cid":"{cid}"}}}}}}}}}}"#
                )
            }
            _ => format!(
                r#"{{"did":"{author}","time_us":{i},"kind":"commit","commit":{{"operation":"create","collection":"app.bsky.feed.like","rkey":"{rkey}","record":{{"subject":{{"uri":"{post}","cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}}}}}}}}"#
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    if to > 300 {
        out.push_str(r#"{"did":"did:plc:author000000000000000003","time_us":999999,"kind":"account","account":{"active":false,"did":"did:plc:author000000000000000003","seq":1,"status":"deleted","time":"2024-01-01T00:00:00Z"}}"#);
        out.push('\n');
    }
    out
}

fn targets() -> Vec<String> {
    let mut targets: Vec<String> = (0..7)
        .flat_map(|p| (0..5).map(move |r| format!("at://did:plc:poster{p:018}/app.bsky.feed.post/3kabcdefgh{r:03}")))
        .collect();
    targets.extend((0..7).map(|p| format!("did:plc:poster{p:018}")));
    targets.push("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j".into());
    targets.push("did:plc:anc6s2kher6ltrhhglxrzxsa".into());
    targets
}

/// Every target's full answer, paging with a small limit, and for each post the replies to
/// threads rooted there with their parents (getManyToMany, from the forward tree).
async fn answers(index: &Index) -> Vec<Vec<(String, String)>> {
    let mut all = Vec::new();
    for target in targets().into_iter().filter(|t| t.contains("/app.bsky.feed.post/")) {
        let pairs = [
            ("subject", target.as_str()),
            ("source", "app.bsky.feed.post:reply.root.uri"),
            ("pathToOther", "reply.parent.uri"),
            ("limit", "1000"),
        ];
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let params = many::parse_many_query(&pairs, "linkDid").unwrap();
        let page = many::get_many_to_many(index, &params).await.unwrap();
        all.push(vec![(target, page.to_string())]);
    }
    for target in targets() {
        let mut items = Vec::new();
        let mut params = ListParams { limit: 7, ..ListParams::new(target.clone()) };
        loop {
            let page = list_backlinks(index, &params).await.unwrap();
            items.extend(page.items);
            match page.cursor {
                Some(c) => params.cursor = Some(backlinks::query::Cursor::decode(&c).unwrap()),
                None => break,
            }
        }
        all.push(items);
        all.push(did_pages(index, &target).await);
    }
    all
}

/// Every page of a target's linking DIDs (three a page; a count reads at most 16 entries whole,
/// so hot targets page their account tallies).
async fn did_pages(index: &Index, target: &str) -> Vec<(String, String)> {
    let options = backlinks::count::CountOptions { exact_scan_limit: 16 };
    let mut params = ListParams { limit: 3, ..ListParams::new(target) };
    let mut pages = Vec::new();
    for _ in 0..10_000 {
        let page = backlinks::constellation::get_backlink_dids(index, &params, options).await.unwrap();
        pages.push((target.to_string(), page.to_string()));
        match page["cursor"].as_str() {
            Some(c) => params.cursor = Some(backlinks::query::Cursor::decode(c).unwrap()),
            None => return pages,
        }
    }
    panic!("{target}: the DID pages never ended");
}

fn open(dir: &Path, store: Arc<dyn Store>) -> Index {
    Index::open(dir, store, options(), 5).unwrap()
}

fn ingest(index: &Index, text: &str, runtime: &tokio::runtime::Handle) {
    import_lines(index, text.as_bytes()).unwrap();
    while index.compact_once(runtime, &|| 1).unwrap() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_the_bucket_alone_and_follow_as_a_replica() {
    let root = tempfile::tempdir().unwrap();
    restore_and_follow(Arc::new(DirStore::new(root.path().join("bucket"))), root.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_garage_alone_and_follow_as_a_replica() {
    let root = tempfile::tempdir().unwrap();
    let store = backlinks::store::s3::S3Store::new(support::garage_settings("restore")).unwrap();
    restore_and_follow(Arc::new(store), root.path()).await;
}

async fn restore_and_follow(bucket: Arc<dyn Store>, root: &Path) {
    let writer = Arc::new(open(&root.join("writer"), bucket.clone()));
    let capture = std::fs::read_to_string(CAPTURE).unwrap();
    let first = format!("{capture}{}", events(0, 400));
    let handle = tokio::runtime::Handle::current();
    let w = writer.clone();
    tokio::task::spawn_blocking(move || ingest(&w, &first, &handle)).await.unwrap();
    assert!(writer.counters.compactions.load(std::sync::atomic::Ordering::Relaxed) >= 1, "the workload compacts");
    writer.publish_manifest().await.unwrap();
    let expected = answers(&writer).await;

    assert!(expected.iter().filter(|a| !a.is_empty()).count() >= 30, "most targets have backlinks");
    let threads = expected.iter().filter(|a| a.len() == 1 && a[0].1.contains("linkRecord")).count();
    assert!(threads >= 7, "replies to every poster's first post ({threads})");

    // A new machine with an empty data directory and only the bucket.
    let restored = open(&root.join("restored"), bucket.clone());
    assert!(restored.restore_if_empty(2).await.unwrap());

    assert!(
        !std::fs::read_dir(root.join("restored/state/tables/links"))
            .unwrap()
            .any(|e| { e.unwrap().path().extension().is_some_and(|x| x == "data") }),
        "a restored machine fetches data by range, it does not download tables"
    );
    assert_eq!(answers(&restored).await, expected, "restored answers differ");
    assert_eq!(restored.position(), writer.position());

    // A replica follows CURRENT: it sees the writer's next publication.
    let replica = open(&root.join("replica"), bucket.clone());
    assert!(replica.restore_if_empty(3).await.unwrap());
    assert!(!replica.follow_current(4).await.unwrap(), "nothing new yet");
    let more = events(400, 700);
    let (w, handle) = (writer.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || ingest(&w, &more, &handle)).await.unwrap();
    writer.publish_manifest().await.unwrap();
    let expected = answers(&writer).await;
    assert_ne!(answers(&replica).await, expected, "the replica has not followed yet");
    assert!(replica.follow_current(5).await.unwrap());
    assert_eq!(answers(&replica).await, expected, "replica answers differ after following");

    // GC after the grace period removes what compaction retired; readers of the current
    // manifest lose nothing.
    let (retired, orphans) = writer.collect_garbage(10, 0).await.unwrap();
    assert!(retired > 0, "compaction retired tables that GC collects");
    assert_eq!(orphans, 0);
    assert_eq!(answers(&replica).await, expected, "replica answers changed after GC");
    assert_eq!(answers(&writer).await, expected, "writer answers changed after GC");
}

/// A publish that carries more new strings than one outline range may hold (8 MiB of rows here:
/// 5,000 DIDs of 1,900 bytes) cuts them into several ranges, and a restore reads every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_new_strings_are_published_in_bounded_ranges() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    let long_did = |i: usize| format!("did:web:{}", format!("{i:06}.").repeat(270).trim_end_matches('.'));
    assert!(long_did(1).len() > 1_850 && long_did(1).len() <= 2_048);
    let mut lines = String::new();
    for i in 0..5_000 {
        let rkey = backlinks::model::tid::format_tid(1_700_000_000_000_000 + i as u64);
        lines.push_str(&format!(
            r#"{{"did":"did:plc:follower{:016}","time_us":{},"kind":"commit","commit":{{"operation":"create","collection":"app.bsky.graph.follow","rkey":"{rkey}","record":{{"subject":"{}"}}}}}}"#,
            i % 3,
            i + 1,
            long_did(i)
        ));
        lines.push('\n');
    }
    let writer = Arc::new(open(&root.path().join("writer"), bucket.clone()));
    let (w, handle) = (writer.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || ingest(&w, &lines, &handle)).await.unwrap();
    writer.publish_manifest().await.unwrap();
    let did_ranges = bucket.list("outlines/did/").await.unwrap();
    assert!(did_ranges.len() >= 2, "5,000 long DIDs fill more than one range: {did_ranges:?}");
    assert!(did_ranges.iter().all(|range| range.size < 4 << 20), "each range is a bounded chunk");

    let restored = open(&root.path().join("restored"), bucket.clone());
    assert!(restored.restore_if_empty(2).await.unwrap());
    for i in [0, 2_500, 4_999] {
        let params = ListParams::new(long_did(i));
        let (want, got) =
            (list_backlinks(&writer, &params).await.unwrap(), list_backlinks(&restored, &params).await.unwrap());
        assert_eq!(got.items.len(), 1, "DID {i} has its follower after the restore");
        assert_eq!(got.items, want.items);
    }
}

/// A flush's job runs without the writer: operations applied meanwhile go to fresh memtables,
/// every answer sees both, and after a reopen everything is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_background_flush_are_answered_and_kept() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    let reference = Arc::new(open(&root.path().join("reference"), bucket.clone()));
    let r = reference.clone();
    tokio::task::spawn_blocking(move || import_lines(&r, events(0, 600).as_bytes()).unwrap()).await.unwrap();
    let expected = answers(&reference).await;

    let dir = root.path().join("index");
    let index = Arc::new(open(&dir, Arc::new(DirStore::new(root.path().join("other")))));
    let i = index.clone();
    tokio::task::spawn_blocking(move || {
        import_lines(&i, events(0, 300).as_bytes()).unwrap();
        let job = i.begin_flush().unwrap();
        std::thread::scope(|scope| {
            let finishing = scope.spawn(move || job.finish());
            // import_lines' own flushes wait at the gate until the job above is done.
            import_lines(&i, events(300, 600).as_bytes()).unwrap();
            finishing.join().unwrap().unwrap();
        });
    })
    .await
    .unwrap();
    assert_eq!(answers(&index).await, expected, "answers with writes made during the flush");
    assert_eq!(index.position(), reference.position());
    drop(index);
    let reopened = open(&dir, Arc::new(DirStore::new(root.path().join("other"))));
    assert_eq!(answers(&reopened).await, expected, "answers after a reopen");
}

/// Bytes of table metas the replica read from `store`, by its log (whole gets counted at the
/// size the bucket holds).
async fn meta_bytes_read(store: &FaultyStore<DirStore>) -> u64 {
    let sizes: std::collections::HashMap<String, u64> =
        store.inner().list("tables/").await.unwrap().into_iter().map(|o| (o.key, o.size)).collect();
    let metas = store.log().into_iter().filter(|r| r.key.ends_with(".meta"));
    metas
        .map(|r| match (r.operation, r.range) {
            (Operation::GetRange, Some((_, len))) => len,
            (Operation::Get, _) => sizes[&r.key],
            _ => 0,
        })
        .sum()
}

/// Files of `ext` among the replica's local tables.
fn local_files(root: &Path, ext: &str) -> usize {
    let trees = TreeKind::ALL.map(|tree| root.join("state/tables").join(tree.name()));
    let files = trees.iter().flat_map(|dir| std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()));
    files.filter(|path| path.extension().is_some_and(|x| x == ext)).count()
}

/// A server that only reads, given an empty data directory, answers (correctly) once it has the
/// manifest and each table's directory: the filter pages and index chunks its queries read are
/// fetched as they read them, kept locally, and a writer later completes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_answers_before_it_has_fetched_every_meta() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    // Few, large tables of small frames: metas of many index chunks, of which a query reads few.
    let options = || IndexOptions {
        memtable_bytes: 256 << 10,
        table: TableOptions { frame_bytes: 128, ..TableOptions::default() },
        // Hot targets: their DID pages are range reads of the account tallies' index chunks.
        hot_target_entries: 64,
        compaction: CompactionOptions { shard_bytes: 64 << 20, ..options().compaction },
        ..options()
    };
    let writer = Arc::new(Index::open(&root.path().join("writer"), bucket.clone(), options(), 5).unwrap());
    let workload = format!("{}{}", std::fs::read_to_string(CAPTURE).unwrap(), events(0, 20_000));
    let (w, handle) = (writer.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || ingest(&w, &workload, &handle)).await.unwrap();
    writer.publish_manifest().await.unwrap();
    let expected = answers(&writer).await;
    let posts = targets();
    let post = writer.lookup_target(&backlinks::model::syntax::parse_target(&posts[0]).unwrap()).unwrap().unwrap();
    assert!(writer.tallies_of(post).await.unwrap().is_some(), "the posts are hot");
    let total_meta: u64 =
        bucket.list("tables/").await.unwrap().iter().filter(|o| o.key.ends_with(".meta")).map(|o| o.size).sum();

    let counted = Arc::new(FaultyStore::new(DirStore::new(root.path().join("bucket")), 1, vec![]));
    let replica_dir = root.path().join("replica");
    let replica = Index::open(&replica_dir, counted.clone(), options(), 5).unwrap();
    assert!(replica.restore_on_demand_if_empty(2).await.unwrap());
    let tables = local_files(&replica_dir, "part");
    assert!(tables >= 4, "the replica holds partial metas ({tables})");
    assert_eq!(local_files(&replica_dir, "meta"), 0, "and no whole one");
    let local = backlinks::verify::verify_local(&replica_dir).await.unwrap();
    assert!(local.is_clean(), "partial copies are not missing metas:\n{}", local.render());
    let after_restore = meta_bytes_read(&counted).await;
    assert!(after_restore * 2 < total_meta, "the restore read {after_restore} of {total_meta} meta bytes");

    let first = ListParams::new(targets()[0].clone());
    let (want, got) = (list_backlinks(&writer, &first).await.unwrap(), list_backlinks(&replica, &first).await.unwrap());
    assert!(!got.items.is_empty());
    assert_eq!(got.items, want.items, "the first answer is the writer's");
    let after_first = meta_bytes_read(&counted).await;
    assert!(after_first < total_meta, "one query read {after_first} of {total_meta} meta bytes: not all of them");
    assert_eq!(answers(&replica).await, expected, "every answer is the writer's");

    // A restart forgets the pieces fetched (the resident parts stay) and answers the same.
    drop(replica);
    let replica = Index::open(&replica_dir, counted.clone(), options(), 5).unwrap();
    assert_eq!(answers(&replica).await, expected, "answers after a restart");
    // A writer starting from this directory first fetches every meta whole.
    assert_eq!(replica.complete_partial_metas().await.unwrap(), tables);
    assert_eq!((local_files(&replica_dir, "part"), local_files(&replica_dir, "meta")), (0, tables));
    assert_eq!(answers(&replica).await, expected, "answers from completed metas");
    drop(replica);
    let replica = Index::open(&replica_dir, counted.clone(), options(), 5).unwrap();
    assert_eq!(answers(&replica).await, expected, "answers from completed metas after a restart");
}

/// A piece of a meta that fails its checksum when a replica fetches it fails the query naming
/// the meta, and is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_meta_piece_fails_the_query_and_is_not_kept() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    let writer = Arc::new(open(&root.path().join("writer"), bucket.clone()));
    let (w, handle, workload) = (writer.clone(), tokio::runtime::Handle::current(), events(0, 400));
    tokio::task::spawn_blocking(move || ingest(&w, &workload, &handle)).await.unwrap();
    writer.publish_manifest().await.unwrap();
    let target = targets()[0].clone();
    let want = list_backlinks(&writer, &ListParams::new(target.clone())).await.unwrap();

    let replica = Index::open(&root.path().join("replica"), bucket.clone(), options(), 5).unwrap();
    assert!(replica.restore_on_demand_if_empty(2).await.unwrap());
    // Every byte after each links meta's resident part flipped: filter pages and index chunks.
    let metas = bucket.list("tables/links/").await.unwrap().into_iter().filter(|o| o.key.ends_with(".meta"));
    let mut originals = Vec::new();
    for meta in metas {
        let path = root.path().join("bucket").join(&meta.key);
        let bytes = std::fs::read(&path).unwrap();
        let resident = backlinks::lsm::table::resident_len::<backlinks::model::ids::Backlink>(&bytes).unwrap() as usize;
        let mut flipped = bytes.clone();
        flipped[resident..].iter_mut().for_each(|b| *b ^= 0x55);
        std::fs::write(&path, flipped).unwrap();
        originals.push((path, bytes));
    }
    let error = list_backlinks(&replica, &ListParams::new(target.clone())).await.unwrap_err().to_string();
    assert!(error.contains("corrupt object tables/links/") && error.contains(".meta"), "{error}");
    // Repaired, the same replica answers: nothing of the corrupt pieces was kept.
    originals.iter().for_each(|(path, bytes)| std::fs::write(path, bytes).unwrap());
    assert_eq!(list_backlinks(&replica, &ListParams::new(target)).await.unwrap().items, want.items);
}

/// A meta whose header declares other lengths than the manifest gives (here another table's
/// meta, valid in itself) fails the restore on demand before its copy is written or the catalog
/// moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meta_of_other_lengths_fails_the_restore_on_demand_before_its_copy_is_written() {
    let root = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Store> = Arc::new(DirStore::new(root.path().join("bucket")));
    let writer = Arc::new(open(&root.path().join("writer"), bucket.clone()));
    let (w, handle, workload) = (writer.clone(), tokio::runtime::Handle::current(), events(0, 400));
    tokio::task::spawn_blocking(move || ingest(&w, &workload, &handle)).await.unwrap();
    writer.publish_manifest().await.unwrap();
    let mut metas: Vec<_> =
        bucket.list("tables/links/").await.unwrap().into_iter().filter(|o| o.key.ends_with(".meta")).collect();
    metas.sort_by_key(|o| o.size);
    let (small, large) = (&metas[0], &metas[metas.len() - 1]);
    assert_ne!(small.size, large.size);
    let path = |key: &str| root.path().join("bucket").join(key);
    std::fs::copy(path(&large.key), path(&small.key)).unwrap();

    let replica_dir = root.path().join("replica");
    let replica = Index::open(&replica_dir, bucket.clone(), options(), 5).unwrap();
    let error = replica.restore_on_demand_if_empty(2).await.unwrap_err().to_string();
    assert!(error.contains(&small.key), "{error}");
    let id = small.key.trim_start_matches("tables/links/").trim_end_matches(".meta");
    let written = std::fs::read_dir(replica_dir.join("state/tables/links")).unwrap().map(|e| e.unwrap().file_name());
    assert!(!written.into_iter().any(|name| name.to_string_lossy().starts_with(id)), "its copy was written");
    assert!(replica.catalog.tables().unwrap().is_empty(), "the catalog did not move");
}

/// An account event of `did` with `status` (`active` shows the account again).
fn account_event(did: &str, status: &str, time_us: usize) -> String {
    let active = status == "active";
    format!(
        r#"{{"did":"{did}","time_us":{time_us},"kind":"account","account":{{"active":{active},"did":"{did}","seq":{time_us},"status":"{status}","time":"2024-01-01T00:00:00Z"}}}}"#
    ) + "\n"
}

/// Whether each of `dids` is hidden, as `index` says.
fn hidden_of(index: &Index, dids: &[String]) -> Vec<bool> {
    dids.iter().map(|did| index.account_state(did).unwrap().is_some_and(|state| state.is_hidden())).collect()
}

/// The account log objects a replica fetched since its log was last cleared.
fn account_objects_fetched(store: &FaultyStore<DirStore>) -> Vec<String> {
    let fetched = store.log().into_iter().filter(|r| r.key.starts_with("accounts/") && r.operation == Operation::Get);
    let keys: Vec<String> = fetched.map(|r| r.key.split_once('-').unwrap().0.to_string()).collect();
    store.clear_log();
    keys
}

/// Account states travel beside the manifest, not in it: a snapshot, then a range of the changes
/// of each publish, which a following replica fetches alone; once the changes outnumber the
/// snapshot the log starts over from a new one, and GC deletes the old objects after the grace
/// period. The replica hides exactly the accounts the writer hides at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_states_travel_as_a_log_a_replica_follows_by_its_changes() {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    // A log starts over past 100 changes here (65,536 by default): every rule of the default
    // holds at any minimum, and 65,536 account events take minutes with this test's tiny memtables.
    let rebase_min = 100;
    let options = IndexOptions { account_rebase_min_changes: rebase_min, ..options() };
    let writer = Index::open(&root.path().join("writer"), Arc::new(DirStore::new(bucket.clone())), options, 5).unwrap();
    let replica_store = Arc::new(FaultyStore::new(DirStore::new(bucket.clone()), 1, vec![]));
    let replica = open(&root.path().join("replica"), replica_store.clone());
    let authors: Vec<String> = (0..23).map(|i| format!("did:plc:author{i:018}")).collect();
    let statuses = ["deactivated", "suspended", "takendown"];
    let mut first = events(0, 200);
    (0..12).for_each(|i| first.push_str(&account_event(&authors[i], statuses[i % 3], 10_000 + i)));
    import_lines(&writer, first.as_bytes()).unwrap();
    writer.publish_manifest().await.unwrap();
    let (_, manifest) = writer.current_manifest().await.unwrap().unwrap();
    assert!(manifest.hidden_accounts.is_empty(), "the manifest lists no account");
    let log = manifest.accounts.clone().unwrap();
    assert_eq!((log.snapshot.count, log.changes.len()), (12, 0), "{log:?}");

    assert!(replica.restore_on_demand_if_empty(1).await.unwrap());
    assert_eq!(account_objects_fetched(&replica_store), ["accounts/snapshot"]);
    assert_eq!(hidden_of(&replica, &authors), hidden_of(&writer, &authors));
    assert_eq!(hidden_of(&writer, &authors).iter().filter(|h| **h).count(), 12);

    // Four shown again, one deleted, three more hidden: one range of eight changes.
    let mut second = events(200, 260);
    (0..4).for_each(|i| second.push_str(&account_event(&authors[i], "active", 20_000 + i)));
    second.push_str(&account_event(&authors[5], "deleted", 20_010));
    (12..15).for_each(|i| second.push_str(&account_event(&authors[i], "suspended", 20_020 + i)));
    import_lines(&writer, second.as_bytes()).unwrap();
    writer.publish_manifest().await.unwrap();
    assert!(replica.follow_current(2).await.unwrap());
    assert_eq!(account_objects_fetched(&replica_store), ["accounts/changes"], "only the new range");
    assert_eq!(hidden_of(&replica, &authors), hidden_of(&writer, &authors));
    assert_eq!(hidden_of(&writer, &authors).iter().filter(|h| **h).count(), 12 - 4 - 1 + 3);
    let (_, manifest) = writer.current_manifest().await.unwrap().unwrap();
    assert_eq!(manifest.accounts.as_ref().unwrap().changes.iter().map(|r| r.count).collect::<Vec<_>>(), [8]);

    // More changes than the snapshot holds and than a log takes before it starts over.
    let many = rebase_min as usize + 10;
    let mut third: String =
        (0..many).map(|i| account_event(&format!("did:plc:many{i:020}"), "deactivated", 30_000 + i)).collect();
    third.push_str(&account_event(&authors[13], "active", 30_000 + many));
    import_lines(&writer, third.as_bytes()).unwrap();
    writer.publish_manifest().await.unwrap();
    let (_, manifest) = writer.current_manifest().await.unwrap().unwrap();
    let log = manifest.accounts.clone().unwrap();
    assert_eq!((log.snapshot.count as usize, log.changes.len()), (12 - 4 - 1 + 3 - 1 + many, 0), "a new snapshot");
    assert!(replica.follow_current(3).await.unwrap());
    assert_eq!(account_objects_fetched(&replica_store), ["accounts/snapshot"]);
    let sample: Vec<String> =
        (0..many).step_by(7).map(|i| format!("did:plc:many{i:020}")).chain(authors.clone()).collect();
    assert_eq!(hidden_of(&replica, &sample), hidden_of(&writer, &sample));

    // The first snapshot and the range are no manifest's now: kept for the grace period, then
    // deleted; the current snapshot stays.
    let in_bucket = || std::fs::read_dir(bucket.join("accounts")).unwrap().count();
    assert_eq!(in_bucket(), 3);
    writer.collect_garbage(1_000, 500).await.unwrap();
    assert_eq!(in_bucket(), 3, "in their grace period");
    let (_, removed) = writer.collect_garbage(1_600, 500).await.unwrap();
    assert_eq!((removed, in_bucket()), (2, 1));
    let restored = open(&root.path().join("restored"), Arc::new(DirStore::new(bucket.clone())));
    assert!(restored.restore_if_empty(4).await.unwrap());
    assert_eq!(hidden_of(&restored, &sample), hidden_of(&writer, &sample));
}
