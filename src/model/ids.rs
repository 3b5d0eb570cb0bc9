//! Fixed-width identifiers: `RecordId`, `Backlink`, `ForwardLink`, `Revocation`, `HotLink`, `Tally`,
//! `AccountTally`.
//!
//! Invariants:
//! - Every encoding is big-endian with fields in declaration order, so the byte order of two
//!   encoded values equals the `Ord` order of the values (the derived `Ord` compares fields in
//!   declaration order, and big-endian `u64` bytes compare like the integers).
//! - A bare DID target, and a repo-level revocation source, is `RecordId { rkey: 0, collection: 0, did }`.
//! - An inline rkey (a TID) has the top bit clear; an outlined rkey has it set.
//! - An outlined DID has the top bit set; the second-highest bit is reserved and always clear.
//! - A URL target is `RecordId::url`: a `did` with both top bits set ([`URL_DID_TAG`], which no
//!   DID id has), collection 0 and an odd `rkey`, the other 125 bits from SHA-256 of the URL as
//!   written. It is never a source, and no string is kept: an answer never names a URL target.

use sha2::{Digest, Sha256};

/// Top bit of a u64: marks an outlined rkey or DID.
pub const OUTLINED_BIT: u64 = 1 << 63;
/// Second-highest bit of a DID id: reserved for future DID kinds, never set today.
pub const DID_RESERVED_BIT: u64 = 1 << 62;
/// Collection id reserved for `<self>`: the target is the account itself.
pub const SELF_COLLECTION: u64 = 0;
/// The top two bits of a URL target's `did`: outlined, and the bit reserved in DIDs.
pub const URL_DID_TAG: u64 = OUTLINED_BIT | DID_RESERVED_BIT;

/// One record (or, with `rkey == 0 && collection == 0`, one whole repository).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId {
    pub rkey: u64,
    pub collection: u64,
    pub did: u64,
}

impl RecordId {
    pub const WIDTH: usize = 24;

    /// The bare-DID / whole-repository form.
    pub fn repo(did: u64) -> Self {
        Self { rkey: 0, collection: SELF_COLLECTION, did }
    }

    pub fn is_repo(&self) -> bool {
        self.rkey == 0 && self.collection == SELF_COLLECTION
    }

    /// The target id of an `http(s)://` URL: 125 bits of its SHA-256, so that finding two URLs
    /// with one id takes some 2^62 hashes (a cryptographic hash, because whoever writes records
    /// chooses the URLs). The id is a function of the text alone; no outline is written or read.
    pub fn url(url: &str) -> Self {
        let digest: [u8; 32] = Sha256::digest(url.as_bytes()).into();
        let rkey = be_u64(&digest[0..8]) | 1;
        let did = URL_DID_TAG | (be_u64(&digest[8..16]) >> 2);
        let id = Self { rkey, collection: SELF_COLLECTION, did };
        debug_assert!(id.is_url() && !id.is_repo());
        id
    }

    pub fn is_url(&self) -> bool {
        self.did & URL_DID_TAG == URL_DID_TAG
    }

    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::WIDTH);
        out[0..8].copy_from_slice(&self.rkey.to_be_bytes());
        out[8..16].copy_from_slice(&self.collection.to_be_bytes());
        out[16..24].copy_from_slice(&self.did.to_be_bytes());
    }

    pub fn to_bytes(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        self.encode(&mut out);
        out
    }

    pub fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), Self::WIDTH);
        Self { rkey: be_u64(&bytes[0..8]), collection: be_u64(&bytes[8..16]), did: be_u64(&bytes[16..24]) }
    }

    pub const MIN: RecordId = RecordId { rkey: 0, collection: 0, did: 0 };
    pub const MAX: RecordId = RecordId { rkey: u64::MAX, collection: u64::MAX, did: u64::MAX };
}

/// `source` links to `target` at `location`; written at ingest stamp `source_rev`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backlink {
    pub target: RecordId,
    pub source: RecordId,
    pub location: u64,
    pub source_rev: u64,
}

impl Backlink {
    pub const WIDTH: usize = 64;

    /// The liveness rule: live iff written at or after both the record-level and the repo-level
    /// threshold of its source (`threshold` gives 0 for a source never revoked).
    pub fn survives(&self, threshold: impl Fn(&RecordId) -> u64) -> bool {
        self.source_rev >= self.threshold(threshold)
    }

    /// The stamp this backlink must reach to be live: the larger of its source's record-level
    /// and repo-level thresholds.
    pub fn threshold(&self, threshold: impl Fn(&RecordId) -> u64) -> u64 {
        threshold(&self.source).max(threshold(&RecordId::repo(self.source.did)))
    }
}

/// A backlink seen from its source: `source` links to `target` at `location`, written at
/// `source_rev`. Kept for records with more than one link, so that a query can go from a record
/// that links to one subject to the other subjects it links to (many-to-many). The same fields
/// as its `Backlink`, in source order, and alive by the same rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForwardLink {
    pub source: RecordId,
    pub location: u64,
    pub target: RecordId,
    pub source_rev: u64,
}

impl ForwardLink {
    pub const WIDTH: usize = 64;

    pub fn backlink(self) -> Backlink {
        Backlink { target: self.target, source: self.source, location: self.location, source_rev: self.source_rev }
    }
}

impl Backlink {
    /// The same link seen from its source.
    pub fn forward(self) -> ForwardLink {
        ForwardLink { source: self.source, location: self.location, target: self.target, source_rev: self.source_rev }
    }
}

/// A backlink to a hot target (one whose counts the index keeps, `Tally`) seen from its source's
/// account: the source's DID, collection and record key, then the target, location and stamp,
/// the fields of its `Backlink`, alive by the same rule. Ordered by account, so that everything an
/// account links to among hot targets is one key range: a deletion, a snapshot or a change of
/// the account's visibility finds what it changes in the counts there, as a record's deletion
/// finds its record's links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HotLink {
    pub account: u64,
    pub collection: u64,
    pub rkey: u64,
    pub target: RecordId,
    pub location: u64,
    pub source_rev: u64,
}

impl HotLink {
    pub const WIDTH: usize = 64;

    pub fn of(link: Backlink) -> Self {
        let Backlink { target, source, location, source_rev } = link;
        HotLink { account: source.did, collection: source.collection, rkey: source.rkey, target, location, source_rev }
    }

    pub fn backlink(self) -> Backlink {
        Backlink { target: self.target, source: self.source(), location: self.location, source_rev: self.source_rev }
    }

    pub fn source(&self) -> RecordId {
        RecordId { rkey: self.rkey, collection: self.collection, did: self.account }
    }

    /// The tree key of a source's hot links: the source's three fields, DID first, in the three
    /// fields of a `RecordId` (whose encoding is their concatenation). Not a record id: only the
    /// hot tree's lookups use it.
    pub fn key_of(source: RecordId) -> RecordId {
        RecordId { rkey: source.did, collection: source.collection, did: source.rkey }
    }

    /// The source whose key (`key_of`) is `key`.
    pub fn source_of_key(key: RecordId) -> RecordId {
        RecordId { rkey: key.did, collection: key.collection, did: key.rkey }
    }

    /// The smallest and largest keys of an account's hot links (`key_of` of its sources).
    pub fn account_keys(did: u64) -> (RecordId, RecordId) {
        (RecordId { rkey: did, collection: 0, did: 0 }, RecordId { rkey: did, collection: u64::MAX, did: u64::MAX })
    }
}

/// How many live backlinks a hot target has from one (source collection, location), and from how
/// many accounts: the values a flush wrote at `stamp` (the clock it covers), the freshest stamp
/// winning. Hidden accounts' links are not counted. The tally of (`ALL`, `ALL`) counts every
/// collection and location together, its `accounts` the sum of theirs (an account linking from
/// two of them counts twice: a flush learns an account's count of one group, never whether it has
/// others); every hot target has it, and a target is hot exactly when it has tallies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tally {
    pub target: RecordId,
    pub collection: u64,
    pub location: u64,
    pub stamp: u64,
    pub records: u64,
    pub accounts: u64,
}

impl Tally {
    pub const WIDTH: usize = 64;
    /// The collection and location of the tally of a whole target: 0 is no collection or
    /// location id (their outline ids have counters from 1 and no tag bits).
    pub const ALL: u64 = 0;

    /// True for the tally of a whole target, not of one (collection, location).
    pub fn is_whole(&self) -> bool {
        self.collection == Self::ALL && self.location == Self::ALL
    }

    /// The tallies of `target` that `accounts` (its account tallies, one an identity) make,
    /// stamped `stamp`: one a (collection, location) with a live link, sorted, then the whole
    /// target's (its accounts summed over the groups), which is there even when no account has
    /// one.
    pub fn of_accounts<'a>(
        target: RecordId,
        accounts: impl Iterator<Item = &'a AccountTally>,
        stamp: u64,
    ) -> Vec<Tally> {
        let mut groups = TallyGroups::default();
        accounts.for_each(|tally| groups.add(tally));
        groups.tallies(target, stamp)
    }

    /// The whole tally of `target`, stamped `stamp`: its groups' records and accounts summed.
    pub fn whole_of<'a>(target: RecordId, groups: impl Iterator<Item = &'a Tally>, stamp: u64) -> Tally {
        let mut whole = Tally { target, collection: Self::ALL, location: Self::ALL, stamp, ..Tally::default() };
        for group in groups {
            whole.records += group.records;
            whole.accounts += group.accounts;
        }
        whole
    }
}

/// The tallies of one target summed from its account tallies, one at a time (what
/// `Tally::of_accounts` makes, for account tallies that come in no order of their own).
#[derive(Debug, Default)]
pub struct TallyGroups {
    /// (collection, location) -> (records, accounts).
    groups: std::collections::BTreeMap<(u64, u64), (u64, u64)>,
}

impl TallyGroups {
    pub fn add(&mut self, tally: &AccountTally) {
        if tally.records > 0 {
            let group = self.groups.entry((tally.collection, tally.location)).or_default();
            group.0 += tally.records;
            group.1 += 1;
        }
    }

    /// One tally a group with a live link, sorted, then the whole target's.
    pub fn tallies(self, target: RecordId, stamp: u64) -> Vec<Tally> {
        let tally = |((collection, location), (records, accounts))| Tally {
            target,
            collection,
            location,
            stamp,
            records,
            accounts,
        };
        let groups: Vec<Tally> = self.groups.into_iter().map(tally).collect();
        let whole = Tally::whole_of(target, groups.iter(), stamp);
        groups.into_iter().chain([whole]).collect()
    }
}

/// How many live backlinks a hot target has from one account at one (source collection,
/// location), as a flush wrote it at `stamp` (the freshest stamp winning); a hidden account's are
/// not counted. What a flush needs to know whether a change of one link changes the target's
/// distinct accounts (a count going to or from 0), and what a count filtered by account reads.
/// Fields in encoding order: the target's record key and DID, the account, then the target's
/// collection. A target's accounts are next to each other (their ids are close: they compress
/// well), and the first 24 bytes, the tree key, tell one (target, account) from another nearly
/// always: two share them only when their targets differ in collection alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AccountTally {
    pub target_rkey: u64,
    pub target_did: u64,
    pub account: u64,
    pub target_collection: u64,
    pub collection: u64,
    pub location: u64,
    pub stamp: u64,
    pub records: u64,
}

impl AccountTally {
    pub const WIDTH: usize = 64;

    /// `account`'s count of live links to `target` from one (source collection, location).
    pub fn of(account: u64, target: RecordId, (collection, location): (u64, u64), stamp: u64, records: u64) -> Self {
        let RecordId { rkey: target_rkey, collection: target_collection, did: target_did } = target;
        AccountTally { account, target_rkey, target_did, target_collection, collection, location, stamp, records }
    }

    pub fn target(&self) -> RecordId {
        RecordId { rkey: self.target_rkey, collection: self.target_collection, did: self.target_did }
    }

    /// The tree key of an account's tallies of a target: the target's record key and DID, then
    /// the account, in the three fields of a `RecordId` (whose encoding is their concatenation).
    /// Not a record id: only the account tallies' lookups use it.
    pub fn key_of(account: u64, target: RecordId) -> RecordId {
        RecordId { rkey: target.rkey, collection: target.did, did: account }
    }

    /// The account of a key `key_of` made.
    pub fn account_of_key(key: RecordId) -> u64 {
        key.did
    }
}

/// Every backlink of `source` written before stamp `rev` is dead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revocation {
    pub source: RecordId,
    pub rev: u64,
}

impl Revocation {
    pub const WIDTH: usize = 32;
}

/// The trees of the index: backlinks, the same links by source (for records with more than one),
/// the revocations that decide the liveness of both, and for hot targets their links by account,
/// their counts and their counts by account. The name is the tree's directory, object key segment and catalog value
/// (`tables/<name>/<id>.data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TreeKind {
    /// `Backlink` entries.
    Links,
    /// `Revocation` entries.
    Thresholds,
    /// `ForwardLink` entries.
    Forward,
    /// `HotLink` entries.
    Hot,
    /// `Tally` entries.
    Tallies,
    /// `AccountTally` entries.
    AccountTallies,
}

impl TreeKind {
    pub const ALL: [TreeKind; 6] = [
        TreeKind::Links,
        TreeKind::Thresholds,
        TreeKind::Forward,
        TreeKind::Hot,
        TreeKind::Tallies,
        TreeKind::AccountTallies,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            TreeKind::Links => "links",
            TreeKind::Thresholds => "thresholds",
            TreeKind::Forward => "forward",
            TreeKind::Hot => "hot",
            TreeKind::Tallies => "tallies",
            TreeKind::AccountTallies => "account_tallies",
        }
    }

    /// The tree of a name that `name` gave; `None` for any other string.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl std::fmt::Display for TreeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) fn be_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_of_accounts_sum_the_groups_for_the_whole_target() {
        let target = RecordId { rkey: 9, collection: 3, did: 1 };
        let of = |account, group, records| AccountTally::of(account, target, group, 5, records);
        let (likes, replies) = ((2, 7), (4, 8));
        let accounts = [of(10, likes, 2), of(10, replies, 1), of(11, likes, 1), of(12, replies, 0)];
        let tally = |(collection, location), records, accounts| Tally {
            target,
            collection,
            location,
            stamp: 5,
            records,
            accounts,
        };
        let whole = (Tally::ALL, Tally::ALL);
        // Account 10 links from both groups: the whole target's accounts count it twice.
        let want = vec![tally(likes, 3, 2), tally(replies, 1, 1), tally(whole, 4, 3)];
        assert_eq!(Tally::of_accounts(target, accounts.iter(), 5), want);
        assert_eq!(Tally::of_accounts(target, [].iter(), 5), vec![tally(whole, 0, 0)], "the whole tally stays");
        assert!(Tally::of_accounts(target, [].iter(), 5)[0].is_whole());
    }

    #[test]
    fn record_id_round_trips_and_orders_like_bytes() {
        let a = RecordId { rkey: 1, collection: u64::MAX, did: 7 };
        let b = RecordId { rkey: 2, collection: 0, did: 0 };
        assert_eq!(RecordId::decode(&a.to_bytes()), a);
        assert!(a < b);
        assert!(a.to_bytes() < b.to_bytes());
        assert_eq!(
            a.to_bytes(),
            [0, 0, 0, 0, 0, 0, 0, 1, 255, 255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 7]
        );
    }

    #[test]
    fn a_backlink_survives_only_thresholds_at_or_below_its_stamp() {
        let source = RecordId { rkey: 9, collection: 2, did: 7 };
        let link = Backlink { target: RecordId::repo(1), source, location: 1, source_rev: 10 };
        let only = |key: RecordId, rev: u64| move |k: &RecordId| if *k == key { rev } else { 0 };
        assert!(link.survives(|_| 0));
        assert!(link.survives(only(source, 10)), "an update at the same stamp keeps its links");
        assert!(!link.survives(only(source, 11)));
        assert!(!link.survives(only(RecordId::repo(7), 11)), "the repo-level threshold counts too");
        assert!(link.survives(only(RecordId::repo(8), 11)), "another repo's does not");
    }

    #[test]
    fn tree_names_round_trip() {
        for kind in TreeKind::ALL {
            assert_eq!(TreeKind::from_name(kind.name()), Some(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(TreeKind::from_name("Links"), None);
    }

    #[test]
    fn url_ids_are_tagged_and_differ_by_every_byte() {
        let a = RecordId::url("https://example.com/a");
        assert_eq!(a, RecordId::url("https://example.com/a"), "a function of the text");
        assert!(a.is_url() && !a.is_repo() && a.collection == SELF_COLLECTION);
        assert_eq!(a.did >> 62, 0b11);
        assert_eq!(a.rkey & 1, 1);
        for other in
            ["https://example.com/b", "https://example.com/a/", "https://Example.com/a", "http://example.com/a"]
        {
            assert_ne!(RecordId::url(other), a, "{other}");
        }
        // No DID id, outlined or a did:plc sequence number, carries the tag.
        assert!(!RecordId::repo(OUTLINED_BIT | 5).is_url() && !RecordId::repo(5).is_url());
    }

    #[test]
    fn repo_form_is_zero_rkey_and_collection() {
        let r = RecordId::repo(42);
        assert!(r.is_repo());
        assert_eq!(r.to_bytes()[..16], [0u8; 16]);
        assert!(!RecordId { rkey: 1, collection: 0, did: 42 }.is_repo());
    }
}
