-- repos.db: what backfill knows about each repository, and how far each listing got.
CREATE TABLE repos (
    did             TEXT PRIMARY KEY,
    -- Base URL of the PDS it is fetched from ('' for a repo read from a CAR file).
    host            TEXT NOT NULL,
    -- pending | done | deactivated | takendown | suspended | deleted | not_found | failed | stale
    status          TEXT NOT NULL,
    -- Revision (TID as integer) of the indexed snapshot.
    rev             INTEGER,
    -- Ingest stamp the snapshot was written at (done only).
    stamp           INTEGER,
    records         INTEGER NOT NULL DEFAULT 0,
    links           INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    -- Unix milliseconds before which a retry must not start.
    next_attempt_ms INTEGER NOT NULL DEFAULT 0,
    updated_ms      INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX repos_due ON repos (status, next_attempt_ms);

-- Paging position of each listing (listHosts on a relay, listRepos on a host).
CREATE TABLE listings (
    source   TEXT PRIMARY KEY,
    cursor   TEXT,
    complete INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Newest live commit revision applied per repo: a snapshot older than it is stale.
CREATE TABLE live_revs (
    did TEXT PRIMARY KEY,
    rev INTEGER NOT NULL
) WITHOUT ROWID;
