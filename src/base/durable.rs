//! Files that appear whole or not at all, and stay after a crash.

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes to a temporary name, fsyncs, renames over `path`: a reader (or a restart after a
/// crash) sees the old file or the new one, never a part.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    write_synced(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Creates (or truncates) `path` with `bytes` and fsyncs it; the caller renames it into place.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Fsyncs a directory, so that the renames and removals inside it survive a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
