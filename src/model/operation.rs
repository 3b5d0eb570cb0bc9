//! What one event asks the index to do, whatever wire it came from (a Jetstream line or frame, a
//! firehose commit, a repository snapshot's records): create, update or delete a record, or change
//! an account's state. Strings are borrowed from the event where they can be.

use serde_json::Value;
use std::borrow::Cow;

/// What an event asks the index to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation<'a> {
    Create(RecordOp<'a>),
    Update(RecordOp<'a>),
    Delete(RecordRef<'a>),
    Account {
        did: Cow<'a, str>,
        active: bool,
        status: Option<Cow<'a, str>>,
    },
    /// The account's identity (handle, signing key, PDS) may have changed: nothing to index, but
    /// whatever resolved it should look again.
    Identity {
        did: Cow<'a, str>,
    },
    /// Valid, but nothing to index (sync events, unknown kinds).
    Skip,
}

impl Operation<'_> {
    /// Whether the index has anything to do for it.
    pub fn writes(&self) -> bool {
        !matches!(self, Operation::Identity { .. } | Operation::Skip)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordRef<'a> {
    pub did: Cow<'a, str>,
    pub collection: Cow<'a, str>,
    pub rkey: Cow<'a, str>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordOp<'a> {
    pub record_ref: RecordRef<'a>,
    pub record: Value,
}
