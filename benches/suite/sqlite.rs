//! The baseline a small operator would otherwise pick: every link as a row of one SQLite table
//! with an index, loaded from the same Jetstream file with the same parser and extractor, and
//! queried for the same page (newest first, 100 links, hidden accounts left out).
//!
//! Invariants:
//! - Same semantics as the index: a delete removes the record's rows, an update replaces them, an
//!   account deletion removes every row of the account, a deactivation hides the account's rows
//!   until it is active again, and one record's duplicate (target, location) is one row.
//! - Loading commits every `BATCH_EVENTS` events, so memory stays bounded whatever the file.

use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::ingest::jetstream::parse_event;
use backlinks::model::operation::{Operation, RecordRef};
use rusqlite::{Connection, OpenFlags, params};
use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

/// Events per transaction while loading (with a 256 MiB page cache: `SCHEMA`).
const BATCH_EVENTS: u64 = 10_000;
/// Links per page, as listBacklinks answers by default.
pub const PAGE: usize = 100;
/// Backlink-count bands the query targets are drawn from (inclusive), one sample per band.
const BANDS: [(i64, i64); 3] = [(1, 4), (5, 19), (20, 100)];

const SCHEMA: &str = "
    PRAGMA journal_mode = WAL;
    PRAGMA synchronous = NORMAL;
    PRAGMA cache_size = -262144;
    CREATE TABLE links (
        target TEXT NOT NULL, rkey TEXT NOT NULL, source TEXT NOT NULL, location TEXT NOT NULL, did TEXT NOT NULL,
        PRIMARY KEY (target, rkey, source, location)
    ) WITHOUT ROWID;
    CREATE INDEX links_by_source ON links (source);
    CREATE TABLE hidden (did TEXT PRIMARY KEY) WITHOUT ROWID;
";

/// The page query: newest first by record key, hidden accounts left out.
pub const PAGE_QUERY: &str = "SELECT location, source FROM links WHERE target = ?1
    AND NOT EXISTS (SELECT 1 FROM hidden WHERE hidden.did = links.did)
    ORDER BY rkey DESC, source DESC, location DESC LIMIT ?2";

/// Loads `file` into a new database at `db`; reports the load rate and the live rows.
pub fn load(file: &Path, db: &Path) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(!db.exists(), "{} exists: the baseline is loaded into a new database", db.display());
    let mut conn = Connection::open(db)?;
    conn.execute_batch(SCHEMA)?;
    let started = Instant::now();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?);
    let (mut lines, mut events, mut line) = (0u64, 0u64, Vec::new());
    let mut tx = conn.transaction()?;
    while reader.read_until(b'\n', &mut line)? > 0 {
        if let Ok(event) = parse_event(trim_newline(&line)) {
            apply(&tx, &event.operation)?;
            events += 1;
        }
        line.clear();
        lines += 1;
        if lines % BATCH_EVENTS == 0 {
            tx.commit()?;
            tx = conn.transaction()?;
        }
    }
    tx.commit()?;
    let seconds = started.elapsed().as_secs_f64();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    let rows: i64 = conn.query_row("SELECT count(*) FROM links", [], |r| r.get(0))?;
    Ok(serde_json::json!({
        "events": events, "seconds": seconds, "events_per_sec": events as f64 / seconds,
        "live_links": rows, "db_bytes": std::fs::metadata(db)?.len(),
    }))
}

fn trim_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

fn apply(conn: &Connection, operation: &Operation<'_>) -> rusqlite::Result<()> {
    match operation {
        Operation::Create(op) => insert_links(conn, &op.record_ref, &op.record),
        Operation::Update(op) => {
            delete_record(conn, &op.record_ref)?;
            insert_links(conn, &op.record_ref, &op.record)
        }
        Operation::Delete(record_ref) => delete_record(conn, record_ref),
        Operation::Account { did, active, status } => account(conn, did, *active, status.as_deref()),
        Operation::Identity { .. } | Operation::Skip => Ok(()),
    }
}

fn source_uri(record_ref: &RecordRef<'_>) -> String {
    format!("at://{}/{}/{}", record_ref.did, record_ref.collection, record_ref.rkey)
}

fn insert_links(conn: &Connection, record_ref: &RecordRef<'_>, record: &serde_json::Value) -> rusqlite::Result<()> {
    let source = source_uri(record_ref);
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO links (target, rkey, source, location, did) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for link in extract_links(record, &ExtractLimits::default()).links {
        let target = link.target.to_string();
        insert.execute(params![target, record_ref.rkey, source, link.location, record_ref.did])?;
    }
    Ok(())
}

fn delete_record(conn: &Connection, record_ref: &RecordRef<'_>) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM links WHERE source = ?1")?.execute([source_uri(record_ref)])?;
    Ok(())
}

/// Deleted: every row of the account goes (a range of the source index). Deactivated,
/// suspended, taken down: hidden. Anything else: shown.
fn account(conn: &Connection, did: &str, active: bool, status: Option<&str>) -> rusqlite::Result<()> {
    let status = if active { "active" } else { status.unwrap_or("") };
    if status == "deleted" {
        // '0' is the byte after '/': the range holds exactly the URIs of this DID's records.
        let (from, to) = (format!("at://{did}/"), format!("at://{did}0"));
        conn.prepare_cached("DELETE FROM links WHERE source >= ?1 AND source < ?2")?.execute([from, to])?;
    }
    if matches!(status, "deactivated" | "suspended" | "takendown") {
        conn.prepare_cached("INSERT OR IGNORE INTO hidden (did) VALUES (?1)")?.execute([did])?;
    } else {
        conn.prepare_cached("DELETE FROM hidden WHERE did = ?1")?.execute([did])?;
    }
    Ok(())
}

/// Opens the baseline for queries only.
pub fn open_read_only(db: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    // Readers share the OS page cache through a memory map instead of 2 MiB private caches.
    conn.execute_batch("PRAGMA query_only = ON; PRAGMA mmap_size = 17179869184;")?;
    Ok(conn)
}

/// One page for `target`: (location, source URI) pairs, newest first.
pub fn page(conn: &Connection, target: &str) -> rusqlite::Result<Vec<(String, String)>> {
    let mut query = conn.prepare_cached(PAGE_QUERY)?;
    let rows = query.query_map(params![target, PAGE as i64], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}

/// Writes `per_band` targets of each backlink-count band to `out`, one per line, in a seeded
/// random order (reservoir samples, so the whole table is read once and memory stays bounded).
pub fn pick_targets(db: &Path, out: &Path, per_band: usize, seed: u64) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!((1..=1_000_000).contains(&per_band), "--per-band must be 1..=1000000");
    let conn = open_read_only(db)?;
    let mut state = seed;
    let mut reservoirs: Vec<Vec<(String, i64)>> = vec![Vec::with_capacity(per_band); BANDS.len()];
    let mut seen = [0u64; BANDS.len()];
    let mut query = conn.prepare("SELECT target, count(*) FROM links GROUP BY target")?;
    let mut rows = query.query([])?;
    while let Some(row) = rows.next()? {
        let count: i64 = row.get(1)?;
        let Some(band) = BANDS.iter().position(|(lo, hi)| (*lo..=*hi).contains(&count)) else { continue };
        seen[band] += 1;
        let slot = backlinks::base::rng::splitmix64(&mut state) % seen[band];
        if reservoirs[band].len() < per_band {
            reservoirs[band].push((row.get(0)?, count));
        } else if (slot as usize) < per_band {
            reservoirs[band][slot as usize] = (row.get(0)?, count);
        }
    }
    let mut picked: Vec<(String, i64)> = reservoirs.into_iter().flatten().collect();
    for i in (1..picked.len()).rev() {
        picked.swap(i, (backlinks::base::rng::splitmix64(&mut state) % (i as u64 + 1)) as usize);
    }
    let text: String = picked.iter().map(|(target, _)| format!("{target}\n")).collect();
    std::fs::write(out, text)?;
    let mean = picked.iter().map(|(_, n)| *n as f64).sum::<f64>() / picked.len().max(1) as f64;
    Ok(serde_json::json!({
        "targets": picked.len(), "mean_backlinks": mean,
        "band_sizes": seen, "bands": BANDS.iter().map(|(lo, hi)| format!("{lo}..={hi}")).collect::<Vec<_>>(),
    }))
}
