-- plc.db: a local copy of the PLC directory (identity::directory).
-- One row per did:plc: its operation log pruned to what later operations can be checked against
-- (PlcLog::to_bytes, JSON), and whether it is stale (an #identity event or a refused operation
-- since: resolve it from the directory before trusting the row again).
CREATE TABLE dids (
    did   TEXT PRIMARY KEY,
    log   BLOB NOT NULL,
    stale INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Where the bulk export stands: the seq of the last operation taken, and what became of them.
CREATE TABLE export (
    id      INTEGER PRIMARY KEY CHECK (id = 0),
    after   INTEGER NOT NULL,
    applied INTEGER NOT NULL DEFAULT 0,
    refused INTEGER NOT NULL DEFAULT 0
);
INSERT INTO export (id, after) VALUES (0, 0);
