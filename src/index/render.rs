//! Ids and strings: record ids rendered back to `at://` URIs (a query's last step), and targets
//! looked up as ids without allocating any.
//!
//! Invariants:
//! - Rendering never allocates an id; a part with no outline string makes that URI `None`.

use super::{Index, IndexError};
use crate::model::ids::{OUTLINED_BIT, RecordId};
use crate::model::syntax::LinkTarget;
use crate::model::tid::{TID_ALPHABET, TID_LEN, parse_tid};
use crate::outline::OutlineKind;

impl Index {
    /// Renders record ids as `at://` URIs (`at://DID` for the repo form); `None` for an id some
    /// part of which has no outline string. One pass per outline kind, each under one lock of
    /// that kind's cache: a page renders up to a thousand of these.
    pub fn render_uris(&self, ids: &[RecordId]) -> Result<Vec<Option<String>>, IndexError> {
        // Each built in place (cloning a String would keep only its length's room).
        let mut uris: Vec<Option<String>> =
            ids.iter().map(|_| Some(String::with_capacity(URI_ROOM) + "at://")).collect();
        let all: Vec<usize> = (0..ids.len()).collect();
        self.append_outlined(OutlineKind::Did, ids, &all, |id| id.did, &mut uris, |uri, did| uri.push_str(did))?;
        let records: Vec<usize> = all.into_iter().filter(|&i| !ids[i].is_repo()).collect();
        let collection = |uri: &mut String, collection: &str| {
            for part in ["/", collection, "/"] {
                uri.push_str(part);
            }
        };
        self.append_outlined(OutlineKind::Collection, ids, &records, |id| id.collection, &mut uris, collection)?;
        let (tids, outlined): (Vec<usize>, Vec<usize>) =
            records.into_iter().partition(|&i| ids[i].rkey & OUTLINED_BIT == 0);
        for i in tids {
            if let Some(uri) = &mut uris[i] {
                push_tid(uri, ids[i].rkey);
            }
        }
        self.append_outlined(
            OutlineKind::Rkey,
            ids,
            &outlined,
            |id| id.rkey,
            &mut uris,
            |uri, rkey| uri.push_str(rkey),
        )?;
        Ok(uris)
    }

    /// Appends the `kind` string of `part(ids[i])` to `uris[i]` for each `i` of `members`; a
    /// missing string makes that URI `None`.
    fn append_outlined(
        &self,
        kind: OutlineKind,
        ids: &[RecordId],
        members: &[usize],
        part: impl Fn(&RecordId) -> u64,
        uris: &mut [Option<String>],
        append: impl Fn(&mut String, &str),
    ) -> Result<(), IndexError> {
        // URIs already missing a part need no more lookups.
        let members: Vec<usize> = members.iter().copied().filter(|&i| uris[i].is_some()).collect();
        let parts: Vec<u64> = members.iter().map(|&i| part(&ids[i])).collect();
        self.outlines.resolve_each(kind, &parts, |j, value| {
            let uri = &mut uris[members[j]];
            match (uri.as_mut(), value) {
                (Some(text), Some(value)) => append(text, value),
                _ => *uri = None,
            }
        })?;
        Ok(())
    }

    /// Looks up a target without allocating ids: `None` when some part was never seen (a URL's id
    /// is its hash, so it is always known).
    pub fn lookup_target(&self, target: &LinkTarget<'_>) -> Result<Option<RecordId>, IndexError> {
        let did_of = |did: &str| self.outlines.lookup(OutlineKind::Did, did);
        match target {
            LinkTarget::Did(did) => Ok(did_of(did)?.map(RecordId::repo)),
            LinkTarget::Url(url) => Ok(Some(RecordId::url(url))),
            LinkTarget::Record { did, collection, rkey } => {
                let rkey = match parse_tid(rkey) {
                    Some(tid) => Some(tid),
                    None => self.outlines.lookup(OutlineKind::Rkey, rkey)?,
                };
                let collection = self.outlines.lookup(OutlineKind::Collection, collection)?;
                Ok(match (rkey, collection, did_of(did)?) {
                    (Some(rkey), Some(collection), Some(did)) => Some(RecordId { rkey, collection, did }),
                    _ => None,
                })
            }
        }
    }
}

/// Room for most URIs without regrowth: `at://`, a did:plc, an NSID and a TID.
const URI_ROOM: usize = 96;

/// Appends the TID spelling of `value` (top bit clear): the digits `format_tid` writes, without
/// the `String` it allocates and fills a `char` at a time (rendering a page spells up to 1,000).
fn push_tid(out: &mut String, value: u64) {
    let start = out.len();
    let alphabet = TID_ALPHABET;
    out.extend((0..TID_LEN).rev().map(|i| char::from(alphabet[((value >> (5 * i)) & 31) as usize])));
    debug_assert_eq!(parse_tid(&out[start..]), Some(value), "TID spelling round trip");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{IndexOptions, open_in_dir};

    #[test]
    fn uris_render_each_form_and_none_for_an_unknown_part() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        let intern = |kind, value| index.outlines.intern(kind, value, 0).unwrap();
        let (did, other) = (intern(OutlineKind::Did, "did:plc:abc"), intern(OutlineKind::Did, "did:web:x.test"));
        let collection = intern(OutlineKind::Collection, "app.bsky.feed.like");
        let tid = parse_tid("3jzfcijpj2z2a").unwrap();
        let outlined = intern(OutlineKind::Rkey, "self");
        let unknown = (did + 1000, intern(OutlineKind::Collection, "app.bsky.feed.post") + 1000);
        let ids = [
            RecordId::repo(did),
            RecordId { did, collection, rkey: tid },
            RecordId { did: other, collection, rkey: outlined },
            RecordId { did: unknown.0, collection, rkey: tid },
            RecordId { did, collection: unknown.1, rkey: tid },
            RecordId { did: other, collection, rkey: outlined + 1000 },
        ];
        let uris = index.render_uris(&ids).unwrap();
        let expected = [
            Some("at://did:plc:abc"),
            Some("at://did:plc:abc/app.bsky.feed.like/3jzfcijpj2z2a"),
            Some("at://did:web:x.test/app.bsky.feed.like/self"),
            None,
            None,
            None,
        ];
        assert_eq!(uris, expected.map(|uri| uri.map(String::from)));
    }

    #[test]
    fn pushed_tids_are_spelled_as_format_tid_spells_them() {
        for value in [0, 1, 31, 32, 0x194a_947d_4aac_b00c, (1 << 63) - 1] {
            let mut uri = String::from("at://x/");
            push_tid(&mut uri, value);
            assert_eq!(uri, format!("at://x/{}", crate::model::tid::format_tid(value)));
        }
    }
}
