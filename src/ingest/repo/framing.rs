//! CAR v1 framing: a header frame naming the root, then frames of a CID and its block. The CAR is
//! indexed in one pass (CID -> where its block lies) and blocks are read from where it is kept,
//! memory or a file, when the walk needs them, each checked against its CID then.
//!
//! Crates: `iroh-car` only decodes the header (its own reader mis-framed an overflowing length
//! prefix, found by the `car` fuzz target); `ipld-core` gives `Cid`; `sha2` hashes blocks.
//!
//! Invariants:
//! - Never more than `max_bytes` indexed, `max_blocks` frames, `max_block_bytes` per frame; a
//!   length prefix is minimal LEB128 of at most 10 bytes and never overflows.
//! - A frame that runs past the end of the CAR is `Truncated`; frames end exactly at the end.
//! - A block is handed out only when its bytes hash to its CID: CIDv1, dag-cbor, sha2-256 (the
//!   only kind a repository's commit, MST nodes and records may have).

use super::{CarError, CarLimits};
use ipld_core::cid::{Cid, Version};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// Longest length prefix: a u64 in unsigned LEB128 takes at most 10 bytes.
const MAX_VARINT_BYTES: usize = 10;
const DAG_CBOR: u64 = 0x71;
const SHA2_256: u64 = 0x12;

/// Where a CAR's bytes are: in memory, or in a (temporary) file read by position.
pub enum CarSource<'a> {
    Memory(&'a [u8]),
    File(&'a File),
}

/// The frames of one CAR: its root and where each block lies; the first copy of a CID wins.
pub(super) struct CarIndex<'a> {
    source: &'a CarSource<'a>,
    pub root: Cid,
    blocks: HashMap<Cid, Range<u64>>,
    /// Block frames, duplicates included.
    pub frames: usize,
    /// Bytes of the whole CAR.
    pub len: u64,
}

impl<'a> CarIndex<'a> {
    /// Reads the header and every frame boundary of `source`.
    pub fn read(source: &'a CarSource<'a>, limits: &CarLimits) -> Result<Self, CarError> {
        let (len, mut frames): (u64, Box<dyn ReadSeek + 'a>) = match source {
            CarSource::Memory(bytes) => (bytes.len() as u64, Box::new(std::io::Cursor::new(*bytes))),
            CarSource::File(file) => {
                let len = file.metadata().map_err(|e| CarError::Io(e.to_string()))?.len();
                // The file may have just been written: its cursor is wherever that left it.
                let mut reader = BufReader::with_capacity(64 << 10, *file);
                reader.seek(std::io::SeekFrom::Start(0)).map_err(io_error)?;
                (len, Box::new(reader))
            }
        };
        if len > limits.max_bytes {
            return Err(CarError::TooBig { max_bytes: limits.max_bytes });
        }
        let mut reader = FrameReader { inner: frames.as_mut(), offset: 0, len };
        let header = match reader.next_frame(limits.max_block_bytes) {
            Ok(Some(frame)) => reader.read_all(frame)?,
            Ok(None) => return Err(CarError::Truncated { offset: 0 }),
            Err(CarError::BadFraming(reason)) => return Err(CarError::BadHeader(reason)),
            Err(other) => return Err(other),
        };
        let root = single_root(&header)?;
        let mut index = CarIndex { source, root, blocks: HashMap::new(), frames: 0, len };
        while let Some(frame) = reader.next_frame(limits.max_block_bytes)? {
            if index.frames >= limits.max_blocks {
                return Err(CarError::TooManyBlocks { max: limits.max_blocks });
            }
            let (cid, data) = reader.read_cid(frame)?;
            index.frames += 1;
            index.blocks.entry(cid).or_insert(data);
        }
        Ok(index)
    }

    /// The block of `cid`, checked against it; `MissingBlock` when the CAR lacks it.
    pub fn block(&self, cid: &Cid) -> Result<Cow<'a, [u8]>, CarError> {
        let range = self.blocks.get(cid).ok_or_else(|| CarError::MissingBlock { cid: cid.to_string() })?;
        let bytes = match self.source {
            CarSource::Memory(bytes) => Cow::Borrowed(&bytes[range.start as usize..range.end as usize]),
            CarSource::File(file) => {
                let mut buffer = vec![0; (range.end - range.start) as usize];
                file.read_exact_at(&mut buffer, range.start).map_err(|e| CarError::Io(e.to_string()))?;
                Cow::Owned(buffer)
            }
        };
        check_block(cid, &bytes)?;
        Ok(bytes)
    }
}

impl CarIndex<'_> {
    /// Checks every block against its CID (a slice whose blocks are not all reached by a walk).
    pub fn check_all(&self) -> Result<(), CarError> {
        for cid in self.blocks.keys() {
            self.block(cid)?;
        }
        Ok(())
    }
}

/// A repository block's bytes must hash to its CID, which must be CIDv1, dag-cbor, sha2-256.
pub fn check_block(cid: &Cid, bytes: &[u8]) -> Result<(), CarError> {
    let bad = |reason: &str| CarError::BadCid { cid: cid.to_string(), reason: reason.into() };
    if cid.version() != Version::V1 || cid.codec() != DAG_CBOR {
        return Err(bad("not a CIDv1 of dag-cbor"));
    }
    let hash = cid.hash();
    if hash.code() != SHA2_256 || hash.size() != 32 {
        return Err(bad("not a sha2-256 hash"));
    }
    if hash.digest() != Sha256::digest(bytes).as_slice() {
        return Err(CarError::BadHash { cid: cid.to_string() });
    }
    Ok(())
}

/// The one root the header names.
fn single_root(header: &[u8]) -> Result<Cid, CarError> {
    let header = iroh_car::CarHeader::decode(header).map_err(|e| CarError::BadHeader(e.to_string()))?;
    match header.roots() {
        [root] => Ok(*root),
        roots => Err(CarError::BadHeader(format!("expected exactly one root, found {}", roots.len()))),
    }
}

trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}

/// Walks the frames of a CAR in order, keeping the byte offset.
struct FrameReader<'r> {
    inner: &'r mut dyn ReadSeek,
    offset: u64,
    len: u64,
}

impl FrameReader<'_> {
    /// The next frame's byte range, `None` at a clean end; a frame longer than `max_len` is
    /// refused before anything of it is read.
    fn next_frame(&mut self, max_len: usize) -> Result<Option<Range<u64>>, CarError> {
        if self.offset == self.len {
            return Ok(None);
        }
        let len = self.read_varint()?;
        if len > max_len as u64 {
            return Err(CarError::BlockTooBig { len, max: max_len });
        }
        let frame = self.offset..self.offset + len;
        if frame.end > self.len {
            return Err(CarError::Truncated { offset: self.len });
        }
        Ok(Some(frame))
    }

    /// The whole of `frame` (the header: small and bounded).
    fn read_all(&mut self, frame: Range<u64>) -> Result<Vec<u8>, CarError> {
        let mut bytes = vec![0; (frame.end - frame.start) as usize];
        self.inner.read_exact(&mut bytes).map_err(io_error)?;
        self.offset = frame.end;
        Ok(bytes)
    }

    /// The CID at the start of `frame` and the range of the block after it; moves past the frame.
    fn read_cid(&mut self, frame: Range<u64>) -> Result<(Cid, Range<u64>), CarError> {
        let mut limited = (&mut self.inner).take(frame.end - frame.start);
        let cid = Cid::read_bytes(&mut limited).map_err(|e| CarError::BadFraming(format!("bad block CID: {e}")))?;
        let data = frame.start + cid.encoded_len() as u64..frame.end;
        assert!(data.start <= data.end, "a CID read from a frame fits in it");
        self.inner.seek_relative((data.end - data.start) as i64).map_err(io_error)?;
        self.offset = frame.end;
        Ok((cid, data))
    }

    /// Unsigned LEB128, minimally encoded, as multiformats requires.
    fn read_varint(&mut self) -> Result<u64, CarError> {
        let mut value = 0u64;
        for index in 0..MAX_VARINT_BYTES {
            if self.offset == self.len {
                return Err(CarError::Truncated { offset: self.len });
            }
            let mut byte = [0u8];
            self.inner.read_exact(&mut byte).map_err(io_error)?;
            self.offset += 1;
            let payload = u64::from(byte[0] & 0x7f);
            if index == MAX_VARINT_BYTES - 1 && payload > 1 {
                return Err(CarError::BadFraming("length prefix overflows u64".into()));
            }
            value |= payload << (7 * index);
            if byte[0] & 0x80 == 0 {
                if byte[0] == 0 && index > 0 {
                    return Err(CarError::BadFraming("length prefix is not minimally encoded".into()));
                }
                return Ok(value);
            }
        }
        Err(CarError::BadFraming("length prefix longer than 10 bytes".into()))
    }
}

fn io_error(error: std::io::Error) -> CarError {
    CarError::Io(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_varint(bytes: &[u8]) -> Result<u64, CarError> {
        let mut cursor = std::io::Cursor::new(bytes);
        FrameReader { inner: &mut cursor, offset: 0, len: bytes.len() as u64 }.read_varint()
    }

    #[test]
    fn varints_must_be_minimal_and_bounded() {
        assert_eq!(read_varint(&[0x00]).unwrap(), 0);
        assert_eq!(read_varint(&[0xac, 0x02]).unwrap(), 300);
        assert!(matches!(read_varint(&[0x80, 0x00]), Err(CarError::BadFraming(_))));
        assert!(matches!(read_varint(&[0x80]), Err(CarError::Truncated { .. })));
        assert!(matches!(read_varint(&[0xff; 11]), Err(CarError::BadFraming(_))));
        assert_eq!(read_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).unwrap(), u64::MAX);
    }

    #[test]
    fn blocks_must_hash_to_their_cids() {
        let block = serde_ipld_dagcbor::to_vec(&ipld_core::ipld::Ipld::String("a record".into())).unwrap();
        let digest = Sha256::digest(&block);
        let multihash = ipld_core::cid::multihash::Multihash::<64>::wrap(SHA2_256, &digest).unwrap();
        let cid = Cid::new_v1(DAG_CBOR, multihash);
        assert!(check_block(&cid, &block).is_ok());
        assert!(matches!(check_block(&cid, b"another"), Err(CarError::BadHash { .. })));
        let raw = Cid::new_v1(0x55, multihash);
        assert!(matches!(check_block(&raw, &block), Err(CarError::BadCid { .. })));
        let v0 = Cid::new_v0(multihash).unwrap();
        assert!(matches!(check_block(&v0, &block), Err(CarError::BadCid { .. })));
    }
}
