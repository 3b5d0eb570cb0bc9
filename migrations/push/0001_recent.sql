-- Recent records' links: where the newest change-log entry of each record created or updated
-- within the log's window is. Keys are xxh3-64 hashes of the record's at:// URI and its DID
-- (the entry they lead to is checked against the URI, so a collision is only a miss).
CREATE TABLE recent (
    source INTEGER PRIMARY KEY,
    did INTEGER NOT NULL,
    position INTEGER NOT NULL
);
CREATE INDEX recent_by_did ON recent (did);
CREATE INDEX recent_by_position ON recent (position);

-- The feed's own facts: `observed_through`, the Jetstream time of the newest event it took, and
-- `log_through`, the newest change-log cursor the rows reflect.
CREATE TABLE facts (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
