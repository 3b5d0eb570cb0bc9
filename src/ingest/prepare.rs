//! The importer's parsing thread: Jetstream lines in, operations with their links found out.
//!
//! `backlinks import` was one thread parsing, extracting and writing, while the second core
//! only flushed and merged now and then. Now one thread reads, parses, validates and extracts
//! (`prepare_lines`) and hands batches to the writing thread, which interns strings and fills
//! the memtables (`Batch::apply`).
//!
//! Invariants:
//! - Operations reach the writer in input order, one batch after another, each with its line's
//!   Jetstream time as the cursor; malformed, skipped and overlong lines are counted here and
//!   never reach it.
//! - Memory is bounded: `BATCHES` batches circulate between the threads (filled ones to the
//!   writer, applied ones back, cleared). A batch closes at `MAX_BATCH_OPERATIONS` operations or
//!   once its strings pass `MAX_BATCH_TEXT` bytes; one operation's strings are bounded by its line.
//! - While both threads run, nothing allocated on one is freed on the other: the strings an
//!   operation needs are copied into its batch's one text buffer, which is reused (freeing parsed
//!   JSON values on the other thread costs more than the copy: BENCHMARKS.md).
//! - A writer that fails stops the parser within a line (`stop`), or at its next hand-over.

use super::jetstream;
use super::{ImportReport, LineRead, MAX_LINE_BYTES, read_bounded_line};
use crate::extract::{ExtractLimits, ExtractStats, extract_links};
use crate::index::{Change, FoundLinks, Index, IndexError, NoLinks};
use crate::model::operation::{Operation, RecordRef};
use crate::model::syntax::LinkTarget;
use crate::outline::OutlineKind;
use std::borrow::Cow;
use std::io::BufRead;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};

/// Batches in circulation: one being filled, one being applied, the rest queued.
pub const BATCHES: usize = 4;
/// Operations per batch at most.
pub const MAX_BATCH_OPERATIONS: usize = 1024;
/// A batch closes once its strings pass this many bytes.
pub const MAX_BATCH_TEXT: usize = 1 << 20;

/// A run of bytes in a batch's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create,
    Update,
    Delete,
    Account { active: bool, status: Option<Span> },
}

/// One operation: `record` is (did, collection, rkey); an account change uses only the did.
#[derive(Debug, Clone)]
struct Prepared {
    kind: Kind,
    record: [Span; 3],
    links: Range<usize>,
    stats: ExtractStats,
    time_us: i64,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Record([Span; 3]),
    Did(Span),
    Url(Span),
}

#[derive(Debug, Clone, Copy)]
struct PreparedLink {
    target: Target,
    location: Span,
}

/// Operations ready for the writer, their strings in one buffer.
#[derive(Debug, Default)]
pub struct Batch {
    text: String,
    operations: Vec<Prepared>,
    links: Vec<PreparedLink>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    fn is_full(&self) -> bool {
        self.operations.len() >= MAX_BATCH_OPERATIONS || self.text.len() >= MAX_BATCH_TEXT
    }

    fn clear(&mut self) {
        self.text.clear();
        self.operations.clear();
        self.links.clear();
    }

    /// Adds `operation` (not `Skip`), finding its record's links.
    fn push(&mut self, operation: &Operation<'_>, time_us: i64, limits: &ExtractLimits) {
        let (kind, record, found) = match operation {
            Operation::Create(op) => (Kind::Create, self.record(&op.record_ref), Some(&op.record)),
            Operation::Update(op) => (Kind::Update, self.record(&op.record_ref), Some(&op.record)),
            Operation::Delete(record_ref) => (Kind::Delete, self.record(record_ref), None),
            Operation::Account { did, active, status } => {
                let did = self.span(did);
                let status = status.as_deref().map(|status| self.span(status));
                (Kind::Account { active: *active, status }, [did, did, did], None)
            }
            Operation::Identity { .. } | Operation::Skip => unreachable!("skipped lines are counted, not batched"),
        };
        let first_link = self.links.len();
        let mut stats = ExtractStats::default();
        if let Some(value) = found {
            let extraction = extract_links(value, limits);
            for link in &extraction.links {
                let target = match link.target {
                    LinkTarget::Record { did, collection, rkey } => {
                        Target::Record([self.span(did), self.span(collection), self.span(rkey)])
                    }
                    LinkTarget::Did(did) => Target::Did(self.span(did)),
                    LinkTarget::Url(url) => Target::Url(self.span(url)),
                };
                let location = self.span(&link.location);
                self.links.push(PreparedLink { target, location });
            }
            stats = extraction.stats;
        }
        let links = first_link..self.links.len();
        self.operations.push(Prepared { kind, record, links, stats, time_us });
    }

    fn record(&mut self, record_ref: &RecordRef<'_>) -> [Span; 3] {
        [self.span(&record_ref.did), self.span(&record_ref.collection), self.span(&record_ref.rkey)]
    }

    /// Copies `text` in (a line's strings, each far below 4 GiB in total: the line is bounded).
    fn span(&mut self, text: &str) -> Span {
        let start = self.text.len();
        self.text.push_str(text);
        let end = self.text.len();
        assert!(end <= u32::MAX as usize, "batch text beyond 4 GiB");
        Span { start: start as u32, end: end as u32 }
    }

    fn str(&self, span: Span) -> &str {
        &self.text[span.start as usize..span.end as usize]
    }

    /// Applies every operation in order, calling `after_each` after each (to start a flush).
    pub fn apply(
        &self,
        index: &Index,
        after_each: &mut dyn FnMut() -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        index.outlines.warm(OutlineKind::Did, self.dids())?;
        for operation in &self.operations {
            self.apply_one(index, operation)?;
            after_each()?;
        }
        Ok(())
    }

    /// Every DID the batch's operations name (their repositories and their links' targets).
    fn dids(&self) -> impl Iterator<Item = &str> {
        let repositories = self.operations.iter().map(|operation| operation.record[0]);
        let targets = self.links.iter().filter_map(|link| match link.target {
            Target::Record([did, _, _]) | Target::Did(did) => Some(did),
            Target::Url(_) => None,
        });
        repositories.chain(targets).map(|span| self.str(span))
    }

    fn apply_one(&self, index: &Index, operation: &Prepared) -> Result<(), IndexError> {
        let cursor = Some(operation.time_us);
        let [did, collection, rkey] = operation.record.map(|span| Cow::Borrowed(self.str(span)));
        let record_ref = RecordRef { did, collection, rkey };
        let links =
            self.links[operation.links.clone()].iter().map(|link| (self.target(link.target), self.str(link.location)));
        let found = FoundLinks { links, stats: operation.stats.clone() };
        match operation.kind {
            Kind::Create => index.apply_extracted(Change::Create(&record_ref, found), cursor),
            Kind::Update => index.apply_extracted(Change::Update(&record_ref, found), cursor),
            Kind::Delete => index.apply_extracted::<NoLinks<'_>>(Change::Delete(&record_ref), cursor),
            Kind::Account { active, status } => {
                let status = status.map(|span| self.str(span));
                let change = Change::Account { did: self.str(operation.record[0]), active, status };
                index.apply_extracted::<NoLinks<'_>>(change, cursor)
            }
        }
    }

    fn target(&self, target: Target) -> LinkTarget<'_> {
        match target {
            Target::Record([did, collection, rkey]) => {
                LinkTarget::Record { did: self.str(did), collection: self.str(collection), rkey: self.str(rkey) }
            }
            Target::Did(did) => LinkTarget::Did(self.str(did)),
            Target::Url(url) => LinkTarget::Url(self.str(url)),
        }
    }
}

/// The parsing thread: reads every line of `reader`, sends filled batches on `filled` (taking
/// empty ones from `emptied`) and returns its part of the report. Stops early, without error,
/// once `stop` is set or the writer hangs up (it failed and says why itself). On a read error
/// the operations parsed before it are still handed over, then the error is returned.
pub fn prepare_lines(
    mut reader: impl BufRead,
    limits: &ExtractLimits,
    stop: &AtomicBool,
    emptied: &Receiver<Batch>,
    filled: &SyncSender<Batch>,
) -> std::io::Result<ImportReport> {
    let mut report = ImportReport::default();
    let mut line = Vec::with_capacity(64 << 10);
    let Ok(mut batch) = emptied.recv() else { return Ok(report) };
    while !stop.load(Ordering::Relaxed) {
        let read = match read_bounded_line(&mut reader, &mut line, MAX_LINE_BYTES) {
            Ok(read) => read,
            Err(error) => {
                let _ = filled.send(batch);
                return Err(error);
            }
        };
        match read {
            LineRead::Eof => break,
            LineRead::TooLong => {
                report.lines += 1;
                report.too_long += 1;
                report.malformed(report.lines, format!("line longer than {MAX_LINE_BYTES} bytes"));
            }
            LineRead::Line => {
                report.lines += 1;
                prepare_line(&line, &mut batch, &mut report, limits);
            }
        }
        if batch.is_full() {
            let Some(next) = hand_over(batch, emptied, filled) else { return Ok(report) };
            batch = next;
        }
    }
    if !batch.is_empty() {
        let _ = filled.send(batch);
    }
    Ok(report)
}

/// Sends `batch` to the writer and takes back an empty one; `None` once the writer is gone.
fn hand_over(batch: Batch, emptied: &Receiver<Batch>, filled: &SyncSender<Batch>) -> Option<Batch> {
    filled.send(batch).ok()?;
    let mut next = emptied.recv().ok()?;
    next.clear();
    Some(next)
}

fn prepare_line(line: &[u8], batch: &mut Batch, report: &mut ImportReport, limits: &ExtractLimits) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    match jetstream::parse_event(line) {
        Ok(event) if !event.operation.writes() => report.skipped += 1,
        Ok(event) => batch.push(&event.operation, event.time_us, limits),
        Err(e) => report.malformed(report.lines, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexOptions;
    use crate::ingest::import_lines;
    use crate::model::ids::{Backlink, Revocation};

    fn did(i: usize) -> String {
        format!("did:plc:{:024}", i % 97)
    }

    fn commit(i: usize, operation: &str, record: Option<serde_json::Value>) -> String {
        let mut commit = serde_json::json!({
            "rev": "3mmoojp7vgo2g", "operation": operation, "collection": "app.bsky.feed.post",
            "rkey": format!("3mmoojp{:06}", i % 5000).replace('0', "a"),
        });
        if let Some(record) = record {
            commit["record"] = record;
        }
        serde_json::json!({ "did": did(i), "time_us": 1_779_719_009_000_000_i64 + i as i64, "kind": "commit", "commit": commit })
            .to_string()
    }

    /// Creates with several links (strong refs, mentions, escaped and non-ASCII strings), updates,
    /// deletes, account changes, identity events, blank, malformed and overlong lines.
    fn lines() -> String {
        let golden = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jetstream/golden_v1.jsonl"),
        )
        .unwrap();
        let mut lines: Vec<String> = golden.lines().map(str::to_string).collect();
        for i in 0..3_000 {
            let parent = format!("at://{}/app.bsky.feed.post/3mmoojp4cd223", did(i * 7));
            let record = serde_json::json!({
                "$type": "app.bsky.feed.post", "text": format!("caf\u{e9} \"{i}\""),
                "reply": { "parent": { "uri": parent, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em" } },
                "facets": [{ "features": [{ "$type": "app.bsky.richtext.facet#mention", "did": did(i * 3) }] }],
            });
            lines.push(match i % 10 {
                0 => commit(i, "delete", None),
                1 => commit(i, "update", Some(record)),
                2 => serde_json::json!({ "did": did(i), "time_us": 5, "kind": "account",
                    "account": { "active": i % 20 == 2, "did": did(i), "seq": 1, "time": "2026-05-25T14:23:28.778Z",
                                 "status": if i % 40 == 12 { "deleted" } else { "deactivated" } } })
                .to_string(),
                3 => serde_json::json!({ "did": did(i), "time_us": 6, "kind": "identity",
                    "identity": { "did": did(i), "seq": 2, "time": "2026-05-25T14:23:28.778Z" } })
                .to_string(),
                4 if i % 100 == 4 => "{not json".to_string(),
                5 if i % 100 == 5 => String::new(),
                _ => commit(i, "create", Some(record)),
            });
        }
        lines.push("x".repeat(MAX_LINE_BYTES + 1));
        lines.push(commit(9_999, "create", Some(serde_json::json!({ "$type": "app.bsky.feed.like",
            "subject": { "uri": format!("at://{}/app.bsky.feed.post/3mmoojp4cd223", did(1)), "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em" } }))));
        lines.join("\n")
    }

    /// Every entry of every table of `tree`, read from the local table files.
    fn everything<E: crate::lsm::entry::Entry>(tree: &crate::lsm::tree::Tree<E>) -> Vec<E> {
        let mut entries = Vec::new();
        for table in tree.tables() {
            let meta = std::fs::read(tree.local_path(&table.record.id, "meta")).unwrap();
            let meta = crate::lsm::table::TableMeta::<E>::decode(&meta).unwrap();
            let data = std::fs::read(tree.local_path(&table.record.id, "data")).unwrap();
            crate::lsm::table::decode_frames(&meta, 0..meta.frames.len(), &data, &mut entries).unwrap();
        }
        entries
    }

    /// The two-thread import writes exactly what applying each parsed line in turn writes.
    #[test]
    fn the_pipeline_writes_what_applying_each_line_writes() {
        let text = lines();
        let (piped_dir, direct_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open = |dir: &tempfile::TempDir| crate::index::open_in_dir(dir.path(), IndexOptions::default());
        let (piped, direct) = (open(&piped_dir), open(&direct_dir));
        let report = import_lines(&piped, text.as_bytes()).unwrap();
        let (mut applied, mut skipped, mut malformed) = (0, 0, 0);
        for line in text.lines().filter(|line| line.len() <= MAX_LINE_BYTES && !line.trim().is_empty()) {
            match jetstream::parse_event(line.as_bytes()) {
                Ok(event) if !event.operation.writes() => skipped += 1,
                Ok(event) => {
                    applied += 1;
                    direct.apply(&event.operation, Some(event.time_us)).unwrap();
                }
                Err(_) => malformed += 1,
            }
        }
        direct.flush().unwrap();
        assert_eq!((report.applied, report.skipped, report.malformed), (applied, skipped, malformed + 1));
        assert!(applied > 2 * MAX_BATCH_OPERATIONS as u64, "several batches");
        assert!(skipped >= 300 && malformed >= 30 && report.too_long == 1, "every kind of line was seen");
        assert_eq!(piped.position(), direct.position());
        let (piped_links, direct_links): (Vec<Backlink>, Vec<Backlink>) =
            (everything(&piped.links), everything(&direct.links));
        // About half the links written die before the flush (their accounts are deleted later in
        // the stream), and a flush writes no backlink that its own revocations kill.
        assert!(piped_links.len() > 2_000, "replies and mentions were indexed: {}", piped_links.len());
        assert_eq!(piped_links, direct_links);
        let (piped_revocations, direct_revocations): (Vec<Revocation>, Vec<Revocation>) =
            (everything(&piped.thresholds), everything(&direct.thresholds));
        assert_eq!(piped_revocations, direct_revocations);
        for i in 0..97 {
            assert_eq!(piped.account_state(&did(i)).unwrap(), direct.account_state(&did(i)).unwrap());
        }
        let counters = |index: &Index| {
            let c = &index.counters;
            [&c.backlinks, &c.revocations, &c.links_collection_only, &c.links_handle_authority, &c.links_over_limit]
                .map(|counter| counter.load(std::sync::atomic::Ordering::Relaxed))
        };
        assert_eq!(counters(&piped), counters(&direct));
    }
}
