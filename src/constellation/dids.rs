//! getBacklinkDids and `/links/distinct-dids`: the accounts that link to a target, each once over
//! all pages.
//!
//! An account's place in the list is its first link: the oldest live backlink it has to the
//! target (among those the filters admit), by position (`(source, location)`, the order of
//! listBacklinks). Accounts are listed newest first by that place (oldest first with `reverse`),
//! as constellation lists them, and the cursor is the place of the page's last account, in
//! listBacklinks' cursor format.
//!
//! Invariants:
//! - Over the pages of one walk, an account comes out at most once, and every account whose
//!   first link stays put comes out: each page takes the places strictly beyond the cursor, and
//!   an account has one place. (An account whose first link is deleted mid-walk moves to its next
//!   link, and may come out again; one that links for the first time behind the cursor is not
//!   listed, as a new backlink behind a listBacklinks cursor is not.)
//! - The work is a count's: every entry of the target is read when it has at most
//!   `exact_scan_limit` entries. A hotter target is paged as listBacklinks pages it, distinct
//!   within a page only, at most `MAX_DID_ROUNDS` rounds, and the answer says `"approximate"`.
//! - `limit` 0 answers the total with an empty page and no cursor.
//! - A target that grows past the bound during a walk switches to the hot-target paging, whose
//!   cursor is a position too: from there DIDs may repeat.

use super::{did_of, mark_estimate};
use crate::count::{CountOptions, TargetLinks, count_of, read_target};
use crate::index::Index;
use crate::model::ids::{Backlink, RecordId};
use crate::query::{Cursor, ListPage, ListParams, QueryError, list_backlinks};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};

/// Most listBacklinks pages one request reads to fill its page of DIDs on a target too hot to
/// read whole.
pub const MAX_DID_ROUNDS: usize = 8;

/// A place in listBacklinks order: (source, location).
type Place = (RecordId, u64);

/// getBacklinkDids: `{"total", "linking_dids", "cursor"}`, `total` the distinct accounts over all
/// pages.
pub async fn get_backlink_dids(index: &Index, params: &ListParams, options: CountOptions) -> Result<Value, QueryError> {
    let live = match read_target(index, params, options).await? {
        TargetLinks::All(live) => live,
        sampled => return hot_target_page(index, params, &sampled).await,
    };
    let places = first_places(&live, params.reverse);
    let (places_on_page, cursor) = page_after(&places, params);
    let ids: Vec<RecordId> = places_on_page.iter().map(|(source, _)| RecordId::repo(source.did)).collect();
    let dids = render_dids(index, &ids)?;
    Ok(json!({ "total": places.len(), "linking_dids": dids, "cursor": cursor }))
}

/// Each linking account's first place, in page order.
fn first_places(live: &[Backlink], reverse: bool) -> Vec<Place> {
    let mut first: HashMap<u64, Place> = HashMap::new();
    for link in live {
        let place = (link.source, link.location);
        first.entry(link.source.did).and_modify(|known| *known = (*known).min(place)).or_insert(place);
    }
    let mut places: Vec<Place> = first.into_values().collect();
    places.sort_unstable();
    if !reverse {
        places.reverse();
    }
    places
}

/// The places after `params.cursor` that fill a page, and the cursor after them (`None` when no
/// place follows).
fn page_after<'p>(places: &'p [Place], params: &ListParams) -> (&'p [Place], Option<String>) {
    let beyond = |place: &Place| match &params.cursor {
        None => true,
        Some(cursor) => {
            let at = (cursor.source, cursor.location);
            match (params.reverse, cursor.inclusive) {
                (false, false) => *place < at,
                (false, true) => *place <= at,
                (true, false) => *place > at,
                (true, true) => *place >= at,
            }
        }
    };
    let start = places.iter().position(beyond).unwrap_or(places.len());
    let end = (start + params.limit).min(places.len());
    let page = &places[start..end];
    let more = end < places.len() && params.limit > 0;
    let cursor = page.last().filter(|_| more).map(|&(source, location)| Cursor { source, location, inclusive: false });
    (page, cursor.map(|c| c.encode()))
}

fn render_dids(index: &Index, repos: &[RecordId]) -> Result<Vec<String>, QueryError> {
    let uris = index.render_uris(repos)?;
    uris.iter()
        .map(|uri| match uri {
            Some(uri) => Ok(did_of(uri)?.to_string()),
            None => Err(QueryError::Internal("a linking account has no outline entry".into())),
        })
        .collect()
}

/// A target with more entries than a count reads whole: DIDs distinct within the page, in
/// listBacklinks order, and its total (exact for a hot target, from its tallies; estimated
/// otherwise). The answer is `approximate` either way: a DID may come again on a later page.
async fn hot_target_page(index: &Index, params: &ListParams, sampled: &TargetLinks) -> Result<Value, QueryError> {
    let (dids, cursor) = match params.limit {
        0 => (Vec::new(), None),
        _ => distinct_in_page(index, params).await?,
    };
    let count = count_of(index, sampled, &|location| Some(location.to_string()))?;
    let body = json!({ "total": count.distinct_dids, "linking_dids": dids, "cursor": cursor });
    Ok(mark_estimate(body, true))
}

/// Up to `params.limit` DIDs distinct within the page, in page order, and the cursor after the
/// last one read. Each round asks for no more backlinks than DIDs still missing, so a round
/// never overshoots and the cursor of its page is exactly where the next request resumes.
async fn distinct_in_page(index: &Index, params: &ListParams) -> Result<(Vec<String>, Option<String>), QueryError> {
    let mut seen = HashSet::new();
    let mut dids = Vec::new();
    let mut round = params.clone();
    for _ in 0..MAX_DID_ROUNDS {
        round.limit = params.limit - dids.len();
        let page: ListPage = list_backlinks(index, &round).await?;
        for (_, uri) in &page.items {
            let did = did_of(uri)?;
            if seen.insert(did.to_string()) {
                dids.push(did.to_string());
            }
        }
        match page.cursor {
            Some(cursor) if dids.len() < params.limit => round.cursor = Some(Cursor::decode(&cursor)?),
            cursor => return Ok((dids, cursor)),
        }
    }
    Ok((dids, round.cursor.map(|c| c.encode())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(did: u64, rkey: u64) -> Backlink {
        let source = RecordId { rkey, collection: 1, did };
        Backlink { target: RecordId::repo(99), source, location: 1, source_rev: 1 }
    }

    fn params(limit: usize, cursor: Option<Cursor>, reverse: bool) -> ListParams {
        let mut params = ListParams::from_pairs([("target", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")]).unwrap();
        (params.limit, params.cursor, params.reverse) = (limit, cursor, reverse);
        params
    }

    #[test]
    fn each_account_sits_at_its_oldest_link_and_pages_never_repeat_it() {
        // Account 7 links at rkeys 10, 30 and 50; account 8 at 20 and 60; account 9 at 40.
        let live: Vec<Backlink> =
            [(7, 10), (8, 20), (7, 30), (9, 40), (7, 50), (8, 60)].map(|(d, r)| link(d, r)).into();
        for reverse in [false, true] {
            let places = first_places(&live, reverse);
            let mut order: Vec<(u64, u64)> = places.iter().map(|(s, _)| (s.did, s.rkey)).collect();
            if reverse {
                order.reverse();
            }
            assert_eq!(order, [(9, 40), (8, 20), (7, 10)], "newest first by each account's oldest link");
            let (mut walked, mut cursor) = (Vec::new(), None);
            loop {
                let (page, next) = page_after(&places, &params(1, cursor, reverse));
                walked.extend(page.iter().map(|(s, _)| s.did));
                match next {
                    Some(next) => cursor = Some(Cursor::decode(&next).unwrap()),
                    None => break,
                }
            }
            let expected: Vec<u64> = if reverse { vec![7, 8, 9] } else { vec![9, 8, 7] };
            assert_eq!(walked, expected, "reverse {reverse}");
        }
    }

    #[test]
    fn a_full_last_page_has_no_cursor_and_limit_zero_none_either() {
        let places = first_places(&[link(1, 5), link(2, 6)], false);
        let (page, cursor) = page_after(&places, &params(2, None, false));
        assert_eq!((page.len(), cursor), (2, None));
        let (page, cursor) = page_after(&places, &params(0, None, false));
        assert_eq!((page.len(), cursor), (0, None));
        let (page, cursor) = page_after(&places, &params(1, None, false));
        assert_eq!(page.len(), 1);
        let at = Cursor::decode(&cursor.unwrap()).unwrap();
        let inclusive = Cursor { inclusive: true, ..at };
        let (page, _) = page_after(&places, &params(5, Some(inclusive), false));
        assert_eq!(page.len(), 2, "an inclusive cursor starts at its own place");
    }
}
