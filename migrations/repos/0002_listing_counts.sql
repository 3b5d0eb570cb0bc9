-- What each listing has given so far, for the per-host caps on pages and entries.
ALTER TABLE listings ADD COLUMN pages INTEGER NOT NULL DEFAULT 0;
ALTER TABLE listings ADD COLUMN dids INTEGER NOT NULL DEFAULT 0;
-- repos.status gains 'rejected' (a snapshot or identity that failed verification) and repos.host
-- becomes where the repository was listed, a hint: it is fetched from the PDS its DID names.
