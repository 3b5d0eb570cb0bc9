//! Record JSON -> links: arbitrary bytes, parsed as JSON, through `extract_links` with the default
//! limits.
//!
//! Invariants checked (src/extract.rs states them):
//! - The limits hold: at most `max_links` links, every location starts with `$` and fits
//!   `max_location_len`, and each (target, location) appears once.
//! - Every target is a link again when rendered back to text.
//! - When nothing was left out (all "left out" counters zero), the result equals, link for link and
//!   in order, an independent unbounded walk written here from the rules of docs/design.md.
//! - The extraction is deterministic: a second run gives the same result.
#![no_main]

use backlinks::extract::{ExtractLimits, ExtractStats, Link, extract_links};
use backlinks::model::syntax::{Classified, LinkTarget, classify_link};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let Ok(record) = serde_json::from_slice::<Value>(data) else { return };
    let limits = ExtractLimits::default();
    let extraction = extract_links(&record, &limits);
    check_limits(&extraction.links, &limits);
    for link in &extraction.links {
        assert_eq!(
            classify_link(&link.target.to_string()),
            Classified::Link(link.target),
            "target does not re-classify"
        );
    }
    if nothing_left_out(&extraction.stats) {
        let expected = reference_links(&record);
        let found: Vec<(LinkTarget<'_>, &str)> =
            extraction.links.iter().map(|link| (link.target, link.location.as_str())).collect();
        let expected: Vec<(LinkTarget<'_>, &str)> =
            expected.iter().map(|(target, location)| (*target, location.as_str())).collect();
        assert_eq!(found, expected, "extract_links disagrees with the reference walk");
    }
    assert_eq!(extract_links(&record, &limits), extraction, "extraction is not deterministic");
});

fn check_limits(links: &[Link<'_>], limits: &ExtractLimits) {
    assert!(links.len() <= limits.max_links, "{} links", links.len());
    let mut seen = HashSet::new();
    for link in links {
        assert!(link.location.starts_with('$'), "location {:?}", link.location);
        assert!(link.location.len() <= limits.max_location_len, "location of {} bytes", link.location.len());
        assert!(seen.insert((link.target, link.location.as_str())), "duplicate link {link:?}");
    }
}

fn nothing_left_out(stats: &ExtractStats) -> bool {
    stats.over_link_limit == 0 && stats.too_deep == 0 && stats.location_too_long == 0
}

/// docs/design.md "Which strings are links", without limits: (target, location), first seen first.
fn reference_links(record: &Value) -> Vec<(LinkTarget<'_>, String)> {
    let mut found = Vec::new();
    walk(record, "$".to_string(), &mut found);
    let mut seen = HashSet::new();
    found.retain(|(target, location)| seen.insert((*target, location.clone())));
    found
}

fn walk<'a>(value: &'a Value, location: String, found: &mut Vec<(LinkTarget<'a>, String)>) {
    match value {
        Value::String(text) => {
            if let Classified::Link(target) = classify_link(text) {
                found.push((target, location));
            }
        }
        Value::Array(items) => {
            for item in items {
                let element_type = item.get("$type").and_then(Value::as_str).unwrap_or("");
                walk(item, format!("{location}[{element_type}]"), found);
            }
        }
        Value::Object(map) => match strong_reference_uri(map) {
            Some(uri) => walk(uri, location, found),
            None => {
                for (key, child) in map.iter().filter(|(key, _)| !matches!(key.as_str(), "$type" | "$link" | "$bytes"))
                {
                    walk(child, format!("{location}.{key}"), found);
                }
            }
        },
        _ => {}
    }
}

/// An object whose keys are `uri` (a string) and `cid`, and optionally `$type`.
fn strong_reference_uri(map: &Map<String, Value>) -> Option<&Value> {
    let mut keys: Vec<&str> = map.keys().map(String::as_str).filter(|key| *key != "$type").collect();
    keys.sort_unstable();
    let uri = map.get("uri").filter(|uri| uri.is_string())?;
    (keys == ["cid", "uri"]).then_some(uri)
}
