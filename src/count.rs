//! countBacklinks: how many live backlinks a target has, in total and by location, with the same
//! filters as listBacklinks - and bounded work however popular the target is.
//!
//! The work one request may cause is capped by `CountOptions::exact_scan_limit` entries (the
//! lesson of lossy timelines: a hot target must not be able to stall the server, so past a
//! reasonable size the answer trades exactness for a bounded cost).
//!
//! - Exact path: table metadata gives an upper bound on the target's entries (the entries of the
//!   frames that can hold it). When the bound fits the limit, every such frame is read, duplicates
//!   collapse to the freshest, and the revocation round, hidden accounts and filters apply exactly
//!   as in listBacklinks. The count then equals the length of listBacklinks' full enumeration.
//! - Tallied path: a hot target past the bound (one with tallies, `index::tally`) is counted from
//!   its tallies, exactly, by source collection and location, with distinct accounts; with a DID
//!   filter, from those accounts' tallies (one key read each). Distinct accounts over several
//!   (collection, location) groups are exact under a DID filter; otherwise they sum their groups'
//!   accounts, marked `distinct_approximate` when more than one group has any (an account linking
//!   from two of them counts twice: flushes keep an account's count per group, not per target).
//! - Estimate path: otherwise, per table, the target's boundary frames plus its newest frames (as
//!   many as the table's share of the limit) are read. The frames between the boundaries are known
//!   from metadata to hold only the target, so the raw number of entries is exact; the live share
//!   and the split by location come from the sample. The answer says `approximate: true`, and the
//!   index is asked to promote the target, so that its later counts are tallied.
//!
//! Invariants:
//! - At most `exact_scan_limit` entries (plus two boundary frames per table) are read per request.
//! - `total` is the sum of `by_location`; an unknown target or an impossible filter is an exact 0.
//! - Exact figures never carry `approximate` (records) or `distinct_approximate` (accounts),
//!   estimates always do.

use crate::index::{Index, IndexError};
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::table::PageUse;
use crate::model::ids::{AccountTally, Backlink, RecordId, Tally};
use crate::model::syntax::parse_target;
use crate::outline::OutlineKind;
use crate::query::{Filters, ListParams, QueryError, freshest_per_position, live_only};
use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

/// Default of `CountOptions::exact_scan_limit`: 64 Ki entries, 4 MiB of raw entries.
pub const DEFAULT_EXACT_SCAN_LIMIT: usize = 1 << 16;
/// Bounds on the configurable limit.
pub const MIN_EXACT_SCAN_LIMIT: usize = 1;
pub const MAX_EXACT_SCAN_LIMIT: usize = 1 << 22;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountOptions {
    /// Entries a count may read before it answers with an estimate.
    pub exact_scan_limit: usize,
}

impl Default for CountOptions {
    fn default() -> Self {
        Self { exact_scan_limit: DEFAULT_EXACT_SCAN_LIMIT }
    }
}

/// The answer of countBacklinks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Count {
    pub total: u64,
    /// Live backlinks per location string (`$.subject`).
    pub by_location: BTreeMap<String, u64>,
    /// Distinct repositories among the counted sources.
    pub distinct_dids: u64,
    /// Live backlinks and distinct linking repositories per (source collection, location).
    pub by_source: BTreeMap<(String, String), SourceCount>,
    /// True when the records figures are an estimate (a target with more entries than the scan
    /// limit and no tallies).
    pub approximate: bool,
    /// True when `distinct_dids` is an estimate (or was not asked for).
    pub distinct_approximate: bool,
    /// True when some of `by_source`'s distinct accounts are estimates (a name summing groups of
    /// a hot target, or a sample).
    pub by_source_approximate: bool,
}

/// The live backlinks of one (source collection, location) and how many repositories they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceCount {
    pub records: u64,
    pub distinct_dids: u64,
}

impl Count {
    /// The JSON body of countBacklinks.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "total": self.total, "byLocation": self.by_location, "approximate": self.approximate })
    }
}

/// The parameters countBacklinks reads; the paging ones of listBacklinks do not apply.
pub const COUNT_PARAMETERS: [&str; 3] = ["target", "collection", "location"];

/// Parses a countBacklinks query string (listBacklinks' rules; paging parameters are ignored).
pub fn parse_count_query(pairs: &[(String, String)]) -> Result<ListParams, QueryError> {
    let wanted = pairs.iter().filter(|(name, _)| COUNT_PARAMETERS.contains(&name.as_str()));
    ListParams::from_pairs(wanted.map(|(k, v)| (k.as_str(), v.as_str())))
}

/// countBacklinks: live backlinks to `params.target` that pass its filters (paging ignored).
pub async fn count_backlinks(index: &Index, params: &ListParams, options: CountOptions) -> Result<Count, QueryError> {
    let links = read_target(index, params, options).await?;
    count_of(index, &links, &|location| Some(location.to_string()))
}

/// `count_backlinks`, with `by_source` keyed by `(collection, name(location))`: locations one
/// name gives are summed (their accounts counted once), and those it gives `None` left out.
pub async fn count_backlinks_named(
    index: &Index,
    params: &ListParams,
    options: CountOptions,
    name: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Count, QueryError> {
    count_of(index, &read_target(index, params, options).await?, name)
}

/// What a count reads of one target: every live backlink that passes the filters, or for a
/// target with more than `exact_scan_limit` entries its tallies or a bounded sample.
pub enum TargetLinks {
    /// Every one, in position order.
    All(Vec<Backlink>),
    /// The live ones of a sample, and the entries (dead and duplicate copies included) the sample
    /// read and stands for.
    Sampled { live: Vec<Backlink>, raw_total: u64, raw_sampled: u64 },
    /// A hot target's tallies that pass the filters, and when it is known (a DID filter read
    /// the accounts' own tallies) the tally of all of them together, its `accounts` counting each
    /// account once; the target and the filters, for a reader of its account tallies.
    Tallied { target: RecordId, filters: Filters, tallies: Vec<Tally>, whole: Option<Tally> },
}

/// Reads the live backlinks to `params.target` that pass its filters: all of them, or when the
/// target is hotter than `exact_scan_limit` its tallies or a sample.
pub async fn read_target(index: &Index, params: &ListParams, options: CountOptions) -> Result<TargetLinks, QueryError> {
    let Some((scope, filters)) = target_scope(index, params).await? else { return Ok(TargetLinks::All(Vec::new())) };
    let limit = exact_limit(options);
    if scope.upper_bound() <= limit {
        return Ok(TargetLinks::All(scope.live_all(index, &filters).await?));
    }
    let Some(tallies) = index.tallies_of(scope.target).await? else {
        index.request_promotion(scope.target);
        return scope.sampled(index, limit as usize, &filters).await;
    };
    if let Some(dids) = filters.dids() {
        let found = index.account_tallies_of(scope.target, dids).await?;
        return Ok(tallied_by_account(scope.target, &found, filters));
    }
    let tallies =
        tallies.into_iter().filter(|t| !t.is_whole() && filters.admits_group(t.collection, t.location)).collect();
    Ok(TargetLinks::Tallied { target: scope.target, filters, tallies, whole: None })
}

/// The tallies of the groups `filters` admits, and of all of them together, from the account
/// tallies of the accounts it admits (`found`: freshest, any target with their keys).
fn tallied_by_account(target: RecordId, found: &[AccountTally], filters: Filters) -> TargetLinks {
    let admitted: Vec<&AccountTally> = found
        .iter()
        .filter(|t| t.target() == target && t.records > 0 && filters.admits_group(t.collection, t.location))
        .collect();
    let mut tallies = Tally::of_accounts(target, admitted.iter().copied(), 0);
    let mut whole = tallies.pop().filter(Tally::is_whole).expect("the whole tally comes last");
    whole.accounts = admitted.iter().map(|t| t.account).collect::<HashSet<u64>>().len() as u64;
    TargetLinks::Tallied { target, filters, tallies, whole: Some(whole) }
}

/// The count of what `read_target` read, `by_source` keyed as in `count_backlinks_named`.
pub fn count_of(
    index: &Index,
    links: &TargetLinks,
    name: &dyn Fn(&str) -> Option<String>,
) -> Result<Count, QueryError> {
    match links {
        TargetLinks::All(live) => tally(index, live, (1, 1), name),
        TargetLinks::Sampled { live, raw_total, raw_sampled } => {
            let mut count = tally(index, live, (*raw_total, *raw_sampled), name)?;
            count.approximate = true;
            count.distinct_approximate = true;
            count.by_source_approximate = true;
            Ok(count)
        }
        TargetLinks::Tallied { tallies, whole, .. } => count_tallies(index, tallies, whole.as_ref(), name),
    }
}

/// A hot target's count from its tallies: records exact; distinct accounts exact for one group
/// and for `whole`, otherwise the groups' accounts summed (capped by the records) and marked.
fn count_tallies(
    index: &Index,
    tallies: &[Tally],
    whole: Option<&Tally>,
    name: &dyn Fn(&str) -> Option<String>,
) -> Result<Count, QueryError> {
    let mut count = Count::default();
    let mut groups_by_source: BTreeMap<(String, String), usize> = BTreeMap::new();
    let counted: Vec<&Tally> = tallies.iter().filter(|tally| tally.records > 0).collect();
    for tally in &counted {
        let collection = resolve(index, OutlineKind::Collection, tally.collection)?;
        let location = resolve(index, OutlineKind::Location, tally.location)?;
        *count.by_location.entry(location.to_string()).or_default() += tally.records;
        if let Some(location_name) = name(&location) {
            let key = (collection.to_string(), location_name);
            let figures = count.by_source.entry(key.clone()).or_default();
            figures.records += tally.records;
            figures.distinct_dids += tally.accounts;
            *groups_by_source.entry(key).or_default() += 1;
        }
    }
    count.total = count.by_location.values().sum();
    let summed_accounts: u64 = counted.iter().map(|tally| tally.accounts).sum();
    count.distinct_dids = match whole {
        Some(whole) => whole.accounts,
        None => summed_accounts.min(count.total),
    };
    let summed_groups = groups_by_source.values().any(|&groups| groups > 1);
    count.distinct_approximate = summed_groups || (whole.is_none() && counted.len() > 1);
    count.by_source_approximate = summed_groups;
    Ok(count)
}

/// Entries of a target (dead and duplicate copies included) a count reads whole.
fn exact_limit(options: CountOptions) -> u64 {
    options.exact_scan_limit.max(MIN_EXACT_SCAN_LIMIT) as u64
}

/// Where the target's entries may be, and the query's filters; `None` when nothing can match (a
/// target never seen, or filters naming nothing the index holds).
async fn target_scope(index: &Index, params: &ListParams) -> Result<Option<(TargetScope, Filters)>, QueryError> {
    let target =
        parse_target(&params.target).map_err(|e| QueryError::InvalidRequest(format!("invalid target: {e}")))?;
    let Some(target) = index.lookup_target(&target)? else { return Ok(None) };
    let filters = Filters::resolve(index, params)?;
    if filters.matches_nothing() {
        return Ok(None);
    }
    Ok(Some((TargetScope::of(index, target).await?, filters)))
}

/// The frames of one table that can hold the target, and their entry counts (read once from
/// the frame index).
struct TableSpan {
    table: Arc<TableHandle<Backlink>>,
    frames: Range<usize>,
    frame_entries: Vec<u32>,
}

impl TableSpan {
    fn of(table: Arc<TableHandle<Backlink>>, target: RecordId) -> Result<Self, ReadError> {
        let (frames, infos) = table.frame_infos_for_key(target, PageUse::Lookup)?;
        let frame_entries = infos.iter().map(|f| f.entries).collect();
        Ok(TableSpan { table, frames, frame_entries })
    }

    /// Entries of `frames` (table frame numbers within the span).
    fn entries(&self, frames: Range<usize>) -> u64 {
        let base = self.frames.start;
        self.frame_entries[frames.start - base..frames.end - base].iter().map(|&n| u64::from(n)).sum()
    }

    /// The frames to read for a sample of about `budget` entries: the first frame (it may begin
    /// with other targets), and the newest frames (the last may end with other targets). Every
    /// frame left out lies strictly inside the span and so holds only the target's entries.
    /// Two ranges, the second empty when the first covers the whole span.
    fn sample_frames(&self, budget: u64) -> [Range<usize>; 2] {
        let Range { start, end } = self.frames.clone();
        let mut tail_start = end - 1;
        let mut taken = self.entries(tail_start..end);
        while tail_start > start + 1 && taken + self.entries(tail_start - 1..tail_start) <= budget {
            tail_start -= 1;
            taken += self.entries(tail_start..tail_start + 1);
        }
        if tail_start <= start + 1 { [start..end, end..end] } else { [start..start + 1, tail_start..end] }
    }
}

/// Everything that may hold the target's entries, taken from one snapshot.
struct TargetScope {
    target: RecordId,
    memtable_entries: Vec<Backlink>,
    spans: Vec<TableSpan>,
}

/// A bounded sample of the target's entries and what it stands for.
struct Sample {
    entries: Vec<Backlink>,
    /// Entries of the target in the sample, duplicates and dead ones included.
    raw_sampled: u64,
    /// Entries of the target everywhere: sampled ones plus the unread interior frames.
    raw_total: u64,
}

impl TargetScope {
    async fn of(index: &Index, target: RecordId) -> Result<Self, ReadError> {
        let (lo, hi) = (Backlink::min_for_key(target), Backlink::max_for_key(target));
        let snapshot = index.links.snapshot([(lo, hi)]);
        snapshot.fetch_metas_for_keys(index.store.as_ref(), &[(target, None)]).await?;
        let mut spans = Vec::new();
        for table in snapshot.tables_for_key(&target) {
            let span = TableSpan::of(table, target)?;
            if !span.frames.is_empty() {
                spans.push(span);
            }
        }
        Ok(TargetScope { target, memtable_entries: snapshot.memtable_entries, spans })
    }

    /// Entries that may belong to the target, from metadata alone (boundary frames counted whole).
    fn upper_bound(&self) -> u64 {
        self.memtable_entries.len() as u64 + self.spans.iter().map(|s| s.entries(s.frames.clone())).sum::<u64>()
    }

    /// Every entry of the target, then the live ones that `filters` admit, in position order.
    async fn live_all(&self, index: &Index, filters: &Filters) -> Result<Vec<Backlink>, QueryError> {
        let reads: Vec<_> = self.spans.iter().map(|s| (s.table.clone(), s.frames.clone())).collect();
        let mut entries = self.read(index, reads).await?;
        entries.extend(self.memtable_entries.iter().copied());
        live_only(index, freshest_per_position(entries), filters).await
    }

    /// The live links of a sample of about `limit` entries that `filters` admit, and what it
    /// stands for.
    async fn sampled(&self, index: &Index, limit: usize, filters: &Filters) -> Result<TargetLinks, QueryError> {
        let sample = self.read_sample(index, limit).await?;
        let live = live_only(index, freshest_per_position(sample.entries), filters).await?;
        Ok(TargetLinks::Sampled { live, raw_total: sample.raw_total, raw_sampled: sample.raw_sampled })
    }

    /// Reads each table's share of `limit` entries (at least its boundary frames).
    async fn read_sample(&self, index: &Index, limit: usize) -> Result<Sample, QueryError> {
        let upper = self.upper_bound().max(1);
        let mut reads = Vec::new();
        let mut unread = 0u64;
        for span in &self.spans {
            let span_entries = span.entries(span.frames.clone());
            let share = (limit as u128 * span_entries as u128 / upper as u128) as u64;
            let frames = span.sample_frames(share);
            unread += span_entries - frames.iter().map(|r| span.entries(r.clone())).sum::<u64>();
            reads.extend(frames.into_iter().filter(|r| !r.is_empty()).map(|r| (span.table.clone(), r)));
        }
        let mut entries = self.read(index, reads).await?;
        entries.extend(self.memtable_entries.iter().copied());
        let raw_sampled = entries.len() as u64;
        Ok(Sample { entries, raw_sampled, raw_total: raw_sampled + unread })
    }

    /// Reads frame ranges concurrently (one ranged read each) and keeps the target's entries.
    async fn read(
        &self,
        index: &Index,
        reads: Vec<(Arc<TableHandle<Backlink>>, Range<usize>)>,
    ) -> Result<Vec<Backlink>, QueryError> {
        let store = index.store.as_ref();
        let fetched =
            futures::future::try_join_all(reads.iter().map(|(table, frames)| table.read_frames(store, frames.clone())))
                .await?;
        Ok(fetched.into_iter().flatten().filter(|e| e.target == self.target).collect())
    }
}

/// Counts live links by location, and by (collection, named location) with distinct
/// repositories, scaled by `raw_total / raw_sampled` (1/1 for an exact count).
fn tally(
    index: &Index,
    live: &[Backlink],
    (raw_total, raw_sampled): (u64, u64),
    name: &dyn Fn(&str) -> Option<String>,
) -> Result<Count, QueryError> {
    let mut groups: BTreeMap<(u64, u64), (u64, HashSet<u64>)> = BTreeMap::new();
    for link in live {
        let (records, dids) = groups.entry((link.source.collection, link.location)).or_default();
        *records += 1;
        dids.insert(link.source.did);
    }
    let scale =
        |n: u64| if raw_sampled == 0 { 0 } else { (n as u128 * raw_total as u128 / raw_sampled as u128) as u64 };
    // A distinct count scales like the records, but never past them nor below what was seen.
    let scale_distinct = |seen: u64, records: u64| scale(seen).min(records).max(seen.min(records));
    let mut count = Count::default();
    let mut named: BTreeMap<(String, String), (u64, HashSet<u64>)> = BTreeMap::new();
    for ((collection, location), (records, dids)) in groups {
        let collection = resolve(index, OutlineKind::Collection, collection)?;
        let location = resolve(index, OutlineKind::Location, location)?;
        *count.by_location.entry(location.to_string()).or_default() += scale(records);
        if let Some(location_name) = name(&location) {
            let (named_records, named_dids) = named.entry((collection.to_string(), location_name)).or_default();
            *named_records += records;
            named_dids.extend(dids);
        }
    }
    for (key, (records, dids)) in named {
        let records = scale(records);
        let distinct_dids = scale_distinct(dids.len() as u64, records);
        count.by_source.insert(key, SourceCount { records, distinct_dids });
    }
    count.total = count.by_location.values().sum();
    let sampled_dids = live.iter().map(|l| l.source.did).collect::<HashSet<_>>().len() as u64;
    count.distinct_dids = scale_distinct(sampled_dids, count.total);
    Ok(count)
}

fn resolve(index: &Index, kind: OutlineKind, id: u64) -> Result<Arc<str>, QueryError> {
    index
        .outlines
        .resolve(kind, id)
        .map_err(IndexError::from)?
        .ok_or_else(|| QueryError::Internal(format!("{kind} id {id} has no outline entry")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexOptions;
    use crate::lsm::table::TableOptions;
    use crate::model::operation::{Operation, RecordOp, RecordRef};
    use crate::model::tid::format_tid;
    use crate::query::list_backlinks;
    use std::borrow::Cow;

    const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";

    fn open(dir: &std::path::Path) -> Index {
        let table = TableOptions { frame_bytes: 4096, ..TableOptions::default() };
        let options = IndexOptions { table, ..IndexOptions::default() };
        crate::index::open_in_dir(dir, options)
    }

    fn did(i: usize) -> String {
        format!("did:plc:{i:024}")
    }

    fn record_ref(author: usize, collection: &str, rkey: u64) -> RecordRef<'static> {
        RecordRef {
            did: Cow::Owned(did(author)),
            collection: Cow::Owned(collection.into()),
            rkey: format_tid(rkey).into(),
        }
    }

    /// A like (strong ref at `$.subject`) or a post replying to (`$.reply.parent`) the target.
    fn link(index: &Index, author: usize, rkey: u64, like: bool) {
        let strong = serde_json::json!({"uri": POST, "cid": "bafyreib2rxk3rybloqtqwbo"});
        let (collection, record) = if like {
            ("app.bsky.feed.like", serde_json::json!({"subject": strong}))
        } else {
            ("app.bsky.feed.post", serde_json::json!({"reply": {"parent": strong, "root": "x"}}))
        };
        let op = Operation::Create(RecordOp { record_ref: record_ref(author, collection, rkey), record });
        index.apply(&op, None).unwrap();
    }

    /// Every live backlink by paging listBacklinks to the end: (location, count).
    async fn enumerate(index: &Index, params: &ListParams) -> BTreeMap<String, u64> {
        let mut params = ListParams { limit: 7, ..params.clone() };
        let mut seen = BTreeMap::new();
        for _ in 0..10_000 {
            let page = list_backlinks(index, &params).await.unwrap();
            for (location, _) in &page.items {
                *seen.entry(location.clone()).or_default() += 1;
            }
            match page.cursor {
                Some(c) => params.cursor = Some(crate::query::Cursor::decode(&c).unwrap()),
                None => return seen,
            }
        }
        panic!("listBacklinks never ended");
    }

    /// Writes 300 links over several tables, with deletes, updates and a hidden account.
    fn populate(index: &Index) {
        for i in 0..300u64 {
            link(index, (i % 13) as usize, 1_700_000_000_000_000 + i * 1_000_003, i % 3 != 0);
            if i % 70 == 69 {
                index.flush().unwrap();
            }
        }
        for i in (0..300u64).step_by(11) {
            let collection = if i % 3 != 0 { "app.bsky.feed.like" } else { "app.bsky.feed.post" };
            let rkey = 1_700_000_000_000_000 + i * 1_000_003;
            index.apply(&Operation::Delete(record_ref((i % 13) as usize, collection, rkey)), None).unwrap();
        }
        // Re-creating a record writes a duplicate position at a newer stamp.
        link(index, 1, 1_700_000_000_000_000 + 1_000_003, true);
        let deactivate = Operation::Account { did: did(5).into(), active: false, status: Some("deactivated".into()) };
        index.apply(&deactivate, None).unwrap();
        index.flush().unwrap();
        link(index, 2, 1_800_000_000_000_000, true);
    }

    #[tokio::test]
    async fn exact_count_equals_the_full_enumeration_under_every_filter() {
        let dir = tempfile::tempdir().unwrap();
        let index = open(dir.path());
        populate(&index);
        let filters: [(&[&str], &[&str]); 4] = [
            (&[], &[]),
            (&["app.bsky.feed.like"], &[]),
            (&[], &["$.reply.parent"]),
            (&["app.bsky.feed.post"], &["$.subject"]),
        ];
        for (collections, locations) in filters {
            let params = ListParams {
                collections: collections.iter().map(|c| c.to_string()).collect(),
                locations: locations.iter().map(|l| l.to_string()).collect(),
                ..ListParams::new(POST)
            };
            let expected = enumerate(&index, &params).await;
            let count = count_backlinks(&index, &params, CountOptions::default()).await.unwrap();
            assert_eq!(count.by_location, expected, "{collections:?} {locations:?}");
            assert_eq!(count.total, expected.values().sum::<u64>());
            assert!(!count.approximate);
        }
        let all = count_backlinks(&index, &ListParams::new(POST), CountOptions::default()).await.unwrap();
        // 300 written, 28 deleted, the re-created one counts once, account 5's 21 live ones
        // hidden (2 of its 23 were deleted), one more written after the flush.
        assert_eq!(all.total, 300 - 28 - 21 + 1, "{all:?}");
        assert_eq!(all.distinct_dids, 12, "13 authors, one hidden");
    }

    #[tokio::test]
    async fn unknown_targets_and_impossible_filters_count_zero() {
        let dir = tempfile::tempdir().unwrap();
        let index = open(dir.path());
        populate(&index);
        let unknown = ListParams::new("did:plc:zzzzzzzzzzzzzzzzzzzzzzzz");
        assert_eq!(count_backlinks(&index, &unknown, CountOptions::default()).await.unwrap(), Count::default());
        let nothing = ListParams { collections: vec!["com.example.never".into()], ..ListParams::new(POST) };
        assert_eq!(count_backlinks(&index, &nothing, CountOptions::default()).await.unwrap(), Count::default());
    }

    #[tokio::test]
    async fn a_hot_target_gets_a_bounded_estimate_that_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let index = open(dir.path());
        // 4000 live likes over 4 tables (64 entries per frame): no deletes, so the estimate of the
        // total is exact (interior frames counted from metadata, the live share is 1).
        for i in 0..4000u64 {
            link(&index, (i % 50) as usize, 1_700_000_000_000_000 + i * 1_000_003, true);
            if i % 1000 == 999 {
                index.flush().unwrap();
            }
        }
        let options = CountOptions { exact_scan_limit: 500 };
        let count = count_backlinks(&index, &ListParams::new(POST), options).await.unwrap();
        assert!(count.approximate);
        assert_eq!(count.total, 4000);
        assert_eq!(count.by_location, BTreeMap::from([("$.subject".to_string(), 4000)]));
        let exact = count_backlinks(&index, &ListParams::new(POST), CountOptions::default()).await.unwrap();
        assert_eq!((exact.total, exact.approximate, exact.distinct_dids), (4000, false, 50));
    }

    #[tokio::test]
    async fn estimates_scale_the_sampled_live_share() {
        let dir = tempfile::tempdir().unwrap();
        let index = open(dir.path());
        for i in 0..2000u64 {
            link(&index, (i % 50) as usize, 1_700_000_000_000_000 + i * 1_000_003, true);
        }
        index.flush().unwrap();
        // Delete every other like: half of the entries are dead.
        for i in (0..2000u64).step_by(2) {
            let rkey = 1_700_000_000_000_000 + i * 1_000_003;
            index.apply(&Operation::Delete(record_ref((i % 50) as usize, "app.bsky.feed.like", rkey)), None).unwrap();
        }
        index.flush().unwrap();
        let count = count_backlinks(&index, &ListParams::new(POST), CountOptions { exact_scan_limit: 400 }).await;
        let count = count.unwrap();
        assert!(count.approximate);
        assert!((900..=1100).contains(&count.total), "estimate {} of 1000", count.total);
    }

    #[tokio::test]
    async fn sample_frames_keep_both_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let index = open(dir.path());
        for i in 0..1000u64 {
            link(&index, 0, 1_700_000_000_000_000 + i, true);
        }
        index.flush().unwrap();
        let target = index.lookup_target(&parse_target(POST).unwrap()).unwrap().unwrap();
        let scope = TargetScope::of(&index, target).await.unwrap();
        assert_eq!(scope.spans.len(), 1);
        let span = &scope.spans[0];
        let n = span.frames.len();
        assert!(n >= 10, "{n} frames");
        assert_eq!(span.sample_frames(0), [0..1, n - 1..n]);
        assert_eq!(span.sample_frames(u64::MAX), [0..n, n..n]);
        assert_eq!(span.sample_frames(130), [0..1, n - 2..n]);
    }
}
