//! DAG-CBOR -> atproto JSON: the first byte is `max_depth`, the rest is decoded as DAG-CBOR and
//! converted by `dagcbor_to_json`.
//!
//! Invariants checked (src/ingest/repo/json.rs states them):
//! - The conversion succeeds exactly when the value has no float, no integer outside i64 and no
//!   more than `min(max_depth, RECORD_DEPTH_CAP)` nested lists and maps.
//! - It loses nothing: converting the JSON back (an independent inverse written here: `$link`
//!   objects are CIDs, `$bytes` objects base64) gives the original value, whenever the original has
//!   no map that would itself look like a `$link` or `$bytes` object.
#![no_main]

use backlinks::ingest::repo::{RECORD_DEPTH_CAP, dagcbor_to_json};
use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&max_depth, cbor)) = data.split_first() else { return };
    let max_depth = usize::from(max_depth);
    let Ok(ipld) = serde_ipld_dagcbor::from_slice::<Ipld>(cbor) else { return };
    let converted = dagcbor_to_json(&ipld, max_depth);
    let convertible = fits_json(&ipld) && nesting(&ipld) <= max_depth.min(RECORD_DEPTH_CAP);
    assert_eq!(converted.is_ok(), convertible, "{converted:?} for {ipld:?}");
    if let Ok(json) = converted
        && !has_ambiguous_map(&ipld)
    {
        assert_eq!(json_to_ipld(&json), Some(ipld), "conversion is lossy: {json}");
    }
});

/// No floats, and every integer fits an i64.
fn fits_json(ipld: &Ipld) -> bool {
    match ipld {
        Ipld::Float(_) => false,
        Ipld::Integer(int) => i64::try_from(*int).is_ok(),
        Ipld::List(items) => items.iter().all(fits_json),
        Ipld::Map(fields) => fields.values().all(fits_json),
        _ => true,
    }
}

/// Lists and maps nested in each other, counting the outermost.
fn nesting(ipld: &Ipld) -> usize {
    match ipld {
        Ipld::List(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Ipld::Map(fields) => 1 + fields.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// A map whose one key is `$link` or `$bytes` converts to JSON that reads back as a CID or bytes.
fn has_ambiguous_map(ipld: &Ipld) -> bool {
    match ipld {
        Ipld::List(items) => items.iter().any(has_ambiguous_map),
        Ipld::Map(fields) => {
            let looks_special = fields.len() == 1 && fields.keys().any(|key| key == "$link" || key == "$bytes");
            looks_special || fields.values().any(has_ambiguous_map)
        }
        _ => false,
    }
}

fn json_to_ipld(json: &Value) -> Option<Ipld> {
    Some(match json {
        Value::Null => Ipld::Null,
        Value::Bool(flag) => Ipld::Bool(*flag),
        Value::Number(number) => Ipld::Integer(i128::from(number.as_i64()?)),
        Value::String(text) => Ipld::String(text.clone()),
        Value::Array(items) => Ipld::List(items.iter().map(json_to_ipld).collect::<Option<_>>()?),
        Value::Object(map) => match (map.len(), map.get("$link"), map.get("$bytes")) {
            (1, Some(Value::String(cid)), _) => Ipld::Link(cid.parse::<Cid>().ok()?),
            (1, _, Some(Value::String(base64))) => Ipld::Bytes(base64_decode(base64)?),
            _ => Ipld::Map(
                map.iter().map(|(key, value)| Some((key.clone(), json_to_ipld(value)?))).collect::<Option<_>>()?,
            ),
        },
    })
}

/// Standard alphabet, no padding; `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut bits, mut bit_count, mut out) = (0u32, 0u32, Vec::new());
    for symbol in text.bytes() {
        bits = (bits << 6) | ALPHABET.iter().position(|&c| c == symbol)? as u32;
        bit_count += 6;
        if bit_count >= 8 {
            bit_count -= 8;
            out.push((bits >> bit_count) as u8);
            bits &= (1 << bit_count) - 1;
        }
    }
    (bits == 0 && bit_count < 6).then_some(out)
}
