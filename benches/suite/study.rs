//! What the link tables would cost encoded otherwise: re-encodes the entries of the largest link
//! table with variants of the frame encoding (transform, zstd level, frame size) and reports
//! compressed bytes per entry for each. It reads only; it informs choices, it decides nothing.
//!
//! Invariants:
//! - Every variant is checked to round-trip on the first frames before it is measured.
//! - Bounded: at most `--entries` entries are sampled.

use backlinks::index::{Index, IndexOptions};
use backlinks::lsm::entry::Entry;
use backlinks::lsm::table::PageUse;
use backlinks::model::ids::Backlink;
use backlinks::store::dir::DirStore;
use std::path::Path;
use std::sync::Arc;

const WORDS: usize = Backlink::WIDTH / 8;

/// How one 8-byte word of an entry is turned into a delta against the previous entry.
#[derive(Clone, Copy, Debug)]
enum Delta {
    Xor,
    /// Wrapping subtraction of the big-endian words (small for increasing fields).
    Sub,
}

fn words(entry: &Backlink) -> [u64; WORDS] {
    let mut bytes = [0u8; Backlink::WIDTH];
    entry.encode(&mut bytes);
    std::array::from_fn(|i| u64::from_be_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes")))
}

/// Delta against the previous entry per word (`modes[i]` for word i), then byte-transposed.
fn transform(frame: &[Backlink], modes: &[Delta; WORDS]) -> Vec<u8> {
    let mut deltas = Vec::with_capacity(frame.len() * Backlink::WIDTH);
    let mut previous = [0u64; WORDS];
    for entry in frame {
        let current = words(entry);
        for i in 0..WORDS {
            let delta = match modes[i] {
                Delta::Xor => current[i] ^ previous[i],
                Delta::Sub => current[i].wrapping_sub(previous[i]),
            };
            deltas.extend_from_slice(&delta.to_be_bytes());
        }
        previous = current;
    }
    let mut out = vec![0u8; deltas.len()];
    for (e, delta) in deltas.chunks_exact(Backlink::WIDTH).enumerate() {
        for (b, byte) in delta.iter().enumerate() {
            out[b * frame.len() + e] = *byte;
        }
    }
    out
}

fn untransform(bytes: &[u8], count: usize, modes: &[Delta; WORDS]) -> Vec<[u64; WORDS]> {
    let mut previous = [0u64; WORDS];
    (0..count)
        .map(|e| {
            let delta: Vec<u8> = (0..Backlink::WIDTH).map(|b| bytes[b * count + e]).collect();
            let current: [u64; WORDS] = std::array::from_fn(|i| {
                let d = u64::from_be_bytes(delta[8 * i..8 * i + 8].try_into().expect("8 bytes"));
                match modes[i] {
                    Delta::Xor => d ^ previous[i],
                    Delta::Sub => previous[i].wrapping_add(d),
                }
            });
            previous = current;
            current
        })
        .collect()
}

/// Compressed bytes per entry of `entries` cut into frames of `per_frame`, with 28 bytes of frame
/// header and checksum each (as encoding 1 has).
fn bytes_per_entry(entries: &[Backlink], per_frame: usize, level: i32, modes: &[Delta; WORDS]) -> anyhow::Result<f64> {
    let first = &entries[..per_frame.min(entries.len())];
    let encoded = transform(first, modes);
    let expected: Vec<[u64; WORDS]> = first.iter().map(words).collect();
    anyhow::ensure!(untransform(&encoded, first.len(), modes) == expected, "{modes:?} does not round-trip");
    let mut total = 0usize;
    for frame in entries.chunks(per_frame) {
        total += 28 + zstd::bulk::compress(&transform(frame, modes), level)?.len();
    }
    Ok(total as f64 / entries.len() as f64)
}

pub fn run(data_dir: &Path, max_entries: usize) -> anyhow::Result<serde_json::Value> {
    let store = Arc::new(DirStore::new(data_dir.join("bucket")));
    let index = Index::open(data_dir, store.clone(), IndexOptions { read_only: true, ..IndexOptions::default() }, 5)?;
    let table = index
        .links
        .tables()
        .into_iter()
        .max_by_key(|t| t.record.entries)
        .ok_or_else(|| anyhow::anyhow!("no tables"))?;
    let frames = table.frame_count();
    let take = frames.min(max_entries.div_ceil(1024).max(1));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let entries = runtime.block_on(table.read_frames_with(store.as_ref(), 0..take, PageUse::Scan))?;
    let stored: u64 = table.frame_infos(0..take, PageUse::Scan)?.iter().map(|f| u64::from(f.len)).sum();
    let xor = [Delta::Xor; WORDS];
    // Target words XORed (a new target shares only a prefix), the rest subtracted.
    let mixed = [Delta::Xor, Delta::Xor, Delta::Xor, Delta::Sub, Delta::Sub, Delta::Sub, Delta::Sub, Delta::Sub];
    let mut variants = serde_json::Map::new();
    for (name, per_frame, level, modes) in [
        ("xor, 1024/frame, zstd 3 (encoding 1: record keys not spread)", 1024, 3, &xor),
        ("xor, 1024/frame, zstd 9", 1024, 9, &xor),
        ("xor, 1024/frame, zstd 19", 1024, 19, &xor),
        ("xor, 4096/frame, zstd 3", 4096, 3, &xor),
        ("xor, 4096/frame, zstd 19", 4096, 19, &xor),
        ("xor target, sub rest, 1024/frame, zstd 3", 1024, 3, &mixed),
        ("xor target, sub rest, 4096/frame, zstd 19", 4096, 19, &mixed),
    ] {
        variants.insert(name.to_string(), bytes_per_entry(&entries, per_frame, level, modes)?.into());
    }
    Ok(serde_json::json!({
        "table": table.record.id, "entries_sampled": entries.len(),
        "stored_bytes_per_entry": stored as f64 / entries.len() as f64, "variants": variants,
    }))
}
