//! Manifests: the published view of the index, `manifests/<generation>-<digest>` in the bucket.
//!
//! Invariants:
//! - A manifest names only objects that were uploaded before it was written.
//! - Its name carries its generation (16 hex digits, so names sort by generation) and the xxh3-128
//!   of its body (32 hex digits); a reader recomputes the digest and rejects a mismatch.
//! - Everything read from a manifest is validated before use: table ids are exactly 24 lowercase
//!   hex digits, trees are known, counts and sizes are bounded. A hostile manifest is an error,
//!   never a path outside `tables/`.
//! - Account states are not in a manifest (format 2): it names an account log whose objects
//!   hold them (`account_log`). Format 1 listed the hidden accounts; it is still read.
//! - A writer never holds a manifest's JSON: it is serialized twice, once to count it and once
//!   into the zstd frame that states its length. Readers decode a manifest whole.

use crate::account_log::AccountLog;
use crate::catalog::IngestPosition;
use crate::lsm::record::{RunKind, TableRecord};
use crate::model::account::AccountState;
use crate::model::ids::TreeKind;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_128;

pub const MANIFEST_FORMAT: u32 = 2;
/// The format that listed hidden accounts in the manifest itself, still read.
const LISTED_ACCOUNTS_FORMAT: u32 = 1;
/// Upper bounds on what a manifest may claim (far above any real index).
const MAX_TABLES: usize = 1_000_000;
const MAX_OBJECT_BYTES: u64 = 1 << 40;
const MAX_MANIFEST_BYTES: usize = 256 << 20;
/// The JSON repeats its field names for every table, which zstd folds away
/// (about sixteenfold on the 10 M-link benchmark's manifest, BENCHMARKS.md).
const MANIFEST_ZSTD_LEVEL: i32 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestTable {
    pub tree: String,
    pub id: String,
    pub run_id: String,
    pub compacted: bool,
    pub shard: u32,
    pub shard_count: u32,
    pub entries: u64,
    pub data_len: u64,
    pub meta_len: u64,
    pub min_stamp: u64,
    pub max_stamp: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub generation: u64,
    pub cursor: Option<i64>,
    pub clock: u64,
    pub tables: Vec<ManifestTable>,
    /// Format 1 only: the hidden accounts, (did id, status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_accounts: Vec<(u64, String)>,
    /// Format 2: where the account states are, so a restored machine hides the same accounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<AccountLog>,
    /// Every published outline range, oldest first: together they hold every outlined string
    /// the tables can name.
    #[serde(default)]
    pub outlines: Vec<OutlineRange>,
}

/// Outline rows of one kind with insertion sequence in `(after, through]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutlineRange {
    pub kind: String,
    pub after: i64,
    pub through: i64,
}

impl OutlineRange {
    /// `outlines/<kind>/<after>-<through>`, both as 16 hex digits.
    pub fn key(&self) -> String {
        format!("outlines/{}/{:016x}-{:016x}", self.kind, self.after, self.through)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest {name}: {reason}")]
    Invalid { name: String, reason: String },
}

/// The name and body of `manifest`: its JSON serialized twice, once to learn its length and
/// once into the zstd frame that states it, so that the JSON is never whole in memory (the
/// compressed body is).
fn encode_json(generation: u64, manifest: &Manifest) -> (String, Vec<u8>) {
    let mut counted = CountingSink(0);
    serde_json::to_writer(&mut counted, manifest).expect("a manifest always serializes");
    let json_len = counted.0;
    assert!(json_len <= MAX_MANIFEST_BYTES as u64, "manifest larger than the decode limit");
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), MANIFEST_ZSTD_LEVEL).expect("a zstd context");
    encoder.include_contentsize(true).expect("zstd takes the parameter");
    encoder.set_pledged_src_size(Some(json_len)).expect("zstd takes the pledge before any data");
    let mut writer = std::io::BufWriter::with_capacity(64 << 10, encoder);
    serde_json::to_writer(&mut writer, manifest).expect("a manifest always serializes");
    let encoder = writer.into_inner().map_err(|e| e.into_error()).expect("writing into memory succeeds");
    let body = encoder.finish().expect("compressing into memory succeeds");
    assert!(
        body.starts_with(&crate::store::ZSTD_MAGIC) && body.len() <= MAX_MANIFEST_BYTES,
        "manifest over the decode limit"
    );
    (format!("{generation:016x}-{:032x}", xxh3_128(&body)), body)
}

/// A writer that only counts the bytes written to it.
struct CountingSink(u64);

impl std::io::Write for CountingSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Manifest {
    pub fn new(
        generation: u64,
        position: IngestPosition,
        tables: Vec<TableRecord>,
        outlines: Vec<OutlineRange>,
        accounts: AccountLog,
    ) -> Self {
        let tables = tables
            .into_iter()
            .map(|t| ManifestTable {
                compacted: t.run_kind == RunKind::Compacted,
                tree: t.tree.name().to_string(),
                id: t.id,
                run_id: t.run_id,
                shard: t.shard,
                shard_count: t.shard_count,
                entries: t.entries,
                data_len: t.data_len,
                meta_len: t.meta_len,
                min_stamp: t.min_stamp,
                max_stamp: t.max_stamp,
            })
            .collect();
        Manifest {
            format: MANIFEST_FORMAT,
            generation,
            cursor: position.cursor,
            clock: position.clock,
            tables,
            hidden_accounts: Vec::new(),
            accounts: Some(accounts),
            outlines,
        }
    }

    /// The object name (`<generation>-<digest>`) and body (the JSON in one zstd frame that
    /// records its size).
    pub fn encode(&self) -> (String, Vec<u8>) {
        encode_json(self.generation, self)
    }

    /// Parses and validates a manifest fetched under `name`.
    pub fn decode(name: &str, body: &[u8]) -> Result<Self, ManifestError> {
        let invalid = |reason: String| ManifestError::Invalid { name: name.to_string(), reason };
        let (generation, digest) = parse_name(name).ok_or_else(|| invalid("malformed name".into()))?;
        if body.len() > MAX_MANIFEST_BYTES {
            return Err(invalid(format!("{} bytes is over the limit", body.len())));
        }
        if xxh3_128(body) != digest {
            return Err(invalid("digest does not match the body".into()));
        }
        let json = if body.starts_with(&crate::store::ZSTD_MAGIC) {
            crate::store::inflate(body, MAX_MANIFEST_BYTES).map_err(invalid)?
        } else {
            body.to_vec()
        };
        let manifest: Manifest = serde_json::from_slice(&json).map_err(|e| invalid(e.to_string()))?;
        if !(LISTED_ACCOUNTS_FORMAT..=MANIFEST_FORMAT).contains(&manifest.format) || manifest.generation != generation {
            return Err(invalid("format or generation does not match".into()));
        }
        manifest.validate().map_err(invalid)?;
        Ok(manifest)
    }

    fn validate(&self) -> Result<(), String> {
        if self.tables.len() > MAX_TABLES {
            return Err(format!("{} tables is over the limit", self.tables.len()));
        }
        for table in &self.tables {
            if TreeKind::from_name(&table.tree).is_none() {
                return Err(format!("unknown tree {:?}", table.tree));
            }
            if !is_table_id(&table.id) || !is_table_id(&table.run_id) {
                return Err(format!("invalid table id {:?}", table.id));
            }
            if table.data_len > MAX_OBJECT_BYTES || table.meta_len > MAX_OBJECT_BYTES {
                return Err(format!("table {} claims an impossible size", table.id));
            }
            if table.shard_count == 0 || table.shard >= table.shard_count {
                return Err(format!("table {} has shard {} of {}", table.id, table.shard, table.shard_count));
            }
        }
        match (self.format, &self.accounts) {
            (LISTED_ACCOUNTS_FORMAT, None) => {}
            (MANIFEST_FORMAT, Some(log)) if self.hidden_accounts.is_empty() => log.validate()?,
            _ => return Err(format!("format {} with the account states of another", self.format)),
        }
        if let Some((_, status)) = self.hidden_accounts.iter().find(|(_, s)| !AccountState::parse(s).is_hidden()) {
            return Err(format!("hidden account with status {status:?}"));
        }
        if self.outlines.len() > MAX_TABLES {
            return Err(format!("{} outline ranges is over the limit", self.outlines.len()));
        }
        for range in &self.outlines {
            if crate::outline::OutlineKind::from_name(&range.kind).is_none()
                || range.after < 0
                || range.after >= range.through
            {
                return Err(format!("invalid outline range {range:?}"));
            }
        }
        Ok(())
    }
}

/// Table ids are 24 lowercase hex digits: a 64-bit sequence number and 32 random bits.
pub fn is_table_id(id: &str) -> bool {
    id.len() == 24 && is_lower_hex(id)
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Accepts only the spelling `encode` writes: `from_str_radix` alone also takes upper case and a
/// leading `+`, which would give one manifest several names, not all sorting by generation.
fn parse_name(name: &str) -> Option<(u64, u128)> {
    let (generation, digest) = name.split_once('-')?;
    if generation.len() != 16 || digest.len() != 32 || !is_lower_hex(generation) || !is_lower_hex(digest) {
        return None;
    }
    Some((u64::from_str_radix(generation, 16).ok()?, u128::from_str_radix(digest, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account_log::AccountObject;

    fn table(id: &str) -> TableRecord {
        TableRecord {
            id: id.into(),
            tree: TreeKind::Links,
            run_id: id.into(),
            run_kind: RunKind::Delta,
            shard: 0,
            shard_count: 1,
            entries: 10,
            data_len: 100,
            meta_len: 50,
            uploaded: true,
            min_stamp: 1,
            max_stamp: 9,
        }
    }

    fn sample() -> Manifest {
        Manifest::new(
            7,
            IngestPosition { cursor: Some(42), clock: 9 },
            vec![table("0000000000000001abcdef01")],
            vec![OutlineRange { kind: "did".into(), after: 0, through: 4 }],
            AccountLog {
                snapshot: AccountObject { after: 0, through: 3, count: 10 },
                changes: vec![AccountObject { after: 3, through: 5, count: 2 }],
            },
        )
    }

    /// A manifest of the format that listed its hidden accounts still decodes as written.
    #[test]
    fn a_manifest_that_lists_its_hidden_accounts_still_decodes() {
        let mut listed = sample();
        (listed.format, listed.accounts) = (LISTED_ACCOUNTS_FORMAT, None);
        listed.hidden_accounts = vec![(5, "suspended".into()), (1 << 63, "takendown".into())];
        let (name, body) = listed.encode();
        assert_eq!(Manifest::decode(&name, &body).unwrap(), listed);
        let mut mixed = sample();
        mixed.hidden_accounts = listed.hidden_accounts.clone();
        let (name, body) = mixed.encode();
        assert!(Manifest::decode(&name, &body).unwrap_err().to_string().contains("account states of another"));
        listed.hidden_accounts[0].1 = "active".into();
        let (name, body) = listed.encode();
        assert!(Manifest::decode(&name, &body).unwrap_err().to_string().contains("hidden account with status"));
    }

    #[test]
    fn round_trips_and_names_itself() {
        let manifest = sample();
        let (name, body) = manifest.encode();
        assert!(name.starts_with("0000000000000007-"));
        assert_eq!(Manifest::decode(&name, &body).unwrap(), manifest);
    }

    fn name_of(generation: u64, body: &[u8]) -> String {
        format!("{generation:016x}-{:032x}", xxh3_128(body))
    }

    /// New bodies are compressed; the bare pretty JSON that manifests were before still decodes.
    #[test]
    fn compressed_and_bare_json_bodies_both_decode() {
        let manifest = sample();
        let (_, body) = manifest.encode();
        let json = serde_json::to_vec(&manifest).unwrap();
        assert_eq!(&body[..4], crate::store::ZSTD_MAGIC);
        assert_eq!(zstd::bulk::decompress(&body, json.len()).unwrap(), json);
        let bare = serde_json::to_vec_pretty(&manifest).unwrap();
        assert_eq!(Manifest::decode(&name_of(7, &bare), &bare).unwrap(), manifest);
    }

    #[test]
    fn compressed_bodies_must_state_a_bounded_size() {
        let error = |body: &[u8]| Manifest::decode(&name_of(7, body), body).unwrap_err().to_string();
        // A frame header (single segment, 8-byte content size) claiming 2^40 bytes, no blocks.
        let mut huge = crate::store::ZSTD_MAGIC.to_vec();
        huge.push(0xE0);
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(error(&huge).contains("over the limit"), "{}", error(&huge));
        let json = serde_json::to_vec(&sample()).unwrap();
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        encoder.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut encoder, &json).unwrap();
        let unsized_frame = encoder.finish().unwrap();
        assert!(error(&unsized_frame).contains("does not state its size"), "{}", error(&unsized_frame));
        let mut truncated = zstd::bulk::compress(&json, 3).unwrap();
        truncated.truncate(truncated.len() - 3);
        assert!(error(&truncated).contains("zstd"), "{}", error(&truncated));
        let mut garbage = crate::store::ZSTD_MAGIC.to_vec();
        garbage.extend_from_slice(b"not a frame header");
        assert!(error(&garbage).contains("not a zstd frame"), "{}", error(&garbage));
    }

    /// Found by running the `manifest` fuzz target on a name with an upper-case digest: the
    /// manifest decoded under a name that is not its own.
    #[test]
    fn only_the_canonical_name_is_accepted() {
        let (name, body) = sample().encode();
        assert!(Manifest::decode(&name, &body).is_ok());
        let (generation, digest) = name.split_once('-').unwrap();
        let upper_case = format!("{generation}-{}", digest.to_ascii_uppercase());
        let signed = format!("+{}-{digest}", &generation[1..]);
        for alias in [upper_case, signed] {
            assert_ne!(alias, name);
            let err = Manifest::decode(&alias, &body).unwrap_err().to_string();
            assert!(err.contains("malformed name"), "{alias}: {err}");
        }
    }

    #[test]
    fn rejects_tampered_and_hostile_manifests() {
        let (name, mut body) = sample().encode();
        body[10] ^= 1;
        assert!(Manifest::decode(&name, &body).is_err(), "digest mismatch accepted");

        for hostile_id in ["../../etc/passwd", "0000000000000001ABCDEF01", "1", ""] {
            let mut manifest = sample();
            manifest.tables[0].id = hostile_id.into();
            let (name, body) = manifest.encode();
            let err = Manifest::decode(&name, &body).unwrap_err().to_string();
            assert!(err.contains("invalid table id"), "{hostile_id}: {err}");
        }
        let mut manifest = sample();
        manifest.tables[0].data_len = u64::MAX;
        let (name, body) = manifest.encode();
        assert!(Manifest::decode(&name, &body).is_err());
        assert!(Manifest::decode("nonsense", b"{}").is_err());
        let mut manifest = sample();
        manifest.accounts.as_mut().unwrap().changes[0].after = 2;
        let (name, body) = manifest.encode();
        assert!(Manifest::decode(&name, &body).unwrap_err().to_string().contains("does not follow"));
        for (kind, after, through) in [("../x", 0, 1), ("did", 5, 5), ("did", -1, 3)] {
            let mut manifest = sample();
            manifest.outlines[0] = OutlineRange { kind: kind.into(), after, through };
            let (name, body) = manifest.encode();
            assert!(Manifest::decode(&name, &body).is_err(), "accepted outline range {kind} {after} {through}");
        }
    }
}
