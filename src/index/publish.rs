//! Publishing: every table not yet in the bucket is checked and uploaded, the account changes
//! since the last manifest (or a snapshot of every hidden account) and new outline rows are
//! uploaded, then a manifest naming all of it, then CURRENT.
//!
//! Invariants:
//! - Objects reach the bucket before any manifest names them; CURRENT is written last.
//! - A table's local files are checked (meta decodes, every frame's checksum holds) before upload:
//!   a copy that rotted on disk never reaches the bucket, where it would pass for the good copy.
//!   The data file is checked and hashed in one pass, then sent a buffer at a time with that hash
//!   (`Store::put_file`): exactly the bytes checked are uploaded, and never held whole in memory.
//! - Generations strictly increase, past both the catalog's record and the bucket's CURRENT.
//! - A manifest names the tables of one look at the catalog, every one of them uploaded. A merge
//!   may retire tables while they upload; their local files stay until the publish ends
//!   (`retired`). A table retired after the look that named it is in the bucket, where GC
//!   leaves it for the grace period.
//! - An account log's objects are uploaded before the manifest that names them; the account
//!   changes it covers are forgotten locally only once that manifest is recorded.

use super::{Index, IndexError, add_elapsed, io_err};
use crate::account_log::{AccountLog, AccountObject, LogObject, PackedAccounts, object_key};
use crate::base::corruption::{ObjectKind, Place, report_corruption};
use crate::catalog::IngestPosition;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, table_key};
use crate::lsm::record::TableRecord;
use crate::lsm::table::{FormatError, FrameInfo, PAGED_HEADER_LEN, TableMeta, check_data_len, check_in_order};
use crate::lsm::table::{declared_lengths, is_paged, verify_data_file, verify_data_frames};
use crate::manifest::{Manifest, OutlineRange};
use crate::model::ids::{AccountTally, Backlink, ForwardLink, HotLink, Revocation, Tally, TreeKind};
use crate::outline::OutlineKind;
use crate::store::object::{HashingReader, LocalFile};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Bytes read at a time while a data file is checked before its upload.
const CHECK_READ_BYTES: usize = 256 << 10;

/// What a manifest is made of from the catalog: the ingest position and the current tables.
type CatalogLook = (IngestPosition, Vec<TableRecord>);

/// What the newest known manifest says, as far as publishing and GC care.
#[derive(Debug, Clone, Default)]
pub(super) struct Published {
    pub(super) name: Option<String>,
    /// Its generation (0: none yet); the next manifest's must be larger.
    pub(super) generation: u64,
    pub(super) table_ids: HashSet<String>,
    pub(super) outlines: Vec<OutlineRange>,
    /// Its account log (`None`: a manifest that listed its hidden accounts, or none yet).
    pub(super) accounts: Option<AccountLog>,
}

impl Published {
    pub(super) fn of(name: &str, manifest: &Manifest) -> Self {
        Published {
            name: Some(name.to_string()),
            generation: manifest.generation,
            table_ids: manifest.tables.iter().map(|t| t.id.clone()).collect(),
            outlines: manifest.outlines.clone(),
            accounts: manifest.accounts.clone(),
        }
    }

    /// Outline rows up to this insertion sequence number are published.
    fn outline_through(&self) -> i64 {
        self.outlines.iter().map(|r| r.through).max().unwrap_or(0)
    }
}

impl Index {
    /// Bytes of live tables (data and meta) not yet uploaded.
    pub fn unuploaded_bytes(&self) -> Result<u64, IndexError> {
        Ok(self.catalog.pending_uploads()?.iter().map(|t| t.data_len + t.meta_len).sum())
    }

    /// Uploads each table (checked first; data before meta) and records it as uploaded.
    async fn upload_tables(&self, records: &[TableRecord]) -> Result<(), IndexError> {
        for record in records {
            let dir = self.tree_files(record.tree).dir();
            let (data_path, meta_path) =
                (dir.join(format!("{}.data", record.id)), dir.join(format!("{}.meta", record.id)));
            let TableFiles { data, meta } = check_before_upload(record.clone(), data_path, meta_path).await?;
            let started = std::time::Instant::now();
            self.store.put_file(&table_key(record.tree, &record.id, "data"), &data).await?;
            self.store.put_file(&table_key(record.tree, &record.id, "meta"), &meta).await?;
            self.counters.upload_bytes.fetch_add(data.len + meta.len, Ordering::Relaxed);
            add_elapsed(&self.counters.upload_micros, started);
            self.catalog.mark_uploaded(&record.id)?;
            self.tree_files(record.tree).mark_uploaded(&record.id);
        }
        Ok(())
    }

    /// Publishes a manifest naming every table (all uploaded) and every outline range (new rows
    /// uploaded first), then points CURRENT at it, then trims the local data cache.
    pub async fn publish_manifest(&self) -> Result<String, IndexError> {
        let name = self.publish_uploaded().await?;
        self.enforce_cache_budget()?;
        Ok(name)
    }

    async fn publish_uploaded(&self) -> Result<String, IndexError> {
        let result = self.publish_after(self.published().await?).await;
        if result.is_err() {
            // CURRENT may have moved even though the call failed (the answer to the PUT was lost,
            // or the catalog write after it failed): read it again before the next publish or GC
            // relies on what it names.
            *self.published.lock().expect("published lock poisoned") = None;
        }
        result
    }

    /// Writes the next manifest after `previous` and points CURRENT at it.
    async fn publish_after(&self, previous: Published) -> Result<String, IndexError> {
        // The catalog first (position before tables: tables may hold more than the position
        // says, never less), while flushes and merges may go on committing. Every id its tables
        // use was persisted before they were committed, so the outline rows read after it cover
        // them; its tables not uploaded yet are uploaded before the manifest names them.
        let (position, tables) = self.upload_current_tables().await?;
        let accounts = self.upload_account_log(previous.accounts.as_ref()).await?;
        let mut outlines = previous.outlines.clone();
        outlines.extend(self.upload_outline_ranges(previous.outline_through()).await?);
        // Past both the catalog's record and CURRENT's: a crash (or a lost answer) between
        // writing CURRENT and recording it leaves the catalog one generation behind.
        let recorded = self.catalog.last_manifest()?.map_or(0, |(generation, _)| generation);
        let generation = recorded.max(previous.generation) + 1;
        let manifest = Manifest::new(generation, position, tables, outlines, accounts);
        let (name, body) = manifest.encode();
        self.store.put(&format!("manifests/{name}"), body.into()).await?;
        self.store.put("CURRENT", name.clone().into_bytes().into()).await?;
        self.catalog.record_manifest(generation, &name)?;
        let covered = manifest.accounts.as_ref().expect("a writer's manifest has an account log").through();
        self.catalog.forget_published_account_changes(covered)?;
        *self.published.lock().expect("published lock poisoned") = Some(Published::of(&name, &manifest));
        Ok(name)
    }

    /// The catalog's position and tables, every table uploaded. In flight from before the look
    /// (`enter_publish`), so no merge removes the files of a table it names.
    async fn upload_current_tables(&self) -> Result<CatalogLook, IndexError> {
        let _in_flight = self.enter_publish();
        let (position, tables) = (self.catalog.position()?, self.catalog.tables()?);
        let not_uploaded: Vec<TableRecord> = tables.iter().filter(|t| !t.uploaded).cloned().collect();
        self.upload_tables(&not_uploaded).await?;
        Ok((position, tables))
    }

    /// The account log the next manifest names, its new object uploaded: `previous` as it is when
    /// no account changed since, `previous` and a range of the changes since it, or a snapshot of
    /// every hidden account (no log yet, or `rebase_due`).
    async fn upload_account_log(&self, previous: Option<&AccountLog>) -> Result<AccountLog, IndexError> {
        if let Some(log) = previous {
            let mut changes = PackedAccounts::default();
            let through = self.catalog.visit_account_changes(log.through(), |did, state| changes.push(did, state))?;
            if through == log.through() {
                return Ok(log.clone());
            }
            if !log.rebase_due(changes.len(), self.options.account_rebase_min_changes) {
                let range = AccountObject { after: log.through(), through, count: changes.len() };
                let body = crate::account_log::encode(LogObject::Changes, &range, &changes);
                self.store.put(&object_key(LogObject::Changes, &range), body.into()).await?;
                let mut log = log.clone();
                log.changes.push(range);
                return Ok(log);
            }
        }
        let mut hidden = PackedAccounts::default();
        let through = self.catalog.visit_hidden_accounts(|did, state| hidden.push(did, state))?;
        let snapshot = AccountObject { after: 0, through, count: hidden.len() };
        let body = crate::account_log::encode(LogObject::Snapshot, &snapshot, &hidden);
        self.store.put(&object_key(LogObject::Snapshot, &snapshot), body.into()).await?;
        Ok(AccountLog::starting_at(snapshot))
    }

    /// Uploads the outline rows stored after `after`: per kind that has any, one object per chunk
    /// of at most `range::CHUNK_ROWS` rows or `range::CHUNK_BYTES` bytes, so that a publish after
    /// a long import holds one chunk in memory at a time. A range ends at its last row's sequence
    /// number; the kind that stored the newest row reaches `through`, which is what the next
    /// publish starts after.
    async fn upload_outline_ranges(&self, after: i64) -> Result<Vec<OutlineRange>, IndexError> {
        use crate::outline::range::{CHUNK_BYTES, CHUNK_ROWS, encode};
        let through = self.outlines.max_seq()?;
        let mut ranges = Vec::new();
        for kind in OutlineKind::ALL {
            let mut from = after;
            while from < through {
                let rows = self.outlines.rows_between(kind, from, through, CHUNK_ROWS, CHUNK_BYTES)?;
                let Some(&(last_seq, _, _)) = rows.last() else { break };
                let range = OutlineRange { kind: kind.name().to_string(), after: from, through: last_seq };
                let body = encode(kind, rows.iter().map(|(_, id, value)| (*id, value.as_str())));
                self.store.put(&range.key(), body.into()).await?;
                from = range.through;
                ranges.push(range);
            }
        }
        Ok(ranges)
    }
}

/// A table's local files decode and every frame's checksum holds: a copy that rotted on disk
/// must never reach the bucket, where it would pass for the good copy. Both files are read in one
/// pass, the meta a page or index chunk at a time and the data file a frame at a time as the
/// chunks name them (a data file is up to 64 MiB, a meta tens of MiB), and hashed as they are
/// read: the upload, which reads them again, sends exactly the bytes checked here or nothing.
async fn check_before_upload(record: TableRecord, data: PathBuf, meta: PathBuf) -> Result<TableFiles, IndexError> {
    let path = data.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let checked = match record.tree {
            TreeKind::Links => check_table_files::<Backlink>(&data, &meta),
            TreeKind::Thresholds => check_table_files::<Revocation>(&data, &meta),
            TreeKind::Forward => check_table_files::<ForwardLink>(&data, &meta),
            TreeKind::Hot => check_table_files::<HotLink>(&data, &meta),
            TreeKind::Tallies => check_table_files::<Tally>(&data, &meta),
            TreeKind::AccountTallies => check_table_files::<AccountTally>(&data, &meta),
        };
        checked.map_err(|failure| failure.into_error(&record, &data, &meta))
    });
    checked.await.map_err(|e| io_err(&path)(std::io::Error::other(format!("table check task failed: {e}"))))?
}

/// A table's two files as checked, to be uploaded.
struct TableFiles {
    data: LocalFile,
    meta: LocalFile,
}

/// Why a table's local files could not be checked.
enum CheckFailure {
    /// A file could not be opened or read: an IO error, not corruption.
    Unreadable(ObjectKind, std::io::Error),
    /// Which file failed its check, and why.
    Corrupt(ObjectKind, &'static str, FormatError),
}

impl CheckFailure {
    fn into_error(self, record: &TableRecord, data: &Path, meta: &Path) -> IndexError {
        match self {
            CheckFailure::Unreadable(ObjectKind::Meta, source) => io_err(meta)(source),
            CheckFailure::Unreadable(_, source) => io_err(data)(source),
            CheckFailure::Corrupt(kind, ext, source) => {
                let object = format!("{} (local copy)", table_key(record.tree, &record.id, ext));
                report_corruption(kind, Place::Local, &object, &source);
                IndexError::Read(ReadError::Corrupt { object, source })
            }
        }
    }
}

fn check_table_files<E: Entry>(data: &Path, meta: &Path) -> Result<TableFiles, CheckFailure> {
    let (meta_file, meta_len) = open_sized(ObjectKind::Meta, meta)?;
    let (data_file, data_len) = open_sized(ObjectKind::Data, data)?;
    let mut start = [0u8; PAGED_HEADER_LEN];
    let start = &mut start[..meta_len.min(PAGED_HEADER_LEN as u64) as usize];
    let read = std::os::unix::fs::FileExt::read_exact_at(&meta_file, start, 0);
    read.map_err(|e| CheckFailure::Unreadable(ObjectKind::Meta, e))?;
    let mut meta_reader = HashingReader::new(std::io::BufReader::with_capacity(CHECK_READ_BYTES, meta_file));
    let mut data_reader = HashingReader::new(std::io::BufReader::with_capacity(CHECK_READ_BYTES, data_file));
    if is_paged(start) {
        check_paged_files::<E>(start, (&mut meta_reader, meta_len), (&mut data_reader, data_len))?;
    } else {
        check_resident_files::<E>((&mut meta_reader, meta_len), (&mut data_reader, data_len))?;
    }
    // Frames cover the whole data file (a checked meta's frames are contiguous up to its length),
    // so each hash is of every byte its check read.
    Ok(TableFiles {
        data: LocalFile { path: data.to_owned(), len: data_len, sha256: data_reader.finish() },
        meta: LocalFile { path: meta.to_owned(), len: meta_len, sha256: meta_reader.finish() },
    })
}

/// A file opened for its check, and its length.
fn open_sized(kind: ObjectKind, path: &Path) -> Result<(std::fs::File, u64), CheckFailure> {
    let unreadable = |e| CheckFailure::Unreadable(kind, e);
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    Ok((file, len))
}

/// A file being checked (read through its hash) and its length.
type Checked<'a> = (&'a mut HashingReader<std::io::BufReader<std::fs::File>>, u64);

/// A version-4 meta and its data file, checked together in file order: each index chunk's frames
/// are read from the data file as the chunk is checked.
fn check_paged_files<E: Entry>(start: &[u8], meta: Checked<'_>, data: Checked<'_>) -> Result<(), CheckFailure> {
    // The data file's length first, so that a short one is corruption, not a failed read; the
    // meta's own length is the in-order check's first.
    let (_, _, declared_data_len) = declared_lengths::<E>(start).map_err(CheckFailure::meta)?;
    check_data_len(declared_data_len, data.1).map_err(CheckFailure::data)?;
    let mut buffer = Vec::new();
    let on_chunk =
        |frames: &[FrameInfo<E>]| verify_data_frames(frames, data.0, &mut buffer).map_err(CheckFailure::data);
    check_in_order::<E, CheckFailure>(meta.0, meta.1, |_| {}, on_chunk).map(drop)
}

/// A meta of an older version (never larger than its tables were then), decoded whole, and its
/// data file.
fn check_resident_files<E: Entry>(meta: Checked<'_>, data: Checked<'_>) -> Result<(), CheckFailure> {
    let mut bytes = Vec::with_capacity(meta.1 as usize);
    std::io::Read::read_to_end(meta.0, &mut bytes).map_err(|e| CheckFailure::Unreadable(ObjectKind::Meta, e))?;
    let decoded = TableMeta::<E>::decode(&bytes).map_err(CheckFailure::meta)?;
    verify_data_file(&decoded, data.1, data.0).map_err(CheckFailure::data)
}

impl CheckFailure {
    /// A failure of the meta's check.
    fn meta(error: FormatError) -> Self {
        CheckFailure::of(ObjectKind::Meta, "meta", error)
    }

    /// A failure of the data file's check.
    fn data(error: FormatError) -> Self {
        CheckFailure::of(ObjectKind::Data, "data", error)
    }

    fn of(kind: ObjectKind, ext: &'static str, error: FormatError) -> Self {
        match error {
            FormatError::Unreadable { detail, .. } => CheckFailure::Unreadable(kind, std::io::Error::other(detail)),
            error => CheckFailure::Corrupt(kind, ext, error),
        }
    }
}

/// What the meta's in-order check finds itself (a data file's errors come through `on_chunk`
/// already placed).
impl From<FormatError> for CheckFailure {
    fn from(error: FormatError) -> Self {
        CheckFailure::meta(error)
    }
}
