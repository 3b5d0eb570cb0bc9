//! A sealed change-log segment, compressed (`NNNNNNNNNN-CURSOR.logz`): the segment's frames in
//! blocks of whole frames, each block one zstd frame, then an index of the blocks and a footer.
//! At the network's rate the log is some 17 GB a day as written; packed, a few.
//!
//! ```text
//! blocks      zstd(frames), one after another
//! index       per block: plain offset u64 LE, packed offset u64 LE
//! footer      block count u32 LE, plain length u64 LE, xxh3-64 of the index u64 LE, "BLPK"
//! ```
//!
//! Invariants:
//! - A block holds whole frames and at most `BLOCK_BYTES` of them, unless one frame is larger
//!   (then it holds that frame alone): a frame never spans two blocks, so a reader that starts
//!   at a frame's offset finds all of it in the block holding that offset.
//! - The index is believed only when its checksum matches, its offsets increase inside the
//!   file and the plain length, and no block is longer than one may be; a block is believed only when it decompresses, its zstd content
//!   checksum matching, to exactly the bytes the index says (the frames inside keep their own
//!   checksums too, which readers check).
//! - A packed file appears whole or not at all: written beside, synced, then renamed.

use super::entry::MAX_ENTRY_BYTES;
use super::frame::{FRAME_HEADER, header_fields};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

/// Plain bytes per block: large enough to compress well, small enough that a lookup of one
/// frame decompresses little.
pub const BLOCK_BYTES: usize = 64 << 10;
const MAGIC: &[u8; 4] = b"BLPK";
const FOOTER_LEN: usize = 4 + 8 + 8 + 4;
const INDEX_RECORD: usize = 16;
const LEVEL: i32 = 3;
/// Most plain bytes of one block: `BLOCK_BYTES`, or one frame of the largest entry alone. A
/// reader refuses an index that says more before it allocates for a block.
const MAX_BLOCK_PLAIN: u64 = if BLOCK_BYTES > FRAME_HEADER + MAX_ENTRY_BYTES {
    BLOCK_BYTES as u64
} else {
    (FRAME_HEADER + MAX_ENTRY_BYTES) as u64
};

/// Where one block is: its first plain offset and its first byte in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    plain: u64,
    packed: u64,
}

/// An open packed segment: its index, read and checked.
pub struct PackedSegment {
    file: File,
    /// One decompression context and one read buffer for every block read.
    decompressor: zstd::bulk::Decompressor<'static>,
    packed: Vec<u8>,
    blocks: Vec<Block>,
    /// Where the index starts: the end of the last block.
    blocks_end: u64,
    plain_len: u64,
}

/// Writes `plain` (a sealed segment of whole frames) packed at `packed`: beside it first, synced,
/// then renamed. Reads a frame at a time: it holds one block and one frame, not the segment.
/// Returns the packed file's length.
pub fn pack(plain: &Path, packed: &Path) -> std::io::Result<u64> {
    let mut input = BufReader::with_capacity(256 << 10, File::open(plain)?);
    let tmp = packed.with_extension("logz.tmp");
    let mut out = BlockWriter::new(BufWriter::new(File::create(&tmp)?))?;
    let (mut block, mut frame) = (Vec::with_capacity(BLOCK_BYTES), Vec::new());
    while next_frame(&mut input, &mut frame)? {
        if !block.is_empty() && block.len() + frame.len() > BLOCK_BYTES {
            out.write_block(&block)?;
            block.clear();
        }
        block.extend_from_slice(&frame);
    }
    if !block.is_empty() {
        out.write_block(&block)?;
    }
    let (file, packed_len) = out.finish()?;
    file.sync_all()?;
    std::fs::rename(&tmp, packed)?;
    Ok(packed_len)
}

/// Reads the next whole frame into `frame`; `false` at the end of the segment.
fn next_frame(input: &mut impl BufRead, frame: &mut Vec<u8>) -> std::io::Result<bool> {
    if input.fill_buf()?.is_empty() {
        return Ok(false);
    }
    let cut_short = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => invalid("a frame cut short".into()),
        _ => e,
    };
    frame.resize(FRAME_HEADER, 0);
    input.read_exact(frame).map_err(cut_short)?;
    let (len, _) = header_fields(frame);
    if len > MAX_ENTRY_BYTES {
        return Err(invalid(format!("a frame of {len} bytes")));
    }
    frame.resize(FRAME_HEADER + len, 0);
    input.read_exact(&mut frame[FRAME_HEADER..]).map_err(cut_short)?;
    Ok(true)
}

/// The blocks of a packed file as they are written, then its index and footer.
struct BlockWriter {
    out: BufWriter<File>,
    compressor: zstd::bulk::Compressor<'static>,
    blocks: Vec<Block>,
    plain_len: u64,
    packed_len: u64,
}

impl BlockWriter {
    fn new(out: BufWriter<File>) -> std::io::Result<Self> {
        let mut compressor = zstd::bulk::Compressor::new(LEVEL)?;
        // Each block carries zstd's own checksum of its content: damage is found at the block.
        compressor.set_parameter(zstd::stream::raw::CParameter::ChecksumFlag(true))?;
        Ok(BlockWriter { out, compressor, blocks: Vec::new(), plain_len: 0, packed_len: 0 })
    }

    fn write_block(&mut self, block: &[u8]) -> std::io::Result<()> {
        let compressed = self.compressor.compress(block)?;
        self.blocks.push(Block { plain: self.plain_len, packed: self.packed_len });
        self.out.write_all(&compressed)?;
        self.plain_len += block.len() as u64;
        self.packed_len += compressed.len() as u64;
        Ok(())
    }

    /// Writes the index and the footer; returns the file and its length.
    fn finish(mut self) -> std::io::Result<(File, u64)> {
        let mut index = Vec::with_capacity(self.blocks.len() * INDEX_RECORD);
        for block in &self.blocks {
            index.extend_from_slice(&block.plain.to_le_bytes());
            index.extend_from_slice(&block.packed.to_le_bytes());
        }
        self.out.write_all(&index)?;
        self.out.write_all(&(self.blocks.len() as u32).to_le_bytes())?;
        self.out.write_all(&self.plain_len.to_le_bytes())?;
        self.out.write_all(&xxh3_64(&index).to_le_bytes())?;
        self.out.write_all(MAGIC)?;
        let file = self.out.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        Ok((file, self.packed_len + (index.len() + FOOTER_LEN) as u64))
    }
}

fn invalid(detail: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("packed change-log segment: {detail}"))
}

impl PackedSegment {
    /// Reads and checks the footer and the index of `file`.
    pub fn open(file: File) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        if len < FOOTER_LEN as u64 {
            return Err(invalid(format!("{len} bytes")));
        }
        let mut footer = [0u8; FOOTER_LEN];
        file.read_exact_at(&mut footer, len - FOOTER_LEN as u64)?;
        if &footer[20..] != MAGIC {
            return Err(invalid("no footer".into()));
        }
        let count = u32::from_le_bytes(footer[..4].try_into().expect("4 bytes")) as u64;
        let plain_len = u64::from_le_bytes(footer[4..12].try_into().expect("8 bytes"));
        let checksum = u64::from_le_bytes(footer[12..20].try_into().expect("8 bytes"));
        let index_len = count.checked_mul(INDEX_RECORD as u64).filter(|n| *n <= len - FOOTER_LEN as u64);
        let index_len = index_len.ok_or_else(|| invalid(format!("an index of {count} blocks")))?;
        let blocks_end = len - FOOTER_LEN as u64 - index_len;
        let mut index = vec![0u8; index_len as usize];
        file.read_exact_at(&mut index, blocks_end)?;
        if xxh3_64(&index) != checksum {
            return Err(invalid("index checksum mismatch".into()));
        }
        let blocks: Vec<Block> = index
            .chunks_exact(INDEX_RECORD)
            .map(|r| Block {
                plain: u64::from_le_bytes(r[..8].try_into().expect("8 bytes")),
                packed: u64::from_le_bytes(r[8..].try_into().expect("8 bytes")),
            })
            .collect();
        let increasing = blocks.windows(2).all(|w| w[0].plain < w[1].plain && w[0].packed < w[1].packed);
        let inside = blocks.last().is_none_or(|b| b.plain < plain_len && b.packed < blocks_end);
        let starts = blocks.first().is_none_or(|b| b.plain == 0 && b.packed == 0);
        if !(increasing && inside && starts) || (blocks.is_empty() && plain_len > 0) {
            return Err(invalid("an index out of order".into()));
        }
        let ends = blocks.iter().skip(1).map(|b| b.plain).chain([plain_len]);
        if blocks.iter().zip(ends).any(|(block, end)| end - block.plain > MAX_BLOCK_PLAIN) {
            return Err(invalid(format!("a block of more than {MAX_BLOCK_PLAIN} bytes")));
        }
        let decompressor = zstd::bulk::Decompressor::new()?;
        Ok(PackedSegment { file, decompressor, packed: Vec::new(), blocks, blocks_end, plain_len })
    }

    /// The segment's length as written (what plain offsets run to).
    pub fn plain_len(&self) -> u64 {
        self.plain_len
    }

    /// The block holding plain offset `offset`, decompressed into `into`; returns the block's
    /// first plain offset (`None` past the end).
    pub fn block_at(&mut self, offset: u64, into: &mut Vec<u8>) -> std::io::Result<Option<u64>> {
        if offset >= self.plain_len {
            return Ok(None);
        }
        let at = self.blocks.partition_point(|b| b.plain <= offset) - 1;
        let block = self.blocks[at];
        let (plain_end, packed_end) =
            self.blocks.get(at + 1).map_or((self.plain_len, self.blocks_end), |next| (next.plain, next.packed));
        let plain_len = (plain_end - block.plain) as usize;
        self.packed.resize((packed_end - block.packed) as usize, 0);
        self.file.read_exact_at(&mut self.packed, block.packed)?;
        into.clear();
        into.reserve(plain_len);
        let written = self.decompressor.decompress_to_buffer(&self.packed, into)?;
        if written != plain_len {
            return Err(invalid(format!("a block of {written} bytes where the index says {plain_len}")));
        }
        Ok(Some(block.plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames of `lens` body bytes (headers with those lengths, bodies of one byte value each).
    fn frames(lens: &[usize]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            bytes.extend_from_slice(&(len as u32).to_le_bytes());
            bytes.extend_from_slice(&[0; 8]);
            bytes.extend(std::iter::repeat_n(i as u8, len));
        }
        bytes
    }

    #[test]
    fn blocks_hold_whole_frames_and_a_large_frame_alone() {
        let dir = tempfile::tempdir().unwrap();
        let lens = [100, BLOCK_BYTES * 2, 10, 10, BLOCK_BYTES - 40, 5];
        let bytes = frames(&lens);
        let (plain, packed) = (dir.path().join("0-1.log"), dir.path().join("0-1.logz"));
        std::fs::write(&plain, &bytes).unwrap();
        pack(&plain, &packed).unwrap();
        let segment = PackedSegment::open(File::open(&packed).unwrap()).unwrap();
        let starts: Vec<u64> = segment.blocks.iter().map(|b| b.plain).collect();
        let frame = |i: usize| frames(&lens[..i]).len() as u64;
        assert_eq!(starts, [0, frame(1), frame(2), frame(4)]);
        assert_eq!(segment.plain_len(), bytes.len() as u64);
        std::fs::write(&plain, &bytes[..bytes.len() - 1]).unwrap();
        assert!(pack(&plain, &packed).is_err(), "a torn frame is refused");
    }

    #[test]
    fn every_block_reads_back_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = frames(&(0..3000).map(|i| i % 97 * 3).collect::<Vec<_>>());
        let (plain, packed) = (dir.path().join("0-1.log"), dir.path().join("0-1.logz"));
        std::fs::write(&plain, &bytes).unwrap();
        let len = pack(&plain, &packed).unwrap();
        assert_eq!(std::fs::metadata(&packed).unwrap().len(), len);
        assert!(len < bytes.len() as u64 / 4, "{len} of {}", bytes.len());
        let mut segment = PackedSegment::open(File::open(&packed).unwrap()).unwrap();
        assert_eq!(segment.plain_len(), bytes.len() as u64);
        let (mut block, mut offset, mut read) = (Vec::new(), 0, Vec::new());
        while let Some(start) = segment.block_at(offset, &mut block).unwrap() {
            assert_eq!(start, offset);
            read.extend_from_slice(&block);
            offset += block.len() as u64;
        }
        assert_eq!(read, bytes);
        assert_eq!(
            segment.block_at(bytes.len() as u64 / 2, &mut block).unwrap().map(|s| s <= bytes.len() as u64 / 2),
            Some(true)
        );

        let whole = std::fs::read(&packed).unwrap();
        for at in [0, whole.len() - 30, whole.len() - 2] {
            let mut damaged = whole.clone();
            damaged[at] ^= 0x10;
            std::fs::write(&packed, &damaged).unwrap();
            let opened = PackedSegment::open(File::open(&packed).unwrap());
            let refused = match opened {
                Err(_) => true,
                Ok(mut segment) => segment.block_at(0, &mut block).is_err(),
            };
            assert!(refused, "a flip at {at} of {}", whole.len());
        }
    }

    /// The footer's plain length is not under the index's checksum: one far past the blocks
    /// makes the last block longer than a block may be, refused at open (a reader would have
    /// reserved that many bytes for it).
    #[test]
    fn a_block_longer_than_a_block_may_be_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, packed) = (dir.path().join("0-1.log"), dir.path().join("0-1.logz"));
        std::fs::write(&plain, frames(&[10, 20, 30])).unwrap();
        pack(&plain, &packed).unwrap();
        let mut bytes = std::fs::read(&packed).unwrap();
        let at = bytes.len() - FOOTER_LEN + 4;
        for plain_len in [MAX_BLOCK_PLAIN + 1, u64::MAX / 2] {
            bytes[at..at + 8].copy_from_slice(&plain_len.to_le_bytes());
            std::fs::write(&packed, &bytes).unwrap();
            let error = PackedSegment::open(File::open(&packed).unwrap()).err().expect("refused");
            assert!(error.to_string().contains("a block of more than"), "{error}");
        }
    }
}
