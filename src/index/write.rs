//! The write path: every operation takes the next stamp of the ingest clock and becomes
//! backlinks and revocations in the memtables, its strings outlined to ids.
//!
//! Invariants:
//! - An update writes its revocation and its new backlinks at the same stamp.
//! - An operation that fails writes nothing at its stamp, except a repository snapshot cut
//!   short, which moves the clock past its stamp anyway (no two operations share a stamp).
//! - A record with more than one link also gets its links in the forward tree, at the same stamp
//!   (the many-to-many queries go from one of its links to the others).
//! - A repository snapshot holds the writer for the whole repository: its repo-level revocation
//!   and every record's backlinks share one stamp.

use super::{Index, IndexError, WriterState};
use crate::extract::{ExtractLimits, ExtractStats, Extraction, extract_links};
use crate::model::account::AccountState;
use crate::model::ids::{Backlink, RecordId, Revocation};
use crate::model::operation::{Operation, RecordRef};
use crate::model::syntax::LinkTarget;
use crate::model::tid::parse_tid;
use crate::outline::OutlineKind;
use std::sync::atomic::Ordering;

/// The interning shard of the single ingest writer.
const WRITER_SHARD: u16 = 0;

/// One operation with its record's links already found, as the writer takes it: `apply` finds
/// them first; the importer finds them on its parsing thread (`ingest::prepare`).
pub enum Change<'r, L> {
    Create(&'r RecordRef<'r>, FoundLinks<L>),
    /// A revocation of the record, then its new links, at one stamp.
    Update(&'r RecordRef<'r>, FoundLinks<L>),
    Delete(&'r RecordRef<'r>),
    Account {
        did: &'r str,
        active: bool,
        status: Option<&'r str>,
    },
}

/// A record's links (target, location) and what extraction counted but did not return.
pub struct FoundLinks<L> {
    pub links: L,
    pub stats: ExtractStats,
}

/// An extraction's links, borrowed from it, as the writer takes them.
fn found_links<'l>(extraction: &'l Extraction<'l>) -> FoundLinks<impl Iterator<Item = (LinkTarget<'l>, &'l str)>> {
    let links = extraction.links.iter().map(|link| (link.target, link.location.as_str()));
    FoundLinks { links, stats: extraction.stats.clone() }
}

/// The link iterator of changes that carry none.
pub type NoLinks<'l> = std::iter::Empty<(LinkTarget<'l>, &'l str)>;

impl Index {
    /// Applies one operation at the next stamp; `cursor` is the event's stream position.
    pub fn apply(&self, operation: &Operation<'_>, cursor: Option<i64>) -> Result<(), IndexError> {
        assert!(!self.options.read_only, "write to a read-only index");
        let no_links = |change: Change<'_, NoLinks<'_>>| self.apply_extracted(change, cursor);
        match operation {
            Operation::Create(op) | Operation::Update(op) => {
                let extraction = extract_links(&op.record, &self.options.extract);
                let found = found_links(&extraction);
                let change = match operation {
                    Operation::Create(_) => Change::Create(&op.record_ref, found),
                    _ => Change::Update(&op.record_ref, found),
                };
                self.apply_extracted(change, cursor)
            }
            Operation::Delete(record_ref) => no_links(Change::Delete(record_ref)),
            Operation::Account { did, active, status } => {
                no_links(Change::Account { did: did.as_ref(), active: *active, status: status.as_deref() })
            }
            Operation::Identity { .. } | Operation::Skip => Ok(()),
        }
    }

    /// Applies one operation whose links were already found: `apply` after its extraction, or
    /// the importer's writing thread with links found on its parsing thread.
    pub fn apply_extracted<'l, L>(&self, change: Change<'_, L>, cursor: Option<i64>) -> Result<(), IndexError>
    where
        L: Iterator<Item = (LinkTarget<'l>, &'l str)>,
    {
        assert!(!self.options.read_only, "write to a read-only index");
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let stamp = writer.position.clock + 1;
        match change {
            Change::Create(record_ref, found) => {
                self.write_backlinks(self.backlinks(self.source_id(record_ref)?, found, stamp)?)
            }
            Change::Update(record_ref, found) => {
                // Everything that can fail first: a failed update writes nothing at its stamp.
                let source = self.source_id(record_ref)?;
                let backlinks = self.backlinks(source, found, stamp)?;
                self.write_revocation(source, stamp);
                self.write_backlinks(backlinks);
            }
            Change::Delete(record_ref) => self.write_revocation(self.source_id(record_ref)?, stamp),
            Change::Account { did, active, status } => {
                let did = self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?;
                let state = if active { AccountState::Active } else { AccountState::parse(status.unwrap_or("")) };
                if state == AccountState::Deleted {
                    self.write_revocation(RecordId::repo(did), stamp);
                }
                self.set_account_state(&mut writer, did, state);
            }
        }
        writer.position.clock = stamp;
        if cursor.is_some() {
            writer.position.cursor = cursor;
        }
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How records' links are found (the importer's parsing thread uses it too).
    pub fn extract_limits(&self) -> &ExtractLimits {
        &self.options.extract
    }

    /// Writes a repository snapshot: a repo-level revocation and every record's backlinks, all at
    /// one new stamp, so the snapshot replaces whatever the index held for the repo before.
    /// Returns the stamp and the number of backlinks written. Holds the writer for the whole repo:
    /// no other operation can take a stamp in between.
    pub fn apply_snapshot<'r>(
        &self,
        did: &str,
        records: impl IntoIterator<Item = (RecordRef<'r>, &'r serde_json::Value)>,
    ) -> Result<(u64, u64), IndexError> {
        assert!(!self.options.read_only, "write to a read-only index");
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let stamp = writer.position.clock + 1;
        let repo = RecordId::repo(self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?);
        self.write_revocation(repo, stamp);
        let before = self.counters.backlinks.load(Ordering::Relaxed);
        let written = records.into_iter().try_for_each(|(record_ref, record)| {
            assert_eq!(record_ref.did, did, "a snapshot holds one repository");
            let extraction = extract_links(record, &self.options.extract);
            self.source_id(&record_ref)
                .and_then(|source| self.backlinks(source, found_links(&extraction), stamp))
                .map(|links| self.write_backlinks(links))
        });
        // Even a snapshot cut short wrote at `stamp` (a retry writes a new one over it): no later
        // operation may take the same stamp.
        writer.position.clock = stamp;
        written?;
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        Ok((stamp, self.counters.backlinks.load(Ordering::Relaxed) - before))
    }

    fn set_account_state(&self, writer: &mut WriterState, did: u64, state: AccountState) {
        // Deleted accounts stay in the map too: a backfilled snapshot must not bring them back.
        self.account_states.write().expect("account states lock poisoned").set(did, state);
        writer.pending_accounts.push((did, state));
    }

    fn write_revocation(&self, source: RecordId, stamp: u64) {
        self.thresholds.insert([Revocation { source, rev: stamp }]);
        self.counters.revocations.fetch_add(1, Ordering::Relaxed);
    }

    /// The backlinks of a record at `stamp`, their strings outlined (written by `write_backlinks`).
    fn backlinks<'l>(
        &self,
        source: RecordId,
        found: FoundLinks<impl Iterator<Item = (LinkTarget<'l>, &'l str)>>,
        stamp: u64,
    ) -> Result<Vec<Backlink>, IndexError> {
        let FoundLinks { links, stats } = found;
        let mut entries = Vec::with_capacity(links.size_hint().0);
        for (target, location) in links {
            let target = self.target_id(&target)?;
            let location = self.outlines.intern(OutlineKind::Location, location, WRITER_SHARD)?;
            entries.push(Backlink { target, source, location, source_rev: stamp });
        }
        self.counters.links_collection_only.fetch_add(stats.collection_only as u64, Ordering::Relaxed);
        self.counters.links_handle_authority.fetch_add(stats.handle_authority as u64, Ordering::Relaxed);
        self.counters.links_over_limit.fetch_add(stats.over_link_limit as u64, Ordering::Relaxed);
        Ok(entries)
    }

    /// Writes one record's backlinks, and the same links by source when it has more than one
    /// (a record with a single link is its own only other subject: the forward tree need not say).
    fn write_backlinks(&self, backlinks: Vec<Backlink>) {
        self.counters.backlinks.fetch_add(backlinks.len() as u64, Ordering::Relaxed);
        if backlinks.len() > 1 {
            self.forward.insert(backlinks.iter().map(|link| link.forward()));
        }
        self.links.insert(backlinks);
    }

    fn source_id(&self, record_ref: &RecordRef<'_>) -> Result<RecordId, IndexError> {
        self.record_id(&record_ref.did, &record_ref.collection, &record_ref.rkey)
    }

    fn target_id(&self, target: &LinkTarget<'_>) -> Result<RecordId, IndexError> {
        match target {
            LinkTarget::Record { did, collection, rkey } => self.record_id(did, collection, rkey),
            LinkTarget::Did(did) => Ok(RecordId::repo(self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?)),
            LinkTarget::Url(url) => Ok(RecordId::url(url)),
        }
    }

    fn record_id(&self, did: &str, collection: &str, rkey: &str) -> Result<RecordId, IndexError> {
        let rkey = match parse_tid(rkey) {
            Some(tid) => tid,
            None => self.outlines.intern(OutlineKind::Rkey, rkey, WRITER_SHARD)?,
        };
        Ok(RecordId {
            rkey,
            collection: self.outlines.intern(OutlineKind::Collection, collection, WRITER_SHARD)?,
            did: self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?,
        })
    }
}
