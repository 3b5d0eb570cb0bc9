//! The local catalog (`state/state.db`): every table and its run, upload state and obsolescence;
//! the ingest cursor and clock that the committed tables cover; non-active accounts; published
//! manifests; a durable counter for table ids.
//!
//! Invariants:
//! - A commit of this database is THE durability point of the engine: a flush's tables, the
//!   ingest position they cover and the account states they saw are committed in one transaction
//!   (`commit_flush`), with `synchronous = FULL`, so after a crash the catalog names exactly the
//!   tables of the flushes that completed and the cursor to replay from. (Outline strings those
//!   tables refer to were persisted before, by `Outlines::persist`.)
//! - The ingest clock never goes backwards: a flush that would lower it is refused.
//! - A run is created whole, by one commit: its tables agree on tree, kind and shard count, each
//!   shard appears once, and no later commit adds tables to it. A delta run is one table.
//! - Compaction retires runs and adds their replacement in one transaction (`replace_runs`); a
//!   retired table keeps its row, stamped with the time it became obsolete, until GC removes it.
//!   `tables()` and `pending_uploads()` only ever list live tables.
//! - Table and run ids are 1..=128 bytes of `[A-Za-z0-9._-]`: they become object key segments.
//! - Manifest generations strictly increase; the newest `MANIFEST_HISTORY` are kept.
//! - Counts, lengths, stamps and times are stored as SQLite integers; a value above `i64::MAX` is
//!   refused (`OutOfRange`), never wrapped. DID ids are stored as i64 bit casts.

use crate::account_log::PackedAccounts;
use crate::lsm::record::{RunKind, TableRecord};
use crate::model::account::AccountState;
use crate::model::ids::TreeKind;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use rusqlite_migration::{M, Migrations};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// How many recorded manifests the catalog keeps.
pub const MANIFEST_HISTORY: u64 = 1024;
/// Longest table id or run id, in bytes.
pub const MAX_TABLE_ID_LEN: usize = 128;
/// Longest manifest name, in bytes.
pub const MAX_MANIFEST_NAME_LEN: usize = 256;

/// Schema versions of `state.db`, oldest first. Append only: never edit a released migration.
/// The schema's migrations, oldest first.
fn migrations_sql() -> Vec<&'static str> {
    vec![
        include_str!("../migrations/state/0001_catalog.sql"),
        include_str!("../migrations/state/0002_forward_tree.sql"),
        include_str!("../migrations/state/0003_count_trees.sql"),
        include_str!("../migrations/state/0004_account_tallies.sql"),
        include_str!("../migrations/state/0005_account_log.sql"),
    ]
}

fn migrations() -> Migrations<'static> {
    Migrations::new(migrations_sql().into_iter().map(M::up).collect())
}

/// What `sync_to_manifest` applies.
#[derive(Debug)]
pub struct ManifestSync<'a> {
    pub generation: u64,
    pub name: &'a str,
    pub retired_runs: &'a [String],
    pub added: &'a [TableRecord],
    pub position: IngestPosition,
    pub accounts: AccountSync<'a>,
    /// The next table sequence number must be at least this (past every id in the bucket).
    pub min_table_seq: u64,
}

/// What a manifest changes of the account states.
#[derive(Debug)]
pub struct AccountSync<'a> {
    /// Every hidden account, replacing all the catalog holds (`None`: keep them).
    pub replace: Option<&'a PackedAccounts>,
    /// Ranges of changes applied after, in order.
    pub changes: &'a [PackedAccounts],
    /// The account change they are as of: this machine's next one comes after it.
    pub through: u64,
}

/// The firehose cursor to resume from and the ingest clock after the last covered operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestPosition {
    pub cursor: Option<i64>,
    pub clock: u64,
}

/// Everything one flush commits, atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushRecord {
    pub tables: Vec<TableRecord>,
    pub position: IngestPosition,
    /// (did id, state) changes seen by the operations this flush covers, in order.
    pub accounts: Vec<(u64, AccountState)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("state.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("state.db migration: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("creating {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid table {id:?}: {reason}")]
    InvalidTable { id: String, reason: &'static str },
    #[error("invalid manifest name {name:?}")]
    InvalidManifestName { name: String },
    #[error("{what} {value} does not fit in a SQLite integer")]
    OutOfRange { what: &'static str, value: u64 },
    #[error("ingest clock would go backwards from {stored} to {given}")]
    ClockRegressed { stored: u64, given: u64 },
    #[error("no table {id:?}")]
    UnknownTable { id: String },
    #[error("no live run {run_id:?}")]
    UnknownRun { run_id: String },
    #[error("manifest generation {given} is not after {last}")]
    ManifestRegressed { last: u64, given: u64 },
    #[error("state.db is corrupt: {0}")]
    Corrupt(String),
    #[error("a thread panicked while holding the catalog lock")]
    Poisoned,
}

/// The catalog: one SQLite connection behind a mutex.
#[derive(Debug)]
pub struct Catalog {
    db: Mutex<Connection>,
}

const TABLE_COLUMNS: &str =
    "id, tree, run_id, run_kind, shard, shard_count, entries, data_len, meta_len, uploaded, min_stamp, max_stamp";

impl Catalog {
    /// Opens (creating it and its directory if needed) `state.db` and applies migrations.
    pub fn open(path: &Path) -> Result<Self, CatalogError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| CatalogError::Io { path: dir.to_owned(), source })?;
        }
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrations().to_latest(&mut conn)?;
        Ok(Self { db: Mutex::new(conn) })
    }

    /// Commits a flush: its tables, the ingest position they cover, and account state changes
    /// (`Active` deletes the account's row), all or nothing.
    pub fn commit_flush(&self, flush: &FlushRecord) -> Result<(), CatalogError> {
        validate_new_tables(&flush.tables)?;
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        insert_tables(&tx, &flush.tables)?;
        set_position(&tx, &flush.position)?;
        if !flush.accounts.is_empty() {
            let seq = take_counter(&tx, "account_seq")?;
            for (did, state) in &flush.accounts {
                set_account_state(&tx, *did, *state)?;
                record_account_change(&tx, *did, *state, seq)?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Retires the live runs `removed` (stamping their tables obsolete at `obsolete_at`, unix
    /// milliseconds) and adds `added`, all or nothing. Fails with `UnknownRun` if a removed run is
    /// missing or already retired, which catches two compactions racing for the same runs.
    pub fn replace_runs(&self, removed: &[&str], added: &[TableRecord], obsolete_at: u64) -> Result<(), CatalogError> {
        validate_new_tables(added)?;
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for run_id in removed {
            let retired = tx.execute(
                "UPDATE tables SET obsolete_at = ?1 WHERE run_id = ?2 AND obsolete_at IS NULL",
                params![sql_int("obsolete_at", obsolete_at)?, run_id],
            )?;
            if retired == 0 {
                return Err(CatalogError::UnknownRun { run_id: run_id.to_string() });
            }
        }
        insert_tables(&tx, added)?;
        tx.commit()?;
        Ok(())
    }

    /// Live tables, oldest first.
    pub fn tables(&self) -> Result<Vec<TableRecord>, CatalogError> {
        self.query_tables(&format!("SELECT {TABLE_COLUMNS} FROM tables WHERE obsolete_at IS NULL ORDER BY seq"), [])
    }

    /// Live tables not yet uploaded, oldest first.
    pub fn pending_uploads(&self) -> Result<Vec<TableRecord>, CatalogError> {
        let sql = format!("SELECT {TABLE_COLUMNS} FROM tables WHERE uploaded = 0 AND obsolete_at IS NULL ORDER BY seq");
        self.query_tables(&sql, [])
    }

    /// Retired tables that became obsolete at or before `before` (unix milliseconds), with the
    /// time they did, oldest first: the candidates for GC.
    pub fn obsolete_tables(&self, before: u64) -> Result<Vec<(TableRecord, u64)>, CatalogError> {
        let db = self.lock()?;
        let sql = format!(
            "SELECT {TABLE_COLUMNS}, obsolete_at FROM tables
             WHERE obsolete_at IS NOT NULL AND obsolete_at <= ?1 ORDER BY obsolete_at, seq"
        );
        let mut query = db.prepare_cached(&sql)?;
        let before = sql_int("obsolete time", before.min(i64::MAX as u64))?;
        let rows = query.query_map([before], |row| Ok((table_from_row(row)?, u64_at(row, 12)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Makes the catalog say exactly what a published manifest says (a restore, or a replica
    /// following the writer), in one transaction: live tables the manifest does not name are
    /// retired at `now_ms`, the ones it adds are inserted as uploaded, the position, the hidden
    /// accounts and the manifest itself are recorded, and the table counter moves past `min_seq`.
    pub fn sync_to_manifest(&self, sync: &ManifestSync<'_>, now_ms: u64) -> Result<(), CatalogError> {
        validate_new_tables(sync.added)?;
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for run_id in sync.retired_runs {
            tx.execute(
                "UPDATE tables SET obsolete_at = ?1 WHERE run_id = ?2 AND obsolete_at IS NULL",
                params![sql_int("obsolete_at", now_ms)?, run_id],
            )?;
        }
        insert_tables(&tx, sync.added)?;
        set_position(&tx, &sync.position)?;
        if let Some(hidden) = sync.accounts.replace {
            tx.execute("DELETE FROM accounts", [])?;
            for (did, state) in hidden.iter() {
                set_account_state(&tx, did, state)?;
            }
        }
        for (did, state) in sync.accounts.changes.iter().flat_map(PackedAccounts::iter) {
            set_account_state(&tx, did, state)?;
        }
        // What the manifest says is published; this machine's own changes come after it.
        tx.execute("DELETE FROM account_changes", [])?;
        raise_counter(&tx, "account_seq", sync.accounts.through.saturating_add(1))?;
        raise_counter(&tx, "table_seq", sync.min_table_seq.max(1))?;
        tx.execute(
            "INSERT OR IGNORE INTO manifests (generation, name) VALUES (?1, ?2)",
            params![sql_int("generation", sync.generation)?, sync.name],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Forgets a retired table whose objects and files are gone (the end of its GC).
    pub fn forget_table(&self, table_id: &str) -> Result<(), CatalogError> {
        let removed =
            self.lock()?.execute("DELETE FROM tables WHERE id = ?1 AND obsolete_at IS NOT NULL", [table_id])?;
        if removed == 0 {
            return Err(CatalogError::UnknownTable { id: table_id.to_owned() });
        }
        Ok(())
    }

    /// Ids of every table the catalog knows, live or retired (what is not here is an orphan).
    pub fn known_table_ids(&self) -> Result<std::collections::HashSet<String>, CatalogError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached("SELECT id FROM tables")?;
        let ids = query.query_map([], |row| row.get::<_, String>(0))?;
        Ok(ids.collect::<Result<_, _>>()?)
    }

    pub fn mark_uploaded(&self, table_id: &str) -> Result<(), CatalogError> {
        let changed = self.lock()?.execute("UPDATE tables SET uploaded = 1 WHERE id = ?1", [table_id])?;
        if changed == 0 {
            return Err(CatalogError::UnknownTable { id: table_id.to_owned() });
        }
        Ok(())
    }

    pub fn position(&self) -> Result<IngestPosition, CatalogError> {
        let db = self.lock()?;
        let position = db.query_row("SELECT cursor, clock FROM ingest_position WHERE singleton = 1", [], |row| {
            Ok(IngestPosition { cursor: row.get(0)?, clock: u64_at(row, 1)? })
        })?;
        Ok(position)
    }

    /// The committed states of those of `dids` that have one (an account never seen, or active,
    /// has none).
    pub fn account_states(
        &self,
        dids: impl IntoIterator<Item = u64>,
    ) -> Result<std::collections::HashMap<u64, AccountState>, CatalogError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached("SELECT state FROM accounts WHERE did = ?1")?;
        let mut states = std::collections::HashMap::new();
        for did in dids {
            let state: Option<String> = query.query_row([did as i64], |row| row.get(0)).optional()?;
            if let Some(state) = state {
                states.insert(did, AccountState::parse(&state));
            }
        }
        Ok(states)
    }

    /// Accounts whose links queries must hide, by did id, in order.
    #[cfg(test)]
    pub fn hidden_accounts(&self) -> Result<Vec<(u64, AccountState)>, CatalogError> {
        let mut hidden = Vec::new();
        self.visit_hidden_accounts(|did, state| hidden.push((did, state)))?;
        Ok(hidden)
    }

    /// Hands every hidden account to `visit` in did order without collecting them (a snapshot
    /// packs them as they come, and there may be millions); returns the account change they are
    /// as of.
    pub fn visit_hidden_accounts(&self, mut visit: impl FnMut(u64, AccountState)) -> Result<u64, CatalogError> {
        let db = self.lock()?;
        let through = last_account_seq(&db)?;
        visit_account_rows(&db, "accounts WHERE true", [], |did, state| {
            if state.is_hidden() {
                visit(did, state);
            }
        })?;
        Ok(through)
    }

    /// Hands the newest state of every account changed after account change `after` to `visit`
    /// in did order; returns the account change they are as of (`after` when none changed).
    pub fn visit_account_changes(
        &self,
        after: u64,
        mut visit: impl FnMut(u64, AccountState),
    ) -> Result<u64, CatalogError> {
        let db = self.lock()?;
        let through = last_account_seq(&db)?;
        if through <= after {
            return Ok(after);
        }
        visit_account_rows(&db, "account_changes WHERE seq > ?1", [sql_int("account change", after)?], &mut visit)?;
        Ok(through)
    }

    /// Forgets the account changes up to `through`, which a recorded manifest's log covers.
    pub fn forget_published_account_changes(&self, through: u64) -> Result<(), CatalogError> {
        self.lock()?.execute("DELETE FROM account_changes WHERE seq <= ?1", [sql_int("account change", through)?])?;
        Ok(())
    }

    /// Of the `unnamed` objects (not named by the newest manifest), those first found so at or
    /// before `before` (unix milliseconds); the others are remembered from `now_ms`, and objects
    /// remembered before but not in `unnamed` (named again, or deleted) are forgotten.
    pub fn unnamed_objects_since(
        &self,
        unnamed: &[String],
        now_ms: u64,
        before: u64,
    ) -> Result<Vec<String>, CatalogError> {
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let known: HashMap<String, u64> = {
            let mut query = tx.prepare_cached("SELECT key, since FROM unnamed_objects")?;
            let rows = query.query_map([], |row| Ok((row.get::<_, String>(0)?, u64_at(row, 1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let unnamed_now: HashSet<&String> = unnamed.iter().collect();
        for key in known.keys().filter(|key| !unnamed_now.contains(key)) {
            tx.execute("DELETE FROM unnamed_objects WHERE key = ?1", [key])?;
        }
        let mut due = Vec::new();
        for key in unnamed {
            match known.get(key) {
                Some(since) if *since <= before => due.push(key.clone()),
                Some(_) => {}
                None => {
                    tx.execute(
                        "INSERT INTO unnamed_objects (key, since) VALUES (?1, ?2)",
                        params![key, sql_int("time", now_ms)?],
                    )?;
                }
            }
        }
        tx.commit()?;
        Ok(due)
    }

    /// The next value of the durable table counter: 1, 2, 3, ... across restarts.
    pub fn next_table_seq(&self) -> Result<u64, CatalogError> {
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = take_counter(&tx, "table_seq")?;
        tx.commit()?;
        Ok(value)
    }

    /// Records that manifest `name` of `generation` was published. Generations strictly increase.
    pub fn record_manifest(&self, generation: u64, name: &str) -> Result<(), CatalogError> {
        if name.is_empty() || name.len() > MAX_MANIFEST_NAME_LEN || !name.bytes().all(is_id_byte) {
            return Err(CatalogError::InvalidManifestName { name: name.chars().take(MAX_MANIFEST_NAME_LEN).collect() });
        }
        let mut db = self.lock()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some((last, _)) = last_manifest(&tx)?
            && generation <= last
        {
            return Err(CatalogError::ManifestRegressed { last, given: generation });
        }
        tx.execute(
            "INSERT INTO manifests (generation, name) VALUES (?1, ?2)",
            params![sql_int("generation", generation)?, name],
        )?;
        tx.execute(
            "DELETE FROM manifests WHERE generation NOT IN
             (SELECT generation FROM manifests ORDER BY generation DESC LIMIT ?1)",
            [MANIFEST_HISTORY as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The newest recorded manifest: (generation, name).
    pub fn last_manifest(&self) -> Result<Option<(u64, String)>, CatalogError> {
        last_manifest(&*self.lock()?)
    }

    fn query_tables<P: rusqlite::Params>(&self, sql: &str, params: P) -> Result<Vec<TableRecord>, CatalogError> {
        let db = self.lock()?;
        let mut query = db.prepare_cached(sql)?;
        let rows = query.query_map(params, table_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, CatalogError> {
        self.db.lock().map_err(|_| CatalogError::Poisoned)
    }
}

/// WAL with `synchronous = FULL`: a commit is on disk when it returns. This database is the
/// engine's durability point (see the module header), so NORMAL, which may lose the last commits
/// on power loss, is not acceptable here.
fn configure(conn: &Connection) -> Result<(), CatalogError> {
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(CatalogError::Corrupt(format!("cannot switch state.db to WAL (mode is {mode})")));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(())
}

fn last_manifest(conn: &Connection) -> Result<Option<(u64, String)>, CatalogError> {
    let sql = "SELECT generation, name FROM manifests ORDER BY generation DESC LIMIT 1";
    Ok(conn.query_row(sql, [], |row| Ok((u64_at(row, 0)?, row.get(1)?))).optional()?)
}

fn set_position(tx: &Transaction<'_>, position: &IngestPosition) -> Result<(), CatalogError> {
    let stored = tx.query_row("SELECT clock FROM ingest_position WHERE singleton = 1", [], |row| u64_at(row, 0))?;
    if position.clock < stored {
        return Err(CatalogError::ClockRegressed { stored, given: position.clock });
    }
    tx.execute(
        "UPDATE ingest_position SET cursor = ?1, clock = ?2 WHERE singleton = 1",
        params![position.cursor, sql_int("clock", position.clock)?],
    )?;
    Ok(())
}

/// The newest account change committed (0: none yet).
fn last_account_seq(conn: &Connection) -> Result<u64, CatalogError> {
    let next =
        conn.query_row("SELECT next FROM counters WHERE name = 'account_seq'", [], |row| u64_at(row, 0)).optional()?;
    Ok(next.unwrap_or(1) - 1)
}

/// The next value of durable counter `name` (1 the first time), moving it on.
fn take_counter(tx: &Transaction<'_>, name: &str) -> Result<u64, CatalogError> {
    let stored = tx.query_row("SELECT next FROM counters WHERE name = ?1", [name], |row| u64_at(row, 0)).optional()?;
    let value = stored.unwrap_or(1);
    let next = value.checked_add(1).ok_or_else(|| CatalogError::Corrupt(format!("counter {name} exhausted")))?;
    tx.execute(
        "INSERT INTO counters (name, next) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET next = excluded.next",
        params![name, sql_int("counter", next)?],
    )?;
    Ok(value)
}

/// Moves counter `name` to at least `next`.
fn raise_counter(tx: &Transaction<'_>, name: &str, next: u64) -> Result<(), CatalogError> {
    tx.execute(
        "INSERT INTO counters (name, next) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET next = max(next, excluded.next)",
        params![name, sql_int("counter", next)?],
    )?;
    Ok(())
}

/// Hands the (did, state) rows of `SELECT did, state FROM {rows}` to `visit` in did order,
/// dids cast back to u64. A did is stored as its bits cast to i64, so its u64 order is the
/// non-negative ones ascending, then the negative ones (bit 63 set: outlined DIDs) ascending.
fn visit_account_rows<P: rusqlite::Params + Clone>(
    conn: &Connection,
    rows: &str,
    params: P,
    mut visit: impl FnMut(u64, AccountState),
) -> Result<(), CatalogError> {
    for half in ["did >= 0", "did < 0"] {
        let mut statement = conn.prepare_cached(&format!("SELECT did, state FROM {rows} AND {half} ORDER BY did"))?;
        let mut found = statement.query(params.clone())?;
        while let Some(row) = found.next()? {
            visit(row.get::<_, i64>(0)? as u64, AccountState::parse(&row.get::<_, String>(1)?));
        }
    }
    Ok(())
}

// The statements of one account each are cached: a flush runs them for every account it changes
// and a replica's snapshot for every hidden account, and parsed again each time they took twice
// as long.
fn record_account_change(tx: &Transaction<'_>, did: u64, state: AccountState, seq: u64) -> Result<(), CatalogError> {
    tx.prepare_cached(
        "INSERT INTO account_changes (did, state, seq) VALUES (?1, ?2, ?3)
         ON CONFLICT (did) DO UPDATE SET state = excluded.state, seq = excluded.seq",
    )?
    .execute(params![did as i64, state.as_str(), sql_int("account change", seq)?])?;
    Ok(())
}

fn set_account_state(tx: &Transaction<'_>, did: u64, state: AccountState) -> Result<(), CatalogError> {
    // Bit cast: outlined DID ids have the top bit set.
    let did = did as i64;
    if state == AccountState::Active {
        tx.prepare_cached("DELETE FROM accounts WHERE did = ?1")?.execute([did])?;
    } else {
        tx.prepare_cached(
            "INSERT INTO accounts (did, state) VALUES (?1, ?2) ON CONFLICT (did) DO UPDATE SET state = excluded.state",
        )?
        .execute(params![did, state.as_str()])?;
    }
    Ok(())
}

/// Inserts the tables of new runs; fails if any of those runs already has tables.
fn insert_tables(tx: &Transaction<'_>, tables: &[TableRecord]) -> Result<(), CatalogError> {
    let mut run_exists = tx.prepare_cached("SELECT 1 FROM tables WHERE run_id = ?1 LIMIT 1")?;
    for table in tables {
        if run_exists.exists([&table.run_id])? {
            return Err(CatalogError::InvalidTable { id: table.id.clone(), reason: "its run already exists" });
        }
    }
    let mut insert = tx.prepare_cached(&format!(
        "INSERT INTO tables ({TABLE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?;
    for t in tables {
        insert.execute(params![
            t.id,
            t.tree.name(),
            t.run_id,
            t.run_kind.as_str(),
            t.shard,
            t.shard_count,
            sql_int("entries", t.entries)?,
            sql_int("data_len", t.data_len)?,
            sql_int("meta_len", t.meta_len)?,
            t.uploaded,
            sql_int("min_stamp", t.min_stamp)?,
            sql_int("max_stamp", t.max_stamp)?
        ])?;
    }
    Ok(())
}

fn table_from_row(row: &Row<'_>) -> rusqlite::Result<TableRecord> {
    let unknown = |column: usize, what: String| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, what.into())
    };
    let tree: String = row.get(1)?;
    let tree = TreeKind::from_name(&tree).ok_or_else(|| unknown(1, format!("tree {tree:?}")))?;
    let run_kind: String = row.get(3)?;
    let run_kind = RunKind::parse(&run_kind).ok_or_else(|| unknown(3, format!("run kind {run_kind:?}")))?;
    Ok(TableRecord {
        id: row.get(0)?,
        tree,
        run_id: row.get(2)?,
        run_kind,
        shard: row.get(4)?,
        shard_count: row.get(5)?,
        entries: u64_at(row, 6)?,
        data_len: u64_at(row, 7)?,
        meta_len: u64_at(row, 8)?,
        uploaded: row.get(9)?,
        min_stamp: u64_at(row, 10)?,
        max_stamp: u64_at(row, 11)?,
    })
}

/// A count, length, stamp or time as a SQLite integer: refused above `i64::MAX`, never wrapped.
fn sql_int(what: &'static str, value: u64) -> Result<i64, CatalogError> {
    i64::try_from(value).map_err(|_| CatalogError::OutOfRange { what, value })
}

/// The inverse of `sql_int`: a negative stored value is a conversion error, never wrapped.
fn u64_at(row: &Row<'_>, index: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(index)?;
    u64::try_from(value)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Integer, e.into()))
}

fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Checks each table on its own, and that the tables of each run agree and name distinct shards.
fn validate_new_tables(tables: &[TableRecord]) -> Result<(), CatalogError> {
    let mut runs: HashMap<&str, &TableRecord> = HashMap::new();
    for table in tables {
        validate_table(table)?;
        let first = *runs.entry(&table.run_id).or_insert(table);
        let agrees =
            (&first.tree, first.run_kind, first.shard_count) == (&table.tree, table.run_kind, table.shard_count);
        if !agrees {
            return Err(invalid(table, "disagrees with another table of its run on tree, kind or shard count"));
        }
    }
    Ok(())
}

fn validate_table(table: &TableRecord) -> Result<(), CatalogError> {
    let valid_id = |id: &str| !id.is_empty() && id.len() <= MAX_TABLE_ID_LEN && id.bytes().all(is_id_byte);
    if !valid_id(&table.id) {
        return Err(invalid(table, "id must be 1..=128 bytes of [A-Za-z0-9._-]"));
    }
    if !valid_id(&table.run_id) {
        return Err(invalid(table, "run id must be 1..=128 bytes of [A-Za-z0-9._-]"));
    }
    if table.shard >= table.shard_count {
        return Err(invalid(table, "shard must be below shard_count"));
    }
    if table.run_kind == RunKind::Delta && table.shard_count != 1 {
        return Err(invalid(table, "a delta run has exactly one shard"));
    }
    if table.min_stamp > table.max_stamp {
        return Err(invalid(table, "min_stamp is above max_stamp"));
    }
    Ok(())
}

fn invalid(table: &TableRecord, reason: &'static str) -> CatalogError {
    CatalogError::InvalidTable { id: table.id.chars().take(MAX_TABLE_ID_LEN).collect(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::OUTLINED_BIT;

    fn open(dir: &tempfile::TempDir) -> Catalog {
        Catalog::open(&dir.path().join("state/state.db")).unwrap()
    }

    fn delta(id: &str, stamps: (u64, u64)) -> TableRecord {
        TableRecord {
            id: id.into(),
            tree: TreeKind::Links,
            run_id: format!("run-{id}"),
            run_kind: RunKind::Delta,
            shard: 0,
            shard_count: 1,
            entries: 10,
            data_len: 640,
            meta_len: 99,
            uploaded: false,
            min_stamp: stamps.0,
            max_stamp: stamps.1,
        }
    }

    fn compacted(id: &str, run_id: &str, shard: u32, shard_count: u32) -> TableRecord {
        TableRecord { run_id: run_id.into(), run_kind: RunKind::Compacted, shard, shard_count, ..delta(id, (1, 50)) }
    }

    fn flush(tables: Vec<TableRecord>, cursor: i64, clock: u64) -> FlushRecord {
        FlushRecord { tables, position: IngestPosition { cursor: Some(cursor), clock }, accounts: vec![] }
    }

    fn ids(tables: &[TableRecord]) -> Vec<&str> {
        tables.iter().map(|t| t.id.as_str()).collect()
    }

    #[test]
    fn catalog_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Catalog>();
    }

    #[test]
    fn fresh_catalog_is_empty_and_schema_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        assert_eq!(catalog.position().unwrap(), IngestPosition { cursor: None, clock: 0 });
        assert!(catalog.tables().unwrap().is_empty());
        assert!(catalog.hidden_accounts().unwrap().is_empty());
        assert_eq!(catalog.last_manifest().unwrap(), None);
        let version: i64 = catalog.lock().unwrap().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(version, migrations_sql().len() as i64);
        let mode: String = catalog.lock().unwrap().pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = catalog.lock().unwrap().pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "FULL");
        migrations().validate().unwrap();
    }

    #[test]
    fn commit_flush_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let t1 = delta("t1", (1, 5));
        catalog.commit_flush(&flush(vec![t1.clone()], 1_700_000_000_000_000, 5)).unwrap();
        catalog.commit_flush(&flush(vec![], 1_700_000_000_000_100, 5)).unwrap();
        assert_eq!(catalog.tables().unwrap(), vec![t1]);
        assert_eq!(catalog.position().unwrap(), IngestPosition { cursor: Some(1_700_000_000_000_100), clock: 5 });
    }

    #[test]
    fn failed_commit_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        catalog.commit_flush(&flush(vec![delta("t1", (1, 5))], 100, 5)).unwrap();
        let mut bad =
            flush(vec![delta("t2", (6, 9)), TableRecord { run_id: "run-x".into(), ..delta("t1", (6, 9)) }], 200, 9);
        bad.accounts = vec![(OUTLINED_BIT | 1, AccountState::Suspended)];
        assert!(matches!(catalog.commit_flush(&bad), Err(CatalogError::Sqlite(_))), "duplicate table id");
        assert_eq!(ids(&catalog.tables().unwrap()), ["t1"]);
        assert_eq!(catalog.position().unwrap(), IngestPosition { cursor: Some(100), clock: 5 });
        assert!(catalog.hidden_accounts().unwrap().is_empty());
        // Refused before any write, for other reasons: a second table for a run, a lower clock.
        let reused_run = TableRecord { run_id: "run-t1".into(), ..delta("t3", (6, 9)) };
        assert!(matches!(
            catalog.commit_flush(&flush(vec![reused_run], 300, 9)),
            Err(CatalogError::InvalidTable { reason: "its run already exists", .. })
        ));
        assert!(matches!(
            catalog.commit_flush(&flush(vec![delta("t4", (1, 2))], 300, 4)),
            Err(CatalogError::ClockRegressed { stored: 5, given: 4 })
        ));
        assert_eq!(ids(&catalog.tables().unwrap()), ["t1"]);
        assert_eq!(catalog.position().unwrap().clock, 5);
    }

    #[test]
    fn invalid_tables_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let cases = [
            (TableRecord { id: "../x".into(), ..delta("a", (1, 1)) }, "id must be 1..=128 bytes of [A-Za-z0-9._-]"),
            (delta("a", (5, 1)), "min_stamp is above max_stamp"),
            (compacted("a", "r", 4, 4), "shard must be below shard_count"),
            (TableRecord { shard_count: 2, ..delta("a", (1, 1)) }, "a delta run has exactly one shard"),
        ];
        for (table, why) in cases {
            match catalog.commit_flush(&flush(vec![table], 1, 1)) {
                Err(CatalogError::InvalidTable { reason, .. }) => assert_eq!(reason, why),
                other => panic!("expected {why}, got {other:?}"),
            }
        }
        let split_run = vec![compacted("a", "r", 0, 2), compacted("b", "r", 1, 4)];
        assert!(matches!(catalog.commit_flush(&flush(split_run, 1, 1)), Err(CatalogError::InvalidTable { .. })));
        let huge = TableRecord { max_stamp: u64::MAX, ..delta("a", (1, 1)) };
        assert!(matches!(
            catalog.commit_flush(&flush(vec![huge], 1, 1)),
            Err(CatalogError::OutOfRange { what: "max_stamp", value: u64::MAX })
        ));
        assert!(catalog.tables().unwrap().is_empty());
        assert_eq!(catalog.position().unwrap(), IngestPosition::default());
    }

    #[test]
    fn reopen_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = flush(vec![delta("t1", (1, 5)), compacted("t2", "c1", 0, 1)], 42, 5);
        record.accounts = vec![(OUTLINED_BIT | 7, AccountState::Takendown)];
        {
            let catalog = open(&dir);
            catalog.commit_flush(&record).unwrap();
            catalog.mark_uploaded("t1").unwrap();
            assert_eq!(catalog.next_table_seq().unwrap(), 1);
            assert_eq!(catalog.next_table_seq().unwrap(), 2);
            catalog.record_manifest(3, "3-abcdef").unwrap();
        }
        let catalog = open(&dir);
        let mut expected = record.tables.clone();
        expected[0].uploaded = true;
        assert_eq!(catalog.tables().unwrap(), expected);
        assert_eq!(catalog.pending_uploads().unwrap(), vec![expected[1].clone()]);
        assert_eq!(catalog.position().unwrap(), IngestPosition { cursor: Some(42), clock: 5 });
        assert_eq!(catalog.hidden_accounts().unwrap(), vec![(OUTLINED_BIT | 7, AccountState::Takendown)]);
        assert_eq!(catalog.next_table_seq().unwrap(), 3);
        assert_eq!(catalog.last_manifest().unwrap(), Some((3, "3-abcdef".into())));
        let version: i64 = catalog.lock().unwrap().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(version, 5, "migrations did not run twice");
    }

    /// A catalog in `dir` at schema `version`, with a delta table of one row for each (id, tree).
    fn catalog_at_version(dir: &Path, version: usize, tables: &[(&str, &str)]) -> (PathBuf, Connection) {
        let path = dir.join("state/state.db");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut conn = Connection::open(&path).unwrap();
        let mut upto = migrations_sql();
        upto.truncate(version);
        Migrations::new(upto.into_iter().map(M::up).collect()).to_latest(&mut conn).unwrap();
        for (id, tree) in tables {
            conn.execute(
                "INSERT INTO tables (id, tree, run_id, run_kind, shard, shard_count, entries, data_len, meta_len,
                    uploaded, min_stamp, max_stamp) VALUES (?1, ?2, ?1, 'delta', 0, 1, 3, 10, 5, 1, 1, 2)",
                [id, tree],
            )
            .unwrap();
        }
        (path, conn)
    }

    #[test]
    fn a_version_1_catalog_keeps_its_tables_and_takes_forward_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = catalog_at_version(dir.path(), 1, &[("t1", "links"), ("t2", "links")]);
        // GC forgot the newest row: its seq must not be given again.
        conn.execute("DELETE FROM tables WHERE id = 't2'", []).unwrap();
        drop(conn);
        let catalog = Catalog::open(&path).unwrap();
        let before = catalog.tables().unwrap();
        assert_eq!(before.len(), 1);
        assert_eq!((before[0].id.as_str(), before[0].tree, before[0].entries), ("t1", TreeKind::Links, 3));
        let forward = TableRecord { tree: TreeKind::Forward, ..delta("f1", (3, 3)) };
        let hot = TableRecord { tree: TreeKind::Hot, ..delta("h1", (3, 3)) };
        let tallies = TableRecord { tree: TreeKind::Tallies, ..delta("c1", (3, 3)) };
        let account_tallies = TableRecord { tree: TreeKind::AccountTallies, ..delta("a1", (3, 3)) };
        catalog.commit_flush(&flush(vec![forward, hot, tallies, account_tallies], 1, 3)).unwrap();
        let trees: Vec<TreeKind> = catalog.tables().unwrap().iter().map(|t| t.tree).collect();
        assert_eq!(
            trees,
            TreeKind::ALL[..].iter().copied().filter(|k| *k != TreeKind::Thresholds).collect::<Vec<_>>(),
            "rows kept in order, the newer trees accepted"
        );
        let seq: i64 =
            catalog.lock().unwrap().query_row("SELECT seq FROM tables WHERE id = 'f1'", [], |r| r.get(0)).unwrap();
        assert_eq!(seq, 3, "the sequence goes on past the forgotten row");
    }

    #[test]
    fn a_version_3_catalog_retires_its_hot_links_and_tallies() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = catalog_at_version(dir.path(), 3, &[("l1", "links"), ("h1", "hot"), ("c1", "tallies")]);
        drop(conn);
        let catalog = Catalog::open(&path).unwrap();
        let live: Vec<String> = catalog.tables().unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(live, ["l1"], "tallies of 56 bytes are not read by this version");
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        let retired: Vec<(String, u64)> =
            catalog.obsolete_tables(u64::MAX).unwrap().into_iter().map(|(t, at)| (t.id, at)).collect();
        let ids: Vec<&str> = retired.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["h1", "c1"], "GC deletes them");
        for (id, at) in &retired {
            assert!(now_ms - 60_000 <= *at && *at <= now_ms + 60_000, "{id} retired at {at}: GC's grace runs from now");
        }
        let account_tallies = TableRecord { tree: TreeKind::AccountTallies, ..delta("a1", (3, 3)) };
        catalog.commit_flush(&flush(vec![account_tallies], 1, 3)).unwrap();
        assert_eq!(catalog.tables().unwrap()[1].tree, TreeKind::AccountTallies);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(&dir));
        let conn = Connection::open(dir.path().join("state/state.db")).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        assert!(matches!(Catalog::open(&dir.path().join("state/state.db")), Err(CatalogError::Migration(_))));
    }

    #[test]
    fn account_states_upsert_hide_and_unhide() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let (a, b, c) = (OUTLINED_BIT | 1, OUTLINED_BIT | 2, 3);
        let mut record = flush(vec![], 1, 1);
        record.accounts = vec![
            (a, AccountState::Deactivated),
            (b, AccountState::Suspended),
            (c, AccountState::Deleted),
            (a, AccountState::Takendown), // later change of the same account wins
        ];
        catalog.commit_flush(&record).unwrap();
        let hidden = catalog.hidden_accounts().unwrap();
        assert_eq!(hidden, [(a, AccountState::Takendown), (b, AccountState::Suspended)], "deleted is not hidden");
        record.accounts = vec![(a, AccountState::Active), (b, AccountState::Other)];
        catalog.commit_flush(&record).unwrap();
        assert!(catalog.hidden_accounts().unwrap().is_empty());
        let rows: i64 = catalog.lock().unwrap().query_row("SELECT count(*) FROM accounts", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 2, "active removed its row; other and deleted stay");
    }

    /// Dids are stored as signed integers: the hidden accounts still come in u64 order, outlined
    /// DIDs (bit 63 set) after did:plc sequence numbers, hidden ones only.
    #[test]
    fn hidden_accounts_come_in_did_order() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let mut record = flush(vec![], 1, 1);
        let dids = [OUTLINED_BIT | 9, 2, u64::MAX, OUTLINED_BIT, 1 << 40, 7];
        record.accounts = dids.iter().map(|did| (*did, AccountState::Deactivated)).collect();
        record.accounts.push((5, AccountState::Deleted));
        catalog.commit_flush(&record).unwrap();
        let mut visited = Vec::new();
        catalog.visit_hidden_accounts(|did, _| visited.push(did)).unwrap();
        assert_eq!(visited, [2, 7, 1 << 40, OUTLINED_BIT, OUTLINED_BIT | 9, u64::MAX]);
    }

    /// Each flush that changes accounts is one account change; the changes after a number are
    /// each account's newest state (active ones too), in did order, until a manifest covers
    /// them; a followed manifest moves the counter past its log.
    #[test]
    fn account_changes_are_numbered_by_flush_until_published() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let changes_after = |after| {
            let mut changes = Vec::new();
            let through = catalog.visit_account_changes(after, |did, state| changes.push((did, state))).unwrap();
            (through, changes)
        };
        assert_eq!(changes_after(0), (0, vec![]));
        let (a, b) = (OUTLINED_BIT | 4, 3);
        let mut record = flush(vec![], 1, 1);
        record.accounts = vec![(a, AccountState::Deactivated), (b, AccountState::Suspended)];
        catalog.commit_flush(&record).unwrap();
        catalog.commit_flush(&flush(vec![], 2, 2)).unwrap();
        assert_eq!(changes_after(0), (1, vec![(b, AccountState::Suspended), (a, AccountState::Deactivated)]));
        let mut record = flush(vec![], 3, 3);
        record.accounts = vec![(a, AccountState::Active)];
        catalog.commit_flush(&record).unwrap();
        assert_eq!(changes_after(1), (2, vec![(a, AccountState::Active)]));
        assert_eq!(catalog.visit_hidden_accounts(|_, _| {}).unwrap(), 2, "the snapshot's number");
        catalog.forget_published_account_changes(1).unwrap();
        assert_eq!(changes_after(0), (2, vec![(a, AccountState::Active)]), "a's newer change stays");
        catalog.forget_published_account_changes(2).unwrap();
        assert_eq!(changes_after(0), (2, vec![]));

        let sync = ManifestSync {
            generation: 1,
            name: "0000000000000001-00000000000000000000000000000000",
            retired_runs: &[],
            added: &[],
            position: IngestPosition { cursor: Some(3), clock: 3 },
            accounts: AccountSync { replace: None, changes: &[], through: 9 },
            min_table_seq: 1,
        };
        catalog.sync_to_manifest(&sync, 0).unwrap();
        let mut record = flush(vec![], 4, 4);
        record.accounts = vec![(b, AccountState::Active)];
        catalog.commit_flush(&record).unwrap();
        assert_eq!(changes_after(9), (10, vec![(b, AccountState::Active)]), "numbered after the manifest's log");
    }

    #[test]
    fn a_table_of_an_unknown_tree_cannot_be_stored() {
        // `TreeKind` makes one unrepresentable in Rust; the schema refuses one written by hand.
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        catalog.commit_flush(&flush(vec![delta("t1", (1, 2))], 1, 2)).unwrap();
        let error =
            catalog.lock().unwrap().execute("UPDATE tables SET tree = 'other' WHERE id = 't1'", []).unwrap_err();
        assert!(error.to_string().contains("CHECK constraint failed"), "{error}");
        assert_eq!(catalog.tables().unwrap()[0].tree, TreeKind::Links);
    }

    #[test]
    fn uploads_are_tracked() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        catalog.commit_flush(&flush(vec![delta("t1", (1, 2)), delta("t2", (3, 4))], 1, 4)).unwrap();
        assert_eq!(ids(&catalog.pending_uploads().unwrap()), ["t1", "t2"]);
        catalog.mark_uploaded("t2").unwrap();
        assert_eq!(ids(&catalog.pending_uploads().unwrap()), ["t1"]);
        assert!(matches!(catalog.mark_uploaded("nope"), Err(CatalogError::UnknownTable { .. })));
    }

    #[test]
    fn replace_runs_swaps_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        catalog.commit_flush(&flush(vec![delta("d1", (1, 5))], 1, 5)).unwrap();
        catalog.commit_flush(&flush(vec![delta("d2", (6, 9))], 2, 9)).unwrap();
        catalog.commit_flush(&flush(vec![delta("d3", (10, 12))], 3, 12)).unwrap();
        let output = vec![compacted("c1-0", "c1", 0, 2), compacted("c1-1", "c1", 1, 2)];
        catalog.replace_runs(&["run-d1", "run-d2"], &output, 1_000).unwrap();
        assert_eq!(ids(&catalog.tables().unwrap()), ["d3", "c1-0", "c1-1"]);
        assert_eq!(ids(&catalog.pending_uploads().unwrap()), ["d3", "c1-0", "c1-1"]);
        let obsolete = catalog.obsolete_tables(1_000).unwrap();
        assert_eq!(
            obsolete.iter().map(|(t, at)| (t.id.as_str(), *at)).collect::<Vec<_>>(),
            [("d1", 1_000), ("d2", 1_000)]
        );
        assert!(catalog.obsolete_tables(999).unwrap().is_empty());

        // A run already retired (a racing compaction) fails the whole replacement.
        let again = vec![compacted("c2-0", "c2", 0, 1)];
        assert!(matches!(
            catalog.replace_runs(&["run-d3", "run-d1"], &again, 2_000),
            Err(CatalogError::UnknownRun { run_id }) if run_id == "run-d1"
        ));
        assert_eq!(ids(&catalog.tables().unwrap()), ["d3", "c1-0", "c1-1"]);
        assert_eq!(catalog.obsolete_tables(u64::MAX >> 1).unwrap().len(), 2);
    }

    #[test]
    fn table_seq_counts_from_one() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        let seqs: Vec<u64> = (0..3).map(|_| catalog.next_table_seq().unwrap()).collect();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[test]
    fn manifests_move_forward_and_history_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open(&dir);
        catalog.record_manifest(1, "1-aa").unwrap();
        catalog.record_manifest(5, "5-bb").unwrap();
        assert!(matches!(
            catalog.record_manifest(5, "5-cc"),
            Err(CatalogError::ManifestRegressed { last: 5, given: 5 })
        ));
        assert!(matches!(catalog.record_manifest(6, "../x/y"), Err(CatalogError::InvalidManifestName { .. })));
        assert_eq!(catalog.last_manifest().unwrap(), Some((5, "5-bb".into())));
        for generation in 6..6 + MANIFEST_HISTORY {
            catalog.record_manifest(generation, &format!("{generation}-x")).unwrap();
        }
        let count: i64 = catalog.lock().unwrap().query_row("SELECT count(*) FROM manifests", [], |r| r.get(0)).unwrap();
        assert_eq!(count, MANIFEST_HISTORY as i64);
        assert_eq!(
            catalog.last_manifest().unwrap(),
            Some((5 + MANIFEST_HISTORY, format!("{}-x", 5 + MANIFEST_HISTORY)))
        );
    }
}
