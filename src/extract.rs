//! Links in a record: every string that is an `at://` URI, a DID or an `http(s)://` URL, with its
//! location (docs/design.md, "Which strings are links" and "Locations").
//!
//! Invariants:
//! - A location is the JSON path to the link, rooted at `$`: `.key` per object field, `[]` per
//!   array element, or `[T]` when the element is an object whose `$type` is the string `T`. Keys
//!   are copied verbatim (no quoting).
//! - A strong reference (an object whose keys are exactly `uri` and `cid`, optionally with `$type`,
//!   and whose `uri` is a string) yields at most one link, at the object's own path. A `uri` field
//!   of any other object is an ordinary field (`.uri`).
//! - Values of the reserved keys `$type`, `$link` (CIDs) and `$bytes` are never links; nothing
//!   inside a string is parsed (classification is of whole strings only).
//! - Each (target, location) appears once in the result, in first-seen order.
//! - The work is bounded: values deeper than `max_depth` (capped at [`MAX_DEPTH_CAP`]) are not
//!   visited, at most `max_links` links are returned, no location is longer than
//!   `max_location_len`; everything left out is counted in [`ExtractStats`]. Memory is the one
//!   reused location buffer, one `String` per returned link, and a dedup index over the returned
//!   links. Nothing panics, whatever the input.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::BuildHasher;

use serde_json::{Map, Value};

use crate::model::syntax::{Classified, LinkTarget, classify_link};

/// Recursion depth never exceeded, whatever `ExtractLimits::max_depth` says: the walk recurses once
/// per nesting level, and this keeps its stack use to tens of kilobytes on any thread.
pub const MAX_DEPTH_CAP: usize = 256;

/// Reserved data-model keys whose values are never links: a record's or object's type NSID, a CID
/// link, and base64 bytes.
const RESERVED_KEYS: [&str; 3] = ["$type", "$link", "$bytes"];

/// Bounds on the work done for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Deepest nesting visited; the record itself is depth 0, its fields depth 1.
    pub max_depth: usize,
    /// Most links returned for one record.
    pub max_links: usize,
    /// Longest location, in bytes, including the leading `$`.
    pub max_location_len: usize,
}

impl Default for ExtractLimits {
    /// - depth 32: the deepest app.bsky records (a post quoting with media, facets) nest under 10
    ///   levels; 32 leaves room for other lexicons while bounding recursion.
    /// - 512 links: a post with the maximum number of mentions stays far below it, and one record can
    ///   then add at most 32 KiB of 64-byte entries to the index.
    /// - 256-byte locations: real locations are under 80 bytes; each distinct location becomes a row
    ///   of the location outline table forever, so a record must not be able to add huge ones.
    fn default() -> Self {
        Self { max_depth: 32, max_links: 512, max_location_len: 256 }
    }
}

/// One link found in a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link<'a> {
    pub target: LinkTarget<'a>,
    pub location: String,
}

/// What was seen but not returned; each counter is exact for the record.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExtractStats {
    /// `at://DID/COLLECTION` strings (no record key): valid, not indexed.
    pub collection_only: u32,
    /// At-uris with a handle authority: valid, not indexed.
    pub handle_authority: u32,
    /// Links found after `max_links` links were taken, except duplicates of taken links. Dropped
    /// links are not remembered (that memory would grow with the record), so a dropped link that
    /// occurs twice counts twice.
    pub over_link_limit: u32,
    /// Strings, arrays and objects not visited because they are deeper than `max_depth`.
    pub too_deep: u32,
    /// Links whose location would be longer than `max_location_len`.
    pub location_too_long: u32,
}

/// The links of one record, borrowing their targets from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction<'a> {
    pub links: Vec<Link<'a>>,
    pub stats: ExtractStats,
}

/// Finds every link in `record`, within `limits`.
pub fn extract_links<'a>(record: &'a Value, limits: &ExtractLimits) -> Extraction<'a> {
    let mut walker = Walker::new(limits);
    walker.visit(record, 0, false, Segment::Here);
    debug_assert_eq!(walker.location, "$", "every pushed segment is truncated again");
    Extraction { links: walker.links.into_links(), stats: walker.stats }
}

/// The step from a value to one of its children, appended to the location when needed.
#[derive(Debug, Clone, Copy)]
enum Segment<'a> {
    /// The value itself (the root, or a strong reference's own path): nothing to append.
    Here,
    /// `.key`
    Field(&'a str),
    /// `[]`, or `[T]` for an object element whose `$type` is `T`.
    Element(Option<&'a str>),
}

impl<'a> Segment<'a> {
    fn element(item: &'a Value) -> Self {
        Segment::Element(item.as_object().and_then(|map| map.get("$type")).and_then(Value::as_str))
    }

    fn len(&self) -> usize {
        match self {
            Segment::Here => 0,
            Segment::Field(key) => 1 + key.len(),
            Segment::Element(element_type) => 2 + element_type.map_or(0, str::len),
        }
    }

    fn push_onto(&self, location: &mut String) {
        match self {
            Segment::Here => {}
            Segment::Field(key) => {
                location.push('.');
                location.push_str(key);
            }
            Segment::Element(element_type) => {
                location.push('[');
                location.push_str(element_type.unwrap_or_default());
                location.push(']');
            }
        }
    }
}

struct Walker<'a, 'l> {
    limits: &'l ExtractLimits,
    /// `limits.max_depth`, capped at [`MAX_DEPTH_CAP`].
    max_depth: usize,
    /// The location of the value being visited; never longer than `limits.max_location_len`
    /// (except the initial `$` when that limit is 0).
    location: String,
    links: LinkSet<'a>,
    stats: ExtractStats,
}

impl<'a, 'l> Walker<'a, 'l> {
    fn new(limits: &'l ExtractLimits) -> Self {
        let mut location = String::with_capacity(limits.max_location_len.clamp(1, 1024));
        location.push('$');
        Self {
            limits,
            max_depth: limits.max_depth.min(MAX_DEPTH_CAP),
            location,
            links: LinkSet::default(),
            stats: ExtractStats::default(),
        }
    }

    /// Visits `value`, reached from the current location by `segment`. `overlong` says that an
    /// ancestor's segment did not fit, so no link below can get its true location.
    fn visit(&mut self, value: &'a Value, depth: usize, overlong: bool, segment: Segment<'a>) {
        if !matches!(value, Value::String(_) | Value::Array(_) | Value::Object(_)) {
            return;
        }
        if depth > self.max_depth {
            bump(&mut self.stats.too_deep);
            return;
        }
        match value {
            Value::String(text) => self.consider(text, overlong, segment),
            Value::Array(items) => self.enter(overlong, segment, |walker, overlong| {
                for item in items {
                    walker.visit(item, depth + 1, overlong, Segment::element(item));
                }
            }),
            Value::Object(map) => self.enter(overlong, segment, |walker, overlong| {
                walker.visit_fields(map, depth, overlong);
            }),
            _ => {}
        }
    }

    /// Runs `visit_children` with `segment` appended to the location, then restores the location.
    fn enter(&mut self, overlong: bool, segment: Segment<'a>, visit_children: impl FnOnce(&mut Self, bool)) {
        let mark = self.location.len();
        let fits = !overlong && self.push_segment(segment);
        visit_children(self, !fits);
        self.location.truncate(mark);
    }

    fn visit_fields(&mut self, map: &'a Map<String, Value>, depth: usize, overlong: bool) {
        if let Some(uri) = strong_ref_uri(map) {
            self.consider(uri, overlong, Segment::Here);
            return;
        }
        for (key, child) in map {
            if !RESERVED_KEYS.contains(&key.as_str()) {
                self.visit(child, depth + 1, overlong, Segment::Field(key));
            }
        }
    }

    /// Classifies one string; the location is only built for actual links.
    fn consider(&mut self, text: &'a str, overlong: bool, segment: Segment<'a>) {
        match classify_link(text) {
            Classified::NotALink => {}
            Classified::CollectionOnly => bump(&mut self.stats.collection_only),
            Classified::HandleAuthority => bump(&mut self.stats.handle_authority),
            Classified::Link(target) => self.enter(overlong, segment, |walker, overlong| {
                if overlong {
                    bump(&mut walker.stats.location_too_long);
                } else {
                    walker.add(target);
                }
            }),
        }
    }

    /// Adds `target` at the current location unless it is a duplicate or the record is full.
    fn add(&mut self, target: LinkTarget<'a>) {
        if self.links.contains(&target, &self.location) {
            return;
        }
        if self.links.len() >= self.limits.max_links {
            bump(&mut self.stats.over_link_limit);
            return;
        }
        self.links.push(Link { target, location: self.location.clone() });
    }

    /// Appends `segment` if the location stays within the limit; says whether it did.
    fn push_segment(&mut self, segment: Segment<'a>) -> bool {
        if self.location.len() + segment.len() > self.limits.max_location_len {
            return false;
        }
        segment.push_onto(&mut self.location);
        debug_assert!(self.location.len() <= self.limits.max_location_len);
        true
    }
}

/// The `uri` of a strong reference: keys exactly `uri` and `cid`, optionally `$type`, and a string
/// `uri`. Checks the key count first, so most objects are rejected without a lookup.
fn strong_ref_uri(map: &Map<String, Value>) -> Option<&str> {
    if !(2..=3).contains(&map.len()) {
        return None;
    }
    let type_keys = usize::from(map.contains_key("$type"));
    if map.len() != 2 + type_keys || !map.contains_key("cid") {
        return None;
    }
    map.get("uri")?.as_str()
}

/// Counters saturate: a stat must never be the thing that panics on a hostile record.
fn bump(counter: &mut u32) {
    *counter = counter.saturating_add(1);
}

/// Links at or above this count are also indexed by fingerprint. Below it a linear scan is faster
/// than hashing, and allocates nothing; typical records hold one to a few links.
const INDEX_FROM: usize = 16;

/// Links in first-seen order, with duplicate checks that stay O(1) for records with many links.
#[derive(Default)]
struct LinkSet<'a> {
    links: Vec<Link<'a>>,
    /// Fingerprint of (target, location) -> index of the first link with it; empty until
    /// `links.len()` reaches [`INDEX_FROM`]. The map's own randomly keyed hasher makes the
    /// fingerprints, so a record cannot be crafted to collide them.
    by_fingerprint: HashMap<u64, usize>,
}

impl<'a> LinkSet<'a> {
    fn len(&self) -> usize {
        self.links.len()
    }

    fn contains(&self, target: &LinkTarget<'a>, location: &str) -> bool {
        if self.links.len() < INDEX_FROM {
            return self.scan(target, location);
        }
        match self.by_fingerprint.get(&self.fingerprint(target, location)) {
            None => false,
            // A different link under the same fingerprint is a 64-bit collision: fall back to a scan.
            Some(&index) => is_same(&self.links[index], target, location) || self.scan(target, location),
        }
    }

    fn push(&mut self, link: Link<'a>) {
        self.links.push(link);
        match self.links.len().cmp(&INDEX_FROM) {
            Ordering::Less => {}
            Ordering::Equal => (0..INDEX_FROM).for_each(|index| self.index(index)),
            Ordering::Greater => self.index(self.links.len() - 1),
        }
    }

    fn index(&mut self, index: usize) {
        let link = &self.links[index];
        let fingerprint = self.fingerprint(&link.target, &link.location);
        self.by_fingerprint.entry(fingerprint).or_insert(index);
    }

    fn scan(&self, target: &LinkTarget<'a>, location: &str) -> bool {
        self.links.iter().any(|link| is_same(link, target, location))
    }

    fn fingerprint(&self, target: &LinkTarget<'a>, location: &str) -> u64 {
        self.by_fingerprint.hasher().hash_one((target, location))
    }

    fn into_links(self) -> Vec<Link<'a>> {
        self.links
    }
}

fn is_same(link: &Link<'_>, target: &LinkTarget<'_>, location: &str) -> bool {
    link.target == *target && link.location == location
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALICE: &str = "did:plc:vfnmgxg2yscfliemmcxzyfyh";
    const BOB: &str = "did:plc:j76trmiofvaxxpvx2vnb2vwf";
    const POST: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
    const CID: &str = "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em";

    fn post_target() -> LinkTarget<'static> {
        LinkTarget::Record { did: ALICE, collection: "app.bsky.feed.post", rkey: "3mmoodizfwc2j" }
    }

    fn link<'a>(target: LinkTarget<'a>, location: &str) -> Link<'a> {
        Link { target, location: location.to_string() }
    }

    fn extract(record: &Value) -> Extraction<'_> {
        extract_links(record, &ExtractLimits::default())
    }

    /// Extracts with default limits and asserts that nothing was skipped.
    fn clean_links(record: &Value) -> Vec<Link<'_>> {
        let extraction = extract(record);
        assert_eq!(extraction.stats, ExtractStats::default());
        extraction.links
    }

    #[test]
    fn like_and_repost_subjects_are_strong_refs() {
        for collection in ["app.bsky.feed.like", "app.bsky.feed.repost"] {
            let record = json!({
                "$type": collection,
                "createdAt": "2026-05-25T14:23:28.778Z",
                "subject": {"cid": CID, "uri": POST},
            });
            assert_eq!(clean_links(&record), vec![link(post_target(), "$.subject")]);
        }
    }

    #[test]
    fn reply_parent_and_root() {
        let root = "at://did:plc:j76trmiofvaxxpvx2vnb2vwf/app.bsky.feed.post/3mmojbrjwbs26";
        let record = json!({
            "$type": "app.bsky.feed.post",
            "text": "hi",
            "reply": {"parent": {"cid": CID, "uri": POST}, "root": {"cid": CID, "uri": root}},
        });
        let root_target = LinkTarget::Record { did: BOB, collection: "app.bsky.feed.post", rkey: "3mmojbrjwbs26" };
        assert_eq!(
            clean_links(&record),
            vec![link(post_target(), "$.reply.parent"), link(root_target, "$.reply.root")]
        );
    }

    #[test]
    fn quote_and_quote_with_media() {
        let quote = json!({
            "$type": "app.bsky.feed.post",
            "embed": {"$type": "app.bsky.embed.record", "record": {"cid": CID, "uri": POST}},
        });
        assert_eq!(clean_links(&quote), vec![link(post_target(), "$.embed.record")]);

        let with_media = json!({
            "$type": "app.bsky.feed.post",
            "embed": {
                "$type": "app.bsky.embed.recordWithMedia",
                "media": {"$type": "app.bsky.embed.images", "images": [{
                    "alt": "at://did:plc:vfnmgxg2yscfliemmcxzyfyh is in the text",
                    "image": {"$type": "blob", "ref": {"$link": CID}, "mimeType": "image/png", "size": 1},
                }]},
                "record": {"$type": "app.bsky.embed.record", "record": {"cid": CID, "uri": POST}},
            },
        });
        assert_eq!(clean_links(&with_media), vec![link(post_target(), "$.embed.record.record")]);
    }

    #[test]
    fn facet_mentions_use_the_feature_type() {
        let mention = json!({"$type": "app.bsky.richtext.facet#mention", "did": ALICE});
        let web_link = json!({"$type": "app.bsky.richtext.facet#link", "uri": "https://bsky.app"});
        let index = json!({"byteStart": 0, "byteEnd": 5});
        let record = json!({
            "$type": "app.bsky.feed.post",
            "facets": [
                {"index": index, "features": [mention]},
                {"$type": "app.bsky.richtext.facet", "index": index, "features": [web_link, mention]},
            ],
        });
        assert_eq!(
            clean_links(&record),
            vec![
                link(LinkTarget::Did(ALICE), "$.facets[].features[app.bsky.richtext.facet#mention].did"),
                link(
                    LinkTarget::Url("https://bsky.app"),
                    "$.facets[app.bsky.richtext.facet].features[app.bsky.richtext.facet#link].uri"
                ),
                link(
                    LinkTarget::Did(ALICE),
                    "$.facets[app.bsky.richtext.facet].features[app.bsky.richtext.facet#mention].did"
                ),
            ]
        );
    }

    #[test]
    fn follow_and_block_subjects_are_bare_dids() {
        for collection in ["app.bsky.graph.follow", "app.bsky.graph.block"] {
            let record = json!({"$type": collection, "subject": ALICE, "createdAt": "2026-05-25T14:23:27.319Z"});
            assert_eq!(clean_links(&record), vec![link(LinkTarget::Did(ALICE), "$.subject")]);
        }
    }

    #[test]
    fn list_item_links_the_list_and_the_account() {
        let record = json!({
            "$type": "app.bsky.graph.listitem",
            "subject": BOB,
            "list": "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.graph.list/3mmoojp7etg2g",
        });
        let list = LinkTarget::Record { did: ALICE, collection: "app.bsky.graph.list", rkey: "3mmoojp7etg2g" };
        assert_eq!(clean_links(&record), vec![link(list, "$.list"), link(LinkTarget::Did(BOB), "$.subject")]);
    }

    #[test]
    fn did_uri_is_a_did_target() {
        let record = json!({"pinned": "at://did:plc:vfnmgxg2yscfliemmcxzyfyh"});
        assert_eq!(clean_links(&record), vec![link(LinkTarget::Did(ALICE), "$.pinned")]);
    }

    #[test]
    fn uri_field_outside_a_strong_ref_keeps_its_name() {
        let record = json!({
            "external": {"uri": POST, "title": "a post"},
            "almost": {"uri": POST, "cid": CID, "extra": 1},
            "noCid": {"uri": POST},
        });
        assert_eq!(
            clean_links(&record),
            vec![
                link(post_target(), "$.almost.uri"),
                link(post_target(), "$.external.uri"),
                link(post_target(), "$.noCid.uri"),
            ]
        );
    }

    #[test]
    fn typed_strong_ref_is_still_one_link() {
        let record = json!({"subject": {"$type": "com.atproto.repo.strongRef", "uri": POST, "cid": CID}});
        assert_eq!(clean_links(&record), vec![link(post_target(), "$.subject")]);
        let items = json!({"items": [{"$type": "com.atproto.repo.strongRef", "uri": POST, "cid": CID}]});
        assert_eq!(clean_links(&items), vec![link(post_target(), "$.items[com.atproto.repo.strongRef]")]);
    }

    #[test]
    fn handle_authority_and_collection_only_are_counted_not_linked() {
        let record = json!({
            "subject": {"cid": CID, "uri": "at://bsky.app/app.bsky.feed.post/3mmoodizfwc2j"},
            "profile": "at://bsky.app",
            "feeds": "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.generator",
            "other": ["at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post"],
        });
        let extraction = extract(&record);
        assert_eq!(extraction.links, vec![]);
        assert_eq!(extraction.stats, ExtractStats { collection_only: 2, handle_authority: 2, ..Default::default() });
    }

    #[test]
    fn reserved_keys_and_cids_are_never_links() {
        let record = json!({
            "$type": "did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "cidLink": {"$link": ALICE},
            "bytes": {"$bytes": ALICE},
            "nested": {"$type": POST, "cid": CID},
            "blob": {"$type": "blob", "ref": {"$link": CID}, "mimeType": "image/jpeg", "size": 3},
        });
        assert_eq!(clean_links(&record), vec![]);
    }

    #[test]
    fn strings_are_not_searched_inside() {
        let record = json!({
            "text": format!("look at {POST}"),
            "url": "see https://bsky.app/profile/did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "query": format!("{POST}?x=1"),
            "fragment": format!("{POST}#x"),
            "deeper": format!("{POST}/more"),
        });
        assert_eq!(clean_links(&record), vec![]);
    }

    #[test]
    fn duplicates_collapse_but_distinct_locations_stay() {
        let record = json!({
            "a": [ALICE, BOB, ALICE, format!("at://{ALICE}")],
            "b": ALICE,
        });
        assert_eq!(
            clean_links(&record),
            vec![
                link(LinkTarget::Did(ALICE), "$.a[]"),
                link(LinkTarget::Did(BOB), "$.a[]"),
                link(LinkTarget::Did(ALICE), "$.b"),
            ]
        );
    }

    #[test]
    fn duplicates_collapse_past_the_index_threshold() {
        let dids: Vec<String> = (0..400).map(|n| format!("did:plc:{n:024}")).collect();
        let doubled: Vec<&String> = dids.iter().chain(dids.iter()).collect();
        let record = json!({ "members": doubled });
        let links = clean_links(&record);
        assert_eq!(links.len(), 400);
        for (link, did) in links.iter().zip(&dids) {
            assert_eq!(link.target, LinkTarget::Did(did));
            assert_eq!(link.location, "$.members[]");
        }
    }

    #[test]
    fn root_values_have_location_dollar() {
        assert_eq!(clean_links(&json!(ALICE)), vec![link(LinkTarget::Did(ALICE), "$")]);
        assert_eq!(clean_links(&json!({"uri": POST, "cid": CID})), vec![link(post_target(), "$")]);
        assert_eq!(clean_links(&json!([[ALICE]])), vec![link(LinkTarget::Did(ALICE), "$[][]")]);
        assert_eq!(clean_links(&json!(null)), vec![]);
    }

    #[test]
    fn keys_are_copied_verbatim() {
        let record = json!({"a.b[c]": {"": ALICE}});
        assert_eq!(clean_links(&record), vec![link(LinkTarget::Did(ALICE), "$.a.b[c].")]);
    }

    /// `{"next": {"next": ... {"next": ALICE} ...}}` with `levels` objects, plus `ALICE` at `$.top`.
    fn nested(levels: usize) -> Value {
        let mut value = json!(ALICE);
        for _ in 0..levels {
            value = json!({ "next": value });
        }
        value.as_object_mut().expect("levels > 0").insert("top".into(), json!(ALICE));
        value
    }

    #[test]
    fn depth_limit_stops_descending_and_counts() {
        let record = nested(1_000);
        let extraction = extract(&record);
        assert_eq!(extraction.links, vec![link(LinkTarget::Did(ALICE), "$.top")]);
        assert_eq!(extraction.stats, ExtractStats { too_deep: 1, ..Default::default() });

        // A limit above the hard cap is capped, so the stack stays bounded.
        let huge = ExtractLimits { max_depth: 1_000_000, max_location_len: 1_000_000, ..Default::default() };
        let extraction = extract_links(&record, &huge);
        assert_eq!(extraction.links.len(), 1);
        assert_eq!(extraction.stats, ExtractStats { too_deep: 1, ..Default::default() });
    }

    #[test]
    fn depth_limit_is_inclusive() {
        // The DID string sits at depth 3 (object, object, string).
        let record = nested(3);
        let at_limit = ExtractLimits { max_depth: 3, ..Default::default() };
        let extraction = extract_links(&record, &at_limit);
        assert_eq!(extraction.links.len(), 2);
        assert_eq!(extraction.links[0].location, "$.next.next.next");
        let below = ExtractLimits { max_depth: 2, ..Default::default() };
        let extraction = extract_links(&record, &below);
        assert_eq!(extraction.links, vec![link(LinkTarget::Did(ALICE), "$.top")]);
        assert_eq!(extraction.stats.too_deep, 1);
    }

    #[test]
    fn link_limit_keeps_the_first_links_and_counts_the_rest() {
        let dids: Vec<String> = (0..100_000).map(|n| format!("did:plc:{n:024}")).collect();
        let record = json!({ "subjects": dids });
        let extraction = extract(&record);
        assert_eq!(extraction.links.len(), 512);
        assert_eq!(extraction.links[0], link(LinkTarget::Did(&dids[0]), "$.subjects[]"));
        assert_eq!(extraction.links[511], link(LinkTarget::Did(&dids[511]), "$.subjects[]"));
        assert_eq!(extraction.stats, ExtractStats { over_link_limit: 100_000 - 512, ..Default::default() });
    }

    #[test]
    fn duplicates_of_kept_links_are_not_counted_past_the_limit() {
        let limits = ExtractLimits { max_links: 1, ..Default::default() };
        let record = json!({"a": [ALICE, ALICE, BOB, BOB, ALICE]});
        let extraction = extract_links(&record, &limits);
        assert_eq!(extraction.links, vec![link(LinkTarget::Did(ALICE), "$.a[]")]);
        // Dropped links are not remembered, so BOB counts twice; ALICE is kept, so its copies don't count.
        assert_eq!(extraction.stats.over_link_limit, 2);
    }

    #[test]
    fn overlong_locations_are_skipped_and_counted() {
        let long_key = "k".repeat(300);
        let record = json!({
            long_key.clone(): {"deeper": [ALICE, BOB], "ignored": 5},
            "short": ALICE,
            "typed": [{"$type": "t".repeat(300), "uri": POST, "cid": CID}],
        });
        let extraction = extract(&record);
        assert_eq!(extraction.links, vec![link(LinkTarget::Did(ALICE), "$.short")]);
        assert_eq!(extraction.stats, ExtractStats { location_too_long: 3, ..Default::default() });
    }

    #[test]
    fn location_limit_is_inclusive() {
        let record = json!({"abcd": ALICE});
        let exact = ExtractLimits { max_location_len: "$.abcd".len(), ..Default::default() };
        assert_eq!(extract_links(&record, &exact).links, vec![link(LinkTarget::Did(ALICE), "$.abcd")]);
        let short = ExtractLimits { max_location_len: "$.abcd".len() - 1, ..Default::default() };
        assert_eq!(extract_links(&record, &short).stats.location_too_long, 1);
    }
}
