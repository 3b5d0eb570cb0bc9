//! Object storage: the `Store` trait (`object`) and its implementations: a local directory
//! (`dir`), S3 (`s3`), a seeded fault injector for tests (`faulty`), a runtime pin for serving
//! threads (`pinned`), and the one retry policy (`retry`).

pub mod dir;
pub mod faulty;
pub mod object;
pub mod pinned;
pub mod retry;
pub mod s3;

/// The first bytes of a standard zstd frame. A manifest body that does not start with them is the
/// bare JSON of a manifest written before manifests were compressed.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

thread_local! {
    /// One zstd decompression context per thread: a paged meta inflates a frame-index chunk on
    /// every cache miss, and a fresh context per call cost more than the chunk.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

fn decompress(frame: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decompressor = match cell.as_mut() {
            Some(decompressor) => decompressor,
            None => cell.insert(zstd::bulk::Decompressor::new()?),
        };
        decompressor.decompress(frame, capacity)
    })
}

/// The content of one zstd frame that states its size, at most `max` bytes: the size is checked
/// before anything is allocated for it (the bucket's compressed objects: manifests, outline
/// ranges, meta frame indexes).
pub(crate) fn inflate(frame: &[u8], max: usize) -> Result<Vec<u8>, String> {
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) => size,
        Ok(None) => return Err("the zstd frame does not state its size".into()),
        Err(_) => return Err("not a zstd frame".into()),
    };
    if size > max as u64 {
        return Err(format!("{size} bytes of content is over the limit of {max}"));
    }
    // Exactly one standard frame: no legacy format, nothing (not even a skippable frame) after it.
    if !frame.starts_with(&ZSTD_MAGIC) || zstd::zstd_safe::find_frame_compressed_size(frame) != Ok(frame.len()) {
        return Err("not a zstd frame".into());
    }
    let content = decompress(frame, size as usize).map_err(|e| format!("zstd: {e}"))?;
    if content.len() as u64 != size {
        return Err(format!("the zstd frame holds {} bytes, not the {size} it states", content.len()));
    }
    Ok(content)
}
