//! The engine against a reference model: a plain map of live records and their links, fed the
//! same seeded random operations (as Jetstream events), with flushes at random points. After every
//! check, listBacklinks (paged with random limits, both directions) must equal the model exactly,
//! in order, with no skipped or repeated backlink, and the live forward links of every record
//! must equal the links it was last written with (records written with more than one). Targets
//! of three entries are hot: after a flush, a hot target's tallies and its count must equal the
//! model's live links by source collection and location, and its linking DIDs, paged, the
//! model's accounts, each once.

mod support;

use backlinks::constellation::get_backlink_dids;
use backlinks::constellation::many::forward_links;
use backlinks::count::{CountOptions, count_backlinks};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::jetstream::parse_event;
use backlinks::lsm::compaction::CompactionOptions;
use backlinks::lsm::table::{PageUse, TableOptions};
use backlinks::model::ids::{RecordId, Revocation, Tally};
use backlinks::model::syntax::parse_target;
use backlinks::model::tid::format_tid;
use backlinks::outline::OutlineKind;
use backlinks::query::{Cursor, ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use support::model::{Model, RecordKey};

const DIDS: usize = 5;
const RKEYS: usize = 12;
const COLLECTIONS: [&str; 3] = ["app.bsky.feed.like", "app.bsky.feed.post", "com.example.thing"];
const FIELDS: [&str; 3] = ["subject", "other", "list"];

fn did(i: usize) -> String {
    format!(
        "did:plc:{}",
        "abcdefghijklmnopqrstuvwx"
            .chars()
            .map(|c| ((c as u8 - b'a' + i as u8) % 26 + b'a') as char)
            .collect::<String>()
    )
}

fn rkey(i: usize) -> String {
    // Mostly TIDs (inline), one outlined key.
    if i == RKEYS - 1 { "self".to_string() } else { format_tid(1_700_000_000_000_000 + (i as u64) * 1_000_003) }
}

/// Targets: a few posts and bare DIDs, and two URLs.
fn target(i: usize) -> String {
    match i % 3 {
        _ if i >= URL_TARGETS_FROM => format!("https://example.com/page/{i}"),
        0 => did(i % DIDS),
        _ => format!("at://{}/app.bsky.feed.post/{}", did(i % DIDS), rkey(i % (RKEYS - 1))),
    }
}
const TARGETS: usize = 9;
const URL_TARGETS_FROM: usize = 7;

#[derive(Debug, Clone)]
enum Op {
    Write {
        update: bool,
        did: usize,
        collection: usize,
        rkey: usize,
        links: Vec<(usize, usize)>,
    },
    Delete {
        did: usize,
        collection: usize,
        rkey: usize,
    },
    AccountDeleted {
        did: usize,
    },
    Deactivate {
        did: usize,
    },
    Activate {
        did: usize,
    },
    Flush,
    /// Compact until no tier is full.
    Compact,
    /// Merge each tree's tier 0 into one run, as a quiet or finishing writer does.
    Settle,
    /// Upload, publish a manifest, collect garbage.
    Publish,
    Check {
        target: usize,
        limit: usize,
        reverse: bool,
    },
    /// Flush, then compare a target's tallies (if hot) and count with the model.
    CheckCounts {
        target: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let record = (0..DIDS, 0..COLLECTIONS.len(), 0..RKEYS);
    prop_oneof![
        6 => (any::<bool>(), record.clone(), prop::collection::vec((0..TARGETS, 0..FIELDS.len()), 0..4))
            .prop_map(|(update, (did, collection, rkey), links)| Op::Write { update, did, collection, rkey, links }),
        2 => record.prop_map(|(did, collection, rkey)| Op::Delete { did, collection, rkey }),
        1 => (0..DIDS).prop_map(|did| Op::AccountDeleted { did }),
        1 => (0..DIDS).prop_map(|did| Op::Deactivate { did }),
        1 => (0..DIDS).prop_map(|did| Op::Activate { did }),
        1 => Just(Op::Flush),
        1 => Just(Op::Compact),
        1 => Just(Op::Settle),
        1 => Just(Op::Publish),
        2 => (0..TARGETS, 1..6usize, any::<bool>()).prop_map(|(target, limit, reverse)| Op::Check { target, limit, reverse }),
        1 => (0..TARGETS).prop_map(|target| Op::CheckCounts { target }),
    ]
}

/// A record's JSON: each link in a field; `list` fields are arrays, the others strong refs or
/// plain strings, so locations are `$.subject`, `$.other` and `$.list[]`.
fn record_json(links: &[(usize, usize)]) -> (serde_json::Value, BTreeSet<(String, String)>) {
    let mut record = serde_json::Map::new();
    let mut expected = BTreeSet::new();
    for (i, (t, f)) in links.iter().enumerate() {
        let uri = target(*t);
        let field = FIELDS[*f];
        match field {
            "list" => {
                let list = record.entry("list").or_insert_with(|| serde_json::json!([]));
                list.as_array_mut().unwrap().push(uri.clone().into());
                expected.insert((uri, "$.list[]".to_string()));
            }
            _ if record.contains_key(field) => {}
            _ if i % 2 == 0 && uri.starts_with("at://") => {
                record.insert(field.into(), serde_json::json!({"uri": uri, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}));
                expected.insert((uri, format!("$.{field}")));
            }
            _ => {
                record.insert(field.into(), uri.clone().into());
                expected.insert((uri, format!("$.{field}")));
            }
        }
    }
    record.insert("$type".into(), "com.example.record".into());
    (serde_json::Value::Object(record), expected)
}

/// A record of this test's universe as an at-uri.
fn record_uri(&(d, c, r): &RecordKey) -> String {
    format!("at://{}/{}/{}", did(d), COLLECTIONS[c], rkey(r))
}

struct Harness {
    dir: tempfile::TempDir,
    index: Index,
    model: Model,
    /// What the forward tree must hold live: the links of each record as last written, for
    /// records written with more than one (a create adds to what the record had, as in `model`;
    /// an update replaces it, and one with a single link leaves nothing).
    forward: BTreeMap<RecordKey, BTreeSet<(String, String)>>,
    time_us: i64,
    runtime: tokio::runtime::Runtime,
    options: IndexOptions,
}

impl Harness {
    fn new() -> Self {
        Self::with(Self::options())
    }

    fn with(options: IndexOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(DirStore::new(dir.path().join("bucket")));
        let index = Index::open(dir.path(), store, options.clone(), 7).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Harness { dir, index, model: Model::default(), forward: BTreeMap::new(), time_us: 1, runtime, options }
    }

    /// Tiny memtables, frames and tiers, so a short run flushes, spans frames, compacts through
    /// several tiers and shards its compacted runs.
    fn options() -> IndexOptions {
        IndexOptions {
            memtable_bytes: 64 * 40,
            table: TableOptions { frame_bytes: 256, ..TableOptions::default() },
            compaction: CompactionOptions {
                fan_in: 3,
                min_run_bytes: 64,
                shard_bytes: 300,
                frames_per_read: 2,
                max_bytes_per_sec: None,
                ..CompactionOptions::default()
            },
            hot_target_entries: 3,
            // Promotions read a target's backlinks and sort what they make a few at a time.
            promotion_entries: 4,
            ..IndexOptions::default()
        }
    }

    /// Flushes, closes and reopens the index from its data directory alone.
    fn reopen(&mut self) {
        self.flush();
        let store = Arc::new(DirStore::new(self.dir.path().join("bucket")));
        // Drop the old index (and its lock) before opening again.
        let placeholder = tempfile::tempdir().unwrap();
        let old = std::mem::replace(
            &mut self.index,
            Index::open(placeholder.path(), store.clone(), self.options.clone(), 1).unwrap(),
        );
        drop(old);
        self.index = Index::open(self.dir.path(), store, self.options.clone(), 8).unwrap();
    }

    fn apply_json(&mut self, event: serde_json::Value) {
        self.time_us += 1;
        let line = serde_json::to_vec(&event).unwrap();
        let event = parse_event(&line).unwrap();
        self.index.apply(&event.operation, Some(event.time_us)).unwrap();
        if self.index.wants_flush() {
            self.flush();
        }
    }

    /// Flushes, and checks that the flush's own reads (tallies: hot links, revocations, tallies,
    /// targets it may promote) left the caches as queries left them.
    fn flush(&mut self) {
        let before = self.index.memory_use();
        self.index.flush().unwrap();
        let after = self.index.memory_use();
        assert_eq!((after.meta_cache, after.frame_cache), (before.meta_cache, before.frame_cache), "a flush cached");
    }

    fn commit(
        &mut self,
        did_i: usize,
        operation: &str,
        collection: usize,
        rkey_i: usize,
        record: Option<serde_json::Value>,
    ) {
        let mut commit = serde_json::json!({"rev": "3l3qo2vutsw2b", "operation": operation, "collection": COLLECTIONS[collection], "rkey": rkey(rkey_i)});
        if let Some(record) = record {
            commit["record"] = record;
        }
        let time_us = self.time_us;
        self.apply_json(serde_json::json!({"did": did(did_i), "time_us": time_us, "kind": "commit", "commit": commit}));
    }

    fn account(&mut self, did_i: usize, active: bool, status: Option<&str>) {
        let time_us = self.time_us;
        let mut account =
            serde_json::json!({"active": active, "did": did(did_i), "seq": 1, "time": "2024-01-01T00:00:00Z"});
        if let Some(status) = status {
            account["status"] = status.into();
        }
        self.apply_json(
            serde_json::json!({"did": did(did_i), "time_us": time_us, "kind": "account", "account": account}),
        );
    }

    fn run(&mut self, op: &Op) {
        match op.clone() {
            Op::Write { update, did, collection, rkey, links } => {
                let (record, expected) = record_json(&links);
                self.commit(did, if update { "update" } else { "create" }, collection, rkey, Some(record));
                let key = (did, collection, rkey);
                if update {
                    self.forward.remove(&key);
                }
                if expected.len() > 1 {
                    self.forward.entry(key).or_default().extend(expected.iter().cloned());
                }
                let entry = self.model.records.entry(key).or_default();
                if update {
                    *entry = expected;
                } else {
                    entry.extend(expected);
                }
            }
            Op::Delete { did, collection, rkey } => {
                self.commit(did, "delete", collection, rkey, None);
                self.model.records.remove(&(did, collection, rkey));
                self.forward.remove(&(did, collection, rkey));
            }
            Op::AccountDeleted { did } => {
                self.account(did, false, Some("deleted"));
                self.model.delete_account(did);
                self.forward.retain(|(owner, _, _), _| *owner != did);
            }
            Op::Deactivate { did } => {
                self.account(did, false, Some("deactivated"));
                self.model.hidden.insert(did);
            }
            Op::Activate { did } => {
                self.account(did, true, None);
                self.model.hidden.remove(&did);
            }
            Op::Flush => self.flush(),
            Op::Compact => {
                self.time_us += 1;
                while self.index.compact_once(self.runtime.handle(), &|| self.time_us as u64).unwrap() {}
            }
            Op::Settle => {
                self.time_us += 1;
                while self.index.settle_once(self.runtime.handle(), &|| self.time_us as u64).unwrap() {}
            }
            Op::Publish => {
                self.time_us += 1;
                let now = self.time_us as u64;
                self.runtime.block_on(async {
                    self.index.publish_manifest().await.unwrap();
                    self.index.collect_garbage(now, 0).await.unwrap();
                });
            }
            Op::Check { target: t, limit, reverse } => {
                self.check(&target(t), limit, reverse);
                self.check_forward();
            }
            Op::CheckCounts { target: t } => {
                self.flush();
                self.check_counts(&target(t));
            }
        }
    }

    /// A hot target's tallies equal the model's live links by (source collection, location) and
    /// the accounts they come from, and for the whole target (its groups' sums); so does a count
    /// too hot to read (a scan limit of one entry); the first such count of a target not yet hot
    /// asks for its promotion, which the next flush makes. Each group's linking DIDs come out
    /// once each over all pages.
    fn check_counts(&mut self, target: &str) -> bool {
        let mut links: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (uri, location) in self.model.backlinks(target, record_uri) {
            let collection = uri.split('/').nth(3).unwrap().to_string();
            let account = uri.split('/').nth(2).unwrap().to_string();
            links.entry((collection, location)).or_default().push(account);
        }
        let accounts = |of: &mut dyn Iterator<Item = &String>| of.collect::<HashSet<_>>().len() as u64;
        let want: BTreeMap<(String, String), (u64, u64)> = links
            .iter()
            .map(|(group, from)| (group.clone(), (from.len() as u64, accounts(&mut from.iter()))))
            .collect();
        let sum = |of: fn(&(u64, u64)) -> u64| want.values().map(of).sum::<u64>();
        let want_whole = (sum(|figures| figures.0), sum(|figures| figures.1));
        let Some(id) = self.index.lookup_target(&parse_target(target).unwrap()).unwrap() else {
            assert!(want.is_empty(), "{target} has links but no id");
            return false;
        };
        let count_options = CountOptions { exact_scan_limit: 1 };
        let count =
            self.runtime.block_on(count_backlinks(&self.index, &ListParams::new(target), count_options)).unwrap();
        if !count.approximate {
            assert_eq!(count.total, want_whole.0, "count of {target}");
        }
        let Some(tallies) = self.runtime.block_on(self.index.tallies_of(id)).unwrap() else { return false };
        let name = |kind, id| self.index.outlines.resolve(kind, id).unwrap().unwrap().to_string();
        let (wholes, groups): (Vec<&Tally>, Vec<&Tally>) = tallies.iter().partition(|tally| tally.is_whole());
        let got: BTreeMap<(String, String), (u64, u64)> = groups
            .iter()
            .filter(|tally| tally.records > 0)
            .map(|t| {
                let group = (name(OutlineKind::Collection, t.collection), name(OutlineKind::Location, t.location));
                (group, (t.records, t.accounts))
            })
            .collect();
        assert_eq!(got, want, "tallies of {target}");
        let whole: Vec<(u64, u64)> = wholes.iter().map(|t| (t.records, t.accounts)).collect();
        assert_eq!(whole, [want_whole], "the whole tally of {target}");
        assert!(!count.approximate, "a hot target's count is exact");
        for ((collection, location), from) in &links {
            let linking: BTreeSet<&String> = from.iter().collect();
            let group = ListParams {
                collections: vec![collection.clone()],
                locations: vec![location.clone()],
                ..ListParams::new(target)
            };
            for (limit, reverse) in [(1, false), (2, true)] {
                let walked = self.linking_dids(ListParams { limit, reverse, ..group.clone() });
                let once: BTreeSet<&String> = walked.iter().collect();
                assert_eq!(
                    (walked.len(), &once),
                    (linking.len(), &linking),
                    "DIDs of {target} {location}, {limit} a page"
                );
            }
        }
        true
    }

    /// Every page of getBacklinkDids of a target counted from its tallies, each page exact.
    fn linking_dids(&self, mut params: ListParams) -> Vec<String> {
        let (options, target) = (CountOptions { exact_scan_limit: 1 }, params.target.clone());
        let mut dids = Vec::new();
        for _ in 0..10_000 {
            let page = self.runtime.block_on(get_backlink_dids(&self.index, &params, options)).unwrap();
            assert_eq!(page.get("approximate"), None, "{target}: {page}");
            dids.extend(page["linking_dids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()));
            match page["cursor"].as_str() {
                Some(cursor) => params.cursor = Some(Cursor::decode(cursor).unwrap()),
                None => return dids,
            }
        }
        panic!("the DID pages of {target} never ended");
    }

    /// Sort key of a model item as the engine orders them: (source id, location id).
    fn position(&self, (uri, location): &(String, String)) -> (RecordId, u64) {
        let source = self.index.lookup_target(&parse_target(uri).unwrap()).unwrap().unwrap();
        let location = self.index.outlines.lookup(OutlineKind::Location, location).unwrap().unwrap();
        (source, location)
    }

    /// The live forward links of every record of the universe equal what the forward model says
    /// (as ids: a URL target has no text in the index).
    fn check_forward(&self) {
        let keys: Vec<RecordKey> = (0..DIDS)
            .flat_map(|d| (0..COLLECTIONS.len()).flat_map(move |c| (0..RKEYS).map(move |r| (d, c, r))))
            .collect();
        let id = |uri: &str| self.index.lookup_target(&parse_target(uri).unwrap()).unwrap();
        let sources: Vec<RecordId> = keys.iter().filter_map(|key| id(&record_uri(key))).collect();
        let (live, _) = self.runtime.block_on(forward_links(&self.index, sources)).unwrap();
        let got: BTreeSet<(RecordId, RecordId, u64)> =
            live.values().flatten().map(|link| (link.source, link.target, link.location)).collect();
        let want: BTreeSet<(RecordId, RecordId, u64)> = self
            .forward
            .iter()
            .flat_map(|(key, links)| links.iter().map(move |link| (key, link)))
            .map(|(key, (target, location))| {
                let location = self.index.outlines.lookup(OutlineKind::Location, location).unwrap().unwrap();
                (id(&record_uri(key)).unwrap(), id(target).unwrap(), location)
            })
            .collect();
        assert_eq!(got, want, "live forward links");
    }

    fn check(&mut self, target: &str, limit: usize, reverse: bool) {
        let mut expected = self.model.backlinks(target, record_uri);
        expected.sort_by_key(|item| self.position(item));
        if !reverse {
            expected.reverse();
        }
        let mut got: Vec<(String, String)> = Vec::new();
        let mut cursor: Option<Cursor> = None;
        for _page in 0..1000 {
            let params = ListParams { limit, reverse, cursor, ..ListParams::new(target) };
            let page = self.runtime.block_on(list_backlinks(&self.index, &params)).unwrap();
            assert!(page.items.len() <= limit);
            if std::env::var("MODEL_DEBUG").is_ok() {
                eprintln!("page after {cursor:?}: {:?} next {:?}", page.items, page.cursor);
            }
            got.extend(page.items.iter().map(|(location, uri)| (uri.clone(), location.clone())));
            match page.cursor {
                Some(c) => cursor = Some(Cursor::decode(&c).unwrap()),
                None => break,
            }
        }
        assert_eq!(got, expected, "target {target}, limit {limit}, reverse {reverse}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(ops in prop::collection::vec(op(), 1..160)) {
        run_against_model(Harness::new(), &ops);
    }

    /// With no memory for meta pages or frames, every filter probe and index lookup reads its
    /// page again: the answers are the same.
    #[test]
    fn engine_matches_model_when_every_meta_read_misses(ops in prop::collection::vec(op(), 1..120)) {
        let options = IndexOptions { meta_cache_bytes: 0, frame_cache_bytes: 0, ..Harness::options() };
        run_against_model(Harness::with(options), &ops);
    }

    /// Merges that may hold only the few newest revocations drop and settle what those allow,
    /// and leave the rest for queries to filter: the answers are the same.
    #[test]
    fn engine_matches_model_when_merges_hold_few_revocations(
        ops in prop::collection::vec(op(), 1..160),
        max_thresholds in 0usize..6,
    ) {
        let mut options = Harness::options();
        options.compaction.max_thresholds = max_thresholds;
        run_against_model(Harness::with(options), &ops);
    }
}

/// Runs `ops` on the engine and the model, checking every target's pages, across a reopen.
fn run_against_model(mut harness: Harness, ops: &[Op]) {
    for op in ops {
        harness.run(op);
    }
    for t in 0..TARGETS {
        for (limit, reverse) in [(1, false), (3, true), (100, false)] {
            harness.check(&target(t), limit, reverse);
        }
    }
    harness.check_forward();
    harness.index.flush().unwrap();
    let hot_before: Vec<bool> = (0..TARGETS).map(|t| harness.check_counts(&target(t))).collect();
    // Everything survives a reopen from the data directory, and ingest continues after it.
    harness.reopen();
    let hot_after: Vec<bool> = (0..TARGETS).map(|t| harness.check_counts(&target(t))).collect();
    // Checks before the reopen may have asked for promotions, which its flush made.
    let kept = hot_before.iter().zip(&hot_after).all(|(before, after)| !before || *after);
    assert!(kept, "hot targets after a reopen: {hot_before:?} then {hot_after:?}");
    for t in 0..TARGETS {
        harness.check(&target(t), 2, t % 2 == 0);
    }
    harness.check_forward();
    for op in ops.iter().take(20) {
        harness.run(op);
    }
    for t in 0..TARGETS {
        harness.check(&target(t), 4, t % 2 == 1);
    }
    harness.check_forward();
    harness.index.flush().unwrap();
    for t in 0..TARGETS {
        harness.check_counts(&target(t));
    }
}

/// A fixed workload that must compact through two generations (compacted runs merged again) into
/// sharded runs, with answers equal to the model after every step and after GC.
#[test]
fn compaction_generations_keep_answers() {
    let mut harness = Harness::new();
    let mut state = 11u64;
    let mut next = |n: usize| (backlinks::base::rng::splitmix64(&mut state) % n as u64) as usize;
    let mut second_generation = false;
    for step in 0..600 {
        let op = match next(10) {
            0 => Op::Delete { did: next(DIDS), collection: next(3), rkey: next(RKEYS) },
            1 => Op::Write {
                update: true,
                did: next(DIDS),
                collection: next(3),
                rkey: next(RKEYS),
                links: vec![(next(TARGETS), 0)],
            },
            _ => Op::Write {
                update: false,
                did: next(DIDS),
                collection: next(3),
                rkey: next(RKEYS),
                links: vec![(next(TARGETS), next(3)), (next(TARGETS), 1)],
            },
        };
        harness.run(&op);
        if step % 15 == 14 {
            harness.run(&Op::Flush);
            // A compaction may cascade (its output completes another tier), so look at which
            // compacted runs are gone afterwards rather than at the first pick alone.
            let compacted = |runs: &[Arc<backlinks::lsm::run::Run<backlinks::model::ids::Backlink>>]| -> Vec<String> {
                runs.iter()
                    .filter(|r| r.kind == backlinks::lsm::record::RunKind::Compacted)
                    .map(|r| r.id.clone())
                    .collect()
            };
            let before = compacted(&harness.index.links.runs());
            harness.run(&Op::Compact);
            let after = harness.index.links.runs().iter().map(|r| r.id.clone()).collect::<Vec<_>>();
            second_generation |= before.iter().any(|id| !after.contains(id));
            harness.run(&Op::Check { target: next(TARGETS), limit: 3, reverse: next(2) == 0 });
        }
        if step % 100 == 99 {
            harness.run(&Op::Publish);
        }
    }
    let runs = harness.index.links.runs();
    assert!(second_generation, "no compaction merged an already compacted run");
    assert!(
        runs.iter().any(|r| r.shard_count() > 1),
        "no sharded run: {:?}",
        runs.iter().map(|r| r.shard_count()).collect::<Vec<_>>()
    );
    assert!(harness.index.counters.compactions.load(std::sync::atomic::Ordering::Relaxed) >= 4);
    for t in 0..TARGETS {
        harness.check(&target(t), 2, false);
        harness.check(&target(t), 50, true);
    }
    assert_merges_settle_stamps(&harness);
    harness.reopen();
    for t in 0..TARGETS {
        harness.check(&target(t), 3, false);
    }
}

/// With tier 0 wide enough to hold every flushed delta, settling merges each tree's deltas into
/// one run, leaves a tree with a single run alone, and the answers stay equal to the model.
#[test]
fn settling_merges_tier_zero_into_one_run() {
    let mut options = Harness::options();
    options.compaction.min_run_bytes = 1 << 20;
    options.compaction.fan_in = 8;
    let mut harness = Harness::with(options);
    let mut state = 5u64;
    let mut next = |n: usize| (backlinks::base::rng::splitmix64(&mut state) % n as u64) as usize;
    for step in 0..150 {
        let record = (next(DIDS), next(3), next(RKEYS));
        let op = match next(8) {
            0 => Op::Delete { did: record.0, collection: record.1, rkey: record.2 },
            1 => Op::AccountDeleted { did: next(DIDS) },
            2 => Op::Write {
                update: true,
                did: record.0,
                collection: record.1,
                rkey: record.2,
                links: vec![(next(TARGETS), 0)],
            },
            _ => Op::Write {
                update: false,
                did: record.0,
                collection: record.1,
                rkey: record.2,
                links: vec![(next(TARGETS), next(3)), (next(TARGETS), 1)],
            },
        };
        harness.run(&op);
        if step % 30 == 29 {
            harness.run(&Op::Flush);
        }
    }
    let (links, thresholds) = (harness.index.links.runs().len(), harness.index.thresholds.runs().len());
    assert!(links >= 4 && thresholds >= 4, "{links} links runs and {thresholds} revocation runs before settling");
    harness.run(&Op::Settle);
    assert_eq!(harness.index.links.runs().len(), 1);
    assert_eq!(harness.index.thresholds.runs().len(), 1);
    assert!(harness.index.forward.runs().len() <= 1);
    let merges = harness.index.counters.compactions.load(std::sync::atomic::Ordering::Relaxed);
    assert!(!harness.index.settle_once(harness.runtime.handle(), &|| 1).unwrap(), "nothing left to settle");
    assert_eq!(harness.index.counters.compactions.load(std::sync::atomic::Ordering::Relaxed), merges);
    for t in 0..TARGETS {
        harness.check(&target(t), 2, false);
        harness.check(&target(t), 50, true);
    }
    harness.check_forward();
    harness.reopen();
    for t in 0..TARGETS {
        harness.check(&target(t), 3, t % 2 == 0);
    }
}

/// `memory_use` follows what each bounded part holds: memtables until their flush, outline
/// strings, meta pages and frames once a query reads tables, revocations once a merge knows them.
#[test]
fn memory_use_names_what_each_part_holds() {
    let mut options = Harness::options();
    options.memtable_bytes = 1 << 20;
    options.compaction.min_run_bytes = 1 << 20; // every run in tier 0, for settling to merge
    let mut harness = Harness::with(options);
    assert_eq!(harness.index.memory_use().memtables, 0);
    for rkey in 0..RKEYS {
        let links = vec![(rkey % TARGETS, 0), ((rkey + 1) % TARGETS, 1)];
        harness.run(&Op::Write { update: false, did: rkey % DIDS, collection: 0, rkey, links });
    }
    let written = harness.index.memory_use();
    assert!(written.memtables >= 2 * RKEYS * 64, "{written:?}");
    assert!(written.outline_cache > 0, "{written:?}");
    assert_eq!((written.frame_cache, written.meta_cache, written.merge_revocations), (0, 0, 0), "{written:?}");
    harness.run(&Op::Flush);
    harness.run(&Op::Delete { did: 0, collection: 0, rkey: 0 });
    harness.run(&Op::Write { update: false, did: 1, collection: 1, rkey: 0, links: vec![(1, 0)] });
    harness.run(&Op::Flush);
    assert_eq!(harness.index.memory_use().memtables, 0, "a flush lets its memtables go");
    harness.run(&Op::Check { target: 1, limit: 50, reverse: false });
    let read = harness.index.memory_use();
    assert!(read.meta_cache > 0 && read.frame_cache > 0, "{read:?}");
    harness.run(&Op::Settle);
    let merged = harness.index.memory_use();
    assert!(merged.merge_revocations >= size_of::<Revocation>(), "{merged:?}");
    assert!(merged.line().starts_with("memtables 0.0 MiB, frame_cache "), "{}", merged.line());
}

/// Every table's entries, read through its own checks, with the id of the run each is in.
fn entries_of<E: backlinks::lsm::entry::Entry>(
    harness: &Harness,
    tree: &backlinks::lsm::tree::Tree<E>,
) -> Vec<(Option<String>, E)> {
    let mut entries = Vec::new();
    for run in tree.runs().iter() {
        let compacted = (run.kind == backlinks::lsm::record::RunKind::Compacted).then(|| run.id.clone());
        for table in &run.tables {
            let frames = 0..table.frame_count();
            let read =
                harness.runtime.block_on(table.read_frames_with(harness.index.store.as_ref(), frames, PageUse::Scan));
            entries.extend(read.unwrap().into_iter().map(|entry| (compacted.clone(), entry)));
        }
    }
    entries
}

/// In this harness every merge knows every revocation stamped before its inputs (they are all
/// flushed first), so it stores each live backlink with its stamp raised to the clock it knows
/// them through: one stamp for all the live backlinks of a merged run.
fn assert_merges_settle_stamps(harness: &Harness) {
    let revoked: std::collections::HashMap<RecordId, u64> =
        entries_of(harness, &harness.index.thresholds).into_iter().fold(Default::default(), |mut newest, (_, r)| {
            let rev = newest.entry(r.source).or_insert(0);
            *rev = r.rev.max(*rev);
            newest
        });
    let mut stamps_by_run: std::collections::HashMap<String, std::collections::BTreeSet<u64>> = Default::default();
    for (run, link) in entries_of(harness, &harness.index.links) {
        let threshold = link.threshold(|key| revoked.get(key).copied().unwrap_or(0));
        if let Some(run) = run.filter(|_| link.source_rev >= threshold) {
            stamps_by_run.entry(run).or_default().insert(link.source_rev);
        }
    }
    assert!(!stamps_by_run.is_empty(), "no live compacted backlinks");
    for (run, stamps) in stamps_by_run {
        assert_eq!(stamps.len(), 1, "the live backlinks of run {run} have several stamps: {stamps:?}");
    }
}

/// A flush that fails leaves its operations in a frozen memtable, in no table: a later flush must
/// not commit a position past them (they would be lost for good), so it refuses until a restart.
#[test]
fn a_failed_flush_refuses_later_flushes() {
    let mut harness = Harness::new();
    let write = |harness: &mut Harness, rkey| {
        harness.run(&Op::Write { update: false, did: 1, collection: 0, rkey, links: vec![(1, 0)] })
    };
    write(&mut harness, 0);
    harness.run(&Op::Flush);
    let committed = harness.index.catalog.position().unwrap();
    write(&mut harness, 1);
    // The links tree's directory turns into a file: the table cannot be written.
    let dir = harness.index.links.dir().to_path_buf();
    let aside = dir.with_extension("aside");
    std::fs::rename(&dir, &aside).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    assert!(harness.index.flush().is_err());
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&aside, &dir).unwrap();
    write(&mut harness, 2);
    let refused = harness.index.flush().unwrap_err();
    assert!(matches!(refused, backlinks::index::IndexError::FlushFailed), "{refused}");
    assert_eq!(harness.index.catalog.position().unwrap(), committed);
    // Readers still see the frozen operations until the process goes.
    harness.run(&Op::Check { target: 1, limit: 10, reverse: false });
}

/// A flush job dropped unfinished took the account changes made before it (here with empty
/// memtables, so nothing stays frozen): later flushes refuse too, or they would commit past them.
#[test]
fn a_dropped_flush_job_refuses_later_flushes() {
    let mut harness = Harness::new();
    harness.run(&Op::Flush);
    let committed = harness.index.catalog.position().unwrap();
    harness.run(&Op::Deactivate { did: 2 });
    drop(harness.index.begin_flush().unwrap());
    let refused = harness.index.flush().unwrap_err();
    assert!(matches!(refused, backlinks::index::IndexError::FlushFailed), "{refused}");
    assert_eq!(harness.index.catalog.position().unwrap(), committed);
}
