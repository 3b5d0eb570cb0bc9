//! The change log and the feed against references: a log read back from every cursor, and a
//! subscriber rebuilding the answer from the events, compared with a model of the records.

use super::PushCounters;
use super::entry::{Change, Entry, Link, PushEvent};
use super::feed::{Feed, FeedOptions};
use super::log::{ChangeLog, LogOptions, LogReader};
use crate::extract::ExtractLimits;
use crate::model::operation::{Operation, RecordOp, RecordRef};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn log_options(segment_bytes: u64) -> LogOptions {
    LogOptions { segment_bytes, retain_us: i64::MAX / 4, max_bytes: u64::MAX, pack: false }
}

fn show(cursor: i64) -> Entry {
    Entry {
        first_cursor: cursor,
        time_us: cursor,
        identity: cursor as u64,
        change: Change::Show { did: format!("did:plc:{cursor}") },
    }
}

fn read_all(log: &ChangeLog, after: i64) -> Vec<i64> {
    let mut reader = LogReader::after(log.shared().clone(), after);
    let mut cursors = vec![];
    while let Some(entry) = reader.next_entry().unwrap() {
        cursors.extend(entry.events().map(|e| e.cursor()).filter(|c| *c > after));
    }
    cursors
}

#[test]
fn readers_start_after_any_cursor_across_segments_and_see_only_what_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = ChangeLog::open(dir.path(), log_options(200)).unwrap();
    let cursors: Vec<i64> = (1..=60).map(|i| i * 10).collect();
    for &cursor in &cursors[..50] {
        log.append(&show(cursor)).unwrap();
        log.publish().unwrap();
    }
    let segments = || std::fs::read_dir(dir.path()).unwrap().count();
    let before = segments();
    for &cursor in &cursors[50..] {
        log.append(&show(cursor)).unwrap();
    }
    // A segment starts only where nothing is pending: what was appended since the last publish
    // is neither read nor split across segments (a crash keeps all of a batch or none).
    assert_eq!(read_all(&log, 0), cursors[..50].to_vec(), "unpublished entries are not read");
    assert!(segments() <= before + 1, "no segment starts within a batch");
    log.publish().unwrap();
    assert!(std::fs::read_dir(dir.path()).unwrap().count() > 5, "several segments");
    for after in [0, 9, 10, 11, 255, 499, 500, 600, 700] {
        let expected: Vec<i64> = cursors.iter().copied().filter(|c| *c > after).collect();
        assert_eq!(read_all(&log, after), expected, "after {after}");
    }
    drop(log);
    let reopened = ChangeLog::open(dir.path(), log_options(200)).unwrap();
    assert_eq!(reopened.last_cursor(), 600);
    assert_eq!(read_all(&reopened, 0), cursors);
}

#[test]
fn a_torn_tail_is_cut_on_open_and_a_bad_frame_is_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = ChangeLog::open(dir.path(), log_options(1 << 20)).unwrap();
    for cursor in 1..=3 {
        log.append(&show(cursor)).unwrap();
    }
    log.publish().unwrap();
    drop(log);
    let segment = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let bytes = std::fs::read(&segment).unwrap();
    std::fs::write(&segment, &bytes[..bytes.len() - 3]).unwrap();
    let mut log = ChangeLog::open(dir.path(), log_options(1 << 20)).unwrap();
    assert_eq!(log.last_cursor(), 2, "the torn third entry is gone");
    log.append(&show(4)).unwrap();
    log.publish().unwrap();
    assert_eq!(read_all(&log, 0), [1, 2, 4]);
    let mut bytes = std::fs::read(&segment).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();
    let mut reader = LogReader::after(log.shared().clone(), 2);
    let error = reader.next_entry().unwrap_err().to_string();
    assert!(error.contains("checksum"), "{error}");
}

#[test]
fn old_segments_go_and_a_reader_from_before_them_starts_at_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions { segment_bytes: 200, retain_us: 100, max_bytes: u64::MAX, pack: false };
    let mut log = ChangeLog::open(dir.path(), options).unwrap();
    for cursor in 1..=100 {
        log.append(&show(cursor * 10)).unwrap();
        log.publish().unwrap();
    }
    let oldest = log.shared().oldest_cursor().unwrap();
    assert!(oldest >= 1000 - 100 - 200, "old segments retired, oldest {oldest}");
    let start = LogReader::start_of(log.shared(), 5);
    assert!(start.from_log_start);
    assert_eq!(read_all(&log, 5).first(), Some(&oldest));
    let start = LogReader::start_of(log.shared(), oldest);
    assert!(!start.from_log_start);
}

/// The files of a log directory with this extension.
fn files_ending(dir: &std::path::Path, extension: &str) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().map(|item| item.unwrap().file_name().into_string().unwrap());
    let mut names: Vec<String> = names.filter(|name| name.ends_with(extension)).collect();
    names.sort();
    names
}

/// Waits (up to 20 s) until the packer has packed every sealed segment: one plain file is left.
fn wait_packed(dir: &std::path::Path) {
    let started = std::time::Instant::now();
    while files_ending(dir, ".log").len() > 1 {
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "sealed segments still plain");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn sealed_segments_are_packed_and_read_as_written_from_any_cursor_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let packing = LogOptions { pack: true, ..log_options(300) };
    let mut log = ChangeLog::open(dir.path(), packing.clone()).unwrap();
    // A reader that starts in the first segment while it is still being written.
    let mut early = LogReader::after(log.shared().clone(), 0);
    let cursors: Vec<i64> = (1..=80).map(|i| i * 10).collect();
    let mut early_read = vec![];
    for &cursor in &cursors {
        log.append(&show(cursor)).unwrap();
        log.publish().unwrap();
        if cursor == 30 {
            while let Some(entry) = early.next_entry().unwrap() {
                early_read.push(entry.first_cursor);
            }
        }
    }
    wait_packed(dir.path());
    let packed = files_ending(dir.path(), ".logz");
    assert!(packed.len() > 5, "{packed:?}");
    assert!(files_ending(dir.path(), ".tmp").is_empty());
    while let Some(entry) = early.next_entry().unwrap() {
        early_read.push(entry.first_cursor);
    }
    assert_eq!(early_read, cursors, "a reader from before the packing reads on");
    for after in [0, 9, 10, 11, 255, 499, 500, 795, 800] {
        let expected: Vec<i64> = cursors.iter().copied().filter(|c| *c > after).collect();
        assert_eq!(read_all(&log, after), expected, "after {after}");
    }
    assert_eq!(log.shared().oldest_cursor(), Some(10));
    let mut positions = LogReader::after(log.shared().clone(), 0);
    while let Some((position, entry)) = positions.next_with_position().unwrap() {
        assert_eq!(log.read_at(position).unwrap().map(|e| e.first_cursor), Some(entry.first_cursor));
    }
    drop(log);
    let mut reopened = ChangeLog::open(dir.path(), packing).unwrap();
    assert_eq!(reopened.last_cursor(), 800);
    reopened.append(&show(810)).unwrap();
    reopened.publish().unwrap();
    assert_eq!(read_all(&reopened, 0), [cursors.clone(), vec![810]].concat());
}

#[test]
fn a_packers_leftovers_are_cleared_on_open_and_a_damaged_block_is_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = ChangeLog::open(dir.path(), log_options(300)).unwrap();
    for cursor in 1..=40 {
        log.append(&show(cursor)).unwrap();
        log.publish().unwrap();
    }
    drop(log);
    let plain = files_ending(dir.path(), ".log");
    assert!(plain.len() > 3);
    // A packer stopped between its rename and its removal, and one stopped before its rename.
    let first = dir.path().join(&plain[0]);
    super::packed::pack(&first, &first.with_extension("logz")).unwrap();
    std::fs::write(dir.path().join(&plain[1]).with_extension("logz.tmp"), b"half").unwrap();
    let log = ChangeLog::open(dir.path(), log_options(300)).unwrap();
    assert_eq!(files_ending(dir.path(), ".logz"), [plain[0].replace(".log", ".logz")]);
    assert_eq!(files_ending(dir.path(), ".log"), plain[1..].to_vec());
    assert!(files_ending(dir.path(), ".tmp").is_empty());
    assert_eq!(read_all(&log, 0), (1..=40).collect::<Vec<i64>>());
    let packed = dir.path().join(plain[0].replace(".log", ".logz"));
    let mut bytes = std::fs::read(&packed).unwrap();
    bytes[20] ^= 0x04;
    std::fs::write(&packed, &bytes).unwrap();
    let error = LogReader::after(log.shared().clone(), 0).next_entry().unwrap_err().to_string();
    assert!(error.contains("checksum"), "zstd's checksum of the block: {error}");
}

#[test]
fn retired_segments_leave_no_file_whether_packed_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions { segment_bytes: 200, retain_us: 100, max_bytes: u64::MAX, pack: true };
    let mut log = ChangeLog::open(dir.path(), options).unwrap();
    for cursor in 1..=200 {
        log.append(&show(cursor * 10)).unwrap();
        log.publish().unwrap();
    }
    wait_packed(dir.path());
    let oldest = log.shared().oldest_segment();
    let numbers = |extension| {
        files_ending(dir.path(), extension).iter().map(|n| n[..10].parse::<u32>().unwrap()).collect::<Vec<_>>()
    };
    let (packed, plain) = (numbers(".logz"), numbers(".log"));
    assert!(packed.iter().chain(&plain).all(|n| *n >= oldest), "{packed:?} {plain:?} from {oldest}");
    assert!(!packed.is_empty());
    assert_eq!(read_all(&log, 0).first(), log.shared().oldest_cursor().as_ref());
}

// --- The feed against a model of records and accounts.

#[derive(Debug, Clone)]
enum Op {
    Put { did: u8, rkey: u8, targets: Vec<u8> },
    Delete { did: u8, rkey: u8 },
    Hide { did: u8, deleted: bool },
    Show { did: u8 },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0u8..6, proptest::collection::vec(0u8..5, 0..4)).prop_map(|(did, rkey, targets)| Op::Put { did, rkey, targets }),
        3 => (0u8..4, 0u8..6).prop_map(|(did, rkey)| Op::Delete { did, rkey }),
        1 => (0u8..4, any::<bool>()).prop_map(|(did, deleted)| Op::Hide { did, deleted }),
        1 => (0u8..4).prop_map(|did| Op::Show { did }),
    ]
}

fn did(i: u8) -> String {
    format!("did:plc:account{i}")
}

fn target(i: u8) -> String {
    format!("at://did:plc:target/app.bsky.feed.post/3k{i}")
}

/// The operation, and whether it is an update of an existing record.
fn operation(op: &Op, exists: bool) -> Operation<'static> {
    let record_ref = |d: u8, r: u8| RecordRef {
        did: did(d).into(),
        collection: "app.example.thing".into(),
        rkey: format!("r{r}").into(),
    };
    match op {
        Op::Put { did: d, rkey, targets } => {
            let items: Vec<serde_json::Value> =
                targets.iter().map(|t| serde_json::json!({ "uri": target(*t) })).collect();
            let record = serde_json::json!({ "$type": "app.example.thing", "items": items });
            let op = RecordOp { record_ref: record_ref(*d, *rkey), record };
            if exists { Operation::Update(op) } else { Operation::Create(op) }
        }
        Op::Delete { did: d, rkey } => Operation::Delete(record_ref(*d, *rkey)),
        Op::Hide { did: d, deleted } => Operation::Account {
            did: did(*d).into(),
            active: false,
            status: Some(if *deleted { "deleted" } else { "deactivated" }.into()),
        },
        Op::Show { did: d } => Operation::Account { did: did(*d).into(), active: true, status: None },
    }
}

/// What a subscriber holds: links, and hidden accounts.
#[derive(Default, Debug)]
struct Rebuilt {
    links: BTreeSet<(String, String, String)>,
    hidden: BTreeSet<String>,
}

impl Rebuilt {
    fn apply(&mut self, event: PushEvent<'_>) {
        match event {
            PushEvent::Link { op, link, source, .. } => {
                let key = (link.target.clone(), source.to_string(), link.location.clone());
                match op {
                    super::entry::LinkOp::Create => self.links.insert(key),
                    super::entry::LinkOp::Delete => self.links.remove(&key),
                };
            }
            PushEvent::Hide { did, .. } => {
                self.hidden.insert(did.to_string());
            }
            PushEvent::Show { did, .. } => {
                self.hidden.remove(did);
            }
        }
    }

    fn answer(&self) -> BTreeSet<(String, String)> {
        let visible = |source: &str| !self.hidden.iter().any(|did| source.starts_with(&format!("at://{did}/")));
        self.links.iter().filter(|(_, s, _)| visible(s)).map(|(t, s, _)| (t.clone(), s.clone())).collect()
    }
}

fn feed_options() -> FeedOptions {
    FeedOptions {
        log: LogOptions { pack: true, ..log_options(4096) },
        extract: ExtractLimits::default(),
        remember_us: 1_000_000,
        max_remembered: 100_000,
        recent_bytes: 64 << 10,
        boot: 1,
    }
}

/// How a feed stops before it is opened again.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// After a sync, closed.
    Clean,
    /// The process dies: nothing is closed, the pages it wrote stay.
    ProcessCrash,
    /// The machine stops: as a process crash, and the machine boots again.
    MachineCrash,
}

impl Stop {
    fn of(i: usize) -> Stop {
        [Stop::Clean, Stop::ProcessCrash, Stop::MachineCrash][i % 3]
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A subscriber from the start, applying every event, holds the model's answer; the stream
    /// replayed from any point adds no entry; a reopened feed carries on.
    #[test]
    fn a_subscriber_applying_the_events_holds_the_models_answer(
        ops in proptest::collection::vec(op_strategy(), 1..80),
        replay_from in 0usize..80,
        reopen_at in 0usize..80,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let counters = Arc::new(PushCounters::default());
        let mut feed = Feed::open(dir.path(), feed_options(), counters.clone()).unwrap();
        let mut records: BTreeMap<(u8, u8), BTreeSet<u8>> = BTreeMap::new();
        let mut hidden: BTreeSet<u8> = BTreeSet::new();
        let mut stream = vec![];
        for (i, op) in ops.iter().enumerate() {
            let exists = match op {
                Op::Put { did, rkey, .. } => records.contains_key(&(*did, *rkey)),
                _ => false,
            };
            stream.push((operation(op, exists), 1_000 + i as i64 * 10, Some(i as u64 + 1)));
            match op {
                Op::Put { did, rkey, targets } => {
                    records.insert((*did, *rkey), targets.iter().copied().collect());
                }
                Op::Delete { did, rkey } => {
                    records.remove(&(*did, *rkey));
                }
                Op::Hide { did, deleted } => {
                    if *deleted {
                        records.retain(|(d, _), _| d != did);
                    }
                    hidden.insert(*did);
                }
                Op::Show { did } => {
                    hidden.remove(did);
                }
            }
        }
        // A restart resumes the stream a little before the last sync (the index's flush, whose
        // cursor is the durable one), so what a crash left uncommitted comes again.
        let mut resumed_at = 0;
        let mut options = feed_options();
        for i in 0..stream.len() {
            if i == reopen_at {
                let stop = Stop::of(i);
                let synced_at = match stop {
                    Stop::Clean => {
                        feed.sync().unwrap();
                        drop(feed);
                        i
                    }
                    // The batch in the log's buffer is lost; the table's slots for it stay.
                    Stop::ProcessCrash | Stop::MachineCrash => {
                        std::mem::forget(feed);
                        0
                    }
                };
                if let Stop::MachineCrash = stop {
                    options.boot += 1;
                }
                feed = Feed::open(dir.path(), options.clone(), counters.clone()).unwrap();
                resumed_at = synced_at.saturating_sub(2);
                for (operation, time_us, rev) in &stream[resumed_at..i] {
                    feed.observe(operation, *time_us, *rev).unwrap();
                }
            }
            let (operation, time_us, rev) = &stream[i];
            feed.observe(operation, *time_us, *rev).unwrap();
        }
        feed.end_batch().unwrap();
        let logged = counters.entries.load(std::sync::atomic::Ordering::Relaxed);
        // A resume (another instance) replays a suffix of the stream from after the restart's
        // resume point: nothing new.
        for (operation, time_us, rev) in &stream[replay_from.max(resumed_at).min(stream.len())..] {
            feed.observe(operation, *time_us, *rev).unwrap();
        }
        feed.end_batch().unwrap();
        prop_assert_eq!(counters.entries.load(std::sync::atomic::Ordering::Relaxed), logged);

        let mut rebuilt = Rebuilt::default();
        let mut reader = LogReader::after(feed.log(), 0);
        let mut last = 0;
        while let Some(entry) = reader.next_entry().unwrap() {
            for event in entry.events() {
                prop_assert!(event.cursor() > last, "cursors increase");
                last = event.cursor();
                rebuilt.apply(event);
            }
        }
        let expected: BTreeSet<(String, String)> = records
            .iter()
            .filter(|((d, _), _)| !hidden.contains(d))
            .flat_map(|((d, r), targets)| {
                let source = format!("at://{}/app.example.thing/r{r}", did(*d));
                targets.iter().map(move |t| (target(*t), source.clone()))
            })
            .collect();
        prop_assert_eq!(rebuilt.answer(), expected);
        // Every link the subscriber holds is a live one (deletes reached it), hidden or not.
        let live: BTreeSet<(String, String)> = records
            .iter()
            .flat_map(|((d, r), targets)| {
                let source = format!("at://{}/app.example.thing/r{r}", did(*d));
                targets.iter().map(move |t| (target(*t), source.clone()))
            })
            .collect();
        let held: BTreeSet<(String, String)> = rebuilt.links.iter().map(|(t, s, _)| (t.clone(), s.clone())).collect();
        prop_assert_eq!(held, live);
    }
}

#[test]
fn an_entry_for_a_link_names_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let mut feed = Feed::open(dir.path(), feed_options(), Arc::new(PushCounters::default())).unwrap();
    let like = serde_json::json!({
        "$type": "app.bsky.feed.like",
        "subject": { "uri": target(1), "cid": "bafyreib2rxk3rh6kzwq" },
        "createdAt": "2024-01-01T00:00:00Z",
    });
    let record_ref = RecordRef { did: did(1).into(), collection: "app.bsky.feed.like".into(), rkey: "3kabc".into() };
    feed.observe(&Operation::Create(RecordOp { record_ref, record: like }), 5, None).unwrap();
    feed.end_batch().unwrap();
    let mut reader = LogReader::after(feed.log(), 0);
    let entry = reader.next_entry().unwrap().unwrap();
    let expected = Link { target: target(1), location: "$.subject".into() };
    match entry.change {
        Change::Links { created, .. } => assert_eq!(created, vec![expected]),
        other => panic!("{other:?}"),
    }
}

/// After a restart, the slots of records whose entries are in segments the log let go are stale
/// from the start: a delete of such a record is unrouted (no lookup counts as bad), and new
/// records take those slots instead of displacing live ones.
#[test]
fn a_reopened_feed_knows_which_segments_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let counters = Arc::new(PushCounters::default());
    let mut options = feed_options();
    options.log.retain_us = 10_000;
    // 256 slots: the 204 keys of the first run and the 104 of the second fit only if the
    // first run's retired ones are free.
    options.recent_bytes = super::recent::MIN_TABLE_BYTES;
    let mut feed = Feed::open(dir.path(), options.clone(), counters.clone()).unwrap();
    for i in 0..200u8 {
        let put = Op::Put { did: i % 4, rkey: i, targets: vec![i % 5] };
        feed.observe(&operation(&put, false), 1_000 * (i as i64 + 1), Some(i as u64 + 1)).unwrap();
        feed.sync().unwrap();
    }
    assert!(feed.log().oldest_segment() > 0, "old segments were let go");
    drop(feed);
    let mut feed = Feed::open(dir.path(), options, counters.clone()).unwrap();
    let delete = Op::Delete { did: 0, rkey: 0 };
    feed.observe(&operation(&delete, false), 1_000_000, Some(1_000)).unwrap();
    let count = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((count(&counters.bad_lookups), count(&counters.unrouted_deletes)), (0, 1));
    // New records before any sync (which would forget the retired segments all the same).
    for i in 0..100u8 {
        let put = Op::Put { did: 4 + i % 4, rkey: i, targets: vec![i % 5] };
        feed.observe(&operation(&put, false), 1_001_000 + i as i64, Some(2_000 + i as u64)).unwrap();
        feed.end_batch().unwrap();
    }
    assert_eq!(count(&counters.recent_displaced), 0, "retired slots were free");
}

/// A process that dies with entries not yet written out leaves no slot leading to them: the
/// account's chain still reaches its older record when the stream replays the lost event and the
/// account is then deleted.
#[test]
fn a_crash_before_the_batch_is_written_leaves_no_slot_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let counters = Arc::new(PushCounters::default());
    let put = |rkey: u8, target: u8| operation(&Op::Put { did: 0, rkey, targets: vec![target] }, false);
    let mut feed = Feed::open(dir.path(), feed_options(), counters.clone()).unwrap();
    feed.observe(&put(1, 1), 1_000, Some(1)).unwrap();
    feed.sync().unwrap();
    feed.observe(&put(2, 2), 2_000, Some(2)).unwrap();
    std::mem::forget(feed);
    let mut feed = Feed::open(dir.path(), feed_options(), counters).unwrap();
    feed.observe(&put(2, 2), 2_000, Some(2)).unwrap();
    feed.observe(&operation(&Op::Hide { did: 0, deleted: true }, false), 3_000, None).unwrap();
    feed.end_batch().unwrap();
    let mut deleted = BTreeSet::new();
    let mut reader = LogReader::after(feed.log(), 0);
    while let Some(entry) = reader.next_entry().unwrap() {
        if let Change::Links { deleted: links, .. } = entry.change {
            deleted.extend(links.into_iter().map(|link| link.target));
        }
    }
    assert_eq!(deleted, BTreeSet::from([target(1), target(2)]), "both records' links removed");
}
