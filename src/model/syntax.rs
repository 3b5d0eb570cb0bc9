//! atproto string syntax: DIDs, handles, NSIDs, record keys, TIDs, at-identifiers, at-uris, and the
//! link classifier that decides which record strings are backlinks.
//!
//! Invariants:
//! - Every validator checks the length limit first, is a single forward scan over the bytes, never
//!   allocates and never panics, whatever the input (any UTF-8, any length).
//! - A `SyntaxError` holds only `Copy` data, so rejecting a string costs no allocation; its
//!   `Display` text names the kind of string and what is wrong, and is fit for an HTTP 400 message.
//! - At-uris are the strict form of the interop vectors: `at://AUTHORITY[/COLLECTION[/RKEY]]`, no
//!   query, no fragment, no trailing or doubled `/`, the authority a DID or a handle, the collection
//!   an NSID, the record key a record key.
//! - `classify_link` returns `NotALink` for any string that starts with none of `at://`, `did:`
//!   and `http` after three prefix comparisons; it runs on every string of every record.
//! - A URL is `http://` or `https://` (lowercase, as written), a non-empty host, at most
//!   [`MAX_URL_LEN`] bytes and no whitespace or control character; it is never normalized.
//! - `parse_target(s)` is `Ok` exactly when `classify_link(s)` is a `Link`, and returns that link.

use std::fmt;

use crate::model::tid::{TID_LEN, digit_value, parse_tid};

/// Longest DID accepted (the DID spec caps DIDs at 2 KB).
pub const MAX_DID_LEN: usize = 2048;
/// Longest handle: a DNS name.
pub const MAX_HANDLE_LEN: usize = 253;
/// Longest label of a handle, and longest domain segment of an NSID (a DNS label).
pub const MAX_DOMAIN_LABEL_LEN: usize = 63;
/// Longest NSID. The interop vectors accept a 283-byte domain authority, so the 253-byte DNS limit
/// is not applied to the authority on its own: only this overall limit is.
pub const MAX_NSID_LEN: usize = 317;
/// Longest name (final) segment of an NSID.
pub const MAX_NSID_NAME_LEN: usize = 63;
/// Longest record key.
pub const MAX_RECORD_KEY_LEN: usize = 512;
/// Longest at-uri (the at-uri spec caps them at 8 KB).
pub const MAX_AT_URI_LEN: usize = 8 * 1024;

/// Longest URL indexed as a link target.
pub const MAX_URL_LEN: usize = 2048;

const AT_URI_SCHEME: &str = "at://";
const DID_SCHEME: &str = "did:";
const URL_SCHEMES: [&str; 2] = ["https://", "http://"];

/// Which kind of string a [`SyntaxError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntaxKind {
    Did,
    Handle,
    Nsid,
    RecordKey,
    Tid,
    AtIdentifier,
    AtUri,
    Url,
    /// The `target` of a backlink query.
    Target,
}

impl fmt::Display for SyntaxKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyntaxKind::Did => "DID",
            SyntaxKind::Handle => "handle",
            SyntaxKind::Nsid => "NSID",
            SyntaxKind::RecordKey => "record key",
            SyntaxKind::Tid => "TID",
            SyntaxKind::AtIdentifier => "at-identifier",
            SyntaxKind::AtUri => "at-uri",
            SyntaxKind::Url => "URL",
            SyntaxKind::Target => "target",
        })
    }
}

/// Why a string is not valid. Positions are byte offsets into the string of the named kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    #[error("{kind} is empty")]
    Empty { kind: SyntaxKind },
    #[error("{kind} is {len} bytes long, the limit is {max}")]
    TooLong { kind: SyntaxKind, len: usize, max: usize },
    #[error("{kind} contains {found:?} at byte {at}, which is not allowed there")]
    BadChar { kind: SyntaxKind, found: char, at: usize },
    #[error("{kind} is malformed: {reason}")]
    Malformed { kind: SyntaxKind, reason: &'static str },
    #[error("{kind} not supported: {reason}")]
    Unsupported { kind: SyntaxKind, reason: &'static str },
}

fn malformed(kind: SyntaxKind, reason: &'static str) -> SyntaxError {
    SyntaxError::Malformed { kind, reason }
}

/// The error for the byte at `at`. Validators stop at the first byte outside their ASCII
/// alphabet, so `at` is a char boundary; the fallback only guards against a caller bug.
fn bad_char(kind: SyntaxKind, s: &str, at: usize) -> SyntaxError {
    let found = s.get(at..).and_then(|rest| rest.chars().next()).unwrap_or(char::REPLACEMENT_CHARACTER);
    SyntaxError::BadChar { kind, found, at }
}

fn check_length(kind: SyntaxKind, s: &str, max: usize) -> Result<(), SyntaxError> {
    match s.len() {
        0 => Err(SyntaxError::Empty { kind }),
        len if len > max => Err(SyntaxError::TooLong { kind, len, max }),
        _ => Ok(()),
    }
}

/// Checks that every byte of `s[start..]` satisfies `allowed`; `at` in the error is into `s`.
fn check_bytes(kind: SyntaxKind, s: &str, start: usize, allowed: impl Fn(u8) -> bool) -> Result<(), SyntaxError> {
    let tail = s.as_bytes().get(start..).unwrap_or_default();
    match tail.iter().position(|&byte| !allowed(byte)) {
        Some(offset) => Err(bad_char(kind, s, start + offset)),
        None => Ok(()),
    }
}

/// `did:METHOD:IDENTIFIER`: a lowercase method, an identifier of `[A-Za-z0-9._:%-]` that does not
/// end in `:` or `%`.
pub fn validate_did(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Did;
    check_length(KIND, s, MAX_DID_LEN)?;
    let rest = s.strip_prefix(DID_SCHEME).ok_or(malformed(KIND, "must start with \"did:\""))?;
    let method_len = rest.find(':').ok_or(malformed(KIND, "must have the form did:METHOD:IDENTIFIER"))?;
    if method_len == 0 {
        return Err(malformed(KIND, "the method is empty"));
    }
    let identifier_start = DID_SCHEME.len() + method_len + 1;
    check_bytes(KIND, &s[..identifier_start - 1], DID_SCHEME.len(), |byte| byte.is_ascii_lowercase())?;
    if identifier_start == s.len() {
        return Err(malformed(KIND, "the identifier is empty"));
    }
    check_bytes(KIND, s, identifier_start, is_did_identifier_byte)?;
    if s.ends_with([':', '%']) {
        return Err(malformed(KIND, "must not end with ':' or '%'"));
    }
    Ok(())
}

fn is_did_identifier_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'%' | b'-')
}

/// A DNS name of at least two labels whose last label (the top-level domain) starts with a letter.
pub fn validate_handle(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Handle;
    check_length(KIND, s, MAX_HANDLE_LEN)?;
    check_domain_labels(KIND, s)?;
    let Some((_, top_level)) = s.rsplit_once('.') else {
        return Err(malformed(KIND, "must have at least two labels separated by '.'"));
    };
    if !top_level.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(malformed(KIND, "the last label (the top-level domain) must start with a letter"));
    }
    Ok(())
}

/// Checks every `.`-separated label of `s`: 1 to 63 bytes of `[A-Za-z0-9-]`, no `-` at either end.
fn check_domain_labels(kind: SyntaxKind, s: &str) -> Result<(), SyntaxError> {
    let mut start = 0;
    for label in s.split('.') {
        check_domain_label(kind, s, start, label)?;
        start += label.len() + 1;
    }
    Ok(())
}

fn check_domain_label(kind: SyntaxKind, s: &str, start: usize, label: &str) -> Result<(), SyntaxError> {
    if label.is_empty() {
        return Err(malformed(kind, "has an empty label (a leading, trailing or doubled '.')"));
    }
    if label.len() > MAX_DOMAIN_LABEL_LEN {
        return Err(malformed(kind, "has a label longer than 63 characters"));
    }
    check_bytes(kind, &s[..start + label.len()], start, |byte| byte.is_ascii_alphanumeric() || byte == b'-')?;
    if label.starts_with('-') || label.ends_with('-') {
        return Err(malformed(kind, "has a label that starts or ends with '-'"));
    }
    Ok(())
}

/// A reversed domain authority (at least two labels, the first not starting with a digit) and a
/// name of ASCII letters and digits that starts with a letter.
pub fn validate_nsid(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Nsid;
    check_length(KIND, s, MAX_NSID_LEN)?;
    let (authority, name) = s.rsplit_once('.').unwrap_or(("", s));
    if !authority.contains('.') {
        return Err(malformed(KIND, "must have at least three segments separated by '.'"));
    }
    check_domain_labels(KIND, authority)?;
    if authority.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(malformed(KIND, "the first segment must not start with a digit"));
    }
    check_nsid_name(s, authority.len() + 1, name)
}

fn check_nsid_name(s: &str, start: usize, name: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Nsid;
    if name.is_empty() {
        return Err(malformed(KIND, "the name (last segment) is empty"));
    }
    if name.len() > MAX_NSID_NAME_LEN {
        return Err(malformed(KIND, "the name (last segment) is longer than 63 characters"));
    }
    check_bytes(KIND, s, start, |byte| byte.is_ascii_alphanumeric())?;
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(malformed(KIND, "the name (last segment) must start with a letter"));
    }
    Ok(())
}

/// 1 to 512 bytes of `[A-Za-z0-9._:~-]`, and neither `.` nor `..`.
pub fn validate_record_key(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::RecordKey;
    check_length(KIND, s, MAX_RECORD_KEY_LEN)?;
    if s == "." || s == ".." {
        return Err(malformed(KIND, "must not be \".\" or \"..\""));
    }
    check_bytes(KIND, s, 0, is_record_key_byte)
}

fn is_record_key_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'~' | b'-')
}

/// Exactly what [`parse_tid`] accepts; on failure, says which rule the string breaks.
///
/// The spec's regex lets the first character go up to `j`, but its layout fixes the top bit at 0,
/// which limits it to `234567ab`; the interop vectors agree with both readings. This takes the
/// stricter one so that every TID fits the inline record-key form. A key rejected here may still
/// be a valid record key (it is then outlined).
pub fn validate_tid(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Tid;
    if parse_tid(s).is_some() {
        return Ok(());
    }
    check_length(KIND, s, TID_LEN)?;
    if s.len() != TID_LEN {
        return Err(malformed(KIND, "must be exactly 13 characters"));
    }
    check_bytes(KIND, s, 0, |byte| digit_value(byte).is_some())?;
    Err(malformed(KIND, "the first character must be one of 234567ab (the top bit is always 0)"))
}

/// A DID (when it starts with `did:`) or else a handle.
pub fn validate_at_identifier(s: &str) -> Result<(), SyntaxError> {
    if s.is_empty() {
        return Err(SyntaxError::Empty { kind: SyntaxKind::AtIdentifier });
    }
    if s.starts_with(DID_SCHEME) { validate_did(s) } else { validate_handle(s) }
}

/// A parsed strict at-uri: `at://AUTHORITY[/COLLECTION[/RKEY]]`, borrowing from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtUri<'a> {
    /// A DID or a handle.
    pub authority: &'a str,
    /// An NSID.
    pub collection: Option<&'a str>,
    /// A record key; only present with a collection.
    pub rkey: Option<&'a str>,
}

impl<'a> AtUri<'a> {
    /// Parses the strict at-uri syntax. Queries and fragments are rejected: the interop vectors
    /// list every at-uri with a `#` as invalid, and a link target never needs either.
    pub fn parse(s: &'a str) -> Result<Self, SyntaxError> {
        const KIND: SyntaxKind = SyntaxKind::AtUri;
        check_length(KIND, s, MAX_AT_URI_LEN)?;
        let path = s.strip_prefix(AT_URI_SCHEME).ok_or(malformed(KIND, "must start with \"at://\""))?;
        if path.contains(['?', '#']) {
            return Err(malformed(KIND, "a query or fragment is not allowed"));
        }
        let mut segments = path.split('/');
        let authority = segments.next().unwrap_or_default();
        let collection = segments.next();
        let rkey = segments.next();
        if segments.next().is_some() {
            return Err(malformed(KIND, "too many path segments, expected at://AUTHORITY/COLLECTION/RKEY"));
        }
        if collection == Some("") || rkey == Some("") {
            return Err(malformed(KIND, "has an empty path segment (a trailing or doubled '/')"));
        }
        validate_at_identifier(authority)?;
        collection.map(validate_nsid).transpose()?;
        rkey.map(validate_record_key).transpose()?;
        Ok(AtUri { authority, collection, rkey })
    }

    /// Whether the authority is a DID (otherwise it is a handle).
    pub fn has_did_authority(&self) -> bool {
        self.authority.starts_with(DID_SCHEME)
    }
}

/// What a link points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkTarget<'a> {
    /// `at://DID/COLLECTION/RKEY`.
    Record { did: &'a str, collection: &'a str, rkey: &'a str },
    /// `at://DID` or a bare DID: the account itself.
    Did(&'a str),
    /// An `http://` or `https://` URL, as written.
    Url(&'a str),
}

impl fmt::Display for LinkTarget<'_> {
    /// The target's canonical text: what a query's `target` names it by.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkTarget::Record { did, collection, rkey } => write!(f, "at://{did}/{collection}/{rkey}"),
            LinkTarget::Did(did) | LinkTarget::Url(did) => f.write_str(did),
        }
    }
}

/// The verdict on one string of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified<'a> {
    /// An indexed link.
    Link(LinkTarget<'a>),
    /// A valid `at://DID/COLLECTION` with no record key: not indexed, counted.
    CollectionOnly,
    /// A valid at-uri whose authority is a handle: not indexed (handles change), counted.
    HandleAuthority,
    /// Anything else: text, other URIs, CIDs, invalid at-uris, DIDs or URLs.
    NotALink,
}

/// Classifies one string of a record (docs/design.md, "Which strings are links").
#[inline]
pub fn classify_link(s: &str) -> Classified<'_> {
    let bytes = s.as_bytes();
    if bytes.starts_with(AT_URI_SCHEME.as_bytes()) {
        classify_at_uri(s)
    } else if bytes.starts_with(DID_SCHEME.as_bytes()) && validate_did(s).is_ok() {
        Classified::Link(LinkTarget::Did(s))
    } else if bytes.starts_with(b"http") && validate_url(s).is_ok() {
        Classified::Link(LinkTarget::Url(s))
    } else {
        Classified::NotALink
    }
}

fn classify_at_uri(s: &str) -> Classified<'_> {
    let Ok(uri) = AtUri::parse(s) else {
        return Classified::NotALink;
    };
    if !uri.has_did_authority() {
        return Classified::HandleAuthority;
    }
    match (uri.collection, uri.rkey) {
        (None, _) => Classified::Link(LinkTarget::Did(uri.authority)),
        (Some(collection), Some(rkey)) => Classified::Link(LinkTarget::Record { did: uri.authority, collection, rkey }),
        (Some(_), None) => Classified::CollectionOnly,
    }
}

/// `http://AUTHORITY...` or `https://AUTHORITY...`: see the module invariants. The authority is
/// `[USERINFO@]HOST[:PORT]` with a host of letters (any script), digits, `-`, `.`, `_` and `%`, or an
/// IPv6 literal in brackets, and a port of at most 5 digits; what follows it is any text without
/// whitespace or control characters.
pub fn validate_url(s: &str) -> Result<(), SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Url;
    check_length(KIND, s, MAX_URL_LEN)?;
    let Some(rest) = URL_SCHEMES.iter().find_map(|scheme| s.strip_prefix(scheme)) else {
        return Err(malformed(KIND, "must start with https:// or http://"));
    };
    if let Some((at, found)) = s.char_indices().find(|(_, c)| c.is_whitespace() || c.is_control()) {
        return Err(SyntaxError::BadChar { kind: KIND, found, at });
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host_and_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    match split_host_port(host_and_port) {
        Some((_, Some(port))) if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) => {
            Err(malformed(KIND, "has a port that is not a number"))
        }
        Some(_) => Ok(()),
        None => Err(malformed(KIND, "has no host, or a host with characters a host cannot have")),
    }
}

/// (host, port) of `HOST[:PORT]` or `[IPV6][:PORT]`; `None` when the host is empty or holds a
/// character no host can (a registered name is letters of any script, digits, `-`, `.`, `_`
/// and `%`-escapes).
fn split_host_port(host_and_port: &str) -> Option<(&str, Option<&str>)> {
    if let Some(literal) = host_and_port.strip_prefix('[') {
        let (address, after) = literal.split_once(']')?;
        let ipv6 = !address.is_empty() && address.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        return match (ipv6, after) {
            (false, _) => None,
            (true, "") => Some((address, None)),
            (true, _) => Some((address, Some(after.strip_prefix(':')?))),
        };
    }
    let (host, port) = match host_and_port.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (host_and_port, None),
    };
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '-' | '.' | '_' | '%');
    (!host.is_empty() && host.chars().all(name_char)).then_some((host, port))
}

/// Parses the `target` of a backlink query: `at://DID/COLLECTION/RKEY`, `at://DID`, a bare DID or
/// an `http(s)://` URL.
pub fn parse_target(s: &str) -> Result<LinkTarget<'_>, SyntaxError> {
    const KIND: SyntaxKind = SyntaxKind::Target;
    match classify_link(s) {
        Classified::Link(target) => Ok(target),
        Classified::CollectionOnly => Err(SyntaxError::Unsupported {
            kind: KIND,
            reason: "at-uri without record key, use at://DID/COLLECTION/RKEY or at://DID",
        }),
        Classified::HandleAuthority => {
            Err(SyntaxError::Unsupported { kind: KIND, reason: "handle authority not supported, use the DID" })
        }
        Classified::NotALink => Err(explain_not_a_link(s)),
    }
}

/// Re-runs the validator that rejected `s` to get its reason; only called on the error path.
fn explain_not_a_link(s: &str) -> SyntaxError {
    let specific = if s.starts_with(AT_URI_SCHEME) {
        AtUri::parse(s).err()
    } else if s.starts_with(DID_SCHEME) {
        validate_did(s).err()
    } else if s.starts_with("http") {
        validate_url(s).err()
    } else {
        None
    };
    specific.unwrap_or(if s.is_empty() {
        SyntaxError::Empty { kind: SyntaxKind::Target }
    } else {
        malformed(SyntaxKind::Target, "must be an at:// URI, a DID or an http(s):// URL")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DID: &str = "did:plc:vfnmgxg2yscfliemmcxzyfyh";

    fn record(did: &'static str, collection: &'static str, rkey: &'static str) -> Classified<'static> {
        Classified::Link(LinkTarget::Record { did, collection, rkey })
    }

    #[test]
    fn classifies_record_uris() {
        assert_eq!(
            classify_link("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j"),
            record(DID, "app.bsky.feed.post", "3mmoodizfwc2j")
        );
        assert_eq!(
            classify_link("at://did:web:example.com/app.bsky.actor.profile/self"),
            record("did:web:example.com", "app.bsky.actor.profile", "self")
        );
    }

    #[test]
    fn classifies_bare_dids_and_did_uris() {
        assert_eq!(classify_link(DID), Classified::Link(LinkTarget::Did(DID)));
        assert_eq!(classify_link("did:web:stream.place"), Classified::Link(LinkTarget::Did("did:web:stream.place")));
        assert_eq!(classify_link("at://did:plc:vfnmgxg2yscfliemmcxzyfyh"), Classified::Link(LinkTarget::Did(DID)));
    }

    #[test]
    fn counts_but_does_not_index_collection_only_and_handle_uris() {
        assert_eq!(
            classify_link("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post"),
            Classified::CollectionOnly
        );
        assert_eq!(classify_link("at://bsky.app"), Classified::HandleAuthority);
        assert_eq!(classify_link("at://bsky.app/app.bsky.feed.post/3mmoodizfwc2j"), Classified::HandleAuthority);
        assert_eq!(classify_link("at://bsky.app/app.bsky.feed.post"), Classified::HandleAuthority);
    }

    #[test]
    fn everything_else_is_not_a_link() {
        let uri = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
        for text in [
            "",
            "hello",
            "ftp://bsky.app/profile/did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "wss://bsky.app",
            "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em",
            "app.bsky.feed.like",
            "at:/did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "AT://did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "did:PLC:vfnmgxg2yscfliemmcxzyfyh",
            "did:plc:",
            "did:plc:abc:",
            " did:plc:vfnmgxg2yscfliemmcxzyfyh",
            "did:plc:vfnmgxg2yscfliemmcxzyfyh ",
            &format!("see {uri}"),
            &format!("{uri} is great"),
            &format!("{uri}?reply=1"),
            &format!("{uri}#frag"),
            &format!("{uri}/extra"),
            &format!("{uri}/"),
            "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/",
            "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/notansid/3mmoodizfwc2j",
            "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/..",
            "at://not_a_handle",
        ] {
            assert_eq!(classify_link(text), Classified::NotALink, "{text:?}");
        }
    }

    #[test]
    fn overlong_strings_are_not_links() {
        let long_did = format!("did:plc:{}", "a".repeat(MAX_DID_LEN));
        assert_eq!(classify_link(&long_did), Classified::NotALink);
        let long_rkey = format!("at://{DID}/app.bsky.feed.post/{}", "a".repeat(MAX_RECORD_KEY_LEN + 1));
        assert_eq!(classify_link(&long_rkey), Classified::NotALink);
    }

    #[test]
    fn parse_target_accepts_exactly_the_link_forms() {
        assert_eq!(parse_target(DID), Ok(LinkTarget::Did(DID)));
        assert_eq!(parse_target("at://did:plc:vfnmgxg2yscfliemmcxzyfyh"), Ok(LinkTarget::Did(DID)));
        assert_eq!(
            parse_target("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j"),
            Ok(LinkTarget::Record { did: DID, collection: "app.bsky.feed.post", rkey: "3mmoodizfwc2j" })
        );
    }

    fn target_error(s: &str) -> String {
        parse_target(s).expect_err(s).to_string()
    }

    #[test]
    fn parse_target_explains_rejections() {
        assert_eq!(
            target_error("at://bsky.app/app.bsky.feed.post/3k"),
            "target not supported: handle authority not supported, use the DID"
        );
        assert_eq!(
            target_error("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post"),
            "target not supported: at-uri without record key, use at://DID/COLLECTION/RKEY or at://DID"
        );
        assert_eq!(target_error(""), "target is empty");
        assert_eq!(
            target_error("ftp://bsky.app"),
            "target is malformed: must be an at:// URI, a DID or an http(s):// URL"
        );
        assert_eq!(target_error("https://bsky.app/a b"), "URL contains ' ' at byte 18, which is not allowed there");
        assert_eq!(target_error("did:plc:ab@c"), "DID contains '@' at byte 10, which is not allowed there");
        assert_eq!(target_error("did:PLC:abc"), "DID contains 'P' at byte 4, which is not allowed there");
        assert_eq!(target_error("at://did:plc:abc#x"), "at-uri is malformed: a query or fragment is not allowed");
        assert_eq!(
            target_error("at://did:plc:abc/app.bsky.feed.post/3k/x"),
            "at-uri is malformed: too many path segments, expected at://AUTHORITY/COLLECTION/RKEY"
        );
        assert_eq!(
            target_error("at://did:plc:abc/app.bsky/3k"),
            "NSID is malformed: must have at least three segments separated by '.'"
        );
        assert_eq!(
            target_error("at://did:plc:abc/a.b.c/3k%"),
            "record key contains '%' at byte 2, which is not allowed there"
        );
    }

    #[test]
    fn error_messages_name_the_problem() {
        let long = "a".repeat(MAX_DID_LEN);
        assert_eq!(
            validate_did(&format!("did:x:{long}")).unwrap_err().to_string(),
            "DID is 2054 bytes long, the limit is 2048"
        );
        assert_eq!(
            validate_handle("jo💩.test").unwrap_err(),
            SyntaxError::BadChar { kind: SyntaxKind::Handle, found: '💩', at: 2 }
        );
        assert_eq!(
            validate_handle("john.test.").unwrap_err(),
            malformed(SyntaxKind::Handle, "has an empty label (a leading, trailing or doubled '.')")
        );
        assert_eq!(
            validate_handle("john.0a").unwrap_err(),
            malformed(SyntaxKind::Handle, "the last label (the top-level domain) must start with a letter")
        );
        assert_eq!(
            validate_nsid("com.example.fooBar.2").unwrap_err(),
            malformed(SyntaxKind::Nsid, "the name (last segment) must start with a letter")
        );
        assert_eq!(
            validate_nsid("com.exam_ple.foo").unwrap_err(),
            SyntaxError::BadChar { kind: SyntaxKind::Nsid, found: '_', at: 8 }
        );
        assert_eq!(
            validate_nsid("com.example.p_st").unwrap_err(),
            SyntaxError::BadChar { kind: SyntaxKind::Nsid, found: '_', at: 13 }
        );
        assert_eq!(
            validate_tid("c222222222222").unwrap_err(),
            malformed(SyntaxKind::Tid, "the first character must be one of 234567ab (the top bit is always 0)")
        );
        assert_eq!(
            validate_tid("3jzfcijpj2z21").unwrap_err(),
            SyntaxError::BadChar { kind: SyntaxKind::Tid, found: '1', at: 12 }
        );
        assert_eq!(validate_tid("3jzf").unwrap_err(), malformed(SyntaxKind::Tid, "must be exactly 13 characters"));
        assert_eq!(
            validate_record_key("..").unwrap_err(),
            malformed(SyntaxKind::RecordKey, "must not be \".\" or \"..\"")
        );
        assert_eq!(validate_at_identifier("").unwrap_err(), SyntaxError::Empty { kind: SyntaxKind::AtIdentifier });
    }

    #[test]
    fn classifies_urls_as_written() {
        for url in [
            "https://example.com",
            "http://example.com/a?b=c#d",
            "https://ja.wikipedia.org/wiki/日本",
            "https://EXAMPLE.com/../x",
            "https://user@host:8080",
            "http://[2001:db8::1]:80/x",
            "https://xn--bcher-kva.example/%20",
        ] {
            assert_eq!(classify_link(url), Classified::Link(LinkTarget::Url(url)), "{url:?}");
            assert_eq!(parse_target(url), Ok(LinkTarget::Url(url)));
            assert_eq!(LinkTarget::Url(url).to_string(), url);
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN - 20));
        assert_eq!(classify_link(&long), Classified::Link(LinkTarget::Url(&long)));
        let too_long = format!("{long}a");
        for not_url in [
            "https://",
            "http:///path",
            "https://?q",
            "HTTPS://example.com",
            "https://a b",
            "https://a\tb",
            "httpx://a",
            "ftp://a",
            "https:/a",
            too_long.as_str(),
        ] {
            assert_eq!(classify_link(not_url), Classified::NotALink, "{not_url:?}");
            assert!(parse_target(not_url).is_err(), "{not_url:?}");
        }
        assert_eq!(
            parse_target("https://a b").unwrap_err(),
            SyntaxError::BadChar { kind: SyntaxKind::Url, found: ' ', at: 9 }
        );
        assert_eq!(
            parse_target("https://").unwrap_err(),
            malformed(SyntaxKind::Url, "has no host, or a host with characters a host cannot have")
        );
        assert_eq!(
            parse_target("https://a:b").unwrap_err(),
            malformed(SyntaxKind::Url, "has a port that is not a number")
        );
        assert_eq!(
            parse_target(&too_long).unwrap_err(),
            SyntaxError::TooLong { kind: SyntaxKind::Url, len: MAX_URL_LEN + 1, max: MAX_URL_LEN }
        );
    }

    #[test]
    fn at_uri_parts() {
        let uri = AtUri::parse("at://did:plc:abc/app.bsky.feed.post/self").unwrap();
        assert_eq!(uri, AtUri { authority: "did:plc:abc", collection: Some("app.bsky.feed.post"), rkey: Some("self") });
        assert!(uri.has_did_authority());
        let uri = AtUri::parse("at://bsky.app").unwrap();
        assert_eq!(uri, AtUri { authority: "bsky.app", collection: None, rkey: None });
        assert!(!uri.has_did_authority());
    }
}
