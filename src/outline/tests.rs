//! Tests of the outline tables: ids, the cache, persist and crash semantics, imports.

use super::*;
use crate::model::ids::{DID_RESERVED_BIT, OUTLINED_BIT};
use std::collections::HashSet;

const DID: OutlineKind = OutlineKind::Did;
const COLLECTION: OutlineKind = OutlineKind::Collection;
const RKEY: OutlineKind = OutlineKind::Rkey;
const LOCATION: OutlineKind = OutlineKind::Location;

fn open(dir: &tempfile::TempDir, cache_entries: usize) -> Outlines {
    Outlines::open(&dir.path().join("outlines.db"), OutlineOptions { cache_entries, map_bytes: 0 }).unwrap()
}

#[test]
fn outlines_are_shareable_and_migrations_valid() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Outlines>();
    migrations().validate().unwrap();
}

#[test]
fn kind_codes_and_names_are_stable() {
    let table: Vec<_> = OutlineKind::ALL.iter().map(|k| (k.code(), k.name())).collect();
    assert_eq!(table, [(1, "did"), (2, "collection"), (3, "rkey"), (4, "location")]);
    for kind in OutlineKind::ALL {
        assert_eq!(OutlineKind::from_code(kind.code()), Some(kind));
        assert_eq!(OutlineKind::from_name(kind.name()), Some(kind));
    }
    assert_eq!(OutlineKind::from_code(0), None);
    assert_eq!(OutlineKind::from_code(5), None);
    assert_eq!(OutlineKind::from_name("DID"), None);
}

#[test]
fn layouts_compose_and_split() {
    assert_eq!(DID.layout().compose(0, 1), Some(OUTLINED_BIT | 1));
    assert_eq!(DID.layout().compose(3, 5), Some(OUTLINED_BIT | 3 << 46 | 5));
    assert_eq!(DID.layout().compose(u16::MAX, (1 << 46) - 1), Some(OUTLINED_BIT | ((1 << 62) - 1)));
    assert_eq!(DID.layout().compose(0, 1 << 46), None);
    assert_eq!(DID.layout().compose(0, 0), None);
    assert_eq!(RKEY.layout().compose(u16::MAX, (1 << 47) - 1), Some(u64::MAX));
    assert_eq!(COLLECTION.layout().compose(0, 7), Some(7));
    assert_eq!(LOCATION.layout().compose(2, 7), Some(2 << 48 | 7));
    assert_eq!(COLLECTION.layout().compose(0, 1 << 48), None);
    // Values outside a layout are not ids of that kind.
    assert_eq!(DID.layout().split(1), None); // no outlined bit
    assert_eq!(DID.layout().split(OUTLINED_BIT | DID_RESERVED_BIT | 1), None);
    assert_eq!(DID.layout().split(OUTLINED_BIT), None); // counter 0
    assert_eq!(RKEY.layout().split(0x0123_4567), None); // an inline TID
    assert_eq!(COLLECTION.layout().split(0), None); // <self>
    assert_eq!(LOCATION.layout().split(u64::MAX), Some((u16::MAX, (1 << 48) - 1)));
}

#[test]
fn intern_lookup_resolve_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    let did = outlines.intern(DID, "did:plc:abc", 0).unwrap();
    assert_eq!(did, OUTLINED_BIT | 1);
    assert_eq!(outlines.intern(DID, "did:plc:abc", 7).unwrap(), did, "an existing string keeps its id");
    assert_eq!(outlines.intern(DID, "did:plc:def", 0).unwrap(), OUTLINED_BIT | 2);
    assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.like", 0).unwrap(), 1);
    assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.post", 0).unwrap(), 2);
    assert_eq!(outlines.intern(RKEY, "self", 0).unwrap(), OUTLINED_BIT | 1);
    assert_eq!(outlines.intern(LOCATION, "$.subject", 0).unwrap(), 1);
    // The same string in another kind is another entry.
    assert_eq!(outlines.intern(LOCATION, "self", 0).unwrap(), 2);

    assert_eq!(outlines.lookup(DID, "did:plc:abc").unwrap(), Some(did));
    assert_eq!(outlines.lookup(DID, "did:plc:zzz").unwrap(), None);
    assert_eq!(outlines.lookup(COLLECTION, "did:plc:abc").unwrap(), None);
    assert_eq!(outlines.lookup(DID, "").unwrap(), None);
    assert_eq!(outlines.resolve(DID, did).unwrap().as_deref(), Some("did:plc:abc"));
    assert_eq!(outlines.resolve(RKEY, OUTLINED_BIT | 1).unwrap().as_deref(), Some("self"));
    assert_eq!(outlines.resolve(DID, OUTLINED_BIT | 3).unwrap(), None);
    assert_eq!(outlines.resolve(COLLECTION, 0).unwrap(), None);
    assert_eq!(outlines.pending(), 7);
    assert_eq!(outlines.lookup(DID, "did:plc:nope").unwrap(), None);
    assert_eq!(outlines.pending(), 7, "lookup never allocates");
}

#[test]
fn a_complete_cache_answers_misses_until_it_evicts_or_imports() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 2);
    let complete = |kind: OutlineKind| read(&outlines.caches[kind.index()]).unwrap().complete;
    assert!(complete(DID) && complete(RKEY), "a new outlines.db stores nothing");
    let a = outlines.intern(DID, "did:plc:a", 0).unwrap();
    outlines.intern(DID, "did:plc:b", 0).unwrap();
    outlines.persist().unwrap();
    assert!(complete(DID), "two strings fit a two-entry cache");
    let c = outlines.intern(DID, "did:plc:c", 0).unwrap();
    outlines.persist().unwrap(); // the third string evicts one
    assert!(!complete(DID));
    assert_eq!(outlines.intern(DID, "did:plc:a", 0).unwrap(), a, "an evicted string is found in SQLite");
    assert_eq!(outlines.intern(DID, "did:plc:c", 0).unwrap(), c);
    assert_eq!(outlines.pending(), 0);

    outlines.import_rows(RKEY, &[(OUTLINED_BIT | 9, "imported".to_string())]).unwrap();
    assert!(!complete(RKEY), "imported rows are in SQLite only");
    assert_eq!(outlines.intern(RKEY, "imported", 0).unwrap(), OUTLINED_BIT | 9);
    drop(outlines);
    let reopened = open(&dir, 2);
    assert!(!read(&reopened.caches[DID.index()]).unwrap().complete, "stored strings: not complete at open");
    assert_eq!(reopened.intern(DID, "did:plc:b", 0).unwrap(), OUTLINED_BIT | 2);
}

#[test]
fn a_restored_writers_new_rows_come_after_every_published_range() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    let published = [(OUTLINED_BIT | 1, "did:plc:one".to_string()), (OUTLINED_BIT | 2, "did:plc:two".to_string())];
    // A retried import must not use up sequence numbers (AUTOINCREMENT would, with OR IGNORE).
    assert_eq!(outlines.import_rows(DID, &published).unwrap(), 2);
    assert_eq!(outlines.import_rows(DID, &published).unwrap(), 0);
    outlines.intern(DID, "did:plc:three", 0).unwrap();
    outlines.persist().unwrap();
    assert_eq!(outlines.max_seq().unwrap(), 3, "no gap after a repeated import");
    // The writer that published them numbered them up to 7 (it had gaps, or other kinds).
    outlines.reserve_seq_through(7).unwrap();
    outlines.reserve_seq_through(5).unwrap(); // never lowers it
    outlines.intern(DID, "did:plc:new", 0).unwrap();
    outlines.persist().unwrap();
    assert_eq!(outlines.max_seq().unwrap(), 8);
    assert_eq!(
        outlines.rows_between(DID, 7, 8, 10, 1 << 20).unwrap(),
        [(8, OUTLINED_BIT | 4, "did:plc:new".to_string())]
    );
    let fresh = tempfile::tempdir().unwrap();
    let empty = open(&fresh, 16);
    empty.reserve_seq_through(4).unwrap(); // before any row exists
    empty.intern(LOCATION, "$.subject", 0).unwrap();
    empty.persist().unwrap();
    assert_eq!(empty.max_seq().unwrap(), 5);
}

#[test]
fn shards_carry_their_number() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    let id = outlines.intern(DID, "did:plc:three", 3).unwrap();
    assert_eq!(id, OUTLINED_BIT | 3 << 46 | 1);
    assert_eq!(DID.layout().split(id), Some((3, 1)));
    assert_eq!(outlines.intern(DID, "did:plc:three-b", 3).unwrap(), OUTLINED_BIT | 3 << 46 | 2);
    assert_eq!(outlines.intern(RKEY, "a", 3).unwrap(), OUTLINED_BIT | 3 << 47 | 1);
    assert_eq!(outlines.intern(COLLECTION, "a.b.c", 3).unwrap(), 3 << 48 | 1);
    assert_eq!(outlines.intern(DID, "did:plc:zero", 0).unwrap(), OUTLINED_BIT | 1);
}

#[test]
fn bad_strings_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    assert!(matches!(outlines.intern(DID, "", 0), Err(OutlineError::InvalidValue { len: 0, max: 2048, .. })));
    let long = "a".repeat(318);
    assert!(matches!(outlines.intern(COLLECTION, &long, 0), Err(OutlineError::InvalidValue { len: 318, .. })));
    assert_eq!(outlines.lookup(COLLECTION, &long).unwrap(), None);
    assert_eq!(outlines.pending(), 0);
}

#[test]
fn persist_and_reopen_keep_ids_and_continue_counters() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, col) = {
        let outlines = open(&dir, 16);
        let a = outlines.intern(DID, "did:plc:a", 0).unwrap();
        let b = outlines.intern(DID, "did:plc:b", 5).unwrap();
        let col = outlines.intern(COLLECTION, "app.bsky.graph.follow", 0).unwrap();
        assert_eq!(outlines.persist().unwrap(), 3);
        assert_eq!(outlines.pending(), 0);
        assert_eq!(outlines.persist().unwrap(), 0);
        (a, b, col)
    };
    let outlines = open(&dir, 16);
    assert_eq!(outlines.pending(), 0);
    assert_eq!(outlines.lookup(DID, "did:plc:a").unwrap(), Some(a));
    assert_eq!(outlines.intern(DID, "did:plc:b", 0).unwrap(), b);
    assert_eq!(outlines.resolve(COLLECTION, col).unwrap().as_deref(), Some("app.bsky.graph.follow"));
    assert_eq!(outlines.pending(), 0, "re-interning a stored string allocates nothing");
    assert_eq!(outlines.intern(DID, "did:plc:c", 0).unwrap(), OUTLINED_BIT | 2);
    assert_eq!(outlines.intern(DID, "did:plc:d", 5).unwrap(), OUTLINED_BIT | 5 << 46 | 2);
    assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.repost", 0).unwrap(), 2);
}

#[test]
fn unpersisted_ids_are_forgotten_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let outlines = open(&dir, 16);
        outlines.intern(DID, "did:plc:kept", 0).unwrap();
        outlines.persist().unwrap();
        assert_eq!(outlines.intern(DID, "did:plc:lost", 0).unwrap(), OUTLINED_BIT | 2);
        assert_eq!(outlines.pending(), 1);
    }
    let outlines = open(&dir, 16);
    assert_eq!(outlines.lookup(DID, "did:plc:lost").unwrap(), None);
    assert_eq!(outlines.resolve(DID, OUTLINED_BIT | 2).unwrap(), None);
    // The counter resumed from its persisted value, so the forgotten id is handed out again.
    assert_eq!(outlines.intern(DID, "did:plc:other", 0).unwrap(), OUTLINED_BIT | 2);
}

#[test]
fn exhausted_sequence_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(&dir, 16));
    let conn = Connection::open(dir.path().join("outlines.db")).unwrap();
    conn.execute("INSERT INTO sequences (kind, shard, next) VALUES (1, 9, ?1)", [(1i64 << 46) - 1]).unwrap();
    drop(conn);
    let outlines = open(&dir, 16);
    assert_eq!(outlines.intern(DID, "did:plc:last", 9).unwrap(), OUTLINED_BIT | 9 << 46 | ((1 << 46) - 1));
    assert!(matches!(outlines.intern(DID, "did:plc:more", 9), Err(OutlineError::Exhausted { shard: 9, .. })));
    // Other shards are unaffected.
    assert_eq!(outlines.intern(DID, "did:plc:more", 10).unwrap(), OUTLINED_BIT | 10 << 46 | 1);
}

#[test]
fn failed_persist_writes_nothing_and_keeps_pending() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    outlines.intern(DID, "did:plc:one", 0).unwrap();
    outlines.intern(DID, "did:plc:two", 0).unwrap();
    // A row that must never exist took the second id: the batch cannot commit. (The file is
    // locked for its one connection, so the row goes in through it.)
    let sql = |statement: &str| outlines.lock_db().unwrap().execute(statement, []).unwrap();
    sql(&format!("INSERT INTO outlines (kind, id, value) VALUES (1, {}, 'x')", (OUTLINED_BIT | 2) as i64));
    assert!(matches!(outlines.persist(), Err(OutlineError::Sqlite(_))));
    assert_eq!(outlines.pending(), 2);
    let count = |table: &str| -> i64 {
        outlines.lock_db().unwrap().query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
    };
    assert_eq!((count("outlines"), count("sequences")), (1, 0));
    sql("DELETE FROM outlines");
    assert_eq!(outlines.persist().unwrap(), 2);
}

#[test]
fn tiny_cache_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 3);
    let names: Vec<String> = (0..500).map(|i| format!("did:plc:{i:05}")).collect();
    let ids: Vec<u64> = names.iter().map(|n| outlines.intern(DID, n, 1).unwrap()).collect();
    let check = |outlines: &Outlines| {
        for (name, id) in names.iter().zip(&ids).rev() {
            assert_eq!(outlines.lookup(DID, name).unwrap(), Some(*id));
            assert_eq!(outlines.resolve(DID, *id).unwrap().as_deref(), Some(name.as_str()));
        }
    };
    check(&outlines); // all pending: never evicted
    assert_eq!(outlines.persist().unwrap(), 500);
    check(&outlines); // stored: the cache holds 3, the rest come from SQLite
    assert_eq!(read(&outlines.caches[DID.index()]).unwrap().len(), 3);
    assert_eq!(outlines.intern(DID, &names[0], 2).unwrap(), ids[0]);
    assert_eq!(outlines.pending(), 0);
}

#[test]
fn concurrent_shards_never_share_an_id() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 64);
    let names: Vec<String> = (0..400).map(|i| format!("did:web:host{i}.example")).collect();
    let per_thread: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4u16)
            .map(|shard| {
                let (outlines, names) = (&outlines, &names);
                scope.spawn(move || {
                    // Every worker interns every name, each in its own order; persists race too.
                    let mut order: Vec<usize> = (0..names.len()).collect();
                    order.rotate_left(shard as usize * 97);
                    let mut ids = vec![0; names.len()];
                    for (step, i) in order.into_iter().enumerate() {
                        ids[i] = outlines.intern(DID, &names[i], shard).unwrap();
                        if step % 50 == 49 {
                            outlines.persist().unwrap();
                        }
                    }
                    ids
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for ids in &per_thread[1..] {
        assert_eq!(ids, &per_thread[0], "all workers agree on every string's id");
    }
    let distinct: HashSet<u64> = per_thread[0].iter().copied().collect();
    assert_eq!(distinct.len(), names.len());
    outlines.persist().unwrap();
    drop(outlines); // one connection per file at a time
    let reopened = open(&dir, 64);
    for (name, id) in names.iter().zip(&per_thread[0]) {
        assert_eq!(reopened.lookup(DID, name).unwrap(), Some(*id));
    }
}

#[test]
fn the_map_setting_reaches_sqlite() {
    let mapped_bytes = |map_bytes: u64| {
        let dir = tempfile::tempdir().unwrap();
        let outlines =
            Outlines::open(&dir.path().join("outlines.db"), OutlineOptions { cache_entries: 16, map_bytes }).unwrap();
        let bytes: i64 = outlines.lock_db().unwrap().query_row("PRAGMA mmap_size", [], |r| r.get(0)).unwrap();
        bytes
    };
    assert_eq!(mapped_bytes(0), 0, "nothing mapped by default");
    assert_eq!(mapped_bytes(1 << 20), 1 << 20);
}

#[test]
fn pending_bytes_follow_the_new_strings_until_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 16);
    assert_eq!(outlines.pending_bytes(), 0);
    outlines.intern(DID, "did:plc:abc", 0).unwrap();
    outlines.intern(DID, "did:plc:abc", 0).unwrap();
    outlines.intern(RKEY, "self", 0).unwrap();
    assert_eq!(outlines.pending_bytes(), "did:plc:abc".len() + "self".len() + 2 * PENDING_OVERHEAD_BYTES);
    outlines.intern(DID, "did:plc:vfnmgxg2yscfliemmcxzyfyh", 0).unwrap(); // kept packed: 15 bytes
    assert_eq!(outlines.pending_bytes(), "did:plc:abc".len() + "self".len() + 15 + 3 * PENDING_OVERHEAD_BYTES);
    outlines.persist().unwrap();
    assert_eq!(outlines.pending_bytes(), 0);
    outlines.intern(DID, "did:plc:abc", 0).unwrap();
    assert_eq!(outlines.pending_bytes(), 0, "a stored string is not new");
}

/// Interns `count` DIDs and persists them with a 3-entry cache: nearly all are then forgotten by
/// the cache and found again only through the fingerprint table or SQLite.
fn persisted_dids(outlines: &Outlines, count: usize) -> Vec<(String, u64)> {
    let names: Vec<String> = (0..count).map(|i| format!("did:plc:{i:024}")).collect();
    let ids: Vec<u64> = names.iter().map(|name| outlines.intern(DID, name, 1).unwrap()).collect();
    assert_eq!(outlines.persist().unwrap(), count);
    names.into_iter().zip(ids).collect()
}

fn assert_found(outlines: &Outlines, dids: &[(String, u64)]) {
    for (name, id) in dids {
        assert_eq!(outlines.lookup(DID, name).unwrap(), Some(*id), "{name}");
        assert_eq!(outlines.intern(DID, name, 2).unwrap(), *id, "{name} interned again");
    }
    assert_eq!(outlines.lookup(DID, "did:plc:never-interned").unwrap(), None);
}

#[test]
fn forgotten_strings_are_found_by_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 3);
    let dids = persisted_dids(&outlines, 2000);
    assert_found(&outlines, &dids);
    assert_eq!(outlines.pending(), 0, "nothing interned twice");
    drop(outlines);
    let outlines = open(&dir, 3);
    assert_found(&outlines, &dids);
}

#[test]
fn a_lost_or_damaged_fingerprint_table_is_rebuilt_and_lookups_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let dids = persisted_dids(&open(&dir, 3), 2000);
    std::fs::remove_file(dir.path().join("outlines.fpdir")).unwrap();
    let outlines = open(&dir, 3);
    assert_found(&outlines, &dids);
    assert_eq!(outlines.fingerprint_rebuilds(), 0);
    // Damage every page: the first lookup meets it and rebuilds the table, and no string gets
    // a second id.
    damage_pages(&dir);
    assert_found(&outlines, &dids);
    assert_eq!(outlines.fingerprint_rebuilds(), 1);
    assert_eq!(outlines.pending(), 0);
    // Met by a persist's catch-up instead: rebuilt there.
    damage_pages(&dir);
    outlines.intern(DID, "did:plc:after-the-damage", 0).unwrap();
    assert_eq!(outlines.persist().unwrap(), 1);
    assert_eq!(outlines.fingerprint_rebuilds(), 2);
    assert_found(&outlines, &dids);
    drop(outlines);
    damage_pages(&dir);
    let outlines = open(&dir, 3);
    assert_found(&outlines, &dids);
    assert_eq!(outlines.fingerprint_rebuilds(), 1, "the damaged table was rebuilt at open");
}

fn damage_pages(dir: &tempfile::TempDir) {
    let pages = dir.path().join("outlines.fp");
    let mut bytes = std::fs::read(&pages).unwrap();
    bytes.iter_mut().step_by(1000).for_each(|byte| *byte ^= 0x40);
    std::fs::write(&pages, bytes).unwrap();
}

#[test]
fn a_catch_up_of_many_rows_goes_through_spill_files_in_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let dids = persisted_dids(&open(&dir, 3), 3000);
    let parts = 3000usize.div_ceil(CATCH_UP_ROWS).next_power_of_two();
    assert!(parts > SPILL_FILES, "more than one scan");
    std::fs::remove_file(dir.path().join("outlines.fpdir")).unwrap();
    let outlines = open(&dir, 3);
    assert_eq!(outlines.fingerprints.covered_seq(), 3000);
    assert_found(&outlines, &dids);
    let spills_left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(spills_left, 5, "outlines.db, its WAL and SHM, outlines.fp and .fpdir: {spills_left}");
}

#[test]
fn an_import_refuses_a_stored_did_under_another_id() {
    let dir = tempfile::tempdir().unwrap();
    let outlines = open(&dir, 3);
    let dids = persisted_dids(&outlines, 100);
    let (name, id) = &dids[50];
    let clash = [(id + 1000, name.clone())];
    assert!(matches!(outlines.import_rows(DID, &clash), Err(OutlineError::Corrupt(_))));
    let twice =
        [(OUTLINED_BIT | 5000, "did:plc:twice".to_string()), (OUTLINED_BIT | 5001, "did:plc:twice".to_string())];
    assert!(matches!(outlines.import_rows(DID, &twice), Err(OutlineError::Corrupt(_))));
    let pending = outlines.intern(DID, "did:plc:pending", 0).unwrap();
    let under_another = [(pending + 1000, "did:plc:pending".to_string())];
    assert!(matches!(outlines.import_rows(DID, &under_another), Err(OutlineError::Corrupt(_))));
    assert_eq!(outlines.max_seq().unwrap(), 100, "nothing stored");
    assert_found(&outlines, &dids);
}

#[test]
fn version_one_databases_migrate_keeping_rows_and_the_sequence_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outlines.db");
    {
        let mut db = Connection::open(&path).unwrap();
        Migrations::new(vec![M::up(include_str!("../../migrations/outlines/0001_outlines.sql"))])
            .to_latest(&mut db)
            .unwrap();
        db.execute_batch(
            "INSERT INTO outlines (kind, id, value) VALUES (1, -9223372036854775807, 'did:plc:one'), (2, 1, 'app.bsky.feed.like');
             INSERT INTO sequences (kind, shard, next) VALUES (1, 0, 2), (2, 0, 2);
             UPDATE sqlite_sequence SET seq = 40 WHERE name = 'outlines';",
        )
        .unwrap();
    }
    let outlines = open(&dir, 3);
    assert_eq!(outlines.lookup(DID, "did:plc:one").unwrap(), Some(OUTLINED_BIT | 1));
    assert_eq!(outlines.lookup(COLLECTION, "app.bsky.feed.like").unwrap(), Some(1));
    outlines.intern(DID, "did:plc:two", 0).unwrap();
    outlines.persist().unwrap();
    assert_eq!(outlines.max_seq().unwrap(), 41, "the high-water mark survived the rebuild");
    let db = outlines.lock_db().unwrap();
    let small_only: bool = db
        .query_row(
            "SELECT sql LIKE '%WHERE kind IN (2, 4)%' FROM sqlite_master WHERE name = 'outlines_small_values'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(small_only);
    let plan: String = db
        .query_row(
            "EXPLAIN QUERY PLAN SELECT id FROM outlines WHERE kind = ?1 AND kind IN (2, 4) AND value = ?2",
            [2, 0],
            |row| row.get(3),
        )
        .unwrap();
    assert!(plan.contains("outlines_small_values"), "{plan}");
}

#[test]
fn imported_rows_are_found_by_fingerprint() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dids = persisted_dids(&open(&source_dir, 3), 1000);
    let outlines = open(&target_dir, 3);
    let rows: Vec<(u64, String)> = dids.iter().map(|(name, id)| (*id, name.clone())).collect();
    assert_eq!(outlines.import_rows(DID, &rows).unwrap(), 1000);
    assert_found(&outlines, &dids);
}
