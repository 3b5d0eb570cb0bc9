//! getBacklinkDids and `/links/distinct-dids`: the accounts that link to a target, each once over
//! all pages.
//!
//! Two orders, each with its own cursor:
//! - A target a count reads whole: an account's place in the list is its first link, the oldest
//!   live backlink it has to the target (among those the filters admit), by position
//!   (`(source, location)`, the order of listBacklinks). Accounts are listed newest first by that
//!   place (oldest first with `reverse`), as constellation lists them, and the cursor is the
//!   place of the page's last account, in listBacklinks' cursor format.
//! - A hot target (one with tallies, `index::tally`): its accounts are read from its account
//!   tallies (an account with a live link the filters admit), by account id: newest account to
//!   the index first (ids come from a sequence), oldest first with `reverse`. The cursor names the
//!   page's last account (a listBacklinks cursor whose source is the account's repository: a
//!   listBacklinks source is always a record).
//!
//! Invariants:
//! - Over the pages of one walk, an account comes out at most once, and every account whose
//!   place stays put comes out: each page takes the places strictly beyond the cursor, and an
//!   account has one place. (An account whose first link is deleted mid-walk moves to its next
//!   link, and may come out again; one that links for the first time behind the cursor is not
//!   listed, as a new backlink behind a listBacklinks cursor is not. An account id never moves.)
//! - The work is bounded. A target read whole costs a count (at most `exact_scan_limit`
//!   entries). A hot target's page reads its account tallies from the cursor on, whole accounts
//!   at a time (`lsm::range`): at most `MAX_DID_ROUNDS` rounds of about twice the page's entries
//!   a run, doubling up to `MAX_WANT_DOUBLINGS` times (a page cut short by the rounds has a
//!   cursor where they stopped); with `did` filters, one point read each. A target past the scan
//!   limit without tallies (promotion is asked for) is paged as listBacklinks pages it, distinct
//!   within a page only, and the answer says `"approximate"`.
//! - `limit` 0 answers the total with an empty page and no cursor. The total is the count's
//!   distinct accounts (exact for a hot target unless the filters name a union of groups).
//! - A cursor of one order given to a target that has changed kind since (a target that grew hot
//!   mid-walk, say) goes on as well as it can: an account cursor on a target read whole pages its
//!   accounts by id; a place cursor on a hot target pages as listBacklinks does (DIDs may repeat),
//!   and so does an account cursor on a target past the bound without tallies, from its start.

use super::{did_of, mark_estimate};
use crate::count::{CountOptions, TargetLinks, count_of, read_target};
use crate::index::Index;
use crate::lsm::range::Direction;
use crate::model::ids::{AccountTally, Backlink, RecordId, SELF_COLLECTION};
use crate::query::{Cursor, Filters, ListPage, ListParams, QueryError, list_backlinks};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::RangeInclusive;

/// Most reads one request makes to fill its page of DIDs on a target too hot to read whole.
pub const MAX_DID_ROUNDS: usize = 8;
/// A hot target's page reads about twice its size of account tallies in each run first, then
/// twice as many each round up to this many doublings (a page that filters leave short reads on
/// for up to `MAX_DID_ROUNDS` rounds: at most 94 times its size a run, then gives a cursor).
const MAX_WANT_DOUBLINGS: usize = 3;

/// A place in listBacklinks order: (source, location).
type Place = (RecordId, u64);

/// getBacklinkDids: `{"total", "linking_dids", "cursor"}`, `total` the distinct accounts over all
/// pages.
pub async fn get_backlink_dids(index: &Index, params: &ListParams, options: CountOptions) -> Result<Value, QueryError> {
    let links = read_target(index, params, options).await?;
    let after_account = params.cursor.as_ref().and_then(account_of_cursor);
    let place_cursor = params.cursor.is_some() && after_account.is_none();
    match links {
        TargetLinks::All(live) if after_account.is_none() => first_places_page(index, &live, params),
        TargetLinks::All(ref live) if after_account.is_some() => {
            let accounts: BTreeSet<u64> = live.iter().map(|link| link.source.did).collect();
            let (page, cursor) = page_of_accounts(accounts, params);
            respond(index, &page, cursor, &links)
        }
        TargetLinks::Tallied { target, ref filters, .. } if !place_cursor => {
            let (page, cursor) = hot_accounts_page(index, (target, filters), params).await?;
            respond(index, &page, cursor, &links)
        }
        TargetLinks::Sampled { .. } if after_account.is_some() => {
            let from_start = ListParams { cursor: None, ..params.clone() };
            listed_page(index, &from_start, &links).await
        }
        links => listed_page(index, params, &links).await,
    }
}

/// The page of a target read whole, in first-place order.
fn first_places_page(index: &Index, live: &[Backlink], params: &ListParams) -> Result<Value, QueryError> {
    let places = first_places(live, params.reverse);
    let (places_on_page, cursor) = page_after(&places, params);
    let ids: Vec<RecordId> = places_on_page.iter().map(|(source, _)| RecordId::repo(source.did)).collect();
    let dids = render_dids(index, &ids)?;
    Ok(json!({ "total": places.len(), "linking_dids": dids, "cursor": cursor }))
}

/// The answer for a page of accounts: the total is the count's distinct accounts.
fn respond(index: &Index, accounts: &[u64], cursor: Option<Cursor>, links: &TargetLinks) -> Result<Value, QueryError> {
    let ids: Vec<RecordId> = accounts.iter().map(|account| RecordId::repo(*account)).collect();
    let dids = render_dids(index, &ids)?;
    let count = count_of(index, links, &|location| Some(location.to_string()))?;
    let body = json!({ "total": count.distinct_dids, "linking_dids": dids, "cursor": cursor.map(|c| c.encode()) });
    Ok(mark_estimate(body, count.distinct_approximate))
}

/// The cursor after `account` in the accounts' order (at it, `inclusive`).
fn account_cursor(account: u64, inclusive: bool) -> Cursor {
    Cursor { source: RecordId::repo(account), location: 0, inclusive }
}

/// The account a cursor of the accounts' order names; `None` for a place (a record's).
fn account_of_cursor(cursor: &Cursor) -> Option<u64> {
    let source = cursor.source;
    (source.rkey == 0 && source.collection == SELF_COLLECTION).then_some(source.did)
}

/// The order in which a walk reads account ids: newest first, oldest first with `reverse`.
fn direction_of(params: &ListParams) -> Direction {
    if params.reverse { Direction::Ascending } else { Direction::Descending }
}

/// The account ids a page may take, beyond `params.cursor` (every one without); `None` when no
/// id is beyond it.
fn unread_accounts(params: &ListParams) -> Option<RangeInclusive<u64>> {
    let Some(cursor) = params.cursor.as_ref() else { return Some(0..=u64::MAX) };
    let at = account_of_cursor(cursor)?;
    match (direction_of(params), cursor.inclusive) {
        (Direction::Ascending, true) => Some(at..=u64::MAX),
        (Direction::Descending, true) => Some(0..=at),
        (Direction::Ascending, false) => at.checked_add(1).map(|from| from..=u64::MAX),
        (Direction::Descending, false) => at.checked_sub(1).map(|to| 0..=to),
    }
}

/// The accounts of `accounts` beyond the cursor that fill a page, and the cursor after them.
fn page_of_accounts(accounts: BTreeSet<u64>, params: &ListParams) -> (Vec<u64>, Option<Cursor>) {
    let Some(unread) = unread_accounts(params) else { return (Vec::new(), None) };
    let beyond: Vec<u64> = match direction_of(params) {
        Direction::Ascending => accounts.range(unread).copied().collect(),
        Direction::Descending => accounts.range(unread).rev().copied().collect(),
    };
    let page: Vec<u64> = beyond.iter().take(params.limit).copied().collect();
    let more = beyond.len() > page.len() && params.limit > 0;
    let cursor = page.last().filter(|_| more).map(|account| account_cursor(*account, false));
    (page, cursor)
}

/// A hot target's page of accounts, from its account tallies, and the cursor after it.
async fn hot_accounts_page(
    index: &Index,
    (target, filters): (RecordId, &Filters),
    params: &ListParams,
) -> Result<(Vec<u64>, Option<Cursor>), QueryError> {
    if params.limit == 0 {
        return Ok((Vec::new(), None));
    }
    let admits = |tally: &AccountTally| {
        tally.target() == target
            && tally.records > 0
            && filters.admits_group(tally.collection, tally.location)
            && !index.is_hidden(tally.account)
    };
    if let Some(dids) = filters.dids() {
        let found = index.account_tallies_of(target, dids).await?;
        return Ok(page_of_accounts(found.iter().filter(|t| admits(t)).map(|t| t.account).collect(), params));
    }
    let direction = direction_of(params);
    let Some(mut unread) = unread_accounts(params) else { return Ok((Vec::new(), None)) };
    let mut page: Vec<u64> = Vec::new();
    for round in 0..MAX_DID_ROUNDS {
        let want = params.limit.saturating_mul(2) << round.min(MAX_WANT_DOUBLINGS);
        let part = index.account_tallies_in(target, unread.clone(), direction, want).await?;
        for account in admitted_accounts(&part.entries, direction, &admits) {
            if page.len() == params.limit {
                return Ok((page.clone(), page.last().map(|last| account_cursor(*last, false))));
            }
            page.push(account);
        }
        // A part holds whole accounts, up to its frontier's, which it does not hold (`lsm::range`).
        let Some(frontier) = part.frontier else { return Ok((page, None)) };
        let at = AccountTally::account_of_key(frontier);
        unread = match direction {
            Direction::Ascending => at..=*unread.end(),
            Direction::Descending => *unread.start()..=at,
        };
    }
    // Rounds spent: the next page starts with the first account not read.
    let next = match direction {
        Direction::Ascending => *unread.start(),
        Direction::Descending => *unread.end(),
    };
    Ok((page, Some(account_cursor(next, true))))
}

/// The accounts of `tallies` (sorted, freshest) that `admits` one of, in reading order.
fn admitted_accounts(
    tallies: &[AccountTally],
    direction: Direction,
    admits: &dyn Fn(&AccountTally) -> bool,
) -> Vec<u64> {
    let mut accounts: Vec<u64> = Vec::new();
    for tally in tallies.iter().filter(|tally| admits(tally)) {
        if accounts.last() != Some(&tally.account) {
            accounts.push(tally.account);
        }
    }
    if direction == Direction::Descending {
        accounts.reverse();
    }
    accounts
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

/// A target too hot to read whole that has no tallies yet (or a walk that began before its
/// tallies): DIDs distinct within the page, in listBacklinks order, and its total. The answer
/// is `approximate`: a DID may come again on a later page.
async fn listed_page(index: &Index, params: &ListParams, sampled: &TargetLinks) -> Result<Value, QueryError> {
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

    /// By account id, newest first (oldest with `reverse`); a cursor continues after its account
    /// (at it when inclusive, as a hot page cut short by its rounds leaves it).
    #[test]
    fn accounts_page_by_id_after_their_cursor() {
        let accounts: BTreeSet<u64> = [3, 9, 4, 20, 11].into();
        for reverse in [false, true] {
            let (mut walked, mut cursor) = (Vec::new(), None);
            loop {
                let (page, next) = page_of_accounts(accounts.clone(), &params(2, cursor, reverse));
                assert!(page.len() <= 2);
                walked.extend(page);
                match next {
                    Some(next) => cursor = Some(Cursor::decode(&next.encode()).unwrap()),
                    None => break,
                }
            }
            let expected: Vec<u64> = if reverse { vec![3, 4, 9, 11, 20] } else { vec![20, 11, 9, 4, 3] };
            assert_eq!(walked, expected, "reverse {reverse}");
        }
        let at_nine = Some(account_cursor(9, true));
        assert_eq!(page_of_accounts(accounts.clone(), &params(2, at_nine, false)).0, [9, 4]);
        assert_eq!(page_of_accounts(accounts.clone(), &params(2, at_nine, true)).0, [9, 11]);
        let after_nine = Some(account_cursor(9, false));
        assert_eq!(page_of_accounts(accounts.clone(), &params(9, after_nine, true)), (vec![11, 20], None));
        assert_eq!(account_of_cursor(&account_cursor(9, false)), Some(9));
        let place = Cursor { source: RecordId { rkey: 5, collection: 1, did: 9 }, location: 1, inclusive: false };
        assert_eq!(account_of_cursor(&place), None, "a listBacklinks cursor names a record");
    }

    /// A hot post liked and reposted by 90 accounts (some only like it, some unlike it), over
    /// tables of four entries a frame, so that an account's two tallies often straddle two frames:
    /// pages of one or two DIDs, newest or oldest first, give every live account once, and the
    /// exact total, whatever the frames.
    #[test]
    fn a_hot_targets_accounts_come_once_whatever_its_frames() {
        use crate::index::IndexOptions;
        use crate::lsm::table::TableOptions;
        use crate::model::operation::{Operation, RecordOp, RecordRef};
        use crate::model::tid::format_tid;
        const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";
        let dir = tempfile::tempdir().unwrap();
        let table = TableOptions { frame_bytes: 4 * AccountTally::WIDTH, ..TableOptions::default() };
        let index = crate::index::open_in_dir(
            dir.path(),
            IndexOptions { table, hot_target_entries: 8, ..IndexOptions::default() },
        );
        let record_ref = |account: usize, collection: &'static str| RecordRef {
            did: format!("did:plc:{account:024}").into(),
            collection: collection.into(),
            rkey: format_tid(1_700_000_000_000_000 + account as u64).into(),
        };
        let subject = serde_json::json!({"subject": {"uri": POST, "cid": "bafyreib2rxk3rybloqtqwbo"}});
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let options = CountOptions { exact_scan_limit: 4 };
        // The likes: an account's repost sits beside its like among the post's account tallies.
        let base = ListParams::from_pairs([("target", POST), ("collection", "app.bsky.feed.like")]).unwrap();
        let mut live = BTreeSet::new();
        for account in 0..90 {
            for collection in
                ["app.bsky.feed.like", "app.bsky.feed.repost"].iter().take(1 + usize::from(account % 3 != 0))
            {
                let op = RecordOp { record_ref: record_ref(account, collection), record: subject.clone() };
                index.apply(&Operation::Create(op), None).unwrap();
            }
            match account % 7 {
                0 => index.apply(&Operation::Delete(record_ref(account, "app.bsky.feed.like")), None).unwrap(),
                _ => assert!(live.insert(format!("did:plc:{account:024}"))),
            }
            if account == 30 {
                // A count past its bound asks the next flush to promote the post.
                runtime.block_on(crate::count::read_target(&index, &base, options)).unwrap();
            }
            if account % 20 == 19 || account == 30 {
                index.flush().unwrap();
            }
        }
        index.flush().unwrap();
        let target = index.lookup_target(&crate::model::syntax::parse_target(POST).unwrap()).unwrap().unwrap();
        assert!(runtime.block_on(index.tallies_of(target)).unwrap().is_some(), "the post is hot");
        for (limit, reverse) in [(1, false), (1, true), (2, false), (2, true)] {
            let (mut walked, mut cursor) = (Vec::new(), None);
            for _ in 0..1_000 {
                let params = ListParams { limit, reverse, cursor, ..base.clone() };
                let page = runtime.block_on(get_backlink_dids(&index, &params, options)).unwrap();
                assert_eq!((page.get("approximate"), &page["total"]), (None, &json!(live.len())), "{page}");
                walked.extend(page["linking_dids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()));
                match page["cursor"].as_str() {
                    Some(next) => cursor = Some(Cursor::decode(next).unwrap()),
                    None => break,
                }
            }
            let once: BTreeSet<String> = walked.iter().cloned().collect();
            assert_eq!((walked.len(), &once), (live.len(), &live), "limit {limit}, reverse {reverse}");
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
