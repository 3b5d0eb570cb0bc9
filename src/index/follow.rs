//! Restore and follow: a data directory made to match the bucket's CURRENT manifest, once (a new
//! machine restoring itself) or again and again (a read-only replica).
//!
//! Invariants:
//! - A manifest is validated (`Manifest::decode`) and every meta it adds is checked before any of
//!   it is written locally; a corrupt object fails the step and changes nothing.
//! - Outline rows are imported before the tables that use them are installed.
//! - After following a manifest, the index holds exactly its tables, position and hidden accounts,
//!   and this machine's future table and outline ids come after every id in it.

use super::publish::Published;
use super::{Index, IndexError, io_err};
use crate::base::corruption::{ObjectKind, Place, report_corruption};
use crate::base::durable::write_durably;
use crate::catalog::{IngestPosition, ManifestSync};
use crate::lsm::bytes::invalid;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, table_key};
use crate::lsm::record::{RunKind, TableRecord};
use crate::lsm::table::{FormatError, TableMeta};
use crate::manifest::{Manifest, ManifestTable};
use crate::model::account::AccountState;
use crate::model::ids::{Backlink, Revocation, TreeKind};
use crate::outline::OutlineKind;
use crate::store::object::StoreError;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

impl Index {
    /// The newest manifest known: the one this process published or followed, else CURRENT.
    pub(super) async fn published(&self) -> Result<Published, IndexError> {
        if let Some(published) = self.published.lock().expect("published lock poisoned").clone() {
            return Ok(published);
        }
        let published = match self.current_manifest().await? {
            Some((name, manifest)) => Published::of(&name, &manifest),
            None => Published::default(),
        };
        *self.published.lock().expect("published lock poisoned") = Some(published.clone());
        Ok(published)
    }

    /// The bucket's CURRENT manifest, validated; `None` for an empty bucket.
    pub async fn current_manifest(&self) -> Result<Option<(String, Manifest)>, IndexError> {
        let name = match self.store.get("CURRENT").await {
            Ok(name) => String::from_utf8_lossy(&name).into_owned(),
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let key = format!("manifests/{name}");
        let body = self.store.get(&key).await?;
        let manifest = Manifest::decode(&name, &body).map_err(|e| {
            report_corruption(ObjectKind::Manifest, Place::Bucket, &key, &e);
            ReadError::Corrupt { object: key.clone(), source: invalid("manifest", e) }
        })?;
        Ok(Some((name, manifest)))
    }

    /// Restores a new, empty data directory from the bucket's CURRENT manifest (if there is
    /// one). Returns whether it restored anything.
    pub async fn restore_if_empty(&self, now_ms: u64) -> Result<bool, IndexError> {
        let empty = self.catalog.last_manifest()?.is_none() && self.catalog.tables()?.is_empty();
        if !empty {
            return Ok(false);
        }
        match self.current_manifest().await? {
            Some((name, manifest)) => {
                self.follow(&name, manifest, now_ms).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A replica's step: follows CURRENT if it moved. Returns whether it did.
    pub async fn follow_current(&self, now_ms: u64) -> Result<bool, IndexError> {
        let known = self.published.lock().expect("published lock poisoned").as_ref().and_then(|p| p.name.clone());
        match self.current_manifest().await? {
            Some((name, manifest)) if Some(&name) != known.as_ref() => {
                self.follow(&name, manifest, now_ms).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Makes this index exactly what `manifest` describes: imports its outline ranges, fetches
    /// the metas of tables it adds, retires the runs it no longer names, and takes its position
    /// and hidden accounts. Table data stays in the bucket (read by range).
    async fn follow(&self, name: &str, manifest: Manifest, now_ms: u64) -> Result<(), IndexError> {
        let already = self.published.lock().expect("published lock poisoned").clone().unwrap_or_default();
        for range in manifest.outlines.iter().filter(|r| !already.outlines.contains(r)) {
            let kind = OutlineKind::from_name(&range.kind).expect("validated by Manifest::decode");
            let key = range.key();
            let rows = crate::outline::range::decode(kind, &self.store.get(&key).await?).map_err(|e| {
                report_corruption(ObjectKind::Outline, Place::Bucket, &key, &e);
                ReadError::Corrupt { object: key.clone(), source: invalid("outline range", e) }
            })?;
            self.outlines.import_rows(kind, &rows)?;
        }
        // Rows this machine stores from now on must come after every published range.
        self.outlines.reserve_seq_through(manifest.outlines.iter().map(|r| r.through).max().unwrap_or(0))?;
        let live: HashMap<String, TableRecord> =
            self.catalog.tables()?.into_iter().map(|t| (t.id.clone(), t)).collect();
        let named: HashSet<&str> = manifest.tables.iter().map(|t| t.id.as_str()).collect();
        let mut added = Vec::new();
        for table in manifest.tables.iter().filter(|t| !live.contains_key(&t.id)) {
            added.push(self.fetch_meta(table).await?);
        }
        let mut retired_runs: Vec<String> =
            live.values().filter(|t| !named.contains(t.id.as_str())).map(|t| t.run_id.clone()).collect();
        retired_runs.sort();
        retired_runs.dedup();
        let hidden: Vec<(u64, AccountState)> =
            manifest.hidden_accounts.iter().map(|(did, status)| (*did, AccountState::parse(status))).collect();
        let position = IngestPosition { cursor: manifest.cursor, clock: manifest.clock };
        let sync = ManifestSync {
            generation: manifest.generation,
            name,
            retired_runs: &retired_runs,
            added: &added,
            position: position.clone(),
            hidden: &hidden,
            min_table_seq: next_table_seq_after(&manifest),
        };
        self.catalog.sync_to_manifest(&sync, now_ms)?;
        self.reload_trees()?;
        // The manifest's tables hold all up to its position (and maybe more).
        self.tables_clock.store(position.clock, Ordering::Release);
        for table in live.values().filter(|t| !named.contains(t.id.as_str())) {
            self.remove_local_table(table)?;
            self.catalog.forget_table(&table.id)?;
        }
        *self.hidden.write().expect("hidden lock poisoned") = hidden.into_iter().collect();
        self.writer.lock().expect("writer lock poisoned").position = position;
        *self.published.lock().expect("published lock poisoned") = Some(Published::of(name, &manifest));
        Ok(())
    }

    /// Downloads and checks a table's meta into the local tree directory.
    async fn fetch_meta(&self, table: &ManifestTable) -> Result<TableRecord, IndexError> {
        let tree = TreeKind::from_name(&table.tree).expect("validated by Manifest::decode");
        let key = table_key(tree, &table.id, "meta");
        let bytes = self.store.get(&key).await?;
        // Checked before it is written: a corrupt meta must fail the restore, not the next start.
        let checked = match tree {
            TreeKind::Links => check_fetched_meta::<Backlink>(table, &bytes),
            TreeKind::Thresholds => check_fetched_meta::<Revocation>(table, &bytes),
        };
        checked.map_err(|source| {
            report_corruption(ObjectKind::Meta, Place::Bucket, &key, &source);
            ReadError::Corrupt { object: key.clone(), source }
        })?;
        let dir = self.tree_files(tree).dir();
        let path = dir.join(format!("{}.meta", table.id));
        write_durably(&path, &bytes).map_err(io_err(&path))?;
        Ok(TableRecord {
            id: table.id.clone(),
            tree,
            run_id: table.run_id.clone(),
            run_kind: if table.compacted { RunKind::Compacted } else { RunKind::Delta },
            shard: table.shard,
            shard_count: table.shard_count,
            entries: table.entries,
            data_len: table.data_len,
            meta_len: table.meta_len,
            uploaded: true,
            min_stamp: table.min_stamp,
            max_stamp: table.max_stamp,
        })
    }
}

/// A fetched meta decodes, and its sizes are the ones the manifest gave.
fn check_fetched_meta<E: Entry>(table: &ManifestTable, bytes: &[u8]) -> Result<(), FormatError> {
    let meta = TableMeta::<E>::decode(bytes)?;
    if bytes.len() as u64 != table.meta_len || meta.data_len != table.data_len {
        let detail = format!(
            "meta of {} bytes for {} bytes of data; the manifest says {} and {}",
            bytes.len(),
            meta.data_len,
            table.meta_len,
            table.data_len
        );
        return Err(FormatError::Invalid { what: "meta", detail });
    }
    Ok(())
}

/// The table sequence a writer restored from `manifest` must start at: past every id in it (the
/// first 16 hex digits of a table or run id are its sequence number).
fn next_table_seq_after(manifest: &Manifest) -> u64 {
    let seq_of = |id: &str| u64::from_str_radix(&id[..16], 16).unwrap_or(0);
    manifest.tables.iter().flat_map(|t| [seq_of(&t.id), seq_of(&t.run_id)]).max().unwrap_or(0) + 1
}
