//! Constellation-compatible endpoints, answered from the same index as listBacklinks, for the
//! clients that exist: the XRPC methods `blue.microcosm.links.getBacklinks`, `getBacklinksCount`
//! and `getBacklinkDids` here, the older REST family (`/links`, ...) in `rest`.
//!
//! Paths. Constellation names where a link sits with a path without `$` (`subject.uri`, also
//! written `.subject.uri`) in which a strong reference ends in `.uri`. Ours (docs/design.md) puts a strong
//! reference at the object's own path (`$.subject`) and keeps `.uri` only on a `uri` field of any
//! other object. So a constellation path ending in `.uri` stands for two of our locations, `$.X`
//! (a strong ref) and `$.X.uri` (a plain string field), and both are asked for; any other path
//! `X` is our `$.X`. The way back (`rest::constellation_path`) spells `$.X` as `.X.uri` for a
//! record target and `.X` for any other (a plain at-uri field such as a list item's `list` is
//! `.list` in constellation and `.list.uri` here; either finds it here).
//!
//! Invariants:
//! - The subject and where its links sit (`source` = `collection:path`, or REST's `collection`
//!   and `path`) are required; every parameter is validated and a bad one is a 400
//!   InvalidRequest naming it. An unknown subject is a 200 with nothing in it.
//! - `limit` is constellation's: default `DEFAULT_LIMIT`, 0..=`MAX_LIMIT`; 0 answers the totals
//!   with an empty page and no cursor.
//! - Work is bounded: at most `MAX_DIDS` `did` filters; getBacklinkDids reads what a count reads,
//!   plus at most `MAX_DID_ROUNDS` reads on a target too hot to read whole (`dids`).
//! - Totals come from countBacklinks with the same filters; an estimate adds `"approximate": true`
//!   (exact answers have exactly constellation's fields).

use crate::count::{CountOptions, count_backlinks, count_backlinks_named};
use crate::model::syntax::{parse_target, validate_did, validate_nsid};
use crate::query::{ListPage, ListParams, QueryError, list_backlinks};
use serde_json::{Value, json};

pub const GET_BACKLINKS: &str = "/xrpc/blue.microcosm.links.getBacklinks";
pub const GET_BACKLINKS_COUNT: &str = "/xrpc/blue.microcosm.links.getBacklinksCount";
pub const GET_BACKLINK_DIDS: &str = "/xrpc/blue.microcosm.links.getBacklinkDids";

mod dids;
pub mod many;
pub mod rest;

pub use dids::get_backlink_dids;

/// Constellation's default page size (since December 2025).
pub const DEFAULT_LIMIT: usize = 100;
/// Constellation's largest page, which is also listBacklinks'.
pub const MAX_LIMIT: usize = crate::query::MAX_LIMIT;
/// Most `did` filters one request may give.
pub const MAX_DIDS: usize = 64;
/// Longest path in `source`.
const MAX_PATH_BYTES: usize = 1024;

fn invalid(message: impl Into<String>) -> QueryError {
    QueryError::InvalidRequest(message.into())
}

/// Our locations for a constellation path (`subject.uri` or `.subject.uri`): see the module header.
pub fn locations_for_path(path: &str) -> Result<Vec<String>, QueryError> {
    let dotted = if path.starts_with('.') || path.starts_with('[') { path.to_string() } else { format!(".{path}") };
    let bad = |why: &str| invalid(format!("invalid path {path:?} in source: {why}"));
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err(bad("must be 1 to 1024 bytes"));
    }
    if dotted.contains("..") || dotted.ends_with('.') || dotted.chars().any(|c| c.is_whitespace() || c == '$') {
        return Err(bad("expected a path like subject.uri or reply.parent.uri"));
    }
    let plain = format!("${dotted}");
    match dotted.strip_suffix(".uri") {
        Some(strong_ref) if !strong_ref.is_empty() => Ok(vec![format!("${strong_ref}"), plain]),
        _ => Ok(vec![plain]),
    }
}

/// A parsed `source`: the collection and our candidate locations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub collection: String,
    pub locations: Vec<String>,
}

/// Parses `collection:path` (`app.bsky.feed.like:subject.uri`).
pub fn parse_source(text: &str) -> Result<Source, QueryError> {
    let Some((collection, path)) = text.split_once(':') else {
        return Err(invalid(format!(
            "invalid source {text:?}: expected collection:path, like app.bsky.feed.like:subject.uri"
        )));
    };
    Source::of(collection, path)
}

impl Source {
    /// A collection (an NSID) and a constellation path, both validated.
    pub fn of(collection: &str, path: &str) -> Result<Self, QueryError> {
        validate_nsid(collection).map_err(|e| invalid(format!("invalid collection {collection:?}: {e}")))?;
        Ok(Source { collection: collection.to_string(), locations: locations_for_path(path)? })
    }
}

/// Validated parameters of the three XRPC endpoints, as listBacklinks parameters.
pub fn parse_query(pairs: &[(String, String)]) -> Result<ListParams, QueryError> {
    let mut subject = None;
    let mut source = None;
    let mut dids = Vec::new();
    let mut paging: Vec<(&str, &str)> = Vec::new();
    for (name, value) in pairs {
        match name.as_str() {
            "subject" if subject.is_some() => return Err(invalid("subject given more than once")),
            "subject" => subject = Some(value.as_str()),
            "source" if source.is_some() => return Err(invalid("source given more than once")),
            "source" => source = Some(parse_source(value)?),
            "did" => dids.push(parse_did(value)?),
            "limit" | "cursor" | "reverse" => paging.push((name.as_str(), value.as_str())),
            _ => {}
        }
    }
    let subject = subject.ok_or_else(|| invalid("missing required parameter: subject"))?;
    let source = source.ok_or_else(|| {
        invalid("missing required parameter: source (collection:path, like app.bsky.feed.like:subject.uri)")
    })?;
    list_params(subject, &source, dids, &paging)
}

/// listBacklinks parameters for links to `subject` from `source`, from accounts `dids` (none: from
/// any), with constellation's `limit`, `cursor` and `reverse` in `paging`.
fn list_params(
    subject: &str,
    source: &Source,
    dids: Vec<String>,
    paging: &[(&str, &str)],
) -> Result<ListParams, QueryError> {
    parse_target(subject).map_err(|e| invalid(format!("invalid subject {subject:?}: {e}")))?;
    if dids.len() > MAX_DIDS {
        return Err(invalid(format!("at most {MAX_DIDS} did filters")));
    }
    let mut limit = DEFAULT_LIMIT;
    let mut translated = vec![("target", subject), ("collection", source.collection.as_str())];
    translated.extend(source.locations.iter().map(|l| ("location", l.as_str())));
    for &(name, value) in paging {
        match name {
            "limit" => limit = parse_limit(value)?,
            _ => translated.push((name, value)),
        }
    }
    let mut params = ListParams::from_pairs(translated)?;
    params.limit = limit;
    params.dids = dids;
    Ok(params)
}

/// Constellation's `limit`: 0..=`MAX_LIMIT` (0 asks for the totals alone).
fn parse_limit(value: &str) -> Result<usize, QueryError> {
    match value.parse::<usize>() {
        Ok(limit) if limit <= MAX_LIMIT => Ok(limit),
        _ => Err(invalid(format!("limit must be an integer from 0 to {MAX_LIMIT}, got {value:?}"))),
    }
}

fn parse_did(value: &str) -> Result<String, QueryError> {
    validate_did(value).map_err(|e| invalid(format!("invalid did {value:?}: {e}")))?;
    Ok(value.to_string())
}

/// `at://DID/COLLECTION/RKEY` -> `{"did", "collection", "rkey"}`.
fn record_json(uri: &str) -> Result<Value, QueryError> {
    let parts: Vec<&str> = uri.strip_prefix("at://").map(|rest| rest.splitn(3, '/').collect()).unwrap_or_default();
    match parts.as_slice() {
        [did, collection, rkey] => Ok(json!({ "did": did, "collection": collection, "rkey": rkey })),
        _ => Err(QueryError::Internal(format!("source {uri:?} is not a record URI"))),
    }
}

fn did_of(uri: &str) -> Result<&str, QueryError> {
    uri.strip_prefix("at://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| QueryError::Internal(format!("source {uri:?} is not an at:// URI")))
}

/// Adds `"approximate": true` to an estimate; exact answers keep constellation's exact shape.
fn mark_estimate(mut body: Value, approximate: bool) -> Value {
    if approximate {
        body["approximate"] = Value::Bool(true);
    }
    body
}

/// getBacklinks: `{"total", "records": [{"did", "collection", "rkey"}], "cursor"}`; REST's `/links`
/// names its list `records_key`.
pub async fn get_backlinks(
    index: &crate::index::Index,
    params: &ListParams,
    options: CountOptions,
    records_key: &str,
) -> Result<Value, QueryError> {
    let page = match params.limit {
        0 => ListPage::default(),
        _ => list_backlinks(index, params).await?,
    };
    let count = count_backlinks(index, params, options).await?;
    let records: Vec<Value> = page.items.iter().map(|(_, uri)| record_json(uri)).collect::<Result<_, _>>()?;
    let body = json!({ "total": count.total, records_key: records, "cursor": page.cursor });
    Ok(mark_estimate(body, count.approximate))
}

/// getBacklinksCount: `{"total"}` (of records, or with `distinct` of linking accounts).
pub async fn get_backlinks_count(
    index: &crate::index::Index,
    params: &ListParams,
    options: CountOptions,
    distinct: bool,
) -> Result<Value, QueryError> {
    if distinct {
        let count = count_backlinks_named(index, params, options, &|l| Some(l.into())).await?;
        return Ok(mark_estimate(json!({ "total": count.distinct_dids }), count.distinct_approximate));
    }
    let count = count_backlinks(index, params, options).await?;
    Ok(mark_estimate(json!({ "total": count.total }), count.approximate))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";

    #[test]
    fn paths_map_to_locations_and_back() {
        assert_eq!(locations_for_path("subject.uri").unwrap(), ["$.subject", "$.subject.uri"]);
        assert_eq!(locations_for_path(".subject.uri").unwrap(), ["$.subject", "$.subject.uri"]);
        assert_eq!(locations_for_path("subject").unwrap(), ["$.subject"]);
        assert_eq!(locations_for_path(".reply.parent.uri").unwrap(), ["$.reply.parent", "$.reply.parent.uri"]);
        assert_eq!(locations_for_path("uri").unwrap(), ["$.uri"]);
        let facet = ".facets[].features[app.bsky.richtext.facet#mention].did";
        assert_eq!(locations_for_path(facet).unwrap(), [format!("${facet}")]);
        for bad in ["", ".", "a..b", "a.", "$.subject", "sub ject"] {
            assert!(locations_for_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sources_split_at_the_first_colon() {
        let source = parse_source("app.bsky.feed.like:subject.uri").unwrap();
        assert_eq!(source.collection, "app.bsky.feed.like");
        assert_eq!(source.locations, ["$.subject", "$.subject.uri"]);
        let message = |r: Result<Source, QueryError>| match r {
            Err(QueryError::InvalidRequest(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(message(parse_source("app.bsky.feed.like")).contains("expected collection:path"));
        assert!(message(parse_source("not an nsid:subject")).contains("invalid collection"));
        assert!(message(parse_source("app.bsky.feed.like:")).contains("invalid path"));
    }

    #[test]
    fn queries_translate_to_list_parameters() {
        let query = pairs(&[
            ("subject", POST),
            ("source", "app.bsky.feed.like:subject.uri"),
            ("did", "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"),
            ("did", "did:web:example.com"),
            ("reverse", "true"),
            ("ignored", "x"),
        ]);
        let params = parse_query(&query).unwrap();
        assert_eq!(params.target, POST);
        assert_eq!(params.collections, ["app.bsky.feed.like"]);
        assert_eq!(params.locations, ["$.subject", "$.subject.uri"]);
        assert_eq!(params.dids, ["did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", "did:web:example.com"]);
        assert_eq!((params.limit, params.reverse, params.cursor), (DEFAULT_LIMIT, true, None));
        let with_limit = |limit| pairs(&[("subject", POST), ("source", "a.b.c:x"), ("limit", limit)]);
        assert_eq!(parse_query(&with_limit("1000")).unwrap().limit, 1000);
        assert_eq!(parse_query(&with_limit("0")).unwrap().limit, 0, "the totals alone");
        let errors = [
            (pairs(&[("source", "a.b.c:x")]), "missing required parameter: subject"),
            (pairs(&[("subject", POST)]), "missing required parameter: source"),
            (pairs(&[("subject", "nope"), ("source", "a.b.c:x")]), "invalid subject"),
            (pairs(&[("subject", POST), ("source", "a.b.c:x"), ("did", "bob")]), "invalid did"),
            (pairs(&[("subject", POST), ("source", "a.b.c:x"), ("limit", "-1")]), "limit must be"),
            (pairs(&[("subject", POST), ("source", "a.b.c:x"), ("limit", "1001")]), "limit must be"),
            (pairs(&[("subject", POST), ("subject", POST), ("source", "a.b.c:x")]), "more than once"),
        ];
        for (query, expected) in errors {
            match parse_query(&query) {
                Err(QueryError::InvalidRequest(message)) => assert!(message.contains(expected), "{message}"),
                other => panic!("{query:?}: {other:?}"),
            }
        }
        let too_many: Vec<(String, String)> = pairs(&[("subject", POST), ("source", "a.b.c:x")])
            .into_iter()
            .chain((0..=MAX_DIDS).map(|i| ("did".to_string(), format!("did:plc:{i:024}"))))
            .collect();
        assert!(parse_query(&too_many).is_err());
    }

    #[test]
    fn record_uris_split_into_their_parts() {
        let uri = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.like/3kaaaaaaaaaaa";
        let expected = json!({"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "collection": "app.bsky.feed.like", "rkey": "3kaaaaaaaaaaa"});
        assert_eq!(record_json(uri).unwrap(), expected);
        assert_eq!(did_of(uri).unwrap(), "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");
        assert!(record_json("at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa").is_err());
    }
}
