//! What a subscriber wants: targets (exact, by prefix, or by the account they belong to), then
//! narrowed by the linking record's collection and the link's location.
//!
//! A link event matches when the target filters are all empty or one of them holds (exact
//! target, a prefix of it, or its account), and every non-empty source filter holds (collection,
//! location, collection-and-location pair). Account events (hide, show) match every filter: an
//! account's links may reach any target, and they are rare.
//!
//! Invariants:
//! - A filter never holds more than its caps (`MAX_TARGETS`, `MAX_TARGET_DIDS`,
//!   `MAX_TARGET_PREFIXES`, `MAX_SOURCES` for each source filter); a request over them is refused.
//! - Every value is validated before it is kept (targets as link targets, then spelled as the log
//!   spells them; DIDs; NSIDs); locations start with `$`, prefixes are 1 to 2 KiB.

use super::entry::{PushEvent, collection_of_source};
use crate::model::syntax::{parse_target, validate_did, validate_nsid};
use std::collections::{HashMap, HashSet};

pub const MAX_TARGETS: usize = 50_000;
pub const MAX_TARGET_DIDS: usize = 10_000;
pub const MAX_TARGET_PREFIXES: usize = 100;
/// Most collections, locations, or collection-and-location pairs.
pub const MAX_SOURCES: usize = 1_000;
/// Longest target prefix.
pub const MAX_PREFIX_BYTES: usize = 2_048;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub targets: HashSet<String>,
    pub prefixes: HashSet<String>,
    pub dids: HashSet<String>,
    pub collections: HashSet<String>,
    pub locations: HashSet<String>,
    /// (collection, location) pairs, spacedust's `wantedSources`: each collection's locations.
    pub sources: HashMap<String, HashSet<String>>,
}

/// The account a target belongs to: a DID target's own, an at:// URI's authority; none for URLs
/// (and for at:// URIs named by handle).
pub fn did_of_target(target: &str) -> Option<&str> {
    if target.starts_with("did:") {
        return Some(target);
    }
    let authority = target.strip_prefix("at://")?.split('/').next()?;
    authority.starts_with("did:").then_some(authority)
}

impl Filter {
    pub fn has_target_filters(&self) -> bool {
        !(self.targets.is_empty() && self.prefixes.is_empty() && self.dids.is_empty())
    }

    pub fn matches(&self, event: &PushEvent<'_>) -> bool {
        let PushEvent::Link { link, source, .. } = event else { return true };
        self.wants_target(&link.target) && self.wants_source(collection_of_source(source), &link.location)
    }

    fn wants_target(&self, target: &str) -> bool {
        !self.has_target_filters()
            || self.targets.contains(target)
            || self.prefixes.iter().any(|prefix| target.starts_with(prefix.as_str()))
            || did_of_target(target).is_some_and(|did| self.dids.contains(did))
    }

    /// Whether the source filters hold for a link from a record of `collection` at `location`.
    pub fn wants_source(&self, collection: &str, location: &str) -> bool {
        (self.collections.is_empty() || self.collections.contains(collection))
            && (self.locations.is_empty() || self.locations.contains(location))
            && (self.sources.is_empty()
                || self.sources.get(collection).is_some_and(|locations| locations.contains(location)))
    }

    /// Adds a (collection, location) pair to the source filter.
    pub fn add_source(&mut self, collection: &str, location: String) {
        self.sources.entry(collection.to_string()).or_default().insert(location);
    }

    fn source_count(&self) -> usize {
        self.sources.values().map(HashSet::len).sum()
    }

    /// Refuses a filter over its caps.
    pub fn check_caps(&self) -> Result<(), String> {
        let caps = [
            ("targets", self.targets.len(), MAX_TARGETS),
            ("target DIDs", self.dids.len(), MAX_TARGET_DIDS),
            ("target prefixes", self.prefixes.len(), MAX_TARGET_PREFIXES),
            ("collections", self.collections.len(), MAX_SOURCES),
            ("locations", self.locations.len(), MAX_SOURCES),
            ("sources", self.source_count(), MAX_SOURCES),
        ];
        for (what, count, cap) in caps {
            if count > cap {
                return Err(format!("at most {cap} {what} per subscription, got {count}"));
            }
        }
        Ok(())
    }

    /// A filter from subscribeBacklinks parameters (`target`, `targetPrefix`, `targetDid`,
    /// `collection`, `location`, each repeatable); other names are left to the caller.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Filter, String> {
        let mut filter = Filter::default();
        for (name, value) in pairs {
            match name {
                "target" => {
                    // As the log spells it (`at://did:...` with no path is the DID itself).
                    let target = parse_target(value).map_err(|e| format!("invalid target {value:?}: {e}"))?;
                    filter.targets.insert(target.to_string());
                }
                "targetPrefix" => {
                    if value.is_empty() || value.len() > MAX_PREFIX_BYTES {
                        return Err(format!("a targetPrefix is 1 to {MAX_PREFIX_BYTES} bytes"));
                    }
                    filter.prefixes.insert(value.to_string());
                }
                "targetDid" => {
                    validate_did(value).map_err(|e| format!("invalid targetDid {value:?}: {e}"))?;
                    filter.dids.insert(value.to_string());
                }
                "collection" => {
                    validate_nsid(value).map_err(|e| format!("invalid collection {value:?}: {e}"))?;
                    filter.collections.insert(value.to_string());
                }
                "location" if value.starts_with('$') => {
                    filter.locations.insert(value.to_string());
                }
                "location" => {
                    return Err(format!("invalid location {value:?}: a location starts with $, like $.subject"));
                }
                _ => {}
            }
        }
        filter.check_caps()?;
        Ok(filter)
    }
}

/// The (name, value) pairs of a client's filter update, `{"type": "options_update", "payload":
/// {name: [value, ...], ...}}` (spacedust's message; a single string stands for a list of one).
pub fn update_pairs(message: &str) -> Result<Vec<(String, String)>, String> {
    let value: serde_json::Value = serde_json::from_str(message).map_err(|e| format!("not JSON: {e}"))?;
    if value.get("type").and_then(|t| t.as_str()) != Some("options_update") {
        return Err("expected {\"type\": \"options_update\", \"payload\": {...}}".into());
    }
    let Some(payload) = value.get("payload").and_then(|p| p.as_object()) else {
        return Err("options_update needs a payload object".into());
    };
    let mut pairs = vec![];
    for (name, values) in payload {
        let values = match values {
            serde_json::Value::String(one) => vec![one.as_str()],
            serde_json::Value::Array(many) => many
                .iter()
                .map(|v| v.as_str().ok_or_else(|| format!("{name}: expected strings")))
                .collect::<Result<_, _>>()?,
            _ => return Err(format!("{name}: expected a string or a list of strings")),
        };
        pairs.extend(values.into_iter().map(|v| (name.clone(), v.to_string())));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::entry::{Link, LinkOp};

    fn event<'e>(link: &'e Link, source: &'e str) -> PushEvent<'e> {
        PushEvent::Link { op: LinkOp::Create, link, source, rev: None, time_us: 1, cursor: 1 }
    }

    fn filter(pairs: &[(&str, &str)]) -> Filter {
        Filter::from_pairs(pairs.iter().copied()).unwrap()
    }

    #[test]
    fn target_filters_are_alternatives_and_source_filters_narrow_them() {
        let post = "at://did:plc:bob/app.bsky.feed.post/3k";
        let link = Link { target: post.into(), location: "$.subject".into() };
        let like = "at://did:plc:al/app.bsky.feed.like/3j";
        let repost = "at://did:plc:al/app.bsky.feed.repost/3j";
        assert!(filter(&[]).matches(&event(&link, like)), "no filter: everything");
        assert!(filter(&[("target", post)]).matches(&event(&link, like)));
        assert!(!filter(&[("target", "did:plc:bob")]).matches(&event(&link, like)));
        assert!(filter(&[("targetDid", "did:plc:bob")]).matches(&event(&link, like)));
        let account = Link { target: "did:plc:bob".into(), location: "$.subject".into() };
        assert!(
            filter(&[("target", "at://did:plc:bob")]).matches(&event(&account, like)),
            "an account by its at:// URI"
        );
        assert!(filter(&[("targetPrefix", "at://did:plc:bob/app.bsky.feed.")]).matches(&event(&link, like)));
        assert!(filter(&[("targetDid", "did:plc:eve"), ("target", post)]).matches(&event(&link, like)));
        let likes_only = filter(&[("target", post), ("collection", "app.bsky.feed.like")]);
        assert!(likes_only.matches(&event(&link, like)));
        assert!(!likes_only.matches(&event(&link, repost)));
        assert!(!filter(&[("location", "$.reply.parent")]).matches(&event(&link, like)));
        let mut by_source = Filter::default();
        by_source.add_source("app.bsky.feed.like", "$.subject".into());
        assert!(by_source.matches(&event(&link, like)));
        assert!(!by_source.matches(&event(&link, repost)));
        let hide = PushEvent::Hide { did: "did:plc:x", status: "deactivated", time_us: 1, cursor: 1 };
        assert!(filter(&[("target", post)]).matches(&hide));
    }

    #[test]
    fn bad_values_and_too_many_are_refused() {
        assert!(Filter::from_pairs([("target", "nope")]).is_err());
        assert!(Filter::from_pairs([("targetDid", "bob")]).is_err());
        assert!(Filter::from_pairs([("collection", "not an nsid")]).is_err());
        assert!(Filter::from_pairs([("location", "subject")]).is_err());
        assert!(Filter::from_pairs([("targetPrefix", "")]).is_err());
        let prefixes: Vec<String> = (0..=MAX_TARGET_PREFIXES).map(|i| format!("at://{i}")).collect();
        let error = Filter::from_pairs(prefixes.iter().map(|p| ("targetPrefix", p.as_str()))).unwrap_err();
        assert!(error.contains("at most 100 target prefixes"), "{error}");
    }

    #[test]
    fn updates_are_spacedust_messages() {
        let message = r#"{"type":"options_update","payload":{"target":["did:plc:a","did:plc:b"],"collection":"app.bsky.feed.like"}}"#;
        let mut pairs = update_pairs(message).unwrap();
        pairs.sort();
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[0], ("collection".to_string(), "app.bsky.feed.like".to_string()));
        assert!(update_pairs(r#"{"type":"other","payload":{}}"#).is_err());
        assert!(update_pairs(r#"{"type":"options_update","payload":{"target":[1]}}"#).is_err());
        assert!(update_pairs("[").is_err());
    }
}
