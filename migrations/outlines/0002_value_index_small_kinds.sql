-- outlines.db, version 2: the index by string covers only collections and locations.
--
-- DIDs and record keys (tens of millions on the network) are found by string through the
-- fingerprint table beside this file (outlines.fp), which also refuses a second id for a string.
-- Their random inserts into a unique (kind, value) index were most of a flush's work with
-- millions of accounts, so the table is rebuilt without that constraint.

CREATE TABLE outlines_v2 (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    kind  INTEGER NOT NULL CHECK (kind BETWEEN 1 AND 4),  -- 1 did, 2 collection, 3 rkey, 4 location
    id    INTEGER NOT NULL,
    value TEXT    NOT NULL CHECK (length(value) BETWEEN 1 AND 2048),
    UNIQUE (kind, id)
) STRICT;

INSERT INTO outlines_v2 (seq, kind, id, value) SELECT seq, kind, id, value FROM outlines ORDER BY seq;

-- The high-water mark may be above every stored row (a restored writer reserves published
-- sequence numbers): carry it over rather than let the insert above set it.
CREATE TEMP TABLE kept_sequence AS SELECT seq FROM sqlite_sequence WHERE name = 'outlines';
DROP TABLE outlines;
ALTER TABLE outlines_v2 RENAME TO outlines;
DELETE FROM sqlite_sequence WHERE name IN ('outlines', 'outlines_v2');
INSERT INTO sqlite_sequence (name, seq) SELECT 'outlines', seq FROM kept_sequence;
DROP TABLE kept_sequence;

-- Lookups by string of the small kinds must name the condition (`kind IN (2, 4)`) for SQLite to
-- use this partial index.
CREATE UNIQUE INDEX outlines_small_values ON outlines (kind, value) WHERE kind IN (2, 4);
