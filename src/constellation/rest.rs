//! Constellation's REST family, which most of its clients still call: `/links`, `/links/count`,
//! `/links/distinct-dids`, `/links/count/distinct-dids`, `/links/all` and `/links/all/count`.
//! They are the XRPC methods under other names: `target` for `subject`, `collection` and `path`
//! (`.subject.uri`) for `source`, `linking_records` for `records`, and the deprecated
//! `from_dids` (comma-separated) beside the repeatable `did`.
//!
//! Invariants:
//! - Parameters are validated as the XRPC methods' are (a bad one is a 400 InvalidRequest naming
//!   it); `did` and `from_dids` together are a 400, as in constellation.
//! - `/links/all` lists every (collection, path) with live links to the target, each with its
//!   records and distinct linking accounts; its path is the one spelling constellation stores
//!   (`constellation_path`). Its figures are countBacklinks', estimates marked `approximate`.

use super::parse_did;
use super::{DEFAULT_LIMIT, Source, get_backlink_dids, get_backlinks, get_backlinks_count, invalid, list_params};
use crate::count::{CountOptions, count_backlinks_named};
use crate::index::Index;
use crate::model::syntax::{LinkTarget, parse_target};
use crate::query::{ListParams, QueryError};
use serde_json::{Map, Value, json};

pub const LINKS: &str = "/links";
pub const LINKS_COUNT: &str = "/links/count";
pub const LINKS_DISTINCT_DIDS: &str = "/links/distinct-dids";
pub const LINKS_COUNT_DISTINCT_DIDS: &str = "/links/count/distinct-dids";
pub const LINKS_ALL: &str = "/links/all";
pub const LINKS_ALL_COUNT: &str = "/links/all/count";

/// Most accounts one `from_dids` may list (the `did` bound).
const MAX_FROM_DIDS: usize = super::MAX_DIDS;

/// Validated parameters of `/links` and its siblings (`target`, `collection`, `path`, `did`,
/// `from_dids`, `limit`, `cursor`, `reverse`), as listBacklinks parameters.
pub fn parse_links_query(pairs: &[(String, String)]) -> Result<ListParams, QueryError> {
    let (mut target, mut collection, mut path, mut from_dids) = (None, None, None, None);
    let mut dids = Vec::new();
    let mut paging: Vec<(&str, &str)> = Vec::new();
    for (name, value) in pairs {
        let once = |slot: &Option<&str>| match slot {
            Some(_) => Err(invalid(format!("{name} given more than once"))),
            None => Ok(Some(value.as_str())),
        };
        match name.as_str() {
            "target" => target = once(&target)?,
            "collection" => collection = once(&collection)?,
            "path" => path = once(&path)?,
            "from_dids" => from_dids = once(&from_dids)?,
            "did" => dids.push(parse_did(value)?),
            "limit" | "cursor" | "reverse" => paging.push((name.as_str(), value.as_str())),
            _ => {}
        }
    }
    let target = required(target, "target")?;
    let source = Source::of(required(collection, "collection")?, required(path, "path (like .subject.uri)")?)?;
    match from_dids.filter(|list| !list.is_empty()) {
        Some(_) if !dids.is_empty() => return Err(invalid("give did or from_dids, not both")),
        Some(list) => dids = parse_from_dids(list)?,
        None => {}
    }
    list_params(target, &source, dids, &paging)
}

fn required<'a>(slot: Option<&'a str>, name: &str) -> Result<&'a str, QueryError> {
    slot.ok_or_else(|| invalid(format!("missing required parameter: {name}")))
}

/// The deprecated `from_dids`: DIDs separated by commas (empty items skipped).
fn parse_from_dids(list: &str) -> Result<Vec<String>, QueryError> {
    let dids: Vec<String> =
        list.split(',').map(str::trim).filter(|d| !d.is_empty()).map(parse_did).collect::<Result<_, _>>()?;
    if dids.len() > MAX_FROM_DIDS {
        return Err(invalid(format!("at most {MAX_FROM_DIDS} DIDs in from_dids")));
    }
    Ok(dids)
}

/// The one parameter of `/links/all` and `/links/all/count`: `target`.
pub fn parse_target_query(pairs: &[(String, String)]) -> Result<ListParams, QueryError> {
    let mut targets = pairs.iter().filter(|(name, _)| name == "target").map(|(_, value)| value.as_str());
    let target = targets.next().ok_or_else(|| invalid("missing required parameter: target"))?;
    if targets.next().is_some() {
        return Err(invalid("target given more than once"));
    }
    let mut params = ListParams::from_pairs([("target", target)])?;
    params.limit = DEFAULT_LIMIT;
    Ok(params)
}

/// `/links`: `{"total", "linking_records": [{"did", "collection", "rkey"}], "cursor"}`.
pub async fn links(index: &Index, params: &ListParams, options: CountOptions) -> Result<Value, QueryError> {
    get_backlinks(index, params, options, "linking_records").await
}

/// `/links/count`: `{"total"}` records.
pub async fn links_count(index: &Index, params: &ListParams, options: CountOptions) -> Result<Value, QueryError> {
    get_backlinks_count(index, params, options, false).await
}

/// `/links/distinct-dids`: `{"total", "linking_dids", "cursor"}`, as getBacklinkDids.
pub async fn distinct_dids(index: &Index, params: &ListParams, options: CountOptions) -> Result<Value, QueryError> {
    get_backlink_dids(index, params, options).await
}

/// `/links/count/distinct-dids`: `{"total"}` distinct linking accounts.
pub async fn count_distinct_dids(
    index: &Index,
    params: &ListParams,
    options: CountOptions,
) -> Result<Value, QueryError> {
    get_backlinks_count(index, params, options, true).await
}

/// `/links/all`: `{"links": {collection: {path: {"records", "distinct_dids"}}}}`, or with
/// `records_only`, `/links/all/count`'s `{"links": {collection: {path: records}}}`.
pub async fn links_all(
    index: &Index,
    params: &ListParams,
    options: CountOptions,
    records_only: bool,
) -> Result<Value, QueryError> {
    let target_is_record = matches!(parse_target(&params.target), Ok(LinkTarget::Record { .. }));
    // Two of our locations can be one constellation path (`$.X` and `$.X.uri`): counted as one.
    let path_of = |location: &str| constellation_path(location, target_is_record);
    let count = count_backlinks_named(index, params, options, &path_of).await?;
    let mut links: Map<String, Value> = Map::new();
    for ((collection, path), figures) in &count.by_source {
        let path = path.clone();
        let value = match records_only {
            true => json!(figures.records),
            false => json!({ "records": figures.records, "distinct_dids": figures.distinct_dids }),
        };
        let paths = links.entry(collection.clone()).or_insert_with(|| Value::Object(Map::new()));
        paths.as_object_mut().expect("a collection holds an object of paths").insert(path, value);
    }
    let approximate = count.approximate || (!records_only && count.by_source_approximate);
    Ok(super::mark_estimate(json!({ "links": links }), approximate))
}

/// The path constellation would store for a link at our `location`: the location without `$`,
/// with `.uri` added when the target is a record, as for a strong reference (a link to an
/// account or a URL at `$.X` is a plain string). A plain at-uri field holding a record's URI is
/// `.X` in constellation and `.X.uri` here: our location does not say which it was. `None` for
/// the root (`$`).
pub fn constellation_path(location: &str, target_is_record: bool) -> Option<String> {
    let path = location.strip_prefix('$').filter(|p| !p.is_empty())?;
    if !target_is_record || path.ends_with(".uri") { Some(path.to_string()) } else { Some(format!("{path}.uri")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const POST: &str = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kaaaaaaaaaaa";
    const ALICE: &str = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
    const BOB: &str = "did:web:example.com";

    #[test]
    fn rest_queries_translate_to_list_parameters() {
        let base = [("target", POST), ("collection", "app.bsky.feed.like"), ("path", ".subject.uri")];
        let params = parse_links_query(&pairs(&base)).unwrap();
        assert_eq!((params.target.as_str(), params.limit), (POST, DEFAULT_LIMIT));
        assert_eq!(params.collections, ["app.bsky.feed.like"]);
        assert_eq!(params.locations, ["$.subject", "$.subject.uri"]);
        let with = |extra: &[(&str, &str)]| parse_links_query(&pairs(&[&base[..], extra].concat()));
        let from_dids = format!("{ALICE}, {BOB},");
        assert_eq!(with(&[("from_dids", &from_dids)]).unwrap().dids, [ALICE, BOB]);
        assert_eq!(with(&[("did", ALICE), ("from_dids", "")]).unwrap().dids, [ALICE], "an empty from_dids is absent");
        assert_eq!(with(&[("limit", "0")]).unwrap().limit, 0);
        let errors = [
            (with(&[("did", ALICE), ("from_dids", BOB)]), "not both"),
            (with(&[("from_dids", "alice")]), "invalid did"),
            (with(&[("limit", "1001")]), "limit must be"),
            (with(&[("target", POST)]), "target given more than once"),
            (parse_links_query(&pairs(&base[1..])), "missing required parameter: target"),
            (parse_links_query(&pairs(&[base[0], base[2]])), "missing required parameter: collection"),
            (parse_links_query(&pairs(&base[..2])), "missing required parameter: path"),
            (parse_links_query(&pairs(&[base[0], ("collection", "nope"), base[2]])), "invalid collection"),
        ];
        for (result, expected) in errors {
            match result {
                Err(QueryError::InvalidRequest(message)) => assert!(message.contains(expected), "{message}"),
                other => panic!("{expected}: {other:?}"),
            }
        }
        assert_eq!(parse_target_query(&pairs(&[("target", POST), ("x", "y")])).unwrap().target, POST);
        assert!(parse_target_query(&pairs(&[])).is_err());
        assert!(parse_target_query(&pairs(&[("target", "nope")])).is_err());
    }

    #[test]
    fn paths_are_spelled_as_constellation_stores_them() {
        assert_eq!(constellation_path("$.subject", true).unwrap(), ".subject.uri", "a strong reference");
        assert_eq!(constellation_path("$.subject", false).unwrap(), ".subject", "a follow's DID");
        assert_eq!(constellation_path("$.embed.external.uri", false).unwrap(), ".embed.external.uri");
        let mention = "$.facets[].features[app.bsky.richtext.facet#mention].did";
        assert_eq!(constellation_path(mention, false).unwrap(), &mention[1..]);
        assert_eq!(constellation_path("$.website", false).unwrap(), ".website", "a URL");
        assert_eq!(constellation_path("$", false), None);
        for (location, is_record) in [("$.subject", true), ("$.reply.parent", true), ("$.subject", false)] {
            let path = constellation_path(location, is_record).unwrap();
            assert!(
                super::super::locations_for_path(&path).unwrap().contains(&location.to_string()),
                "{path} asks for {location}"
            );
        }
    }
}
