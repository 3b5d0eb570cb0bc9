//! Restore and follow: a data directory made to match the bucket's CURRENT manifest, once (a new
//! machine restoring itself) or again and again (a read-only replica).
//!
//! Invariants:
//! - A manifest is validated (`Manifest::decode`) and every meta it adds is checked before any of
//!   it is written locally; a corrupt object fails the step and changes nothing. A meta fetched
//!   on demand has its resident part checked now and each later piece checked as it arrives.
//! - A writer starts only from whole metas: a restore for a writer fetches them whole, and a
//!   replica's directory is completed (`complete_partial_metas`) before a writer uses it.
//! - Outline rows are imported before the tables that use them are installed.
//! - After following a manifest, the index holds exactly its tables, position and hidden accounts,
//!   and this machine's future table ids, outline ids and account changes come after every one
//!   in it.
//! - A manifest whose account log extends the one followed before costs only its new change
//!   ranges; another log costs its snapshot and every range.

use super::publish::Published;
use super::{Index, IndexError};
use crate::account_log::{AccountObject, LogObject, PackedAccounts, object_key};
use crate::base::corruption::{ObjectKind, Place, report_corruption};
use crate::catalog::{AccountSync, IngestPosition, ManifestSync};
use crate::lsm::bytes::invalid;
use crate::lsm::handle::ReadError;
use crate::lsm::record::{RunKind, TableRecord};
use crate::manifest::{Manifest, ManifestTable};
use crate::model::account::AccountState;
use crate::model::account_states::AccountStates;
use crate::model::ids::TreeKind;
use crate::outline::OutlineKind;
use crate::store::object::StoreError;
use futures::{StreamExt, TryStreamExt};
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
    /// one), every meta whole: what a writer starts from. Returns whether it restored anything.
    pub async fn restore_if_empty(&self, now_ms: u64) -> Result<bool, IndexError> {
        self.restore_with(now_ms, MetaFetch::Whole).await
    }

    /// `restore_if_empty` for a server that only reads: metas on demand, so it answers as soon as
    /// it has the manifest, the outline ranges and each table's directory.
    pub async fn restore_on_demand_if_empty(&self, now_ms: u64) -> Result<bool, IndexError> {
        self.restore_with(now_ms, MetaFetch::OnDemand).await
    }

    async fn restore_with(&self, now_ms: u64, metas: MetaFetch) -> Result<bool, IndexError> {
        let empty = self.catalog.last_manifest()?.is_none() && self.catalog.tables()?.is_empty();
        if !empty {
            return Ok(false);
        }
        match self.current_manifest().await? {
            Some((name, manifest)) => {
                self.follow(&name, manifest, now_ms, metas).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A replica's step: follows CURRENT if it moved (the metas of new tables on demand).
    /// Returns whether it did.
    pub async fn follow_current(&self, now_ms: u64) -> Result<bool, IndexError> {
        let known = self.published.lock().expect("published lock poisoned").as_ref().and_then(|p| p.name.clone());
        match self.current_manifest().await? {
            Some((name, manifest)) if Some(&name) != known.as_ref() => {
                self.follow(&name, manifest, now_ms, MetaFetch::OnDemand).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Fetches whole every meta a replica left partial: before a writer starts from its data
    /// directory (flushes and merges read metas in ways no single key names). Returns how many.
    pub async fn complete_partial_metas(&self) -> Result<usize, IndexError> {
        let store = self.store.as_ref();
        Ok(self.links.complete_partial_metas(store).await?
            + self.thresholds.complete_partial_metas(store).await?
            + self.forward.complete_partial_metas(store).await?
            + self.hot.complete_partial_metas(store).await?
            + self.tallies.complete_partial_metas(store).await?
            + self.account_tallies.complete_partial_metas(store).await?)
    }

    /// Makes this index exactly what `manifest` describes: imports its outline ranges, fetches
    /// the metas of tables it adds (whole or their resident parts, `metas`), retires the runs it
    /// no longer names, and takes its position and hidden accounts. Table data stays in the
    /// bucket (read by range).
    async fn follow(&self, name: &str, manifest: Manifest, now_ms: u64, metas: MetaFetch) -> Result<(), IndexError> {
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
        let added: Vec<TableRecord> =
            manifest.tables.iter().filter(|t| !live.contains_key(&t.id)).map(record_of).collect();
        // Collected first: a lazy iterator of futures here is not `Send` for every lifetime.
        let fetches: Vec<_> = added.iter().map(|record| self.fetch_meta(record, metas)).collect();
        futures::stream::iter(fetches).buffer_unordered(FETCHES_AT_ONCE).try_collect::<Vec<()>>().await?;
        let mut retired_runs: Vec<String> =
            live.values().filter(|t| !named.contains(t.id.as_str())).map(|t| t.run_id.clone()).collect();
        retired_runs.sort();
        retired_runs.dedup();
        let accounts = self.fetch_account_states(&already, &manifest).await?;
        let position = IngestPosition { cursor: manifest.cursor, clock: manifest.clock };
        let sync = ManifestSync {
            generation: manifest.generation,
            name,
            retired_runs: &retired_runs,
            added: &added,
            position: position.clone(),
            accounts: AccountSync {
                replace: accounts.replace.as_ref(),
                changes: &accounts.changes,
                through: accounts.through,
            },
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
        accounts.apply_to(&mut self.account_states.write().expect("account states lock poisoned"));
        self.writer.lock().expect("writer lock poisoned").position = position;
        *self.published.lock().expect("published lock poisoned") = Some(Published::of(name, &manifest));
        Ok(())
    }

    /// What `manifest` changes of the account states this index holds after `already`: only its
    /// new change ranges when its log extends the one followed, else all it says.
    async fn fetch_account_states(
        &self,
        already: &Published,
        manifest: &Manifest,
    ) -> Result<FetchedAccounts, IndexError> {
        let Some(log) = &manifest.accounts else {
            return Ok(FetchedAccounts::listed(&manifest.hidden_accounts));
        };
        let known = already.accounts.as_ref().and_then(|known| log.ranges_after(known));
        let (replace, ranges) = match known {
            Some(new_ranges) => (None, new_ranges),
            None => (Some(self.fetch_account_object(LogObject::Snapshot, &log.snapshot).await?), &log.changes[..]),
        };
        // In order (they apply in order), several at once: a log may hold hundreds of ranges.
        let fetches: Vec<_> = ranges.iter().map(|range| self.fetch_account_object(LogObject::Changes, range)).collect();
        let changes = futures::stream::iter(fetches).buffered(FETCHES_AT_ONCE).try_collect().await?;
        Ok(FetchedAccounts { replace, changes, through: log.through() })
    }

    /// An account log's object, checked.
    async fn fetch_account_object(
        &self,
        kind: LogObject,
        object: &AccountObject,
    ) -> Result<PackedAccounts, IndexError> {
        let key = object_key(kind, object);
        let body = self.store.get(&key).await?;
        crate::account_log::decode(kind, object, &body).map_err(|e| {
            report_corruption(ObjectKind::Accounts, Place::Bucket, &key, &e);
            ReadError::Corrupt { object: key.clone(), source: invalid("account log object", e) }.into()
        })
    }

    /// Downloads and checks a table's meta (or its resident part) into the local tree directory.
    async fn fetch_meta(&self, record: &TableRecord, metas: MetaFetch) -> Result<(), IndexError> {
        let (store, whole) = (self.store.as_ref(), metas == MetaFetch::Whole);
        match record.tree {
            TreeKind::Links => self.links.fetch_meta(store, record, whole).await?,
            TreeKind::Thresholds => self.thresholds.fetch_meta(store, record, whole).await?,
            TreeKind::Forward => self.forward.fetch_meta(store, record, whole).await?,
            TreeKind::Hot => self.hot.fetch_meta(store, record, whole).await?,
            TreeKind::Tallies => self.tallies.fetch_meta(store, record, whole).await?,
            TreeKind::AccountTallies => self.account_tallies.fetch_meta(store, record, whole).await?,
        }
        Ok(())
    }
}

/// The account states a followed manifest brings: every hidden account (when its log is not the
/// one followed before), then changes in order.
struct FetchedAccounts {
    replace: Option<PackedAccounts>,
    changes: Vec<PackedAccounts>,
    /// The account change they are as of.
    through: u64,
}

impl FetchedAccounts {
    /// A format-1 manifest's listed accounts (checked hidden by `Manifest::decode`), sorted and
    /// each once (a hostile list may be neither).
    fn listed(hidden: &[(u64, String)]) -> Self {
        let mut listed: Vec<(u64, AccountState)> =
            hidden.iter().map(|(did, status)| (*did, AccountState::parse(status))).collect();
        listed.sort_by_key(|(did, _)| *did);
        listed.dedup_by_key(|(did, _)| *did);
        let mut replace = PackedAccounts::default();
        listed.into_iter().for_each(|(did, state)| replace.push(did, state));
        FetchedAccounts { replace: Some(replace), changes: Vec::new(), through: 0 }
    }

    fn apply_to(&self, states: &mut AccountStates) {
        if let Some(hidden) = &self.replace {
            *states = AccountStates::default();
            hidden.iter().for_each(|(did, state)| states.push_sorted(did, state));
        }
        for (did, state) in self.changes.iter().flat_map(PackedAccounts::iter) {
            states.set(did, state);
        }
    }
}

/// How a restore or a replica fetches the metas of the tables it adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MetaFetch {
    Whole,
    /// The resident part now, the pages queries read when they read them.
    OnDemand,
}

/// Objects (metas, account change ranges) fetched at once while following a manifest.
const FETCHES_AT_ONCE: usize = 16;

/// The catalog record of a table a manifest names.
fn record_of(table: &ManifestTable) -> TableRecord {
    TableRecord {
        id: table.id.clone(),
        tree: TreeKind::from_name(&table.tree).expect("validated by Manifest::decode"),
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
    }
}

/// The table sequence a writer restored from `manifest` must start at: past every id in it (the
/// first 16 hex digits of a table or run id are its sequence number).
fn next_table_seq_after(manifest: &Manifest) -> u64 {
    let seq_of = |id: &str| u64::from_str_radix(&id[..16], 16).unwrap_or(0);
    manifest.tables.iter().flat_map(|t| [seq_of(&t.id), seq_of(&t.run_id)]).max().unwrap_or(0) + 1
}
