//! DAG-CBOR records in the atproto JSON data model: links as `{"$link": cid}`, bytes as
//! `{"$bytes": base64}` (standard alphabet, no padding); floats and integers outside i64 refused.
//!
//! Invariants:
//! - Nesting beyond the limit (itself capped at `RECORD_DEPTH_CAP`) is an error, never deep
//!   recursion.

use super::CarError;
use ipld_core::ipld::Ipld;
use serde_json::{Map, Value};

/// Hard cap on the conversion's recursion, whatever the limits say.
pub const RECORD_DEPTH_CAP: usize = 256;

/// Converts a DAG-CBOR value to the atproto JSON data model: links become `{"$link": cid}`, bytes
/// `{"$bytes": base64}` (standard alphabet, no padding); floats and integers outside i64 are errors.
/// Nesting beyond `max_depth` (itself capped at [`RECORD_DEPTH_CAP`]) is an error.
pub fn dagcbor_to_json(ipld: &Ipld, max_depth: usize) -> Result<Value, CarError> {
    let max_depth = max_depth.min(RECORD_DEPTH_CAP);
    ipld_to_json(ipld, max_depth, max_depth)
}

fn ipld_to_json(ipld: &Ipld, depth_left: usize, max_depth: usize) -> Result<Value, CarError> {
    let nested_depth = || depth_left.checked_sub(1).ok_or(CarError::RecordTooDeep { max: max_depth });
    Ok(match ipld {
        Ipld::Null => Value::Null,
        Ipld::Bool(flag) => Value::Bool(*flag),
        Ipld::Integer(int) => Value::from(i64::try_from(*int).map_err(|_| CarError::RecordInteger(*int))?),
        Ipld::Float(_) => return Err(CarError::RecordFloat),
        Ipld::String(text) => Value::String(text.clone()),
        Ipld::Bytes(bytes) => single_key_object("$bytes", base64_encode_unpadded(bytes)),
        Ipld::Link(cid) => single_key_object("$link", cid.to_string()),
        Ipld::List(items) => {
            let depth = nested_depth()?;
            Value::Array(items.iter().map(|item| ipld_to_json(item, depth, max_depth)).collect::<Result<_, _>>()?)
        }
        Ipld::Map(fields) => {
            let depth = nested_depth()?;
            let mut object = Map::new();
            for (key, field) in fields {
                object.insert(key.clone(), ipld_to_json(field, depth, max_depth)?);
            }
            Value::Object(object)
        }
    })
}

fn single_key_object(key: &str, value: String) -> Value {
    let mut object = Map::new();
    object.insert(key.to_owned(), Value::String(value));
    Value::Object(object)
}

const BASE64_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648 section 4) without `=` padding, as atproto's `$bytes` uses.
pub fn base64_encode_unpadded(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(base64_unpadded_len(bytes.len()));
    for chunk in bytes.chunks(3) {
        let mut group = [0u8; 4];
        group[1..1 + chunk.len()].copy_from_slice(chunk);
        let bits = u32::from_be_bytes(group);
        // n input bytes carry 8n bits: n + 1 six-bit symbols cover them.
        for symbol in 0..=chunk.len() {
            let index = (bits >> (18 - 6 * symbol)) & 0x3f;
            out.push(char::from(BASE64_ALPHABET[index as usize]));
        }
    }
    assert_eq!(out.len(), base64_unpadded_len(bytes.len()), "base64 output length");
    out
}

fn base64_unpadded_len(input_len: usize) -> usize {
    input_len / 3 * 4 + [0, 2, 3][input_len % 3]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipld_core::cid::Cid;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ipld_map<const N: usize>(fields: [(&str, Ipld); N]) -> Ipld {
        Ipld::Map(fields.into_iter().map(|(key, value)| (key.to_owned(), value)).collect::<BTreeMap<_, _>>())
    }

    /// Test-side decoder, written independently of the encoder, for round trips.
    fn base64_decode_unpadded(text: &str) -> Option<Vec<u8>> {
        let mut bits = 0u32;
        let mut bit_count = 0;
        let mut out = Vec::new();
        for symbol in text.bytes() {
            let value = BASE64_ALPHABET.iter().position(|&c| c == symbol)? as u32;
            bits = (bits << 6) | value;
            bit_count += 6;
            if bit_count >= 8 {
                bit_count -= 8;
                out.push((bits >> bit_count) as u8);
                bits &= (1 << bit_count) - 1;
            }
        }
        (bits == 0).then_some(out)
    }

    #[test]
    fn base64_matches_rfc4648_vectors_without_padding() {
        let vectors = [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg")];
        for (input, expected) in vectors.into_iter().chain([("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy")]) {
            assert_eq!(base64_encode_unpadded(input.as_bytes()), expected);
            assert_eq!(base64_decode_unpadded(expected).as_deref(), Some(input.as_bytes()));
        }
        assert_eq!(base64_encode_unpadded(&[0xfb, 0xff]), "+/8");
    }

    proptest! {
        #[test]
        fn base64_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let text = base64_encode_unpadded(&bytes);
            prop_assert_eq!(text.len(), base64_unpadded_len(bytes.len()));
            prop_assert_eq!(base64_decode_unpadded(&text), Some(bytes));
        }
    }

    #[test]
    fn json_conversion_follows_the_atproto_data_model() {
        let cid: Cid = "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy".parse().unwrap();
        let record = ipld_map([
            ("b", Ipld::Bytes(vec![1, 2, 3, 4])),
            ("l", Ipld::Link(cid)),
            ("n", Ipld::List(vec![Ipld::Null, Ipld::Bool(true), Ipld::Integer(-7)])),
            ("s", Ipld::String("x".into())),
        ]);
        let expected = serde_json::json!({
            "b": {"$bytes": "AQIDBA"},
            "l": {"$link": "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy"},
            "n": [null, true, -7],
            "s": "x",
        });
        assert_eq!(dagcbor_to_json(&record, 8).unwrap(), expected);
    }

    #[test]
    fn json_conversion_rejects_floats_big_integers_and_deep_nesting() {
        let float = ipld_map([("f", Ipld::Float(1.5))]);
        assert!(matches!(dagcbor_to_json(&float, 8), Err(CarError::RecordFloat)));
        let big = Ipld::Integer(i128::from(i64::MAX) + 1);
        assert!(matches!(dagcbor_to_json(&big, 8), Err(CarError::RecordInteger(_))));
        let nested = Ipld::List(vec![Ipld::List(vec![Ipld::List(vec![])])]);
        assert!(dagcbor_to_json(&nested, 3).is_ok());
        assert!(matches!(dagcbor_to_json(&nested, 2), Err(CarError::RecordTooDeep { max: 2 })));
    }
}
