//! A change-log frame: `len u32 LE, xxh3-64 of the body u64 LE, body` (docs/format.md, "Change
//! log"), as the log writes it and as a packed segment keeps it whole within one block.

use xxhash_rust::xxh3::xxh3_64;

/// Bytes before a frame's body.
pub const FRAME_HEADER: usize = 12;

/// A header's body length and checksum.
pub fn header_fields(header: &[u8]) -> (usize, u64) {
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let checksum = u64::from_le_bytes(header[4..FRAME_HEADER].try_into().expect("8 bytes"));
    (len, checksum)
}

/// The body of the frame at the start of `bytes`, with the frame's length.
pub fn frame_in(bytes: &[u8]) -> Result<(&[u8], usize), String> {
    if bytes.len() < FRAME_HEADER {
        return Err("a frame cut short".into());
    }
    let (len, checksum) = header_fields(bytes);
    let body = bytes.get(FRAME_HEADER..FRAME_HEADER + len).ok_or("a frame cut short")?;
    if xxh3_64(body) != checksum {
        return Err("checksum mismatch".into());
    }
    Ok((body, FRAME_HEADER + len))
}
