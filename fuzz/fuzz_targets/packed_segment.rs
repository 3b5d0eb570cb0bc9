//! A packed change-log segment (`push::packed`) over files it did not write, and over files it
//! packed with one byte changed.
//!
//! Byte 0 picks the mode:
//! - bit 0 clear: the file is the fuzzer's bytes. Bit 1 seals them first (a footer is appended
//!   whose index checksum matches the bytes before it, taken as the index), so that the checks
//!   behind the checksum are reached.
//! - bit 0 set: the fuzzer's bytes cut into frames (a length byte, then that many body bytes) are
//!   packed, then read back; bit 1 also flips one byte of the packed file first (the next two
//!   bytes say which) and reads it again.
//!
//! Invariants checked (the module's header states them):
//! - Opening and reading never panic, whatever the file holds.
//! - A block read starts at or before the offset asked for, and the blocks read from offset 0,
//!   one after another, tile the plain length exactly.
//! - A packed segment reads back as exactly the frames packed; with a byte changed it reads back
//!   the same, or says it is damaged (never other bytes).
#![no_main]

use backlinks::push::packed::{PackedSegment, pack};
use libfuzzer_sys::fuzz_target;
use std::fs::File;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

/// Frames of one packed segment.
const MAX_FRAMES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    match mode & 1 {
        0 => foreign_file(&dir.path().join("0-1.logz"), mode & 2 != 0, rest),
        _ => packed_and_changed(dir.path(), mode & 2 != 0, rest),
    }
});

fn foreign_file(path: &Path, seal: bool, data: &[u8]) {
    let mut bytes = data.to_vec();
    if seal && bytes.len() >= 12 {
        // The last 12 bytes become the block count and plain length; everything before them the
        // blocks and index, whose last count * 16 bytes the checksum covers.
        let (body, fields) = bytes.split_at(bytes.len() - 12);
        let count = u32::from_le_bytes(fields[..4].try_into().unwrap()) % 64;
        let index_len = (count as usize * 16).min(body.len());
        let checksum = xxh3_64(&body[body.len() - index_len..]);
        let plain_len = u64::from_le_bytes(fields[4..].try_into().unwrap()) % (1 << 24);
        let mut sealed = body.to_vec();
        sealed.extend_from_slice(&((index_len / 16) as u32).to_le_bytes());
        sealed.extend_from_slice(&plain_len.to_le_bytes());
        sealed.extend_from_slice(&checksum.to_le_bytes());
        sealed.extend_from_slice(b"BLPK");
        bytes = sealed;
    }
    std::fs::write(path, &bytes).expect("writing the file");
    let Ok(segment) = PackedSegment::open(File::open(path).expect("opening the file")) else { return };
    let _ = read_whole(segment);
}

/// Every block from offset 0, one after another: the plain bytes, or the first error.
fn read_whole(mut segment: PackedSegment) -> std::io::Result<Vec<u8>> {
    let (mut plain, mut block) = (Vec::new(), Vec::new());
    while let Some(start) = segment.block_at(plain.len() as u64, &mut block)? {
        assert_eq!(start, plain.len() as u64, "a block begins where the one before it ended");
        assert!(!block.is_empty(), "a block inside the plain length holds bytes");
        plain.extend_from_slice(&block);
        assert!(plain.len() as u64 <= segment.plain_len(), "blocks past the plain length");
        for back in [1, block.len() / 2] {
            let inside = plain.len() as u64 - back as u64;
            let again = segment.block_at(inside, &mut block)?.expect("a block holds every offset before its end");
            assert!(again <= inside && again == start, "the block of an offset inside it");
        }
    }
    assert_eq!(plain.len() as u64, segment.plain_len(), "the blocks tile the plain length");
    Ok(plain)
}

fn packed_and_changed(dir: &Path, change: bool, data: &[u8]) {
    let (mut frames, mut rest) = (Vec::new(), data);
    while let Some((&len, tail)) = rest.split_first() {
        if frames.len() >= MAX_FRAMES * 16 {
            break;
        }
        // Some frames are long, so that blocks fill and a frame over a block stands alone.
        let len = if len == 255 { 70_000 } else { usize::from(len) };
        let body: Vec<u8> = (0..len).map(|i| tail.get(i % tail.len().max(1)).copied().unwrap_or(0)).collect();
        frames.extend_from_slice(&(len as u32).to_le_bytes());
        frames.extend_from_slice(&xxh3_64(&body).to_le_bytes());
        frames.extend_from_slice(&body);
        rest = &tail[len.min(tail.len())..];
    }
    let (plain, packed) = (dir.join("0-1.log"), dir.join("0-1.logz"));
    std::fs::write(&plain, &frames).expect("writing the segment");
    pack(&plain, &packed).expect("a segment of whole frames packs");
    let open = || PackedSegment::open(File::open(&packed).expect("opening the packed file"));
    assert_eq!(read_whole(open().expect("a packed segment opens")).expect("and reads"), frames);
    let Some(which) = data.get(..2).filter(|_| change) else { return };
    let mut bytes = std::fs::read(&packed).expect("reading the packed file");
    let at = usize::from(u16::from_le_bytes([which[0], which[1]])) % bytes.len();
    bytes[at] ^= 1 << (which[0] % 8);
    std::fs::write(&packed, &bytes).expect("writing the changed file");
    if let Ok(Ok(read)) = open().map(read_whole) {
        assert_eq!(read, frames, "a changed byte read back as other bytes");
    }
}
