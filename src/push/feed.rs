//! The feed: what each ingested event changed, as change-log entries. Live ingest hands it every
//! event as it hands it to the index, and ends each batch once the index holds the batch; the hub
//! and the subscribers read the log.
//!
//! - A create or update becomes the links that went away and the links that appeared (the record's
//!   links before come from `recent`; an update of a record older than the log's window only
//!   adds: its old links are not known here).
//! - A delete becomes the removal of the record's links, if the record was created or updated
//!   within the window; a delete of an older record makes no event (counted as unrouted).
//! - An account shown again becomes `show`; hidden, `hide` with its status; deleted, the removal
//!   of its recent records' links (found by walking its entries back through `account_before`,
//!   at most `MAX_ACCOUNT_WALK` of them) and then `hide` with status `deleted`, which tells a
//!   subscriber to drop the account's older links too.
//!
//! Invariants:
//! - Cursors are `max(previous + 1, time_us)`: strictly increasing, and close to the event's
//!   Jetstream time so that a time works as a cursor.
//! - An event the stream replays (live ingest resumes a little before its cursor after a restart
//!   or an instance switch) makes no second entry: events are remembered by identity (repository,
//!   record, operation and revision) for `remember_us` of stream time; after a restart, events up
//!   to the newest time the feed had synced (`observed_through`, in the recent-links table's
//!   header) are skipped (the feed saw them all, in order), and the identities of the log's tail
//!   are remembered again for a resume on another instance, whose times differ a little.
//! - The recent-links table follows from the log alone (`reflect`); on open, entries past its
//!   `log_through` are reflected again (all of them after a machine crash), so a crash between the
//!   two loses nothing. (What such a resume can still get wrong: a delete of a record it never
//!   knew, replayed after the record was created again within the rewind, unlinks the new links.)
//! - Readers see a batch's entries only after `end_batch`; entries are on disk after `sync`.

use super::entry::{Change, Entry, Link};
use super::filter::did_of_target;
use super::log::{ChangeLog, LogOptions, LogReader, LogShared, Position};
use super::recent::{Facts, Fresh, RecentLinks};
use super::{PushCounters, PushError};
use crate::extract::{ExtractLimits, extract_links};
use crate::model::operation::{Operation, RecordRef};
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use xxhash_rust::xxh3::Xxh3;

#[derive(Debug, Clone)]
pub struct FeedOptions {
    pub log: LogOptions,
    pub extract: ExtractLimits,
    /// How long (stream time) an event is remembered to recognise a replay of it.
    pub remember_us: i64,
    /// The most events remembered at once.
    pub max_remembered: usize,
    /// The recent-links table's size on disk.
    pub recent_bytes: u64,
    /// This boot of the machine (`recent::current_boot`): tells a restart from a reboot.
    pub boot: u64,
}

/// Segments of the change log start past this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Live ingest resumes 10 s before its cursor; a minute of memory covers that with room.
pub const REMEMBER_US: i64 = 60_000_000;
/// At most this many events remembered (a minute at 8,000 events/s).
pub const MAX_REMEMBERED: usize = 500_000;
/// An account deletion reaches at most this many of the account's newest entries; its `hide`
/// covers the rest.
pub const MAX_ACCOUNT_WALK: usize = 100_000;

impl FeedOptions {
    /// A log keeping `retain_us` of history within `max_bytes`, a recent-links table of
    /// `recent_bytes`, and the default memory.
    pub fn new(retain_us: i64, max_bytes: u64, recent_bytes: u64, extract: ExtractLimits) -> Self {
        let log = LogOptions { segment_bytes: SEGMENT_BYTES, retain_us, max_bytes, pack: true };
        let boot = super::recent::current_boot();
        FeedOptions { log, extract, remember_us: REMEMBER_US, max_remembered: MAX_REMEMBERED, recent_bytes, boot }
    }
}

pub struct Feed {
    log: ChangeLog,
    recent: RecentLinks,
    remembered: Remembered,
    options: FeedOptions,
    counters: Arc<PushCounters>,
    /// The newest event time committed when the feed opened: every event up to it was seen.
    resumed_through: i64,
    /// The newest event time observed.
    observed_through: i64,
    /// The caller's last step failed (its next failure is not logged again).
    failing: bool,
}

/// What an older binary kept where the recent-links table is now: its change log has entries
/// without `account_before`, so both go.
const OBSOLETE_RECENT_FILES: [&str; 3] = ["recent.db", "recent.db-wal", "recent.db-shm"];

/// The identities of the newest events, oldest first.
#[derive(Default)]
struct Remembered {
    set: HashSet<u64>,
    order: VecDeque<(i64, u64)>,
}

impl Remembered {
    /// Remembers `identity`; false if it was already.
    fn insert(&mut self, identity: u64, time_us: i64, options: &FeedOptions) -> bool {
        if !self.set.insert(identity) {
            return false;
        }
        self.order.push_back((time_us, identity));
        let horizon = time_us.saturating_sub(options.remember_us);
        while let Some(&(time, old)) = self.order.front() {
            if time >= horizon && self.order.len() <= options.max_remembered {
                break;
            }
            self.order.pop_front();
            self.set.remove(&old);
        }
        true
    }
}

impl Feed {
    /// Opens the log and the recent-links table under `dir`.
    pub fn open(dir: &Path, options: FeedOptions, counters: Arc<PushCounters>) -> Result<Self, PushError> {
        forget_an_older_format(dir)?;
        let log = ChangeLog::open(&dir.join("log"), options.log.clone())?;
        let (mut recent, fresh) = RecentLinks::open(&dir.join("recent.table"), options.recent_bytes, options.boot)?;
        recent.forget_before(log.shared().oldest_segment());
        if fresh == Fresh::MachineCrash {
            tracing::warn!("the machine stopped with the recent-links table open: rebuilding it from the change log");
        }
        let remembered = Remembered::default();
        let observed_through = recent.facts().observed_through;
        let mut feed = Feed {
            log,
            recent,
            remembered,
            options,
            counters,
            resumed_through: observed_through,
            observed_through,
            failing: false,
        };
        feed.read_the_tail()?;
        Ok(feed)
    }

    pub fn log(&self) -> Arc<LogShared> {
        self.log.shared().clone()
    }

    /// Records what one event changed. `time_us` is its Jetstream time; `rev` its commit's.
    pub fn observe(&mut self, operation: &Operation<'_>, time_us: i64, rev: Option<u64>) -> Result<(), PushError> {
        if !operation.writes() {
            return Ok(());
        }
        let identity = identity_of(operation, time_us, rev);
        self.observed_through = self.observed_through.max(time_us);
        if time_us <= self.resumed_through || !self.remembered.insert(identity, time_us, &self.options) {
            self.counters.replays_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let stamp = Stamp { time_us, identity };
        match operation {
            Operation::Create(op) | Operation::Update(op) => {
                let extraction = extract_links(&op.record, &self.options.extract);
                let links: BTreeSet<Link> = extraction
                    .links
                    .iter()
                    .map(|link| Link { target: link.target.to_string(), location: link.location.clone() })
                    .collect();
                self.record_links(&op.record_ref, links, rev, stamp).map(drop)
            }
            Operation::Delete(record_ref) => {
                let routed = self.record_links(record_ref, BTreeSet::new(), rev, stamp)?;
                if !routed {
                    self.counters.unrouted_deletes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Operation::Account { did, active: true, .. } => {
                self.append(Change::Show { did: did.to_string() }, stamp).map(drop)
            }
            Operation::Account { did, active: false, status } => {
                let status = status.as_deref().unwrap_or("inactive");
                if status == "deleted" {
                    self.remove_recent_records_of(did, stamp)?;
                }
                self.append(Change::Hide { did: did.to_string(), status: status.to_string() }, stamp).map(drop)
            }
            Operation::Identity { .. } | Operation::Skip => Ok(()),
        }
    }

    /// Lets readers see the batch's entries, and the recent-links table reflect them.
    pub fn end_batch(&mut self) -> Result<(), PushError> {
        self.log.publish()?;
        self.apply_unpublished();
        Ok(())
    }

    /// Makes the log durable (with the index's flush) and says in the table's header how far it
    /// reflects the log.
    pub fn sync(&mut self) -> Result<(), PushError> {
        self.end_batch()?;
        self.log.sync()?;
        self.recent.forget_before(self.log.shared().oldest_segment());
        self.recent.set_facts(Facts { log_through: self.log.last_cursor(), observed_through: self.observed_through });
        Ok(())
    }

    /// Counts a failure of this feed's caller's step (for the metrics); true for the first one
    /// since a step last succeeded.
    pub fn count_error(&mut self) -> bool {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        !std::mem::replace(&mut self.failing, true)
    }

    /// A step succeeded: the next failure is logged again.
    pub fn clear_failure(&mut self) {
        self.failing = false;
    }

    /// A record now has `links` (none: deleted). False when its links before are unknown.
    fn record_links(
        &mut self,
        record_ref: &RecordRef<'_>,
        links: BTreeSet<Link>,
        rev: Option<u64>,
        stamp: Stamp,
    ) -> Result<bool, PushError> {
        let source = format!("at://{}/{}/{}", record_ref.did, record_ref.collection, record_ref.rkey);
        let before = self.current_links(&source)?;
        let known = before.is_some();
        let before = before.unwrap_or_default();
        let deleted: Vec<Link> = before.difference(&links).cloned().collect();
        let created: Vec<Link> = links.difference(&before).cloned().collect();
        let kept: Vec<Link> = links.intersection(&before).cloned().collect();
        if !deleted.is_empty() || !created.is_empty() {
            self.append(Change::Links { source, rev, account_before: None, deleted, created, kept }, stamp)?;
        }
        Ok(known)
    }

    /// The links the record has now, if it changed within the window.
    fn current_links(&mut self, source: &str) -> Result<Option<BTreeSet<Link>>, PushError> {
        let Some(position) = self.recent.position_of(source) else { return Ok(None) };
        Ok(self.record_at(position, |entry_source| entry_source == source).map(|record| record.links))
    }

    /// The record of the entry at `position`, if it is there and its source passes `belongs`.
    fn record_at(&mut self, position: Position, belongs: impl Fn(&str) -> bool) -> Option<Recorded> {
        let entry = match self.log.read_at(position) {
            Ok(entry) => entry?,
            Err(e) => {
                // A row ahead of a log cut short by a crash, or a bad frame: a miss, never an event.
                self.counters.bad_lookups.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "a recent-links row leads nowhere");
                return None;
            }
        };
        match entry.change {
            Change::Links { source, account_before, created, kept, .. } if belongs(&source) => Some(Recorded {
                source,
                account_before: account_before.map(|at| Position::unpacked(at as i64)),
                links: created.into_iter().chain(kept).collect(),
            }),
            _ => None,
        }
    }

    /// Removes the links of the account's records changed within the window, oldest first.
    fn remove_recent_records_of(&mut self, did: &str, stamp: Stamp) -> Result<(), PushError> {
        let mut removals = vec![];
        for record in self.recent_records_of(did) {
            let deleted: Vec<Link> = record.links.into_iter().collect();
            if !deleted.is_empty() {
                removals.push(Change::Links {
                    source: record.source,
                    rev: None,
                    account_before: None,
                    deleted,
                    created: vec![],
                    kept: vec![],
                });
            }
        }
        for change in removals.into_iter().rev() {
            self.append(change, stamp)?;
        }
        Ok(())
    }

    /// The account's records changed within the window as they are now, newest first: the first
    /// entry of a record met walking the account's entries back is its newest.
    fn recent_records_of(&mut self, did: &str) -> Vec<Recorded> {
        let prefix = format!("at://{did}/");
        let oldest_segment = self.log.shared().oldest_segment();
        let mut next = self.recent.account_position(did);
        let (mut seen, mut records) = (HashSet::new(), vec![]);
        for _ in 0..MAX_ACCOUNT_WALK {
            let Some(position) = next.filter(|at| at.segment >= oldest_segment) else { break };
            // A chain that does not lead back to the account's own entries ends (a collision,
            // or a slot ahead of a log a crash cut short).
            let Some(record) = self.record_at(position, |source| source.starts_with(&prefix)) else { break };
            next = record.account_before.filter(|before| *before < position);
            if seen.insert(record.source.clone()) {
                records.push(record);
            }
        }
        records
    }

    fn append(&mut self, mut change: Change, stamp: Stamp) -> Result<Position, PushError> {
        if let Change::Links { source, account_before, .. } = &mut change {
            let did = did_of_target(source).unwrap_or("");
            *account_before = self.recent.account_position(did).map(|at| at.packed() as u64);
        }
        let first_cursor = stamp.time_us.max(self.log.last_cursor() + 1);
        let entry = Entry { first_cursor, time_us: stamp.time_us, identity: stamp.identity, change };
        let position = self.log.append(&entry)?;
        self.reflect(&entry, position);
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        self.counters.events_logged.fetch_add(entry.event_count() as u64, Ordering::Relaxed);
        Ok(position)
    }

    /// What an entry at `position` means for the recent-links table: the record's links are now
    /// its `created` and `kept` (none: it has no slot), and it is its account's newest entry.
    /// Every change to the table goes through here, so reflecting the log past `log_through`
    /// rebuilds what a crash lost. The table stages it until the entry is written out
    /// (`end_batch`): a slot never leads to an entry a crash of the process can lose.
    fn reflect(&mut self, entry: &Entry, position: Position) {
        let Change::Links { source, created, kept, .. } = &entry.change else { return };
        if created.is_empty() && kept.is_empty() {
            self.recent.remove(source);
        } else {
            self.recent.set(source, position);
        }
        self.recent.set_account(did_of_target(source).unwrap_or(""), position);
    }

    /// Writes what the published entries mean into the recent-links table.
    fn apply_unpublished(&mut self) {
        let displaced = self.recent.write_staged();
        self.counters.recent_displaced.fetch_add(displaced, Ordering::Relaxed);
    }

    /// Reads the log's tail once: remembers the identities of the last `2 * remember_us` (for a
    /// resume on another instance), brings the recent-links table up to the log (entries past
    /// its `log_through`), and learns how far the stream was seen.
    fn read_the_tail(&mut self) -> Result<(), PushError> {
        let remember_since = self.log.last_cursor().saturating_sub(self.options.remember_us.saturating_mul(2));
        let through = self.recent.facts().log_through;
        let mut reader = LogReader::after(self.log.shared().clone(), remember_since.min(through));
        let mut caught_up = 0;
        while let Some((position, entry)) = reader.next_with_position()? {
            self.resumed_through = self.resumed_through.max(entry.time_us);
            if entry.last_cursor() > remember_since {
                self.remembered.insert(entry.identity, entry.time_us, &self.options);
            }
            if entry.first_cursor > through {
                self.reflect(&entry, position);
                caught_up += 1;
            }
        }
        if caught_up > 0 {
            tracing::info!(caught_up, "recent links rebuilt from the change log");
        }
        self.apply_unpublished();
        let facts = Facts { log_through: self.log.last_cursor(), observed_through: self.observed_through };
        self.recent.set_facts(facts);
        Ok(())
    }
}

/// A record as its newest entry left it.
struct Recorded {
    source: String,
    account_before: Option<Position>,
    links: BTreeSet<Link>,
}

/// Removes the push state of an older binary (a change log without account chains): losing it
/// loses only the replay of past events.
fn forget_an_older_format(dir: &Path) -> Result<(), PushError> {
    if !dir.join(OBSOLETE_RECENT_FILES[0]).exists() {
        return Ok(());
    }
    tracing::warn!(dir = %dir.display(), "the change log is of an older format: starting it afresh");
    let log = dir.join("log");
    if log.exists() {
        std::fs::remove_dir_all(&log).map_err(|e| PushError::io(&log, e))?;
    }
    for name in OBSOLETE_RECENT_FILES {
        let path = dir.join(name);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| PushError::io(&path, e))?;
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Stamp {
    time_us: i64,
    identity: u64,
}

/// Names an event the same way on every Jetstream instance where it can (a commit by its
/// repository, record, operation and revision); account events also by their time.
fn identity_of(operation: &Operation<'_>, time_us: i64, rev: Option<u64>) -> u64 {
    let mut hasher = Xxh3::new();
    let mut field = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    let record = |field: &mut dyn FnMut(&[u8]), tag: &[u8], r: &RecordRef<'_>| {
        field(tag);
        field(r.did.as_bytes());
        field(r.collection.as_bytes());
        field(r.rkey.as_bytes());
    };
    match operation {
        Operation::Create(op) => record(&mut field, b"create", &op.record_ref),
        Operation::Update(op) => record(&mut field, b"update", &op.record_ref),
        Operation::Delete(r) => record(&mut field, b"delete", r),
        Operation::Account { did, active, status } => {
            field(b"account");
            field(did.as_bytes());
            field(&[*active as u8]);
            field(status.as_deref().unwrap_or("").as_bytes());
            field(&time_us.to_le_bytes());
        }
        Operation::Identity { .. } | Operation::Skip => field(b"none"),
    }
    // A commit's revision names it on every instance; without one, its time does on one.
    match (operation, rev) {
        (Operation::Account { .. }, _) => {}
        (_, Some(rev)) => field(&rev.to_le_bytes()),
        (_, None) => field(&time_us.to_le_bytes()),
    }
    hasher.digest()
}
