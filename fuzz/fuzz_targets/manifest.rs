//! Manifests: `Manifest::decode(name, body)` on arbitrary bodies and names.
//!
//! The first byte picks how the name is made (the digest in it is always the body's real xxh3-128,
//! or nothing but the digest check would ever be reached):
//! - bit 0 clear: the canonical name, from the body's own `generation` field;
//! - bit 0 set: the next 16 bytes are the generation part, as the fuzzer wrote them; bit 1 also
//!   writes the digest in upper case.
//!
//! Invariants checked (src/manifest.rs states them):
//! - A manifest that decodes was fetched under its one canonical name: 16 lowercase hex digits of
//!   its generation, `-`, 32 lowercase hex digits of its body's digest (names sort by generation).
//! - Everything in it is valid: table ids are 24 lowercase hex digits, trees are known, shards are
//!   below their count, outline ranges are non-empty and start at or above 0.
//! - decode(encode(m)) == m.
#![no_main]

use backlinks::manifest::{Manifest, is_table_id};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_128;

const GENERATION_TEXT_LEN: usize = 16;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (name, body) = if mode & 1 == 0 {
        (canonical_name(own_generation(rest), rest), rest)
    } else {
        let Some((generation, body)) = split_generation(rest) else { return };
        let digest = format!("{:032x}", xxh3_128(body));
        let digest = if mode & 2 == 0 { digest } else { digest.to_ascii_uppercase() };
        (format!("{generation}-{digest}"), body)
    };
    let Ok(manifest) = Manifest::decode(&name, body) else { return };
    assert_eq!(name, canonical_name(manifest.generation, body), "accepted a non-canonical manifest name");
    check_valid(&manifest);
    let (encoded_name, encoded_body) = manifest.encode();
    let again = Manifest::decode(&encoded_name, &encoded_body).expect("an encoded manifest decodes");
    assert_eq!(again, manifest, "decode(encode(m)) != m");
});

fn canonical_name(generation: u64, body: &[u8]) -> String {
    format!("{generation:016x}-{:032x}", xxh3_128(body))
}

/// The body's `generation` when it is (or is a zstd frame of at most 1 MiB holding) a JSON
/// object that has one, else 0.
fn own_generation(body: &[u8]) -> u64 {
    let inflated = zstd::bulk::decompress(body, 1 << 20).ok();
    let json: Option<Value> = serde_json::from_slice(inflated.as_deref().unwrap_or(body)).ok();
    json.and_then(|json| json.get("generation").and_then(Value::as_u64)).unwrap_or(0)
}

fn split_generation(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let generation = std::str::from_utf8(bytes.get(..GENERATION_TEXT_LEN)?).ok()?;
    Some((generation, &bytes[GENERATION_TEXT_LEN..]))
}

fn check_valid(manifest: &Manifest) {
    for table in &manifest.tables {
        assert!(matches!(table.tree.as_str(), "links" | "thresholds"), "tree {:?}", table.tree);
        assert!(is_table_id(&table.id) && is_table_id(&table.run_id), "ids {:?} {:?}", table.id, table.run_id);
        assert!(table.id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && table.id.len() == 24);
        assert!(table.shard < table.shard_count, "shard {} of {}", table.shard, table.shard_count);
    }
    for range in &manifest.outlines {
        assert!(0 <= range.after && range.after < range.through, "{range:?}");
        assert!(!range.kind.contains('/') && !range.kind.contains(".."), "outline kind {:?}", range.kind);
    }
}
