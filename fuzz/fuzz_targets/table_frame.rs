//! Table data frames: `decode_frame` on arbitrary bytes, for both entry types.
//!
//! The first byte picks the entry type (bit 0: backlinks or revocations) and whether the trailing
//! checksum is fixed up first (bit 1), so that the parsing behind the checksum is reached.
//!
//! Invariants checked (src/lsm/table.rs states them):
//! - On error the output vector is exactly as it was.
//! - On success the frame held 1..=max_frame_entries entries, strictly increasing.
//! - decode(encode(x)) == x: the decoded entries, written again as a one-frame table, decode to
//!   the same entries.
#![no_main]

mod common;

use backlinks::lsm::entry::Entry;
use backlinks::lsm::table::{MAX_FRAME_RAW_BYTES, decode_frame, max_frame_entries};
use backlinks::model::ids::{Backlink, Revocation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else { return };
    let frame = if mode & 2 == 0 { frame.to_vec() } else { common::with_checksum(frame) };
    if mode & 1 == 0 { check_frame::<Backlink>(&frame) } else { check_frame::<Revocation>(&frame) }
});

fn check_frame<E: Entry + Default>(frame: &[u8]) {
    // A sentinel entry already in the output: a failed decode must leave it alone.
    let mut out = vec![E::default()];
    let result = decode_frame::<E>(frame, &mut out);
    let decoded = out.split_off(1);
    assert_eq!(out, [E::default()], "the entries before the frame were touched");
    if result.is_err() {
        assert!(decoded.is_empty(), "a failed decode appended {} entries", decoded.len());
        return;
    }
    assert!((1..=max_frame_entries::<E>()).contains(&decoded.len()), "{} entries", decoded.len());
    assert!(decoded.windows(2).all(|pair| pair[0] < pair[1]), "entries not strictly increasing");
    let (rewritten, _meta) = common::build_table(&decoded, MAX_FRAME_RAW_BYTES);
    let mut again = Vec::new();
    decode_frame::<E>(&rewritten, &mut again).expect("a frame we wrote decodes");
    assert_eq!(again, decoded, "decode(encode(x)) != x");
}
