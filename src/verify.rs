//! `backlinks verify`: looks for corruption everywhere, instead of waiting for a reader to meet it.
//!
//! Every object backlinks writes carries a checksum (docs/format.md, "Checksums"): each frame of
//! a `.data` file and the whole `.meta` file end with an xxh3-64, a manifest's name holds the
//! xxh3-128 of its body, and an outline range and an account log object end with an xxh3-64
//! inside their zstd frame. A
//! reader that finds a mismatch reports it (`base::corruption`) and fails with an error that
//! names the object, so a query answers with an XRPC 500, never with the bytes.
//!
//! `verify_bucket` checks every object the bucket's CURRENT manifest names; `verify_local` checks
//! the local copies (metas, cached data) of every table the local catalog names. Both return one
//! line per object.
//!
//! Invariants:
//! - A verification holds at most `MAX_VERIFY_READ` bytes of a data file (plus one frame) at a
//!   time, whatever the file's size, and at most `MAX_META_BYTES` of a meta.
//! - A verification never writes, moves or deletes anything, and never stops at the first bad
//!   object: it reports them all.

use crate::account_log::{AccountLog, object_key};
use crate::catalog::Catalog;
use crate::lsm::entry::Entry;
use crate::lsm::handle::table_key;
use crate::lsm::record::TableRecord;
use crate::lsm::table::{TableMeta, decode_frames};
use crate::manifest::{Manifest, ManifestTable};
use crate::model::ids::{AccountTally, Backlink, ForwardLink, HotLink, Revocation, Tally, TreeKind};
use crate::outline::OutlineKind;
use crate::store::dir::DirStore;
use crate::store::object::{Store, StoreError};
use std::ops::Range;
use std::path::Path;

/// Most bytes of a data file one verification read fetches.
pub const MAX_VERIFY_READ: u64 = 8 << 20;
/// Largest meta file a verification reads (a meta holds a filter of at most 256 MiB).
pub const MAX_META_BYTES: u64 = 300 << 20;

/// What a verification found about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Ok,
    Missing,
    /// A checksum or format check failed.
    Corrupt(String),
    /// The store failed to answer (the object may be fine).
    Unreadable(String),
}

impl Status {
    fn word(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "MISSING",
            Status::Corrupt(_) => "CORRUPT",
            Status::Unreadable(_) => "UNREADABLE",
        }
    }
}

/// One object and its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub object: String,
    pub status: Status,
}

/// Every object a verification looked at, in the order it looked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub checked: Vec<Checked>,
}

impl Report {
    fn push(&mut self, object: impl Into<String>, status: Status) {
        self.checked.push(Checked { object: object.into(), status });
    }

    fn count(&self, word: &str) -> usize {
        self.checked.iter().filter(|c| c.status.word() == word).count()
    }

    /// Nothing corrupt, missing or unreadable.
    pub fn is_clean(&self) -> bool {
        self.checked.iter().all(|c| c.status == Status::Ok)
    }

    pub fn extend(&mut self, other: Report) {
        self.checked.extend(other.checked);
    }

    /// One line per object (`<status> <object>[: <why>]`), then a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for checked in &self.checked {
            let word = checked.status.word();
            match &checked.status {
                Status::Corrupt(why) | Status::Unreadable(why) => {
                    out.push_str(&format!("{word:<10} {}: {why}\n", checked.object))
                }
                _ => out.push_str(&format!("{word:<10} {}\n", checked.object)),
            }
        }
        out.push_str(&format!(
            "{} objects checked: {} ok, {} corrupt, {} missing, {} unreadable\n",
            self.checked.len(),
            self.count("ok"),
            self.count("CORRUPT"),
            self.count("MISSING"),
            self.count("UNREADABLE"),
        ));
        out
    }
}

/// A store error as a status: a missing object, or an unreadable one.
fn store_status(error: &StoreError) -> Status {
    match error {
        StoreError::NotFound { .. } => Status::Missing,
        other => Status::Unreadable(other.to_string()),
    }
}

/// Checks CURRENT, the manifest it names, every outline range and every table (meta and data)
/// of that manifest.
pub async fn verify_bucket(store: &dyn Store) -> Report {
    let mut report = Report::default();
    let name = match store.get("CURRENT").await {
        Ok(name) => String::from_utf8_lossy(&name).into_owned(),
        Err(e) => {
            report.push("CURRENT", store_status(&e));
            return report;
        }
    };
    report.push("CURRENT", Status::Ok);
    let key = format!("manifests/{name}");
    let manifest = match store.get(&key).await {
        Ok(body) => Manifest::decode(&name, &body),
        Err(e) => {
            report.push(key, store_status(&e));
            return report;
        }
    };
    let manifest = match manifest {
        Ok(manifest) => manifest,
        Err(e) => {
            report.push(key, Status::Corrupt(e.to_string()));
            return report;
        }
    };
    report.push(key, Status::Ok);
    for range in &manifest.outlines {
        let status = check_outline_range(store, &range.kind, &range.key()).await;
        report.push(range.key(), status);
    }
    for (kind, object) in manifest.accounts.iter().flat_map(AccountLog::objects) {
        let key = object_key(kind, object);
        let status = match store.get(&key).await {
            Ok(body) => crate::account_log::decode(kind, object, &body).map_or_else(Status::Corrupt, |_| Status::Ok),
            Err(e) => store_status(&e),
        };
        report.push(key, status);
    }
    for table in &manifest.tables {
        report.extend(check_table(store, &table.tree, &table.id, Some(table), "").await);
    }
    report
}

/// Checks the local copy of every table the catalog in `data_dir` names: its meta (always
/// local) and its data file when it is cached. An absent data directory has nothing to check.
pub async fn verify_local(data_dir: &Path) -> Result<Report, crate::catalog::CatalogError> {
    let state = data_dir.join("state");
    if !state.join("state.db").exists() {
        return Ok(Report::default());
    }
    let tables = Catalog::open(&state.join("state.db"))?.tables()?;
    let local = DirStore::new(state.clone());
    let shown = format!("{}/", state.display());
    let mut report = Report::default();
    for record in &tables {
        report.extend(check_local_table(&local, record, &shown).await);
    }
    Ok(report)
}

async fn check_local_table(local: &DirStore, record: &TableRecord, shown: &str) -> Report {
    let present = |ext| async move {
        local.list(&table_key(record.tree, &record.id, ext)).await.is_ok_and(|found| !found.is_empty())
    };
    let (cached, partial) = (present("data").await, !present("meta").await && present("part").await);
    let mut report = check_table(local, record.tree.name(), &record.id, None, shown).await;
    if !cached {
        // Not cached locally (read by range from the bucket): only the meta is expected here.
        report.checked.retain(|c| !c.object.ends_with(".data"));
    }
    if partial {
        // A read-only server's partial copy: its pieces were checked as they were fetched, and
        // the bucket's whole meta is what `verify` checks there.
        report.checked.retain(|c| !c.object.ends_with(".meta"));
    }
    report
}

/// The outline range at `key` decodes and its checksum holds.
async fn check_outline_range(store: &dyn Store, kind: &str, key: &str) -> Status {
    let Some(kind) = OutlineKind::from_name(kind) else { return Status::Corrupt(format!("unknown kind {kind:?}")) };
    match store.get(key).await {
        Ok(bytes) => match crate::outline::range::decode(kind, &bytes) {
            Ok(_) => Status::Ok,
            Err(e) => Status::Corrupt(e.to_string()),
        },
        Err(e) => store_status(&e),
    }
}

/// Checks one table's meta and data in `store`; `expected` (from a manifest) adds size checks.
/// Objects are named `<shown><key>`.
async fn check_table(store: &dyn Store, tree: &str, id: &str, expected: Option<&ManifestTable>, shown: &str) -> Report {
    match TreeKind::from_name(tree) {
        Some(TreeKind::Links) => check_table_of::<Backlink>(store, id, expected, shown).await,
        Some(TreeKind::Thresholds) => check_table_of::<Revocation>(store, id, expected, shown).await,
        Some(TreeKind::Forward) => check_table_of::<ForwardLink>(store, id, expected, shown).await,
        Some(TreeKind::Hot) => check_table_of::<HotLink>(store, id, expected, shown).await,
        Some(TreeKind::Tallies) => check_table_of::<Tally>(store, id, expected, shown).await,
        Some(TreeKind::AccountTallies) => check_table_of::<AccountTally>(store, id, expected, shown).await,
        None => {
            let other = tree;
            let mut report = Report::default();
            report.push(format!("{shown}tables/{other}/{id}"), Status::Corrupt(format!("unknown tree {other:?}")));
            report
        }
    }
}

async fn check_table_of<E: Entry>(
    store: &dyn Store,
    id: &str,
    expected: Option<&ManifestTable>,
    shown: &str,
) -> Report {
    let mut report = Report::default();
    let (meta_key, data_key) = (table_key(E::TREE, id, "meta"), table_key(E::TREE, id, "data"));
    let meta = match read_meta::<E>(store, &meta_key, expected).await {
        Ok(meta) => meta,
        Err(status) => {
            report.push(format!("{shown}{meta_key}"), status);
            // Without its meta, a data file cannot be split into frames; say so rather than skip it.
            let why = "not checked: its meta is unusable".to_string();
            report.push(format!("{shown}{data_key}"), Status::Unreadable(why));
            return report;
        }
    };
    report.push(format!("{shown}{meta_key}"), Status::Ok);
    report.push(format!("{shown}{data_key}"), check_data(store, &data_key, &meta).await);
    report
}

/// Reads and decodes a meta, checking it against the manifest's sizes when there is one.
async fn read_meta<E: Entry>(
    store: &dyn Store,
    key: &str,
    expected: Option<&ManifestTable>,
) -> Result<TableMeta<E>, Status> {
    let size = object_size(store, key).await?;
    if size > MAX_META_BYTES {
        return Err(Status::Corrupt(format!("{size} bytes is over the {MAX_META_BYTES}-byte limit of a meta")));
    }
    let bytes = store.get(key).await.map_err(|e| store_status(&e))?;
    let meta = TableMeta::<E>::decode(&bytes).map_err(|e| Status::Corrupt(e.to_string()))?;
    match expected {
        Some(table) if table.meta_len != bytes.len() as u64 || table.data_len != meta.data_len => {
            Err(Status::Corrupt(format!(
                "sizes disagree with the manifest: meta {} (manifest {}), data {} (manifest {})",
                bytes.len(),
                table.meta_len,
                meta.data_len,
                table.data_len
            )))
        }
        _ => Ok(meta),
    }
}

/// Reads a data file in bounded pieces and decodes every frame (checksums, order, index).
async fn check_data<E: Entry>(store: &dyn Store, key: &str, meta: &TableMeta<E>) -> Status {
    match object_size(store, key).await {
        Ok(size) if size != meta.data_len => {
            return Status::Corrupt(format!("{size} bytes, the meta says {}", meta.data_len));
        }
        Ok(_) => {}
        Err(status) => return status,
    }
    let mut entries = Vec::new();
    for frames in frame_batches(meta, MAX_VERIFY_READ) {
        let (start, end) = meta.byte_range(frames.clone());
        let bytes = match store.get_range(key, start, end - start).await {
            Ok(bytes) => bytes,
            Err(e) => return store_status(&e),
        };
        if let Err(e) = decode_frames(meta, frames, &bytes, &mut entries) {
            return Status::Corrupt(e.to_string());
        }
        entries.clear();
    }
    Status::Ok
}

/// Consecutive frame ranges of at most `max_read` bytes each (or one frame, if larger).
fn frame_batches<E: Entry>(meta: &TableMeta<E>, max_read: u64) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    while start < meta.frames.len() {
        let mut end = start + 1;
        while end < meta.frames.len() {
            let (from, to) = meta.byte_range(start..end + 1);
            if to - from > max_read {
                break;
            }
            end += 1;
        }
        batches.push(start..end);
        start = end;
    }
    batches
}

/// The size of the object at exactly `key`, from a listing.
async fn object_size(store: &dyn Store, key: &str) -> Result<u64, Status> {
    let found = store.list(key).await.map_err(|e| store_status(&e))?;
    found.iter().find(|o| o.key == key).map(|o| o.size).ok_or(Status::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::table::{TableOptions, write_table};
    use crate::model::ids::RecordId;
    use bytes::Bytes;

    fn table(entries: u64) -> (Vec<u8>, Vec<u8>) {
        let options = TableOptions { frame_bytes: 256, ..TableOptions::default() };
        let links: Vec<Backlink> = (0..entries)
            .map(|i| {
                let target = RecordId { rkey: i / 3, collection: 1, did: 1 << 63 | 1 };
                let source = RecordId { rkey: i, collection: 2, did: 1 << 63 | 2 };
                Backlink { target, source, location: 1, source_rev: 1 }
            })
            .collect();
        let (data, meta, _) = write_table(Vec::new(), &links, &options).unwrap();
        (data, meta)
    }

    async fn store_with(data: &[u8], meta: &[u8]) -> (tempfile::TempDir, DirStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::new(dir.path().to_path_buf());
        store.put("tables/links/t.data", Bytes::copy_from_slice(data)).await.unwrap();
        store.put("tables/links/t.meta", Bytes::copy_from_slice(meta)).await.unwrap();
        (dir, store)
    }

    fn statuses(report: &Report) -> Vec<(&str, &'static str)> {
        report.checked.iter().map(|c| (c.object.as_str(), c.status.word())).collect()
    }

    #[tokio::test]
    async fn every_flipped_bit_of_a_table_is_reported_and_a_good_one_is_ok() {
        let (data, meta) = table(100);
        let (_dir, store) = store_with(&data, &meta).await;
        let good = check_table(&store, "links", "t", None, "").await;
        assert_eq!(statuses(&good), [("tables/links/t.meta", "ok"), ("tables/links/t.data", "ok")]);
        for at in (0..data.len()).step_by(7) {
            let mut bad = data.clone();
            bad[at] ^= 1 << (at % 8);
            let (_dir, store) = store_with(&bad, &meta).await;
            let report = check_table(&store, "links", "t", None, "").await;
            assert_eq!(statuses(&report)[1], ("tables/links/t.data", "CORRUPT"), "flip at data byte {at}");
        }
        for at in (0..meta.len()).step_by(5) {
            let mut bad = meta.clone();
            bad[at] ^= 1 << (at % 8);
            let (_dir, store) = store_with(&data, &bad).await;
            let report = check_table(&store, "links", "t", None, "").await;
            assert_eq!(
                statuses(&report),
                [("tables/links/t.meta", "CORRUPT"), ("tables/links/t.data", "UNREADABLE")],
                "flip at meta byte {at}"
            );
        }
    }

    #[test]
    fn reads_are_bounded_and_cover_every_frame() {
        let (data, meta) = table(3000);
        let meta = TableMeta::<Backlink>::decode(&meta).unwrap();
        let max_read = 1000;
        let batches = frame_batches(&meta, max_read);
        assert!(batches.len() > 3, "{batches:?}");
        assert_eq!(batches.first().map(|b| b.start), Some(0));
        assert_eq!(batches.last().map(|b| b.end), Some(meta.frames.len()));
        assert!(batches.windows(2).all(|w| w[0].end == w[1].start));
        for batch in &batches {
            let (from, to) = meta.byte_range(batch.clone());
            assert!(to - from <= max_read || batch.len() == 1, "{batch:?} reads {} bytes", to - from);
        }
        let whole = frame_batches(&meta, MAX_VERIFY_READ);
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..meta.frames.len()));
        assert_eq!(meta.byte_range(0..meta.frames.len()).1, data.len() as u64);
    }

    #[test]
    fn the_report_names_every_object_and_sums_up() {
        let mut report = Report::default();
        report.push("CURRENT", Status::Ok);
        report.push("tables/links/a.data", Status::Corrupt("frame: checksum mismatch".into()));
        report.push("tables/links/b.data", Status::Missing);
        assert!(!report.is_clean());
        assert_eq!(
            report.render(),
            "ok         CURRENT\n\
             CORRUPT    tables/links/a.data: frame: checksum mismatch\n\
             MISSING    tables/links/b.data\n\
             3 objects checked: 1 ok, 1 corrupt, 1 missing, 0 unreadable\n"
        );
    }
}
