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
//! - At most `KEEP` checkpoints are kept; older ones are deleted after each new one.

use crate::ingest::backfill::repos::{ReposDb, ReposError};
use crate::store::object::{Store, StoreError};
use std::path::Path;

/// Checkpoints kept in the bucket.
pub const KEEP: usize = 3;
/// Largest repos.db accepted from a checkpoint (decompressed): 64 GiB, a whole network's worth.
pub const MAX_DECOMPRESSED_BYTES: u64 = 64 << 30;
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
    let mut found: Vec<((u64, u64), String)> = store
        .list(PREFIX)
        .await?
        .into_iter()
        .filter_map(|o| parse_key(&o.key).map(|k| (k, o.key)))
        .filter(|((generation, _), _)| *generation <= max_generation)
        .collect();
    found.sort();
    for (_, key) in found.into_iter().rev() {
        let compressed = store.get(&key).await?;
        match decompress(&key, &compressed) {
            Ok(bytes) => {
                install(path, &bytes)?;
                return Ok(Some(key));
            }
            Err(e) => tracing::error!(error = %e, "checkpoint refused; trying an older one"),
        }
    }
    Ok(None)
}

fn decompress(key: &str, compressed: &[u8]) -> Result<Vec<u8>, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { key: key.into(), reason };
    let decoder = zstd::stream::Decoder::new(compressed).map_err(|e| corrupt(e.to_string()))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(decoder, MAX_DECOMPRESSED_BYTES + 1), &mut bytes)
        .map_err(|e| corrupt(e.to_string()))?;
    if bytes.len() as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(corrupt(format!("larger than {MAX_DECOMPRESSED_BYTES} bytes")));
    }
    if !bytes.starts_with(SQLITE_MAGIC) {
        return Err(corrupt("not an SQLite database".into()));
    }
    Ok(bytes)
}

/// Writes the file beside `path`, fsyncs it, then renames it into place.
fn install(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io { path: path.display().to_string(), source };
    let temporary = path.with_extension("db.restoring");
    let mut file = std::fs::File::create(&temporary).map_err(io)?;
    std::io::Write::write_all(&mut file, bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::backfill::repos::{Listed, RepoStatus};
    use crate::store::dir::DirStore;

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
    }
}
