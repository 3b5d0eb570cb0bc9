//! Live ingest and backfill meeting in every order (DESIGN "Clock, revocations, deletes"): a live
//! commit newer than a snapshot is never lost, and a snapshot older than a live delete never
//! brings the record back. Each case drives the gate with snapshots and live events and checks
//! the answers against what the repository holds at its newest revision.

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::backfill::gate::{GateLimits, LiveOutcome, SnapshotGate, SnapshotOutcome};
use backlinks::ingest::backfill::repos::ReposDb;
use backlinks::ingest::frames::StreamEvent;
use backlinks::ingest::repo::{RepoCommit, RepoRecord};
use backlinks::model::account::AccountState;
use backlinks::model::operation::{Operation, RecordOp, RecordRef};
use backlinks::model::tid::format_tid;
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use std::sync::Arc;

const AUTHOR: &str = "did:plc:author";
const POST: &str = "at://did:plc:target/app.bsky.feed.post/3l3qo2vutsw2b";
const LIKE: &str = "app.bsky.feed.like";

/// A likes-only repository, its snapshots and live commits, and the answers for `POST`.
struct Case {
    _dir: tempfile::TempDir,
    index: Arc<Index>,
    repos: Arc<ReposDb>,
    gate: SnapshotGate,
    time_us: i64,
}

fn like_record() -> serde_json::Value {
    serde_json::json!({ "$type": LIKE, "subject": { "uri": POST, "cid": "bafyreib2rxk3rh6kzwq" }, "createdAt": "2024-01-01T00:00:00Z" })
}

/// A TID-shaped record key for like `n`.
fn rkey(n: u64) -> String {
    format_tid(1_700_000_000_000_000 + n)
}

impl Case {
    fn new(limits: GateLimits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(DirStore::new(dir.path().join("bucket")));
        let index = Arc::new(Index::open(dir.path(), store, IndexOptions::default(), 3).unwrap());
        let repos = Arc::new(ReposDb::open(&dir.path().join("repos.db")).unwrap());
        let gate = SnapshotGate::new(index.clone(), repos.clone(), limits);
        Case { _dir: dir, index, repos, gate, time_us: 1_700_000_000_000_000 }
    }

    /// A snapshot at revision `rev` holding likes `likes`, fetched (`begin`) and then written.
    fn snapshot(&self, rev: u64, likes: &[u64]) -> SnapshotOutcome {
        assert!(self.gate.begin(AUTHOR), "no fetch of the repository is running");
        self.finish(rev, likes)
    }

    fn finish(&self, rev: u64, likes: &[u64]) -> SnapshotOutcome {
        let commit = RepoCommit { did: AUTHOR.into(), rev: format_tid(rev), data: "bafy".into(), version: 3 };
        let records: Vec<RepoRecord> = likes
            .iter()
            .map(|n| RepoRecord {
                collection: LIKE.into(),
                rkey: rkey(*n),
                cid: "bafy".into(),
                record: std::sync::Arc::new(like_record()),
            })
            .collect();
        let outcome = self.gate.finish(&commit, &records).unwrap();
        if let SnapshotOutcome::Written { rev, stamp, links, .. } = outcome {
            // What the driver records after a written snapshot.
            self.repos
                .offer(
                    &[backlinks::ingest::backfill::repos::Listed { did: AUTHOR, host: "h", rev: None, inactive: None }],
                    0,
                )
                .unwrap();
            self.repos.mark_done(AUTHOR, rev, stamp, records.len() as u64, links, 0).unwrap();
        }
        outcome
    }

    fn live(&mut self, rev: Option<u64>, operation: Operation<'static>) -> LiveOutcome {
        self.time_us += 1;
        let event = StreamEvent { cursor: self.time_us, time_us: self.time_us, operation, rev };
        self.gate.apply_live(event).unwrap()
    }

    fn create(&mut self, rev: u64, n: u64) -> LiveOutcome {
        let record_ref = record_ref(n);
        self.live(Some(rev), Operation::Create(RecordOp { record_ref, record: like_record() }))
    }

    fn delete(&mut self, rev: u64, n: u64) -> LiveOutcome {
        self.live(Some(rev), Operation::Delete(record_ref(n)))
    }

    /// The likes of `POST` that the index answers with, by number.
    fn likes(&self) -> Vec<u64> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let page = runtime.block_on(list_backlinks(&self.index, &ListParams::new(POST))).unwrap();
        assert!(page.cursor.is_none(), "one page holds every like here");
        let mut likes: Vec<u64> = page
            .items
            .iter()
            .map(|(_, uri)| {
                let key = uri.rsplit('/').next().unwrap();
                (0..100).find(|n| rkey(*n) == key).unwrap_or_else(|| panic!("unknown like {uri}"))
            })
            .collect();
        likes.sort();
        likes
    }
}

fn record_ref(n: u64) -> RecordRef<'static> {
    RecordRef { did: AUTHOR.into(), collection: LIKE.into(), rkey: rkey(n).into() }
}

fn case() -> Case {
    Case::new(GateLimits::default())
}

#[test]
fn live_commits_during_a_fetch_are_replayed_on_top_of_the_snapshot() {
    let mut c = case();
    assert!(c.gate.begin(AUTHOR));
    assert_eq!(c.create(20, 2), LiveOutcome::Held);
    assert_eq!(c.delete(21, 1), LiveOutcome::Held, "a delete of a record the snapshot holds");
    assert_eq!(c.create(5, 9), LiveOutcome::Held, "an older commit: the snapshot already covers it");
    let outcome = c.finish(10, &[1, 3]);
    assert!(matches!(outcome, SnapshotOutcome::Written { replayed: 2, .. }), "{outcome:?}");
    assert_eq!(c.likes(), vec![2, 3]);
}

#[test]
fn a_snapshot_older_than_an_applied_live_create_is_stale_and_loses_nothing() {
    let mut c = case();
    assert_eq!(c.create(20, 2), LiveOutcome::Applied);
    assert!(matches!(c.snapshot(10, &[1]), SnapshotOutcome::Stale { newest_live: Some(20) }));
    assert_eq!(c.likes(), vec![2], "the live create survives; the stale snapshot wrote nothing");
    // The refetched, newer snapshot is written.
    assert!(matches!(c.snapshot(21, &[1, 2]), SnapshotOutcome::Written { .. }));
    assert_eq!(c.likes(), vec![1, 2]);
}

#[test]
fn a_snapshot_older_than_a_live_delete_never_resurrects_the_record() {
    let mut c = case();
    assert!(matches!(c.snapshot(10, &[1, 2]), SnapshotOutcome::Written { .. }));
    assert_eq!(c.delete(20, 1), LiveOutcome::Applied);
    assert_eq!(c.likes(), vec![2]);
    assert!(matches!(c.snapshot(15, &[1, 2]), SnapshotOutcome::Stale { .. }), "older than the delete");
    assert_eq!(c.likes(), vec![2], "like 1 stays deleted");
}

#[test]
fn replayed_live_commits_older_than_a_snapshot_are_skipped() {
    let mut c = case();
    assert!(matches!(c.snapshot(10, &[1]), SnapshotOutcome::Written { .. }));
    // A reconnect replays commits from before the snapshot: like 9 was created and deleted then.
    assert_eq!(c.create(8, 9), LiveOutcome::Skipped);
    assert_eq!(c.likes(), vec![1]);
    assert_eq!(c.create(11, 4), LiveOutcome::Applied, "newer than the snapshot");
    assert_eq!(c.likes(), vec![1, 4]);
}

#[test]
fn the_same_revision_is_not_written_twice_and_deleted_accounts_never_come_back() {
    let mut c = case();
    assert!(matches!(c.snapshot(10, &[1]), SnapshotOutcome::Written { .. }));
    assert_eq!(c.snapshot(10, &[1]), SnapshotOutcome::AlreadyIndexed);
    let deleted = Operation::Account { did: AUTHOR.into(), active: false, status: Some("deleted".into()) };
    assert_eq!(c.live(None, deleted), LiveOutcome::Applied);
    assert_eq!(c.index.account_state(AUTHOR).unwrap(), Some(AccountState::Deleted));
    assert_eq!(c.likes(), Vec::<u64>::new());
    assert_eq!(c.snapshot(30, &[1, 2]), SnapshotOutcome::AccountDeleted);
    assert_eq!(c.likes(), Vec::<u64>::new());
}

#[test]
fn an_overflowing_buffer_applies_in_order_and_makes_the_snapshot_stale() {
    let limits = GateLimits { buffered_per_repo: 2, buffered_total: 2, ..GateLimits::default() };
    let mut c = Case::new(limits);
    assert!(c.gate.begin(AUTHOR));
    assert_eq!(c.create(20, 1), LiveOutcome::Held);
    assert_eq!(c.delete(21, 1), LiveOutcome::Held);
    assert_eq!(c.create(22, 2), LiveOutcome::Applied, "no room: everything held is applied, in order");
    assert_eq!(c.likes(), vec![2], "create then delete of like 1 kept their order");
    assert!(matches!(c.finish(10, &[1, 3]), SnapshotOutcome::Stale { .. }));
    assert_eq!(c.likes(), vec![2]);
}

#[test]
fn live_revisions_persisted_before_a_flush_keep_old_snapshots_out_after_a_restart() {
    let mut c = case();
    assert_eq!(c.create(20, 2), LiveOutcome::Applied);
    c.gate.flush().unwrap();
    // A new process: nothing in memory, only repos.db and the index.
    let fresh = SnapshotGate::new(c.index.clone(), c.repos.clone(), GateLimits::default());
    assert!(fresh.begin(AUTHOR));
    let commit = RepoCommit { did: AUTHOR.into(), rev: format_tid(10), data: "bafy".into(), version: 3 };
    let outcome = fresh.finish(&commit, &[]).unwrap();
    assert_eq!(outcome, SnapshotOutcome::Stale { newest_live: Some(20) });
    assert_eq!(c.likes(), vec![2]);
}
