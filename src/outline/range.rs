//! A published outline range object (`outlines/<kind>/<after>-<through>`): zstd over `"BLOR"`,
//! version u16 LE, kind code u8, row count u32 LE, the rows, and an xxh3-64 LE of everything
//! before it (docs/format.md "Outline range").
//!
//! Version 2 (written) stores the rows as columns: the ids' deltas, byte-transposed; the value
//! lengths, byte-transposed; then the values, each `did:plc` DID packed into 15 bytes (length 0
//! marks one). Version 1 (read) stored each row as id u64 LE, length u16 LE, value bytes.

use super::{OutlineError, OutlineKind, check_value, plc};
use crate::lsm::bytes::{transpose_into, untransposed};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 4] = b"BLOR";
const ROWS_VERSION: u16 = 1;
const COLUMNS_VERSION: u16 = 2;
const HEADER_LEN: usize = 11;
const CHECKSUM_LEN: usize = 8;
/// Largest decompressed range accepted. Writers cut ranges at `CHUNK_BYTES`; older writers
/// wrote a whole publish interval in one range, which this still reads.
pub const MAX_RANGE_BYTES: usize = 256 << 20;
/// Encoded bytes of a row besides its value: the id and the length.
pub const ROW_OVERHEAD: usize = 10;
/// Most rows a writer puts in one range.
pub const CHUNK_ROWS: usize = 1 << 17;
/// A writer ends a range once its rows' encoded size reaches this (the largest row is 2 KiB,
/// so a range stays far below `MAX_RANGE_BYTES`).
pub const CHUNK_BYTES: usize = 8 << 20;

/// Encodes `(id, value)` rows as one range object (compressed, checksummed), version 2.
pub fn encode<'a>(kind: OutlineKind, rows: impl ExactSizeIterator<Item = (u64, &'a str)> + Clone) -> Vec<u8> {
    let count = u32::try_from(rows.len()).expect("a range holds fewer than 2^32 rows");
    let values: usize = rows.clone().map(|(_, v)| v.len()).sum();
    let mut raw = Vec::with_capacity(HEADER_LEN + rows.len() * ROW_OVERHEAD + values + CHECKSUM_LEN);
    raw.extend_from_slice(MAGIC);
    raw.extend_from_slice(&COLUMNS_VERSION.to_le_bytes());
    raw.push(kind.code());
    raw.extend_from_slice(&count.to_le_bytes());
    let mut previous = 0u64;
    let deltas: Vec<[u8; 8]> =
        rows.clone().map(|(id, _)| (id.wrapping_sub(std::mem::replace(&mut previous, id))).to_be_bytes()).collect();
    transpose_into(deltas.len(), |i| deltas[i], &mut raw);
    let packed: Vec<Option<plc::Packed>> =
        rows.clone().map(|(_, v)| if kind == OutlineKind::Did { plc::pack(v) } else { None }).collect();
    let lengths: Vec<[u8; 2]> = rows
        .clone()
        .zip(&packed)
        .map(|((_, v), p)| {
            assert!((1..=usize::from(u16::MAX)).contains(&v.len()), "an outline value is 1 to 65,535 bytes long");
            if p.is_some() { [0, 0] } else { (v.len() as u16).to_le_bytes() }
        })
        .collect();
    transpose_into(lengths.len(), |i| lengths[i], &mut raw);
    for ((_, value), packed) in rows.zip(&packed) {
        match packed {
            Some(packed) => raw.extend_from_slice(packed),
            None => raw.extend_from_slice(value.as_bytes()),
        }
    }
    raw.extend_from_slice(&xxh3_64(&raw).to_le_bytes());
    assert!(raw.len() <= MAX_RANGE_BYTES, "outline range over the decode limit");
    zstd::bulk::compress(&raw, 3).expect("zstd compresses in memory")
}

pub fn decode(kind: OutlineKind, compressed: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
    let raw = crate::store::inflate(compressed, MAX_RANGE_BYTES).map_err(|e| corrupt(&e))?;
    if raw.len() < HEADER_LEN + CHECKSUM_LEN || &raw[..4] != MAGIC {
        return Err(corrupt("bad magic or too short"));
    }
    let (body, sum) = raw.split_at(raw.len() - CHECKSUM_LEN);
    if xxh3_64(body).to_le_bytes() != sum {
        return Err(corrupt("checksum mismatch"));
    }
    if body[6] != kind.code() {
        return Err(corrupt("wrong kind"));
    }
    let count = u32::from_le_bytes(body[7..HEADER_LEN].try_into().expect("4 bytes")) as usize;
    let rows = &body[HEADER_LEN..];
    match u16::from_le_bytes([body[4], body[5]]) {
        ROWS_VERSION => decode_rows(kind, count, rows),
        COLUMNS_VERSION => decode_columns(kind, count, rows),
        _ => Err(corrupt("unknown version")),
    }
}

fn corrupt(why: &str) -> OutlineError {
    OutlineError::Corrupt(format!("outline range: {why}"))
}

/// Version 1: each row is id u64 LE, length u16 LE, value.
fn decode_rows(kind: OutlineKind, count: usize, body: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
    let mut rows = Vec::with_capacity(count.min(body.len() / ROW_OVERHEAD));
    let mut at = 0;
    for _ in 0..count {
        let header = body.get(at..at + ROW_OVERHEAD).ok_or_else(|| corrupt("truncated row"))?;
        let id = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let len = u16::from_le_bytes([header[8], header[9]]) as usize;
        let value = body.get(at + ROW_OVERHEAD..at + ROW_OVERHEAD + len).ok_or_else(|| corrupt("truncated value"))?;
        rows.push((id, checked_value(kind, value)?));
        at += ROW_OVERHEAD + len;
    }
    if at != body.len() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(rows)
}

/// Version 2: id deltas and lengths as transposed columns, then the values.
fn decode_columns(kind: OutlineKind, count: usize, body: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
    if count > body.len() / ROW_OVERHEAD {
        return Err(corrupt("more rows than bytes"));
    }
    let (ids, rest) = body.split_at(count * 8);
    let (lengths, values) = rest.split_at(count * 2);
    let mut rows = Vec::with_capacity(count);
    let (mut id, mut at) = (0u64, 0usize);
    for i in 0..count {
        id = id.wrapping_add(u64::from_be_bytes(untransposed(ids, count, i)));
        let value = match u16::from_le_bytes(untransposed(lengths, count, i)) as usize {
            0 if kind == OutlineKind::Did => {
                let packed = values.get(at..at + plc::PACKED_LEN).ok_or_else(|| corrupt("truncated value"))?;
                at += plc::PACKED_LEN;
                plc::unpack(packed.try_into().expect("15 bytes"))
            }
            len => {
                let value = values.get(at..at + len).ok_or_else(|| corrupt("truncated value"))?;
                at += len;
                checked_value(kind, value)?
            }
        };
        rows.push((id, value));
    }
    if at != values.len() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(rows)
}

fn checked_value(kind: OutlineKind, bytes: &[u8]) -> Result<String, OutlineError> {
    let value = std::str::from_utf8(bytes).map_err(|_| corrupt("value is not UTF-8"))?.to_string();
    check_value(kind, &value)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL_PLC: &str = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

    fn rows_of(values: &[&str]) -> Vec<(u64, String)> {
        let ids = [1u64 << 63 | 5, 1 << 63 | 1, 3, u64::MAX, 0, 1 << 63 | 2, 7, 8, 9];
        values.iter().zip(ids).map(|(value, id)| (id, value.to_string())).collect()
    }

    fn encoded(kind: OutlineKind, rows: &[(u64, String)]) -> Vec<u8> {
        encode(kind, rows.iter().map(|(id, value)| (*id, value.as_str())))
    }

    /// The version-1 layout, as writers wrote it before version 2.
    fn encoded_v1(kind: OutlineKind, rows: &[(u64, String)]) -> Vec<u8> {
        let mut raw = MAGIC.to_vec();
        raw.extend_from_slice(&ROWS_VERSION.to_le_bytes());
        raw.push(kind.code());
        raw.extend_from_slice(&(rows.len() as u32).to_le_bytes());
        for (id, value) in rows {
            raw.extend_from_slice(&id.to_le_bytes());
            raw.extend_from_slice(&(value.len() as u16).to_le_bytes());
            raw.extend_from_slice(value.as_bytes());
        }
        with_checksum(raw)
    }

    fn with_checksum(mut raw: Vec<u8>) -> Vec<u8> {
        let sum = xxh3_64(&raw);
        raw.extend_from_slice(&sum.to_le_bytes());
        zstd::bulk::compress(&raw, 3).unwrap()
    }

    fn raw_of(bytes: &[u8]) -> Vec<u8> {
        zstd::bulk::decompress(bytes, MAX_RANGE_BYTES).unwrap()
    }

    #[test]
    fn round_trips_and_detects_corruption() {
        let values = [
            REAL_PLC,
            "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa",
            "did:plc:777777777777777777777777",
            "did:web:x.example",
            "did:plc:abc",
            "did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ",
            "did:plc:ewvi7nxzyoun6zhxrhs64oi1",
            "did:plc:ewvi7nxzyoun6zhxrhs64oiza",
        ];
        let rows = rows_of(&values);
        let bytes = encoded(OutlineKind::Did, &rows);
        assert_eq!(decode(OutlineKind::Did, &bytes).unwrap(), rows);
        // The first three are packed into 15 bytes each; the others are stored as they are.
        let stored: usize = values[3..].iter().map(|v| v.len()).sum::<usize>() + 3 * 15;
        let raw = raw_of(&bytes);
        assert_eq!(raw.len(), HEADER_LEN + values.len() * ROW_OVERHEAD + stored + CHECKSUM_LEN);
        assert!(decode(OutlineKind::Rkey, &bytes).is_err(), "kind is checked");
        for i in 0..raw.len() {
            let mut flipped = raw.clone();
            flipped[i] ^= 0x10;
            let recompressed = zstd::bulk::compress(&flipped, 3).unwrap();
            assert!(decode(OutlineKind::Did, &recompressed).is_err(), "flip at {i} not detected");
        }
        assert!(decode(OutlineKind::Did, b"garbage").is_err());
    }

    /// Version 2's bytes, written out by hand (docs/format.md "Outline range").
    #[test]
    fn version_2_layout_is_byte_exact() {
        let rows = vec![(1u64 << 63 | 1, REAL_PLC.to_string()), (1u64 << 63 | 2, "did:web:x.example".to_string())];
        let raw = raw_of(&encoded(OutlineKind::Did, &rows));
        let mut expected = b"BLOR\x02\x00\x01\x02\x00\x00\x00".to_vec();
        // Id deltas 0x8000000000000001 and 1, big-endian, byte-transposed.
        expected.extend_from_slice(&[0x80, 0]);
        expected.extend_from_slice(&[0; 12]);
        expected.extend_from_slice(&[1, 1]);
        // Lengths 0 (packed) and 17, little-endian, byte-transposed.
        expected.extend_from_slice(&[0, 17, 0, 0]);
        // "ewvi7nxzyoun6zhxrhs64oiz" as 24 five-bit digits, then the other value as it is.
        expected.extend_from_slice(&[
            0x25, 0xaa, 0x8f, 0xb6, 0xf9, 0xc3, 0xa8, 0xdf, 0x64, 0xf7, 0x89, 0xe5, 0xee, 0x39, 0x19,
        ]);
        expected.extend_from_slice(b"did:web:x.example");
        let (body, sum) = raw.split_at(raw.len() - CHECKSUM_LEN);
        assert_eq!(body, expected);
        assert_eq!(sum, xxh3_64(body).to_le_bytes());
    }

    #[test]
    fn other_kinds_store_dids_as_they_are() {
        let rows = rows_of(&[REAL_PLC, "app.bsky.feed.like"]);
        let bytes = encoded(OutlineKind::Collection, &rows);
        assert_eq!(raw_of(&bytes).len(), HEADER_LEN + 2 * ROW_OVERHEAD + 32 + 18 + CHECKSUM_LEN);
        assert_eq!(decode(OutlineKind::Collection, &bytes).unwrap(), rows);
    }

    #[test]
    fn version_1_ranges_still_decode() {
        let rows = rows_of(&[REAL_PLC, "did:web:x.example"]);
        assert_eq!(decode(OutlineKind::Did, &encoded_v1(OutlineKind::Did, &rows)).unwrap(), rows);
    }

    /// Lengths of 0 (a packed DID) in another kind, counts larger than the bytes, and values
    /// that do not add up are errors, not panics or huge allocations.
    #[test]
    fn hostile_columns_are_rejected() {
        // The first value is 15 bytes long, as long as a packed DID.
        let rows = rows_of(&["app.bsky.feed.x", "app.bsky.feed.post"]);
        let raw = raw_of(&encoded(OutlineKind::Collection, &rows));
        let body = &raw[..raw.len() - CHECKSUM_LEN];
        let lengths = HEADER_LEN + 2 * 8;
        let spoiled = |change: &dyn Fn(&mut Vec<u8>)| {
            let mut copy = body.to_vec();
            change(&mut copy);
            decode(OutlineKind::Collection, &with_checksum(copy))
        };
        assert!(spoiled(&|_| {}).is_ok(), "the unspoiled copy decodes");
        assert!(spoiled(&|b| b[lengths] = 0).is_err(), "a packed DID in the collection kind");
        assert!(spoiled(&|b| b[lengths] += 1).is_err(), "values longer than the bytes");
        assert!(spoiled(&|b| b[lengths] -= 1).is_err(), "bytes left after the values");
        let error = spoiled(&|b| b[7..11].copy_from_slice(&u32::MAX.to_le_bytes())).unwrap_err();
        assert!(error.to_string().contains("more rows than bytes"), "{error}");
    }
}
