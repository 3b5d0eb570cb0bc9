//! Exact counts of a target with more than a million live backlinks (issue 23): likes, reposts
//! and replies of one post from 25,000 accounts, under deletes, updates (some keep the link, some
//! move it to another post), account deletions, deactivations and reactivations, repository
//! snapshots and merges. The count (a tally: far past the scan limit) equals a model of the live
//! records after every phase and after a reopen, by location too, and is never an estimate; so
//! do its distinct accounts (each account links many times from each group) by (collection,
//! location), and for the whole target in counts filtered by account. Unfiltered, the whole
//! target's accounts are its groups' summed and say so (`distinct_approximate`).

use backlinks::count::{Count, CountOptions, count_backlinks, count_backlinks_named};
use backlinks::index::{Index, IndexOptions};
use backlinks::model::operation::{Operation, RecordOp, RecordRef};
use backlinks::model::tid::format_tid;
use backlinks::query::ListParams;
use backlinks::store::dir::DirStore;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

const ACCOUNTS: usize = 25_000;
const RECORDS_PER_ACCOUNT: usize = 44;
const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3l3qo2vutsw2b";
const OTHER_POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3l3qo2vutsw2c";
const COLLECTIONS: [&str; 3] = ["app.bsky.feed.like", "app.bsky.feed.repost", "app.bsky.feed.post"];

fn did(account: usize) -> String {
    let mut letters = String::new();
    let mut n = account;
    for _ in 0..24 {
        letters.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
    }
    format!("did:plc:{letters}")
}

/// (account, record number): a like, a repost or a reply by the record number.
type Key = (usize, usize);

fn record_ref(&(account, n): &Key) -> RecordRef<'static> {
    let collection = COLLECTIONS[n % 3];
    let rkey = format_tid(1_700_000_000_000_000 + (account * RECORDS_PER_ACCOUNT + n) as u64);
    RecordRef { did: did(account).into(), collection: collection.into(), rkey: rkey.into() }
}

/// The record linking to `target`, and its (target, location) links.
fn record(key: &Key, target: &'static str) -> (serde_json::Value, Vec<(&'static str, &'static str)>) {
    let strong =
        serde_json::json!({"uri": target, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"});
    match key.1 % 3 {
        2 => (
            serde_json::json!({"text": "yes", "reply": {"root": strong, "parent": strong}}),
            vec![(target, "$.reply.root"), (target, "$.reply.parent")],
        ),
        _ => (serde_json::json!({"subject": strong}), vec![(target, "$.subject")]),
    }
}

struct World {
    index: Index,
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    records: HashMap<Key, Vec<(&'static str, &'static str)>>,
    hidden: HashSet<usize>,
    now_ms: u64,
}

impl World {
    fn options() -> IndexOptions {
        IndexOptions { memtable_bytes: 16 << 20, ..IndexOptions::default() }
    }

    fn open(dir: &tempfile::TempDir) -> Index {
        let store = Arc::new(DirStore::new(dir.path().join("bucket")));
        Index::open(&dir.path().join("data"), store, Self::options(), 3).unwrap()
    }

    fn apply(&mut self, operation: &Operation<'_>) {
        self.index.apply(operation, None).unwrap();
        if self.index.wants_flush() {
            // A flush's tallies read hot links, revocations and tallies all over their trees,
            // and merges read whole tables: neither may crowd out what queries keep in the caches.
            let caches = |index: &Index| (index.memory_use().meta_cache, index.memory_use().frame_cache);
            let before = caches(&self.index);
            self.index.flush().unwrap();
            assert_eq!(caches(&self.index), before, "a flush cached");
            self.now_ms += 1;
            while self.index.compact_once(self.runtime.handle(), &|| self.now_ms).unwrap() {}
            assert_eq!(caches(&self.index), before, "a merge cached");
        }
    }

    fn write(&mut self, key: Key, target: &'static str, update: bool) {
        let (json, links) = record(&key, target);
        let op = RecordOp { record_ref: record_ref(&key), record: json };
        self.apply(&if update { Operation::Update(op) } else { Operation::Create(op) });
        self.records.insert(key, links);
    }

    fn delete(&mut self, key: Key) {
        self.apply(&Operation::Delete(record_ref(&key)));
        self.records.remove(&key);
    }

    fn account(&mut self, account: usize, active: bool, status: Option<&str>) {
        let did = did(account);
        self.apply(&Operation::Account { did: did.into(), active, status: status.map(|s| s.to_string().into()) });
        match status {
            Some("deleted") => {
                self.records.retain(|(owner, _), _| *owner != account);
                self.hidden.remove(&account);
            }
            Some(_) => drop(self.hidden.insert(account)),
            None => drop(self.hidden.remove(&account)),
        }
    }

    /// A repository snapshot of `account` holding only its records below `keep`.
    fn snapshot(&mut self, account: usize, keep: usize) {
        self.records.retain(|(owner, n), _| *owner != account || *n < keep);
        let kept: Vec<(Key, serde_json::Value)> = (0..keep)
            .filter(|n| self.records.contains_key(&(account, *n)))
            .map(|n| ((account, n), record(&(account, n), POST).0))
            .collect();
        for (key, _) in &kept {
            self.records.insert(*key, record(key, POST).1);
        }
        let refs: Vec<(RecordRef<'static>, serde_json::Value)> =
            kept.into_iter().map(|(key, json)| (record_ref(&key), json)).collect();
        self.index.apply_snapshot(&did(account), refs.iter().map(|(r, json)| (r.clone(), json))).unwrap();
    }

    /// The model's live links to `target` from `accounts` (all when `None`): the accounts of
    /// each by (collection, location).
    fn expected(&self, target: &str, accounts: Option<&[usize]>) -> BTreeMap<(String, String), Vec<usize>> {
        let mut by_source: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
        for ((account, n), links) in &self.records {
            if self.hidden.contains(account) || accounts.is_some_and(|wanted| !wanted.contains(account)) {
                continue;
            }
            for (_, location) in links.iter().filter(|(t, _)| *t == target) {
                let key = (COLLECTIONS[n % 3].to_string(), location.to_string());
                by_source.entry(key).or_default().push(*account);
            }
        }
        by_source
    }

    fn count(&self, params: &ListParams) -> Count {
        let name = |location: &str| Some(location.to_string());
        let count = count_backlinks_named(&self.index, params, CountOptions::default(), &name);
        let count = self.runtime.block_on(count).unwrap();
        let records = self.runtime.block_on(count_backlinks(&self.index, params, CountOptions::default())).unwrap();
        assert_eq!((records.total, &records.by_location), (count.total, &count.by_location));
        count
    }

    /// Flushes, then the counts of `target` are exact and equal the model: all of it, by
    /// collection and location with their accounts, from a few accounts, and from two groups.
    fn check(&mut self, target: &str, phase: &str) -> u64 {
        self.index.flush().unwrap();
        let total = self.check_count(&ListParams::new(target), None, phase);
        let some: Vec<usize> = (0..ACCOUNTS).step_by(ACCOUNTS / 40).chain([7, 11, 13, 17, 19]).collect();
        let params = ListParams { dids: some.iter().map(|account| did(*account)).collect(), ..ListParams::new(target) };
        self.check_count(&params, Some(&some), &format!("{phase}, {} accounts", some.len()));
        // Replies link from two locations of one collection: the accounts of both together are
        // a union, which only an account filter's tallies know exactly.
        let replies = ListParams { collections: vec![COLLECTIONS[2].into()], ..ListParams::new(target) };
        let count = self.count(&replies);
        let expected = self.expected(target, None);
        let reply_groups = expected.keys().filter(|(collection, _)| collection == COLLECTIONS[2]).count();
        assert_eq!(count.distinct_approximate, reply_groups > 1, "{phase}: replies' accounts");
        total
    }

    fn check_count(&self, params: &ListParams, accounts: Option<&[usize]>, phase: &str) -> u64 {
        let count = self.count(params);
        let expected = self.expected(&params.target, accounts);
        let target = &params.target;
        assert!(!count.approximate && !count.by_source_approximate, "{phase}: the count of {target} is an estimate");
        let mut by_location: BTreeMap<String, u64> = BTreeMap::new();
        for ((_, location), links) in &expected {
            *by_location.entry(location.clone()).or_default() += links.len() as u64;
        }
        assert_eq!(count.by_location, by_location, "{phase}: {target} by location");
        assert_eq!(count.total, by_location.values().sum::<u64>(), "{phase}: {target}");
        for (key, links) in &expected {
            let figures = count.by_source.get(key).copied().unwrap_or_default();
            let distinct = links.iter().collect::<HashSet<_>>().len() as u64;
            assert_eq!((figures.records, figures.distinct_dids), (links.len() as u64, distinct), "{phase}: {key:?}");
        }
        assert_eq!(count.by_source.len(), expected.len(), "{phase}: {target}'s groups");
        let distinct: HashSet<&usize> = expected.values().flatten().collect();
        let summed: usize = expected.values().map(|links| links.iter().collect::<HashSet<_>>().len()).sum();
        let (accounts, approximate) = match accounts {
            Some(_) => (distinct.len(), false),
            None => (summed, expected.len() > 1),
        };
        assert_eq!(count.distinct_dids, accounts as u64, "{phase}: {target}'s accounts");
        assert_eq!(count.distinct_approximate, approximate, "{phase}: {target}'s accounts");
        count.total
    }
}

#[test]
fn a_target_with_a_million_live_backlinks_counts_exactly_under_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let index = World::open(&dir);
    let mut world = World { index, runtime, dir, records: HashMap::new(), hidden: HashSet::new(), now_ms: 1_000 };
    for account in 0..ACCOUNTS {
        for n in 0..RECORDS_PER_ACCOUNT {
            world.write((account, n), POST, false);
        }
    }
    let created = world.check(POST, "created");
    assert!(created > 1_000_000, "{created} live backlinks");

    for account in (0..ACCOUNTS).step_by(50) {
        world.delete((account, 1));
        world.delete((account, 2));
        world.write((account, 3), POST, true);
        world.write((account, 4), OTHER_POST, true);
        world.delete((account, 40)); // A second delete of one record changes nothing.
        world.delete((account, 40));
    }
    // Accounts that stop reposting but still like and reply: the reposts' accounts fall, the
    // whole target's do not.
    for account in (5..ACCOUNTS).step_by(700) {
        for n in (1..RECORDS_PER_ACCOUNT).step_by(3) {
            world.delete((account, n));
        }
    }
    world.check(POST, "deleted and updated");
    world.check(OTHER_POST, "updated to the other post");

    // Records changed in the flush that hides and deletes accounts, by accounts all over the
    // DIDs: it reads the hot links of those accounts whole in more than one batch, and each of
    // these records' with its DID's batch.
    for account in (29..ACCOUNTS).step_by(97) {
        world.delete((account, 5));
        world.write((account, 7), OTHER_POST, true); // A repost, as the other post's others.
        world.write((account, RECORDS_PER_ACCOUNT + 1), POST, false);
    }
    for account in (7..ACCOUNTS).step_by(250) {
        world.account(account, false, Some("deleted"));
    }
    for account in (11..ACCOUNTS).step_by(200) {
        world.account(account, false, Some("deactivated"));
    }
    // Accounts whose records were deleted and updated: their hiding must not count those again.
    for account in (0..ACCOUNTS).step_by(350) {
        world.account(account, false, Some("deactivated"));
    }
    for account in (13..ACCOUNTS).step_by(300) {
        world.account(account, false, Some("takendown"));
        world.account(account, false, Some("takendown")); // Hidden twice: hidden once.
    }
    world.check(POST, "accounts deleted and hidden");

    for account in (11..ACCOUNTS).step_by(400) {
        world.account(account, true, None);
    }
    for account in (17..ACCOUNTS).step_by(500) {
        world.snapshot(account, 20);
    }
    for account in (19..ACCOUNTS).step_by(500) {
        world.write((account, RECORDS_PER_ACCOUNT), POST, false);
    }
    let before_reopen = world.check(POST, "reactivated, snapshotted and created again");
    world.check(OTHER_POST, "the other post at the end");

    let World { index, runtime, dir, records, hidden, now_ms } = world;
    drop(index);
    let mut world = World { index: World::open(&dir), runtime, dir, records, hidden, now_ms };
    assert_eq!(world.check(POST, "reopened"), before_reopen);
    for account in (23..ACCOUNTS).step_by(600) {
        world.delete((account, 10));
    }
    world.check(POST, "deleted after the reopen");
}
