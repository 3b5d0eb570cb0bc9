//! Events in: Jetstream JSON lines (`backlinks import`, later the live stream) and repository CARs.
//!
//! Invariants:
//! - A malformed line is counted, reported and skipped; it never stops an import and never
//!   reaches the index.
//! - A line longer than the limit is skipped without being buffered whole.

pub mod backfill;
pub mod car;
pub mod frames;
pub mod http;
pub mod jetstream;
pub mod live;

use crate::index::{Index, IndexError};
use std::io::{BufRead, Read};

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
pub fn import_lines(index: &Index, reader: impl BufRead) -> Result<ImportReport, IndexError> {
    import_lines_with(index, reader, &mut |_| Ok(()))
}

/// `import_lines`, calling `after_flush` after every flush (to compact, say). Each flush but the
/// last runs on a thread of its own while the next lines are parsed and applied (the two cores
/// then share parsing and writing tables); the next flush waits for it, so at most one runs.
pub fn import_lines_with(
    index: &Index,
    mut reader: impl BufRead,
    after_flush: &mut dyn FnMut(&Index) -> Result<(), IndexError>,
) -> Result<ImportReport, IndexError> {
    let mut report = ImportReport::default();
    let mut buf = Vec::with_capacity(64 << 10);
    std::thread::scope(|scope| {
        let mut flushing: Option<std::thread::ScopedJoinHandle<'_, Result<usize, IndexError>>> = None;
        loop {
            match read_bounded_line(&mut reader, &mut buf, MAX_LINE_BYTES)
                .map_err(|source| IndexError::Io { path: "<input>".into(), source })?
            {
                LineRead::Eof => break,
                LineRead::TooLong => {
                    report.lines += 1;
                    report.too_long += 1;
                    report.malformed(report.lines, format!("line longer than {MAX_LINE_BYTES} bytes"));
                }
                LineRead::Line => {
                    report.lines += 1;
                    apply_line(index, &buf, &mut report)?;
                }
            }
            if index.wants_flush() {
                finish_flush(flushing.take(), index, &mut report, after_flush)?;
                let job = index.begin_flush()?;
                flushing = Some(scope.spawn(move || job.finish()));
            }
        }
        finish_flush(flushing.take(), index, &mut report, after_flush)?;
        index.flush()?;
        report.flushes += 1;
        after_flush(index)
    })?;
    Ok(report)
}

/// Waits for a background flush (if any) and counts it.
fn finish_flush(
    job: Option<std::thread::ScopedJoinHandle<'_, Result<usize, IndexError>>>,
    index: &Index,
    report: &mut ImportReport,
    after_flush: &mut dyn FnMut(&Index) -> Result<(), IndexError>,
) -> Result<(), IndexError> {
    let Some(job) = job else { return Ok(()) };
    job.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    report.flushes += 1;
    after_flush(index)
}

fn apply_line(index: &Index, line: &[u8], report: &mut ImportReport) -> Result<(), IndexError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match jetstream::parse_event(line) {
        Ok(event) if event.operation == jetstream::Operation::Skip => report.skipped += 1,
        Ok(event) => {
            index.apply(&event.operation, Some(event.time_us))?;
            report.applied += 1;
        }
        Err(e) => report.malformed(report.lines, e.to_string()),
    }
    Ok(())
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
