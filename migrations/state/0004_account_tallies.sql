-- state.db, version 4: the `account_tallies` tree (the counts of hot targets by account, from
-- which flushes keep the distinct accounts of every tally). As in version 3, `tables` is rebuilt
-- under the wider CHECK with its rows, seq values and AUTOINCREMENT high-water mark kept.
--
-- Tallies grew from 56 to 64 bytes (their distinct accounts), so the hot links and tallies that
-- version 3 wrote are retired here (obsolete from the migration's time, in unix milliseconds:
-- GC deletes them after its grace period, once no published manifest names them). Without tallies no target is hot: flushes and counts promote the hot
-- targets again, each with its accounts.
CREATE TABLE tables_v4 (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL UNIQUE CHECK (length(id) BETWEEN 1 AND 128),
    tree        TEXT    NOT NULL CHECK (tree IN ('links', 'thresholds', 'forward', 'hot', 'tallies', 'account_tallies')),
    run_id      TEXT    NOT NULL CHECK (length(run_id) BETWEEN 1 AND 128),
    run_kind    TEXT    NOT NULL CHECK (run_kind IN ('delta', 'compacted')),
    shard       INTEGER NOT NULL CHECK (shard >= 0),
    shard_count INTEGER NOT NULL CHECK (shard_count >= 1 AND shard < shard_count),
    entries     INTEGER NOT NULL CHECK (entries >= 0),
    data_len    INTEGER NOT NULL CHECK (data_len >= 0),
    meta_len    INTEGER NOT NULL CHECK (meta_len >= 0),
    uploaded    INTEGER NOT NULL CHECK (uploaded IN (0, 1)),
    min_stamp   INTEGER NOT NULL CHECK (min_stamp >= 0),
    max_stamp   INTEGER NOT NULL CHECK (max_stamp >= min_stamp),
    obsolete_at INTEGER CHECK (obsolete_at >= 0),
    UNIQUE (run_id, shard)
) STRICT;

INSERT INTO tables_v4 SELECT * FROM tables;
DELETE FROM sqlite_sequence WHERE name = 'tables_v4';
INSERT INTO sqlite_sequence (name, seq) SELECT 'tables_v4', seq FROM sqlite_sequence WHERE name = 'tables';
DROP TABLE tables;
ALTER TABLE tables_v4 RENAME TO tables;

UPDATE tables SET obsolete_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000
    WHERE tree IN ('hot', 'tallies') AND obsolete_at IS NULL;

CREATE INDEX tables_not_uploaded ON tables (seq) WHERE uploaded = 0 AND obsolete_at IS NULL;
CREATE INDEX tables_obsolete ON tables (obsolete_at) WHERE obsolete_at IS NOT NULL;
