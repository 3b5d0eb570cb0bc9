//! What every binary format of the LSM shares: `FormatError`, the bounds-checked little-endian
//! `Reader`, the trailing xxh3-64 checksum, range checks, and fixed-width fields as byte columns.
//! Tables, filters, column models and outline ranges all decode through these, so a hostile byte
//! gets the same kind of error everywhere.
//!
//! Invariants:
//! - A `Reader` never reads past its slice: a short input is a `FormatError::Length`.

use xxhash_rust::xxh3::xxh3_64;

/// Errors for every on-disk format in the LSM (filter, frame, data and meta files).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: truncated or wrong length: expected {expected} bytes, found {found}")]
    Length { what: &'static str, expected: u64, found: u64 },
    #[error("{what}: bad magic {found:02x?}")]
    Magic { what: &'static str, found: [u8; 4] },
    #[error("{what}: unsupported version {found}")]
    Version { what: &'static str, found: u64 },
    #[error("{what}: checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum { what: &'static str, stored: u64, computed: u64 },
    #[error("{what}: {field} = {value} is outside {min}..={max}")]
    OutOfRange { what: &'static str, field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    /// The bytes could not be read at all (a paged read of a local file failed): not corruption.
    #[error("{what}: unreadable: {detail}")]
    Unreadable { what: &'static str, detail: String },
}

/// Bytes of the xxh3-64 checksum that ends every frame and meta file.
pub const CHECKSUM_LEN: usize = 8;

/// Checks the trailing little-endian xxh3-64 of `bytes` against everything before it.
pub(crate) fn verify_checksum(what: &'static str, bytes: &[u8]) -> Result<(), FormatError> {
    let Some(split) = bytes.len().checked_sub(CHECKSUM_LEN) else {
        return Err(FormatError::Length { what, expected: CHECKSUM_LEN as u64, found: bytes.len() as u64 });
    };
    let stored = u64::from_le_bytes(bytes[split..].try_into().expect("8 bytes"));
    let computed = xxh3_64(&bytes[..split]);
    if stored != computed {
        return Err(FormatError::Checksum { what, stored, computed });
    }
    Ok(())
}

/// `value` must lie in `min..=max`.
pub(crate) fn check_range(
    what: &'static str,
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<(), FormatError> {
    if (min..=max).contains(&value) { Ok(()) } else { Err(FormatError::OutOfRange { what, field, value, min, max }) }
}

/// A `FormatError::Invalid` of `what`.
pub(crate) fn invalid(what: &'static str, detail: impl std::fmt::Display) -> FormatError {
    FormatError::Invalid { what, detail: detail.to_string() }
}

/// Bounds-checked little-endian reads from a byte slice.
pub(crate) struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Reader { what, bytes, position: 0 }
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        let end = self.position.checked_add(len).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            let expected = (self.position as u64).saturating_add(len as u64);
            return Err(FormatError::Length { what: self.what, expected, found: self.bytes.len() as u64 });
        };
        let taken = &self.bytes[self.position..end];
        self.position = end;
        Ok(taken)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn expect_end(&self) -> Result<(), FormatError> {
        if self.position != self.bytes.len() {
            return Err(FormatError::Length {
                what: self.what,
                expected: self.position as u64,
                found: self.bytes.len() as u64,
            });
        }
        Ok(())
    }
}

/// Appends fixed-width fields as byte columns: byte 0 of `item(0)..item(count)`, then byte 1 of
/// each, and so on (run lengths, frame index fields, outline range ids and lengths).
pub fn transpose_into<const N: usize>(count: usize, item: impl Fn(usize) -> [u8; N], out: &mut Vec<u8>) {
    for byte in 0..N {
        out.extend((0..count).map(|i| item(i)[byte]));
    }
}

/// Field `i` of `count` fields that `transpose_into` stored in `columns`.
pub fn untransposed<const N: usize>(columns: &[u8], count: usize, i: usize) -> [u8; N] {
    std::array::from_fn(|byte| columns[byte * count + i])
}
