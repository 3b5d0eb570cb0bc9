-- outlines.db, version 1: strings <-> u64 ids, and the sharded sequences that allocate the ids.
--
-- u64 ids are stored as their i64 bit casts (a DID or rkey id has the top bit set, so it reads as
-- negative in SQL; never compare ids with < or > here).

-- One row per outlined string. `seq` is the insertion order: AUTOINCREMENT never reuses a value,
-- so the rows of `seq` range (after, through] can be published as one immutable object.
CREATE TABLE outlines (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    kind  INTEGER NOT NULL CHECK (kind BETWEEN 1 AND 4),  -- 1 did, 2 collection, 3 rkey, 4 location
    id    INTEGER NOT NULL,
    value TEXT    NOT NULL CHECK (length(value) BETWEEN 1 AND 2048),
    UNIQUE (kind, id),
    UNIQUE (kind, value)
) STRICT;

-- The next counter value of each (kind, shard) sequence; a missing row means 1.
CREATE TABLE sequences (
    kind  INTEGER NOT NULL CHECK (kind BETWEEN 1 AND 4),
    shard INTEGER NOT NULL CHECK (shard BETWEEN 0 AND 65535),
    next  INTEGER NOT NULL CHECK (next >= 1),
    PRIMARY KEY (kind, shard)
) STRICT, WITHOUT ROWID;
