//! atproto string syntax: every validator, the at-uri parser, the link classifier and TIDs, run on
//! the same arbitrary string.
//!
//! Invariants checked (src/model/syntax.rs and src/model/tid.rs state them):
//! - No validator panics, whatever the string.
//! - A `BadChar` error about the whole string points at a char boundary and names the char there.
//! - A parsed at-uri re-assembles to exactly the input, and each of its parts re-validates alone.
//! - `parse_target(s)` is `Ok` exactly when `classify_link(s)` is a `Link`, and returns that link.
//! - `validate_tid(s)` is `Ok` exactly when `parse_tid(s)` is `Some(v)`, and `format_tid(v) == s`.
//! - `format_tid` of any 63-bit value parses back to it.
#![no_main]

use backlinks::model::syntax::{
    AtUri, Classified, LinkTarget, SyntaxError, SyntaxKind, classify_link, parse_target, validate_at_identifier,
    validate_did, validate_handle, validate_nsid, validate_record_key, validate_tid, validate_url,
};
use backlinks::model::tid::{TID_TOP_BIT, format_tid, parse_tid};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check_tid_of_value(data);
    let Ok(text) = std::str::from_utf8(data) else { return };
    for (kind, result) in [
        (SyntaxKind::Did, validate_did(text)),
        (SyntaxKind::Handle, validate_handle(text)),
        (SyntaxKind::Nsid, validate_nsid(text)),
        (SyntaxKind::RecordKey, validate_record_key(text)),
        (SyntaxKind::Tid, validate_tid(text)),
    ] {
        check_error_position(text, kind, result);
    }
    check_at_uri(text);
    check_classifier(text);
    check_tid_text(text);
});

/// A `BadChar` about `text` itself (its kind is `kind`) names the char at its byte offset, which
/// is a char boundary. Errors about a part (the DID inside an at-uri) count from that part.
fn check_error_position(text: &str, kind: SyntaxKind, result: Result<(), SyntaxError>) {
    if let Err(SyntaxError::BadChar { kind: error_kind, found, at }) = result
        && error_kind == kind
    {
        let char_there = text.get(at..).and_then(|rest| rest.chars().next());
        assert_eq!(char_there, Some(found), "BadChar at {at} in {text:?}");
    }
}

fn check_at_uri(text: &str) {
    let parsed = AtUri::parse(text);
    if let Err(error) = &parsed {
        check_error_position(text, SyntaxKind::AtUri, Err(error.clone()));
    }
    let Ok(uri) = parsed else { return };
    let mut rebuilt = format!("at://{}", uri.authority);
    for part in [uri.collection, uri.rkey].into_iter().flatten() {
        rebuilt.push('/');
        rebuilt.push_str(part);
    }
    assert_eq!(rebuilt, text, "at-uri does not re-assemble");
    assert!(uri.rkey.is_none() || uri.collection.is_some(), "rkey without collection: {text:?}");
    validate_at_identifier(uri.authority).expect("authority re-validates");
    uri.collection.map(validate_nsid).transpose().expect("collection re-validates");
    uri.rkey.map(validate_record_key).transpose().expect("rkey re-validates");
    assert_eq!(uri.has_did_authority(), validate_did(uri.authority).is_ok(), "DID authority: {text:?}");
}

fn check_classifier(text: &str) {
    match (classify_link(text), parse_target(text)) {
        (Classified::Link(link), Ok(target)) => {
            assert_eq!(link, target);
            check_link_target(text, link);
        }
        (Classified::Link(link), Err(error)) => panic!("classified as {link:?} but parse_target says {error}"),
        (other, Ok(target)) => panic!("classified as {other:?} but parse_target gives {target:?}"),
        (_, Err(error)) => check_error_position(text, SyntaxKind::Target, Err(error)),
    }
}

/// A link's parts are valid alone, and spell the input back.
fn check_link_target(text: &str, link: LinkTarget<'_>) {
    match link {
        LinkTarget::Did(did) => {
            validate_did(did).expect("a DID target is a valid DID");
            assert!(text == did || text == format!("at://{did}"), "DID target {did:?} from {text:?}");
        }
        LinkTarget::Record { did, collection, rkey } => {
            validate_did(did).expect("record target DID");
            validate_nsid(collection).expect("record target collection");
            validate_record_key(rkey).expect("record target rkey");
            assert_eq!(format!("at://{did}/{collection}/{rkey}"), text);
        }
        LinkTarget::Url(url) => {
            validate_url(url).expect("a URL target is a valid URL");
            assert_eq!(url, text, "a URL target is its text, as written");
        }
    }
}

fn check_tid_text(text: &str) {
    match (parse_tid(text), validate_tid(text)) {
        (Some(value), Ok(())) => {
            assert_eq!(value & TID_TOP_BIT, 0, "TID with the top bit set: {text:?}");
            assert_eq!(format_tid(value), text, "TID does not round-trip");
            validate_record_key(text).expect("a TID is a record key");
        }
        (None, Err(error)) => check_error_position(text, SyntaxKind::Tid, Err(error)),
        (parsed, validated) => panic!("parse_tid {parsed:?} but validate_tid {validated:?} for {text:?}"),
    }
}

/// The first 8 bytes as a 63-bit value: format then parse gives it back.
fn check_tid_of_value(data: &[u8]) {
    let Some(bytes) = data.get(..8) else { return };
    let value = u64::from_le_bytes(bytes.try_into().expect("8 bytes")) & !TID_TOP_BIT;
    let text = format_tid(value);
    assert_eq!(parse_tid(&text), Some(value), "format_tid({value}) = {text:?} does not parse back");
}
