//! A local copy of the PLC directory: for each did:plc, its operation log pruned to what later
//! operations can still be checked against (`PlcLog::prune`), and the signing key and PDS its
//! head gives. Filled from the directory's bulk export (`/export?after=<seq>`, on the directory
//! or a mirror of it), a page at a time, every operation checked by the method's rules against
//! the log the table holds; kept current by the same export and by `#identity` events, which
//! mark a DID stale so that its next resolution reads its whole log from the directory.
//!
//! At network scale this answers most resolutions with no request at all; per-DID resolution
//! (`resolve`) remains for did:web, for what the table lacks, and for what it marked stale.
//!
//! Invariants:
//! - An operation is stored only when it applies to the log held for its DID (or is the genesis
//!   of a DID not yet held); one that does not is counted and skipped, and its DID marked stale
//!   (the table may lack what the operation builds on).
//! - The export position moves forward only, in the transaction that stores its page: a crash
//!   loses or repeats nothing.
//! - `lookup` answers only for fresh entries; a stale or missing DID is someone else's to
//!   resolve, and `store` replaces its entry with the checked result.
//! - A page is at most `MAX_PAGE_BYTES` and `PAGE_COUNT` operations, their `seq` increasing.

use super::plc::{LogEntry, PlcLog, PlcState};
use crate::model::syntax::validate_did;
use crate::net::http::{HttpClient, Limits};
use rusqlite::{Connection, OptionalExtension, params};
use rusqlite_migration::{M, Migrations};
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Operations asked for per export page (the directory's maximum).
pub const PAGE_COUNT: usize = 1_000;
/// Largest export page read (1,000 operations of at most 7,500 bytes, as JSON).
pub const MAX_PAGE_BYTES: usize = 32 << 20;

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![M::up(include_str!("../../migrations/plc/0001_plc.sql"))])
}

#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("plc.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("plc.db migration: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("plc.db: a stored log of {did} is unreadable: {reason}")]
    BadLog { did: String, reason: String },
    #[error("PLC export: {0}")]
    Export(String),
    #[error("plc.db lock poisoned")]
    Poisoned,
}

/// What one export page did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageReport {
    pub operations: usize,
    pub applied: usize,
    pub refused: usize,
    /// The export position after the page.
    pub after: u64,
}

/// The table and its export position.
pub struct Directory {
    db: Mutex<Connection>,
}

impl Directory {
    pub fn open(path: &Path) -> Result<Self, DirectoryError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(10))?;
        migrations().to_latest(&mut conn)?;
        Ok(Directory { db: Mutex::new(conn) })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, DirectoryError> {
        self.db.lock().map_err(|_| DirectoryError::Poisoned)
    }

    /// The state of `did`'s head, when the table holds a fresh entry for it.
    pub fn lookup(&self, did: &str) -> Result<Option<PlcState>, DirectoryError> {
        let db = self.lock()?;
        let log: Option<Vec<u8>> =
            db.query_row("SELECT log FROM dids WHERE did = ?1 AND stale = 0", [did], |r| r.get(0)).optional()?;
        drop(db);
        let Some(bytes) = log else { return Ok(None) };
        let log = read_log(did, &bytes)?;
        Ok(log.state().cloned())
    }

    /// Replaces `did`'s entry with a log checked elsewhere (a whole audit log), fresh.
    pub fn store(&self, did: &str, log: &PlcLog) -> Result<(), DirectoryError> {
        let mut log = log.clone();
        log.prune();
        let db = self.lock()?;
        db.execute(
            "INSERT INTO dids (did, log, stale) VALUES (?1, ?2, 0)
             ON CONFLICT (did) DO UPDATE SET log = excluded.log, stale = 0",
            params![did, log.to_bytes()],
        )?;
        Ok(())
    }

    /// `did` changed (an `#identity` event) or failed to verify: ask the directory next time.
    pub fn mark_stale(&self, did: &str) -> Result<(), DirectoryError> {
        self.lock()?.execute("UPDATE dids SET stale = 1 WHERE did = ?1", [did])?;
        Ok(())
    }

    /// Where the export stands: the `seq` of the last operation taken.
    pub fn position(&self) -> Result<u64, DirectoryError> {
        let after: i64 = self.lock()?.query_row("SELECT after FROM export WHERE id = 0", [], |r| r.get(0))?;
        Ok(after.max(0) as u64)
    }

    /// How many DIDs the table holds, and how many of them are stale.
    pub fn counts(&self) -> Result<(u64, u64), DirectoryError> {
        let db = self.lock()?;
        let (all, stale): (i64, i64) =
            db.query_row("SELECT count(*), coalesce(sum(stale), 0) FROM dids", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((all.max(0) as u64, stale.max(0) as u64))
    }

    /// Applies one export page (JSON lines, `seq` after the position) in one transaction.
    pub fn apply_page(&self, page: &[u8]) -> Result<PageReport, DirectoryError> {
        let lines = parse_page(page)?;
        let mut db = self.lock()?;
        let tx = db.transaction()?;
        let after: i64 = tx.query_row("SELECT after FROM export WHERE id = 0", [], |r| r.get(0))?;
        let mut report = PageReport { after: after.max(0) as u64, ..PageReport::default() };
        for line in &lines {
            if line.seq <= report.after {
                return Err(DirectoryError::Export(format!("seq {} is not after {}", line.seq, report.after)));
            }
            report.after = line.seq;
            report.operations += 1;
            match apply_line(&tx, line)? {
                true => report.applied += 1,
                false => report.refused += 1,
            }
        }
        tx.execute(
            "UPDATE export SET after = ?1, applied = applied + ?2, refused = refused + ?3 WHERE id = 0",
            params![report.after as i64, report.applied as i64, report.refused as i64],
        )?;
        tx.commit()?;
        Ok(report)
    }

    /// Fetches and applies the next export page from `plc_url`.
    pub async fn sync_page(
        self: &Arc<Self>,
        http: &HttpClient,
        plc_url: &str,
        timeout: Duration,
    ) -> Result<PageReport, DirectoryError> {
        let after = self.position()?;
        let url = format!("{}/export?count={PAGE_COUNT}&after={after}", plc_url.trim_end_matches('/'));
        let response = http
            .get(&url, Limits::new(MAX_PAGE_BYTES, timeout))
            .await
            .map_err(|e| DirectoryError::Export(e.to_string()))?;
        if !response.is_success() {
            return Err(DirectoryError::Export(format!("{url} answered {}", response.status)));
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.apply_page(&response.body))
            .await
            .map_err(|e| DirectoryError::Export(e.to_string()))?
    }

    /// Follows the export for as long as the process runs: page after page while they come full,
    /// then one page every `poll`; failures wait `poll` and try again.
    pub async fn follow(self: Arc<Self>, http: HttpClient, plc_url: String, poll: Duration) {
        loop {
            match self.sync_page(&http, &plc_url, poll.max(Duration::from_secs(30))).await {
                Ok(report) if report.operations == PAGE_COUNT => continue,
                Ok(report) => tracing::debug!(after = report.after, "PLC export caught up"),
                Err(e) => tracing::warn!(error = %e, "PLC export page failed; trying again later"),
            }
            tokio::time::sleep(poll).await;
        }
    }
}

/// One line of an export page.
struct ExportLine {
    seq: u64,
    did: String,
    operation: Value,
    cid: Option<String>,
    created_at: String,
}

fn parse_page(page: &[u8]) -> Result<Vec<ExportLine>, DirectoryError> {
    if page.len() > MAX_PAGE_BYTES {
        return Err(DirectoryError::Export(format!("a page longer than {MAX_PAGE_BYTES} bytes")));
    }
    let mut lines = Vec::new();
    for raw in page.split(|&b| b == b'\n').filter(|line| !line.iter().all(u8::is_ascii_whitespace)) {
        if lines.len() >= PAGE_COUNT {
            return Err(DirectoryError::Export(format!("a page of more than {PAGE_COUNT} operations")));
        }
        let value: Value = serde_json::from_slice(raw).map_err(|e| DirectoryError::Export(format!("a line: {e}")))?;
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
        let seq = value
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or_else(|| DirectoryError::Export("a line without seq".into()))?;
        let (Some(did), Some(created_at), Some(operation)) = (field("did"), field("createdAt"), value.get("operation"))
        else {
            return Err(DirectoryError::Export(format!("operation {seq} lacks did, createdAt or operation")));
        };
        lines.push(ExportLine { seq, did, operation: operation.clone(), cid: field("cid"), created_at });
    }
    Ok(lines)
}

/// Applies one operation to its DID's stored log; false (and the DID marked stale) when the
/// rules refuse it.
fn apply_line(tx: &rusqlite::Transaction<'_>, line: &ExportLine) -> Result<bool, DirectoryError> {
    if validate_did(&line.did).is_err() || !line.did.starts_with("did:plc:") {
        return Ok(false);
    }
    let stored: Option<(Vec<u8>, bool)> = tx
        .query_row("SELECT log, stale FROM dids WHERE did = ?1", [&line.did], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let mut log = match &stored {
        Some((bytes, _)) => read_log(&line.did, bytes)?,
        None => PlcLog::new(&line.did),
    };
    let entry = LogEntry { operation: &line.operation, cid: line.cid.as_deref(), created_at: &line.created_at };
    match log.apply(&entry) {
        Ok(()) => {
            log.prune();
            let stale = stored.is_some_and(|(_, stale)| stale);
            tx.execute(
                "INSERT INTO dids (did, log, stale) VALUES (?1, ?2, ?3)
                 ON CONFLICT (did) DO UPDATE SET log = excluded.log",
                params![line.did, log.to_bytes(), stale],
            )?;
            Ok(true)
        }
        Err(reason) => {
            tracing::debug!(did = line.did, seq = line.seq, reason, "PLC export operation refused");
            if stored.is_some() {
                tx.execute("UPDATE dids SET stale = 1 WHERE did = ?1", [&line.did])?;
            }
            Ok(false)
        }
    }
}

fn read_log(did: &str, bytes: &[u8]) -> Result<PlcLog, DirectoryError> {
    PlcLog::from_bytes(did, bytes).map_err(|reason| DirectoryError::BadLog { did: did.to_string(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::plc::audit;

    fn fixture(kind: &str, name: &str) -> Vec<Value> {
        let path = format!("{}/tests/data/plc/audit_log/{kind}/{name}.json", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The export's lines for several logs, interleaved (one operation of each in turn), from `seq`.
    fn export_page(logs: &[Vec<Value>], first_seq: u64) -> Vec<u8> {
        let mut lines = Vec::new();
        let longest = logs.iter().map(Vec::len).max().unwrap_or(0);
        let mut seq = first_seq;
        for at in 0..longest {
            for entry in logs.iter().filter_map(|log| log.get(at)) {
                let mut line = entry.clone();
                let fields = line.as_object_mut().unwrap();
                fields.remove("nullified"); // the seq export has none
                fields.insert("seq".into(), seq.into());
                fields.insert("type".into(), "sequenced_op".into());
                seq += 1;
                lines.push(line.to_string());
            }
        }
        lines.join("\n").into_bytes()
    }

    fn open() -> (tempfile::TempDir, Directory) {
        let dir = tempfile::tempdir().unwrap();
        let directory = Directory::open(&dir.path().join("plc.db")).unwrap();
        (dir, directory)
    }

    const VALID: [&str; 6] = [
        "log_bskyapp",
        "log_legacy_dholms",
        "log_nullification",
        "log_nullification_nontrivial",
        "log_nullified_tombstone",
        "log_tombstone",
    ];

    #[test]
    fn an_export_gives_every_did_the_state_its_audit_log_gives() {
        let (_dir, directory) = open();
        let logs: Vec<Vec<Value>> = VALID.iter().map(|name| fixture("valid", name)).collect();
        let page = export_page(&logs, 1);
        let operations = logs.iter().map(Vec::len).sum::<usize>();
        let report = directory.apply_page(&page).unwrap();
        assert_eq!(report, PageReport { operations, applied: operations, refused: 0, after: operations as u64 });
        assert_eq!(directory.position().unwrap(), operations as u64);
        for (name, log) in VALID.iter().zip(&logs) {
            let did = log[0]["did"].as_str().unwrap();
            let (_, expected) = audit(did, log).unwrap();
            assert_eq!(directory.lookup(did).unwrap(), Some(expected), "{name}");
        }
        assert_eq!(directory.counts().unwrap(), (VALID.len() as u64, 0));
    }

    #[test]
    fn a_refused_operation_is_counted_and_its_did_goes_stale() {
        let (_dir, directory) = open();
        let bad = fixture("invalid", "log_invalid_update_tombstoned");
        let good = fixture("valid", "log_bskyapp");
        let report = directory.apply_page(&export_page(&[bad.clone(), good.clone()], 1)).unwrap();
        assert_eq!((report.applied, report.refused), (good.len() + bad.len() - 1, 1));
        assert_eq!(directory.lookup(bad[0]["did"].as_str().unwrap()).unwrap(), None, "stale: ask the directory");
        assert!(directory.lookup(good[0]["did"].as_str().unwrap()).unwrap().is_some());
        assert_eq!(directory.counts().unwrap(), (2, 1));
    }

    #[test]
    fn the_position_only_moves_forward_and_a_bad_page_changes_nothing() {
        let (_dir, directory) = open();
        let log = fixture("valid", "log_bskyapp");
        directory.apply_page(&export_page(std::slice::from_ref(&log), 5)).unwrap();
        assert_eq!(directory.position().unwrap(), 6);
        let replay = directory.apply_page(&export_page(std::slice::from_ref(&log), 5));
        assert!(matches!(replay, Err(DirectoryError::Export(_))), "{replay:?}");
        assert_eq!(directory.position().unwrap(), 6);
        assert!(directory.apply_page(b"{not json").is_err());
        // Lines that parse, so only the count refuses the page.
        let line = |i: usize| {
            let seq = 100 + i;
            format!(r#"{{"seq":{seq},"did":"did:plc:x","createdAt":"2024-01-01T00:00:00Z","operation":{{}}}}"#)
        };
        let too_many: Vec<String> = (0..=PAGE_COUNT).map(line).collect();
        let refused = directory.apply_page(too_many.join("\n").as_bytes());
        assert!(format!("{refused:?}").contains("more than 1000 operations"), "{refused:?}");
        assert_eq!(directory.position().unwrap(), 6);
    }

    #[test]
    fn stale_entries_are_not_answered_until_a_checked_log_replaces_them() {
        let (_dir, directory) = open();
        let log = fixture("valid", "log_bnewbold_robocracy");
        let did = log[0]["did"].as_str().unwrap();
        assert_eq!(directory.lookup(did).unwrap(), None);
        let (whole, state) = audit(did, &log).unwrap();
        directory.store(did, &whole).unwrap();
        assert_eq!(directory.lookup(did).unwrap(), Some(state.clone()));
        directory.mark_stale(did).unwrap();
        assert_eq!(directory.lookup(did).unwrap(), None);
        directory.store(did, &whole).unwrap();
        assert_eq!(directory.lookup(did).unwrap(), Some(state));
    }
}
