//! Flushes: the three memtables frozen at one position and written out as delta tables, with the
//! hot links and tallies they change (`tally`), committed with the ingest position and the
//! account changes they cover.
//!
//! Invariants:
//! - A flush persists the outlines first, then writes table files, then commits tables, clock,
//!   cursor and account states in one catalog transaction. The backlink and forward-link tables
//!   are written first and staged in place of their frozen memtables (`Tree::stage`: readers see
//!   them, merges do not) before the tallies are computed, so those memtables, most of a flush's
//!   memory, are not held while the tallies read. So a durable table never names an id
//!   that a crash could forget, and after a crash the catalog's position says exactly what the
//!   tables hold: replaying from it re-derives the rest.
//! - A flush writes each identity's freshest backlink (and forward link) once, and none that a
//!   revocation frozen with it kills (that revocation commits in the same transaction); stamps as
//!   written.
//! - A flush freezes every memtable and takes the position under the writer lock, in one step;
//!   the rest (`FlushJob::finish`) runs without it, one flush at a time (`FlushGate`), so writes
//!   made meanwhile go to fresh memtables and the catalog's positions only move forward.
//! - `tables_clock` moves after a flush installs its tables, and a failed flush stops all later
//!   ones (its operations are in no table).

use super::tally::{FlushedLinks, FlushedOps};
use super::{Index, IndexError, WriterState, add_elapsed, io_err};
use crate::base::drop_flag::SetOnDrop;
use crate::catalog::{FlushRecord, IngestPosition};
use crate::liveness::{KnownRevocations, Revocable};
use crate::lsm::compaction;
use crate::lsm::entry::Entry;
use crate::lsm::memtable::Memtable;
use crate::lsm::record::{RunKind, TableRecord};
use crate::lsm::run::Run;
use crate::lsm::tree::Tree;
use crate::model::account::AccountState;
use crate::model::ids::{Backlink, ForwardLink, Revocation};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The rest of a flush begun by `Index::begin_flush`: outlines persisted, tables written,
/// catalog committed, tables installed in place of the frozen memtables. Holds the flush gate
/// until it is done (or dropped).
pub struct FlushJob<'a> {
    common: FlushCommon<'a>,
    links: Option<(Arc<Memtable<Backlink>>, String)>,
    forward: Option<(Arc<Memtable<ForwardLink>>, String)>,
}

/// What a flush holds from its start to its commit, staged or not.
struct FlushCommon<'a> {
    index: &'a Index,
    _ticket: FlushTicket<'a>,
    /// Marks the index's flushes failed unless the job finishes: a job that did not took
    /// operations (frozen memtables, account changes) that are now in no table.
    unfinished: SetOnDrop<'a>,
    started: std::time::Instant,
    thresholds: Option<(Arc<Memtable<Revocation>>, String)>,
    position: IngestPosition,
    accounts: Vec<(u64, AccountState)>,
}

impl<'a> FlushJob<'a> {
    /// Returns how many tables it wrote.
    pub fn finish(self) -> Result<usize, IndexError> {
        self.stage()?.finish()
    }

    /// The first part of the flush: the outlines persisted (no committed table may refer to an
    /// id that a crash could forget), what the tallies need of the backlinks taken, and the
    /// backlink and forward-link tables written and staged in place of their frozen memtables,
    /// which go then.
    pub fn stage(self) -> Result<StagedFlush<'a>, IndexError> {
        let index = self.common.index;
        index.outlines.persist()?;
        let frozen = self.common.thresholds.as_ref();
        let revocations = KnownRevocations::of_flush(frozen.map_or(Vec::new(), |(m, _)| m.iter().copied().collect()));
        let tallying = std::time::Instant::now();
        let tally_links = index.flushed_links(self.links.as_ref().map(|(memtable, _)| memtable.as_ref()))?;
        add_elapsed(&index.counters.tally_micros, tallying);
        Ok(StagedFlush {
            links: index.stage_live(&index.links, self.links, &revocations)?,
            forward: index.stage_live(&index.forward, self.forward, &revocations)?,
            tally_links,
            revocations,
            common: self.common,
        })
    }
}

/// A flush whose backlink and forward-link tables are staged: the rest (tallies, the revocation
/// and hot tables, the commit, the installs) is `finish`. Holds the flush gate as `FlushJob`.
pub struct StagedFlush<'a> {
    common: FlushCommon<'a>,
    links: Flushed<Backlink>,
    forward: Flushed<ForwardLink>,
    tally_links: FlushedLinks,
    /// The revocations frozen with the flush.
    revocations: KnownRevocations,
}

impl StagedFlush<'_> {
    /// Returns how many tables the flush wrote.
    pub fn finish(self) -> Result<usize, IndexError> {
        let FlushCommon { index, _ticket, mut unfinished, started, thresholds: frozen, position, accounts } =
            self.common;
        let tallying = std::time::Instant::now();
        let ops = FlushedOps {
            revocations: &self.revocations,
            revoked: frozen.as_ref().map(|(memtable, _)| memtable.as_ref()),
            accounts: &accounts,
            clock: position.clock,
            installed_clock: index.tables_clock.load(Ordering::Acquire),
        };
        let hot = index.hot_writes(&ops, self.tally_links)?;
        add_elapsed(&index.counters.tally_micros, tallying);
        let mut thresholds = None;
        if let Some((memtable, id)) = &frozen {
            thresholds = Some(index.write_table(&index.thresholds, id, || memtable.iter().copied())?);
        }
        let hot_links = index.write_new_table(&index.hot, hot.has_links(), || hot.all_links())?;
        let tallies = index.write_new_table(&index.tallies, !hot.tallies.is_empty(), || hot.tallies.iter().copied())?;
        let account_tallies =
            index.write_new_table(&index.account_tallies, hot.has_account_tallies(), || hot.all_account_tallies())?;
        hot.check()?;
        let tables = (self.links.record().into_iter().chain(self.forward.record()))
            .chain(&thresholds)
            .chain(&hot_links)
            .chain(&tallies)
            .chain(&account_tallies)
            .cloned()
            .collect();
        let flush = FlushRecord { tables, position, accounts };
        index.catalog.commit_flush(&flush)?;
        self.links.install(&index.links);
        self.forward.install(&index.forward);
        if let Some(record) = thresholds {
            index.thresholds.install(index.thresholds.open_table(record)?, frozen.as_ref().map(|(m, _)| m));
        }
        if let Some(record) = hot_links {
            index.hot.install(index.hot.open_table(record)?, None);
        }
        // Account tallies first: a count that finds a target's tallies reads its account
        // tallies next, and must find those of the same flush.
        if let Some(record) = account_tallies {
            index.account_tallies.install(index.account_tallies.open_table(record)?, None);
        }
        if let Some(record) = tallies {
            index.tallies.install(index.tallies.open_table(record)?, None);
        }
        index.promoted(&hot.promoted.targets);
        index.tables_clock.fetch_max(flush.position.clock, Ordering::Release);
        index.counters.flushes.fetch_add(1, Ordering::Relaxed);
        let written: u64 = flush.tables.iter().map(|t| t.data_len + t.meta_len).sum();
        index.counters.flush_bytes.fetch_add(written, Ordering::Relaxed);
        add_elapsed(&index.counters.flush_micros, started);
        unfinished.disarm();
        Ok(flush.tables.len())
    }
}

/// What a flush made of one tree's frozen memtable.
enum Flushed<E: Entry> {
    /// The tree had nothing to flush.
    Nothing,
    /// Every entry died within the flush: no table (an empty run would only be merged).
    AllDead,
    /// Its table, staged in the memtable's place until the flush commits.
    Staged(Arc<Run<E>>),
}

impl<E: Entry> Flushed<E> {
    fn record(&self) -> Option<&TableRecord> {
        match self {
            Flushed::Staged(run) => Some(&run.tables[0].record),
            Flushed::Nothing | Flushed::AllDead => None,
        }
    }

    /// After the commit: the staged table joins the tree's committed runs.
    fn install(&self, tree: &Tree<E>) {
        if let Flushed::Staged(run) = self {
            tree.install_staged(run);
        }
    }
}

/// Lets one flush run at a time: `enter` waits until no ticket is out.
#[derive(Debug, Default)]
pub(super) struct FlushGate {
    busy: Mutex<bool>,
    idle: std::sync::Condvar,
}

impl FlushGate {
    fn enter(&self) -> FlushTicket<'_> {
        let mut busy = self.busy.lock().expect("flush gate poisoned");
        while *busy {
            busy = self.idle.wait(busy).expect("flush gate poisoned");
        }
        *busy = true;
        FlushTicket(self)
    }
}

struct FlushTicket<'a>(&'a FlushGate);

impl Drop for FlushTicket<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = false;
        self.0.idle.notify_one();
    }
}

impl Index {
    /// True when what the next flush writes has reached its byte budget: the memtables of all
    /// trees and the new outline strings, which stay in memory until a flush persists them (one
    /// budget for all of it: memory is bounded by the configuration however the writes split
    /// among them, and an import's first minutes, when nearly every DID is new, flush sooner).
    pub fn wants_flush(&self) -> bool {
        let memtables = self.links.memtable_bytes() + self.thresholds.memtable_bytes() + self.forward.memtable_bytes();
        memtables + self.outlines.unclaimed_pending_bytes() >= self.options.memtable_bytes
    }

    /// Writes the memtables out as tables, durably (see the module invariants); returns how many
    /// tables it wrote.
    pub fn flush(&self) -> Result<usize, IndexError> {
        self.begin_flush()?.finish()
    }

    /// The part of a flush that needs the writer: every memtable frozen at one position (they stay
    /// visible to readers), and that position and the account changes up to it taken. The job
    /// does the rest without the writer, so writes go on into fresh memtables meanwhile. Waits
    /// while an earlier job runs: one flush at a time keeps the catalog's positions in order and
    /// at most one frozen memtable per tree in memory.
    pub fn begin_flush(&self) -> Result<FlushJob<'_>, IndexError> {
        assert!(!self.options.read_only, "flush of a read-only index");
        let ticket = self.flushing.enter();
        // A job that failed (or was dropped) took operations that are in no table. A later flush
        // would commit a position past them (and tell merges they are in tables).
        if self.flush_failed.load(Ordering::Acquire) {
            return Err(IndexError::FlushFailed);
        }
        let started = std::time::Instant::now();
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        // Ids before the freezes: a failure after a freeze would leave a frozen memtable that no
        // flush writes. Memtables only change under the writer, so these ids find them as frozen.
        let links_id = self.id_if_any(&self.links, &mut writer)?;
        let thresholds_id = self.id_if_any(&self.thresholds, &mut writer)?;
        let forward_id = self.id_if_any(&self.forward, &mut writer)?;
        let links = links_id.map(|id| (self.links.freeze().expect("a non-empty memtable freezes"), id));
        let thresholds = thresholds_id.map(|id| (self.thresholds.freeze().expect("a non-empty memtable freezes"), id));
        let forward = forward_id.map(|id| (self.forward.freeze().expect("a non-empty memtable freezes"), id));
        self.outlines.claim_pending();
        let common = FlushCommon {
            index: self,
            _ticket: ticket,
            unfinished: SetOnDrop::new(&self.flush_failed),
            started,
            thresholds,
            position: writer.position.clone(),
            accounts: std::mem::take(&mut writer.pending_accounts),
        };
        Ok(FlushJob { common, links, forward })
    }

    /// A table id for the tree's memtable when it holds anything.
    fn id_if_any<E: Entry>(&self, tree: &Tree<E>, writer: &mut WriterState) -> Result<Option<String>, IndexError> {
        if tree.memtable_bytes() == 0 {
            return Ok(None);
        }
        self.new_table_id(writer).map(Some)
    }

    /// Writes the freshest copy of each entry of a frozen memtable that no revocation frozen with
    /// it (`flushed`) kills, if any, and stages that table in the memtable's place (or drops the
    /// memtable when nothing in it survived: the revocations that killed it stay frozen, so no
    /// answer changes). The memtable goes with the last handle, the tree's or `frozen`.
    fn stage_live<E: Revocable>(
        &self,
        tree: &Tree<E>,
        frozen: Option<(Arc<Memtable<E>>, String)>,
        flushed: &KnownRevocations,
    ) -> Result<Flushed<E>, IndexError> {
        let Some((memtable, id)) = frozen else { return Ok(Flushed::Nothing) };
        let live = || compaction::freshest(memtable.iter().copied()).filter_map(|entry| entry.settle_by(flushed));
        if live().next().is_none() {
            tree.retire_frozen(&memtable);
            return Ok(Flushed::AllDead);
        }
        let record = self.write_table(tree, &id, live)?;
        Ok(Flushed::Staged(tree.stage(tree.open_table(record)?, &memtable)))
    }

    /// Writes sorted, unique entries that no memtable held (the flush's hot links and tallies,
    /// given twice by `entries`) as a new table of `tree`, if there are any (`any`: said by the
    /// caller, as asking `entries` would start reading what a promotion spilled).
    fn write_new_table<E: Entry, I: Iterator<Item = E>>(
        &self,
        tree: &Tree<E>,
        any: bool,
        entries: impl Fn() -> I,
    ) -> Result<Option<TableRecord>, IndexError> {
        if !any {
            return Ok(None);
        }
        let id = self.new_table_id(&mut self.writer.lock().expect("writer lock poisoned"))?;
        self.write_table(tree, &id, entries).map(Some)
    }

    /// Writes a flush's sorted, unique entries (given twice by `entries`) as table `id` of `tree`.
    fn write_table<E: Entry, I: Iterator<Item = E>>(
        &self,
        tree: &Tree<E>,
        id: &str,
        entries: impl Fn() -> I,
    ) -> Result<TableRecord, IndexError> {
        let summary = tree.write_sorted(id, entries).map_err(io_err(tree.dir()))?;
        Ok(TableRecord::written(E::TREE, id.to_string(), (id.to_string(), RunKind::Delta), (0, 1), &summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{IndexOptions, open_in_dir};
    use crate::model::ids::RecordId;
    use crate::model::operation::{Operation, RecordOp, RecordRef};

    /// New DIDs wait in memory for the flush that persists them: they count in its budget, so
    /// an import whose every account is new flushes before they pile up.
    #[test]
    fn new_outline_strings_count_in_the_flush_budget() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions { memtable_bytes: 1 << 20, ..IndexOptions::default() });
        let account =
            |n: usize| Operation::Account { did: format!("did:web:a{n}.example").into(), active: false, status: None };
        let mut applied = 0;
        while !index.wants_flush() && applied < 100_000 {
            index.apply(&account(applied), None).unwrap();
            applied += 1;
        }
        let memtables =
            index.links.memtable_bytes() + index.thresholds.memtable_bytes() + index.forward.memtable_bytes();
        assert_eq!(memtables, 0, "account states go to no memtable");
        assert!((5_000..20_000).contains(&applied), "{applied} new DIDs filled a 1 MiB budget");
        let job = index.begin_flush().unwrap();
        assert!(!index.wants_flush(), "the strings a running flush will persist are not counted again");
        index.apply(&account(applied), None).unwrap();
        let claimed_then_one = index.outlines.pending_bytes();
        job.finish().unwrap();
        assert!(index.outlines.pending_bytes() < claimed_then_one);
        assert_eq!(index.outlines.pending_bytes(), 0, "the flush persisted them all, the last one too");
        assert!(!index.wants_flush());
    }

    const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";

    fn like(author: usize) -> RecordRef<'static> {
        let did = format!("did:plc:{author:024}");
        RecordRef { did: did.into(), collection: "app.bsky.feed.like".into(), rkey: "3kbbbbbbbbbbb".into() }
    }

    fn create_like(index: &Index, author: usize) {
        let record = serde_json::json!({"subject": {"uri": POST, "cid": "bafyreib2rxk3rybloqtqwbo"}});
        index.apply(&Operation::Create(RecordOp { record_ref: like(author), record }), None).unwrap();
    }

    /// The sources of every live backlink to `POST`.
    async fn likers(index: &Index) -> Vec<String> {
        let params = crate::query::ListParams { limit: 100, ..crate::query::ListParams::new(POST) };
        let page = crate::query::list_backlinks(index, &params).await.unwrap();
        assert!(page.cursor.is_none(), "one page holds them all");
        let mut sources: Vec<String> = page.items.into_iter().map(|(_, source)| source).collect();
        sources.sort();
        sources
    }

    /// Between staging and commit, the backlinks are answered from the staged table with no
    /// frozen memtable left, no merge can take that table, and what is written meanwhile counts.
    #[tokio::test]
    async fn a_staged_flush_answers_from_its_table_and_holds_no_frozen_memtable() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        (0..40).for_each(|author| create_like(&index, author));
        index.flush().unwrap();
        (40..80).for_each(|author| create_like(&index, author));
        for author in (0..80).step_by(9) {
            index.apply(&Operation::Delete(like(author)), None).unwrap();
        }
        let before = likers(&index).await;
        assert_eq!(before.len(), 80 - 9);
        let staged = index.begin_flush().unwrap().stage().unwrap();
        assert_eq!(index.links.memtables_memory_bytes() + index.forward.memtables_memory_bytes(), 0);
        let everything = (Backlink::min_for_key(RecordId::MIN), Backlink::max_for_key(RecordId::MAX));
        let snapshot = index.links.snapshot([everything]);
        assert_eq!((snapshot.memtable_entries.len(), snapshot.runs.len()), (0, 2), "the staged table is read");
        assert_eq!(index.links.runs().len(), 1, "merges see only the committed table");
        assert_eq!(likers(&index).await, before);
        index.apply(&Operation::Delete(like(41)), None).unwrap();
        create_like(&index, 80);
        staged.finish().unwrap();
        assert_eq!(index.links.runs().len(), 2, "the staged table is installed");
        assert_eq!(index.links.snapshot([everything]).runs.len(), 2);
        let uri = |author: usize| format!("at://did:plc:{author:024}/app.bsky.feed.like/3kbbbbbbbbbbb");
        let mut expected: Vec<String> = before.into_iter().filter(|source| *source != uri(41)).collect();
        expected.push(uri(80));
        assert_eq!(likers(&index).await, expected);
    }

    #[test]
    fn a_flush_whose_backlinks_all_died_writes_no_links_table() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        let record_ref = RecordRef {
            did: "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb".into(),
            collection: "a.b.c".into(),
            rkey: "self".into(),
        };
        let record = serde_json::json!({"subject": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"});
        let create = Operation::Create(RecordOp { record_ref: record_ref.clone(), record });
        index.apply(&create, Some(1)).unwrap();
        index.apply(&Operation::Delete(record_ref), Some(2)).unwrap();
        assert_eq!(index.flush().unwrap(), 1, "only the revocation's table");
        let tables = |index: &Index| (index.links.tables().len(), index.thresholds.tables().len());
        assert_eq!(tables(&index), (0, 1));
        let everything = (Backlink::min_for_key(RecordId::MIN), Backlink::max_for_key(RecordId::MAX));
        assert_eq!(index.links.snapshot([everything]).memtable_entries, vec![], "no frozen memtable left");
        let files = std::fs::read_dir(index.links.dir()).unwrap().count();
        assert_eq!(files, 0, "the empty table's files are gone");
        drop(index);
        let reopened = open_in_dir(dir.path(), IndexOptions::default());
        assert_eq!(tables(&reopened), (0, 1));
        assert_eq!(reopened.position().clock, 2);
    }
}
