//! listBacklinks cursors and query parameters (src/query.rs), and the many-to-many ones
//! (src/constellation/many.rs).
//!
//! Invariants checked:
//! - A cursor text that decodes is the encoding of what it decodes to (up to the case of its hex
//!   digits), and decode(encode(c)) == c for the cursor built from the first 34 bytes.
//! - `ListParams::from_pairs` on the input read as a query string (`&` and `=` separated) either
//!   fails or returns parameters that are all valid: a target that parses, a limit in range,
//!   collections that are NSIDs, locations that start with `$`, a cursor that round-trips.
//! - The many-to-many cursors that decode are the encodings of what they decode to, and
//!   `parse_many_query` either fails or returns a subject and other subjects that parse, paths
//!   that became locations, and a limit in range.
#![no_main]

use backlinks::constellation::many::{ItemsCursor, decode_subject_cursor, encode_subject_cursor, parse_many_query};
use backlinks::model::ids::RecordId;
use backlinks::model::syntax::{parse_target, validate_nsid};
use backlinks::query::{Cursor, ListParams, MAX_LIMIT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check_cursor_of_bytes(data);
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cursor) = Cursor::decode(text) {
        assert_eq!(cursor.encode(), text.to_ascii_lowercase(), "cursor text is not its encoding");
    }
    let pairs = text.split('&').map(|pair| pair.split_once('=').unwrap_or((pair, "")));
    if let Ok(params) = ListParams::from_pairs(pairs.clone()) {
        check_params(&params);
    }
    check_many_to_many(text, pairs.map(|(k, v)| (k.to_string(), v.to_string())).collect());
});

fn check_many_to_many(text: &str, pairs: Vec<(String, String)>) {
    if let Ok(cursor) = ItemsCursor::decode(text) {
        assert_eq!(cursor.encode(), text.to_ascii_lowercase(), "items cursor text is not its encoding");
        assert!(cursor.given == 0 || cursor.at.inclusive, "items given past an exclusive position");
    }
    if let Ok(subject) = decode_subject_cursor(text) {
        assert_eq!(encode_subject_cursor(&subject), text.to_ascii_lowercase(), "count cursor text is not its encoding");
    }
    for did_name in ["linkDid", "did"] {
        let Ok(params) = parse_many_query(&pairs, did_name) else { continue };
        assert!(parse_target(&params.subject).is_ok(), "subject {:?}", params.subject);
        assert!(params.other_subjects.iter().all(|s| parse_target(s).is_ok()), "{:?}", params.other_subjects);
        assert!(
            !params.to_other.is_empty() && params.to_other.iter().all(|l| l.starts_with('$')),
            "{:?}",
            params.to_other
        );
        assert!(!params.source.locations.is_empty() && validate_nsid(&params.source.collection).is_ok());
        assert!(params.limit <= MAX_LIMIT, "limit {}", params.limit);
    }
}

/// Bytes 0..24 are the source, 24..32 the location, bit 0 of byte 32 the inclusive flag.
fn check_cursor_of_bytes(data: &[u8]) {
    let Some(bytes) = data.get(..33) else { return };
    let cursor = Cursor {
        source: RecordId::decode(&bytes[..24]),
        location: u64::from_be_bytes(bytes[24..32].try_into().expect("8 bytes")),
        inclusive: bytes[32] & 1 == 1,
    };
    let decoded = Cursor::decode(&cursor.encode()).expect("an encoded cursor decodes");
    assert_eq!(decoded, cursor, "decode(encode(c)) != c");
}

fn check_params(params: &ListParams) {
    parse_target(&params.target).expect("the target parses");
    assert!((1..=MAX_LIMIT).contains(&params.limit), "limit {}", params.limit);
    for collection in &params.collections {
        validate_nsid(collection).expect("collection filters are NSIDs");
    }
    assert!(params.locations.iter().all(|location| location.starts_with('$')), "{:?}", params.locations);
    if let Some(cursor) = params.cursor {
        assert_eq!(Cursor::decode(&cursor.encode()).ok(), Some(cursor));
    }
}
