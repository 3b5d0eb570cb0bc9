//! Live push's parsers (src/push): change-log entries read back from disk, and the filter
//! updates a subscriber sends over its websocket.
//!
//! Invariants checked:
//! - `Entry::decode` never panics; an entry that decodes encodes to exactly the input bytes.
//! - A filter update either fails or gives a filter within its caps whose targets parse, whose
//!   DIDs and collections are valid and whose locations start with `$`.
#![no_main]

use backlinks::model::syntax::{parse_target, validate_did, validate_nsid};
use backlinks::push::entry::Entry;
use backlinks::push::filter::{Filter, update_pairs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = Entry::decode(data) {
        let mut bytes = vec![];
        entry.encode(&mut bytes);
        assert_eq!(bytes, data, "an entry that decodes is its own encoding");
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(pairs) = update_pairs(text) else { return };
    if let Ok(filter) = Filter::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        check(&filter);
    }
});

fn check(filter: &Filter) {
    filter.check_caps().expect("within its caps");
    assert!(filter.targets.iter().all(|t| parse_target(t).is_ok()));
    assert!(filter.dids.iter().all(|d| validate_did(d).is_ok()));
    assert!(filter.collections.iter().all(|c| validate_nsid(c).is_ok()));
    assert!(filter.locations.iter().all(|l| l.starts_with('$')));
    assert!(filter.prefixes.iter().all(|p| !p.is_empty()));
}
