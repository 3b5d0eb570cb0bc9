//! The fixed-width entry the generic LSM stores, and its six instances.
//!
//! Invariants every `Entry` upholds (checked by the tests at the bottom):
//! - `encode` writes exactly `WIDTH` bytes and `decode(encode(e)) == e`.
//! - Byte order of encodings equals `Ord` order.
//! - The first `KEY_WIDTH` bytes are the encoded `key()`: the frame fences work on that prefix,
//!   the shard hash on its first `SHARD_WIDTH` bytes.
//! - The first `FILTER_WIDTH` bytes (at least the key, at most the identity) are what a new
//!   table's filter holds: the key, unless a tree's lookups name more of an entry than its key.
//! - The first `IDENTITY_WIDTH` bytes identify an entry up to freshness; the 8 bytes after them
//!   are its big-endian `stamp()`, and whatever follows (a tally's count) is a value the stamp
//!   decides. Of two entries with the same identity the larger stamp wins, and because the
//!   stamp follows the identity, duplicates sort next to each other, oldest first.

use crate::lsm::filter::KeyHash;
use crate::model::ids::{AccountTally, Backlink, ForwardLink, HotLink, RecordId, Revocation, Tally, TreeKind, be_u64};
use std::fmt::Debug;
use std::hash::Hash;

pub trait Entry: Copy + Ord + Eq + Hash + Debug + Send + Sync + 'static {
    /// Encoded size in bytes.
    const WIDTH: usize;
    /// Encoded size of the key prefix (always a `RecordId` here).
    const KEY_WIDTH: usize = RecordId::WIDTH;
    /// Encoded size of the identity prefix, which the 8-byte stamp follows.
    const IDENTITY_WIDTH: usize;
    /// Encoded size of the prefix a new table's filter holds (`lsm::lookup::read_prefixes_uncached`
    /// looks for whole prefixes; a lookup of a key alone cannot use such a filter).
    const FILTER_WIDTH: usize = Self::KEY_WIDTH;
    /// Whether a new table's filter also holds each distinct shard prefix (the first
    /// `SHARD_WIDTH` bytes), so that a read of keys sharing one (`lsm::lookup::read_key_ranges`:
    /// an account's hot links) skips the tables that hold none of them.
    const FILTER_HOLDS_SHARDS: bool = false;
    /// Bytes of the key that choose a compacted run's shard (`run::shard_of`): all of it,
    /// unless a tree reads ranges of keys that share a prefix.
    const SHARD_WIDTH: usize = RecordId::WIDTH;
    /// The tree that holds this entry type (its name is used in paths: `tables/<name>/<id>.data`).
    const TREE: TreeKind;
    /// Byte offsets of the encoded record keys (big-endian `u64`s: TIDs, outlined ids with the
    /// top bit set, or 0 in the repository form), which frames store spread (`tid::spread`,
    /// payload encodings 2 and 3).
    const RKEY_OFFSETS: &'static [usize];

    fn encode(&self, out: &mut [u8]);
    fn decode(bytes: &[u8]) -> Self;
    fn key(&self) -> RecordId;
    fn stamp(&self) -> u64;
    /// The smallest entry whose key is `key`.
    fn min_for_key(key: RecordId) -> Self;
    /// The largest entry whose key is `key`.
    fn max_for_key(key: RecordId) -> Self;
    /// True when both entries name the same thing (they differ at most in stamp).
    fn same_identity(&self, other: &Self) -> bool;
}

impl Entry for Backlink {
    const WIDTH: usize = Backlink::WIDTH;
    const IDENTITY_WIDTH: usize = 56;
    const TREE: TreeKind = TreeKind::Links;
    /// The target's and the source's.
    const RKEY_OFFSETS: &'static [usize] = &[0, 24];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        self.target.encode(&mut out[0..24]);
        self.source.encode(&mut out[24..48]);
        out[48..56].copy_from_slice(&self.location.to_be_bytes());
        out[56..64].copy_from_slice(&self.source_rev.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        Backlink {
            target: RecordId::decode(&bytes[0..24]),
            source: RecordId::decode(&bytes[24..48]),
            location: be_u64(&bytes[48..56]),
            source_rev: be_u64(&bytes[56..64]),
        }
    }

    fn key(&self) -> RecordId {
        self.target
    }

    fn stamp(&self) -> u64 {
        self.source_rev
    }

    fn min_for_key(key: RecordId) -> Self {
        Backlink { target: key, source: RecordId::MIN, location: 0, source_rev: 0 }
    }

    fn max_for_key(key: RecordId) -> Self {
        Backlink { target: key, source: RecordId::MAX, location: u64::MAX, source_rev: u64::MAX }
    }

    fn same_identity(&self, other: &Self) -> bool {
        self.target == other.target && self.source == other.source && self.location == other.location
    }
}

impl Entry for ForwardLink {
    const WIDTH: usize = ForwardLink::WIDTH;
    const IDENTITY_WIDTH: usize = 56;
    const TREE: TreeKind = TreeKind::Forward;
    /// The source's and the target's.
    const RKEY_OFFSETS: &'static [usize] = &[0, 32];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        self.source.encode(&mut out[0..24]);
        out[24..32].copy_from_slice(&self.location.to_be_bytes());
        self.target.encode(&mut out[32..56]);
        out[56..64].copy_from_slice(&self.source_rev.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        ForwardLink {
            source: RecordId::decode(&bytes[0..24]),
            location: be_u64(&bytes[24..32]),
            target: RecordId::decode(&bytes[32..56]),
            source_rev: be_u64(&bytes[56..64]),
        }
    }

    fn key(&self) -> RecordId {
        self.source
    }

    fn stamp(&self) -> u64 {
        self.source_rev
    }

    fn min_for_key(key: RecordId) -> Self {
        ForwardLink { source: key, location: 0, target: RecordId::MIN, source_rev: 0 }
    }

    fn max_for_key(key: RecordId) -> Self {
        ForwardLink { source: key, location: u64::MAX, target: RecordId::MAX, source_rev: u64::MAX }
    }

    fn same_identity(&self, other: &Self) -> bool {
        self.source == other.source && self.location == other.location && self.target == other.target
    }
}

impl Entry for Revocation {
    const WIDTH: usize = Revocation::WIDTH;
    const IDENTITY_WIDTH: usize = 24;
    const TREE: TreeKind = TreeKind::Thresholds;
    /// The revoked source's.
    const RKEY_OFFSETS: &'static [usize] = &[0];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        self.source.encode(&mut out[0..24]);
        out[24..32].copy_from_slice(&self.rev.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        Revocation { source: RecordId::decode(&bytes[0..24]), rev: be_u64(&bytes[24..32]) }
    }

    fn key(&self) -> RecordId {
        self.source
    }

    fn stamp(&self) -> u64 {
        self.rev
    }

    fn min_for_key(key: RecordId) -> Self {
        Revocation { source: key, rev: 0 }
    }

    fn max_for_key(key: RecordId) -> Self {
        Revocation { source: key, rev: u64::MAX }
    }

    fn same_identity(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Entry for HotLink {
    const WIDTH: usize = HotLink::WIDTH;
    const IDENTITY_WIDTH: usize = 56;
    /// The account: all of an account's hot links are in one table of a compacted run.
    const SHARD_WIDTH: usize = 8;
    /// A flush reads whole the hot links of each account it hides, shows or deletes, in every
    /// run: most tables of a busy tree (every flush's) hold none of a given account's.
    const FILTER_HOLDS_SHARDS: bool = true;
    const TREE: TreeKind = TreeKind::Hot;
    /// The source's and the target's.
    const RKEY_OFFSETS: &'static [usize] = &[16, 24];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        out[0..8].copy_from_slice(&self.account.to_be_bytes());
        out[8..16].copy_from_slice(&self.collection.to_be_bytes());
        out[16..24].copy_from_slice(&self.rkey.to_be_bytes());
        self.target.encode(&mut out[24..48]);
        out[48..56].copy_from_slice(&self.location.to_be_bytes());
        out[56..64].copy_from_slice(&self.source_rev.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        HotLink {
            account: be_u64(&bytes[0..8]),
            collection: be_u64(&bytes[8..16]),
            rkey: be_u64(&bytes[16..24]),
            target: RecordId::decode(&bytes[24..48]),
            location: be_u64(&bytes[48..56]),
            source_rev: be_u64(&bytes[56..64]),
        }
    }

    fn key(&self) -> RecordId {
        HotLink::key_of(self.source())
    }

    fn stamp(&self) -> u64 {
        self.source_rev
    }

    fn min_for_key(key: RecordId) -> Self {
        let source = HotLink::source_of_key(key);
        HotLink::of(Backlink { target: RecordId::MIN, source, location: 0, source_rev: 0 })
    }

    fn max_for_key(key: RecordId) -> Self {
        let source = HotLink::source_of_key(key);
        HotLink::of(Backlink { target: RecordId::MAX, source, location: u64::MAX, source_rev: u64::MAX })
    }

    fn same_identity(&self, other: &Self) -> bool {
        self.source() == other.source() && self.target == other.target && self.location == other.location
    }
}

impl Entry for Tally {
    const WIDTH: usize = Tally::WIDTH;
    const IDENTITY_WIDTH: usize = 40;
    const TREE: TreeKind = TreeKind::Tallies;
    /// The target's.
    const RKEY_OFFSETS: &'static [usize] = &[0];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        self.target.encode(&mut out[0..24]);
        out[24..32].copy_from_slice(&self.collection.to_be_bytes());
        out[32..40].copy_from_slice(&self.location.to_be_bytes());
        out[40..48].copy_from_slice(&self.stamp.to_be_bytes());
        out[48..56].copy_from_slice(&self.records.to_be_bytes());
        out[56..64].copy_from_slice(&self.accounts.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        Tally {
            target: RecordId::decode(&bytes[0..24]),
            collection: be_u64(&bytes[24..32]),
            location: be_u64(&bytes[32..40]),
            stamp: be_u64(&bytes[40..48]),
            records: be_u64(&bytes[48..56]),
            accounts: be_u64(&bytes[56..64]),
        }
    }

    fn key(&self) -> RecordId {
        self.target
    }

    fn stamp(&self) -> u64 {
        self.stamp
    }

    fn min_for_key(key: RecordId) -> Self {
        Tally { target: key, ..Tally::default() }
    }

    fn max_for_key(key: RecordId) -> Self {
        let max = u64::MAX;
        Tally { target: key, collection: max, location: max, stamp: max, records: max, accounts: max }
    }

    fn same_identity(&self, other: &Self) -> bool {
        self.target == other.target && self.collection == other.collection && self.location == other.location
    }
}

impl Entry for AccountTally {
    const WIDTH: usize = AccountTally::WIDTH;
    const IDENTITY_WIDTH: usize = 48;
    /// The identity: a flush asks for one account's count of one (collection, location), and an
    /// account that links to the target from another one (a repost after a like) has the key but
    /// not the identity (about two thirds of the keys a flush found present, by model).
    const FILTER_WIDTH: usize = 48;
    /// The target's record key and DID: a target's accounts stay together in one table of a
    /// compacted run (their ids are close, and so compress well).
    const SHARD_WIDTH: usize = 16;
    const TREE: TreeKind = TreeKind::AccountTallies;
    /// The target's.
    const RKEY_OFFSETS: &'static [usize] = &[0];

    fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        let fields = [
            self.target_rkey,
            self.target_did,
            self.account,
            self.target_collection,
            self.collection,
            self.location,
            self.stamp,
            self.records,
        ];
        for (field, bytes) in fields.iter().zip(out.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&field.to_be_bytes());
        }
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        let field = |i: usize| be_u64(&bytes[i * 8..i * 8 + 8]);
        AccountTally {
            target_rkey: field(0),
            target_did: field(1),
            account: field(2),
            target_collection: field(3),
            collection: field(4),
            location: field(5),
            stamp: field(6),
            records: field(7),
        }
    }

    fn key(&self) -> RecordId {
        AccountTally::key_of(self.account, self.target())
    }

    fn stamp(&self) -> u64 {
        self.stamp
    }

    fn min_for_key(key: RecordId) -> Self {
        AccountTally { target_rkey: key.rkey, target_did: key.collection, account: key.did, ..AccountTally::default() }
    }

    fn max_for_key(key: RecordId) -> Self {
        let max = u64::MAX;
        AccountTally {
            target_rkey: key.rkey,
            target_did: key.collection,
            account: key.did,
            target_collection: max,
            collection: max,
            location: max,
            stamp: max,
            records: max,
        }
    }

    fn same_identity(&self, other: &Self) -> bool {
        let identity = |t: &Self| (t.account, t.target(), t.collection, t.location);
        identity(self) == identity(other)
    }
}

/// Encodes into a fresh buffer; for tests and cold paths.
pub fn encode_to_vec<E: Entry>(entry: &E) -> Vec<u8> {
    let mut out = vec![0u8; E::WIDTH];
    entry.encode(&mut out);
    out
}

/// Whether two entries agree in their first `FILTER_WIDTH` bytes (one filter hash holds both).
pub fn same_filter_prefix<E: Entry>(a: &E, b: &E) -> bool {
    if E::FILTER_WIDTH == E::KEY_WIDTH {
        return a.key() == b.key();
    }
    // On the stack: a table builder asks this of every entry it writes.
    let (mut ea, mut eb) = ([0u8; MAX_ENCODED_WIDTH], [0u8; MAX_ENCODED_WIDTH]);
    a.encode(&mut ea[..E::WIDTH]);
    b.encode(&mut eb[..E::WIDTH]);
    ea[..E::FILTER_WIDTH] == eb[..E::FILTER_WIDTH]
}

/// Most bytes any entry encodes to (`same_filter_prefix`'s buffers).
const MAX_ENCODED_WIDTH: usize = 128;

/// The filter hash of the shard prefix of `key` (what `FILTER_HOLDS_SHARDS` filters hold).
pub fn shard_prefix_hash<E: Entry>(key: &RecordId) -> KeyHash {
    KeyHash::of(&key.to_bytes()[..E::SHARD_WIDTH])
}

/// The smallest and largest entries that agree with `probe` in their first `FILTER_WIDTH` bytes.
pub fn filter_prefix_bounds<E: Entry>(probe: &E) -> (E, E) {
    let mut bytes = encode_to_vec(probe);
    bytes[E::FILTER_WIDTH..].fill(0);
    let lo = E::decode(&bytes);
    bytes[E::FILTER_WIDTH..].fill(u8::MAX);
    let hi = E::decode(&bytes);
    assert!(lo <= *probe && *probe <= hi && lo.key() == probe.key(), "a filter prefix spans one key");
    (lo, hi)
}

/// The part of a sorted slice within `lo..=hi`.
pub fn within<'a, E: Ord>(sorted: &'a [E], lo: &E, hi: &E) -> &'a [E] {
    let start = sorted.partition_point(|e| e < lo);
    let end = start + sorted[start..].partition_point(|e| e <= hi);
    &sorted[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record_id() -> impl Strategy<Value = RecordId> {
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(rkey, collection, did)| RecordId {
            rkey,
            collection,
            did,
        })
    }

    fn backlink() -> impl Strategy<Value = Backlink> {
        (record_id(), record_id(), any::<u64>(), any::<u64>())
            .prop_map(|(target, source, location, source_rev)| Backlink { target, source, location, source_rev })
    }

    fn check_laws<E: Entry>(a: E, b: E) {
        let (ea, eb) = (encode_to_vec(&a), encode_to_vec(&b));
        assert_eq!(E::decode(&ea), a);
        assert_eq!(a.cmp(&b), ea.cmp(&eb));
        assert_eq!(ea[..E::KEY_WIDTH], a.key().to_bytes());
        assert_eq!(ea[E::IDENTITY_WIDTH..E::IDENTITY_WIDTH + 8], a.stamp().to_be_bytes());
        assert!(E::SHARD_WIDTH <= E::KEY_WIDTH && E::KEY_WIDTH <= E::IDENTITY_WIDTH);
        assert!(E::KEY_WIDTH <= E::FILTER_WIDTH && E::FILTER_WIDTH <= E::IDENTITY_WIDTH);
        // A shard prefix and a filter prefix hash inputs of different lengths: never one input.
        assert!(!E::FILTER_HOLDS_SHARDS || E::SHARD_WIDTH < E::FILTER_WIDTH);
        let (lo, hi) = filter_prefix_bounds(&a);
        assert_eq!(encode_to_vec(&lo)[..E::FILTER_WIDTH], ea[..E::FILTER_WIDTH]);
        assert_eq!(encode_to_vec(&hi)[..E::FILTER_WIDTH], ea[..E::FILTER_WIDTH]);
        assert!(lo <= a && a <= hi && (b < lo || b > hi || ea[..E::FILTER_WIDTH] == eb[..E::FILTER_WIDTH]));
        assert_eq!(same_filter_prefix(&a, &b), ea[..E::FILTER_WIDTH] == eb[..E::FILTER_WIDTH]);
        assert_eq!(a.same_identity(&b), ea[..E::IDENTITY_WIDTH] == eb[..E::IDENTITY_WIDTH]);
        assert!(E::min_for_key(a.key()) <= a && a <= E::max_for_key(a.key()));
    }

    proptest! {
        #[test]
        fn backlink_laws(a in backlink(), b in backlink()) {
            check_laws(a, b);
            let twin = Backlink { source_rev: b.source_rev, ..a };
            check_laws(a, twin);
        }

        #[test]
        fn forward_link_laws(a in backlink(), b in backlink()) {
            check_laws(a.forward(), b.forward());
            check_laws(a.forward(), Backlink { source_rev: b.source_rev, ..a }.forward());
            assert_eq!(a.forward().backlink(), a);
        }

        #[test]
        fn hot_link_laws(a in backlink(), b in backlink()) {
            check_laws(HotLink::of(a), HotLink::of(b));
            check_laws(HotLink::of(a), HotLink::of(Backlink { source_rev: b.source_rev, ..a }));
            assert_eq!(HotLink::of(a).backlink(), a);
            assert_eq!(HotLink::source_of_key(HotLink::key_of(a.source)), a.source);
            let (first, last) = HotLink::account_keys(a.source.did);
            assert!(first <= HotLink::of(a).key() && HotLink::of(a).key() <= last);
        }

        #[test]
        fn tally_laws(a in backlink(), b in backlink(), records in any::<u64>()) {
            let tally = |l: Backlink, records| Tally {
                target: l.target, collection: l.source.collection, location: l.location, stamp: l.source_rev, records,
                accounts: records / 3,
            };
            check_laws(tally(a, records), tally(b, records / 2));
            let fresher = Backlink { source_rev: b.source_rev, ..a };
            check_laws(tally(a, records), tally(fresher, records / 2));
        }

        #[test]
        fn account_tally_laws(a in backlink(), b in backlink(), records in any::<u64>()) {
            let tally = |l: Backlink, records| {
                AccountTally::of(l.source.did, l.target, (l.source.collection, l.location), l.source_rev, records)
            };
            check_laws(tally(a, records), tally(b, records / 2));
            let fresher = Backlink { source_rev: b.source_rev, ..a };
            check_laws(tally(a, records), tally(fresher, records / 2));
            assert_eq!(tally(a, records).target(), a.target);
        }

        #[test]
        fn revocation_laws(s in record_id(), t in record_id(), r1 in any::<u64>(), r2 in any::<u64>()) {
            check_laws(Revocation { source: s, rev: r1 }, Revocation { source: t, rev: r2 });
            check_laws(Revocation { source: s, rev: r1 }, Revocation { source: s, rev: r2 });
        }
    }

    #[test]
    fn within_takes_exactly_the_inclusive_range() {
        let sorted = [1, 3, 3, 5, 7, 9];
        assert_eq!(within(&sorted, &3, &7), &[3, 3, 5, 7]);
        assert_eq!(within(&sorted, &4, &4), &[] as &[i32]);
        assert_eq!(within(&sorted, &0, &100), &sorted);
        assert_eq!(within(&sorted, &10, &20), &[] as &[i32]);
    }
}
