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
use std::io::BufRead;

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
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(match (read_any, too_long) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        read_any = true;
        let (chunk, consumed, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long && buf.len() + chunk.len() <= max {
            buf.extend_from_slice(chunk);
        } else {
            too_long = true;
            buf.clear();
        }
        reader.consume(consumed);
        if done {
            return Ok(if too_long { LineRead::TooLong } else { LineRead::Line });
        }
    }
}

/// Applies every event of a Jetstream v1 JSON-lines stream in order, flushing when a memtable is
/// full and once at the end.
pub fn import_lines(index: &Index, reader: impl BufRead) -> Result<ImportReport, IndexError> {
    import_lines_with(index, reader, &mut |_| Ok(()))
}

/// `import_lines`, calling `after_flush` after every flush (to compact, say).
pub fn import_lines_with(
    index: &Index,
    mut reader: impl BufRead,
    after_flush: &mut dyn FnMut(&Index) -> Result<(), IndexError>,
) -> Result<ImportReport, IndexError> {
    let mut report = ImportReport::default();
    let mut buf = Vec::with_capacity(64 << 10);
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
            index.flush()?;
            report.flushes += 1;
            after_flush(index)?;
        }
    }
    index.flush()?;
    report.flushes += 1;
    after_flush(index)?;
    Ok(report)
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
    }
}
