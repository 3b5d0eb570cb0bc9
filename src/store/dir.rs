//! `DirStore`: the object store that keeps objects as files under a local directory (the
//! embedded default: the binary runs with no bucket at all).
//!
//! Invariants:
//! - Key `a/b/c` is the file `<root>/a/b/c`; every key is validated (`validate_key`) first.
//! - A put writes `<name>~<pid>-<n>` in the object's directory, fsyncs it, renames it over `<name>`
//!   and fsyncs the directory: the object appears whole or not at all. `~` is not a key character,
//!   so a temporary file can never be mistaken for an object, and `list` skips it (a crash may
//!   leave one behind; it is never read).
//! - Directories created for a put are fsynced into their parents before the put returns.
//! - A read uses one open file for the size check and the read, so it sees one version whole.
//! - All file IO runs on tokio's blocking pool, never on a runtime worker.

use super::object::{
    HashingReader, LocalFile, MAX_KEY_LEN, MAX_LIST_OBJECTS, MAX_OBJECT_LEN, ObjectInfo, Store, StoreError,
    check_object_len, split_prefix, validate_key, validate_prefix,
};
use crate::base::durable::{sync_dir, write_synced};
use bytes::Bytes;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Separates an object's name from the unique suffix of its temporary file. Not a key character.
const TEMP_MARKER: char = '~';

/// A store backed by a local directory.
#[derive(Debug)]
pub struct DirStore {
    root: PathBuf,
    /// Makes temporary file names unique among concurrent puts of this process.
    temp_counter: AtomicU64,
}

impl DirStore {
    /// A store rooted at `root`. The directory is created by the first put that needs it.
    pub fn new(root: PathBuf) -> Self {
        Self { root, temp_counter: AtomicU64::new(0) }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> PathBuf {
        debug_assert!(validate_key(key).is_ok());
        self.root.join(key)
    }

    fn next_temp_suffix(&self) -> String {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        format!("{TEMP_MARKER}{}-{n}", std::process::id())
    }

    /// Writes the `len`-byte object `key` with `write` (which fills and fsyncs a temporary file),
    /// on the blocking pool (`write_object`).
    async fn write_through_temp(
        &self,
        key: &str,
        len: u64,
        write: impl FnOnce(&Path) -> std::io::Result<()> + Send + 'static,
    ) -> Result<(), StoreError> {
        validate_key(key)?;
        check_object_len(key, len)?;
        let (root, path, suffix, key) = (self.root.clone(), self.path_of(key), self.next_temp_suffix(), key.to_owned());
        blocking(move || write_object(&root, &path, &suffix, write).map_err(|e| StoreError::io(&key, e))).await
    }
}

/// Runs blocking file IO on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    task: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(task).await.map_err(|e| StoreError::Other(format!("file io task failed: {e}")))?
}

#[async_trait::async_trait]
impl Store for DirStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        let len = body.len() as u64;
        self.write_through_temp(key, len, move |temp| write_synced(temp, &body)).await
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        let file = file.clone();
        self.write_through_temp(key, file.len, move |temp| copy_synced(&file, temp)).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        let (path, key) = (self.path_of(key), key.to_owned());
        blocking(move || read_whole(&path, &key)).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        let (path, key) = (self.path_of(key), key.to_owned());
        blocking(move || read_range(&path, &key, offset, len)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        let (root, prefix) = (self.root.clone(), prefix.to_owned());
        blocking(move || list_files(&root, &prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        validate_key(key)?;
        let (path, key) = (self.path_of(key), key.to_owned());
        // No directory fsync: a delete lost in a crash leaves garbage that the next GC removes.
        blocking(move || match std::fs::remove_file(&path) {
            Err(e) if is_missing(&e) => Ok(()),
            other => other.map_err(|e| StoreError::io(&key, e)),
        })
        .await
    }
}

/// Missing, or a path through a file (`a/b` when `a` is a file): both mean "no such object".
fn is_missing(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// Writes an object through a temporary file (`write` fills and fsyncs it), renamed into place
/// only when `write` succeeded.
fn write_object(
    root: &Path,
    path: &Path,
    temp_suffix: &str,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("object path has no parent"))?;
    let name = path.file_name().ok_or_else(|| std::io::Error::other("object path has no file name"))?;
    ensure_durable_dir(root, dir)?;
    let mut temp_name = name.to_os_string();
    temp_name.push(temp_suffix);
    let temp = dir.join(temp_name);
    let written = write(&temp).and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        // Best effort: the temporary file is invisible to readers either way.
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    sync_dir(dir)
}

/// Copies `file` into a new file at `temp`, hashing what it copies, and fsyncs it if those were
/// the bytes checked (at most `len` + 1 bytes are copied: enough to tell that a file is too long).
fn copy_synced(file: &LocalFile, temp: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut from = HashingReader::new(File::open(&file.path)?.take(file.len.saturating_add(1)));
    let mut to = File::create(temp)?;
    let copied = std::io::copy(&mut from, &mut to)?;
    file.check(copied, from.finish())?;
    to.sync_all()
}

/// Creates `dir` (under `root`) if needed and, when it did, fsyncs every new directory's parent so
/// that the directory entries survive a crash along with the object.
fn ensure_durable_dir(root: &Path, dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let mut current = dir;
    while let Some(parent) = current.parent() {
        // `Path::new("data").parent()` is `""`: the current directory.
        sync_dir(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })?;
        if current == root || !current.starts_with(root) {
            break;
        }
        current = parent;
    }
    Ok(())
}

/// Opens the object file; `NotFound` when it is missing or is not a regular file.
fn open_object(path: &Path, key: &str) -> Result<(File, u64), StoreError> {
    let file = File::open(path).map_err(|e| match is_missing(&e) {
        true => StoreError::NotFound { key: key.to_owned() },
        false => StoreError::io(key, e),
    })?;
    let meta = file.metadata().map_err(|e| StoreError::io(key, e))?;
    if !meta.is_file() {
        return Err(StoreError::NotFound { key: key.to_owned() });
    }
    Ok((file, meta.len()))
}

fn read_whole(path: &Path, key: &str) -> Result<Bytes, StoreError> {
    // One open file for both the size and the read: reopening could see a newer object.
    let (file, size) = open_object(path, key)?;
    read_open_range(&file, size, key, 0, size)
}

fn read_range(path: &Path, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
    let (file, size) = open_object(path, key)?;
    read_open_range(&file, size, key, offset, len)
}

fn read_open_range(file: &File, size: u64, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
    // Bounds are checked against the file size before anything is allocated, so a hostile
    // `len` costs nothing.
    let available = size.saturating_sub(offset).min(len);
    let in_bounds = offset.checked_add(len).is_some_and(|end| end <= size);
    if !in_bounds {
        return Err(StoreError::ShortRead { key: key.to_owned(), expected: len, got: available });
    }
    if len > MAX_OBJECT_LEN {
        return Err(StoreError::Other(format!("range of {len} bytes of {key} is over the object limit")));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset).map_err(|e| match e.kind() {
        // The file shrank under us: only possible if something outside the store edits it.
        ErrorKind::UnexpectedEof => StoreError::ShortRead { key: key.to_owned(), expected: len, got: 0 },
        _ => StoreError::io(key, e),
    })?;
    assert_eq!(buf.len() as u64, len);
    Ok(Bytes::from(buf))
}

/// Deepest directory nesting `list` descends: a valid key has at most 256 segments.
const MAX_LIST_DEPTH: usize = MAX_KEY_LEN / 2;

fn list_files(root: &Path, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
    let (dirs, _partial) = split_prefix(prefix);
    let start_key = dirs.join("/");
    let mut stack = vec![(root.join(&start_key), start_key, dirs.len())];
    let mut found = Vec::new();
    while let Some((dir, dir_key, depth)) = stack.pop() {
        for (name, kind, size) in read_dir_entries(&dir, &dir_key)? {
            let key = if dir_key.is_empty() { name.clone() } else { format!("{dir_key}/{name}") };
            if kind.is_dir() && depth < MAX_LIST_DEPTH && could_hold_prefix(&key, prefix) {
                stack.push((dir.join(name), key, depth + 1));
            } else if kind.is_file() && key.starts_with(prefix) {
                found.push(ObjectInfo { key, size });
            }
        }
        if found.len() > MAX_LIST_OBJECTS {
            return Err(StoreError::Other(format!("more than {MAX_LIST_OBJECTS} objects under {prefix:?}")));
        }
    }
    found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}

/// Whether keys under directory `dir_key` may start with `prefix`.
fn could_hold_prefix(dir_key: &str, prefix: &str) -> bool {
    let with_slash = format!("{dir_key}/");
    with_slash.starts_with(prefix) || prefix.starts_with(&with_slash)
}

/// The entries of `dir` that could be objects or hold objects: names that are valid key segments
/// (this skips temporary files), regular files and directories only (never symlinks).
fn read_dir_entries(dir: &Path, dir_key: &str) -> Result<Vec<(String, std::fs::FileType, u64)>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if is_missing(&e) => return Ok(Vec::new()),
        other => other.map_err(|e| StoreError::io(dir_key, e))?,
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(dir_key, e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        if validate_key(&name).is_err() {
            continue;
        }
        let kind = entry.file_type().map_err(|e| StoreError::io(dir_key, e))?;
        let size = if kind.is_file() { entry.metadata().map_err(|e| StoreError::io(dir_key, e))?.len() } else { 0 };
        out.push((name, kind, size));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_store_is_shareable() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<DirStore>();
        shareable::<std::sync::Arc<dyn Store>>();
    }

    fn store() -> (tempfile::TempDir, DirStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::new(dir.path().join("bucket"));
        (dir, store)
    }

    fn keys(infos: &[ObjectInfo]) -> Vec<&str> {
        infos.iter().map(|i| i.key.as_str()).collect()
    }

    #[tokio::test]
    async fn list_skips_leftover_temp_files() {
        let (_dir, store) = store();
        store.put("dir/obj", Bytes::from_static(b"x")).await.unwrap();
        std::fs::write(store.root().join("dir/obj~123-4"), b"half").unwrap();
        assert_eq!(keys(&store.list("dir/").await.unwrap()), ["dir/obj"]);
    }
}
