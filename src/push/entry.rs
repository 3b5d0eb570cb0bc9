//! One entry of the change log: what one ingested event changed, as the push events it makes.
//!
//! An entry holds the events of one source event: a record's links removed then added (a create,
//! an update, a delete, or an account deletion reaching a recent record), or an account hidden or
//! shown. Its events take consecutive cursors from `first_cursor`, deletes first.
//!
//! Encoding (little-endian): `first_cursor i64, time_us i64, identity u64, kind u8`, then for
//! `KIND_LINKS`: `source str, rev u64 (0: none), account_before u64 (u64::MAX: none), deleted
//! count u32, (target str, location str)..., created count u32, (target str, location str)...,
//! kept count u32, (target str, location str)...`; for `KIND_HIDE`: `did str, status str`; for
//! `KIND_SHOW`: `did str`. A `str` is a u32 length and UTF-8 bytes.
//!
//! Invariants:
//! - An entry has at least one event, at most `MAX_ENTRY_EVENTS`, and encodes to at most
//!   `MAX_ENTRY_BYTES`; `decode` checks every length against the bytes it has and rejects
//!   trailing bytes, so `decode(encode(e)) == e` and nothing else decodes.

use crate::model::tid::format_tid;

/// Most events one entry holds (a record's links are capped far below this by extraction).
pub const MAX_ENTRY_EVENTS: usize = 1 << 16;
/// Largest encoded entry.
pub const MAX_ENTRY_BYTES: usize = 16 << 20;

const KIND_LINKS: u8 = 0;
const KIND_HIDE: u8 = 1;
const KIND_SHOW: u8 = 2;
/// `account_before` when there is none.
const NO_POSITION: u64 = u64::MAX;

/// A link of a record: what it points at and where in the record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Link {
    pub target: String,
    pub location: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A record's links removed, then added (`source` is its at:// URI); `kept` are links the
    /// record had before and still has (no events: `kept` and `created` are its links now).
    /// `account_before` is where the log held the previous entry of a record of the same account
    /// when this one was written (a packed log position), so an account's entries chain back.
    Links {
        source: String,
        rev: Option<u64>,
        account_before: Option<u64>,
        deleted: Vec<Link>,
        created: Vec<Link>,
        kept: Vec<Link>,
    },
    /// An account hidden: deactivated, suspended, taken down, or deleted (`status`).
    Hide { did: String, status: String },
    /// An account shown again.
    Show { did: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub first_cursor: i64,
    /// When the source event was witnessed upstream (its Jetstream `time_us`).
    pub time_us: i64,
    /// Names the source event, to recognise it when the stream replays it (see `feed`).
    pub identity: u64,
    pub change: Change,
}

/// The collection of an at:// record URI (a source).
pub fn collection_of_source(source: &str) -> &str {
    source.strip_prefix("at://").and_then(|rest| rest.split('/').nth(1)).unwrap_or("")
}

/// Whether a link appeared or went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOp {
    Create,
    Delete,
}

impl LinkOp {
    pub fn name(self) -> &'static str {
        match self {
            LinkOp::Create => "create",
            LinkOp::Delete => "delete",
        }
    }
}

/// One push event, borrowed from its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushEvent<'e> {
    Link { op: LinkOp, link: &'e Link, source: &'e str, rev: Option<u64>, time_us: i64, cursor: i64 },
    Hide { did: &'e str, status: &'e str, time_us: i64, cursor: i64 },
    Show { did: &'e str, time_us: i64, cursor: i64 },
}

impl PushEvent<'_> {
    pub fn cursor(&self) -> i64 {
        match self {
            PushEvent::Link { cursor, .. } | PushEvent::Hide { cursor, .. } | PushEvent::Show { cursor, .. } => *cursor,
        }
    }

    /// The event as subscribeBacklinks sends it.
    pub fn to_json(&self) -> String {
        #[derive(serde::Serialize)]
        struct LinkFrame<'e> {
            op: &'static str,
            target: &'e str,
            source: &'e str,
            location: &'e str,
            time_us: i64,
            cursor: i64,
        }
        #[derive(serde::Serialize)]
        struct AccountFrame<'e> {
            op: &'static str,
            did: &'e str,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<&'e str>,
            time_us: i64,
            cursor: i64,
        }
        let frame = match *self {
            PushEvent::Link { op, link, source, time_us, cursor, .. } => serde_json::to_string(&LinkFrame {
                op: op.name(),
                target: &link.target,
                source,
                location: &link.location,
                time_us,
                cursor,
            }),
            PushEvent::Hide { did, status, time_us, cursor } => {
                serde_json::to_string(&AccountFrame { op: "hide", did, status: Some(status), time_us, cursor })
            }
            PushEvent::Show { did, time_us, cursor } => {
                serde_json::to_string(&AccountFrame { op: "show", did, status: None, time_us, cursor })
            }
        };
        frame.expect("serializing plain fields cannot fail")
    }

    /// The event as spacedust's `/subscribe` sends it; `None` for what spacedust has no shape
    /// for (account events). `path` is the constellation path of the link's location.
    pub fn to_spacedust_json(&self, path: &str) -> Option<String> {
        let PushEvent::Link { op, link, source, rev, .. } = *self else { return None };
        let collection = collection_of_source(source);
        let value = serde_json::json!({
            "kind": "link",
            "origin": "live",
            "link": {
                "operation": op.name(),
                "source": format!("{collection}:{}", path.strip_prefix('.').unwrap_or(path)),
                "source_record": source,
                "source_rev": rev.map(format_tid).unwrap_or_default(),
                "subject": link.target,
            },
        });
        Some(value.to_string())
    }
}

impl Entry {
    /// How many events (and cursors) the entry holds.
    pub fn event_count(&self) -> usize {
        match &self.change {
            Change::Links { deleted, created, .. } => deleted.len() + created.len(),
            Change::Hide { .. } | Change::Show { .. } => 1,
        }
    }

    pub fn last_cursor(&self) -> i64 {
        self.first_cursor + self.event_count() as i64 - 1
    }

    /// The entry's events in cursor order.
    pub fn events(&self) -> impl Iterator<Item = PushEvent<'_>> {
        (0..self.event_count()).map(|index| self.event(index))
    }

    /// The entry's event at `index` (below `event_count`): its links deleted, then created, or
    /// its one account event.
    pub fn event(&self, index: usize) -> PushEvent<'_> {
        let (time_us, cursor) = (self.time_us, self.first_cursor + index as i64);
        match &self.change {
            Change::Links { source, rev, deleted, created, .. } => {
                let (op, link) = match deleted.get(index) {
                    Some(link) => (LinkOp::Delete, link),
                    None => (LinkOp::Create, &created[index - deleted.len()]),
                };
                PushEvent::Link { op, link, source, rev: *rev, time_us, cursor }
            }
            Change::Hide { did, status } => {
                assert_eq!(index, 0, "an account entry holds one event");
                PushEvent::Hide { did, status, time_us, cursor }
            }
            Change::Show { did } => {
                assert_eq!(index, 0, "an account entry holds one event");
                PushEvent::Show { did, time_us, cursor }
            }
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let count = self.event_count();
        assert!((1..=MAX_ENTRY_EVENTS).contains(&count), "an entry holds 1..={MAX_ENTRY_EVENTS} events, not {count}");
        let start = out.len();
        out.extend_from_slice(&self.first_cursor.to_le_bytes());
        out.extend_from_slice(&self.time_us.to_le_bytes());
        out.extend_from_slice(&self.identity.to_le_bytes());
        match &self.change {
            Change::Links { source, rev, account_before, deleted, created, kept } => {
                out.push(KIND_LINKS);
                put_str(out, source);
                out.extend_from_slice(&rev.unwrap_or(0).to_le_bytes());
                assert_ne!(*account_before, Some(NO_POSITION), "a position is below u64::MAX");
                out.extend_from_slice(&account_before.unwrap_or(NO_POSITION).to_le_bytes());
                put_links(out, deleted);
                put_links(out, created);
                put_links(out, kept);
            }
            Change::Hide { did, status } => {
                out.push(KIND_HIDE);
                put_str(out, did);
                put_str(out, status);
            }
            Change::Show { did } => {
                out.push(KIND_SHOW);
                put_str(out, did);
            }
        }
        assert!(out.len() - start <= MAX_ENTRY_BYTES, "an entry encodes to at most {MAX_ENTRY_BYTES} bytes");
        debug_assert_eq!(Entry::decode(&out[start..]).as_ref(), Ok(self));
    }

    pub fn decode(bytes: &[u8]) -> Result<Entry, String> {
        let mut reader = Reader { bytes };
        let first_cursor = reader.i64()?;
        let time_us = reader.i64()?;
        let identity = reader.u64()?;
        let change = match reader.u8()? {
            KIND_LINKS => {
                let source = reader.string()?;
                let rev = Some(reader.u64()?).filter(|rev| *rev != 0);
                let account_before = Some(reader.u64()?).filter(|at| *at != NO_POSITION);
                let (deleted, created, kept) = (reader.links()?, reader.links()?, reader.links()?);
                Change::Links { source, rev, account_before, deleted, created, kept }
            }
            KIND_HIDE => Change::Hide { did: reader.string()?, status: reader.string()? },
            KIND_SHOW => Change::Show { did: reader.string()? },
            kind => return Err(format!("unknown entry kind {kind}")),
        };
        if !reader.bytes.is_empty() {
            return Err(format!("{} bytes after the entry", reader.bytes.len()));
        }
        let entry = Entry { first_cursor, time_us, identity, change };
        let count = entry.event_count();
        if !(1..=MAX_ENTRY_EVENTS).contains(&count) {
            return Err(format!("an entry of {count} events"));
        }
        Ok(entry)
    }
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_links(out: &mut Vec<u8>, links: &[Link]) {
    out.extend_from_slice(&(links.len() as u32).to_le_bytes());
    for link in links {
        put_str(out, &link.target);
        put_str(out, &link.location);
    }
}

struct Reader<'b> {
    bytes: &'b [u8],
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], String> {
        if n > self.bytes.len() {
            return Err(format!("entry cut short: {n} bytes wanted, {} left", self.bytes.len()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("take gives N bytes"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a string that is not UTF-8".to_string())
    }

    fn links(&mut self) -> Result<Vec<Link>, String> {
        let count = self.u32()? as usize;
        if count > MAX_ENTRY_EVENTS {
            return Err(format!("{count} links in one entry"));
        }
        (0..count).map(|_| Ok(Link { target: self.string()?, location: self.string()? })).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn link_strategy() -> impl Strategy<Value = Link> {
        ("[a-z:/.]{0,40}", "\\$[a-z.\\[\\]]{0,20}").prop_map(|(target, location)| Link { target, location })
    }

    fn change_strategy() -> impl Strategy<Value = Change> {
        prop_oneof![
            (
                "at://[a-z:/.]{0,60}",
                proptest::option::of(1u64..),
                proptest::option::of(0..NO_POSITION),
                proptest::collection::vec(link_strategy(), 0..5),
                proptest::collection::vec(link_strategy(), 1..5),
                proptest::collection::vec(link_strategy(), 0..3)
            )
                .prop_map(|(source, rev, account_before, deleted, created, kept)| Change::Links {
                    source,
                    rev,
                    account_before,
                    deleted,
                    created,
                    kept
                }),
            ("did:[a-z]{1,20}", "[a-z]{0,12}").prop_map(|(did, status)| Change::Hide { did, status }),
            "did:[a-z]{1,20}".prop_map(|did| Change::Show { did }),
        ]
    }

    proptest! {
        #[test]
        fn entries_round_trip_and_every_cut_is_refused(
            first_cursor in 0i64..1 << 60,
            time_us in any::<i64>(),
            identity in any::<u64>(),
            change in change_strategy(),
        ) {
            let entry = Entry { first_cursor, time_us, identity, change };
            let mut bytes = vec![];
            entry.encode(&mut bytes);
            prop_assert_eq!(Entry::decode(&bytes), Ok(entry.clone()));
            for cut in 0..bytes.len() {
                prop_assert!(Entry::decode(&bytes[..cut]).is_err());
            }
            bytes.push(0);
            prop_assert!(Entry::decode(&bytes).is_err());
            let cursors: Vec<i64> = entry.events().map(|event| event.cursor()).collect();
            let expected: Vec<i64> = (entry.first_cursor..=entry.last_cursor()).collect();
            prop_assert_eq!(cursors, expected);
        }
    }

    #[test]
    fn deletes_come_before_creates_and_both_shapes_render() {
        let link = |target: &str| Link { target: target.into(), location: "$.subject".into() };
        let entry = Entry {
            first_cursor: 100,
            time_us: 90,
            identity: 7,
            change: Change::Links {
                source: "at://did:plc:a/app.bsky.feed.like/3k".into(),
                rev: Some(1),
                account_before: None,
                deleted: vec![link("at://did:plc:b/app.bsky.feed.post/1")],
                created: vec![link("at://did:plc:b/app.bsky.feed.post/2")],
                kept: vec![link("at://did:plc:b/app.bsky.feed.post/3")],
            },
        };
        let frames: Vec<serde_json::Value> =
            entry.events().map(|event| serde_json::from_str(&event.to_json()).unwrap()).collect();
        assert_eq!(frames.len(), 2, "kept links are no events");
        assert_eq!(frames[0]["op"], "delete");
        assert_eq!(frames[0]["cursor"], 100);
        assert_eq!(frames[1]["op"], "create");
        assert_eq!(frames[1]["target"], "at://did:plc:b/app.bsky.feed.post/2");
        assert_eq!(frames[1]["location"], "$.subject");
        let first = entry.events().next().unwrap();
        let spacedust: serde_json::Value =
            serde_json::from_str(&first.to_spacedust_json(".subject.uri").unwrap()).unwrap();
        assert_eq!(spacedust["link"]["source"], "app.bsky.feed.like:subject.uri");
        assert_eq!(spacedust["link"]["operation"], "delete");
        assert_eq!(spacedust["link"]["source_rev"], format_tid(1));
    }
}
