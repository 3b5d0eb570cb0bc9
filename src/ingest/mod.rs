//! Events in: Jetstream JSON lines (`backlinks import`, later the live stream) and repository CARs.
//!
//! Invariants:
//! - A malformed line is counted, reported and skipped; it never stops an import and never
//!   reaches the index.
//! - A line longer than the limit is skipped without being buffered whole.

pub mod backfill;
pub mod frames;
pub mod import_progress;
pub mod repo;

pub mod jetstream;
pub mod live;
pub mod prepare;
pub mod read_ahead;

use crate::base::drop_flag::SetOnDrop;
use crate::index::{Index, IndexError};
use import_progress::ImportProgress;
use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;

/// Longest accepted line; Jetstream events are a few KiB (records are capped at 1 MiB upstream).
pub const MAX_LINE_BYTES: usize = 4 << 20;
/// How many malformed-line examples a report keeps.
const MAX_EXAMPLES: usize = 10;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub lines: u64,
    pub applied: u64,
    pub skipped: u64,
    pub malformed: u64,
    pub too_long: u64,
    /// (line number, reason) of the first few malformed lines.
    pub examples: Vec<(u64, String)>,
    pub flushes: u64,
}

impl ImportReport {
    fn malformed(&mut self, line: u64, reason: String) {
        self.malformed += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push((line, reason));
        }
    }
}

enum LineRead {
    Line,
    TooLong,
    Eof,
}

/// Reads one line into `buf` (without the newline), refusing to buffer more than `max` bytes.
fn read_bounded_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<LineRead> {
    buf.clear();
    // `read_until` finds the newline with the standard library's vectorized search; `take`
    // keeps a line without one from growing the buffer past the limit.
    let read = (&mut *reader).take(max as u64 + 1).read_until(b'\n', buf)?;
    if read == 0 {
        return Ok(LineRead::Eof);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(LineRead::Line);
    }
    if buf.len() <= max {
        return Ok(LineRead::Line); // the last line, without a newline
    }
    // Too long: skip to its end in bounded pieces.
    loop {
        buf.clear();
        let read = (&mut *reader).take(SKIP_PIECE_BYTES).read_until(b'\n', buf)?;
        if read == 0 || buf.last() == Some(&b'\n') {
            buf.clear();
            return Ok(LineRead::TooLong);
        }
    }
}

/// How much of an overlong line is read (and dropped) at a time.
const SKIP_PIECE_BYTES: u64 = 64 << 10;

/// Applies every event of a Jetstream v1 JSON-lines stream in order, flushing when a memtable is
/// full and once at the end.
pub fn import_lines(index: &Index, reader: impl BufRead + Send) -> Result<ImportReport, IndexError> {
    import_lines_with(index, reader, &mut |_| Ok(()), &ImportProgress::default())
}

/// `import_lines`, calling `after_flush` after every flush (to compact, say) and counting into
/// `progress` as it goes. Two threads share
/// the work: one reads, parses and finds links (`prepare`), this one writes them (the caller
/// may read ahead on another, `read_ahead`). Each flush but the last runs on a thread of its own
/// while writing goes on; the next flush waits for it, so at most one runs.
pub fn import_lines_with(
    index: &Index,
    reader: impl BufRead + Send,
    after_flush: &mut dyn FnMut(&Index) -> Result<(), IndexError>,
    progress: &ImportProgress,
) -> Result<ImportReport, IndexError> {
    let limits = index.extract_limits().clone();
    let stop = &AtomicBool::new(false);
    std::thread::scope(|scope| {
        // However this closure ends (an error, a panic), the parser stops at its next line.
        let _stop_parser = SetOnDrop::new(stop);
        // Made inside the scope: returning early (on an error) drops this thread's ends, which
        // stops the parser at its next hand-over, before the scope waits for it.
        let (filled_tx, filled) = sync_channel(prepare::BATCHES);
        let (emptied, emptied_rx) = sync_channel(prepare::BATCHES);
        for _ in 0..prepare::BATCHES {
            emptied.send(prepare::Batch::default()).expect("the receiver is alive and the channel has room");
        }
        let parser = std::thread::Builder::new()
            .name("import-parse".into())
            .spawn_scoped(scope, move || prepare::prepare_lines(reader, &limits, stop, &emptied_rx, &filled_tx))
            .map_err(|source| IndexError::Io { path: "<parsing thread>".into(), source })?;
        let mut flushes = 0;
        let mut applied = 0;
        let mut flushing: Option<std::thread::ScopedJoinHandle<'_, Result<usize, IndexError>>> = None;
        let mut flush_if_full = || -> Result<(), IndexError> {
            if index.wants_flush() {
                let finished = finish_flush(flushing.take(), index, after_flush)?;
                flushes += finished;
                progress.flushes.fetch_add(finished, Ordering::Relaxed);
                let job = index.begin_flush()?;
                flushing = Some(scope.spawn(move || job.finish()));
            }
            Ok(())
        };
        for batch in &filled {
            batch.apply(index, &mut flush_if_full)?;
            applied += batch.len() as u64;
            progress.events.fetch_add(batch.len() as u64, Ordering::Relaxed);
            // The parser is gone only when it is done or failed: no batch is needed then.
            let _ = emptied.send(batch);
        }
        flushes += finish_flush(flushing.take(), index, after_flush)?;
        let mut report = parser
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|source| IndexError::Io { path: "<input>".into(), source })?;
        index.flush()?;
        after_flush(index)?;
        report.applied = applied;
        report.flushes = flushes + 1;
        Ok(report)
    })
}

/// Waits for a background flush (if any); returns how many it was (0 or 1).
fn finish_flush(
    job: Option<std::thread::ScopedJoinHandle<'_, Result<usize, IndexError>>>,
    index: &Index,
    after_flush: &mut dyn FnMut(&Index) -> Result<(), IndexError>,
) -> Result<u64, IndexError> {
    let Some(job) = job else { return Ok(0) };
    job.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    after_flush(index)?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Result<Vec<u8>, ()>> {
        let mut reader = std::io::BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            match read_bounded_line(&mut reader, &mut buf, max).unwrap() {
                LineRead::Eof => return out,
                LineRead::Line => out.push(Ok(buf.clone())),
                LineRead::TooLong => out.push(Err(())),
            }
        }
    }

    /// A writer-side failure (here the after-flush hook) ends the import with that error while
    /// the parser still has lines and full queues: the parser is stopped, nothing waits forever.
    #[test]
    fn a_failure_while_writing_stops_the_parser_and_returns_the_error() {
        use crate::index::IndexOptions;
        let dir = tempfile::tempdir().unwrap();
        let options = IndexOptions { memtable_bytes: 64 * 200, ..IndexOptions::default() };
        let index = crate::index::open_in_dir(dir.path(), options);
        let line = |i: usize| {
            format!(
                r#"{{"did":"did:plc:{i:024}","time_us":{i},"kind":"commit","commit":{{"rev":"3mmoojp7vgo2g","operation":"create","collection":"app.bsky.feed.like","rkey":"3mmoojp7etg2g","record":{{"subject":{{"uri":"at://did:plc:{:024}/app.bsky.feed.post/3mmoojp4cd223","cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"}}}}}}}}"#,
                i % 7
            )
        };
        let text: Vec<String> = (0..50_000).map(line).collect();
        let mut flushes = 0;
        let fail = &mut |_: &Index| {
            flushes += 1;
            Err(IndexError::Lease("lost the lease".into()))
        };
        let result = import_lines_with(&index, text.join("\n").as_bytes(), fail, &ImportProgress::default());
        assert!(matches!(result, Err(IndexError::Lease(reason)) if reason == "lost the lease"));
        assert_eq!(flushes, 1, "stopped at the first failure");
        assert!(index.position().clock < 10_000, "stopped early, at {}", index.position().clock);
    }

    /// A read error ends the import with that error, after applying every line before it.
    #[test]
    fn a_read_error_comes_after_the_lines_before_it() {
        use crate::index::IndexOptions;
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk on fire"))
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let index = crate::index::open_in_dir(dir.path(), IndexOptions::default());
        let line = |i: usize| {
            format!(
                r#"{{"did":"did:plc:{i:024}","time_us":{i},"kind":"account","account":{{"active":false,"did":"did:plc:{i:024}","seq":1,"time":"2026-05-25T14:23:28.778Z","status":"deactivated"}}}}"#
            )
        };
        let text = (0..100).map(line).collect::<Vec<_>>().join("\n") + "\n";
        let input = std::io::BufReader::new(text.as_bytes().chain(Broken));
        let result = import_lines(&index, input);
        assert!(
            matches!(&result, Err(IndexError::Io { source, .. }) if source.to_string() == "disk on fire"),
            "{result:?}"
        );
        assert_eq!(index.position().clock, 100, "every line before the error was applied");
    }

    #[test]
    fn bounded_lines_skip_long_ones_without_losing_the_next() {
        let got = lines(b"ab\n0123456789\ncd\nlast", 5);
        assert_eq!(got, vec![Ok(b"ab".to_vec()), Err(()), Ok(b"cd".to_vec()), Ok(b"last".to_vec())]);
        assert_eq!(lines(b"", 5), vec![]);
        assert_eq!(lines(b"\n\n", 5), vec![Ok(vec![]), Ok(vec![])]);
        assert_eq!(lines(b"0123456789", 5), vec![Err(())]);
        assert_eq!(lines(b"12345\n123456\n12345", 5), vec![Ok(b"12345".to_vec()), Err(()), Ok(b"12345".to_vec())]);
        let long = [vec![b'x'; 200_000], b"\nok\n".to_vec()].concat();
        assert_eq!(lines(&long, 5), vec![Err(()), Ok(b"ok".to_vec())], "skipped in pieces");
    }
}
