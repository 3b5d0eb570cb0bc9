//! DID documents: the two things backfill needs from one, the repository's signing key (the
//! `#atproto` verification method) and its PDS (the `#atproto_pds` service), both checked.
//!
//! Invariants:
//! - A document is believed only for the DID it names (`id` equal to the DID resolved).
//! - A signing key is a valid point (`keys`); a document whose `#atproto` method is present but
//!   unusable has no key rather than a wrong one.
//! - A PDS endpoint is an origin: `https://host[:port]` (plain `http` only where the resolver
//!   allows private networks, for local setups and tests), with no user, path, query or fragment,
//!   so that `/xrpc/...` appended to it is exactly what is fetched.

use super::keys::{Curve, PublicKey};
use serde_json::Value;

/// Largest DID document read.
pub const MAX_DOCUMENT_BYTES: usize = 64 << 10;
/// Longest endpoint URL accepted.
const MAX_ENDPOINT_LEN: usize = 512;

/// What an identity is for backfill: whose repository, signed by which key, served by which PDS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub did: String,
    /// `None` when the identity has no usable atproto signing key (nothing of it can be verified).
    pub signing_key: Option<PublicKey>,
    /// The PDS origin, `https://host[:port]`; `None` when it has none.
    pub pds: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error("the DID document is not JSON: {0}")]
    Json(String),
    #[error("the DID document is for {found:?}, not {expected}")]
    WrongDid { expected: String, found: String },
    #[error("the DID document is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
}

/// Parses a DID document resolved for `did`. `allow_http(host, port)` says whether a PDS endpoint
/// there may be plain http.
pub fn parse_document(
    did: &str,
    bytes: &[u8],
    allow_http: &dyn Fn(&str, u16) -> bool,
) -> Result<Identity, DocumentError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::TooLarge);
    }
    let document: Value = serde_json::from_slice(bytes).map_err(|e| DocumentError::Json(e.to_string()))?;
    let found = document.get("id").and_then(Value::as_str).unwrap_or("");
    if found != did {
        return Err(DocumentError::WrongDid { expected: did.to_string(), found: found.chars().take(256).collect() });
    }
    let signing_key = find_by_id(&document, "verificationMethod", did, "atproto").and_then(signing_key);
    let pds = find_by_id(&document, "service", did, "atproto_pds")
        .filter(|service| service.get("type").and_then(Value::as_str) == Some("AtprotoPersonalDataServer"))
        .and_then(|service| service.get("serviceEndpoint")?.as_str())
        .and_then(|endpoint| pds_origin(endpoint, allow_http).ok());
    Ok(Identity { did: did.to_string(), signing_key, pds })
}

/// The first entry of `document[list]` whose `id` is `#fragment` or `<did>#fragment`.
fn find_by_id<'d>(document: &'d Value, list: &str, did: &str, fragment: &str) -> Option<&'d Value> {
    let entries = document.get(list)?.as_array()?;
    entries.iter().find(|entry| {
        entry
            .get("id")
            .and_then(Value::as_str)
            .is_some_and(|id| id.strip_prefix(did).unwrap_or(id).strip_prefix('#').is_some_and(|rest| rest == fragment))
    })
}

/// The key of an `#atproto` verification method: a `Multikey`, or one of the two legacy types.
fn signing_key(method: &Value) -> Option<PublicKey> {
    let text = method.get("publicKeyMultibase")?.as_str()?;
    match method.get("type")?.as_str()? {
        "Multikey" => PublicKey::from_multikey(text).ok(),
        "EcdsaSecp256k1VerificationKey2019" => PublicKey::from_legacy(Curve::K256, text).ok(),
        "EcdsaSecp256r1VerificationKey2019" => PublicKey::from_legacy(Curve::P256, text).ok(),
        _ => None,
    }
}

/// `endpoint` as a bare origin (`scheme://host[:port]`, lowercase scheme, no trailing slash), or
/// why it is not one. Plain http only where `allow_http(host, port)` says so.
pub fn pds_origin(endpoint: &str, allow_http: &dyn Fn(&str, u16) -> bool) -> Result<String, String> {
    if endpoint.len() > MAX_ENDPOINT_LEN {
        return Err("the endpoint is too long".into());
    }
    if endpoint.contains(['#', '?', '@', '\\']) || endpoint.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{endpoint:?} is not a bare origin (no user, query or fragment)"));
    }
    let uri: http::Uri = endpoint.parse().map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
    let authority = uri.authority().ok_or_else(|| format!("{endpoint:?} has no host"))?;
    match scheme.as_deref() {
        Some("https") => {}
        Some("http") if allow_http(authority.host(), authority.port_u16().unwrap_or(80)) => {}
        _ => return Err(format!("{endpoint:?} is not an https URL")),
    }
    if authority.host().is_empty() || !matches!(uri.path(), "" | "/") {
        return Err(format!("{endpoint:?} is not a bare origin (no path)"));
    }
    Ok(format!("{}://{}", scheme.unwrap_or_default(), authority.as_str().to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K256_MULTIKEY: &str = "zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc";

    fn document(id: &str, method: Value, service: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "@context": ["https://www.w3.org/ns/did/v1"],
            "id": id,
            "verificationMethod": [method],
            "service": [service],
        }))
        .unwrap()
    }

    fn method(id: &str, kind: &str, key: &str) -> Value {
        serde_json::json!({"id": id, "type": kind, "controller": "did:plc:abc", "publicKeyMultibase": key})
    }

    fn pds(id: &str, endpoint: &str) -> Value {
        serde_json::json!({"id": id, "type": "AtprotoPersonalDataServer", "serviceEndpoint": endpoint})
    }

    #[test]
    fn a_current_document_gives_its_key_and_pds() {
        let did = "did:plc:abc";
        let bytes = document(
            did,
            method("did:plc:abc#atproto", "Multikey", K256_MULTIKEY),
            pds("#atproto_pds", "https://PDS.example.com/"),
        );
        let identity = parse_document(did, &bytes, &|_, _| false).unwrap();
        assert_eq!(identity.signing_key.unwrap().to_multikey(), K256_MULTIKEY);
        assert_eq!(identity.pds.as_deref(), Some("https://pds.example.com"));
    }

    #[test]
    fn the_documents_beside_the_fixture_cars_give_their_keys() {
        let dir = format!("{}/tests/data/car/indigo", env!("CARGO_MANIFEST_DIR"));
        // fakermaker's PDS is http://localhost:2583: not an origin the public network may use.
        for (name, did, has_pds) in [
            ("paul_staging", "did:plc:cmpvykrzb2l22kj4ojlv3ox4", true),
            ("fakermaker", "did:plc:dpg45vsnuir2vqqqadsn6afg", false),
            ("greenground", "did:plc:wqgdnqlv2mwiio6pfchwtrff", true),
        ] {
            let bytes = std::fs::read(format!("{dir}/{name}.didDoc.json")).unwrap();
            let identity = parse_document(did, &bytes, &|_, _| false).unwrap();
            assert!(identity.signing_key.is_some(), "{name}: the legacy key parses");
            assert_eq!(identity.pds.is_some(), has_pds, "{name}");
        }
    }

    #[test]
    fn a_document_for_another_did_is_refused() {
        let bytes = document(
            "did:plc:other",
            method("#atproto", "Multikey", K256_MULTIKEY),
            pds("#atproto_pds", "https://a.b"),
        );
        let error = parse_document("did:plc:abc", &bytes, &|_, _| false).unwrap_err();
        assert!(matches!(error, DocumentError::WrongDid { .. }), "{error}");
        assert!(parse_document("did:plc:abc", b"{", &|_, _| false).is_err());
        assert_eq!(
            parse_document("did:plc:abc", &vec![b' '; MAX_DOCUMENT_BYTES + 1], &|_, _| false),
            Err(DocumentError::TooLarge)
        );
    }

    #[test]
    fn unusable_keys_and_services_are_absent_not_wrong() {
        let did = "did:plc:abc";
        for (method, service) in [
            (method("#atproto", "Ed25519VerificationKey2020", K256_MULTIKEY), pds("#atproto_labeler", "https://a.b")),
            (method("#other", "Multikey", K256_MULTIKEY), pds("#atproto_pds", "https://a.b/path")),
            (
                method("#atproto", "Multikey", "zQ3sh"),
                serde_json::json!({"id": "#atproto_pds", "type": "Other", "serviceEndpoint": "https://a.b"}),
            ),
        ] {
            let identity = parse_document(did, &document(did, method, service), &|_, _| false).unwrap();
            assert_eq!((identity.signing_key, identity.pds), (None, None));
        }
    }

    #[test]
    fn only_bare_https_origins_are_endpoints() {
        assert_eq!(pds_origin("https://pds.example.com", &|_, _| false).as_deref(), Ok("https://pds.example.com"));
        assert_eq!(
            pds_origin("https://pds.example.com:8443/", &|_, _| false).as_deref(),
            Ok("https://pds.example.com:8443")
        );
        for bad in [
            "https://pds.example.com#",
            "https://pds.example.com/#",
            "https://pds.example.com/xrpc",
            "https://pds.example.com?a=b",
            "https://user@pds.example.com",
            "http://pds.example.com",
            "ftp://pds.example.com",
            "pds.example.com",
            "https://",
            "https://pds.example.com\n",
        ] {
            assert!(pds_origin(bad, &|_, _| false).is_err(), "accepted {bad:?}");
        }
        let local = |host: &str, port: u16| host == "127.0.0.1" && port == 2583;
        assert_eq!(pds_origin("http://127.0.0.1:2583", &local).as_deref(), Ok("http://127.0.0.1:2583"));
        assert!(pds_origin("http://127.0.0.1:2584", &local).is_err());
    }
}
