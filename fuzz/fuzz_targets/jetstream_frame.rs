//! Jetstream frames: v1 `/subscribe` JSON and v2 `subscribeEvents` envelopes, plain (text
//! messages) and dict-zstd compressed (binary messages) with the real dictionaries in data/zstd/.
//!
//! The first byte picks the protocol (bit 0) and the path (bit 1); the rest is the frame.
//! - Text path: the bytes are a JSON frame. They are decoded as a text message, and also
//!   compressed with the protocol's dictionary and decoded as a binary message: both must give the
//!   same result (decode(compress(x)) == decode(x)).
//! - Binary path: the bytes are a compressed frame, fed to the zstd decoder as they are.
//! - Bit 2 set instead: the bytes are a v2 `time` (RFC 3339) for `parse_time_us` alone.
//!
//! Invariants checked on every decoded event (src/ingest/frames.rs states them): the cursor is
//! positive (v1: it is `time_us`); the DID, collection and record key re-validate; a create or
//! update carries an object; a v2 time formats and parses back to the same microsecond.
#![no_main]

use backlinks::base::dates::format_rfc3339_us;
use backlinks::ingest::frames::{
    Frame, FrameDecoder, FrameError, LEGACY_DICTIONARY, Protocol, StreamEvent, V2_DICTIONARY, parse_time_us,
};
use backlinks::model::operation::{Operation, RecordRef};
use backlinks::model::syntax::{validate_did, validate_nsid, validate_record_key};
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

thread_local! {
    /// One decoder per protocol, kept across runs as a connection keeps it across frames (each
    /// reserves its 32 MiB output buffer once).
    static DECODERS: RefCell<[FrameDecoder; 2]> = RefCell::new([decoder(Protocol::V1), decoder(Protocol::V2)]);
    /// One compressor per protocol, as a server keeps it (`compress_frame` would load the
    /// dictionary again on every run, which would dominate the run time).
    static COMPRESSORS: RefCell<[zstd::bulk::Compressor<'static>; 2]> =
        RefCell::new([compressor(Protocol::V1), compressor(Protocol::V2)]);
}

fn compressor(protocol: Protocol) -> zstd::bulk::Compressor<'static> {
    zstd::bulk::Compressor::with_dictionary(3, dictionary(protocol)).expect("the shipped dictionaries load")
}

fn decoder(protocol: Protocol) -> FrameDecoder {
    FrameDecoder::new(protocol, Some(dictionary(protocol))).expect("the shipped dictionaries load")
}

fn dictionary(protocol: Protocol) -> &'static [u8] {
    match protocol {
        Protocol::V1 => LEGACY_DICTIONARY,
        Protocol::V2 => V2_DICTIONARY,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else { return };
    if mode & 4 != 0 {
        return check_time(frame);
    }
    let protocol = if mode & 1 == 0 { Protocol::V1 } else { Protocol::V2 };
    DECODERS.with_borrow_mut(|decoders| {
        let decoder = &mut decoders[usize::from(mode & 1)];
        assert_eq!(decoder.protocol(), protocol);
        let decoded = if mode & 2 == 0 { decode_text_both_ways(decoder, frame) } else { decoder.decode_binary(frame) };
        if let Ok(Frame::Event(event)) = decoded {
            check_event(protocol, &event);
        }
    });
});

/// A v2 `time` on its own: whatever parses formats and parses back to the same microsecond.
fn check_time(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else { return };
    if let Ok(time_us) = parse_time_us(text) {
        assert_eq!(parse_time_us(&format_rfc3339_us(time_us)).ok(), Some(time_us), "time {text:?}");
    }
}

/// Decodes `json` as a text message, then compressed as a binary message; both must agree.
fn decode_text_both_ways(decoder: &mut FrameDecoder, json: &[u8]) -> Result<Frame, FrameError> {
    let plain = decoder.decode_text(json);
    let index = usize::from(decoder.protocol() == Protocol::V2);
    let compressed =
        COMPRESSORS.with_borrow_mut(|compressors| compressors[index].compress(json)).expect("compression never fails");
    let unpacked = decoder.decode_binary(&compressed);
    assert_eq!(plain, unpacked, "text and compressed decoding disagree");
    plain
}

fn check_event(protocol: Protocol, event: &StreamEvent) {
    assert!(event.cursor > 0, "cursor {}", event.cursor);
    if protocol == Protocol::V1 {
        assert_eq!(event.cursor, event.time_us, "a v1 cursor is its time_us");
    } else {
        let text = format_rfc3339_us(event.time_us);
        assert_eq!(parse_time_us(&text).ok(), Some(event.time_us), "time {} via {text:?}", event.time_us);
    }
    match &event.operation {
        Operation::Create(op) | Operation::Update(op) => {
            check_record_ref(&op.record_ref);
            assert!(op.record.is_object(), "record is not an object");
        }
        Operation::Delete(record_ref) => check_record_ref(record_ref),
        Operation::Account { did, .. } | Operation::Identity { did } => validate_did(did).expect("DID re-validates"),
        Operation::Skip => {}
    }
}

fn check_record_ref(record_ref: &RecordRef<'_>) {
    validate_did(&record_ref.did).expect("DID re-validates");
    validate_nsid(&record_ref.collection).expect("collection re-validates");
    validate_record_key(&record_ref.rkey).expect("rkey re-validates");
}
