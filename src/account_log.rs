//! Account states as published: a manifest names an account log, a snapshot of every hidden
//! account as of one account change and the changes after it, each an object of its own, so
//! that a manifest stays small and a replica fetches only what changed since it last looked.
//!
//! - `accounts/snapshot-<through>`: every hidden account once account change `through` (a
//!   catalog sequence number, one per flush that changed any account) was committed.
//! - `accounts/changes-<after>-<through>`: the latest state of every account changed in
//!   `(after, through]`, active ones included (they show an account again).
//!
//! Invariants:
//! - An object holds accounts in strictly increasing did order, each once: a snapshot hidden
//!   states only, a change range any state. Its body says its kind, `after`, `through` and count,
//!   and a checksum covers it all; a reader checks each against the name it fetched.
//! - A log's change ranges follow the snapshot without gap or overlap, oldest first; applying
//!   them in order to the snapshot gives the states as of the last one's `through`.
//! - A writer writes a new snapshot (and the log starts over) once the changes since the last
//!   one outnumber it (and `REBASE_MIN_CHANGES`) or the log holds `MAX_CHANGE_RANGES` ranges: a
//!   reader never replays more than about one snapshot's worth of changes.
//! - Neither side holds an object's accounts unpacked: `PackedAccounts` keeps them at 2-3 bytes
//!   each, as they are in the object.

use crate::model::account::AccountState;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 4] = b"BLAC";
const VERSION: u16 = 1;
/// Magic, version, kind, after, through, count.
const HEADER_LEN: usize = 4 + 2 + 1 + 8 + 8 + 8;
const CHECKSUM_LEN: usize = 8;
/// Largest decompressed object accepted: some 350 M accounts at 3 bytes each.
pub const MAX_OBJECT_BYTES: usize = 1 << 30;
/// The fewest changes since the snapshot that make a writer write the next one.
pub const REBASE_MIN_CHANGES: u64 = 1 << 16;
/// Change ranges a writer lets a log hold before it writes a snapshot.
pub const MAX_CHANGE_RANGES: usize = 256;
/// Change ranges a reader accepts in one log (far above what a writer leaves).
const MAX_LOG_RANGES: usize = 4096;
const ZSTD_LEVEL: i32 = 3;

/// One object of a log: a snapshot (`after` 0) or a change range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountObject {
    pub after: u64,
    pub through: u64,
    pub count: u64,
}

/// What a manifest says of account states.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountLog {
    pub snapshot: AccountObject,
    pub changes: Vec<AccountObject>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogObject {
    Snapshot,
    Changes,
}

impl LogObject {
    fn code(self) -> u8 {
        match self {
            LogObject::Snapshot => 1,
            LogObject::Changes => 2,
        }
    }
}

impl AccountLog {
    /// A log that is only a snapshot.
    pub fn starting_at(snapshot: AccountObject) -> Self {
        assert_eq!(snapshot.after, 0, "a snapshot starts from nothing");
        AccountLog { snapshot, changes: Vec::new() }
    }

    /// The account change its states are as of.
    pub fn through(&self) -> u64 {
        self.changes.last().map_or(self.snapshot.through, |range| range.through)
    }

    /// Whether a writer should write a snapshot rather than a range of `new_changes` more: when
    /// the changes since the snapshot would outnumber it and `min_changes` (a writer's
    /// `REBASE_MIN_CHANGES` unless a test wants a rebase sooner), or the ranges run out.
    pub fn rebase_due(&self, new_changes: u64, min_changes: u64) -> bool {
        let since: u64 = self.changes.iter().map(|range| range.count).sum::<u64>() + new_changes;
        since > self.snapshot.count.max(min_changes) || self.changes.len() >= MAX_CHANGE_RANGES
    }

    /// Every object the log names, the snapshot first.
    pub fn objects(&self) -> impl Iterator<Item = (LogObject, &AccountObject)> + '_ {
        std::iter::once((LogObject::Snapshot, &self.snapshot))
            .chain(self.changes.iter().map(|range| (LogObject::Changes, range)))
    }

    /// Every object key the log names, the snapshot first.
    pub fn keys(&self) -> impl Iterator<Item = String> + '_ {
        self.objects().map(|(kind, object)| object_key(kind, object))
    }

    /// The change ranges of `self` after those of `known`, when `self` extends it (the same
    /// snapshot, `known`'s ranges its first ones); `None` when it starts over.
    pub fn ranges_after<'a>(&'a self, known: &AccountLog) -> Option<&'a [AccountObject]> {
        let extends = self.snapshot == known.snapshot && self.changes.starts_with(&known.changes);
        extends.then(|| &self.changes[known.changes.len()..])
    }

    /// Checks what a manifest claims: ranges contiguous after the snapshot, bounded.
    pub fn validate(&self) -> Result<(), String> {
        if self.snapshot.after != 0 {
            return Err(format!("account snapshot {:?} does not start from nothing", self.snapshot));
        }
        if self.changes.len() > MAX_LOG_RANGES {
            return Err(format!("{} account change ranges is over the limit", self.changes.len()));
        }
        let mut through = self.snapshot.through;
        for range in &self.changes {
            if range.after != through || range.through <= range.after {
                return Err(format!("account change range {range:?} does not follow {through}"));
            }
            through = range.through;
        }
        let too_many = |object: &AccountObject| object.count > (MAX_OBJECT_BYTES / 2) as u64;
        if too_many(&self.snapshot) || self.changes.iter().any(too_many) {
            return Err("an account object claims more accounts than it can hold".into());
        }
        Ok(())
    }
}

/// `accounts/snapshot-<through>` or `accounts/changes-<after>-<through>`, 16 hex digits each.
pub fn object_key(kind: LogObject, object: &AccountObject) -> String {
    match kind {
        LogObject::Snapshot => format!("accounts/snapshot-{:016x}", object.through),
        LogObject::Changes => format!("accounts/changes-{:016x}-{:016x}", object.after, object.through),
    }
}

/// Whether `key` is one `object_key` writes (what GC may delete), and the
/// account change it reaches.
pub fn parse_key(key: &str) -> Option<u64> {
    let hex = |text: &str| {
        (text.len() == 16 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then(|| u64::from_str_radix(text, 16).ok())
            .flatten()
    };
    let name = key.strip_prefix("accounts/")?;
    if let Some(through) = name.strip_prefix("snapshot-") {
        return hex(through);
    }
    let (after, through) = name.strip_prefix("changes-")?.split_once('-')?;
    hex(after)?;
    hex(through)
}

/// Accounts packed as an object holds them: each did as the LEB128 of its difference from the
/// one before (the first as itself), then its state's index in `AccountState::ALL`. 2 bytes an
/// account while dids lie under 128 apart, 3 under 16,384 (outlined dids are handed out in
/// sequence).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PackedAccounts {
    bytes: Vec<u8>,
    last: Option<u64>,
    count: u64,
}

impl PackedAccounts {
    /// Adds an account after the ones added: dids must increase.
    pub fn push(&mut self, did: u64, state: AccountState) {
        let delta = match self.last {
            Some(last) => {
                assert!(did > last, "packed accounts out of order");
                did - last
            }
            None => did,
        };
        let mut rest = delta;
        while rest >= 0x80 {
            self.bytes.push((rest as u8) | 0x80);
            rest >>= 7;
        }
        self.bytes.push(rest as u8);
        let index = AccountState::ALL.iter().position(|s| *s == state).expect("every state is in ALL");
        self.bytes.push(index as u8);
        self.last = Some(did);
        self.count += 1;
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The accounts in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (u64, AccountState)> + '_ {
        let mut reader = Unpacker { bytes: &self.bytes, at: 0, previous: None };
        std::iter::from_fn(move || reader.next().map(|next| next.expect("packed by push")))
    }

    /// Unpacks `bytes` as `push` packs them, checking every account: `None` when they are not
    /// exactly `count` accounts in strictly increasing did order with known states.
    fn unpack(bytes: Vec<u8>, count: u64) -> Option<PackedAccounts> {
        let mut reader = Unpacker { bytes: &bytes, at: 0, previous: None };
        let mut unpacked = 0u64;
        for next in reader.by_ref() {
            next?;
            unpacked += 1;
        }
        let last = reader.previous;
        (unpacked == count).then_some(PackedAccounts { bytes, last, count })
    }
}

/// Reads packed accounts one at a time; an item is `None` when the bytes are not an account.
struct Unpacker<'a> {
    bytes: &'a [u8],
    at: usize,
    previous: Option<u64>,
}

impl Iterator for Unpacker<'_> {
    type Item = Option<(u64, AccountState)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.bytes.len() {
            return None;
        }
        Some(self.account())
    }
}

impl Unpacker<'_> {
    fn account(&mut self) -> Option<(u64, AccountState)> {
        let (mut delta, mut shift) = (0u64, 0u32);
        loop {
            let byte = *self.bytes.get(self.at)?;
            self.at += 1;
            // The tenth byte may carry one bit only: more is not a u64.
            if shift == 63 && byte > 1 {
                return None;
            }
            delta |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let did = match self.previous {
            Some(_) if delta == 0 => return None,
            Some(previous) => previous.checked_add(delta)?,
            None => delta,
        };
        let state = *AccountState::ALL.get(usize::from(*self.bytes.get(self.at)?))?;
        self.at += 1;
        self.previous = Some(did);
        Some((did, state))
    }
}

/// The body of an object: zstd over the header, the packed accounts and an xxh3-64 of both.
pub fn encode(kind: LogObject, object: &AccountObject, accounts: &PackedAccounts) -> Vec<u8> {
    assert_eq!(object.count, accounts.len(), "an object's count is its accounts'");
    assert!(
        kind == LogObject::Changes || accounts.iter().all(|(_, state)| state.is_hidden()),
        "a snapshot holds hidden accounts only"
    );
    let mut raw = Vec::with_capacity(HEADER_LEN + accounts.bytes.len() + CHECKSUM_LEN);
    raw.extend_from_slice(MAGIC);
    raw.extend_from_slice(&VERSION.to_le_bytes());
    raw.push(kind.code());
    for field in [object.after, object.through, object.count] {
        raw.extend_from_slice(&field.to_le_bytes());
    }
    raw.extend_from_slice(&accounts.bytes);
    raw.extend_from_slice(&xxh3_64(&raw).to_le_bytes());
    assert!(raw.len() <= MAX_OBJECT_BYTES, "account object over the decode limit");
    let body = zstd::bulk::compress(&raw, ZSTD_LEVEL).expect("zstd compresses in memory");
    debug_assert_eq!(decode(kind, object, &body).as_ref(), Ok(accounts), "an object decodes as written");
    body
}

/// The accounts of the object `object` of `kind`, checked against everything its body says.
pub fn decode(kind: LogObject, object: &AccountObject, body: &[u8]) -> Result<PackedAccounts, String> {
    let mut raw = crate::store::inflate(body, MAX_OBJECT_BYTES)?;
    if raw.len() < HEADER_LEN + CHECKSUM_LEN || &raw[..4] != MAGIC {
        return Err("bad magic or too short".into());
    }
    let (covered, sum) = raw.split_at(raw.len() - CHECKSUM_LEN);
    if xxh3_64(covered).to_le_bytes() != sum {
        return Err("checksum mismatch".into());
    }
    if u16::from_le_bytes([covered[4], covered[5]]) != VERSION || covered[6] != kind.code() {
        return Err("unknown version or another kind of object".into());
    }
    let field = |at: usize| u64::from_le_bytes(covered[at..at + 8].try_into().expect("8 bytes"));
    let said = AccountObject { after: field(7), through: field(15), count: field(23) };
    if said != *object {
        return Err(format!("the object says {said:?} where the manifest says {object:?}"));
    }
    // The accounts keep the decompressed buffer: no second copy of a snapshot's bytes.
    raw.truncate(raw.len() - CHECKSUM_LEN);
    raw.drain(..HEADER_LEN);
    let accounts = PackedAccounts::unpack(raw, object.count)
        .ok_or("the accounts are malformed, out of order or not as many as it says")?;
    if kind == LogObject::Snapshot && accounts.iter().any(|(_, state)| !state.is_hidden()) {
        return Err("a snapshot lists an account that is not hidden".into());
    }
    Ok(accounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dids at the varint's edges and far apart, every hidden state.
    fn hidden() -> Vec<(u64, AccountState)> {
        let dids = [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 40, (1 << 63) | 1, (1 << 63) | 1_000_000, u64::MAX];
        let states = [AccountState::Deactivated, AccountState::Suspended, AccountState::Takendown];
        dids.iter().zip(states.iter().cycle()).map(|(did, state)| (*did, *state)).collect()
    }

    fn packed(accounts: &[(u64, AccountState)]) -> PackedAccounts {
        let mut packed = PackedAccounts::default();
        accounts.iter().for_each(|(did, state)| packed.push(*did, *state));
        packed
    }

    #[test]
    fn packed_accounts_give_back_what_was_pushed() {
        assert_eq!(packed(&hidden()).iter().collect::<Vec<_>>(), hidden());
        assert_eq!(packed(&hidden()).len(), hidden().len() as u64);
    }

    #[test]
    fn objects_round_trip_under_their_own_name_only() {
        let snapshot = AccountObject { after: 0, through: 9, count: hidden().len() as u64 };
        let body = encode(LogObject::Snapshot, &snapshot, &packed(&hidden()));
        assert_eq!(decode(LogObject::Snapshot, &snapshot, &body).unwrap(), packed(&hidden()));
        let elsewhere = AccountObject { through: 10, ..snapshot };
        assert!(decode(LogObject::Snapshot, &elsewhere, &body).unwrap_err().contains("the object says"));
        assert!(decode(LogObject::Changes, &snapshot, &body).unwrap_err().contains("another kind"));
        let changes = [(3, AccountState::Active), (4, AccountState::Deleted), (9, AccountState::Other)];
        let range = AccountObject { after: 9, through: 12, count: 3 };
        let body = encode(LogObject::Changes, &range, &packed(&changes));
        assert_eq!(decode(LogObject::Changes, &range, &body).unwrap().iter().collect::<Vec<_>>(), changes);
    }

    /// No single-byte change of a body decodes as other accounts (zstd or the checksum catches
    /// it), and bodies whose checksum holds but whose accounts are wrong are caught by their
    /// check.
    #[test]
    fn damaged_and_hostile_objects_are_rejected() {
        let snapshot = AccountObject { after: 0, through: 9, count: hidden().len() as u64 };
        let body = encode(LogObject::Snapshot, &snapshot, &packed(&hidden()));
        for at in 0..body.len() {
            let mut damaged = body.clone();
            damaged[at] ^= 0x10;
            // A flip of a bit zstd ignores (its frame header's unused one) changes nothing read.
            let decoded = decode(LogObject::Snapshot, &snapshot, &damaged);
            assert!(decoded.as_ref().is_err() || decoded == Ok(packed(&hidden())), "byte {at}: {decoded:?}");
        }
        let sealed = |accounts: &[u8], count: u64, kind: u8| {
            let mut raw = MAGIC.to_vec();
            raw.extend_from_slice(&VERSION.to_le_bytes());
            raw.push(kind);
            for field in [0, 9, count] {
                raw.extend_from_slice(&field.to_le_bytes());
            }
            raw.extend_from_slice(accounts);
            raw.extend_from_slice(&xxh3_64(&raw).to_le_bytes());
            zstd::bulk::compress(&raw, 1).unwrap()
        };
        let object = |count| AccountObject { after: 0, through: 9, count };
        let cases: [(&[u8], u64, &str); 6] = [
            (&[5, 1, 0, 1], 2, "a did twice"),
            (&[5, 1, 2], 2, "a truncated account"),
            (&[5, 6], 1, "an unknown state"),
            (&[5, 1], 2, "fewer accounts than said"),
            (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 1], 1, "a did over 64 bits"),
            (&[5, 0], 1, "an active account in a snapshot"),
        ];
        for (accounts, count, what) in cases {
            let body = sealed(accounts, count, LogObject::Snapshot.code());
            assert!(decode(LogObject::Snapshot, &object(count), &body).is_err(), "{what} accepted");
        }
        let body = sealed(&[5, 0], 1, LogObject::Changes.code());
        assert!(decode(LogObject::Changes, &object(1), &body).is_ok(), "a change may show an account again");
    }

    #[test]
    fn a_log_grows_then_starts_over() {
        let mut log = AccountLog::starting_at(AccountObject { after: 0, through: 4, count: 100_000 });
        assert!(!log.rebase_due(50_000, REBASE_MIN_CHANGES));
        log.changes.push(AccountObject { after: 4, through: 6, count: 60_000 });
        assert!(log.rebase_due(50_000, REBASE_MIN_CHANGES), "the changes would outnumber the snapshot");
        assert!(!log.rebase_due(50_000, 1 << 20), "nor past the writer's minimum");
        assert_eq!(log.through(), 6);
        let small = AccountLog::starting_at(AccountObject { after: 0, through: 4, count: 10 });
        assert!(
            !small.rebase_due(REBASE_MIN_CHANGES, REBASE_MIN_CHANGES),
            "a small snapshot still takes a range of changes"
        );
        let known = log.clone();
        log.changes.push(AccountObject { after: 6, through: 9, count: 1 });
        assert_eq!(log.ranges_after(&known), Some(&log.changes[1..]));
        assert_eq!(known.ranges_after(&log), None, "a log never goes back");
        let restarted = AccountLog::starting_at(AccountObject { after: 0, through: 9, count: 3 });
        assert_eq!(restarted.ranges_after(&log), None);
        assert_eq!(
            log.keys().collect::<Vec<_>>(),
            [
                "accounts/snapshot-0000000000000004",
                "accounts/changes-0000000000000004-0000000000000006",
                "accounts/changes-0000000000000006-0000000000000009",
            ]
        );
        assert!(log.keys().all(|key| parse_key(&key).is_some()));
        assert!(log.validate().is_ok());
        log.changes[1].after = 5;
        assert!(log.validate().is_err(), "a gap");
    }

    #[test]
    fn only_written_keys_parse() {
        assert_eq!(parse_key("accounts/snapshot-00000000000000ff"), Some(255));
        assert_eq!(parse_key("accounts/changes-0000000000000001-00000000000000ff"), Some(255));
        for other in ["accounts/snapshot-FF", "accounts/snapshot-00000000000000FF", "accounts/x", "tables/a"] {
            assert_eq!(parse_key(other), None, "{other}");
        }
    }
}
