//! listBacklinks: the two-round read path.
//!
//! Round 1 reads the target's entries: every memtable, and for every table whose filter admits the
//! target, the frames that can hold them (one ranged read per table, all concurrently). Round 2
//! reads the record-level and repo-level thresholds of the candidate sources from the revocation
//! tree (again one round of concurrent reads). Then hidden accounts and filters apply, and ids
//! are rendered back to URIs.
//!
//! Invariants:
//! - Order: newest first is descending `(source, location)` (the source's rkey comes first, and
//!   TIDs are timestamps); `reverse` is ascending. A cursor is the position of the last item
//!   returned, and the next page starts strictly after it, so pages never skip or repeat a live
//!   backlink.
//! - A table read is bounded: only enough frames to cover the page are fetched. When a table is
//!   cut short, only positions it fully covers are answered in this pass (its horizon); the rest
//!   comes from another pass that starts at the horizon. Work per request is bounded by
//!   `MAX_SCAN_ENTRIES`; a page that hits it is short but carries a cursor.
//! - Of duplicates (same source and location), the freshest stamp decides liveness.
//! - A backlink is live iff its stamp >= the record-level and the repo-level threshold of its
//!   source and the source's account is not hidden.

use crate::base::hex;
use crate::index::{Index, IndexError};
use crate::liveness::read_thresholds;
use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::table::{FrameInfo, PageUse};
use crate::model::ids::{Backlink, RecordId};
use crate::model::syntax::{parse_target, validate_nsid};
use crate::outline::OutlineKind;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// Entries one request may scan before it returns a (possibly short) page with a cursor.
pub const MAX_SCAN_ENTRIES: usize = 1 << 20;
/// Bounds on repeated query parameters.
const MAX_FILTERS: usize = 64;
const MAX_PARAM_BYTES: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<IndexError> for QueryError {
    fn from(e: IndexError) -> Self {
        QueryError::Internal(e.to_string())
    }
}

impl From<ReadError> for QueryError {
    fn from(e: ReadError) -> Self {
        QueryError::Internal(e.to_string())
    }
}

fn invalid(message: impl Into<String>) -> QueryError {
    QueryError::InvalidRequest(message.into())
}

/// The parameters of listBacklinks, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListParams {
    pub target: String,
    pub collections: Vec<String>,
    pub locations: Vec<String>,
    pub limit: usize,
    pub cursor: Option<Cursor>,
    pub reverse: bool,
    /// Only sources in these repositories (not a listBacklinks parameter: set by the
    /// constellation-compatible layer, whose `did` filter it is).
    pub dids: Vec<String>,
}

impl ListParams {
    pub fn new(target: impl Into<String>) -> Self {
        Self {
            target: target.into(),
            collections: vec![],
            locations: vec![],
            limit: DEFAULT_LIMIT,
            cursor: None,
            reverse: false,
            dids: vec![],
        }
    }

    /// Parses query-string pairs; unknown parameters are ignored, as XRPC servers do.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, QueryError> {
        let mut target = None;
        let mut params = ListParams::new("");
        for (name, value) in pairs {
            if value.len() > MAX_PARAM_BYTES {
                return Err(invalid(format!("parameter {name} is longer than {MAX_PARAM_BYTES} bytes")));
            }
            match name {
                "target" if target.is_some() => return Err(invalid("target given more than once")),
                "target" => target = Some(value.to_string()),
                "collection" => params.collections.push(parse_collection(value)?),
                "location" => params.locations.push(parse_location(value)?),
                "limit" => params.limit = parse_limit(value)?,
                "cursor" if value.is_empty() => {}
                "cursor" => params.cursor = Some(Cursor::decode(value)?),
                "reverse" => params.reverse = parse_bool(value)?,
                _ => {}
            }
        }
        if params.collections.len() > MAX_FILTERS || params.locations.len() > MAX_FILTERS {
            return Err(invalid(format!("at most {MAX_FILTERS} collection and location filters")));
        }
        params.target = target.ok_or_else(|| invalid("missing required parameter: target"))?;
        parse_target(&params.target).map_err(|e| invalid(format!("invalid target: {e}")))?;
        Ok(params)
    }
}

fn parse_collection(value: &str) -> Result<String, QueryError> {
    validate_nsid(value).map_err(|e| invalid(format!("invalid collection {value:?}: {e}")))?;
    Ok(value.to_string())
}

fn parse_location(value: &str) -> Result<String, QueryError> {
    if !value.starts_with('$') {
        return Err(invalid(format!(
            "invalid location {value:?}: a location is a path starting with $, like $.subject"
        )));
    }
    Ok(value.to_string())
}

fn parse_limit(value: &str) -> Result<usize, QueryError> {
    match value.parse::<usize>() {
        Ok(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
        _ => Err(invalid(format!("limit must be an integer from 1 to {MAX_LIMIT}, got {value:?}"))),
    }
}

fn parse_bool(value: &str) -> Result<bool, QueryError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(invalid(format!("reverse must be true or false, got {value:?}"))),
    }
}

/// Where a page ended: the last item's (source, location). Opaque to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    pub source: RecordId,
    pub location: u64,
    /// The next page starts at this position (true) or strictly after it (false, the usual case;
    /// true only when a bounded pass stopped before answering this position).
    pub inclusive: bool,
}

const CURSOR_VERSION: u8 = 1;
const CURSOR_BYTES: usize = 1 + RecordId::WIDTH + 8 + 1;

impl Cursor {
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(CURSOR_BYTES);
        bytes.push(CURSOR_VERSION);
        bytes.extend_from_slice(&self.source.to_bytes());
        bytes.extend_from_slice(&self.location.to_be_bytes());
        bytes.push(self.inclusive as u8);
        assert_eq!(bytes.len(), CURSOR_BYTES);
        hex::encode(&bytes)
    }

    pub fn decode(text: &str) -> Result<Self, QueryError> {
        let bad = || invalid("invalid cursor: pass back the cursor of the previous page unchanged");
        let bytes = hex::decode(text).filter(|bytes| bytes.len() == CURSOR_BYTES).ok_or_else(bad)?;
        if bytes[0] != CURSOR_VERSION || bytes[33] > 1 {
            return Err(bad());
        }
        let cursor = Cursor {
            source: RecordId::decode(&bytes[1..25]),
            location: u64::from_be_bytes(bytes[25..33].try_into().expect("8 bytes")),
            inclusive: bytes[33] == 1,
        };
        assert_eq!(cursor.encode(), text.to_ascii_lowercase());
        Ok(cursor)
    }

    fn of(link: &Backlink) -> Self {
        Cursor { source: link.source, location: link.location, inclusive: false }
    }

    /// Position only (source, location), for ordering.
    fn position(&self) -> (RecordId, u64) {
        (self.source, self.location)
    }
}

/// One page of results, in page order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    /// (location, source URI) pairs.
    pub items: Vec<(String, String)>,
    pub cursor: Option<String>,
}

impl ListPage {
    /// The JSON body of listBacklinks: backlinks grouped by location.
    pub fn to_json(&self) -> serde_json::Value {
        let mut groups = serde_json::Map::new();
        for (location, uri) in &self.items {
            let group = groups.entry(location.clone()).or_insert_with(|| serde_json::Value::Array(vec![]));
            group.as_array_mut().expect("groups are arrays").push(uri.clone().into());
        }
        serde_json::json!({ "backlinks": groups, "cursor": self.cursor })
    }

    /// The same body as `to_json`, byte for byte, serialized straight from the page: no
    /// intermediate `Value`, no copies of the strings (the server answers with this).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            backlinks: BTreeMap<&'a str, Vec<&'a str>>,
            cursor: Option<&'a str>,
        }
        let mut backlinks: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (location, uri) in &self.items {
            backlinks.entry(location).or_default().push(uri);
        }
        let body = Body { backlinks, cursor: self.cursor.as_deref() };
        // Room for every string plus its quotes and separators: one allocation, no regrowth.
        let strings: usize = self.items.iter().map(|(location, uri)| location.len() + uri.len() + 8).sum();
        let mut out = Vec::with_capacity(64 + strings + self.cursor.as_ref().map_or(0, String::len));
        serde_json::to_writer(&mut out, &body).expect("a map of strings always serializes");
        out
    }
}

/// Resolved filters: `None` means "no filter"; an empty set means "nothing can match".
pub struct Filters {
    collections: Option<Vec<u64>>,
    locations: Option<Vec<u64>>,
    dids: Option<Vec<u64>>,
}

impl Filters {
    pub fn resolve(index: &Index, params: &ListParams) -> Result<Self, QueryError> {
        let ids = |kind, names: &[String]| -> Result<Option<Vec<u64>>, QueryError> {
            if names.is_empty() {
                return Ok(None);
            }
            let mut ids = Vec::new();
            for name in names {
                ids.extend(index.outlines.lookup(kind, name).map_err(IndexError::from)?);
            }
            Ok(Some(ids))
        };
        Ok(Filters {
            collections: ids(OutlineKind::Collection, &params.collections)?,
            locations: ids(OutlineKind::Location, &params.locations)?,
            dids: ids(OutlineKind::Did, &params.dids)?,
        })
    }

    pub fn admits(&self, link: &Backlink) -> bool {
        let admits = |ids: &Option<Vec<u64>>, id: u64| ids.as_ref().is_none_or(|ids| ids.contains(&id));
        self.admits_group(link.source.collection, link.location) && admits(&self.dids, link.source.did)
    }

    /// Whether links from one (source collection, location) may pass.
    pub fn admits_group(&self, collection: u64, location: u64) -> bool {
        let admits = |ids: &Option<Vec<u64>>, id: u64| ids.as_ref().is_none_or(|ids| ids.contains(&id));
        admits(&self.collections, collection) && admits(&self.locations, location)
    }

    /// The accounts whose links alone pass, when the filters name some.
    pub fn dids(&self) -> Option<&[u64]> {
        self.dids.as_deref()
    }

    /// Whether links from every (source collection, location) pass.
    pub fn admits_every_group(&self) -> bool {
        self.collections.is_none() && self.locations.is_none()
    }

    pub fn matches_nothing(&self) -> bool {
        [&self.collections, &self.locations, &self.dids].iter().any(|ids| ids.as_ref().is_some_and(|i| i.is_empty()))
    }
}

/// The reading direction and the exclusive start position of one pass.
#[derive(Clone, Copy)]
struct Pass {
    target: RecordId,
    reverse: bool,
    after: Option<Cursor>,
}

impl Pass {
    /// Inclusive entry bounds covering every position this pass may return.
    fn bounds(&self) -> (Backlink, Backlink) {
        let lo = Backlink::min_for_key(self.target);
        let hi = Backlink::max_for_key(self.target);
        match self.after {
            None => (lo, hi),
            Some(c) if self.reverse => (Backlink { source: c.source, location: c.location, ..lo }, hi),
            Some(c) => (lo, Backlink { source: c.source, location: c.location, ..hi }),
        }
    }

    /// After the start position in reading order (or at it, for an inclusive cursor).
    fn is_after_start(&self, pos: Cursor) -> bool {
        let Some(c) = self.after else { return true };
        let (pos, start) = (pos.position(), c.position());
        (c.inclusive && pos == start) || if self.reverse { pos > start } else { pos < start }
    }

    /// Within the region every table fully covered (`horizon` from `merge_horizon`).
    fn within_horizon(&self, pos: Cursor, horizon: Option<Horizon>) -> bool {
        match horizon {
            None => true,
            Some(Horizon::AtLeast(h)) => pos.position() >= h.position(),
            Some(Horizon::Below(h)) => pos.position() < h.position(),
        }
    }
}

/// How far a truncated table read reaches, in positions of the target.
#[derive(Clone, Copy, Debug)]
enum Horizon {
    /// Newest-first read: every position >= this one was read.
    AtLeast(Cursor),
    /// Oldest-first read: every position < this one was read.
    Below(Cursor),
}

fn merge_horizon(a: Option<Horizon>, b: Option<Horizon>) -> Option<Horizon> {
    match (a, b) {
        (None, h) | (h, None) => h,
        (Some(Horizon::AtLeast(x)), Some(Horizon::AtLeast(y))) => Some(Horizon::AtLeast(x.max(y))),
        (Some(Horizon::Below(x)), Some(Horizon::Below(y))) => Some(Horizon::Below(x.min(y))),
        _ => unreachable!("one pass reads in one direction"),
    }
}

/// Frames of one table to read in round 1.
struct Plan {
    table: Arc<TableHandle<Backlink>>,
    frames: Range<usize>,
    horizon: Option<Horizon>,
}

/// Picks the frames of `table` that hold the first `want` entries of the pass.
fn plan_table(table: &Arc<TableHandle<Backlink>>, pass: &Pass, want: usize) -> Result<Option<Plan>, ReadError> {
    let (lo, hi) = pass.bounds();
    let all = table.frames_overlapping(&lo, &hi)?;
    if all.is_empty() {
        return Ok(None);
    }
    // The index records of the frames overlapping the pass, and of the one after them.
    let window = FrameWindow {
        base: all.start,
        infos: table.frame_infos(all.start..(all.end + 1).min(table.frame_count()), PageUse::Lookup)?,
    };
    let frames = &window;
    let mut taken = 0usize;
    let mut range = if pass.reverse { all.start..all.start } else { all.end..all.end };
    while taken < want && range.len() < all.len() {
        if pass.reverse {
            taken += whole_target_entries(frames, range.end, pass.target);
            range.end += 1;
        } else {
            range.start -= 1;
            taken += whole_target_entries(frames, range.start, pass.target);
        }
    }
    let horizon = if pass.reverse {
        frames
            .get(range.end)
            .filter(|f| range.end < all.end && f.first.target == pass.target)
            .map(|f| Horizon::Below(Cursor::of(&f.first)))
    } else {
        let first = &frames.at(range.start).first;
        (range.start > all.start && first.target == pass.target).then(|| Horizon::AtLeast(Cursor::of(first)))
    };
    Ok(Some(Plan { table: table.clone(), frames: range, horizon }))
}

/// Index records of consecutive frames, addressed by table frame number.
struct FrameWindow {
    base: usize,
    infos: Vec<FrameInfo<Backlink>>,
}

impl FrameWindow {
    fn get(&self, i: usize) -> Option<&FrameInfo<Backlink>> {
        i.checked_sub(self.base).and_then(|at| self.infos.get(at))
    }

    fn at(&self, i: usize) -> &FrameInfo<Backlink> {
        self.get(i).expect("a frame inside the window")
    }
}

/// The entries of frame `i` that are certainly `target`'s: all of them when the frame starts with
/// the target and the next frame continues it; none counted otherwise. A frame shared with other
/// targets may hold as few as one of the target's entries, and counting it whole would end the
/// plan early and cost the page another pass (two more serial rounds).
fn whole_target_entries(frames: &FrameWindow, i: usize, target: RecordId) -> usize {
    let next_continues = frames.get(i + 1).is_some_and(|next| next.continues && next.first.target == target);
    let frame = frames.at(i);
    if frame.first.target == target && next_continues { frame.entries as usize } else { 0 }
}

/// Round 1: candidate backlinks of the pass (freshest per position) and the horizon reached.
async fn read_candidates(
    index: &Index,
    pass: &Pass,
    want: usize,
) -> Result<(Vec<Backlink>, Option<Horizon>), QueryError> {
    let (lo, hi) = pass.bounds();
    let snapshot = index.links.snapshot([(lo, hi)]);
    let store = index.store.as_ref();
    snapshot.fetch_metas_for_keys(store, &[(pass.target, None)]).await?;
    let tables = snapshot.tables_for_key(&pass.target);
    let mut plans: Vec<Plan> = Vec::new();
    for table in &tables {
        plans.extend(plan_table(table, pass, want)?);
    }
    let reads = futures::future::try_join_all(
        plans.iter().map(|plan| plan.table.read_frame_slices(store, plan.frames.clone(), (pass.target, pass.target))),
    )
    .await?;
    let horizon = plans.iter().fold(None, |h, plan| merge_horizon(h, plan.horizon));
    let mut entries = snapshot.memtable_entries;
    for slice in reads.iter().flatten() {
        entries.extend_from_slice(within(slice, &lo, &hi));
    }
    entries.retain(|e| e.target == pass.target && lo <= *e && *e <= hi);
    entries.retain(|e| pass.is_after_start(Cursor::of(e)) && pass.within_horizon(Cursor::of(e), horizon));
    Ok((freshest_per_position(entries), horizon))
}

/// The `keep` candidates (sorted by position) nearest the pass's start, and the horizon shrunk to
/// them. A hot target's frames hold far more candidates than a page needs, and the thresholds'
/// round costs a filter probe per candidate source and run: at 100 M links it was half a query's
/// CPU. Twice `want` leaves room for revoked ones; a page they do not fill reads on from the new
/// horizon (one more pass: two more serial rounds when cold).
fn nearest_candidates(
    mut candidates: Vec<Backlink>,
    horizon: Option<Horizon>,
    reverse: bool,
    keep: usize,
) -> (Vec<Backlink>, Option<Horizon>) {
    if candidates.len() <= keep || keep == 0 {
        return (candidates, horizon);
    }
    let horizon = match reverse {
        // Oldest first: every position below the first one dropped is kept.
        true => {
            let first_dropped = Cursor::of(&candidates[keep]);
            candidates.truncate(keep);
            Horizon::Below(first_dropped)
        }
        // Newest first: every position at or above the oldest kept is kept.
        false => {
            candidates.drain(..candidates.len() - keep);
            Horizon::AtLeast(Cursor::of(&candidates[0]))
        }
    };
    (candidates, Some(horizon))
}

/// Sorts by position and keeps the largest stamp of each position.
pub fn freshest_per_position(mut entries: Vec<Backlink>) -> Vec<Backlink> {
    entries.sort_unstable();
    let mut out: Vec<Backlink> = Vec::with_capacity(entries.len());
    for entry in entries {
        match out.last_mut() {
            Some(last) if last.same_identity(&entry) => *last = entry,
            _ => out.push(entry),
        }
    }
    out
}

/// Keeps the candidates that are live, visible and admitted by the filters.
pub async fn live_only(
    index: &Index,
    candidates: Vec<Backlink>,
    filters: &Filters,
) -> Result<Vec<Backlink>, QueryError> {
    surviving(index, visible_admitted(index, candidates, filters)).await
}

/// Keeps the candidates admitted by the filters whose accounts are not hidden (in memory).
fn visible_admitted(index: &Index, mut candidates: Vec<Backlink>, filters: &Filters) -> Vec<Backlink> {
    candidates.retain(|c| filters.admits(c));
    index.retain_visible(&mut candidates);
    candidates
}

/// Keeps the candidates no revocation kills (the thresholds of their sources, read in one round).
async fn surviving(index: &Index, candidates: Vec<Backlink>) -> Result<Vec<Backlink>, QueryError> {
    let thresholds = read_thresholds(&index.thresholds, index.store.as_ref(), candidates.iter().copied()).await?;
    Ok(candidates.into_iter().filter(|c| c.survives(|key| thresholds.get(key))).collect())
}

/// listBacklinks: one page of live backlinks to `params.target`.
pub async fn list_backlinks(index: &Index, params: &ListParams) -> Result<ListPage, QueryError> {
    let (links, next) = live_links(index, params).await?;
    render_page(index, &links, next)
}

/// listBacklinks' page as ids, not yet rendered, and where the next page starts: for the
/// endpoints that go on from the links they find (many-to-many).
pub async fn live_links(index: &Index, params: &ListParams) -> Result<(Vec<Backlink>, Option<Cursor>), QueryError> {
    let target = parse_target(&params.target).map_err(|e| invalid(format!("invalid target: {e}")))?;
    let Some(target) = index.lookup_target(&target)? else { return Ok((Vec::new(), None)) };
    let filters = Filters::resolve(index, params)?;
    if filters.matches_nothing() {
        return Ok((Vec::new(), None));
    }
    collect_page(index, target, params, &filters).await
}

/// Gathers up to `limit` live links in page order, and where the next page starts (if anywhere).
async fn collect_page(
    index: &Index,
    target: RecordId,
    params: &ListParams,
    filters: &Filters,
) -> Result<(Vec<Backlink>, Option<Cursor>), QueryError> {
    let mut pass = Pass { target, reverse: params.reverse, after: params.cursor };
    let mut page: Vec<Backlink> = Vec::new();
    let mut want = params.limit + 1;
    let mut scanned = 0usize;
    loop {
        let (candidates, horizon) = read_candidates(index, &pass, want).await?;
        // Hidden and filtered-out candidates go first (in memory), so the nearest ones kept for
        // the thresholds' round are all ones the page could show.
        let candidates = visible_admitted(index, candidates, filters);
        let (candidates, horizon) = nearest_candidates(candidates, horizon, params.reverse, want * 2);
        let mut live = surviving(index, candidates).await?;
        if !params.reverse {
            live.reverse();
        }
        page.extend(live);
        if page.len() > params.limit {
            page.truncate(params.limit);
            let last = page.last().map(Cursor::of);
            return Ok((page, last));
        }
        let Some(horizon) = horizon else { return Ok((page, None)) };
        // Newest first answered every position >= h, so resume strictly below it; oldest first
        // answered every position < h, so resume at h itself.
        let resume = match horizon {
            Horizon::AtLeast(h) => Cursor { inclusive: false, ..h },
            Horizon::Below(h) => Cursor { inclusive: true, ..h },
        };
        // A horizon at or behind the start (a frame that straddles the cursor) answered nothing
        // new: keep the start, and read further with the larger `want` below.
        let resume = match pass.after {
            Some(start) if !pass.is_after_start(resume) => start,
            _ => resume,
        };
        scanned = scanned.saturating_add(want);
        if scanned >= MAX_SCAN_ENTRIES {
            // Bounded work: a short page whose cursor resumes exactly at the horizon.
            return Ok((page, Some(resume)));
        }
        pass.after = Some(resume);
        want = want.saturating_mul(2);
    }
}

fn render_page(index: &Index, links: &[Backlink], next: Option<Cursor>) -> Result<ListPage, QueryError> {
    let sources: Vec<RecordId> = links.iter().map(|link| link.source).collect();
    let uris = index.render_uris(&sources)?;
    // A page has a handful of distinct locations: resolve each once (bounded by the page size).
    let mut locations: Vec<(u64, Arc<str>)> = Vec::new();
    let mut items = Vec::with_capacity(links.len());
    for (link, uri) in links.iter().zip(uris) {
        let uri =
            uri.ok_or_else(|| QueryError::Internal(format!("source id {:?} has no outline entry", link.source)))?;
        let location = match locations.iter().find(|(id, _)| *id == link.location) {
            Some((_, location)) => location.to_string(),
            None => {
                let location = index
                    .outlines
                    .resolve(OutlineKind::Location, link.location)
                    .map_err(IndexError::from)?
                    .ok_or_else(|| {
                        QueryError::Internal(format!("location id {} has no outline entry", link.location))
                    })?;
                locations.push((link.location, location.clone()));
                location.to_string()
            }
        };
        items.push((location, uri));
    }
    Ok(ListPage { items, cursor: next.map(|c| c.encode()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURSOR: Cursor =
        Cursor { source: RecordId { rkey: 1, collection: 2, did: 1 << 63 | 3 }, location: 4, inclusive: false };
    const CURSOR_TEXT: &str = "0100000000000000010000000000000002800000000000000300000000000000040";

    #[test]
    fn json_bytes_equal_the_json_value() {
        let item = |location: &str, uri: &str| (location.to_string(), uri.to_string());
        let page = ListPage {
            items: vec![
                item("$.subject", "at://did:plc:b/app.bsky.feed.like/3k"),
                item("$.reply.parent", "at://did:plc:a/app.bsky.feed.post/3j"),
                item("$.subject", "at://did:plc:c/app.bsky.feed.like/3i\"quoted\""),
            ],
            cursor: Some("00ff".into()),
        };
        assert_eq!(page.to_json_bytes(), serde_json::to_vec(&page.to_json()).unwrap());
        let empty = ListPage::default();
        assert_eq!(empty.to_json_bytes(), br#"{"backlinks":{},"cursor":null}"#);
    }

    #[test]
    fn only_frames_the_target_fills_count_towards_a_plan() {
        let (target, other) = (RecordId::repo(5), RecordId::repo(6));
        let frame = |key: RecordId, continues: bool| FrameInfo {
            first: Backlink { target: key, source: RecordId::repo(1), location: 1, source_rev: 1 },
            continues,
            offset: 0,
            len: 1,
            entries: 1000,
        };
        // other | target.. | target (continued) .. other | other
        let frames = FrameWindow {
            base: 0,
            infos: vec![frame(other, false), frame(target, false), frame(target, true), frame(other, false)],
        };
        assert_eq!(whole_target_entries(&frames, 0, target), 0, "another target's frame");
        assert_eq!(whole_target_entries(&frames, 1, target), 1000, "filled by the target up to the next frame");
        assert_eq!(whole_target_entries(&frames, 2, target), 0, "shared with the next target");
        assert_eq!(whole_target_entries(&frames, 3, target), 0, "the last frame");
    }

    #[test]
    fn cursors_round_trip_through_their_text() {
        let text = format!("{CURSOR_TEXT}0");
        assert_eq!(CURSOR.encode(), text);
        assert_eq!(Cursor::decode(&text).unwrap(), CURSOR);
        assert_eq!(Cursor::decode(&text.to_ascii_uppercase()).unwrap(), CURSOR);
        let inclusive = Cursor { inclusive: true, ..CURSOR };
        assert_eq!(Cursor::decode(&format!("{CURSOR_TEXT}1")).unwrap(), inclusive);
    }

    /// Found by the `cursor` fuzz target: a `+` in a digit pair got past the check, parsed as a
    /// sign, and then failed the round-trip assertion, which panicked the request.
    #[test]
    fn a_sign_in_a_cursor_is_rejected_not_a_panic() {
        let fuzzed = "010000000000+0000100000000000000028000000000000003000000000000000401";
        assert_eq!(fuzzed.len(), CURSOR_TEXT.len() + 1);
        assert!(matches!(Cursor::decode(fuzzed), Err(QueryError::InvalidRequest(_))));
        assert!(Cursor::decode(&format!("+{}", &CURSOR_TEXT[1..])).is_err());
        assert!(Cursor::decode(&format!("{CURSOR_TEXT}2")).is_err(), "inclusive flag above 1");
    }
}
