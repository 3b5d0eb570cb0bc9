//! `repos.db`: backfill's own state. One row per repository (where it is fetched from, its status,
//! the revision and stamp of the indexed snapshot, attempts and the last error), the paging
//! position of every listing, and the newest live revision applied per repository.
//!
//! Invariants:
//! - A repository is `done` only with the stamp its snapshot was written at. Rows whose stamp is
//!   above the index's durable clock (the snapshot was in a memtable when the process died) go
//!   back to `pending` on open (`reset_undurable`): repos.db never claims more than the index has.
//! - `attempts` only grows until the repository is done or given up; a transient failure past
//!   `max_attempts` becomes `failed` (recorded, not retried forever).
//! - A listing that shows a done repository at the same revision leaves it alone; a newer
//!   revision makes it pending again. A listing never touches a `rejected` row: a host cannot
//!   reset the count of a repository that failed verification.
//! - A `rejected` repository (its snapshot failed verification) is settled for the run that
//!   rejected it and fetched again by a later run once `next_attempt_ms` passes, at most
//!   `max_attempts` times in all: never in a loop.
//! - Revisions are TIDs (63-bit), stored as SQLite integers; stamps and times too. Errors are cut
//!   to `MAX_ERROR_CHARS`.

use rusqlite::{Connection, OptionalExtension, Row, params};
use rusqlite_migration::{M, Migrations};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Longest last-error text kept per repository.
pub const MAX_ERROR_CHARS: usize = 512;

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(include_str!("../../../migrations/repos/0001_repos.sql")),
        M::up(include_str!("../../../migrations/repos/0002_listing_counts.sql")),
    ])
}

/// Where a repository stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RepoStatus {
    Pending,
    Done,
    Deactivated,
    Takendown,
    Suspended,
    Deleted,
    NotFound,
    Failed,
    /// The snapshot was older than live commits already applied; refetched later.
    Stale,
    /// The snapshot (or the identity behind it) failed verification; `last_error` says why.
    Rejected,
}

impl RepoStatus {
    pub const ALL: [RepoStatus; 10] = [
        RepoStatus::Pending,
        RepoStatus::Done,
        RepoStatus::Deactivated,
        RepoStatus::Takendown,
        RepoStatus::Suspended,
        RepoStatus::Deleted,
        RepoStatus::NotFound,
        RepoStatus::Failed,
        RepoStatus::Stale,
        RepoStatus::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RepoStatus::Pending => "pending",
            RepoStatus::Done => "done",
            RepoStatus::Deactivated => "deactivated",
            RepoStatus::Takendown => "takendown",
            RepoStatus::Suspended => "suspended",
            RepoStatus::Deleted => "deleted",
            RepoStatus::NotFound => "not_found",
            RepoStatus::Failed => "failed",
            RepoStatus::Stale => "stale",
            RepoStatus::Rejected => "rejected",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The status an account's hosting status (listRepos `status`, an XRPC error name) means.
    pub fn from_account_status(status: &str) -> Option<Self> {
        match status.to_ascii_lowercase().trim_start_matches("repo") {
            "deactivated" => Some(RepoStatus::Deactivated),
            "takendown" => Some(RepoStatus::Takendown),
            "suspended" => Some(RepoStatus::Suspended),
            "deleted" => Some(RepoStatus::Deleted),
            "notfound" => Some(RepoStatus::NotFound),
            _ => None,
        }
    }

    /// Finished one way or another: nothing more to fetch unless a listing says otherwise.
    pub fn is_settled(self) -> bool {
        !matches!(self, RepoStatus::Pending)
    }
}

/// One repository's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRow {
    pub did: String,
    pub host: String,
    pub status: RepoStatus,
    pub rev: Option<u64>,
    pub stamp: Option<u64>,
    pub records: u64,
    pub links: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub next_attempt_ms: u64,
}

/// How far one listing got: the cursor of its next page, whether it reached its end, and how
/// many pages and entries it has given (what the per-host caps count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub cursor: Option<String>,
    pub complete: bool,
    pub pages: u64,
    pub dids: u64,
}

/// What a listing said about one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed<'a> {
    pub did: &'a str,
    pub host: &'a str,
    pub rev: Option<u64>,
    /// `None` when active; otherwise the status it is in (not fetched).
    pub inactive: Option<RepoStatus>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReposError {
    #[error("repos.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("repos.db migration: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("repos.db: {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("repos.db: unknown status {0:?} in a row")]
    BadStatus(String),
    #[error("repos.db: value {0} out of range")]
    OutOfRange(u64),
    #[error("repos.db lock poisoned")]
    Poisoned,
}

pub struct ReposDb {
    db: Mutex<Connection>,
}

const COLUMNS: &str = "did, host, status, rev, stamp, records, links, attempts, last_error, next_attempt_ms";

impl ReposDb {
    /// Opens (creating) `repos.db` at `path` and applies migrations.
    pub fn open(path: &Path) -> Result<Self, ReposError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| ReposError::Io { path: dir.display().to_string(), source })?;
        }
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        migrations().to_latest(&mut conn)?;
        Ok(ReposDb { db: Mutex::new(conn) })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, ReposError> {
        self.db.lock().map_err(|_| ReposError::Poisoned)
    }

    /// Sends `done` rows whose snapshot stamp the index has not made durable back to `pending`.
    pub fn reset_undurable(&self, durable_clock: u64) -> Result<usize, ReposError> {
        let db = self.lock()?;
        Ok(db.execute(
            "UPDATE repos SET status = 'pending', stamp = NULL WHERE status = 'done' AND stamp > ?1",
            params![to_sql(durable_clock)?],
        )?)
    }

    /// Records what listings said, in one transaction. Returns how many became (or stay) pending.
    /// The indexed revision and stamp are left as they are: they describe what the index holds.
    pub fn offer(&self, listed: &[Listed<'_>], now_ms: u64) -> Result<usize, ReposError> {
        let mut db = self.lock()?;
        let tx = db.transaction()?;
        let mut pending = 0;
        for repo in listed {
            let existing: Option<(String, Option<i64>)> = tx
                .query_row("SELECT status, rev FROM repos WHERE did = ?1", [repo.did], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let indexed_rev = existing.as_ref().and_then(|(_, rev)| rev.map(|r| r as u64));
            let done = existing.as_ref().is_some_and(|(status, _)| status == "done");
            if existing.as_ref().is_some_and(|(status, _)| status == "rejected") {
                continue;
            }
            let status = match repo.inactive {
                Some(inactive) => inactive,
                None if done && repo.rev.is_some_and(|r| Some(r) <= indexed_rev) => continue,
                None => RepoStatus::Pending,
            };
            pending += usize::from(status == RepoStatus::Pending);
            tx.execute(
                "INSERT INTO repos (did, host, status, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (did) DO UPDATE SET host = excluded.host, status = excluded.status,
                     attempts = 0, last_error = NULL, next_attempt_ms = 0, updated_ms = excluded.updated_ms",
                params![repo.did, repo.host, status.as_str(), to_sql(now_ms)?],
            )?;
        }
        tx.commit()?;
        Ok(pending)
    }

    /// A fetched snapshot was not newer than the indexed one: the row is done again, unchanged.
    pub fn mark_unchanged(&self, did: &str, now_ms: u64) -> Result<(), ReposError> {
        let db = self.lock()?;
        db.execute(
            "UPDATE repos SET status = 'done', last_error = NULL, next_attempt_ms = 0, updated_ms = ?2
             WHERE did = ?1 AND stamp IS NOT NULL",
            params![did, to_sql(now_ms)?],
        )?;
        Ok(())
    }

    /// Up to `limit` repositories whose (re)try time has come, oldest first: pending ones, and
    /// rejected ones with attempts left (`max_attempts`). Rows without a host (read from CAR
    /// files) are never due: only the file can bring them.
    pub fn due(&self, limit: usize, now_ms: u64, max_attempts: u32) -> Result<Vec<RepoRow>, ReposError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM repos
             WHERE (status = 'pending' OR (status = 'rejected' AND attempts < ?3))
                 AND host != '' AND next_attempt_ms <= ?1
             ORDER BY next_attempt_ms, did LIMIT ?2"
        ))?;
        let rows = query.query_map(params![to_sql(now_ms)?, limit as i64, max_attempts], read_row)?;
        rows.map(|row| row?).collect()
    }

    /// When the next pending repository becomes due, if any is pending.
    pub fn next_due_ms(&self) -> Result<Option<u64>, ReposError> {
        let db = self.lock()?;
        let next: Option<i64> =
            db.query_row("SELECT min(next_attempt_ms) FROM repos WHERE status = 'pending' AND host != ''", [], |r| {
                r.get(0)
            })?;
        Ok(next.map(|n| n.max(0) as u64))
    }

    pub fn get(&self, did: &str) -> Result<Option<RepoRow>, ReposError> {
        let db = self.lock()?;
        let row = db.query_row(&format!("SELECT {COLUMNS} FROM repos WHERE did = ?1"), [did], read_row).optional()?;
        row.transpose()
    }

    /// The snapshot at `rev` is in the index at `stamp`.
    pub fn mark_done(
        &self,
        did: &str,
        rev: u64,
        stamp: u64,
        records: u64,
        links: u64,
        now_ms: u64,
    ) -> Result<(), ReposError> {
        let db = self.lock()?;
        db.execute(
            "UPDATE repos SET status = 'done', rev = ?2, stamp = ?3, records = ?4, links = ?5,
                 last_error = NULL, next_attempt_ms = 0, updated_ms = ?6 WHERE did = ?1",
            params![did, to_sql(rev)?, to_sql(stamp)?, to_sql(records)?, to_sql(links)?, to_sql(now_ms)?],
        )?;
        Ok(())
    }

    /// A transient failure: try again at `next_attempt_ms`, or give up (`failed`) once `attempts`
    /// reaches `max_attempts`. Returns the status the row is left in.
    pub fn mark_retry(
        &self,
        did: &str,
        error: &str,
        next_attempt_ms: u64,
        max_attempts: u32,
        now_ms: u64,
    ) -> Result<RepoStatus, ReposError> {
        let db = self.lock()?;
        let attempts: u32 = db.query_row("SELECT attempts FROM repos WHERE did = ?1", [did], |r| r.get(0))?;
        let status = if attempts + 1 >= max_attempts { RepoStatus::Failed } else { RepoStatus::Pending };
        db.execute(
            "UPDATE repos SET status = ?2, attempts = attempts + 1, last_error = ?3, next_attempt_ms = ?4,
                 updated_ms = ?5 WHERE did = ?1",
            params![did, status.as_str(), cut(error), to_sql(next_attempt_ms)?, to_sql(now_ms)?],
        )?;
        Ok(status)
    }

    /// A final answer that is not a snapshot (deactivated, taken down, not found, a permanent error).
    pub fn mark_settled(
        &self,
        did: &str,
        status: RepoStatus,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), ReposError> {
        assert!(status.is_settled() && status != RepoStatus::Done, "done needs a snapshot");
        let db = self.lock()?;
        db.execute(
            "UPDATE repos SET status = ?2, attempts = attempts + 1, last_error = ?3, updated_ms = ?4 WHERE did = ?1",
            params![did, status.as_str(), error.map(cut), to_sql(now_ms)?],
        )?;
        Ok(())
    }

    /// The snapshot failed verification: recorded with the reason, not fetched again before
    /// `next_attempt_ms` (and never once `attempts` reaches the limit `due` is given).
    pub fn mark_rejected(&self, did: &str, reason: &str, next_attempt_ms: u64, now_ms: u64) -> Result<(), ReposError> {
        let db = self.lock()?;
        db.execute(
            "UPDATE repos SET status = 'rejected', attempts = attempts + 1, last_error = ?2, next_attempt_ms = ?3,
                 updated_ms = ?4 WHERE did = ?1",
            params![did, cut(reason), to_sql(next_attempt_ms)?, to_sql(now_ms)?],
        )?;
        Ok(())
    }

    /// Not tried now for a reason that is not the repository's (its host is paused): tried again
    /// at `next_attempt_ms`, no attempt counted.
    pub fn postpone(&self, did: &str, reason: &str, next_attempt_ms: u64, now_ms: u64) -> Result<(), ReposError> {
        let db = self.lock()?;
        db.execute(
            "UPDATE repos SET last_error = ?2, next_attempt_ms = max(next_attempt_ms, ?3), updated_ms = ?4
             WHERE did = ?1",
            params![did, cut(reason), to_sql(next_attempt_ms)?, to_sql(now_ms)?],
        )?;
        Ok(())
    }

    /// The repositories rejected, with their reasons, newest first (at most `limit`).
    pub fn rejected(&self, limit: usize) -> Result<Vec<(String, String)>, ReposError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached(
            "SELECT did, coalesce(last_error, '') FROM repos WHERE status = 'rejected'
             ORDER BY updated_ms DESC, did LIMIT ?1",
        )?;
        let rows = query.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many repositories are in each status.
    pub fn counts(&self) -> Result<BTreeMap<RepoStatus, u64>, ReposError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached("SELECT status, count(*) FROM repos GROUP BY status")?;
        let mut counts = BTreeMap::new();
        for row in query.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (status, count) = row?;
            let status = RepoStatus::parse(&status).ok_or(ReposError::BadStatus(status))?;
            counts.insert(status, count.max(0) as u64);
        }
        Ok(counts)
    }

    /// Where listing `source` stopped.
    pub fn listing(&self, source: &str) -> Result<Listing, ReposError> {
        let db = self.lock()?;
        let row = db
            .query_row("SELECT cursor, complete, pages, dids FROM listings WHERE source = ?1", [source], |r| {
                Ok(Listing {
                    cursor: r.get(0)?,
                    complete: r.get(1)?,
                    pages: r.get::<_, i64>(2)?.max(0) as u64,
                    dids: r.get::<_, i64>(3)?.max(0) as u64,
                })
            })
            .optional()?;
        Ok(row.unwrap_or_default())
    }

    pub fn set_listing(&self, source: &str, listing: &Listing) -> Result<(), ReposError> {
        let db = self.lock()?;
        db.execute(
            "INSERT INTO listings (source, cursor, complete, pages, dids) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (source) DO UPDATE SET cursor = excluded.cursor, complete = excluded.complete,
                 pages = excluded.pages, dids = excluded.dids",
            params![source, listing.cursor, listing.complete, to_sql(listing.pages)?, to_sql(listing.dids)?],
        )?;
        Ok(())
    }

    /// Raises each repository's newest applied live revision (never lowers it).
    pub fn record_live_revs<'a>(&self, revs: impl IntoIterator<Item = (&'a str, u64)>) -> Result<(), ReposError> {
        let mut db = self.lock()?;
        let tx = db.transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO live_revs (did, rev) VALUES (?1, ?2)
                 ON CONFLICT (did) DO UPDATE SET rev = max(rev, excluded.rev)",
            )?;
            for (did, rev) in revs {
                upsert.execute(params![did, to_sql(rev)?])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn live_rev(&self, did: &str) -> Result<Option<u64>, ReposError> {
        let db = self.lock()?;
        let rev: Option<i64> =
            db.query_row("SELECT rev FROM live_revs WHERE did = ?1", [did], |r| r.get(0)).optional()?;
        Ok(rev.map(|r| r as u64))
    }

    /// A consistent copy of the whole database, as bytes (for a checkpoint in the bucket).
    pub fn snapshot_bytes(&self, scratch: &Path) -> Result<Vec<u8>, ReposError> {
        let io = |source| ReposError::Io { path: scratch.display().to_string(), source };
        match std::fs::remove_file(scratch) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        self.lock()?.execute("VACUUM INTO ?1", [scratch.to_string_lossy()])?;
        let bytes = std::fs::read(scratch).map_err(io)?;
        std::fs::remove_file(scratch).map_err(io)?;
        Ok(bytes)
    }
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<Result<RepoRow, ReposError>> {
    let status: String = row.get(2)?;
    let Some(parsed) = RepoStatus::parse(&status) else { return Ok(Err(ReposError::BadStatus(status))) };
    let unsigned = |v: Option<i64>| v.map(|v| v.max(0) as u64);
    Ok(Ok(RepoRow {
        did: row.get(0)?,
        host: row.get(1)?,
        status: parsed,
        rev: unsigned(row.get(3)?),
        stamp: unsigned(row.get(4)?),
        records: row.get::<_, i64>(5)?.max(0) as u64,
        links: row.get::<_, i64>(6)?.max(0) as u64,
        attempts: row.get(7)?,
        last_error: row.get(8)?,
        next_attempt_ms: row.get::<_, i64>(9)?.max(0) as u64,
    }))
}

fn to_sql(value: u64) -> Result<i64, ReposError> {
    i64::try_from(value).map_err(|_| ReposError::OutOfRange(value))
}

fn cut(error: &str) -> String {
    error.chars().take(MAX_ERROR_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, ReposDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = ReposDb::open(&dir.path().join("repos.db")).unwrap();
        (dir, db)
    }

    fn listed(did: &str, rev: u64) -> Listed<'_> {
        Listed { did, host: "https://pds.example", rev: Some(rev), inactive: None }
    }

    #[test]
    fn listings_queue_new_repos_and_requeue_only_newer_revisions() {
        let (_dir, db) = open();
        assert_eq!(db.offer(&[listed("did:plc:a", 10), listed("did:plc:b", 10)], 1).unwrap(), 2);
        db.mark_done("did:plc:a", 10, 7, 3, 5, 2).unwrap();
        assert_eq!(db.offer(&[listed("did:plc:a", 10)], 3).unwrap(), 0, "same revision: skipped");
        assert_eq!(db.get("did:plc:a").unwrap().unwrap().status, RepoStatus::Done);
        assert_eq!(db.offer(&[listed("did:plc:a", 11)], 4).unwrap(), 1, "newer revision: fetched again");
        let row = db.get("did:plc:a").unwrap().unwrap();
        assert_eq!((row.status, row.rev, row.stamp), (RepoStatus::Pending, Some(10), Some(7)), "indexed state kept");
        db.mark_unchanged("did:plc:a", 5).unwrap();
        assert_eq!(db.get("did:plc:a").unwrap().unwrap().status, RepoStatus::Done);
        let inactive = Listed { inactive: Some(RepoStatus::Takendown), ..listed("did:plc:c", 1) };
        assert_eq!(db.offer(&[inactive], 5).unwrap(), 0);
        assert_eq!(db.get("did:plc:c").unwrap().unwrap().status, RepoStatus::Takendown);
        let counts = db.counts().unwrap();
        assert_eq!(counts[&RepoStatus::Pending], 1);
        assert_eq!(counts[&RepoStatus::Done], 1);
        assert_eq!(counts[&RepoStatus::Takendown], 1);
    }

    #[test]
    fn retries_are_scheduled_then_given_up() {
        let (_dir, db) = open();
        db.offer(&[listed("did:plc:a", 1)], 0).unwrap();
        assert_eq!(db.mark_retry("did:plc:a", "HTTP 500", 100, 3, 1).unwrap(), RepoStatus::Pending);
        assert!(db.due(10, 99, 3).unwrap().is_empty(), "not before its retry time");
        assert_eq!(db.due(10, 100, 3).unwrap().len(), 1);
        assert_eq!(db.next_due_ms().unwrap(), Some(100));
        assert_eq!(db.mark_retry("did:plc:a", "HTTP 500", 200, 3, 2).unwrap(), RepoStatus::Pending);
        assert_eq!(db.mark_retry("did:plc:a", &"x".repeat(2000), 300, 3, 3).unwrap(), RepoStatus::Failed);
        let row = db.get("did:plc:a").unwrap().unwrap();
        assert_eq!((row.attempts, row.last_error.unwrap().len()), (3, MAX_ERROR_CHARS));
        assert!(db.due(10, u64::MAX >> 1, 3).unwrap().is_empty());
        assert_eq!(db.next_due_ms().unwrap(), None);
    }

    #[test]
    fn rejected_repos_wait_their_turn_keep_their_count_and_run_out_of_attempts() {
        let (_dir, db) = open();
        db.offer(&[listed("did:plc:a", 1)], 0).unwrap();
        db.mark_rejected("did:plc:a", "bad signature", 1_000, 1).unwrap();
        assert_eq!(db.next_due_ms().unwrap(), None, "a rejected repo does not hold a run open");
        assert!(db.due(10, 999, 3).unwrap().is_empty());
        assert_eq!(db.due(10, 1_000, 3).unwrap().len(), 1, "a later run tries again");
        assert_eq!(db.offer(&[listed("did:plc:a", 2)], 2).unwrap(), 0, "a listing does not reset it");
        let row = db.get("did:plc:a").unwrap().unwrap();
        assert_eq!((row.status, row.attempts), (RepoStatus::Rejected, 1));
        db.mark_rejected("did:plc:a", "bad signature", 2_000, 3).unwrap();
        db.mark_rejected("did:plc:a", "bad signature", 3_000, 4).unwrap();
        assert!(db.due(10, 10_000, 3).unwrap().is_empty(), "out of attempts");
        assert_eq!(db.rejected(10).unwrap(), vec![("did:plc:a".to_string(), "bad signature".to_string())]);
        db.postpone("did:plc:a", "host paused", 20_000, 5).unwrap();
        assert_eq!(db.get("did:plc:a").unwrap().unwrap().attempts, 3, "postponing counts no attempt");
    }

    #[test]
    fn undurable_snapshots_go_back_to_pending() {
        let (_dir, db) = open();
        db.offer(&[listed("did:plc:a", 1), listed("did:plc:b", 1)], 0).unwrap();
        db.mark_done("did:plc:a", 1, 50, 1, 1, 1).unwrap();
        db.mark_done("did:plc:b", 1, 51, 1, 1, 1).unwrap();
        assert_eq!(db.reset_undurable(50).unwrap(), 1);
        assert_eq!(db.get("did:plc:a").unwrap().unwrap().status, RepoStatus::Done);
        assert_eq!(db.get("did:plc:b").unwrap().unwrap().status, RepoStatus::Pending);
    }

    #[test]
    fn live_revisions_only_rise_and_listings_resume() {
        let (dir, db) = open();
        db.record_live_revs([("did:plc:a", 9), ("did:plc:b", 4)]).unwrap();
        db.record_live_revs([("did:plc:a", 5)]).unwrap();
        assert_eq!(db.live_rev("did:plc:a").unwrap(), Some(9));
        assert_eq!(db.live_rev("did:plc:z").unwrap(), None);
        assert_eq!(db.listing("relay").unwrap(), Listing::default());
        let listing = Listing { cursor: Some("c1".into()), complete: false, pages: 3, dids: 2_000 };
        db.set_listing("relay", &listing).unwrap();
        assert_eq!(db.listing("relay").unwrap(), listing);
        let copy = db.snapshot_bytes(&dir.path().join("copy.db")).unwrap();
        assert!(copy.starts_with(b"SQLite format 3\0"));
    }

    #[test]
    fn account_statuses_map_to_repo_statuses() {
        assert_eq!(RepoStatus::from_account_status("RepoTakendown"), Some(RepoStatus::Takendown));
        assert_eq!(RepoStatus::from_account_status("deactivated"), Some(RepoStatus::Deactivated));
        assert_eq!(RepoStatus::from_account_status("RepoNotFound"), Some(RepoStatus::NotFound));
        assert_eq!(RepoStatus::from_account_status("throttled"), None);
        for status in RepoStatus::ALL {
            assert_eq!(RepoStatus::parse(status.as_str()), Some(status));
        }
    }
}
