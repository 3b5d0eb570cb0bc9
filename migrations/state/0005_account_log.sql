-- state.db, version 5: account states published as a log (manifest format 2: a snapshot of the
-- hidden accounts, then ranges of changes). Each flush that changes any account takes the next
-- value of the counter 'account_seq'; every account it changes has a row here with its newest
-- state ('active' included: it shows the account again) and that value, until a published
-- manifest's log covers it.
CREATE TABLE account_changes (
    did   INTEGER PRIMARY KEY,
    state TEXT    NOT NULL CHECK (state IN ('active', 'deactivated', 'suspended', 'takendown', 'deleted', 'other')),
    seq   INTEGER NOT NULL CHECK (seq >= 1)
) STRICT;
CREATE INDEX account_changes_by_seq ON account_changes (seq);

-- Objects under `accounts/` that the newest manifest does not name, with the time (unix
-- milliseconds) GC first found them so: deleted once that is longer ago than the grace period.
CREATE TABLE unnamed_objects (
    key   TEXT    PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 256),
    since INTEGER NOT NULL CHECK (since >= 0)
) STRICT, WITHOUT ROWID;
