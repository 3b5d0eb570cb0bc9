-- state.db, version 1: the engine's local catalog.
--
-- Counts, lengths, stamps, cursors and generations are stored as plain i64 (they never reach
-- 2^63, and the Rust side refuses values that would). DID ids have the top bit set and are stored
-- as their i64 bit casts.

-- Every table of every run. A run (delta or compacted) is the set of rows sharing `run_id`, one
-- row per shard. `obsolete_at` is NULL while the run is live; compaction sets it (unix
-- milliseconds) when it replaces the run, and GC deletes the files and the row after a grace
-- period. `seq` keeps insertion order.
CREATE TABLE tables (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL UNIQUE CHECK (length(id) BETWEEN 1 AND 128),
    tree        TEXT    NOT NULL CHECK (tree IN ('links', 'thresholds')),
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

CREATE INDEX tables_not_uploaded ON tables (seq) WHERE uploaded = 0 AND obsolete_at IS NULL;
CREATE INDEX tables_obsolete ON tables (obsolete_at) WHERE obsolete_at IS NOT NULL;

-- Where ingest stands: the one row says which firehose cursor and clock value the committed
-- tables cover. It changes only together with the tables of a flush.
CREATE TABLE ingest_position (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    cursor    INTEGER,
    clock     INTEGER NOT NULL CHECK (clock >= 0)
) STRICT;
INSERT INTO ingest_position (singleton, cursor, clock) VALUES (1, NULL, 0);

-- Accounts that are not active. An account without a row is active.
CREATE TABLE accounts (
    did   INTEGER PRIMARY KEY,
    state TEXT    NOT NULL CHECK (state IN ('deactivated', 'suspended', 'takendown', 'deleted', 'other'))
) STRICT;

-- Durable counters: 'table_seq' names tables.
CREATE TABLE counters (
    name TEXT    PRIMARY KEY,
    next INTEGER NOT NULL CHECK (next >= 1)
) STRICT, WITHOUT ROWID;

-- Manifests published to the bucket, newest generation last.
CREATE TABLE manifests (
    generation INTEGER PRIMARY KEY CHECK (generation >= 0),
    name       TEXT    NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 256)
) STRICT;
