//! The kinds of outlined string and the layout of each kind's ids.
//!
//! Invariants:
//! - Codes and names are stored (`outlines.db`) and published (outline ranges, manifests):
//!   never change them.
//! - An id of a kind is `tag | shard << shard_shift | counter` with `1 <= counter <= max_counter`;
//!   `split(compose(s, c)) == (s, c)`, and any other u64 splits to `None`.

use crate::model::ids::OUTLINED_BIT;
use std::fmt;

/// What an outlined string is. The codes and names are stored and published: never change them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutlineKind {
    Did,
    Collection,
    Rkey,
    Location,
}

impl OutlineKind {
    pub const ALL: [OutlineKind; 4] =
        [OutlineKind::Did, OutlineKind::Collection, OutlineKind::Rkey, OutlineKind::Location];

    pub const fn code(self) -> u8 {
        match self {
            OutlineKind::Did => 1,
            OutlineKind::Collection => 2,
            OutlineKind::Rkey => 3,
            OutlineKind::Location => 4,
        }
    }

    /// Did and rkey: millions of strings on the network, so their caches hold only part of them
    /// and the rest are found through the fingerprint table.
    pub const fn is_large(self) -> bool {
        matches!(self, OutlineKind::Did | OutlineKind::Rkey)
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.code() == code)
    }

    pub const fn name(self) -> &'static str {
        match self {
            OutlineKind::Did => "did",
            OutlineKind::Collection => "collection",
            OutlineKind::Rkey => "rkey",
            OutlineKind::Location => "location",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Longest string of this kind, in bytes: the atproto limits for DIDs (2 KiB), NSIDs (317)
    /// and record keys (512); locations are bounded by the extractor's depth limit.
    pub const fn max_len(self) -> usize {
        match self {
            OutlineKind::Did => 2048,
            OutlineKind::Collection => 317,
            OutlineKind::Rkey => 512,
            OutlineKind::Location => 2048,
        }
    }

    pub(super) const fn index(self) -> usize {
        self.code() as usize - 1
    }

    pub(super) const fn layout(self) -> IdLayout {
        match self {
            OutlineKind::Did => IdLayout { tag: OUTLINED_BIT, shard_shift: 46 },
            OutlineKind::Rkey => IdLayout { tag: OUTLINED_BIT, shard_shift: 47 },
            OutlineKind::Collection | OutlineKind::Location => IdLayout { tag: 0, shard_shift: 48 },
        }
    }
}

impl fmt::Display for OutlineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `tag | shard << shard_shift | counter`: the 16-bit shard sits right below the tag bits, the
/// counter fills the bits below the shard.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdLayout {
    tag: u64,
    shard_shift: u32,
}

impl IdLayout {
    pub(super) fn max_counter(self) -> u64 {
        (1u64 << self.shard_shift) - 1
    }

    /// Bits above the shard field: they must equal the tag's (this keeps bit 62 of DIDs clear).
    fn high_bits(self, id: u64) -> u64 {
        id.checked_shr(self.shard_shift + 16).unwrap_or(0)
    }

    pub(super) fn compose(self, shard: u16, counter: u64) -> Option<u64> {
        if counter == 0 || counter > self.max_counter() {
            return None;
        }
        let id = self.tag | (u64::from(shard) << self.shard_shift) | counter;
        assert_eq!(self.split(id), Some((shard, counter)), "id layout round trip");
        Some(id)
    }

    /// (shard, counter) of an id of this layout; `None` for any other u64.
    pub(super) fn split(self, id: u64) -> Option<(u16, u64)> {
        let counter = id & self.max_counter();
        if self.high_bits(id) != self.high_bits(self.tag) || counter == 0 {
            return None;
        }
        let shard = ((id >> self.shard_shift) & 0xffff) as u16;
        Some((shard, counter))
    }
}
