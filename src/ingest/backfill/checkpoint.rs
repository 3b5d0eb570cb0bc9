//! repos.db checkpoints in the bucket: `checkpoints/<generation>/<id>/repos.db.zst`, a consistent
//! copy (`VACUUM INTO`) compressed with zstd (content checksum on), taken right after a manifest
//! of `generation` is published. A machine restored from the bucket takes the newest checkpoint
//! not newer than the manifest it restored, so backfill resumes instead of starting over.
//!
//! Invariants:
//! - A checkpoint is only ever written under the generation of a manifest already published, and
//!   restore never picks one from a later generation than the manifest it restored.
//! - Its repository marks may run ahead of that manifest's clock: `ReposDb::reset_undurable`
//!   sends those back to pending when backfill starts.
//! - A checkpoint that fails its zstd checksum or is not an SQLite file is refused, never
//!   installed; the next older one is tried.
//! - Restoring never holds a checkpoint in memory: an object larger than
//!   `MAX_DECOMPRESSED_BYTES` (as listed) or whose frame declares a larger content is refused
//!   before anything is read or decompressed; the rest is fetched `RESTORE_RANGE_BYTES` at a time
//!   and decompressed straight into a file beside its destination, stopped past the limit.
//! - At most `KEEP` checkpoints are kept; older ones are deleted after each new one.

use crate::ingest::backfill::repos::{ReposDb, ReposError};
use crate::store::object::{ObjectInfo, Store, StoreError};
use std::path::Path;

/// Checkpoints kept in the bucket.
pub const KEEP: usize = 3;
/// Largest repos.db accepted from a checkpoint (decompressed): 64 GiB, a whole network's worth.
pub const MAX_DECOMPRESSED_BYTES: u64 = 64 << 30;
/// Bytes of a checkpoint fetched (and held) at once while restoring.
pub const RESTORE_RANGE_BYTES: u64 = 8 << 20;
const PREFIX: &str = "checkpoints/";
const FILE: &str = "repos.db.zst";
const SQLITE_MAGIC: &[u8] = b"SQLite format 3\0";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Repos(#[from] ReposError),
    #[error("checkpoint {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("checkpoint: {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// The object key of a checkpoint.
pub fn key(generation: u64, id: u64) -> String {
    format!("{PREFIX}{generation:016x}/{id:016x}/{FILE}")
}

/// (generation, id) of a checkpoint key; `None` for anything else.
pub fn parse_key(key: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(PREFIX)?.strip_suffix(FILE)?.strip_suffix('/')?;
    let (generation, id) = rest.split_once('/')?;
    let hex16 = |s: &str| (s.len() == 16).then(|| u64::from_str_radix(s, 16).ok()).flatten();
    Some((hex16(generation)?, hex16(id)?))
}

/// Uploads a copy of `repos` under `generation`, then prunes old checkpoints. Returns the key.
pub async fn save(
    store: &dyn Store,
    repos: &ReposDb,
    generation: u64,
    id: u64,
    scratch: &Path,
) -> Result<String, CheckpointError> {
    let bytes = repos.snapshot_bytes(scratch)?;
    assert!(bytes.starts_with(SQLITE_MAGIC), "VACUUM INTO wrote something that is not SQLite");
    let compressed = compress(&bytes).map_err(|e| CheckpointError::Io { path: "<zstd>".into(), source: e })?;
    let key = key(generation, id);
    store.put(&key, compressed.into()).await?;
    prune(store).await?;
    Ok(key)
}

fn compress(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3)?;
    encoder.include_checksum(true)?;
    // The frame header states the size, so a restore can refuse an oversized one unread.
    encoder.set_pledged_src_size(Some(bytes.len() as u64))?;
    std::io::Write::write_all(&mut encoder, bytes)?;
    encoder.finish()
}

/// Deletes all but the newest `KEEP` checkpoints.
async fn prune(store: &dyn Store) -> Result<(), CheckpointError> {
    let mut found: Vec<((u64, u64), String)> =
        store.list(PREFIX).await?.into_iter().filter_map(|o| parse_key(&o.key).map(|k| (k, o.key))).collect();
    found.sort();
    let excess = found.len().saturating_sub(KEEP);
    for (_, key) in found.into_iter().take(excess) {
        store.delete(&key).await?;
    }
    Ok(())
}

/// Installs the newest valid checkpoint not newer than `max_generation` at `path`, when `path`
/// does not exist yet. Returns the key installed.
pub async fn restore_if_missing(
    store: &dyn Store,
    path: &Path,
    max_generation: u64,
) -> Result<Option<String>, CheckpointError> {
    if path.exists() {
        return Ok(None);
    }
    let mut found: Vec<((u64, u64), ObjectInfo)> = store
        .list(PREFIX)
        .await?
        .into_iter()
        .filter_map(|o| parse_key(&o.key).map(|k| (k, o)))
        .filter(|((generation, _), _)| *generation <= max_generation)
        .collect();
    found.sort_by_key(|(order, _)| *order);
    let temporary = path.with_extension("db.restoring");
    for (_, object) in found.into_iter().rev() {
        match restore_into(store, &object, &temporary).await {
            Ok(()) => {
                let io = |source| CheckpointError::Io { path: path.display().to_string(), source };
                std::fs::rename(&temporary, path).map_err(io)?;
                return Ok(Some(object.key));
            }
            Err(CheckpointError::Corrupt { key, reason }) => {
                tracing::error!(key, reason, "checkpoint refused; trying an older one");
                let _ = std::fs::remove_file(&temporary);
            }
            Err(other) => {
                let _ = std::fs::remove_file(&temporary);
                return Err(other);
            }
        }
    }
    Ok(None)
}

/// Fetches `object` a range at a time, decompressing into `file` (fsynced); `Corrupt` when it is
/// too large, fails its checksum, ends early or is not an SQLite database.
async fn restore_into(store: &dyn Store, object: &ObjectInfo, file: &Path) -> Result<(), CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { key: object.key.clone(), reason };
    if object.size > MAX_DECOMPRESSED_BYTES {
        return Err(corrupt(format!("{} bytes stored, more than {MAX_DECOMPRESSED_BYTES}", object.size)));
    }
    let io = |source| CheckpointError::Io { path: file.display().to_string(), source };
    let mut sink = LimitedFile::new(std::fs::File::create(file).map_err(io)?, MAX_DECOMPRESSED_BYTES);
    let mut decoder = zstd::stream::raw::Decoder::new().map_err(|e| corrupt(e.to_string()))?;
    let mut frame_done = false;
    let mut offset = 0;
    while offset < object.size {
        let len = RESTORE_RANGE_BYTES.min(object.size - offset);
        let chunk = store.get_range(&object.key, offset, len).await?;
        if offset == 0 {
            check_declared_size(&chunk).map_err(corrupt)?;
        }
        frame_done = decompress_chunk(&mut decoder, &chunk, &mut sink).map_err(corrupt)?;
        offset += len;
    }
    if !frame_done {
        return Err(corrupt("the zstd frame ends early".into()));
    }
    if !sink.head.starts_with(SQLITE_MAGIC) {
        return Err(corrupt("not an SQLite database".into()));
    }
    sink.file.sync_all().map_err(io)?;
    Ok(())
}

/// Refuses a frame whose header states more than `MAX_DECOMPRESSED_BYTES`. (Checkpoints written
/// before sizes were stated have none; the decompression's own limit holds them.)
fn check_declared_size(first: &[u8]) -> Result<(), String> {
    match zstd::zstd_safe::get_frame_content_size(first) {
        Ok(Some(size)) if size > MAX_DECOMPRESSED_BYTES => {
            Err(format!("declares {size} bytes, more than {MAX_DECOMPRESSED_BYTES}"))
        }
        Ok(_) => Ok(()),
        Err(_) => Err("not a zstd frame".into()),
    }
}

/// Feeds one chunk to the decoder, writing what comes out; returns whether a frame just ended
/// (its checksum verified by the decoder).
fn decompress_chunk(
    decoder: &mut zstd::stream::raw::Decoder<'_>,
    chunk: &[u8],
    sink: &mut LimitedFile,
) -> Result<bool, String> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    let mut input = InBuffer::around(chunk);
    let mut out = vec![0u8; 1 << 20];
    loop {
        let mut output = OutBuffer::around(&mut out[..]);
        let hint = decoder.run(&mut input, &mut output).map_err(|e| e.to_string())?;
        let produced = output.pos();
        sink.write(&out[..produced])?;
        // Done with this chunk once it is all read and the output did not fill the buffer.
        if input.pos() == chunk.len() && produced < out.len() {
            return Ok(hint == 0);
        }
    }
}

/// The restored file, refusing to grow past `limit`; keeps its first bytes.
struct LimitedFile {
    file: std::fs::File,
    limit: u64,
    written: u64,
    head: Vec<u8>,
}

impl LimitedFile {
    fn new(file: std::fs::File, limit: u64) -> Self {
        LimitedFile { file, limit, written: 0, head: Vec::new() }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.written += bytes.len() as u64;
        if self.written > self.limit {
            return Err(format!("decompresses to more than {} bytes", self.limit));
        }
        if self.head.len() < SQLITE_MAGIC.len() {
            let take = (SQLITE_MAGIC.len() - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
        }
        std::io::Write::write_all(&mut self.file, bytes).map_err(|e| format!("writing the restored file: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::backfill::repos::{Listed, RepoStatus};
    use crate::store::dir::DirStore;

    #[test]
    fn decompression_stops_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = LimitedFile::new(std::fs::File::create(dir.path().join("out")).unwrap(), 1 << 20);
        let bomb = zstd::stream::encode_all(&vec![0u8; 4 << 20][..], 3).unwrap();
        assert!(bomb.len() < 4 << 10, "four MiB of zeros compress to almost nothing");
        let mut decoder = zstd::stream::raw::Decoder::new().unwrap();
        let error = decompress_chunk(&mut decoder, &bomb, &mut sink).unwrap_err();
        assert!(error.contains("more than 1048576 bytes"), "{error}");
        assert!(sink.written <= (1 << 20) + (1 << 20), "stopped within one output buffer of the limit");
    }

    #[test]
    fn keys_round_trip() {
        let k = key(7, 0xabc);
        assert_eq!(k, "checkpoints/0000000000000007/0000000000000abc/repos.db.zst");
        assert_eq!(parse_key(&k), Some((7, 0xabc)));
        assert_eq!(parse_key("checkpoints/7/1/repos.db.zst"), None);
        assert_eq!(parse_key("tables/links/x.data"), None);
    }

    #[tokio::test]
    async fn saved_checkpoints_restore_pruned_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::new(dir.path().join("bucket"));
        let repos = ReposDb::open(&dir.path().join("repos.db")).unwrap();
        let listed = Listed { did: "did:plc:a", host: "https://pds", rev: None, inactive: None };
        repos.offer(&[listed], 1).unwrap();
        for generation in 1..=5 {
            save(&store, &repos, generation, 100 + generation, &dir.path().join("scratch")).await.unwrap();
        }
        let kept: Vec<_> = store.list(PREFIX).await.unwrap().into_iter().filter_map(|o| parse_key(&o.key)).collect();
        assert_eq!(kept.len(), KEEP);
        assert!(kept.iter().all(|(generation, _)| *generation >= 3));

        // Restore picks the newest checkpoint not newer than the manifest: generation 4.
        let target = dir.path().join("restored").join("repos.db");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        assert_eq!(restore_if_missing(&store, &target, 4).await.unwrap(), Some(key(4, 104)));
        let restored = ReposDb::open(&target).unwrap();
        assert_eq!(restored.get("did:plc:a").unwrap().unwrap().status, RepoStatus::Pending);
        assert_eq!(restore_if_missing(&store, &target, 4).await.unwrap(), None, "an existing file is kept");

        // A flipped bit fails the checksum: the older checkpoint is installed instead.
        let newest = key(4, 104);
        let mut bytes = store.get(&newest).await.unwrap().to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        store.put(&newest, bytes.into()).await.unwrap();
        let other = dir.path().join("other.db");
        assert_eq!(restore_if_missing(&store, &other, 4).await.unwrap(), Some(key(3, 103)));

        // A frame that declares more than the limit is refused from its header alone; one that
        // states no size is read under the limit; one cut short is refused.
        let mut huge = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        huge.set_pledged_src_size(Some(MAX_DECOMPRESSED_BYTES + 1)).unwrap();
        std::io::Write::write_all(&mut huge, SQLITE_MAGIC).unwrap();
        std::io::Write::flush(&mut huge).unwrap();
        let header_only = huge.get_ref().clone();
        assert!(check_declared_size(&header_only).unwrap_err().contains("declares"));
        let mut unsized_frame = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        std::io::Write::write_all(&mut unsized_frame, SQLITE_MAGIC).unwrap();
        std::io::Write::flush(&mut unsized_frame).unwrap(); // streamed: the size is not known up front
        let unsized_frame = unsized_frame.finish().unwrap();
        assert!(check_declared_size(&unsized_frame).is_ok());
        assert!(check_declared_size(b"not zstd at all").is_err());
        let whole = store.get(&key(3, 103)).await.unwrap();
        store.put(&key(4, 104), whole.slice(..whole.len() - 8)).await.unwrap();
        let third = dir.path().join("third.db");
        assert_eq!(restore_if_missing(&store, &third, 4).await.unwrap(), Some(key(3, 103)), "the cut one is refused");
        assert!(!dir.path().join("third.db.restoring").exists(), "no half-restored file is left");
    }
}
