//! Recent records' links: for each record created or updated within the change log's window,
//! the position of its newest entry, whose `created` and `kept` links are the record's links now. A delete
//! or an update looks its record up here to tell subscribers which links went away; an account
//! deletion finds its records by DID.
//!
//! Invariants:
//! - A row is only a hint: the entry it leads to is checked against the record's URI before it
//!   is believed (hashes collide, a crash can leave a row ahead of the log).
//! - Rows pointing into segments the log let go are removed (`forget_before`), so the table is
//!   bounded by the log's window.
//! - Writes are grouped into one transaction per index flush (`begin`, `commit`); rows a crash
//!   loses are rebuilt from the log (see `feed`).

use super::PushError;
use super::log::Position;
use rusqlite::{Connection, OptionalExtension, params};
use rusqlite_migration::{M, Migrations};
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![M::up(include_str!("../../migrations/push/0001_recent.sql"))])
}

/// SQLite's page cache for the table.
const CACHE_KIB: usize = 64 << 10;

pub struct RecentLinks {
    db: Connection,
    in_transaction: bool,
}

fn key(text: &str) -> i64 {
    xxh3_64(text.as_bytes()) as i64
}

impl RecentLinks {
    pub fn open(path: &Path) -> Result<Self, PushError> {
        let mut db = Connection::open(path)?;
        db.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        // A flush's worth of rows stays in memory until its commit (negative: KiB).
        db.pragma_update(None, "cache_size", -(CACHE_KIB as i64))?;
        db.pragma_update_and_check(None, "locking_mode", "EXCLUSIVE", |_| Ok(()))?;
        migrations().to_latest(&mut db).map_err(|e| PushError::Corrupt(format!("recent.db migrations: {e}")))?;
        Ok(RecentLinks { db, in_transaction: false })
    }

    fn begin(&mut self) -> Result<(), PushError> {
        if !self.in_transaction {
            self.db.execute_batch("BEGIN")?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Ends the batch's transaction.
    pub fn commit(&mut self) -> Result<(), PushError> {
        if self.in_transaction {
            self.db.execute_batch("COMMIT")?;
            self.in_transaction = false;
        }
        Ok(())
    }

    pub fn position_of(&mut self, source: &str) -> Result<Option<Position>, PushError> {
        let mut statement = self.db.prepare_cached("SELECT position FROM recent WHERE source = ?1")?;
        let packed: Option<i64> = statement.query_row(params![key(source)], |row| row.get(0)).optional()?;
        Ok(packed.map(Position::unpacked))
    }

    pub fn set(&mut self, source: &str, did: &str, position: Position) -> Result<(), PushError> {
        self.begin()?;
        let mut statement =
            self.db.prepare_cached("INSERT OR REPLACE INTO recent (source, did, position) VALUES (?1, ?2, ?3)")?;
        statement.execute(params![key(source), key(did), position.packed()])?;
        Ok(())
    }

    pub fn remove(&mut self, source: &str) -> Result<(), PushError> {
        self.begin()?;
        self.db.prepare_cached("DELETE FROM recent WHERE source = ?1")?.execute(params![key(source)])?;
        Ok(())
    }

    /// Positions of the account's recent records (some may belong to a colliding DID).
    pub fn of_did(&mut self, did: &str) -> Result<Vec<Position>, PushError> {
        let mut statement = self.db.prepare_cached("SELECT position FROM recent WHERE did = ?1 ORDER BY position")?;
        let rows = statement.query_map(params![key(did)], |row| row.get::<_, i64>(0))?;
        Ok(rows.map(|row| row.map(Position::unpacked)).collect::<Result<_, _>>()?)
    }

    /// Drops the rows of entries in segments before `segment`; returns how many.
    pub fn forget_before(&mut self, segment: u32) -> Result<usize, PushError> {
        self.begin()?;
        let first_kept = Position { segment, offset: 0 }.packed();
        Ok(self.db.prepare_cached("DELETE FROM recent WHERE position < ?1")?.execute(params![first_kept])?)
    }

    /// A fact the feed keeps with the rows (committed with them).
    pub fn fact(&self, name: &str) -> Result<Option<i64>, PushError> {
        let mut statement = self.db.prepare_cached("SELECT value FROM facts WHERE name = ?1")?;
        Ok(statement.query_row(params![name], |row| row.get(0)).optional()?)
    }

    pub fn set_fact(&mut self, name: &str, value: i64) -> Result<(), PushError> {
        self.begin()?;
        let mut statement = self.db.prepare_cached("INSERT OR REPLACE INTO facts (name, value) VALUES (?1, ?2)")?;
        statement.execute(params![name, value])?;
        Ok(())
    }
}
