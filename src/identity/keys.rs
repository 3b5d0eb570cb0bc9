//! The public keys of atproto identities (secp256k1 and NIST P-256) and the signatures they check.
//!
//! Keys arrive as Multikey strings (`z` + base58btc of a two-byte multicodec prefix and the
//! compressed point), as `did:key:` + Multikey (PLC operations), or in the legacy DID document
//! form (`z` + base58btc of the bare SEC1 point, the curve named by the method's `type`).
//! Signatures are the 64-byte `r || s` form over the SHA-256 of the signed bytes.
//!
//! Invariants:
//! - A key is a valid point of its curve, or it is not a key (`KeyError`).
//! - A signature is accepted only when it is exactly 64 bytes, `r` and `s` in range, `s` in the
//!   low half of the group order (the "low-S" form atproto requires of both curves: a high-S
//!   twin of a valid signature is refused, not normalized), and it verifies.
//! - The cryptography is RustCrypto's (`k256`, `p256`, `sha2`); nothing here does arithmetic.

use ipld_core::cid::multibase::{self, Base};
use k256::ecdsa::signature::hazmat::PrehashVerifier;
use sha2::{Digest, Sha256};

/// Multicodec `secp256k1-pub` (0xe7) as an unsigned varint.
const SECP256K1_PREFIX: [u8; 2] = [0xe7, 0x01];
/// Multicodec `p256-pub` (0x1200) as an unsigned varint.
const P256_PREFIX: [u8; 2] = [0x80, 0x24];
/// A compressed SEC1 point of either curve.
const COMPRESSED_POINT_LEN: usize = 33;
/// Longest key text looked at (an uncompressed legacy key is about 90 characters).
const MAX_KEY_TEXT: usize = 256;
/// The 64-byte `r || s` signature.
pub const SIGNATURE_LEN: usize = 64;

/// The two curves atproto signs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    /// secp256k1 ("K-256", `ES256K`).
    K256,
    /// NIST P-256 (`ES256`).
    P256,
}

/// A verifying key of either curve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    K256(k256::ecdsa::VerifyingKey),
    P256(p256::ecdsa::VerifyingKey),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not a base58btc multibase string")]
    Encoding,
    #[error("not a secp256k1 or P-256 Multikey")]
    UnknownCodec,
    #[error("not a valid {0:?} point")]
    BadPoint(Curve),
    #[error("not a did:key")]
    NotDidKey,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("a signature is 64 bytes, got {0}")]
    Length(usize),
    #[error("the signature is not a valid (r, s) pair")]
    Malformed,
    #[error("the signature is not in low-S form")]
    HighS,
    #[error("the signature does not verify with the key")]
    Mismatch,
}

impl PublicKey {
    /// A Multikey string: `z` + base58btc(multicodec prefix || compressed point).
    pub fn from_multikey(text: &str) -> Result<Self, KeyError> {
        let bytes = decode_base58btc(text)?;
        let (prefix, point) = bytes.split_at_checked(2).ok_or(KeyError::UnknownCodec)?;
        let curve = match <[u8; 2]>::try_from(prefix).map_err(|_| KeyError::UnknownCodec)? {
            SECP256K1_PREFIX => Curve::K256,
            P256_PREFIX => Curve::P256,
            _ => return Err(KeyError::UnknownCodec),
        };
        // A Multikey holds a compressed point: 33 bytes, tagged 0x02 or 0x03 (the curve crates
        // are lenient about the tag; the encoding is not).
        if point.len() != COMPRESSED_POINT_LEN || !matches!(point[0], 0x02 | 0x03) {
            return Err(KeyError::BadPoint(curve));
        }
        Self::from_sec1(curve, point)
    }

    /// `did:key:` followed by a Multikey.
    pub fn from_did_key(text: &str) -> Result<Self, KeyError> {
        Self::from_multikey(text.strip_prefix("did:key:").ok_or(KeyError::NotDidKey)?)
    }

    /// The legacy DID document form: `z` + base58btc of a SEC1 point (compressed or not), on the
    /// curve the verification method's `type` names.
    pub fn from_legacy(curve: Curve, text: &str) -> Result<Self, KeyError> {
        Self::from_sec1(curve, &decode_base58btc(text)?)
    }

    fn from_sec1(curve: Curve, point: &[u8]) -> Result<Self, KeyError> {
        match curve {
            Curve::K256 => k256::ecdsa::VerifyingKey::from_sec1_bytes(point).map(PublicKey::K256),
            Curve::P256 => p256::ecdsa::VerifyingKey::from_sec1_bytes(point).map(PublicKey::P256),
        }
        .map_err(|_| KeyError::BadPoint(curve))
    }

    pub fn curve(&self) -> Curve {
        match self {
            PublicKey::K256(_) => Curve::K256,
            PublicKey::P256(_) => Curve::P256,
        }
    }

    /// The Multikey string of this key (compressed point).
    pub fn to_multikey(&self) -> String {
        let (prefix, point) = match self {
            PublicKey::K256(key) => (SECP256K1_PREFIX, key.to_sec1_point(true).as_bytes().to_vec()),
            PublicKey::P256(key) => (P256_PREFIX, key.to_sec1_point(true).as_bytes().to_vec()),
        };
        assert_eq!(point.len(), COMPRESSED_POINT_LEN);
        multibase::encode(Base::Base58Btc, [prefix.as_slice(), &point].concat())
    }

    /// Checks `signature` over `message` (hashed here with SHA-256).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
        self.verify_digest(&Sha256::digest(message).into(), signature)
    }

    /// Checks `signature` over a SHA-256 digest already computed (one hash, several keys).
    pub fn verify_digest(&self, digest: &[u8; 32], signature: &[u8]) -> Result<(), SignatureError> {
        if signature.len() != SIGNATURE_LEN {
            return Err(SignatureError::Length(signature.len()));
        }
        match self {
            PublicKey::K256(key) => {
                let signature = k256::ecdsa::Signature::from_slice(signature).map_err(|_| SignatureError::Malformed)?;
                if signature.normalize_s() != signature {
                    return Err(SignatureError::HighS);
                }
                key.verify_prehash(digest, &signature).map_err(|_| SignatureError::Mismatch)
            }
            PublicKey::P256(key) => {
                let signature = p256::ecdsa::Signature::from_slice(signature).map_err(|_| SignatureError::Malformed)?;
                if signature.normalize_s() != signature {
                    return Err(SignatureError::HighS);
                }
                key.verify_prehash(digest, &signature).map_err(|_| SignatureError::Mismatch)
            }
        }
    }
}

/// The bytes of a `z`-prefixed (base58btc) multibase string, and nothing else.
fn decode_base58btc(text: &str) -> Result<Vec<u8>, KeyError> {
    if text.len() > MAX_KEY_TEXT || !text.starts_with('z') {
        return Err(KeyError::Encoding);
    }
    match multibase::decode(text) {
        Ok((Base::Base58Btc, bytes)) => Ok(bytes),
        _ => Err(KeyError::Encoding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use data_encoding::BASE64_NOPAD;
    use k256::ecdsa::signature::hazmat::PrehashSigner;

    /// The interop crypto vectors (`tests/data/interop-crypto/signature-fixtures.json`): two
    /// valid signatures, two high-S twins, two DER-encoded ones; each key in both encodings.
    #[test]
    fn the_interop_signature_vectors_verify_exactly_when_they_should() {
        let path = format!("{}/tests/data/interop-crypto/signature-fixtures.json", env!("CARGO_MANIFEST_DIR"));
        let vectors: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(vectors.len(), 6);
        for vector in vectors {
            let field = |name: &str| vector[name].as_str().unwrap().to_string();
            let key = PublicKey::from_did_key(&field("publicKeyDid")).unwrap();
            let curve = if field("algorithm") == "ES256K" { Curve::K256 } else { Curve::P256 };
            assert_eq!(key.curve(), curve);
            assert_eq!(PublicKey::from_legacy(curve, &field("publicKeyMultibase")).unwrap(), key);
            assert_eq!(format!("did:key:{}", key.to_multikey()), field("publicKeyDid"));
            let message = BASE64_NOPAD.decode(field("messageBase64").as_bytes()).unwrap();
            let signature = BASE64_NOPAD.decode(field("signatureBase64").as_bytes()).unwrap();
            let verdict = key.verify(&message, &signature);
            assert_eq!(
                verdict.is_ok(),
                vector["validSignature"].as_bool().unwrap(),
                "{}: {verdict:?}",
                field("comment")
            );
            let tags: Vec<&str> = vector["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
            if tags.contains(&"high-s") {
                assert_eq!(verdict, Err(SignatureError::HighS), "{}", field("comment"));
            }
        }
    }

    #[test]
    fn signatures_over_other_bytes_or_keys_do_not_verify() {
        let signing = k256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
        let key = PublicKey::K256(*signing.verifying_key());
        let digest: [u8; 32] = Sha256::digest(b"commit").into();
        let signature: k256::ecdsa::Signature = signing.sign_prehash(&digest).unwrap();
        let bytes = signature.to_bytes().to_vec();
        assert_eq!(key.verify(b"commit", &bytes), Ok(()));
        assert_eq!(key.verify(b"commiT", &bytes), Err(SignatureError::Mismatch));
        let other = PublicKey::K256(*k256::ecdsa::SigningKey::from_slice(&[8; 32]).unwrap().verifying_key());
        assert_eq!(other.verify(b"commit", &bytes), Err(SignatureError::Mismatch));
        assert_eq!(key.verify(b"commit", &bytes[..63]), Err(SignatureError::Length(63)));
        assert_eq!(key.verify(b"commit", &[0; 64]), Err(SignatureError::Malformed));
        let p256 = PublicKey::P256(*p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap().verifying_key());
        assert_eq!(p256.verify(b"commit", &bytes), Err(SignatureError::Mismatch), "another curve");
        assert_eq!(PublicKey::from_multikey(&key.to_multikey()), Ok(key));
    }

    #[test]
    fn key_text_that_is_not_a_key_is_refused() {
        let k256 = PublicKey::K256(*k256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap().verifying_key());
        let text = k256.to_multikey();
        assert!(text.starts_with("zQ3s"), "{text}");
        assert_eq!(PublicKey::from_multikey(&text[1..]), Err(KeyError::Encoding), "no multibase prefix");
        assert_eq!(PublicKey::from_multikey(&format!("m{}", &text[1..])), Err(KeyError::Encoding));
        assert_eq!(PublicKey::from_did_key(&text), Err(KeyError::NotDidKey));
        let mut bytes = decode_base58btc(&text).unwrap();
        bytes[0] = 0xed; // ed25519-pub
        assert_eq!(PublicKey::from_multikey(&multibase::encode(Base::Base58Btc, &bytes)), Err(KeyError::UnknownCodec));
        bytes[0] = 0xe7;
        bytes[2] = 0x05; // not a compressed point's first byte
        assert_eq!(
            PublicKey::from_multikey(&multibase::encode(Base::Base58Btc, &bytes)),
            Err(KeyError::BadPoint(Curve::K256))
        );
        assert_eq!(PublicKey::from_multikey(&"z".repeat(300)), Err(KeyError::Encoding));
    }
}
