//! Table data frames: `decode_frame` on arbitrary bytes, for both entry types, with and without
//! column models.
//!
//! The first byte picks the entry type (bit 0: backlinks or revocations), whether the trailing
//! checksum is fixed up first (bit 1), so that the parsing behind the checksum is reached, and
//! whether the frame is decoded under fixed column models and its entries rewritten with models
//! (bit 2), so that payload encoding 4's decoder is reached.
//!
//! Invariants checked (src/lsm/table.rs states them):
//! - On error the output vector is exactly as it was.
//! - On success the frame held 1..=max_frame_entries entries, strictly increasing.
//! - decode(encode(x)) == x: the decoded entries, written again as a one-frame table, decode to
//!   the same entries.
#![no_main]

mod common;

use backlinks::lsm::coder::ColumnModels;
use backlinks::lsm::entry::Entry;
use backlinks::lsm::table::{MAX_FRAME_RAW_BYTES, TableMeta, decode_frame, max_frame_entries};
use backlinks::model::ids::{Backlink, Revocation};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else { return };
    let frame = if mode & 2 == 0 { frame.to_vec() } else { common::with_checksum(frame) };
    let modelled = mode & 4 != 0;
    if mode & 1 == 0 {
        check_frame::<Backlink>(&frame, modelled.then(|| BACKLINK_MODELS.get_or_init(common::fixed_models::<Backlink>)))
    } else {
        check_frame::<Revocation>(
            &frame,
            modelled.then(|| REVOCATION_MODELS.get_or_init(common::fixed_models::<Revocation>)),
        )
    }
});

static BACKLINK_MODELS: OnceLock<ColumnModels> = OnceLock::new();
static REVOCATION_MODELS: OnceLock<ColumnModels> = OnceLock::new();

fn check_frame<E: Entry + Default>(frame: &[u8], models: Option<&ColumnModels>) {
    // A sentinel entry already in the output: a failed decode must leave it alone.
    let mut out = vec![E::default()];
    let result = decode_frame::<E>(frame, models, &mut out);
    let decoded = out.split_off(1);
    assert_eq!(out, [E::default()], "the entries before the frame were touched");
    if result.is_err() {
        assert!(decoded.is_empty(), "a failed decode appended {} entries", decoded.len());
        return;
    }
    assert!((1..=max_frame_entries::<E>()).contains(&decoded.len()), "{} entries", decoded.len());
    assert!(decoded.windows(2).all(|pair| pair[0] < pair[1]), "entries not strictly increasing");
    let (rewritten, meta) = common::build_table(&decoded, MAX_FRAME_RAW_BYTES, models.is_some());
    let meta = TableMeta::<E>::decode(&meta).expect("a meta we wrote decodes");
    let mut again = Vec::new();
    decode_frame::<E>(&rewritten, meta.models.as_ref(), &mut again).expect("a frame we wrote decodes");
    assert_eq!(again, decoded, "decode(encode(x)) != x");
}
