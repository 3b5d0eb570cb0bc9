//! Jetstream websocket frames: v1 `/subscribe` JSON events and v2 `subscribeEvents` proposal-0015
//! envelopes, plain or dict-zstd compressed, decoded into owned `StreamEvent`s.
//!
//! Invariants:
//! - Decoding never panics: a frame that is not valid zstd, not valid JSON or not a well-formed
//!   event is a `FrameError`, which the caller counts and skips (the tail continues).
//! - A compressed frame never decodes to more than `MAX_DECODED_BYTES` (the decompression-bomb
//!   guard; the websocket read limit bounds only the compressed bytes).
//! - Every event carries a resume cursor: v1 its `time_us`, v2 its `seq` (both positive).
//! - `#info`, `#identity`, `#sync` and unknown payload types never reach the index as writes.

use crate::base::dates::parse_rfc3339_us;
use crate::ingest::jetstream::{self, EventError};
use crate::model::operation::{Operation, RecordOp, RecordRef};
use crate::model::syntax::{validate_did, validate_nsid, validate_record_key};
use crate::model::tid::parse_tid;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// The dictionary of v1 `/subscribe?compress=true` frames.
pub const LEGACY_DICTIONARY: &[u8] = include_bytes!("../../data/zstd/legacy_subscribe.zdict");
/// The current v2 dictionary (servers also serve it from `getZstdDictionary`).
pub const V2_DICTIONARY: &[u8] = include_bytes!("../../data/zstd/subscribe_events_20260811.zdict");
/// Largest decoded frame; v2 frames embed whole records (upstream caps those at 1 MiB).
pub const MAX_DECODED_BYTES: usize = 32 << 20;
/// The v2 payload `$type` prefix.
const V2_PREFIX: &str = "network.bsky.jetstream.subscribeEvents#";
/// The payload types of the v2 message union.
const KNOWN_PAYLOADS: [&str; 5] = ["commit", "identity", "account", "sync", "info"];
/// A zstd dictionary starts with this magic number (little-endian), then its 4-byte id.
const DICTIONARY_MAGIC: u32 = 0xEC30_A437;

/// Which wire a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `/subscribe`: bare JSON events, `time_us` cursors.
    V1,
    /// `/xrpc/network.bsky.jetstream.subscribeEvents`: proposal-0015 envelopes, `seq` cursors.
    V2,
}

/// What an event is, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Create,
    Update,
    Delete,
    Account,
    Other,
}

impl EventKind {
    pub const ALL: [EventKind; 5] =
        [EventKind::Create, EventKind::Update, EventKind::Delete, EventKind::Account, EventKind::Other];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Create => "create",
            EventKind::Update => "update",
            EventKind::Delete => "delete",
            EventKind::Account => "account",
            EventKind::Other => "other",
        }
    }

    fn of(operation: &Operation<'_>) -> Self {
        match operation {
            Operation::Create(_) => EventKind::Create,
            Operation::Update(_) => EventKind::Update,
            Operation::Delete(_) => EventKind::Delete,
            Operation::Account { .. } => EventKind::Account,
            Operation::Identity { .. } | Operation::Skip => EventKind::Other,
        }
    }
}

/// One decoded stream event, owned so it can cross the queue to the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    /// The resume position on the instance that sent it (v1 `time_us`, v2 `seq`).
    pub cursor: i64,
    /// When the instance witnessed it, microseconds since the epoch (a cursor on any instance).
    pub time_us: i64,
    pub operation: Operation<'static>,
    /// The commit's repo revision (a TID), when it has a valid one.
    pub rev: Option<u64>,
}

impl StreamEvent {
    pub fn kind(&self) -> EventKind {
        EventKind::of(&self.operation)
    }
}

/// A structured XRPC error: a v2 error frame or a pre-upgrade HTTP error body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct XrpcError {
    pub error: String,
    #[serde(default)]
    pub message: String,
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Event(StreamEvent),
    /// A seq-less advisory (`OutdatedCursor`); logged, never applied.
    Info {
        name: String,
        message: String,
    },
    /// A terminal stream error (`ConsumerTooSlow`); the server closes next.
    Error(XrpcError),
    /// A payload `$type` this client does not know (added later): skipped for forward compatibility.
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("zstd: {0}")]
    Zstd(String),
    #[error("frame is not JSON: {0}")]
    Json(String),
    #[error(transparent)]
    Event(#[from] EventError),
    #[error("invalid time {0:?}")]
    Time(String),
    #[error("invalid frame: {0}")]
    Invalid(&'static str),
}

/// The id a zstd dictionary declares in its header (bytes 4..8, little-endian).
pub fn dictionary_id(dictionary: &[u8]) -> Result<u32, FrameError> {
    let header = dictionary.get(..8).ok_or(FrameError::Invalid("dictionary shorter than its header"))?;
    let word = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    if word(0) != DICTIONARY_MAGIC {
        return Err(FrameError::Invalid("not a zstd dictionary"));
    }
    Ok(word(4))
}

/// Decodes the frames of one connection; keeps its zstd context and output buffer between frames.
pub struct FrameDecoder {
    protocol: Protocol,
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    decoded: Vec<u8>,
}

impl FrameDecoder {
    /// A decoder for `protocol`; `dictionary` set when the connection asked for compression.
    pub fn new(protocol: Protocol, dictionary: Option<&[u8]>) -> Result<Self, FrameError> {
        let zstd = match dictionary {
            Some(dictionary) => Some(
                zstd::bulk::Decompressor::with_dictionary(dictionary).map_err(|e| FrameError::Zstd(e.to_string()))?,
            ),
            None => None,
        };
        Ok(FrameDecoder { protocol, zstd, decoded: Vec::new() })
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A text websocket message: the JSON frame itself.
    pub fn decode_text(&self, text: &[u8]) -> Result<Frame, FrameError> {
        decode_json(self.protocol, text)
    }

    /// A binary websocket message: one zstd frame whose content is the JSON frame.
    pub fn decode_binary(&mut self, compressed: &[u8]) -> Result<Frame, FrameError> {
        let zstd = self.zstd.as_mut().ok_or(FrameError::Invalid("binary frame on an uncompressed connection"))?;
        self.decoded.clear();
        // Reserve once; the pages are touched only as far as frames actually reach.
        self.decoded.reserve(MAX_DECODED_BYTES);
        let len =
            zstd.decompress_to_buffer(compressed, &mut self.decoded).map_err(|e| FrameError::Zstd(e.to_string()))?;
        assert_eq!(len, self.decoded.len(), "zstd reported a length it did not write");
        if len > MAX_DECODED_BYTES {
            return Err(FrameError::Zstd(format!("frame decodes to more than {MAX_DECODED_BYTES} bytes")));
        }
        decode_json(self.protocol, &self.decoded)
    }
}

/// Compresses one JSON frame with `dictionary`, as a server does (the test server; tests).
pub fn compress_frame(dictionary: &[u8], json: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut compressor =
        zstd::bulk::Compressor::with_dictionary(3, dictionary).map_err(|e| FrameError::Zstd(e.to_string()))?;
    compressor.compress(json).map_err(|e| FrameError::Zstd(e.to_string()))
}

/// A pre-upgrade HTTP error body, when it is an XRPC error envelope.
pub fn parse_xrpc_error(body: &[u8]) -> Option<XrpcError> {
    serde_json::from_slice::<XrpcError>(body).ok().filter(|e| !e.error.is_empty())
}

fn decode_json(protocol: Protocol, json: &[u8]) -> Result<Frame, FrameError> {
    match protocol {
        Protocol::V1 => {
            let event = jetstream::parse_event(json)?;
            positive(event.time_us)?;
            Ok(Frame::Event(StreamEvent {
                cursor: event.time_us,
                time_us: event.time_us,
                operation: owned_operation(event.operation),
                rev: event.rev,
            }))
        }
        Protocol::V2 => decode_v2(json),
    }
}

fn positive(cursor: i64) -> Result<i64, FrameError> {
    if cursor > 0 { Ok(cursor) } else { Err(FrameError::Invalid("cursor is not positive")) }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "$type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default, borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

fn decode_v2(json: &[u8]) -> Result<Frame, FrameError> {
    let envelope: Envelope = serde_json::from_slice(json).map_err(|e| FrameError::Json(e.to_string()))?;
    match envelope.kind.as_ref() {
        "message" => decode_message(envelope.payload.ok_or(FrameError::Invalid("message without payload"))?),
        "error" => Ok(Frame::Error(XrpcError {
            error: envelope.error.ok_or(FrameError::Invalid("error frame without error"))?.into_owned(),
            message: envelope.message.map(Cow::into_owned).unwrap_or_default(),
        })),
        _ => Err(FrameError::Invalid("unknown envelope $type")),
    }
}

fn decode_message(mut payload: Value) -> Result<Frame, FrameError> {
    let kind = payload.get("$type").and_then(Value::as_str).ok_or(FrameError::Invalid("payload without $type"))?;
    let Some(kind) = kind.strip_prefix(V2_PREFIX).filter(|k| KNOWN_PAYLOADS.contains(k)).map(str::to_string) else {
        return Ok(Frame::Unknown(kind.chars().take(128).collect()));
    };
    if kind == "info" {
        let field = |name: &str| payload.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
        return Ok(Frame::Info { name: field("name"), message: field("message") });
    }
    let seq = positive(payload.get("seq").and_then(Value::as_i64).ok_or(FrameError::Invalid("event without seq"))?)?;
    let time = payload.get("time").and_then(Value::as_str).ok_or(FrameError::Invalid("event without time"))?;
    let time_us = parse_time_us(time)?;
    let did = string_field(&payload, "did")?;
    let rev = payload.get("rev").and_then(Value::as_str).and_then(parse_tid);
    validate_did(&did).map_err(|e| EventError::Invalid { field: "did", reason: e.to_string() })?;
    let operation = match kind.as_str() {
        "commit" => commit_operation(did, &mut payload)?,
        "account" => account_operation(did, &payload)?,
        "identity" => Operation::Identity { did: did.into() },
        // sync: nothing to index (a #sync asks for a repo resync, which is backfill's job).
        _ => Operation::Skip,
    };
    Ok(Frame::Event(StreamEvent { cursor: seq, time_us, operation, rev }))
}

fn string_field(payload: &Value, name: &'static str) -> Result<String, FrameError> {
    match payload.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(EventError::Missing(name).into()),
    }
}

fn commit_operation(did: String, payload: &mut Value) -> Result<Operation<'static>, FrameError> {
    let collection = string_field(payload, "collection")?;
    let rkey = string_field(payload, "rkey")?;
    validate_nsid(&collection).map_err(|e| EventError::Invalid { field: "collection", reason: e.to_string() })?;
    validate_record_key(&rkey).map_err(|e| EventError::Invalid { field: "rkey", reason: e.to_string() })?;
    let record_ref = RecordRef { did: did.into(), collection: collection.into(), rkey: rkey.into() };
    let operation = string_field(payload, "operation")?;
    let record = payload.get_mut("record").map(Value::take);
    let with_record = |record: Option<Value>| match record {
        Some(record @ Value::Object(_)) => Ok(RecordOp { record_ref: record_ref.clone(), record }),
        Some(_) => Err(EventError::Invalid { field: "record", reason: "not an object".into() }),
        None => Err(EventError::Missing("create or update without record")),
    };
    Ok(match operation.as_str() {
        "create" => Operation::Create(with_record(record)?),
        "update" => Operation::Update(with_record(record)?),
        "delete" => Operation::Delete(record_ref),
        other => {
            let reason = format!("unknown operation {other:?}");
            return Err(EventError::Invalid { field: "operation", reason }.into());
        }
    })
}

fn account_operation(did: String, payload: &Value) -> Result<Operation<'static>, FrameError> {
    let account = payload.get("account").ok_or(EventError::Missing("account event without account"))?;
    let active = account.get("active").and_then(Value::as_bool).ok_or(EventError::Missing("account.active"))?;
    let status = account.get("status").and_then(Value::as_str).map(|s| Cow::Owned(s.to_string()));
    Ok(Operation::Account { did: did.into(), active, status })
}

/// Detaches an operation from the buffer it was parsed from.
pub fn owned_operation(operation: Operation<'_>) -> Operation<'static> {
    let owned_ref = |r: RecordRef<'_>| RecordRef {
        did: Cow::Owned(r.did.into_owned()),
        collection: Cow::Owned(r.collection.into_owned()),
        rkey: Cow::Owned(r.rkey.into_owned()),
    };
    match operation {
        Operation::Create(op) => {
            Operation::Create(RecordOp { record_ref: owned_ref(op.record_ref), record: op.record })
        }
        Operation::Update(op) => {
            Operation::Update(RecordOp { record_ref: owned_ref(op.record_ref), record: op.record })
        }
        Operation::Delete(r) => Operation::Delete(owned_ref(r)),
        Operation::Account { did, active, status } => Operation::Account {
            did: Cow::Owned(did.into_owned()),
            active,
            status: status.map(|s| Cow::Owned(s.into_owned())),
        },
        Operation::Identity { did } => Operation::Identity { did: Cow::Owned(did.into_owned()) },
        Operation::Skip => Operation::Skip,
    }
}

/// Parses an RFC 3339 UTC datetime into microseconds since the epoch (`base::dates`).
pub fn parse_time_us(text: &str) -> Result<i64, FrameError> {
    parse_rfc3339_us(text).ok_or_else(|| FrameError::Time(text.chars().take(64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: &str = include_str!("../../tests/data/jetstream/golden_v1.jsonl");

    fn v2_commit(seq: i64, operation: &str, record: Option<Value>) -> Vec<u8> {
        let mut payload = serde_json::json!({
            "$type": "network.bsky.jetstream.subscribeEvents#commit", "seq": seq, "did": "did:plc:eygmaihciaxprqvxpfvl6flk",
            "time": "2024-09-09T19:46:02.329308Z", "rev": "3l3qo2vutsw2b", "operation": operation,
            "collection": "app.bsky.feed.like", "rkey": "3l3qo2vuowo2b",
        });
        if let Some(record) = record {
            payload["record"] = record;
        }
        serde_json::to_vec(&serde_json::json!({"$type": "message", "payload": payload})).unwrap()
    }

    #[test]
    fn dictionary_ids_come_from_the_header() {
        assert_eq!(dictionary_id(V2_DICTIONARY).unwrap(), 20_260_811);
        assert_eq!(dictionary_id(LEGACY_DICTIONARY).unwrap(), 1_612_007_021);
        assert!(dictionary_id(b"short").is_err());
        assert!(dictionary_id(b"\0\0\0\0\x01\0\0\0").is_err());
    }

    #[test]
    fn v1_golden_events_decode_plain_and_compressed_alike() {
        let plain = FrameDecoder::new(Protocol::V1, None).unwrap();
        let mut compressed = FrameDecoder::new(Protocol::V1, Some(LEGACY_DICTIONARY)).unwrap();
        let mut creates = 0;
        for line in GOLDEN.lines() {
            let expected = jetstream::parse_event(line.as_bytes()).unwrap();
            let Frame::Event(event) = plain.decode_text(line.as_bytes()).unwrap() else { panic!("not an event") };
            assert_eq!(event.cursor, expected.time_us);
            assert_eq!(event.time_us, expected.time_us);
            assert_eq!(event.operation, expected.operation);
            let bytes = compress_frame(LEGACY_DICTIONARY, line.as_bytes()).unwrap();
            assert!(bytes.len() < line.len(), "the dictionary should shrink a real event");
            assert_eq!(compressed.decode_binary(&bytes).unwrap(), Frame::Event(event.clone()));
            creates += usize::from(event.kind() == EventKind::Create);
        }
        assert!(creates > 0);
    }

    #[test]
    fn v2_commit_account_info_and_error_frames() {
        let record = serde_json::json!({"$type": "app.bsky.feed.like", "subject": {"uri": "at://did:plc:b/app.bsky.feed.post/3l3pte3p2e325"}});
        let json = v2_commit(12_345, "create", Some(record.clone()));
        let mut decoder = FrameDecoder::new(Protocol::V2, Some(V2_DICTIONARY)).unwrap();
        let compressed = compress_frame(V2_DICTIONARY, &json).unwrap();
        let Frame::Event(event) = decoder.decode_binary(&compressed).unwrap() else { panic!("not an event") };
        assert_eq!(event.cursor, 12_345);
        assert_eq!(event.time_us, 1_725_911_162_329_308);
        let Operation::Create(op) = &event.operation else { panic!("not a create") };
        assert_eq!(
            (op.record_ref.collection.as_ref(), op.record_ref.rkey.as_ref()),
            ("app.bsky.feed.like", "3l3qo2vuowo2b")
        );
        assert_eq!(op.record, record);
        assert_eq!(decoder.decode_text(&json).unwrap(), Frame::Event(event));

        let delete = decoder.decode_text(&v2_commit(7, "delete", None)).unwrap();
        assert!(matches!(delete, Frame::Event(StreamEvent { cursor: 7, operation: Operation::Delete(_), .. })));

        let account = br#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#account","seq":9,"did":"did:plc:a","time":"2024-01-01T00:00:00.000001Z","account":{"active":false,"status":"deleted","did":"did:plc:a","seq":1,"time":"2024-01-01T00:00:00Z"}}}"#;
        let Frame::Event(event) = decoder.decode_text(account).unwrap() else { panic!() };
        assert_eq!(event.time_us, 1_704_067_200_000_001);
        assert_eq!(
            event.operation,
            Operation::Account { did: "did:plc:a".into(), active: false, status: Some("deleted".into()) }
        );

        let identity = br#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#identity","seq":10,"did":"did:plc:a","time":"2024-01-01T00:00:00Z","identity":{}}}"#;
        assert!(matches!(
            decoder.decode_text(identity).unwrap(),
            Frame::Event(StreamEvent { cursor: 10, operation: Operation::Identity { .. }, .. })
        ));

        let info = br#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#info","name":"OutdatedCursor","message":"resumed from 3"}}"#;
        assert_eq!(
            decoder.decode_text(info).unwrap(),
            Frame::Info { name: "OutdatedCursor".into(), message: "resumed from 3".into() }
        );
        let later = br#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#labels","x":1}}"#;
        assert_eq!(
            decoder.decode_text(later).unwrap(),
            Frame::Unknown("network.bsky.jetstream.subscribeEvents#labels".into())
        );
        let error = br#"{"$type":"error","error":"ConsumerTooSlow","message":"bye"}"#;
        assert_eq!(
            decoder.decode_text(error).unwrap(),
            Frame::Error(XrpcError { error: "ConsumerTooSlow".into(), message: "bye".into() })
        );
    }

    #[test]
    fn xrpc_error_bodies_are_recognised() {
        let body = br#"{"error":"CursorTooOld","message":"floor is 17"}"#;
        assert_eq!(
            parse_xrpc_error(body),
            Some(XrpcError { error: "CursorTooOld".into(), message: "floor is 17".into() })
        );
        assert_eq!(parse_xrpc_error(b"<html>bad gateway</html>"), None);
        assert_eq!(parse_xrpc_error(br#"{"error":""}"#), None);
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let mut v2 = FrameDecoder::new(Protocol::V2, Some(V2_DICTIONARY)).unwrap();
        let json = v2_commit(1, "create", Some(serde_json::json!({"a": 1})));
        let good = compress_frame(V2_DICTIONARY, &json).unwrap();
        let wrong_dictionary = compress_frame(LEGACY_DICTIONARY, &json).unwrap();
        let binary: Vec<&[u8]> =
            vec![b"", b"\x28\xb5\x2f\xfd", &good[..good.len() / 2], b"not zstd", &wrong_dictionary];
        for bytes in binary {
            assert!(v2.decode_binary(bytes).is_err(), "accepted {bytes:?}");
        }
        assert!(FrameDecoder::new(Protocol::V2, None).unwrap().decode_binary(&good).is_err(), "binary without zstd");
        let text: Vec<Vec<u8>> = vec![
            b"{".to_vec(),
            br#"{"$type":"bogus"}"#.to_vec(),
            br#"{"$type":"message"}"#.to_vec(),
            br#"{"$type":"message","payload":{"seq":1}}"#.to_vec(),
            v2_commit(0, "create", Some(serde_json::json!({}))),
            v2_commit(1, "create", None),
            v2_commit(1, "merge", None),
            v2_commit(1, "update", Some(serde_json::json!([1]))),
            String::from_utf8(v2_commit(1, "delete", None)).unwrap().replace("2024-09-09T", "2024-13-09T").into_bytes(),
        ];
        for bytes in &text {
            assert!(v2.decode_text(bytes).is_err(), "accepted {}", String::from_utf8_lossy(bytes));
        }
        // A zstd bomb: more than the cap once decoded.
        let bomb = compress_frame(V2_DICTIONARY, &vec![b' '; MAX_DECODED_BYTES + 1]).unwrap();
        assert!(matches!(v2.decode_binary(&bomb), Err(FrameError::Zstd(_))));
        // The decoder still works after errors.
        assert!(matches!(v2.decode_binary(&good), Ok(Frame::Event(_))));
    }

    #[test]
    fn times_round_trip_and_reject_garbage() {
        for (text, micros) in [
            ("1970-01-01T00:00:00.000000Z", 0),
            ("2024-09-09T19:46:02.329308Z", 1_725_911_162_329_308),
            ("2000-02-29T23:59:59.999999Z", 951_868_799_999_999),
        ] {
            assert_eq!(parse_time_us(text).unwrap(), micros);
            assert_eq!(crate::base::dates::format_rfc3339_us(micros), text);
        }
        assert_eq!(parse_time_us("2024-09-09T19:46:02Z").unwrap(), 1_725_911_162_000_000);
        assert_eq!(parse_time_us("2024-09-09T19:46:02.5+00:00").unwrap(), 1_725_911_162_500_000);
        for bad in [
            "",
            "2024-09-09",
            "2024-09-09T19:46:02.Z",
            "2024-09-09T19:46:02+01:00",
            "2024-00-09T19:46:02Z",
            "x024-09-09T19:46:02Z",
        ] {
            assert!(parse_time_us(bad).is_err(), "accepted {bad:?}");
        }
    }

    /// Found by the `jetstream_frame` fuzz target: a multi-byte char across byte 19 (the end of
    /// the seconds) made the seconds slice panic, so one v2 frame could stop live ingest.
    #[test]
    fn a_multibyte_char_in_a_time_is_an_error_not_a_panic() {
        let fuzzed = "2024-09-09T19:41:0\u{21e}";
        assert_eq!(fuzzed.len(), 20);
        assert_eq!(parse_time_us(fuzzed), Err(FrameError::Time(fuzzed.into())));
        assert!(parse_time_us("2024-09-09T19:41:0\u{21e}Z").is_err());
        assert!(parse_time_us("2024-09-09T19:41:\u{20ac}Z").is_err(), "a 3-byte char over bytes 17..20");
        let payload = serde_json::json!({
            "$type": "network.bsky.jetstream.subscribeEvents#identity", "seq": 5,
            "did": "did:plc:eygmaihciaxprqvxpfvl6flk", "time": fuzzed,
        });
        let frame = serde_json::to_vec(&serde_json::json!({"$type": "message", "payload": payload})).unwrap();
        let decoder = FrameDecoder::new(Protocol::V2, None).unwrap();
        assert!(matches!(decoder.decode_text(&frame), Err(FrameError::Time(_))));
    }
}
