//! Jetstream v1 JSON events (`/subscribe` framing; also the lines of `backlinks import FILE`).
//!
//! Invariants:
//! - Parsing never panics: any line that is not a well-formed event with valid atproto syntax
//!   is an `EventError`, which the caller counts and skips.
//! - An event becomes at most one `Operation`; identity events and unknown kinds become `Skip`.

use crate::model::operation::{Operation, RecordOp, RecordRef};
use crate::model::syntax::{validate_did, validate_nsid, validate_record_key};
use crate::model::tid::parse_tid;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// One parsed event: its cursor (`time_us`), operation, and for commits the repo revision (a TID;
/// `None` when absent or malformed), which orders it against a backfilled snapshot of the repo.
#[derive(Debug, Clone, PartialEq)]
pub struct Event<'a> {
    pub time_us: i64,
    pub operation: Operation<'a>,
    pub rev: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("not a JSON event: {0}")]
    Json(String),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("{0}")]
    Missing(&'static str),
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    did: Cow<'a, str>,
    time_us: i64,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    commit: Option<RawCommit<'a>>,
    #[serde(borrow, default)]
    account: Option<RawAccount<'a>>,
}

#[derive(Deserialize)]
struct RawCommit<'a> {
    #[serde(borrow)]
    operation: Cow<'a, str>,
    #[serde(borrow)]
    collection: Cow<'a, str>,
    #[serde(borrow)]
    rkey: Cow<'a, str>,
    #[serde(borrow, default)]
    rev: Option<Cow<'a, str>>,
    #[serde(default)]
    record: Option<Value>,
}

#[derive(Deserialize)]
struct RawAccount<'a> {
    active: bool,
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
}

/// Parses one Jetstream v1 JSON event.
pub fn parse_event(line: &[u8]) -> Result<Event<'_>, EventError> {
    let raw: RawEvent = serde_json::from_slice(line).map_err(|e| EventError::Json(e.to_string()))?;
    validate_did(&raw.did).map_err(|e| EventError::Invalid { field: "did", reason: e.to_string() })?;
    let rev = raw.commit.as_ref().and_then(|c| c.rev.as_deref()).and_then(parse_tid);
    let operation = match raw.kind.as_ref() {
        "commit" => commit_operation(raw.did, raw.commit.ok_or(EventError::Missing("commit event without commit"))?)?,
        "account" => {
            let account = raw.account.ok_or(EventError::Missing("account event without account"))?;
            Operation::Account { did: raw.did, active: account.active, status: account.status }
        }
        "identity" => Operation::Identity { did: raw.did },
        _ => Operation::Skip,
    };
    Ok(Event { time_us: raw.time_us, operation, rev })
}

fn commit_operation<'a>(did: Cow<'a, str>, commit: RawCommit<'a>) -> Result<Operation<'a>, EventError> {
    validate_nsid(&commit.collection)
        .map_err(|e| EventError::Invalid { field: "collection", reason: e.to_string() })?;
    validate_record_key(&commit.rkey).map_err(|e| EventError::Invalid { field: "rkey", reason: e.to_string() })?;
    let record_ref = RecordRef { did, collection: commit.collection, rkey: commit.rkey };
    let with_record = |record: Option<Value>| match record {
        Some(record @ Value::Object(_)) => Ok(RecordOp { record_ref: record_ref.clone(), record }),
        Some(_) => Err(EventError::Invalid { field: "record", reason: "not an object".into() }),
        None => Err(EventError::Missing("create or update without record")),
    };
    match commit.operation.as_ref() {
        "create" => Ok(Operation::Create(with_record(commit.record)?)),
        "update" => Ok(Operation::Update(with_record(commit.record)?)),
        "delete" => Ok(Operation::Delete(record_ref)),
        other => Err(EventError::Invalid { field: "operation", reason: format!("unknown operation {other:?}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_create_delete_and_account() {
        let create = br#"{"did":"did:plc:a","time_us":5,"kind":"commit","commit":{"rev":"x","operation":"create","collection":"app.bsky.feed.like","rkey":"3mmoojp7etg2g","record":{"subject":"did:plc:b"}}}"#;
        let event = parse_event(create).unwrap();
        assert_eq!(event.time_us, 5);
        assert_eq!(event.rev, None, "\"x\" is not a TID");
        let with_rev = String::from_utf8_lossy(create).replace("\"rev\":\"x\"", "\"rev\":\"3l3qo2vutsw2b\"");
        assert_eq!(parse_event(with_rev.as_bytes()).unwrap().rev, parse_tid("3l3qo2vutsw2b"));
        let Operation::Create(op) = event.operation else { panic!("not a create") };
        assert_eq!(op.record_ref.collection, "app.bsky.feed.like");
        assert_eq!(op.record["subject"], "did:plc:b");

        let delete = br#"{"did":"did:plc:a","time_us":6,"kind":"commit","commit":{"operation":"delete","collection":"app.bsky.feed.like","rkey":"3mmoojp7etg2g"}}"#;
        assert!(matches!(parse_event(delete).unwrap().operation, Operation::Delete(_)));

        let account = br#"{"did":"did:plc:a","time_us":7,"kind":"account","account":{"active":false,"did":"did:plc:a","status":"deleted"}}"#;
        let Operation::Account { active, status, .. } = parse_event(account).unwrap().operation else { panic!() };
        assert!(!active);
        assert_eq!(status.as_deref(), Some("deleted"));

        let identity = br#"{"did":"did:plc:a","time_us":8,"kind":"identity","identity":{}}"#;
        assert_eq!(parse_event(identity).unwrap().operation, Operation::Identity { did: "did:plc:a".into() });
    }

    #[test]
    fn rejects_malformed_events_with_reasons() {
        let cases: &[&[u8]] = &[
            b"",
            b"{\"did\":",
            b"\xff\xfe",
            br#"{"did":"not a did","time_us":1,"kind":"identity"}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit"}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"operation":"create","collection":"bad","rkey":"x","record":{}}}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"operation":"create","collection":"a.b.c","rkey":"..","record":{}}}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"operation":"create","collection":"a.b.c","rkey":"x"}}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"operation":"create","collection":"a.b.c","rkey":"x","record":[1]}}"#,
            br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"operation":"merge","collection":"a.b.c","rkey":"x"}}"#,
        ];
        for case in cases {
            assert!(parse_event(case).is_err(), "accepted {:?}", String::from_utf8_lossy(case));
        }
    }
}
