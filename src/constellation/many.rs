//! getManyToMany and getManyToManyCounts: from the records that link to a subject (the *join
//! records*: of one collection, at one path) on to the other subjects they link to at a second
//! path (`pathToOther`). For list items: the lists that hold an account, then who else is on them.
//!
//! A join record's other links come from the forward tree, which holds the links of every record
//! that has more than one. A record with none there has a single link, the one that made it a
//! join record, so its only other subject is the subject itself (when `pathToOther` names that
//! link's path). (Records indexed by a version without the forward tree have none either: their
//! other links are unknown until an import or backfill writes them again.)
//!
//! Order: join records oldest first (constellation's order; listBacklinks' `reverse`), and within
//! one record its other links by location, then target. Count groups are sorted by their subject.
//!
//! Invariants:
//! - Work is bounded: a page reads at most `MAX_JOIN_ROUNDS` batches of join records (each pass of
//!   the walk bounded as listBacklinks' are); a count reads at most `exact_scan_limit` join
//!   records in `MAX_JOIN_ROUNDS` such batches (more would make the answer cover the oldest ones
//!   and say `"approximate": true`). Both stop reading forward links past `MAX_FORWARD_ENTRIES`
//!   (a short page with a cursor; an approximate count).
//! - A forward link counts only when it is live by its backlink's rule (its source's thresholds);
//!   join records of hidden accounts are left out before.
//! - A page's cursor names the join record of its last item and how many of that record's items
//!   were given, so the next page neither repeats nor skips an item of a record that stays put.
//! - A URL is named only when `otherSubject` names it: the index keeps a URL's hash, not its
//!   text, so without that filter other subjects that are URLs are left out.

use super::{MAX_DIDS, Source, invalid, list_params, locations_for_path, mark_estimate, parse_did, parse_limit};
use crate::base::hex;
use crate::count::CountOptions;
use crate::index::Index;
use crate::liveness::read_thresholds;
use crate::lsm::compaction::freshest;
use crate::lsm::lookup::read_keys;
use crate::model::ids::{Backlink, ForwardLink, RecordId};
use crate::model::syntax::parse_target;
use crate::outline::OutlineKind;
use crate::query::{Cursor, ListParams, QueryError, live_links};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};

pub const GET_MANY_TO_MANY: &str = "/xrpc/blue.microcosm.links.getManyToMany";
pub const GET_MANY_TO_MANY_COUNTS: &str = "/xrpc/blue.microcosm.links.getManyToManyCounts";

/// Most batches of join records one page reads to fill itself; a page they do not fill is short
/// and has a cursor.
pub const MAX_JOIN_ROUNDS: usize = 8;
/// Most forward-link entries (live or not) one request reads: a record may hold hundreds of links.
pub const MAX_FORWARD_ENTRIES: usize = 1 << 20;
/// Most `otherSubject` filters one request may give.
pub const MAX_OTHER_SUBJECTS: usize = 100;
/// Longest subject a count cursor may name (a URL is at most 2 KiB).
const MAX_CURSOR_SUBJECT_BYTES: usize = 4096;

/// Validated parameters of both endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManyParams {
    pub subject: String,
    pub source: Source,
    /// Our locations for `pathToOther`.
    pub to_other: Vec<String>,
    /// Only join records of these accounts (`linkDid` for items, `did` for counts).
    pub dids: Vec<String>,
    pub other_subjects: Vec<String>,
    pub limit: usize,
    pub cursor: Option<String>,
}

/// Parses either endpoint's query; `did_name` is its name for the join-record account filter.
pub fn parse_many_query(pairs: &[(String, String)], did_name: &str) -> Result<ManyParams, QueryError> {
    let (mut subject, mut source, mut to_other) = (None, None, None);
    let mut params = ManyParams {
        subject: String::new(),
        source: Source { collection: String::new(), locations: vec![] },
        to_other: vec![],
        dids: vec![],
        other_subjects: vec![],
        limit: super::DEFAULT_LIMIT,
        cursor: None,
    };
    for (name, value) in pairs {
        let once = |seen: bool| if seen { Err(invalid(format!("{name} given more than once"))) } else { Ok(()) };
        match name.as_str() {
            "subject" => once(subject.replace(value.clone()).is_some())?,
            "source" => once(source.replace(super::parse_source(value)?).is_some())?,
            "pathToOther" => once(to_other.replace(locations_for_path(value)?).is_some())?,
            "otherSubject" => params.other_subjects.push(parse_subject("otherSubject", value)?),
            "limit" => params.limit = parse_limit(value)?,
            "cursor" if value.is_empty() => {}
            "cursor" => params.cursor = Some(value.clone()),
            name if name == did_name => params.dids.push(parse_did(value)?),
            _ => {}
        }
    }
    let missing = |name: &str| invalid(format!("missing required parameter: {name}"));
    params.subject = parse_subject("subject", &subject.ok_or_else(|| missing("subject"))?)?;
    params.source = source.ok_or_else(|| missing("source (collection:path, like app.bsky.graph.listitem:list)"))?;
    params.to_other = to_other.ok_or_else(|| missing("pathToOther (a path, like subject)"))?;
    if params.dids.len() > MAX_DIDS {
        return Err(invalid(format!("at most {MAX_DIDS} {did_name} filters")));
    }
    if params.other_subjects.len() > MAX_OTHER_SUBJECTS {
        return Err(invalid(format!("at most {MAX_OTHER_SUBJECTS} otherSubject filters")));
    }
    Ok(params)
}

fn parse_subject(name: &str, value: &str) -> Result<String, QueryError> {
    parse_target(value).map_err(|e| invalid(format!("invalid {name} {value:?}: {e}")))?;
    Ok(value.to_string())
}

/// Where an items page ended: listing resumes at `at`, and when `at` is inclusive the first
/// `given` items of the record there were already given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemsCursor {
    pub at: Cursor,
    pub given: u32,
}

impl ItemsCursor {
    pub fn encode(&self) -> String {
        format!("{}{:08x}", self.at.encode(), self.given)
    }

    pub fn decode(text: &str) -> Result<Self, QueryError> {
        let bad = || invalid("invalid cursor: pass back the cursor of the previous page unchanged");
        let split = text.len().checked_sub(8).filter(|&at| text.is_char_boundary(at)).ok_or_else(bad)?;
        let (at, given) = text.split_at(split);
        let given: [u8; 4] = hex::decode(given).and_then(|bytes| bytes.try_into().ok()).ok_or_else(bad)?;
        let cursor = ItemsCursor { at: Cursor::decode(at)?, given: u32::from_be_bytes(given) };
        if cursor.given > 0 && !cursor.at.inclusive {
            return Err(bad());
        }
        Ok(cursor)
    }
}

/// A count page ends at the subject of its last group: hex of its text.
pub fn encode_subject_cursor(subject: &str) -> String {
    hex::encode(subject.as_bytes())
}

pub fn decode_subject_cursor(text: &str) -> Result<String, QueryError> {
    let bad = || invalid("invalid cursor: pass back the cursor of the previous page unchanged");
    let bytes = hex::decode(text).filter(|bytes| bytes.len() <= MAX_CURSOR_SUBJECT_BYTES).ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// The ids a request's strings stand for.
struct Resolved {
    /// Location ids of `pathToOther` (only those ever seen).
    to_other: Vec<u64>,
    /// The `otherSubject` filter (`None`: any), with each subject's text.
    wanted: Option<HashMap<RecordId, String>>,
}

impl Resolved {
    /// `None` when nothing can match (no `pathToOther` location or `otherSubject` was ever seen).
    fn of(index: &Index, params: &ManyParams) -> Result<Option<Self>, QueryError> {
        let mut to_other = Vec::new();
        for location in &params.to_other {
            to_other.extend(
                index.outlines.lookup(OutlineKind::Location, location).map_err(crate::index::IndexError::from)?,
            );
        }
        let wanted = match params.other_subjects.is_empty() {
            true => None,
            false => Some(known_subjects(index, &params.other_subjects)?),
        };
        let nothing = to_other.is_empty() || wanted.as_ref().is_some_and(HashMap::is_empty);
        Ok((!nothing).then_some(Resolved { to_other, wanted }))
    }

    /// The other subjects of one join record, in order: its forward links at `pathToOther`, or,
    /// for a record with a single link, the subject itself when that link is at `pathToOther`.
    fn others_of(&self, join: &Backlink, forward: &HashMap<RecordId, Vec<ForwardLink>>) -> Vec<RecordId> {
        let mut others: Vec<RecordId> = match forward.get(&join.source) {
            Some(links) => links.iter().filter(|l| self.to_other.contains(&l.location)).map(|l| l.target).collect(),
            None if self.to_other.contains(&join.location) => vec![join.target],
            None => vec![],
        };
        match &self.wanted {
            Some(wanted) => others.retain(|other| wanted.contains_key(other)),
            // A URL's text is not kept: it can be named only when the request names it.
            None => others.retain(|other| !other.is_url()),
        }
        others
    }
}

/// The ids of the subjects the index has seen, with their texts.
fn known_subjects(index: &Index, subjects: &[String]) -> Result<HashMap<RecordId, String>, QueryError> {
    let mut known = HashMap::new();
    for subject in subjects {
        let target = parse_target(subject).map_err(|e| invalid(format!("invalid otherSubject: {e}")))?;
        if let Some(id) = index.lookup_target(&target)? {
            known.insert(id, subject.clone());
        }
    }
    Ok(known)
}

/// listBacklinks parameters that walk the join records oldest first from `at` (the caller sets
/// how many a pass takes).
fn join_walk(params: &ManyParams, at: Option<Cursor>) -> Result<ListParams, QueryError> {
    let mut walk = list_params(&params.subject, &params.source, params.dids.clone(), &[("reverse", "true")])?;
    walk.cursor = at;
    Ok(walk)
}

/// The live forward links of the records that have any, by source, each record's in order, and
/// how many entries (every copy, live or not) were read for them: one round of reads of the
/// forward tree, and one of the thresholds when it found anything.
pub async fn forward_links(
    index: &Index,
    sources: impl IntoIterator<Item = RecordId>,
) -> Result<(HashMap<RecordId, Vec<ForwardLink>>, usize), QueryError> {
    let mut sources: Vec<RecordId> = sources.into_iter().collect();
    sources.sort_unstable();
    sources.dedup();
    let mut found = read_keys(&index.forward, index.store.as_ref(), &sources).await?;
    let read = found.len();
    if found.is_empty() {
        return Ok((HashMap::new(), 0));
    }
    found.sort_unstable();
    let links = found.iter().map(|link| link.backlink());
    let thresholds = read_thresholds(&index.thresholds, index.store.as_ref(), links).await?;
    let mut by_source: HashMap<RecordId, Vec<ForwardLink>> = HashMap::new();
    for link in freshest(found.into_iter()).filter(|l| l.backlink().survives(|key| thresholds.get(key))) {
        by_source.entry(link.source).or_default().push(link);
    }
    Ok((by_source, read))
}

/// The text of each other subject: a record's at:// URI, an account's DID, a URL as the request
/// named it. `None` for an id some part of which has no outline string.
fn render_subjects(index: &Index, ids: &[RecordId], resolved: &Resolved) -> Result<Vec<Option<String>>, QueryError> {
    let mut texts = index.render_uris(ids)?;
    for (id, text) in ids.iter().zip(&mut texts) {
        if id.is_url() {
            *text = resolved.wanted.as_ref().and_then(|wanted| wanted.get(id).cloned());
        } else if id.is_repo() {
            *text = text.take().and_then(|uri| uri.strip_prefix("at://").map(str::to_string));
        }
    }
    Ok(texts)
}

/// getManyToMany: `{"items": [{"linkRecord": {"did", "collection", "rkey"}, "otherSubject"}], "cursor"}`.
pub async fn get_many_to_many(index: &Index, params: &ManyParams) -> Result<Value, QueryError> {
    let cursor = params.cursor.as_deref().map(ItemsCursor::decode).transpose()?;
    let empty = json!({ "items": [], "cursor": null });
    let Some(resolved) = Resolved::of(index, params)? else { return Ok(empty) };
    if params.limit == 0 {
        return Ok(empty);
    }
    let (items, next) = collect_items(index, params, &resolved, cursor).await?;
    let joins: Vec<RecordId> = items.iter().map(|(join, _)| *join).collect();
    let others: Vec<RecordId> = items.iter().map(|(_, other)| *other).collect();
    let (records, subjects) = (index.render_uris(&joins)?, render_subjects(index, &others, &resolved)?);
    let mut rendered = Vec::with_capacity(items.len());
    for (record, subject) in records.into_iter().zip(subjects) {
        let (Some(record), Some(subject)) = (record, subject) else {
            return Err(QueryError::Internal("a join record or other subject has no outline entry".into()));
        };
        rendered.push(json!({ "linkRecord": super::record_json(&record)?, "otherSubject": subject }));
    }
    Ok(json!({ "items": rendered, "cursor": next.map(|c| c.encode()) }))
}

/// Up to `limit` (join record, other subject) pairs from the cursor on, and where the next page
/// starts.
async fn collect_items(
    index: &Index,
    params: &ManyParams,
    resolved: &Resolved,
    cursor: Option<ItemsCursor>,
) -> Result<(Vec<(RecordId, RecordId)>, Option<ItemsCursor>), QueryError> {
    let resume = cursor.filter(|c| c.at.inclusive && c.given > 0).map(|c| ((c.at.source, c.at.location), c.given));
    let mut walk = join_walk(params, cursor.map(|c| c.at))?;
    walk.limit = params.limit;
    let mut items = Vec::with_capacity(params.limit);
    let mut forward_read = 0;
    for _ in 0..MAX_JOIN_ROUNDS {
        let (joins, next) = live_links(index, &walk).await?;
        let (forward, read) = forward_links(index, joins.iter().map(|join| join.source)).await?;
        forward_read += read;
        for join in &joins {
            let others = resolved.others_of(join, &forward);
            let skip = resume.filter(|(at, _)| *at == (join.source, join.location)).map_or(0, |(_, given)| given);
            for (given, other) in others.into_iter().enumerate().skip(skip as usize) {
                if items.len() == params.limit {
                    let at = Cursor { source: join.source, location: join.location, inclusive: true };
                    return Ok((items, Some(ItemsCursor { at, given: given as u32 })));
                }
                items.push((join.source, other));
            }
        }
        let Some(next) = next else { return Ok((items, None)) };
        walk.cursor = Some(next);
        if forward_read >= MAX_FORWARD_ENTRIES {
            break;
        }
    }
    // Bounded work: a short page that resumes where the walk stopped (still inside the record
    // the page started in, with its items given so far, when the walk did not get past it).
    let at = walk.cursor.expect("the walk stops only with somewhere to resume");
    let given = match cursor {
        Some(start) if start.at == at => start.given,
        _ => 0,
    };
    Ok((items, Some(ItemsCursor { at, given })))
}

/// One group of a count: join records whose first other subject is this one, and their accounts.
#[derive(Default)]
struct Group {
    records: usize,
    dids: HashSet<u64>,
}

/// getManyToManyCounts: `{"counts_by_other_subject": [{"subject", "total", "distinct"}], "cursor"}`,
/// a join record counted under its first other subject; groups by subject text.
pub async fn get_many_to_many_counts(
    index: &Index,
    params: &ManyParams,
    options: CountOptions,
) -> Result<Value, QueryError> {
    let after = params.cursor.as_deref().map(decode_subject_cursor).transpose()?;
    let empty = json!({ "counts_by_other_subject": [], "cursor": null });
    let Some(resolved) = Resolved::of(index, params)? else { return Ok(empty) };
    let (groups, approximate) = count_groups(index, params, &resolved, options).await?;
    let ids: Vec<RecordId> = groups.keys().copied().collect();
    let mut named: BTreeMap<String, &Group> = BTreeMap::new();
    for (id, text) in ids.iter().zip(render_subjects(index, &ids, &resolved)?) {
        let text = text.ok_or_else(|| QueryError::Internal(format!("other subject {id:?} has no outline entry")))?;
        named.insert(text, &groups[id]);
    }
    let mut page: Vec<Value> = Vec::new();
    let mut last = None;
    let after_cursor = named.iter().filter(|(subject, _)| after.as_ref().is_none_or(|after| *subject > after));
    let mut remaining = after_cursor.peekable();
    while page.len() < params.limit {
        let Some((subject, group)) = remaining.next() else { break };
        page.push(json!({ "subject": subject, "total": group.records, "distinct": group.dids.len() }));
        last = Some(subject);
    }
    let cursor = last.filter(|_| remaining.peek().is_some()).map(|subject| encode_subject_cursor(subject));
    let body = json!({ "counts_by_other_subject": page, "cursor": cursor });
    Ok(mark_estimate(body, approximate))
}

/// Every join record's first other subject, grouped; true when the walk stopped before the end
/// (more than `exact_scan_limit` join records, or `MAX_JOIN_ROUNDS` passes or
/// `MAX_FORWARD_ENTRIES` forward entries used up): then the groups cover the oldest join records.
async fn count_groups(
    index: &Index,
    params: &ManyParams,
    resolved: &Resolved,
    options: CountOptions,
) -> Result<(HashMap<RecordId, Group>, bool), QueryError> {
    // The rounds of a page, each taking its share of the join records a count may read.
    let batch = options.exact_scan_limit.div_ceil(MAX_JOIN_ROUNDS);
    let mut walk = join_walk(params, None)?;
    let mut groups: HashMap<RecordId, Group> = HashMap::new();
    let (mut forward_read, mut unread) = (0, options.exact_scan_limit);
    for _ in 0..MAX_JOIN_ROUNDS {
        walk.limit = batch.min(unread);
        let (joins, next) = live_links(index, &walk).await?;
        unread -= joins.len();
        let (forward, read) = forward_links(index, joins.iter().map(|join| join.source)).await?;
        forward_read += read;
        for join in &joins {
            if let Some(first) = resolved.others_of(join, &forward).first() {
                let group = groups.entry(*first).or_default();
                group.records += 1;
                group.dids.insert(join.source.did);
            }
        }
        let Some(next) = next else { return Ok((groups, false)) };
        if forward_read >= MAX_FORWARD_ENTRIES || unread == 0 {
            break;
        }
        walk.cursor = Some(next);
    }
    Ok((groups, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const LIST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.graph.list/3kaaaaaaaaaaa";

    #[test]
    fn queries_parse_with_each_endpoints_did_name() {
        let query = [
            ("subject", LIST),
            ("source", "app.bsky.graph.listitem:list"),
            ("pathToOther", "subject"),
            ("linkDid", "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"),
            ("did", "did:plc:cccccccccccccccccccccccc"),
            ("limit", "7"),
        ];
        let items = parse_many_query(&pairs(&query), "linkDid").unwrap();
        assert_eq!(items.source.locations, ["$.list"]);
        assert_eq!(items.to_other, ["$.subject"]);
        assert_eq!(items.dids, ["did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"]);
        assert_eq!(items.limit, 7);
        let counts = parse_many_query(&pairs(&query), "did").unwrap();
        assert_eq!(counts.dids, ["did:plc:cccccccccccccccccccccccc"]);
    }

    #[test]
    fn bad_queries_name_what_is_wrong() {
        let message = |query: &[(&str, &str)]| match parse_many_query(&pairs(query), "linkDid") {
            Err(QueryError::InvalidRequest(message)) => message,
            other => panic!("expected a 400, got {other:?}"),
        };
        let base = [("subject", LIST), ("source", "app.bsky.graph.listitem:list"), ("pathToOther", "subject")];
        assert!(message(&base[1..]).contains("subject"));
        assert!(message(&[base[0], base[2]]).contains("source"));
        assert!(message(&base[..2]).contains("pathToOther"));
        assert!(message(&[base[0], base[1], base[2], ("pathToOther", "list")]).contains("more than once"));
        assert!(message(&[base[0], base[1], ("pathToOther", "a..b")]).contains("path"));
        assert!(message(&[base[0], base[1], base[2], ("otherSubject", "nope")]).contains("otherSubject"));
        assert!(message(&[base[0], base[1], base[2], ("limit", "1001")]).contains("limit"));
        assert!(message(&[base[0], base[1], base[2], ("linkDid", "alice")]).contains("did"));
    }

    #[test]
    fn cursors_round_trip_and_reject_what_no_page_wrote() {
        let at = Cursor { source: RecordId { rkey: 1, collection: 2, did: 3 }, location: 4, inclusive: true };
        let cursor = ItemsCursor { at, given: 3 };
        assert_eq!(ItemsCursor::decode(&cursor.encode()).unwrap(), cursor);
        let exclusive = ItemsCursor { at: Cursor { inclusive: false, ..at }, given: 0 };
        assert_eq!(ItemsCursor::decode(&exclusive.encode()).unwrap(), exclusive);
        let given_past_exclusive = format!("{}00000001", exclusive.at.encode());
        for bad in ["", "00", &given_past_exclusive, &format!("{}0000000g", at.encode()), "é0000000"] {
            assert!(ItemsCursor::decode(bad).is_err(), "{bad:?}");
        }
        let subject = "at://did:plc:x/app.bsky.graph.list/3k";
        assert_eq!(decode_subject_cursor(&encode_subject_cursor(subject)).unwrap(), subject);
        for bad in ["0", "zz", "ff"] {
            assert!(decode_subject_cursor(bad).is_err(), "{bad:?}");
        }
    }
}
