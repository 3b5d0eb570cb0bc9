//! Where live ingest and backfill meet: every write of both goes through one [`SnapshotGate`], so
//! that whatever order a repository's snapshot and its live commits arrive in, the index ends up
//! as the repository is.
//!
//! A snapshot is written as a repo-level revocation plus all its links at one stamp. The danger is
//! ordering: a snapshot written after a newer live commit would revoke that commit's links (lost
//! create) or bring back a record the commit deleted (resurrection). Both sides carry the repo
//! revision (a TID), and the gate compares them:
//! - While a repository is being fetched (`begin` .. `finish`/`abandon`), its live commits are
//!   held back in a bounded buffer; after the snapshot is written, those newer than it are
//!   applied on top, in order, at later stamps.
//! - A snapshot older than a live commit already applied (the unflushed revisions in memory, the
//!   flushed ones in repos.db) is stale: it is not written, and the repository is fetched again.
//! - A live commit not newer than a snapshot written shortly before (a replay after a reconnect or
//!   restart) is skipped: the snapshot already holds its effect or a later one.
//! - A deleted account's snapshot is never written.
//!
//! Invariants:
//! - The gate lock is held across the check and the write, on both sides: no live commit can slip
//!   between a snapshot's check and its write.
//! - Every bound holds: commits buffered per repository and in all, recent snapshots remembered,
//!   unpersisted live revisions. A buffer that would overflow is applied at once, in order, and
//!   its snapshot is then treated as stale (refetched), never written over newer commits.

use crate::index::{Index, IndexError};
use crate::ingest::backfill::repos::{ReposDb, ReposError};
use crate::ingest::frames::StreamEvent;
use crate::ingest::repo::{RepoCommit, RepoRecord};
use crate::model::account::AccountState;
use crate::model::operation::{Operation, RecordRef};
use crate::model::tid::parse_tid;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bounds on what the gate holds in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateLimits {
    /// Live commits held back for one repository being fetched.
    pub buffered_per_repo: usize,
    /// Live commits held back in all.
    pub buffered_total: usize,
    /// Snapshots remembered for skipping replayed older commits (oldest forgotten first).
    pub recent_snapshots: usize,
    /// Live revisions kept in memory before they are written to repos.db.
    pub unpersisted_revs: usize,
}

impl Default for GateLimits {
    fn default() -> Self {
        GateLimits {
            buffered_per_repo: 10_000,
            buffered_total: 200_000,
            recent_snapshots: 100_000,
            unpersisted_revs: 1 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Repos(#[from] ReposError),
}

/// What became of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// Revision `rev` written at `stamp` with `links` backlinks; `replayed` held-back commits
    /// applied on top.
    Written { rev: u64, stamp: u64, links: u64, replayed: usize },
    /// Older than live commits already applied (or its buffer overflowed): fetch it again.
    Stale { newest_live: Option<u64> },
    /// Not newer than the snapshot already indexed.
    AlreadyIndexed,
    /// The account was deleted: nothing is written.
    AccountDeleted,
}

/// What became of a live event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveOutcome {
    Applied,
    /// Held back until the repository's snapshot is written.
    Held,
    /// Not newer than a snapshot written recently.
    Skipped,
}

#[derive(Default)]
struct HeldBack {
    events: Vec<StreamEvent>,
    overflowed: bool,
}

#[derive(Default)]
struct GateState {
    in_flight: HashMap<String, HeldBack>,
    held_total: usize,
    recent: HashMap<String, u64>,
    recent_order: VecDeque<String>,
    unpersisted: HashMap<String, u64>,
}

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct GateCounters {
    pub held: AtomicU64,
    pub replayed: AtomicU64,
    pub skipped_live: AtomicU64,
    pub stale_snapshots: AtomicU64,
    pub overflows: AtomicU64,
}

pub struct SnapshotGate {
    index: Arc<Index>,
    repos: Arc<ReposDb>,
    limits: GateLimits,
    state: Mutex<GateState>,
    pub counters: GateCounters,
}

impl std::fmt::Debug for SnapshotGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotGate").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// The repository an operation writes to (`None` for skipped events).
fn operation_did<'o>(operation: &'o Operation<'_>) -> Option<&'o str> {
    match operation {
        Operation::Create(op) | Operation::Update(op) => Some(&op.record_ref.did),
        Operation::Delete(record_ref) => Some(&record_ref.did),
        Operation::Account { did, .. } => Some(did),
        Operation::Identity { .. } | Operation::Skip => None,
    }
}

impl SnapshotGate {
    pub fn new(index: Arc<Index>, repos: Arc<ReposDb>, limits: GateLimits) -> Self {
        assert!(limits.buffered_per_repo <= limits.buffered_total, "a repo's share exceeds the whole");
        SnapshotGate {
            index,
            repos,
            limits,
            state: Mutex::new(GateState::default()),
            counters: GateCounters::default(),
        }
    }

    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("gate lock poisoned")
    }

    /// Applies (or holds back, or skips) one live event.
    pub fn apply_live(&self, event: StreamEvent) -> Result<LiveOutcome, GateError> {
        let mut state = self.lock();
        let Some(did) = operation_did(&event.operation).map(str::to_owned) else {
            return Ok(LiveOutcome::Applied);
        };
        if state.in_flight.contains_key(&did) {
            return self.hold_back(&mut state, &did, event);
        }
        if let (Some(rev), Some(&snapshot)) = (event.rev, state.recent.get(&did))
            && rev <= snapshot
        {
            self.counters.skipped_live.fetch_add(1, Ordering::Relaxed);
            return Ok(LiveOutcome::Skipped);
        }
        self.apply_now(&mut state, &did, &event)?;
        Ok(LiveOutcome::Applied)
    }

    fn hold_back(&self, state: &mut GateState, did: &str, event: StreamEvent) -> Result<LiveOutcome, GateError> {
        let full = state.held_total >= self.limits.buffered_total;
        let held = state.in_flight.get_mut(did).expect("checked by the caller");
        if !held.overflowed && !full && held.events.len() < self.limits.buffered_per_repo {
            held.events.push(event);
            state.held_total += 1;
            self.counters.held.fetch_add(1, Ordering::Relaxed);
            return Ok(LiveOutcome::Held);
        }
        // Out of room: apply what was held and this one, in order; the snapshot will be stale.
        if !held.overflowed {
            self.counters.overflows.fetch_add(1, Ordering::Relaxed);
        }
        held.overflowed = true;
        let events = std::mem::take(&mut held.events);
        state.held_total -= events.len();
        for held_event in events.iter().chain([&event]) {
            self.apply_now(state, did, held_event)?;
        }
        Ok(LiveOutcome::Applied)
    }

    fn apply_now(&self, state: &mut GateState, did: &str, event: &StreamEvent) -> Result<(), GateError> {
        self.index.apply(&event.operation, Some(event.time_us))?;
        if let Some(rev) = event.rev {
            let newest = state.unpersisted.entry(did.to_owned()).or_insert(rev);
            *newest = (*newest).max(rev);
            if state.unpersisted.len() >= self.limits.unpersisted_revs {
                self.persist_locked(state)?;
            }
        }
        Ok(())
    }

    /// Writes the live revisions applied so far to repos.db. Call it before every flush of the
    /// index, so that repos.db never knows less than the index holds.
    pub fn persist_live_revs(&self) -> Result<(), GateError> {
        let mut state = self.lock();
        self.persist_locked(&mut state)
    }

    fn persist_locked(&self, state: &mut GateState) -> Result<(), GateError> {
        if state.unpersisted.is_empty() {
            return Ok(());
        }
        self.repos.record_live_revs(state.unpersisted.iter().map(|(did, rev)| (did.as_str(), *rev)))?;
        state.unpersisted.clear();
        Ok(())
    }

    /// Flushes the index, live revisions first (see `persist_live_revs`).
    pub fn flush(&self) -> Result<usize, GateError> {
        self.persist_live_revs()?;
        Ok(self.index.flush()?)
    }

    /// A fetch of `did` starts: hold back its live commits. False when one is already running.
    pub fn begin(&self, did: &str) -> bool {
        let mut state = self.lock();
        if state.in_flight.contains_key(did) {
            return false;
        }
        state.in_flight.insert(did.to_owned(), HeldBack::default());
        true
    }

    /// The fetch of `did` failed: apply what was held back, in order.
    pub fn abandon(&self, did: &str) -> Result<usize, GateError> {
        let mut state = self.lock();
        self.release(&mut state, did, None)
    }

    /// Releases `did`'s held-back commits, applying those newer than `snapshot_rev` (all of them
    /// when there is no snapshot).
    fn release(&self, state: &mut GateState, did: &str, snapshot_rev: Option<u64>) -> Result<usize, GateError> {
        let Some(held) = state.in_flight.remove(did) else { return Ok(0) };
        state.held_total -= held.events.len();
        let mut replayed = 0;
        for event in &held.events {
            let older = matches!((event.rev, snapshot_rev), (Some(rev), Some(snapshot)) if rev <= snapshot);
            if !older {
                self.apply_now(state, did, event)?;
                replayed += 1;
            }
        }
        self.counters.replayed.fetch_add(replayed as u64, Ordering::Relaxed);
        Ok(replayed)
    }

    /// Writes `did`'s snapshot unless it is stale, already indexed, or the account is deleted;
    /// then releases the commits held back during the fetch.
    pub fn finish(&self, commit: &RepoCommit, records: &[RepoRecord]) -> Result<SnapshotOutcome, GateError> {
        let did = commit.did.as_str();
        let snapshot_rev = parse_tid(&commit.rev).unwrap_or(0);
        let mut state = self.lock();
        let overflowed = state.in_flight.get(did).is_some_and(|held| held.overflowed);
        let outcome = self.judge(&state, did, snapshot_rev, overflowed)?;
        if let Some(outcome) = outcome {
            self.release(&mut state, did, None)?;
            if let SnapshotOutcome::Stale { .. } = outcome {
                self.counters.stale_snapshots.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(outcome);
        }
        let records = records.iter().map(|r| {
            let record_ref = RecordRef {
                did: Cow::Borrowed(did),
                collection: Cow::Borrowed(r.collection.as_str()),
                rkey: Cow::Borrowed(r.rkey.as_str()),
            };
            (record_ref, r.record.as_ref())
        });
        let (stamp, links) = self.index.apply_snapshot(did, records)?;
        let replayed = self.release(&mut state, did, Some(snapshot_rev))?;
        self.remember_snapshot(&mut state, did, snapshot_rev);
        Ok(SnapshotOutcome::Written { rev: snapshot_rev, stamp, links, replayed })
    }

    /// Why the snapshot must not be written, if it must not.
    fn judge(
        &self,
        state: &GateState,
        did: &str,
        snapshot_rev: u64,
        overflowed: bool,
    ) -> Result<Option<SnapshotOutcome>, GateError> {
        if self.index.account_state(did)? == Some(AccountState::Deleted) {
            return Ok(Some(SnapshotOutcome::AccountDeleted));
        }
        let newest_live = state.unpersisted.get(did).copied().max(self.repos.live_rev(did)?);
        if overflowed || newest_live.is_some_and(|live| live > snapshot_rev) {
            return Ok(Some(SnapshotOutcome::Stale { newest_live }));
        }
        let indexed = self.repos.get(did)?.filter(|row| row.stamp.is_some()).and_then(|row| row.rev);
        if indexed.is_some_and(|rev| rev >= snapshot_rev) {
            return Ok(Some(SnapshotOutcome::AlreadyIndexed));
        }
        Ok(None)
    }

    fn remember_snapshot(&self, state: &mut GateState, did: &str, rev: u64) {
        if state.recent.insert(did.to_owned(), rev).is_none() {
            state.recent_order.push_back(did.to_owned());
        }
        while state.recent_order.len() > self.limits.recent_snapshots {
            if let Some(oldest) = state.recent_order.pop_front() {
                state.recent.remove(&oldest);
            }
        }
    }
}
