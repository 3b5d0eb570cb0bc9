//! The object store contract: the `Store` trait every backend implements (local directory, S3,
//! fault injection), its errors, and the key grammar.
//!
//! Invariants (every implementation):
//! - Keys are 1..=`MAX_KEY_LEN` bytes of `[A-Za-z0-9._/-]`, without a leading `/`, an empty segment,
//!   or a `.`/`..` segment (`validate_key`). Every operation validates its key first, so a hostile
//!   key can never name something outside the store.
//! - `put` is atomic: a reader sees the old object or the new one whole, never a mix or a prefix.
//!   Objects are immutable except `CURRENT`.
//! - `get_range` returns exactly `len` bytes or `ShortRead`; it never returns a partial range.
//! - `list` is sorted by key; deleting a missing key succeeds.
//! - Objects are at most `MAX_OBJECT_LEN` bytes (the largest single PUT S3 accepts).
//! - `put_file` writes exactly the bytes the caller checked (`LocalFile`: their length and
//!   SHA-256) or fails with nothing written; the stores that large tables travel through (S3, the
//!   local directory, the wrappers in front of them) stream the file instead of holding it.

use bytes::Bytes;
use std::io::ErrorKind;
use std::path::PathBuf;

/// Longest key in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Largest object in bytes: 5 GiB, the largest single PUT that S3 accepts.
pub const MAX_OBJECT_LEN: u64 = 5 << 30;
/// Most objects one `list` call returns before it fails instead of growing without bound.
pub const MAX_LIST_OBJECTS: usize = 10_000_000;

/// An object storage bucket (or a prefix of one).
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Writes `body` under `key`, replacing any previous object atomically.
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError>;
    /// Writes the local file `file` under `key`, as `put` does, if it still holds the bytes its
    /// caller checked. This default reads it whole; the stores a table's data (up to 64 MiB) goes
    /// through in production stream it.
    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        let body = read_local_file(key, file).await?;
        self.put(key, body).await
    }
    /// The whole object; `StoreError::NotFound` when absent.
    async fn get(&self, key: &str) -> Result<Bytes, StoreError>;
    /// Exactly `len` bytes starting at `offset`, or `StoreError::ShortRead`.
    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError>;
    /// Every object whose key starts with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// Removes `key`; removing a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
}

/// A local file to upload, as its caller checked it: its length and the SHA-256 of its bytes.
/// A store sends exactly these bytes or nothing (a file that changed since is refused).
#[derive(Debug, Clone)]
pub struct LocalFile {
    pub path: PathBuf,
    pub len: u64,
    pub sha256: [u8; 32],
}

impl LocalFile {
    /// Whether the `len` bytes read from the file, of SHA-256 `sha256`, are the ones checked.
    pub(crate) fn check(&self, len: u64, sha256: [u8; 32]) -> std::io::Result<()> {
        check_file_len(self.len, len)?;
        if sha256 != self.sha256 {
            let detail = "the local file sent changed since it was checked (SHA-256 differs)";
            return Err(std::io::Error::new(ErrorKind::InvalidData, detail));
        }
        Ok(())
    }
}

/// A reader that hashes (SHA-256) every byte read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R: std::io::Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader { inner, hasher: <sha2::Sha256 as sha2::Digest>::new() }
    }

    /// The SHA-256 of everything read so far.
    pub fn finish(self) -> [u8; 32] {
        sha2::Digest::finalize(self.hasher).into()
    }
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        sha2::Digest::update(&mut self.hasher, &buf[..n]);
        Ok(n)
    }
}

/// The bytes of the local file `file`, read for an upload to `key`, if they are the ones checked.
async fn read_local_file(key: &str, file: &LocalFile) -> Result<Bytes, StoreError> {
    check_object_len(key, file.len)?;
    let body = tokio::fs::read(&file.path).await.map_err(|e| StoreError::io(key, e))?;
    let sha256: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&body).into();
    file.check(body.len() as u64, sha256).map_err(|e| StoreError::io(key, e))?;
    Ok(body.into())
}

/// An object of `len` bytes may be written at all.
pub(crate) fn check_object_len(key: &str, len: u64) -> Result<(), StoreError> {
    if len > MAX_OBJECT_LEN {
        return Err(StoreError::Other(format!("object {key} is {len} bytes, over the limit")));
    }
    Ok(())
}

/// A local file sent for upload held the `expected` bytes its caller named (`found`: what was
/// read). Not retryable: files are uploaded once written whole and never change.
pub(crate) fn check_file_len(expected: u64, found: u64) -> std::io::Result<()> {
    if found == expected {
        return Ok(());
    }
    let detail = format!("the local file sent is {found} bytes, {expected} were named");
    Err(std::io::Error::new(ErrorKind::InvalidData, detail))
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {key} not found")]
    NotFound { key: String },
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("short read of {key}: wanted {expected} bytes, got {got}")]
    ShortRead { key: String, expected: u64, got: u64 },
    #[error("io error on {key}: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl StoreError {
    /// Whether trying the same request again may succeed. Only transient transport conditions
    /// qualify: a missing object, a bad key or a short read of an immutable object will fail the
    /// same way again. Implementations report transient remote failures as `Io` with one of the
    /// kinds below.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => is_transient(source.kind()),
            StoreError::NotFound { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::ShortRead { .. }
            | StoreError::Other(_) => false,
        }
    }

    pub(crate) fn io(key: &str, source: std::io::Error) -> Self {
        StoreError::Io { key: key.to_owned(), source }
    }

    fn invalid(key: &str, reason: &'static str) -> Self {
        // A hostile key may be huge; the error keeps a bounded copy of it.
        let shown: String = key.chars().take(MAX_KEY_LEN).collect();
        StoreError::InvalidKey { key: shown, reason }
    }
}

fn is_transient(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::TimedOut
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionRefused
            | ErrorKind::NotConnected
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
    )
}

/// Checks `key` against the key grammar (see the module header).
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(StoreError::invalid(key, "length must be 1..=512 bytes"));
    }
    check_characters(key)?;
    if key.starts_with('/') {
        return Err(StoreError::invalid(key, "leading '/'"));
    }
    key.split('/').try_for_each(|segment| check_segment(key, segment))
}

/// A list prefix: empty, or a string whose complete segments obey the key grammar. The last
/// (partial) segment may be empty or a bare `.`, since it only filters names.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.len() > MAX_KEY_LEN {
        return Err(StoreError::invalid(prefix, "prefix longer than 512 bytes"));
    }
    check_characters(prefix)?;
    if prefix.starts_with('/') {
        return Err(StoreError::invalid(prefix, "leading '/'"));
    }
    let (complete, _partial) = split_prefix(prefix);
    complete.into_iter().try_for_each(|segment| check_segment(prefix, segment))
}

fn check_characters(key: &str) -> Result<(), StoreError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-');
    if key.bytes().all(allowed) { Ok(()) } else { Err(StoreError::invalid(key, "characters outside [A-Za-z0-9._/-]")) }
}

fn check_segment(key: &str, segment: &str) -> Result<(), StoreError> {
    match segment {
        "" => Err(StoreError::invalid(key, "empty path segment")),
        "." | ".." => Err(StoreError::invalid(key, "'.' or '..' path segment")),
        _ => Ok(()),
    }
}

/// `"a/b/c"` -> (`["a", "b"]`, `"c"`); `"a/b/"` -> (`["a", "b"]`, `""`).
pub(crate) fn split_prefix(prefix: &str) -> (Vec<&str>, &str) {
    match prefix.rsplit_once('/') {
        Some((dirs, partial)) => (dirs.split('/').collect(), partial),
        None => (Vec::new(), prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_grammar() {
        for good in ["CURRENT", "tables/links/0001.data", "a", ".hidden", "a-b_c.d/e", &"x".repeat(512)] {
            assert!(validate_key(good).is_ok(), "{good}");
        }
        let bad = [
            ("", "length must be 1..=512 bytes"),
            ("../x", "'.' or '..' path segment"),
            ("a/../b", "'.' or '..' path segment"),
            ("a/./b", "'.' or '..' path segment"),
            (".", "'.' or '..' path segment"),
            ("/abs", "leading '/'"),
            ("a//b", "empty path segment"),
            ("a/", "empty path segment"),
            ("a b", "characters outside [A-Za-z0-9._/-]"),
            ("a~1", "characters outside [A-Za-z0-9._/-]"),
            ("a\\b", "characters outside [A-Za-z0-9._/-]"),
            ("caf\u{e9}", "characters outside [A-Za-z0-9._/-]"),
            ("a\0b", "characters outside [A-Za-z0-9._/-]"),
        ];
        for (key, why) in bad {
            match validate_key(key) {
                Err(StoreError::InvalidKey { reason, .. }) => assert_eq!(reason, why, "{key:?}"),
                other => panic!("{key:?} gave {other:?}"),
            }
        }
        let long = "x".repeat(1000);
        assert!(matches!(validate_key(&long), Err(StoreError::InvalidKey { key, .. }) if key.len() == 512));
    }

    #[test]
    fn retryable_only_for_transient_io() {
        let io = |kind| StoreError::Io { key: "k".into(), source: std::io::Error::from(kind) };
        assert!(io(ErrorKind::TimedOut).is_retryable());
        assert!(io(ErrorKind::ConnectionReset).is_retryable());
        assert!(!io(ErrorKind::PermissionDenied).is_retryable());
        assert!(!StoreError::NotFound { key: "k".into() }.is_retryable());
        assert!(!StoreError::ShortRead { key: "k".into(), expected: 2, got: 1 }.is_retryable());
        assert!(!StoreError::Other("x".into()).is_retryable());
    }
}
