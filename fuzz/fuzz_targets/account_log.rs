//! Account log objects: `account_log::decode` on arbitrary bytes, for both kinds.
//!
//! Byte 0 picks the kind (bit 0) and whether the rest is taken as the object itself (bit 7
//! clear) or as its contents before the checksum and compression (bit 7 set: the target appends
//! the xxh3-64 and compresses, and takes the object the manifest would name from the contents'
//! own header, so that the accounts' parsing behind them is reached).
//!
//! Invariants checked (docs/format.md "Account log objects" states the format):
//! - A decoded object holds exactly the accounts its manifest entry counts, in strictly
//!   increasing did order; a snapshot's are all hidden.
//! - decode(encode(accounts)) == accounts.
#![no_main]

use backlinks::account_log::{AccountObject, LogObject, decode, encode};
use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let kind = if mode & 1 == 0 { LogObject::Snapshot } else { LogObject::Changes };
    let field = |at: usize| rest.get(at..at + 8).map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().unwrap()));
    let object = AccountObject { after: field(7), through: field(15), count: field(23) };
    let body = if mode & 0x80 == 0 { rest.to_vec() } else { sealed(rest) };
    let Ok(accounts) = decode(kind, &object, &body) else { return };
    let listed: Vec<_> = accounts.iter().collect();
    assert_eq!(listed.len() as u64, object.count, "as many accounts as the entry says");
    assert!(listed.windows(2).all(|pair| pair[0].0 < pair[1].0), "dids strictly increase");
    assert!(kind == LogObject::Changes || listed.iter().all(|(_, state)| state.is_hidden()), "a snapshot hides");
    let again = encode(kind, &object, &accounts);
    assert_eq!(decode(kind, &object, &again).expect("an object we wrote decodes"), accounts, "decode(encode(x)) != x");
});

/// The contents with their checksum appended, compressed as a writer would.
fn sealed(contents: &[u8]) -> Vec<u8> {
    let mut raw = contents.to_vec();
    raw.extend_from_slice(&xxh3_64(contents).to_le_bytes());
    zstd::bulk::compress(&raw, 3).expect("zstd compresses in memory")
}
