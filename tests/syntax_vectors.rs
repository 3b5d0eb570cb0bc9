//! Runs every atproto interop syntax vector for DIDs, handles, NSIDs, record keys, TIDs, at-uris and
//! at-identifiers (tests/data/interop-syntax, CC0, see its SOURCE.md) against the validators of
//! `backlinks::model::syntax`, and checks that the link classifier agrees with them.
//!
//! File format: one vector per line; lines starting with `#` and empty lines are comments. Lines are
//! NOT trimmed: several invalid vectors differ from valid ones only by a leading or trailing space.

use std::path::Path;

use backlinks::model::syntax::{
    AtUri, Classified, LinkTarget, SyntaxError, classify_link, parse_target, validate_at_identifier, validate_did,
    validate_handle, validate_nsid, validate_record_key, validate_tid,
};
use backlinks::model::tid::{format_tid, parse_tid};

type Validator = fn(&str) -> Result<(), SyntaxError>;

struct Vectors {
    valid: Vec<String>,
    invalid: Vec<String>,
}

fn read_vectors(file_name: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/interop-syntax").join(file_name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    text.split('\n').filter(|line| !line.is_empty() && !line.starts_with('#')).map(str::to_owned).collect()
}

fn load(kind: &str) -> Vectors {
    Vectors {
        valid: read_vectors(&format!("{kind}_syntax_valid.txt")),
        invalid: read_vectors(&format!("{kind}_syntax_invalid.txt")),
    }
}

/// Asserts the vector counts (so a truncated or misread file fails) and every verdict.
fn check_suite(kind: &str, validate: Validator, expected_valid: usize, expected_invalid: usize) -> Vectors {
    let vectors = load(kind);
    assert_eq!(vectors.valid.len(), expected_valid, "{kind}: number of valid vectors");
    assert_eq!(vectors.invalid.len(), expected_invalid, "{kind}: number of invalid vectors");
    let mut failures = Vec::new();
    for vector in &vectors.valid {
        if let Err(error) = validate(vector) {
            failures.push(format!("valid {vector:?} rejected: {error}"));
        }
    }
    for vector in &vectors.invalid {
        if validate(vector).is_ok() {
            failures.push(format!("invalid {vector:?} accepted"));
        }
    }
    assert!(failures.is_empty(), "{kind}:\n{}", failures.join("\n"));
    vectors
}

fn validate_at_uri(s: &str) -> Result<(), SyntaxError> {
    AtUri::parse(s).map(|_| ())
}

#[test]
fn did_vectors() {
    let vectors = check_suite("did", validate_did, 24, 18);
    for did in &vectors.valid {
        assert_eq!(classify_link(did), Classified::Link(LinkTarget::Did(did)), "{did:?}");
        assert_eq!(parse_target(did), Ok(LinkTarget::Did(did)));
    }
    for not_did in &vectors.invalid {
        assert_eq!(classify_link(not_did), Classified::NotALink, "{not_did:?}");
        assert!(parse_target(not_did).is_err(), "{not_did:?}");
    }
}

#[test]
fn handle_vectors() {
    let vectors = check_suite("handle", validate_handle, 71, 48);
    for handle in &vectors.valid {
        assert_eq!(classify_link(&format!("at://{handle}")), Classified::HandleAuthority, "{handle:?}");
    }
}

#[test]
fn nsid_vectors() {
    let vectors = check_suite("nsid", validate_nsid, 25, 27);
    for nsid in &vectors.valid {
        let uri = format!("at://did:plc:abc/{nsid}/self");
        let expected = LinkTarget::Record { did: "did:plc:abc", collection: nsid, rkey: "self" };
        assert_eq!(classify_link(&uri), Classified::Link(expected), "{uri:?}");
    }
    for not_nsid in &vectors.invalid {
        assert_eq!(classify_link(&format!("at://did:plc:abc/{not_nsid}/self")), Classified::NotALink, "{not_nsid:?}");
    }
}

#[test]
fn record_key_vectors() {
    let vectors = check_suite("recordkey", validate_record_key, 16, 11);
    for rkey in &vectors.valid {
        let uri = format!("at://did:plc:abc/app.bsky.feed.post/{rkey}");
        let expected = LinkTarget::Record { did: "did:plc:abc", collection: "app.bsky.feed.post", rkey };
        assert_eq!(classify_link(&uri), Classified::Link(expected), "{uri:?}");
    }
}

#[test]
fn tid_vectors() {
    let vectors = check_suite("tid", validate_tid, 4, 9);
    for tid in &vectors.valid {
        let value = parse_tid(tid).expect("a valid TID parses");
        assert_eq!(format_tid(value), *tid);
    }
    for not_tid in &vectors.invalid {
        assert_eq!(parse_tid(not_tid), None, "{not_tid:?}");
    }
}

#[test]
fn at_uri_vectors() {
    let vectors = check_suite("aturi", validate_at_uri, 23, 72);
    for uri in &vectors.valid {
        assert_ne!(classify_link(uri), Classified::NotALink, "{uri:?}");
    }
    for not_uri in &vectors.invalid {
        assert_eq!(classify_link(not_uri), Classified::NotALink, "{not_uri:?}");
        assert!(parse_target(not_uri).is_err(), "{not_uri:?}");
    }
}

#[test]
fn at_identifier_vectors() {
    check_suite("atidentifier", validate_at_identifier, 11, 22);
}

#[test]
fn at_uri_vectors_classify_by_authority_and_path() {
    let cases = [
        ("at://did:plc:asdf123", Classified::Link(LinkTarget::Did("did:plc:asdf123"))),
        ("at://user.bsky.social", Classified::HandleAuthority),
        ("at://did:plc:asdf123/com.atproto.feed.post", Classified::CollectionOnly),
        (
            "at://did:abc:123/io.nsid.someFunc/record-key",
            Classified::Link(LinkTarget::Record {
                did: "did:abc:123",
                collection: "io.nsid.someFunc",
                rkey: "record-key",
            }),
        ),
    ];
    let valid = load("aturi").valid;
    for (uri, expected) in cases {
        assert!(valid.iter().any(|vector| vector == uri), "{uri} is one of the valid vectors");
        assert_eq!(classify_link(uri), expected, "{uri}");
    }
}
