//! Reading an import's input on a thread of its own, a few chunks ahead of the parser.
//!
//! Copying the file out of the page cache was a tenth of the importing thread's time (by
//! profile); on its own thread that copy overlaps the parse, which is the import's bottleneck.
//!
//! Invariants:
//! - The bytes come out exactly as the source gave them, in order: `ReadAhead` is a `BufRead`
//!   whose buffer is the chunk at the head of the queue.
//! - Memory is bounded: `CHUNKS` buffers of `chunk_bytes` each circulate between the two
//!   threads (filled ones to the parser, emptied ones back); nothing else is allocated per read.
//! - A read error is handed over in order, after every byte read before it, and ends the
//!   stream; dropping the `ReadAhead` ends the reading thread at its next hand-over.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Buffers in circulation: one being parsed, the rest being filled or waiting.
const CHUNKS: usize = 4;
/// Smallest and largest chunk.
const MIN_CHUNK_BYTES: usize = 1;
const MAX_CHUNK_BYTES: usize = 64 << 20;

/// One filled buffer; `len == 0` marks the end of the input.
struct Chunk {
    bytes: Vec<u8>,
    len: usize,
}

pub struct ReadAhead {
    filled: Receiver<io::Result<Chunk>>,
    emptied: SyncSender<Vec<u8>>,
    current: Chunk,
    position: usize,
    finished: bool,
}

impl ReadAhead {
    /// Starts reading `source` on a new thread, `chunk_bytes` at a time.
    pub fn spawn(source: impl Read + Send + 'static, chunk_bytes: usize) -> io::Result<Self> {
        let chunk_bytes = chunk_bytes.clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES);
        let (filled_tx, filled) = sync_channel(CHUNKS);
        let (emptied, emptied_rx) = sync_channel(CHUNKS);
        for _ in 0..CHUNKS {
            emptied.send(vec![0u8; chunk_bytes]).expect("the receiver is alive and the channel has room");
        }
        std::thread::Builder::new()
            .name("import-read".into())
            .spawn(move || read_chunks(source, &emptied_rx, &filled_tx))?;
        Ok(ReadAhead { filled, emptied, current: Chunk { bytes: Vec::new(), len: 0 }, position: 0, finished: false })
    }

    /// Gives the exhausted chunk back and takes the next filled one.
    fn next_chunk(&mut self) -> io::Result<()> {
        let spent = std::mem::replace(&mut self.current, Chunk { bytes: Vec::new(), len: 0 });
        if !spent.bytes.is_empty() {
            // The reader is gone only after the end or an error, when no buffer is needed.
            let _ = self.emptied.send(spent.bytes);
        }
        self.position = 0;
        match self.filled.recv() {
            Ok(Ok(chunk)) => {
                self.finished = chunk.len == 0;
                self.current = chunk;
                Ok(())
            }
            Ok(Err(error)) => {
                self.finished = true;
                Err(error)
            }
            Err(_) => {
                self.finished = true;
                Err(io::Error::other("the input reading thread stopped"))
            }
        }
    }
}

/// The reading thread: fill each empty buffer and pass it on, until the end, an error, or
/// the `ReadAhead` is dropped (a channel closes).
fn read_chunks(mut source: impl Read, emptied: &Receiver<Vec<u8>>, filled: &SyncSender<io::Result<Chunk>>) {
    while let Ok(mut bytes) = emptied.recv() {
        let (len, error) = fill(&mut source, &mut bytes);
        // The bytes before an error go first; an empty chunk without one is the end.
        let send_chunk = len > 0 || error.is_none();
        if send_chunk && filled.send(Ok(Chunk { bytes, len })).is_err() {
            return;
        }
        if let Some(error) = error {
            let _ = filled.send(Err(error));
            return;
        }
        if len == 0 {
            return;
        }
    }
}

/// Reads until `bytes` is full, the source ends or it fails; returns how many bytes were read
/// and the error, if any (the bytes before it are still good).
fn fill(source: &mut impl Read, bytes: &mut [u8]) -> (usize, Option<io::Error>) {
    let mut len = 0;
    while len < bytes.len() {
        match source.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return (len, Some(error)),
        }
    }
    assert!(len <= bytes.len());
    (len, None)
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let len = available.len().min(out.len());
        out[..len].copy_from_slice(&available[..len]);
        self.consume(len);
        Ok(len)
    }
}

impl BufRead for ReadAhead {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.position == self.current.len && !self.finished {
            self.next_chunk()?;
        }
        Ok(&self.current.bytes[self.position..self.current.len])
    }

    fn consume(&mut self, amount: usize) {
        assert!(self.position + amount <= self.current.len, "consumed past the chunk");
        self.position += amount;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives its bytes a few at a time, then fails once (if asked), then gives the rest.
    struct Trickle {
        bytes: Vec<u8>,
        position: usize,
        step: usize,
        fail_at: Option<usize>,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.fail_at.is_some_and(|at| self.position >= at) {
                self.fail_at = None;
                return Err(io::Error::other("disk on fire"));
            }
            let end = (self.position + self.step).min(self.bytes.len()).min(self.position + out.len());
            let len = end - self.position;
            out[..len].copy_from_slice(&self.bytes[self.position..end]);
            self.position = end;
            Ok(len)
        }
    }

    fn trickle(bytes: &[u8], step: usize, fail_at: Option<usize>) -> Trickle {
        Trickle { bytes: bytes.to_vec(), position: 0, step, fail_at }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Lines come out as the source holds them, whatever the chunk and read sizes.
        #[test]
        fn lines_read_ahead_equal_the_source(
            lines in proptest::collection::vec("[a-z]{0,40}", 0..200),
            chunk in 1usize..97,
            step in 1usize..50,
        ) {
            let text = lines.join("\n");
            let mut reader = ReadAhead::spawn(trickle(text.as_bytes(), step, None), chunk).unwrap();
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            proptest::prop_assert_eq!(got, text.as_bytes().to_vec());
            let mut again = ReadAhead::spawn(trickle(text.as_bytes(), step, None), chunk).unwrap();
            let split: Vec<String> = (&mut again).lines().map(Result::unwrap).collect();
            proptest::prop_assert_eq!(split, text.lines().map(str::to_string).collect::<Vec<_>>());
        }
    }

    #[test]
    fn an_error_comes_after_the_bytes_read_before_it_and_ends_the_stream() {
        let text = b"first line\nsecond line\nthird line\n";
        // Chunks of 8 read 5 at a time: the second chunk holds 5 bytes when the read at 13 fails.
        let mut reader = ReadAhead::spawn(trickle(text, 5, Some(10)), 8).unwrap();
        let mut got = Vec::new();
        let error = reader.read_to_end(&mut got).unwrap_err();
        assert_eq!(error.to_string(), "disk on fire");
        assert_eq!(got, text[..13].to_vec(), "every byte read before the error");
        assert_eq!(reader.fill_buf().unwrap(), b"", "nothing after the error");
    }

    #[test]
    fn dropping_it_early_stops_the_reading_thread() {
        /// Endless bytes; `alive` is dropped with the source, when the reading thread returns.
        struct Endless {
            _alive: std::sync::Arc<()>,
        }
        impl Read for Endless {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                out.fill(b'x');
                Ok(out.len())
            }
        }
        let alive = std::sync::Arc::new(());
        let mut reader = ReadAhead::spawn(Endless { _alive: alive.clone() }, 1024).unwrap();
        let mut line = Vec::new();
        (&mut reader).take(10_000).read_until(b'\n', &mut line).unwrap();
        assert_eq!(line.len(), 10_000);
        drop(reader);
        // The thread's next hand-over fails and it returns, dropping the source.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::sync::Arc::strong_count(&alive) > 1 {
            assert!(std::time::Instant::now() < deadline, "the reading thread is still running");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
