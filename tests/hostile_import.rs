//! Hostile input never crashes an import or corrupts the index: truncated JSON, invalid URIs,
//! 1,000-deep nesting, 100,000 links in one record, non-UTF-8 bytes and huge lines are counted and
//! skipped (or bounded), and the valid events around them are indexed exactly.

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::{MAX_LINE_BYTES, import_lines};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use std::sync::Arc;

const POST: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";

fn like(author: &str, rkey: &str) -> String {
    format!(
        r#"{{"did":"{author}","time_us":1,"kind":"commit","commit":{{"rev":"3mmoojp7vgo2g","operation":"create","collection":"app.bsky.feed.like","rkey":"{rkey}","record":{{"$type":"app.bsky.feed.like","subject":{{"cid":"bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em","uri":"{POST}"}}}}}}}}"#
    )
}

fn commit_with_record(rkey: &str, record: &str) -> String {
    format!(
        r#"{{"did":"did:plc:hostilehostilehostileaaa","time_us":2,"kind":"commit","commit":{{"operation":"create","collection":"com.example.hostile","rkey":"{rkey}","record":{record}}}}}"#
    )
}

fn deep_record(depth: usize) -> String {
    let mut record = String::from(r#"{"a":"#);
    for _ in 0..depth {
        record.push_str(r#"{"a":"#);
    }
    record.push_str(r#""did:plc:deepdeepdeepdeepdeepdeep""#);
    for _ in 0..=depth {
        record.push('}');
    }
    record
}

fn many_links_record(n: usize) -> String {
    let links: Vec<String> = (0..n).map(|i| format!(r#""did:plc:{i:024}""#)).collect();
    format!(r#"{{"many":[{}]}}"#, links.join(","))
}

#[test]
fn hostile_lines_are_counted_and_valid_lines_around_them_are_indexed() {
    let mut input: Vec<u8> = Vec::new();
    let mut push = |line: &[u8]| {
        input.extend_from_slice(line);
        input.push(b'\n');
    };
    push(like("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "3mmoojp7etg2a").as_bytes());
    // Malformed: truncated JSON, non-UTF-8, invalid DID / rkey / collection, a 1,000-deep record.
    let truncated = like("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", "3mmoojp7etg2b");
    push(&truncated.as_bytes()[..truncated.len() / 2]);
    push(b"\xff\xfe\xfd{\"did\":\"did:plc:x\"}");
    let mut bad_utf8 = like("did:plc:cccccccccccccccccccccccc", "3mmoojp7etg2c").into_bytes();
    bad_utf8[40] = 0xC3; // a lone UTF-8 lead byte inside a string
    push(&bad_utf8);
    push(like("did:plc:", "3mmoojp7etg2d").as_bytes());
    push(like("did:plc:dddddddddddddddddddddddd", "../../etc").as_bytes());
    push(commit_with_record("3mmoojp7etg2e", &deep_record(1000)).as_bytes());
    // A huge line: skipped without being buffered whole.
    let mut huge = like("did:plc:eeeeeeeeeeeeeeeeeeeeeeee", "3mmoojp7etg2f").into_bytes();
    huge.extend(std::iter::repeat_n(b' ', MAX_LINE_BYTES));
    push(&huge);
    // Valid but bounded: 100,000 links in one record (indexed up to the link limit).
    push(commit_with_record("3mmoojp7etg2g", &many_links_record(100_000)).as_bytes());
    // Invalid URIs inside a valid record are simply not links.
    push(commit_with_record("3mmoojp7etg2h", r#"{"a":"at://","b":"at://did:plc:/x/y","c":"did:","d":"at://handle.example/app.bsky.feed.post/3mmoodizfwc2j"}"#).as_bytes());
    push(like("did:plc:ffffffffffffffffffffffff", "3mmoojp7etg2i").as_bytes());

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DirStore::new(dir.path().join("bucket")));
    let index = Index::open(dir.path(), store, IndexOptions::default(), 3).unwrap();
    let report = import_lines(&index, input.as_slice()).unwrap();
    assert_eq!(report.lines, 11);
    assert_eq!(report.malformed, 7, "{:?}", report.examples);
    assert_eq!(report.too_long, 1);
    assert_eq!(report.applied, 4);
    assert_eq!(index.counters.links_over_limit.load(std::sync::atomic::Ordering::Relaxed), 100_000 - 512);
    assert_eq!(index.counters.links_handle_authority.load(std::sync::atomic::Ordering::Relaxed), 1);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let page = runtime.block_on(list_backlinks(&index, &ListParams::new(POST))).unwrap();
    let sources: Vec<&str> = page.items.iter().map(|(_, uri)| uri.as_str()).collect();
    assert_eq!(
        sources,
        [
            "at://did:plc:ffffffffffffffffffffffff/app.bsky.feed.like/3mmoojp7etg2i",
            "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.like/3mmoojp7etg2a",
        ]
    );
    let first = runtime.block_on(list_backlinks(&index, &ListParams::new(format!("did:plc:{:024}", 0)))).unwrap();
    assert_eq!(first.items.len(), 1);
    let dropped =
        runtime.block_on(list_backlinks(&index, &ListParams::new(format!("did:plc:{:024}", 99_999)))).unwrap();
    assert!(dropped.items.is_empty(), "links past the per-record limit are not indexed");
}
