//! Tallies: exact counts of hot targets, kept by every flush.
//!
//! A count that reads a target's entries is bounded (`exact_scan_limit`); a target with more
//! needs its counts kept. A target is *hot* once it has tallies (`Tally`: its live backlinks and
//! the accounts they come from, per source collection and location and for the whole target,
//! hidden accounts' left out). Distinct accounts need each account's own count (`AccountTally`:
//! its live links to the target per collection and location): a change of one link changes the
//! accounts exactly when an account's count goes to or from 0. A flush reads the count of each
//! (account, collection, location) it changes, and nothing else of the account: the filters of
//! the account tallies hold those identities, so a link from a group new to its account (a
//! repost after a like) reads nothing. A flush *promotes* a target with
//! at least `hot_target_entries` entries (one of which it holds at least 1/64 of, or one a count
//! asked for), and from then on rewrites the tallies its operations change. A deletion names
//! only its record, so the links to hot targets are also kept by account (`HotLink`, the hot
//! tree): a record's deletion finds its hot links there by key; an account's deletion, snapshot
//! or change of visibility, by the account's key range.
//!
//! Invariants:
//! - The hot tree holds the freshest copy of every identity (target, source, location) of a hot
//!   target that no revocation kills: its promotion writes those of the target's backlinks,
//!   every later flush those of its own (minus what its revocations kill, as the links tree),
//!   and merges drop and settle them by the backlinks' rule.
//! - Once the flush covering clock `c` has committed, the freshest tally of each hot target and
//!   (collection, location) is the number of its identities from there that are live at `c`:
//!   a copy at or above its source's and repository's thresholds among the revocations stamped
//!   up to `c`, from an account not hidden at `c`; and the number of accounts those come from.
//!   The freshest account tally of each (account, target, collection, location) is the number of
//!   those identities from that account (an account without one has none), and the whole
//!   target's tally (`Tally::ALL`) sums the others' records and accounts.
//! - A flush computes differences only, identity by identity, for what it can change: the
//!   identities of its backlinks to hot targets, and the hot links of the records it revokes
//!   and of the accounts it revokes or shows or hides. Each is live or not before (installed
//!   tables, revocations up to `tables_clock`, committed account states) and after (with the
//!   flush's memtables and account changes); neither the order of its operations nor a replay of
//!   them changes the result. Identities of different accounts never meet, so it reads the
//!   hot links of the accounts it reads whole a batch of accounts at a time (`batches`),
//!   holding one batch's; its lookups of single keys (its sources' hot links, the account
//!   tallies it changes) are made once for the whole flush, so that each table's filter pages
//!   are read once, not once a batch, in parts of the filter hash space (`lookup`: a part's
//!   plan at a time); the account tallies' in parts it also compares one at a time
//!   (`prefix_parts`), each holding what it reads only while it is computed. The account
//!   tallies it writes go through an external sort (`lsm::sorter`): those of the accounts it
//!   reads whole grow with how many hot targets each links to, not only with the flush.
//! - A promotion reads the target's backlinks as of the flush's clock (installed tables and the
//!   flush's staged table; the active memtable holds only later stamps), a part at a time, and
//!   writes its hot links and tallies from them (`promote`: sorted outside memory). The
//!   differences of that flush never touch the targets it promotes.

use super::promote::{Promoted, Promotions, check, consolidated, finish, merge_sorted};
use super::{Index, IndexError, add_elapsed, io_err};
use crate::liveness::{KnownRevocations, Revocable, revocation_keys};
use crate::lsm::compaction;
use crate::lsm::entry::Entry;
use crate::lsm::handle::ReadError;
use crate::lsm::lookup::{
    prefix_parts, read_key_ranges, read_keys, read_keys_newer_uncached, read_keys_uncached, read_prefixes_uncached,
};
use crate::lsm::memtable::Memtable;
use crate::lsm::range::{Direction, RangePart, read_entries_part, read_range_part};
use crate::lsm::sorter::{Sorted, Sorter};
use crate::lsm::table::PageUse;
use crate::model::account::AccountState;
use crate::model::ids::{AccountTally, Backlink, HotLink, RecordId, Revocation, Tally};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Default of `IndexOptions::hot_target_entries`: a quarter of the default exact scan limit, so
/// that a target is promoted well before a count would have to estimate it.
pub const DEFAULT_HOT_TARGET_ENTRIES: u64 = 1 << 14;
/// Target false-positive rate of the hot tree's filters (a tenth of the default): every flush
/// looks up the source of each of its links to a hot target there, nearly all of them new
/// records, and each false positive reads frames (at 1 % they were most of what a flush decoded
/// at 100 M links, by profile). It costs about half as many filter bytes again, on a small tree.
pub(super) const HOT_FILTER_FPR: f64 = 0.001;
/// Most accounts a flush reads the hot links of whole (deleted, snapshotted, hidden or shown) at
/// a time: what it holds at once is their hot links (and the revocation keys of those), bounded
/// by this and not by how many hot targets an account links to. A smaller batch reads the same
/// frames but some filter pages more often.
const ACCOUNTS_PER_BATCH: usize = 256;
/// Most promotions counts may have asked for that no flush has looked at yet.
const MAX_REQUESTED_PROMOTIONS: usize = 4096;
/// A flush checks a target for promotion when it holds `hot_target_entries >> BATCH_SHARE_SHIFT`
/// of its entries: a target grows past the bound in at most 64 such flushes, and the check (its
/// entries counted from metadata) is made for few targets.
const BATCH_SHARE_SHIFT: u32 = 6;

/// The hot targets, and the promotions counts asked for.
#[derive(Debug, Default)]
pub(super) struct HotTargets {
    /// The targets that have tallies: `None` until a flush needs them (read from the tallies).
    known: Mutex<Option<HashSet<RecordId>>>,
    requested: Mutex<HashSet<RecordId>>,
}

/// What the tallies need of a flush's backlinks, taken from its frozen memtable before the flush
/// swaps the memtable for its table (`Index::flushed_links`), so the memtable's memory goes
/// before the tallies are computed.
pub(super) struct FlushedLinks {
    /// The freshest copy of each identity linking to a hot target, sorted (dead ones included).
    pub to_hot: Vec<Backlink>,
    /// The targets of which the flush holds at least its share of entries (`BATCH_SHARE_SHIFT`),
    /// to be checked for promotion.
    pub crowded: Vec<RecordId>,
}

/// A flush's operations, as its tallies see them (its backlinks are `FlushedLinks`).
pub(super) struct FlushedOps<'a> {
    pub revocations: &'a KnownRevocations,
    /// The frozen revocation memtable, if any.
    pub revoked: Option<&'a Memtable<Revocation>>,
    pub accounts: &'a [(u64, AccountState)],
    /// The clock the flush covers, and the one the installed tables cover.
    pub clock: u64,
    pub installed_clock: u64,
}

/// What a flush adds to the hot tree and the tallies.
pub(super) struct HotWrites {
    /// Sorted, unique.
    pub links: Vec<HotLink>,
    /// Sorted, one per identity.
    pub tallies: Vec<Tally>,
    /// One per identity: the account tallies of a flush's whole accounts grow with how many hot
    /// targets those accounts link to, so they are sorted outside memory past a bound.
    pub account_tallies: Sorted<AccountTally>,
    /// The promoted targets' hot links and account tallies (their tallies are in `tallies`).
    pub promoted: Promoted,
}

impl HotWrites {
    pub fn has_links(&self) -> bool {
        !(self.links.is_empty() && self.promoted.links.is_empty())
    }

    pub fn has_account_tallies(&self) -> bool {
        !(self.account_tallies.is_empty() && self.promoted.account_tallies.is_empty())
    }

    /// Reports a read error of the sorts' spills met while their tables were written.
    pub fn check(&self) -> Result<(), IndexError> {
        check(&self.account_tallies)?;
        self.promoted.check()
    }

    /// The hot links to write, the flush's own and its promotions', in order.
    pub fn all_links(&self) -> impl Iterator<Item = HotLink> + '_ {
        merge_sorted(self.links.iter().copied(), self.promoted.links.merged())
    }

    /// The account tallies to write, the flush's own and its promotions', in order.
    pub fn all_account_tallies(&self) -> impl Iterator<Item = AccountTally> + '_ {
        merge_sorted(self.account_tallies.merged(), consolidated(self.promoted.account_tallies.merged()))
    }
}

/// (target, source, location): what copies of one link share.
type Identity = (RecordId, RecordId, u64);
/// (target, source collection, location): what one tally counts.
type TallyKey = (RecordId, u64, u64);
/// (target, account, source collection, location): what one account tally counts.
type AccountKey = (RecordId, u64, u64, u64);

/// What a flush changes in one tally.
#[derive(Debug, Default, Clone, Copy)]
struct Change {
    records: i64,
    accounts: i64,
}

/// What a flush knows of one account's count (an account tally): how its links change, or for
/// an account whose hot links it read whole, the count before and after.
#[derive(Debug, Clone, Copy)]
enum Counted {
    Changed(i64),
    Whole { before: u64, after: u64 },
}

impl Counted {
    /// Both, of one account tally (one account's identities are either all read whole or not).
    fn plus(self, other: Counted) -> Counted {
        match (self, other) {
            (Counted::Changed(a), Counted::Changed(b)) => Counted::Changed(a + b),
            (Counted::Whole { before: b1, after: a1 }, Counted::Whole { before: b2, after: a2 }) => {
                Counted::Whole { before: b1 + b2, after: a1 + a2 }
            }
            _ => unreachable!("an account is read whole for all of its identities or none"),
        }
    }
}

/// The freshest stamps of one identity: among the installed hot links, and in the flush.
#[derive(Debug, Clone, Copy)]
struct Copies {
    installed: Option<u64>,
    flushed: Option<u64>,
}

/// The revocation stamps of some sources, to take their thresholds as of a clock: those that may
/// kill a copy at or above the stamp each source was read for (`revocations_of`).
struct Revocations(HashMap<RecordId, Vec<u64>>);

impl Revocations {
    fn of(revocations: Vec<Revocation>) -> Self {
        let mut by_source: HashMap<RecordId, Vec<u64>> = HashMap::new();
        for revocation in revocations {
            by_source.entry(revocation.source).or_default().push(revocation.rev);
        }
        Revocations(by_source)
    }

    /// The newest revocation of `source` stamped at or below `clock` (0 if none).
    fn threshold(&self, source: &RecordId, clock: u64) -> u64 {
        self.0.get(source).map_or(0, |revs| revs.iter().copied().filter(|&rev| rev <= clock).max().unwrap_or(0))
    }

    /// Whether a copy stamped `stamp` of a link from `source` is unrevoked at `clock`.
    fn survives(&self, source: RecordId, stamp: u64, clock: u64) -> bool {
        let link = Backlink { source, source_rev: stamp, ..Backlink::default() };
        link.survives(|key| self.threshold(key, clock))
    }
}

/// Account visibility before a flush (committed) and after it (with its account changes).
struct Visibility {
    committed: HashMap<u64, AccountState>,
    flushed: HashMap<u64, AccountState>,
}

impl Visibility {
    fn hidden_before(&self, did: u64) -> bool {
        self.committed.get(&did).is_some_and(|state| state.is_hidden())
    }

    fn hidden_after(&self, did: u64) -> bool {
        self.flushed.get(&did).map_or_else(|| self.hidden_before(did), |state| state.is_hidden())
    }
}

impl Index {
    /// Asks the next flush to promote `target`: a count found it past the exact scan limit
    /// without tallies. Ignored past `MAX_REQUESTED_PROMOTIONS` waiting, and by a read-only index.
    pub fn request_promotion(&self, target: RecordId) {
        if self.options.read_only {
            return;
        }
        let mut requested = self.hot_targets.requested.lock().expect("promotions lock poisoned");
        if requested.len() < MAX_REQUESTED_PROMOTIONS {
            requested.insert(target);
        }
    }

    /// The tallies of `target`, freshest of each (collection, location); `None` when it is not hot.
    pub async fn tallies_of(&self, target: RecordId) -> Result<Option<Vec<Tally>>, ReadError> {
        let found = read_keys(&self.tallies, self.store.as_ref(), &[target]).await?;
        Ok((!found.is_empty()).then(|| freshest(found)))
    }

    /// The freshest account tallies of `accounts` with `target`'s key (those of another target
    /// of an account that shares it come too: the caller tells them apart).
    pub async fn account_tallies_of(&self, target: RecordId, accounts: &[u64]) -> Result<Vec<AccountTally>, ReadError> {
        let keys: Vec<RecordId> = accounts.iter().map(|account| AccountTally::key_of(*account, target)).collect();
        Ok(freshest(read_keys(&self.account_tallies, self.store.as_ref(), &keys).await?))
    }

    /// The freshest account tallies of `target` whose account is in `accounts`, read from the end
    /// `direction` names, about `want` entries a run: a part of them, up to `frontier`
    /// (`lsm::range`). Those of another target that shares its key come too (the caller tells
    /// them apart).
    pub async fn account_tallies_in(
        &self,
        target: RecordId,
        accounts: RangeInclusive<u64>,
        direction: Direction,
        want: usize,
    ) -> Result<RangePart<AccountTally>, ReadError> {
        let lo = AccountTally::min_for_key(AccountTally::key_of(*accounts.start(), target));
        let hi = AccountTally::max_for_key(AccountTally::key_of(*accounts.end(), target));
        let mut part = read_range_part(&self.account_tallies, self.store.as_ref(), (lo, hi), direction, want).await?;
        compaction::keep_freshest(&mut part.entries);
        Ok(part)
    }

    /// What the tallies need of a flush's frozen backlinks (`memtable`).
    pub(super) fn flushed_links(&self, memtable: Option<&Memtable<Backlink>>) -> Result<FlushedLinks, IndexError> {
        let known = self.known_hot_targets()?;
        let hot = known.as_ref().expect("loaded");
        let links = || memtable.into_iter().flat_map(|memtable| memtable.iter().copied());
        let to_hot = compaction::freshest(links().filter(|link| hot.contains(&link.target))).collect();
        let share = (self.options.hot_target_entries.max(1) >> BATCH_SHARE_SHIFT).max(1) as usize;
        Ok(FlushedLinks { to_hot, crowded: crowded_targets(links(), share) })
    }

    /// The hot links and tallies a flush of `ops` and `links` writes (module invariants).
    pub(super) fn hot_writes(&self, ops: &FlushedOps<'_>, links: FlushedLinks) -> Result<HotWrites, IndexError> {
        let known = self.known_hot_targets()?;
        self.reads.block_on(self.hot_writes_of(ops, links, known.as_ref().expect("loaded")))
    }

    /// The hot targets, read from the tallies the first time.
    fn known_hot_targets(&self) -> Result<MutexGuard<'_, Option<HashSet<RecordId>>>, IndexError> {
        let mut known = self.hot_targets.known.lock().expect("hot targets lock poisoned");
        if known.is_none() {
            *known = Some(self.reads.block_on(self.read_hot_targets())?);
        }
        Ok(known)
    }

    /// After the flush's commit: its promoted targets are hot.
    pub(super) fn promoted(&self, targets: &[RecordId]) {
        let mut known = self.hot_targets.known.lock().expect("hot targets lock poisoned");
        if let Some(known) = known.as_mut() {
            known.extend(targets.iter().copied());
        }
    }

    /// Every target with a tally (the tallies tree is small: a few entries per hot target).
    async fn read_hot_targets(&self) -> Result<HashSet<RecordId>, IndexError> {
        let mut targets = HashSet::new();
        for table in self.tallies.tables() {
            let entries = table.read_frames_with(self.store.as_ref(), 0..table.frame_count(), PageUse::Scan).await?;
            targets.extend(entries.iter().map(|tally| tally.target));
        }
        Ok(targets)
    }

    async fn hot_writes_of(
        &self,
        ops: &FlushedOps<'_>,
        links: FlushedLinks,
        hot: &HashSet<RecordId>,
    ) -> Result<HotWrites, IndexError> {
        let times = &self.counters.tally_reads;
        let promoted = timed(&times.promotions_micros, self.promotions(&links.crowded, hot)).await?;
        let flushed = links.to_hot;
        let mut visibility = self.visibility(ops, ops.accounts.iter().map(|(did, _)| *did))?;
        let (keys, accounts) = hot_reads(ops, &flushed, &visibility);
        let mut differences: BTreeMap<TallyKey, Change> = BTreeMap::new();
        let mut account_tallies = Sorter::beside(&self.account_tallies, "flush", self.promotion_entries());
        let mut write = |tally: Option<AccountTally>| match tally {
            Some(tally) => account_tallies.push(tally).map_err(io_err(account_tallies.spill_path())),
            None => Ok(()),
        };
        // Lookups of single keys are made once for the flush, not once a batch (each batch's keys
        // hash all over each table's filter, so batches would read the same filter pages again).
        // Only the whole accounts' hot links, which a batch bounds, are read a batch at a time.
        let mut of_sources = timed(&times.hot_link_keys_micros, self.installed_hot_links_of(&keys)).await?;
        of_sources.sort_unstable_by_key(|link| link.source.did);
        let mut sources_left = &of_sources[..];
        let mut changed = Vec::new();
        for batch in batches(&accounts) {
            let of_batch = |link: &&Backlink| batch.dids.contains(&link.source.did);
            let flushed: Vec<Backlink> = flushed.iter().filter(of_batch).copied().collect();
            let (of_batch_sources, rest) =
                sources_left.split_at(sources_left.partition_point(|link| link.source.did <= *batch.dids.end()));
            sources_left = rest;
            let of_accounts =
                timed(&times.hot_link_accounts_micros, self.installed_hot_links_whole(batch.accounts)).await?;
            let installed = freshest(of_batch_sources.iter().copied().chain(of_accounts).collect());
            let (links, whole) = ((&flushed[..], &installed[..]), batch.accounts);
            for (key, counted) in self.differences_by_account(ops, links, whole, &mut visibility).await? {
                match counted {
                    Counted::Whole { before, after } => {
                        write(account_tally_change(key, (before, after), ops.clock, &mut differences))?
                    }
                    Counted::Changed(difference) => changed.push((key, difference)),
                }
            }
        }
        self.account_tallies_after(changed, ops.clock, &mut differences, &mut write).await?;
        let account_tallies = finish(account_tallies)?;
        let promoting = Instant::now();
        let mut promotions = Promotions::new(&self.hot, &self.account_tallies, self.promotion_entries(), ops.clock);
        for target in promoted {
            self.promote(target, ops, &mut promotions).await?;
        }
        let (promoted, promoted_tallies) = promotions.finish()?;
        add_elapsed(&times.promotions_micros, promoting);
        let mut tallies = self.tallies_after(differences, ops.clock).await?;
        tallies.extend(promoted_tallies);
        let mut writes = HotWrites {
            links: flushed.into_iter().filter_map(|link| link.settle_by(ops.revocations)).map(HotLink::of).collect(),
            tallies,
            account_tallies,
            promoted,
        };
        writes.links.sort_unstable();
        writes.links.dedup();
        writes.tallies.sort_unstable();
        Ok(writes)
    }

    /// What the flush changes of the identities of `flushed` (its links to hot targets) and
    /// `installed` (the hot links it read), both of the same accounts, summed by account tally,
    /// sorted: +1 or -1 an identity whose liveness it changes; for an account of `whole` (whose
    /// hot links it read whole), every identity's liveness before and after, so that its account
    /// tallies need not be read.
    async fn differences_by_account(
        &self,
        ops: &FlushedOps<'_>,
        (flushed, installed): (&[Backlink], &[Backlink]),
        whole: &[u64],
        visibility: &mut Visibility,
    ) -> Result<Vec<(AccountKey, Counted)>, IndexError> {
        // Only an installed copy needs the installed revocations: they are all older than the
        // flush's stamps, so the flush's own revocations alone decide a copy it writes.
        let revocations =
            timed(&self.counters.tally_reads.revocations_micros, self.revocations_of(installed.iter().copied()))
                .await?;
        let dids = flushed.iter().chain(installed).map(|link| link.source.did);
        visibility.committed.extend(self.catalog.account_states(self.maybe_not_active(dids))?);
        let mut differences = Vec::new();
        for ((target, source, location), copies) in identities(flushed, installed) {
            let survives = |stamp: u64, clock: u64| match copies.flushed {
                Some(flushed) if stamp == flushed => {
                    ops.revocations.settle(Backlink { target, source, location, source_rev: stamp }).is_some()
                }
                _ => revocations.survives(source, stamp, clock),
            };
            let live = |stamp: Option<u64>, clock: u64, hidden: bool| {
                stamp.is_some_and(|stamp| !hidden && survives(stamp, clock))
            };
            let before = live(copies.installed, ops.installed_clock, visibility.hidden_before(source.did));
            let freshest = copies.installed.max(copies.flushed);
            let after = live(freshest, ops.clock, visibility.hidden_after(source.did));
            let key = (target, source.did, source.collection, location);
            if whole.binary_search(&source.did).is_ok() {
                differences.push((key, Counted::Whole { before: u64::from(before), after: u64::from(after) }));
            } else if before != after {
                differences.push((key, Counted::Changed(i64::from(after) - i64::from(before))));
            }
        }
        differences.sort_unstable_by_key(|(key, _)| *key);
        differences.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.plus(later.1);
            }
            same
        });
        Ok(differences)
    }

    /// The account tallies `changed` (one per key: how its count changes) makes of the current
    /// ones, read one (collection, location) at a time and a part of them at a time
    /// (`prefix_parts`: what a part holds is bounded), and what they change in the groups'
    /// tallies (added to `differences`).
    async fn account_tallies_after(
        &self,
        changed: Vec<(AccountKey, i64)>,
        clock: u64,
        differences: &mut BTreeMap<TallyKey, Change>,
        write: &mut impl FnMut(Option<AccountTally>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let probe_of = |&((target, account, collection, location), _): &(AccountKey, i64)| {
            AccountTally::of(account, target, (collection, location), 0, 0)
        };
        for part in prefix_parts(changed, probe_of) {
            let probes: Vec<AccountTally> = part.iter().map(probe_of).collect();
            let reading = read_prefixes_uncached(&self.account_tallies, self.store.as_ref(), &probes);
            let current: HashMap<AccountKey, u64> =
                freshest(timed(&self.counters.tally_reads.account_tallies_micros, reading).await?)
                    .into_iter()
                    .map(|tally| ((tally.target(), tally.account, tally.collection, tally.location), tally.records))
                    .collect();
            for (key, difference) in part {
                let before = current.get(&key).copied().unwrap_or(0);
                let after = before as i64 + difference;
                let after = u64::try_from(after).map_err(|_| missing_links(key.0, after))?;
                write(account_tally_change(key, (before, after), clock, differences))?;
            }
        }
        Ok(())
    }

    /// The committed account states of `dids`, and the flush's last change of each account.
    fn visibility(&self, ops: &FlushedOps<'_>, dids: impl Iterator<Item = u64>) -> Result<Visibility, IndexError> {
        let committed = self.catalog.account_states(dids)?;
        let flushed = ops.accounts.iter().copied().collect();
        Ok(Visibility { committed, flushed })
    }

    /// Those of `dids` whose committed state may not be active: not active now, or changed since
    /// the flush froze (the flush's own changes are in `ops.accounts`). Every other one was
    /// active when the last flush committed and is now: the catalog need not be asked.
    fn maybe_not_active(&self, dids: impl Iterator<Item = u64>) -> Vec<u64> {
        let writer = self.writer.lock().expect("writer lock poisoned");
        let changed: HashSet<u64> = writer.pending_accounts.iter().map(|(did, _)| *did).collect();
        let states = self.account_states();
        let mut dids: Vec<u64> =
            dids.filter(|did| states.get(*did) != AccountState::Active || changed.contains(did)).collect();
        dids.sort_unstable();
        dids.dedup();
        dids
    }

    /// The installed hot links of `keys` (sources): as backlinks, every copy found, in no order.
    async fn installed_hot_links_of(&self, keys: &[RecordId]) -> Result<Vec<Backlink>, IndexError> {
        let found = read_keys_uncached(&self.hot, self.store.as_ref(), keys).await?;
        Ok(found.into_iter().map(HotLink::backlink).collect())
    }

    /// The installed hot links of `accounts` (whole): as backlinks, every copy found.
    async fn installed_hot_links_whole(&self, accounts: &[u64]) -> Result<Vec<Backlink>, IndexError> {
        let ranges: Vec<(RecordId, RecordId)> = accounts.iter().map(|did| HotLink::account_keys(*did)).collect();
        let found = read_key_ranges(&self.hot, self.store.as_ref(), &ranges).await?;
        Ok(found.into_iter().map(HotLink::backlink).collect())
    }

    /// The revocations of the sources of `links` and of their repositories that may kill one of
    /// them, from memtables and tables. Tables whose revocations are all at or below the oldest
    /// stamp of a key's links are not read for it: those kill none of them (merges settle
    /// stamps, so a merged link's key skips nearly every table, as in queries).
    async fn revocations_of(&self, links: impl Iterator<Item = Backlink>) -> Result<Revocations, IndexError> {
        let keys = revocation_keys(links);
        Ok(Revocations::of(read_keys_newer_uncached(&self.thresholds, self.store.as_ref(), &keys).await?))
    }

    /// The tallies `differences` (of groups) make of the current ones, and the whole tally of
    /// each of their targets, summed from all of its groups: it never drifts from them, whatever
    /// a binary before these sums kept there (each account once over its groups).
    async fn tallies_after(
        &self,
        differences: BTreeMap<TallyKey, Change>,
        clock: u64,
    ) -> Result<Vec<Tally>, IndexError> {
        let mut targets: Vec<RecordId> = differences.keys().map(|(target, _, _)| *target).collect();
        targets.dedup();
        let mut groups: BTreeMap<TallyKey, Tally> =
            freshest(read_keys_uncached(&self.tallies, self.store.as_ref(), &targets).await?)
                .into_iter()
                .filter(|tally| !tally.is_whole())
                .map(|tally| ((tally.target, tally.collection, tally.location), tally))
                .collect();
        let mut tallies = Vec::new();
        for (key, change) in differences {
            let (target, collection, location) = key;
            let old = groups.get(&key).copied().unwrap_or_default();
            let records = old.records as i64 + change.records;
            let accounts = old.accounts as i64 + change.accounts;
            if records < 0 || accounts < 0 || accounts > records {
                return Err(missing_links(target, records.min(accounts)));
            }
            let (records, accounts) = (records as u64, accounts as u64);
            let tally = Tally { target, collection, location, stamp: clock, records, accounts };
            groups.insert(key, tally);
            tallies.push(tally);
        }
        for target in targets {
            let of_target = groups.range((target, 0, 0)..=(target, u64::MAX, u64::MAX)).map(|(_, tally)| tally);
            tallies.push(Tally::whole_of(target, of_target, clock));
        }
        Ok(tallies)
    }

    /// The targets this flush promotes: those a count asked for or of which it holds a good
    /// share (`crowded`), that are not hot yet and have at least `hot_target_entries` entries.
    async fn promotions(&self, crowded: &[RecordId], hot: &HashSet<RecordId>) -> Result<Vec<RecordId>, IndexError> {
        let bound = self.options.hot_target_entries.max(1);
        let mut candidates: BTreeSet<RecordId> =
            std::mem::take(&mut *self.hot_targets.requested.lock().expect("promotions lock poisoned"))
                .into_iter()
                .collect();
        candidates.extend(crowded.iter().copied());
        let mut promoted = Vec::new();
        for target in candidates.into_iter().filter(|target| !hot.contains(target)) {
            let snapshot = self.links.snapshot([(Backlink::min_for_key(target), Backlink::max_for_key(target))]);
            if snapshot.entries_bound(&target)? >= bound {
                promoted.push(target);
            }
        }
        Ok(promoted)
    }

    /// Most entries a promotion holds at once of each kind.
    fn promotion_entries(&self) -> usize {
        self.options.promotion_entries.max(1)
    }

    /// Adds the hot links and account tallies of `target` as of the flush's clock to
    /// `promotions`, reading its backlinks a part at a time (in key order: the copies of one
    /// identity are next to each other, those a part ends among wait for the next); promoted
    /// unless it has no live backlink (then its count is exact and cheap).
    async fn promote(
        &self,
        target: RecordId,
        ops: &FlushedOps<'_>,
        promotions: &mut Promotions,
    ) -> Result<(), IndexError> {
        let (mut lo, hi) = (Backlink::min_for_key(target), Backlink::max_for_key(target));
        let (store, want) = (self.store.as_ref(), self.promotion_entries());
        let mut waiting: Vec<Backlink> = Vec::new();
        let mut any_live = false;
        loop {
            let part = read_entries_part(&self.links, store, (lo, hi), want, PageUse::Scan).await?;
            let mut copies = std::mem::take(&mut waiting);
            copies.extend(part.entries.into_iter().filter(|link| link.source_rev <= ops.clock));
            if part.frontier.is_some()
                && let Some(last) = copies.last().copied()
            {
                waiting = copies.split_off(copies.partition_point(|link| !link.same_identity(&last)));
            }
            compaction::keep_freshest(&mut copies);
            any_live |= self.promote_part(copies, ops, promotions).await?;
            match part.frontier {
                Some(frontier) => lo = frontier,
                None => break,
            }
        }
        if any_live {
            promotions.promoted(target);
        }
        Ok(())
    }

    /// Adds the live ones of `copies` (sorted, one copy an identity, every copy of each read);
    /// whether there were any.
    async fn promote_part(
        &self,
        mut copies: Vec<Backlink>,
        ops: &FlushedOps<'_>,
        promotions: &mut Promotions,
    ) -> Result<bool, IndexError> {
        let revocations = self.revocations_of(copies.iter().copied()).await?;
        copies.retain(|link| revocations.survives(link.source, link.source_rev, ops.clock));
        let visibility =
            self.visibility(ops, self.maybe_not_active(copies.iter().map(|link| link.source.did)).into_iter())?;
        for link in &copies {
            promotions.add(*link, !visibility.hidden_after(link.source.did))?;
        }
        Ok(!copies.is_empty())
    }
}

/// The targets of at least `share` of `links` (sorted by target).
fn crowded_targets(links: impl Iterator<Item = Backlink>, share: usize) -> Vec<RecordId> {
    let mut crowded = Vec::new();
    let mut links = links.peekable();
    while let Some(first) = links.next() {
        let mut entries = 1;
        while links.next_if(|link| link.target == first.target).is_some() {
            entries += 1;
        }
        if entries >= share {
            crowded.push(first.target);
        }
    }
    crowded
}

/// What a flush reads of the hot tree: the keys of the flushed links' sources and of the records
/// it revokes (sorted, unique, so by account: `HotLink::key_of` puts the DID first), and the
/// accounts it revokes whole or shows or hides (sorted, unique), whose hot links it reads whole.
fn hot_reads(ops: &FlushedOps<'_>, flushed: &[Backlink], visibility: &Visibility) -> (Vec<RecordId>, Vec<u64>) {
    let (repos, records): (Vec<&Revocation>, Vec<&Revocation>) =
        ops.revoked.iter().flat_map(|memtable| memtable.iter()).partition(|revocation| revocation.source.is_repo());
    let mut keys: Vec<RecordId> = flushed.iter().map(|link| HotLink::key_of(link.source)).collect();
    keys.extend(records.iter().map(|revocation| HotLink::key_of(revocation.source)));
    keys.sort_unstable();
    keys.dedup();
    let mut accounts: BTreeSet<u64> = repos.iter().map(|revocation| revocation.source.did).collect();
    let changed = |did: &u64| visibility.hidden_before(*did) != visibility.hidden_after(*did);
    accounts.extend(visibility.flushed.keys().copied().filter(changed));
    (keys, accounts.into_iter().collect())
}

/// One part of a flush's hot-tree reads: the DIDs it covers and their whole accounts.
#[derive(Debug, PartialEq)]
struct Batch<'a> {
    dids: RangeInclusive<u64>,
    accounts: &'a [u64],
}

/// The DIDs cut into ranges, each with at most `ACCOUNTS_PER_BATCH` of `accounts` (sorted, unique,
/// as `hot_reads` gives them), covering every DID once, in order.
fn batches(accounts: &[u64]) -> Vec<Batch<'_>> {
    let mut batches = Vec::new();
    let mut from = 0;
    let mut parts = accounts.chunks(ACCOUNTS_PER_BATCH).peekable();
    while let Some(part) = parts.next() {
        let last = if parts.peek().is_some() { *part.last().expect("chunks are not empty") } else { u64::MAX };
        batches.push(Batch { dids: from..=last, accounts: part });
        from = last.saturating_add(1);
    }
    if batches.is_empty() {
        batches.push(Batch { dids: 0..=u64::MAX, accounts: &[] });
    }
    batches
}

fn identity_of(link: &Backlink) -> Identity {
    (link.target, link.source, link.location)
}

/// Every identity of `flushed` and `installed` (each sorted, one copy an identity) with the
/// stamps of its copies in each, in order.
fn identities<'a>(flushed: &'a [Backlink], installed: &'a [Backlink]) -> impl Iterator<Item = (Identity, Copies)> + 'a {
    let mut flushed = flushed.iter().peekable();
    let mut installed = installed.iter().peekable();
    std::iter::from_fn(move || {
        let next = match (flushed.peek(), installed.peek()) {
            (None, None) => return None,
            (Some(f), Some(i)) => identity_of(f).min(identity_of(i)),
            (Some(f), None) => identity_of(f),
            (None, Some(i)) => identity_of(i),
        };
        let stamp_of = |link: &Backlink| link.source_rev;
        let flushed = flushed.next_if(|link| identity_of(link) == next).map(stamp_of);
        let installed = installed.next_if(|link| identity_of(link) == next).map(stamp_of);
        Some((next, Copies { installed, flushed }))
    })
}

/// The account tally of `key` whose count goes from `before` to `after`, if it changes, and what
/// it changes in its group's tally (added to `differences`): the group's accounts change when an
/// account's count goes to or from 0.
fn account_tally_change(
    key: AccountKey,
    (before, after): (u64, u64),
    clock: u64,
    differences: &mut BTreeMap<TallyKey, Change>,
) -> Option<AccountTally> {
    if before == after {
        return None;
    }
    let (target, account, collection, location) = key;
    let change = differences.entry((target, collection, location)).or_default();
    change.records += after as i64 - before as i64;
    change.accounts += i64::from(after > 0) - i64::from(before > 0);
    Some(AccountTally::of(account, target, (collection, location), clock, after))
}

/// Runs `work`, adding the time it took to `counter`.
async fn timed<T>(counter: &AtomicU64, work: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let done = work.await;
    add_elapsed(counter, started);
    done
}

/// The freshest copy of each identity among `found` (any order).
fn freshest<E: Entry>(mut found: Vec<E>) -> Vec<E> {
    found.sort_unstable();
    compaction::keep_freshest(&mut found);
    found
}

/// A tally a flush would take below 0 (or past its records): the hot tree or the account tallies
/// miss what the tallies counted.
fn missing_links(target: RecordId, value: i64) -> IndexError {
    IndexError::Background(format!("a tally of target {target:?} would fall to {value}: the hot tree is missing links"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(target: u64, rkey: u64, source_rev: u64) -> Backlink {
        let target = RecordId { did: target, collection: 1, rkey: 1 };
        Backlink { target, source: RecordId { did: 7, collection: 2, rkey }, location: 3, source_rev }
    }

    /// A whole tally that is not its groups' sum (as a binary that counted each account once over
    /// its groups wrote it) is replaced by the sum at the target's next change.
    #[test]
    fn a_flush_writes_the_whole_tally_as_its_groups_sum() {
        use crate::model::operation::{Operation, RecordOp, RecordRef};
        const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";
        let dir = tempfile::tempdir().unwrap();
        let options = crate::index::IndexOptions { hot_target_entries: 8, ..Default::default() };
        let index = crate::index::open_in_dir(dir.path(), options);
        let subject = serde_json::json!({"subject": {"uri": POST, "cid": "bafyreib2rxk3rybloqtqwbo"}});
        let like_and_repost = |account: u64| {
            for collection in ["app.bsky.feed.like", "app.bsky.feed.repost"] {
                let rkey = crate::model::tid::format_tid(1_700_000_000_000_000 + account);
                let record_ref = RecordRef {
                    did: format!("did:plc:{account:024}").into(),
                    collection: collection.into(),
                    rkey: rkey.into(),
                };
                index.apply(&Operation::Create(RecordOp { record_ref, record: subject.clone() }), None).unwrap();
            }
        };
        (0..20).for_each(like_and_repost);
        index.flush().unwrap();
        let target = index.lookup_target(&crate::model::syntax::parse_target(POST).unwrap()).unwrap().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let whole = |index: &Index| {
            let tallies = runtime.block_on(index.tallies_of(target)).unwrap().expect("the post is hot");
            let (wholes, groups): (Vec<Tally>, Vec<Tally>) = tallies.into_iter().partition(Tally::is_whole);
            let sum = groups.iter().fold((0, 0), |(r, a), t| (r + t.records, a + t.accounts));
            ((wholes[0].records, wholes[0].accounts), sum)
        };
        assert_eq!(whole(&index), ((40, 40), (40, 40)));
        // Each account once over its two groups, as before the sums.
        let stamp = runtime.block_on(index.tallies_of(target)).unwrap().unwrap()[0].stamp + 1;
        let older = Tally { target, collection: Tally::ALL, location: Tally::ALL, stamp, records: 40, accounts: 20 };
        index.tallies.insert([older]);
        assert_eq!(whole(&index).0, (40, 20));
        (20..25).for_each(like_and_repost);
        index.flush().unwrap();
        assert_eq!(whole(&index), ((50, 50), (50, 50)));
    }

    #[test]
    fn batches_cover_every_did_once_with_a_bounded_number_of_accounts() {
        let accounts: Vec<u64> = (1..=2 * ACCOUNTS_PER_BATCH as u64 + 5).map(|i| i * 10).collect();
        let cut = batches(&accounts);
        assert_eq!(cut.len(), 3);
        assert_eq!(*cut[0].dids.start(), 0);
        assert_eq!(*cut[2].dids.end(), u64::MAX);
        for pair in cut.windows(2) {
            assert_eq!(*pair[0].dids.end() + 1, *pair[1].dids.start(), "contiguous");
        }
        for batch in &cut {
            assert!(batch.accounts.len() <= ACCOUNTS_PER_BATCH);
            assert!(batch.accounts.iter().all(|did| batch.dids.contains(did)));
        }
        assert_eq!(cut.iter().flat_map(|batch| batch.accounts.iter().copied()).collect::<Vec<_>>(), accounts);
        assert_eq!(batches(&[]), vec![Batch { dids: 0..=u64::MAX, accounts: &[] }]);
    }

    #[test]
    fn identities_pair_the_copies_of_each_identity_in_order() {
        let flushed = [link(1, 1, 50), link(1, 3, 51), link(2, 1, 52)];
        let installed = [link(1, 1, 10), link(1, 2, 11), link(2, 1, 12), link(3, 1, 13)];
        let paired: Vec<(Identity, Option<u64>, Option<u64>)> = identities(&flushed, &installed)
            .map(|(identity, copies)| (identity, copies.flushed, copies.installed))
            .collect();
        let expected = vec![
            (identity_of(&link(1, 1, 0)), Some(50), Some(10)),
            (identity_of(&link(1, 2, 0)), None, Some(11)),
            (identity_of(&link(1, 3, 0)), Some(51), None),
            (identity_of(&link(2, 1, 0)), Some(52), Some(12)),
            (identity_of(&link(3, 1, 0)), None, Some(13)),
        ];
        assert_eq!(paired, expected);
    }
}
