//! The HTTP surface in process (tower `oneshot` on the real router): every endpoint with normal
//! answers, bad parameters, unknown targets, limit bounds and cursor round trips; the manners
//! (CORS, Cache-Control, compression, no `Accept` needed); and the concurrency cap and timeout,
//! held with a store that blocks reads until the test lets them go.
//!
//! The index is the real Jetstream capture plus a synthetic hot post: 25 likes from 5 accounts
//! and 3 reposts, enough to page through.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::metrics::Metrics;
use backlinks::model::tid::format_tid;
use backlinks::server::{ServerOptions, app};
use backlinks::store::dir::DirStore;
use backlinks::store::object::{ObjectInfo, Store, StoreError};
use bytes::Bytes;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";
const LIKED: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
const LIKE: &str = "at://did:plc:mcc5yghbk7tixqryac2yxku7/app.bsky.feed.like/3mmoojp7etg2g";
const REPLIED: &str = "at://did:plc:j76trmiofvaxxpvx2vnb2vwf/app.bsky.feed.post/3mmojbrjwbs26";
const FOLLOWED: &str = "did:plc:anc6s2kher6ltrhhglxrzxsa";
const FOLLOW: &str = "at://did:plc:mxwlsvdgs6tn75lq6jrr2vp7/app.bsky.graph.follow/3mmoojocxvr2s";
const HOT: &str = "at://did:plc:hhhhhhhhhhhhhhhhhhhhhhhh/app.bsky.feed.post/3kaaaaaaaaaaa";
const UNKNOWN: &str = "at://did:plc:zzzzzzzzzzzzzzzzzzzzzzzz/app.bsky.feed.post/3kaaaaaaaaaaa";
const HOT_LIKES: usize = 25;
const HOT_REPOSTS: usize = 3;

fn liker(i: usize) -> String {
    format!("did:plc:{}", std::iter::repeat_n((b'a' + (i % 5) as u8) as char, 24).collect::<String>())
}

fn hot_lines() -> String {
    let mut lines = String::new();
    let strong_ref = json!({"uri": HOT, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"});
    for i in 0..HOT_LIKES + HOT_REPOSTS {
        let collection = if i < HOT_LIKES { "app.bsky.feed.like" } else { "app.bsky.feed.repost" };
        let event = json!({
            "did": liker(i), "time_us": 1_779_719_020_000_000u64 + i as u64, "kind": "commit",
            "commit": {"rev": "3mmoojqaaaa2a", "operation": "create", "collection": collection,
                       "rkey": format_tid(1_700_000_000_000_000 + i as u64 * 1000),
                       "record": {"$type": collection, "subject": strong_ref, "createdAt": "2026-05-25T14:23:28.778Z"}}
        });
        lines.push_str(&event.to_string());
        lines.push('\n');
    }
    lines
}

fn hot_uri(i: usize) -> String {
    let collection = if i < HOT_LIKES { "app.bsky.feed.like" } else { "app.bsky.feed.repost" };
    format!("at://{}/{collection}/{}", liker(i), format_tid(1_700_000_000_000_000 + i as u64 * 1000))
}

/// Imports the capture and the hot post into `dir/data`, publishing to `dir/bucket`.
async fn import_into(dir: &Path) {
    let store = Arc::new(DirStore::new(dir.join("bucket")));
    let index = Index::open(&dir.join("data"), store, IndexOptions::default(), 1).unwrap();
    let text = std::fs::read_to_string(CAPTURE).unwrap() + &hot_lines();
    let report = import_lines(&index, std::io::Cursor::new(text)).unwrap();
    assert_eq!(report.applied, 9 + (HOT_LIKES + HOT_REPOSTS) as u64);
    index.publish_manifest().await.unwrap();
}

fn open(dir: &Path, store: Arc<dyn Store>) -> Arc<Index> {
    let options = IndexOptions { read_only: true, ..IndexOptions::default() };
    Arc::new(Index::open(&dir.join("data"), store, options, 2).unwrap())
}

async fn server_with(options: ServerOptions) -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().unwrap();
    import_into(dir.path()).await;
    let index = open(dir.path(), Arc::new(DirStore::new(dir.path().join("bucket"))));
    (dir, app(index, options, Arc::new(Metrics::new())))
}

async fn server() -> (tempfile::TempDir, Router) {
    server_with(ServerOptions::default()).await
}

async fn send(router: &Router, request: Request<Body>) -> Response<Body> {
    router.clone().oneshot(request).await.unwrap()
}

async fn body_bytes(response: Response<Body>) -> Bytes {
    axum::body::to_bytes(response.into_body(), 16 << 20).await.unwrap()
}

/// GET `uri`; returns (status, JSON body).
async fn get(router: &Router, uri: &str) -> (StatusCode, Value) {
    let response = send(router, Request::get(uri).body(Body::empty()).unwrap()).await;
    let status = response.status();
    let bytes = body_bytes(response).await;
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{uri}: {e}: {bytes:?}")))
}

fn query(path: &str, pairs: &[(&str, &str)]) -> String {
    let encoded = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    format!("{path}?{encoded}")
}

const LIST: &str = "/xrpc/blue.cerulea.backlinks.listBacklinks";
const COUNT: &str = "/xrpc/blue.cerulea.backlinks.countBacklinks";
const GET_BACKLINKS: &str = "/xrpc/blue.microcosm.links.getBacklinks";
const GET_COUNT: &str = "/xrpc/blue.microcosm.links.getBacklinksCount";
const GET_DIDS: &str = "/xrpc/blue.microcosm.links.getBacklinkDids";

async fn assert_invalid(router: &Router, uri: &str, word: &str) {
    let (status, body) = get(router, uri).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    assert_eq!(body["error"], "InvalidRequest", "{uri}");
    let message = body["message"].as_str().unwrap();
    assert!(message.to_lowercase().contains(word), "{uri}: message {message:?} should mention {word}");
}

#[tokio::test]
async fn list_answers_pages_and_rejects_bad_parameters() {
    let (_dir, router) = server().await;
    let (status, body) = get(&router, &query(LIST, &[("target", LIKED)])).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"backlinks": {"$.subject": [LIKE]}, "cursor": null})));
    let (status, body) = get(&router, &query(LIST, &[("target", UNKNOWN)])).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"backlinks": {}, "cursor": null})));

    // Limit bounds: 1 gives one item and a cursor, 1000 everything.
    let (_, one) = get(&router, &query(LIST, &[("target", HOT), ("limit", "1")])).await;
    assert_eq!(one["backlinks"]["$.subject"], json!([hot_uri(HOT_LIKES + HOT_REPOSTS - 1)]));
    assert!(one["cursor"].is_string());
    let (_, all) = get(&router, &query(LIST, &[("target", HOT), ("limit", "1000")])).await;
    assert_eq!(all["backlinks"]["$.subject"].as_array().unwrap().len(), HOT_LIKES + HOT_REPOSTS);
    assert_eq!(all["cursor"], Value::Null);

    // Cursor round trips, both directions: every backlink exactly once, in order.
    for reverse in ["false", "true"] {
        let mut seen = Vec::new();
        let mut cursor = String::new();
        for _ in 0..10 {
            let uri = query(LIST, &[("target", HOT), ("limit", "10"), ("reverse", reverse), ("cursor", &cursor)]);
            let (status, page) = get(&router, &uri).await;
            assert_eq!(status, StatusCode::OK);
            seen.extend(
                page["backlinks"]["$.subject"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()),
            );
            match page["cursor"].as_str() {
                Some(next) => cursor = next.to_string(),
                None => break,
            }
        }
        let mut expected: Vec<String> = (0..HOT_LIKES + HOT_REPOSTS).map(hot_uri).collect();
        if reverse == "false" {
            expected.reverse();
        }
        assert_eq!(seen, expected, "reverse={reverse}");
    }

    for (uri, word) in [
        (LIST.to_string(), "target"),
        (query(LIST, &[("target", "ftp://example.com")]), "target"),
        (query(LIST, &[("target", LIKED), ("limit", "0")]), "limit"),
        (query(LIST, &[("target", LIKED), ("limit", "1001")]), "limit"),
        (query(LIST, &[("target", LIKED), ("cursor", "zz")]), "cursor"),
        (query(LIST, &[("target", LIKED), ("reverse", "maybe")]), "reverse"),
        (query(LIST, &[("target", LIKED), ("location", "subject")]), "location"),
    ] {
        assert_invalid(&router, &uri, word).await;
    }
    let too_many = format!("{LIST}?target={}{}", "did:plc:x", "&x=1".repeat(300));
    assert_invalid(&router, &too_many, "at most 256").await;
}

#[tokio::test]
async fn count_matches_the_enumeration_and_rejects_bad_parameters() {
    let (_dir, router) = server().await;
    let (status, body) = get(&router, &query(COUNT, &[("target", REPLIED)])).await;
    let expected = json!({"total": 2, "byLocation": {"$.reply.parent": 1, "$.reply.root": 1}, "approximate": false});
    assert_eq!((status, body), (StatusCode::OK, expected));
    let (_, hot) = get(&router, &query(COUNT, &[("target", HOT)])).await;
    assert_eq!(hot, json!({"total": 28, "byLocation": {"$.subject": 28}, "approximate": false}));
    let (_, likes) = get(&router, &query(COUNT, &[("target", HOT), ("collection", "app.bsky.feed.like")])).await;
    assert_eq!(likes["total"], 25);
    let (_, parents) = get(&router, &query(COUNT, &[("target", REPLIED), ("location", "$.reply.parent")])).await;
    assert_eq!(parents, json!({"total": 1, "byLocation": {"$.reply.parent": 1}, "approximate": false}));
    // Paging parameters do not apply to a count, so even invalid ones are ignored.
    let (status, _) = get(&router, &query(COUNT, &[("target", HOT), ("limit", "0")])).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = get(&router, &query(COUNT, &[("target", UNKNOWN)])).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"total": 0, "byLocation": {}, "approximate": false})));
    assert_invalid(&router, COUNT, "target").await;
    assert_invalid(&router, &query(COUNT, &[("target", "nope")]), "target").await;
    assert_invalid(&router, &query(COUNT, &[("target", HOT), ("collection", "a b")]), "collection").await;
}

#[tokio::test]
async fn a_small_scan_limit_makes_counts_approximate() {
    let options = ServerOptions { count: backlinks::count::CountOptions { exact_scan_limit: 5 }, ..Default::default() };
    let (_dir, router) = server_with(options).await;
    let (_, hot) = get(&router, &query(COUNT, &[("target", HOT)])).await;
    assert_eq!(hot["approximate"], true, "{hot}");
    let source = [("subject", HOT), ("source", "app.bsky.feed.like:subject.uri")];
    let (_, count) = get(&router, &query(GET_COUNT, &source)).await;
    assert_eq!(count["approximate"], true, "{count}");
    // The DID list of a target too hot to read whole: pages distinct within themselves, an
    // estimated total, and a cursor to go on.
    let (_, dids) = get(&router, &query(GET_DIDS, &[source[0], source[1], ("limit", "3")])).await;
    assert_eq!(dids["approximate"], true, "{dids}");
    assert_eq!(dids["linking_dids"].as_array().unwrap().len(), 3, "{dids}");
    assert!(dids["total"].as_u64().unwrap() >= 3 && dids["cursor"].is_string(), "{dids}");
}

#[tokio::test]
async fn constellation_get_backlinks() {
    let (_dir, router) = server().await;
    let like =
        json!({"did": "did:plc:mcc5yghbk7tixqryac2yxku7", "collection": "app.bsky.feed.like", "rkey": "3mmoojp7etg2g"});
    for source in ["app.bsky.feed.like:subject.uri", "app.bsky.feed.like:.subject.uri"] {
        let (status, body) = get(&router, &query(GET_BACKLINKS, &[("subject", LIKED), ("source", source)])).await;
        assert_eq!((status, body), (StatusCode::OK, json!({"total": 1, "records": [like], "cursor": null})));
    }
    let follow = [("subject", FOLLOWED), ("source", "app.bsky.graph.follow:subject")];
    let (_, body) = get(&router, &query(GET_BACKLINKS, &follow)).await;
    assert_eq!(body["records"][0]["rkey"], FOLLOW.rsplit('/').next().unwrap());
    assert_eq!(body["total"], 1);
    // The did filter: only the liker's own link, or nothing.
    let mine =
        [("subject", LIKED), ("source", "app.bsky.feed.like:subject.uri"), ("did", "did:plc:mcc5yghbk7tixqryac2yxku7")];
    assert_eq!(get(&router, &query(GET_BACKLINKS, &mine)).await.1["total"], 1);
    let other =
        [("subject", LIKED), ("source", "app.bsky.feed.like:subject.uri"), ("did", "did:plc:anc6s2kher6ltrhhglxrzxsa")];
    assert_eq!(get(&router, &query(GET_BACKLINKS, &other)).await.1, json!({"total": 0, "records": [], "cursor": null}));
    // Wrong collection or unknown subject: empty.
    let wrong = [("subject", LIKED), ("source", "app.bsky.feed.repost:subject.uri")];
    assert_eq!(get(&router, &query(GET_BACKLINKS, &wrong)).await.1, json!({"total": 0, "records": [], "cursor": null}));
    let unknown = [("subject", UNKNOWN), ("source", "app.bsky.feed.like:subject.uri")];
    let (status, body) = get(&router, &query(GET_BACKLINKS, &unknown)).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"total": 0, "records": [], "cursor": null})));

    // Constellation's default limit (100) takes the 25 likes at once.
    let hot = [("subject", HOT), ("source", "app.bsky.feed.like:subject.uri")];
    let (_, all) = get(&router, &query(GET_BACKLINKS, &hot)).await;
    assert_eq!((all["records"].as_array().unwrap().len(), &all["cursor"]), (HOT_LIKES, &Value::Null));
    // limit=0: the total alone, and no cursor to loop on.
    let (_, none) = get(&router, &query(GET_BACKLINKS, &[hot[0], hot[1], ("limit", "0")])).await;
    assert_eq!(none, json!({"total": 25, "records": [], "cursor": null}));
    // Pages of 16: a cursor round trip over the 25 likes, newest first.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for round in 0..5 {
        let params = [hot[0], hot[1], ("limit", "16"), ("cursor", cursor.as_str())];
        let (_, page) = get(&router, &query(GET_BACKLINKS, &params)).await;
        assert_eq!(page["total"], 25);
        let records = page["records"].as_array().unwrap();
        assert_eq!(records.len(), if round == 0 { 16 } else { 9 });
        seen.extend(records.iter().map(|r| {
            format!(
                "at://{}/{}/{}",
                r["did"].as_str().unwrap(),
                r["collection"].as_str().unwrap(),
                r["rkey"].as_str().unwrap()
            )
        }));
        match page["cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    let expected: Vec<String> = (0..HOT_LIKES).rev().map(hot_uri).collect();
    assert_eq!(seen, expected);

    let (_, max) = get(&router, &query(GET_BACKLINKS, &[hot[0], hot[1], ("limit", "1000")])).await;
    assert_eq!(max["records"].as_array().unwrap().len(), 25);
    let (_, one) = get(&router, &query(GET_BACKLINKS, &[hot[0], hot[1], ("limit", "1"), ("reverse", "true")])).await;
    assert_eq!(one["records"][0]["rkey"], format_tid(1_700_000_000_000_000));
    for (uri, word) in [
        (query(GET_BACKLINKS, &[("source", "app.bsky.feed.like:subject.uri")]), "subject"),
        (query(GET_BACKLINKS, &[("subject", HOT)]), "source"),
        (query(GET_BACKLINKS, &[("subject", HOT), ("source", "app.bsky.feed.like")]), "source"),
        (query(GET_BACKLINKS, &[("subject", "bad"), ("source", "a.b.c:x")]), "subject"),
        (query(GET_BACKLINKS, &[hot[0], hot[1], ("limit", "-1")]), "limit"),
        (query(GET_BACKLINKS, &[hot[0], hot[1], ("limit", "1001")]), "limit"),
        (query(GET_BACKLINKS, &[hot[0], hot[1], ("did", "alice")]), "did"),
        (query(GET_BACKLINKS, &[hot[0], hot[1], ("cursor", "00")]), "cursor"),
    ] {
        assert_invalid(&router, &uri, word).await;
    }
}

#[tokio::test]
async fn constellation_counts_and_dids() {
    let (_dir, router) = server().await;
    let likes = [("subject", HOT), ("source", "app.bsky.feed.like:subject.uri")];
    assert_eq!(get(&router, &query(GET_COUNT, &likes)).await, (StatusCode::OK, json!({"total": 25})));
    let reposts = [("subject", HOT), ("source", "app.bsky.feed.repost:subject.uri")];
    assert_eq!(get(&router, &query(GET_COUNT, &reposts)).await.1, json!({"total": 3}));
    let unknown = [("subject", UNKNOWN), ("source", "app.bsky.feed.like:subject.uri")];
    assert_eq!(get(&router, &query(GET_COUNT, &unknown)).await, (StatusCode::OK, json!({"total": 0})));
    assert_invalid(&router, &query(GET_COUNT, &[("subject", HOT)]), "source").await;

    // 25 likes from 5 accounts: a page of 3 DIDs, then the other 2: each account once, newest
    // first by its oldest like.
    let (_, first) = get(&router, &query(GET_DIDS, &[likes[0], likes[1], ("limit", "3")])).await;
    assert_eq!(first["total"], 5);
    let first_dids: Vec<&str> = first["linking_dids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(first_dids, [liker(24), liker(23), liker(22)]);
    let cursor = first["cursor"].as_str().expect("a cursor after a full page");
    let (_, rest) = get(&router, &query(GET_DIDS, &[likes[0], likes[1], ("limit", "1000"), ("cursor", cursor)])).await;
    let rest_dids: Vec<&str> = rest["linking_dids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(rest_dids, [liker(1), liker(0)]);
    assert_eq!(rest["cursor"], Value::Null);
    let (status, empty) = get(&router, &query(GET_DIDS, &unknown)).await;
    assert_eq!((status, empty), (StatusCode::OK, json!({"total": 0, "linking_dids": [], "cursor": null})));
    let (_, zero) = get(&router, &query(GET_DIDS, &[likes[0], likes[1], ("limit", "0")])).await;
    assert_eq!(zero, json!({"total": 5, "linking_dids": [], "cursor": null}));
    assert_invalid(&router, &query(GET_DIDS, &[likes[0], likes[1], ("limit", "1001")]), "limit").await;
}

/// Constellation's REST family answers what the XRPC methods answer, under its own names.
#[tokio::test]
async fn constellation_rest_family() {
    let (_dir, router) = server().await;
    let likes = [("target", HOT), ("collection", "app.bsky.feed.like"), ("path", ".subject.uri")];
    let xrpc = [("subject", HOT), ("source", "app.bsky.feed.like:subject.uri")];
    let (status, links) = get(&router, &query("/links", &[likes[0], likes[1], likes[2], ("limit", "7")])).await;
    let (_, records) = get(&router, &query(GET_BACKLINKS, &[xrpc[0], xrpc[1], ("limit", "7")])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&links["total"], &links["linking_records"], &links["cursor"]),
        (&json!(25), &records["records"], &records["cursor"])
    );
    assert_eq!(links.as_object().unwrap().len(), 3, "exactly constellation's fields: {links}");
    let (_, next) =
        get(&router, &query("/links", &[likes[0], likes[1], likes[2], ("cursor", links["cursor"].as_str().unwrap())]))
            .await;
    assert_eq!(next["linking_records"].as_array().unwrap().len(), HOT_LIKES - 7);
    // did and the deprecated from_dids filter alike; both at once is a 400.
    let one = liker(0);
    let from_dids = format!("{one},{}", liker(1));
    let (_, mine) = get(&router, &query("/links", &[likes[0], likes[1], likes[2], ("did", &one)])).await;
    let (_, ours) = get(&router, &query("/links", &[likes[0], likes[1], likes[2], ("from_dids", &from_dids)])).await;
    assert_eq!((&mine["total"], &ours["total"]), (&json!(5), &json!(10)));
    assert_invalid(
        &router,
        &query("/links", &[likes[0], likes[1], likes[2], ("did", &one), ("from_dids", &one)]),
        "not both",
    )
    .await;

    assert_eq!(get(&router, &query("/links/count", &likes)).await, (StatusCode::OK, json!({"total": 25})));
    assert_eq!(get(&router, &query("/links/count/distinct-dids", &likes)).await.1, json!({"total": 5}));
    let (_, dids) = get(&router, &query("/links/distinct-dids", &likes)).await;
    let (_, xrpc_dids) = get(&router, &query(GET_DIDS, &xrpc)).await;
    assert_eq!(dids, xrpc_dids);
    assert_eq!(dids["linking_dids"].as_array().unwrap().len(), 5);

    // Every collection and path linking to the target, with records and distinct accounts.
    let expected = json!({"links": {
        "app.bsky.feed.like": {".subject.uri": {"records": 25, "distinct_dids": 5}},
        "app.bsky.feed.repost": {".subject.uri": {"records": 3, "distinct_dids": 3}},
    }});
    assert_eq!(get(&router, &query("/links/all", &[("target", HOT)])).await, (StatusCode::OK, expected));
    let counts =
        json!({"links": {"app.bsky.feed.like": {".subject.uri": 25}, "app.bsky.feed.repost": {".subject.uri": 3}}});
    assert_eq!(get(&router, &query("/links/all/count", &[("target", HOT)])).await.1, counts);
    // A follow's subject is a plain DID string: `.subject`, and asking by that path finds it.
    let (_, followed) = get(&router, &query("/links/all", &[("target", FOLLOWED)])).await;
    assert_eq!(followed, json!({"links": {"app.bsky.graph.follow": {".subject": {"records": 1, "distinct_dids": 1}}}}));
    let follows = [("target", FOLLOWED), ("collection", "app.bsky.graph.follow"), ("path", ".subject")];
    assert_eq!(get(&router, &query("/links/count", &follows)).await.1, json!({"total": 1}));
    assert_eq!(get(&router, &query("/links/all", &[("target", UNKNOWN)])).await.1, json!({"links": {}}));

    for (uri, word) in [
        (query("/links", &likes[1..]), "target"),
        (query("/links", &[likes[0], likes[2]]), "collection"),
        (query("/links", &likes[..2]), "path"),
        (query("/links/count", &[likes[0], ("collection", "nope"), likes[2]]), "collection"),
        (query("/links/distinct-dids", &[likes[0], likes[1], likes[2], ("limit", "1001")]), "limit"),
        (query("/links/all", &[]), "target"),
        (query("/links/all/count", &[("target", "ftp://example.com/")]), "target"),
    ] {
        assert_invalid(&router, &uri, word).await;
    }
}

#[tokio::test]
async fn health_metrics_lexicons_and_unknown_routes() {
    let (_dir, router) = server().await;
    let (status, health) = get(&router, "/xrpc/_health").await;
    assert_eq!((status, &health["status"], &health["clock"]), (StatusCode::OK, &json!("ok"), &json!(37)));
    get(&router, &query(LIST, &[("target", LIKED)])).await;
    let response = send(&router, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(response.headers()["content-type"], backlinks::metrics::CONTENT_TYPE);
    let text = String::from_utf8(body_bytes(response).await.to_vec()).unwrap();
    assert!(text.contains("backlinks_http_query_duration_seconds_count{endpoint=\"listBacklinks\"} 1\n"), "{text}");
    assert!(text.contains("backlinks_ingest_clock 37\n"), "{text}");
    assert!(text.contains("backlinks_tables{tree=\"links\"} 1\n"), "{text}");
    // Write-path figures exist (this server's index has not written yet); the query read frames
    // from the local cache, which holds the imported tables.
    let value = |name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let tally_reads = ["record_hot_link", "account_hot_link", "revocation", "account_tally"]
        .map(|part| format!("flush_tally_{part}_reads_microseconds"));
    let names = [
        "flush_bytes",
        "flush_duration_microseconds",
        "flush_tally_promotion_microseconds",
        "compaction_read_bytes",
        "upload_bytes",
    ];
    for name in names.iter().map(|name| name.to_string()).chain(tally_reads) {
        assert_eq!(value(&format!("backlinks_{name}_total")), 0, "{name}");
    }
    assert!(value("backlinks_table_reads_total{source=\"local\"}") > 0, "{text}");
    assert!(value("backlinks_cache_bytes") > 0);
    let (_, list) = get(&router, "/lexicons").await;
    assert_eq!(list["lexicons"].as_array().unwrap().len(), 8);
    for (nsid, text) in backlinks::server::LEXICONS.iter().chain(&backlinks::server::SUBSCRIPTION_LEXICONS) {
        let response = send(&router, Request::get(format!("/lexicons/{nsid}.json")).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_bytes(response).await, text.as_bytes(), "{nsid}");
    }
    let (status, body) = get(&router, "/lexicons/com.example.nope.json").await;
    assert_eq!((status, &body["error"]), (StatusCode::NOT_FOUND, &json!("NotFound")));
    let (status, body) = get(&router, "/xrpc/blue.cerulea.backlinks.noSuchMethod").await;
    assert_eq!((status, &body["error"]), (StatusCode::NOT_FOUND, &json!("MethodNotImplemented")));
}

#[tokio::test]
async fn cors_cache_headers_compression_and_no_accept_needed() {
    let (_dir, router) = server().await;
    let uri = query(LIST, &[("target", LIKED)]);
    let request = Request::get(&uri).header("origin", "https://app.example").body(Body::empty()).unwrap();
    let response = send(&router, request).await;
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert_eq!(response.headers()["cache-control"], "public, max-age=5");
    let preflight = Request::options(&uri)
        .header("origin", "https://app.example")
        .header("access-control-request-method", "GET")
        .body(Body::empty())
        .unwrap();
    let response = send(&router, preflight).await;
    assert!(response.status().is_success());
    assert!(response.headers()["access-control-allow-methods"].to_str().unwrap().contains("GET"));
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert_eq!(response.headers()["access-control-allow-headers"], "*");
    assert_eq!(response.headers()["access-control-max-age"], "86400");
    // Refused before routing, and still readable by a web page.
    let long = format!("{uri}&x={}", "a".repeat(40_000));
    let response = send(&router, Request::get(&long).body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::URI_TOO_LONG);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert_eq!(response.headers()["cache-control"], "no-store");
    // Errors are never cached, and still carry CORS headers.
    let bad = Request::get(LIST).header("origin", "https://app.example").body(Body::empty()).unwrap();
    let response = send(&router, bad).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()["cache-control"], "no-store");
    assert_eq!(response.headers()["access-control-allow-origin"], "*");

    let plain = body_bytes(send(&router, Request::get(&uri).body(Body::empty()).unwrap()).await).await;
    let zstd = Request::get(&uri).header("accept-encoding", "zstd").body(Body::empty()).unwrap();
    let response = send(&router, zstd).await;
    assert_eq!(response.headers()["content-encoding"], "zstd");
    assert_eq!(zstd::decode_all(&body_bytes(response).await[..]).unwrap(), plain);
    let gzip = Request::get(&uri).header("accept-encoding", "gzip").body(Body::empty()).unwrap();
    let response = send(&router, gzip).await;
    assert_eq!(response.headers()["content-encoding"], "gzip");
    assert_eq!(&body_bytes(response).await[..2], [0x1f, 0x8b], "gzip magic");

    // The status page answers whatever the client accepts.
    for accept in [None, Some("application/json"), Some("*/*")] {
        let mut request = Request::get("/");
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = send(&router, request.body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK, "{accept:?}");
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
        let html = String::from_utf8(body_bytes(response).await.to_vec()).unwrap();
        assert!(html.contains("<dd id=\"tables\">3</dd>"), "{html}");
    }
}

/// A store whose ranged reads wait until the test opens the gate.
#[derive(Debug)]
struct GatedStore {
    inner: DirStore,
    gate: tokio::sync::Semaphore,
    waiting: AtomicUsize,
}

impl GatedStore {
    fn new(root: &Path) -> Self {
        Self {
            inner: DirStore::new(root.to_path_buf()),
            gate: tokio::sync::Semaphore::new(0),
            waiting: AtomicUsize::new(0),
        }
    }

    async fn until_waiting(&self) {
        for _ in 0..1000 {
            if self.waiting.load(Ordering::SeqCst) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no read reached the store");
    }
}

#[async_trait::async_trait]
impl Store for GatedStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        self.inner.put(key, body).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let permit = self.gate.acquire().await.expect("gate open");
        permit.forget();
        self.inner.get_range(key, offset, len).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
}

/// An index whose table data is only in the (gated) bucket: local data files removed.
async fn gated(options: ServerOptions) -> (tempfile::TempDir, Arc<GatedStore>, Router) {
    let dir = tempfile::tempdir().unwrap();
    import_into(dir.path()).await;
    for tree in backlinks::model::ids::TreeKind::ALL.map(|kind| kind.name()) {
        for entry in std::fs::read_dir(dir.path().join("data/state/tables").join(tree)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "data") {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
    let store = Arc::new(GatedStore::new(&dir.path().join("bucket")));
    let index = open(dir.path(), store.clone());
    (dir, store, app(index, options, Arc::new(Metrics::new())))
}

#[tokio::test]
async fn over_capacity_is_an_immediate_503() {
    let options = ServerOptions { max_concurrent_queries: 1, ..Default::default() };
    let (_dir, store, router) = gated(options).await;
    let uri = query(LIST, &[("target", LIKED)]);
    let slow = tokio::spawn({
        let (router, uri) = (router.clone(), uri.clone());
        async move { get(&router, &uri).await }
    });
    store.until_waiting().await;
    let response = send(&router, Request::get(&uri).body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    assert_eq!(body["error"], "ServiceUnavailable");
    assert!(body["message"].as_str().unwrap().contains("over capacity"), "{body}");
    // Non-query routes are not capped, nor are a CORS preflight and other methods on a query route.
    assert_eq!(get(&router, "/xrpc/_health").await.0, StatusCode::OK);
    let preflight = Request::options(&uri)
        .header("origin", "https://app.example")
        .header("access-control-request-method", "GET")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, preflight).await.status(), StatusCode::OK);
    let post = send(&router, Request::post(&uri).body(Body::empty()).unwrap()).await;
    assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
    store.gate.add_permits(1000);
    let (status, body) = slow.await.unwrap();
    assert_eq!((status, body), (StatusCode::OK, json!({"backlinks": {"$.subject": [LIKE]}, "cursor": null})));
    // The permit came back.
    assert_eq!(get(&router, &uri).await.0, StatusCode::OK);
    let text = String::from_utf8(
        body_bytes(send(&router, Request::get("/metrics").body(Body::empty()).unwrap()).await).await.to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("backlinks_http_query_rejections_total{endpoint=\"listBacklinks\",reason=\"capacity\"} 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_query_past_the_timeout_is_stopped_with_a_503() {
    let options =
        ServerOptions { max_concurrent_queries: 1, request_timeout: Duration::from_millis(200), ..Default::default() };
    let (_dir, store, router) = gated(options).await;
    let (status, body) = get(&router, &query(COUNT, &[("target", LIKED)])).await;
    assert_eq!((status, &body["error"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("ServiceUnavailable")));
    assert!(body["message"].as_str().unwrap().contains("took longer"), "{body}");
    store.gate.add_permits(1000);
    // The timed-out query released its permit.
    let (status, body) = get(&router, &query(COUNT, &[("target", LIKED)])).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"total": 1, "byLocation": {"$.subject": 1}, "approximate": false}))
    );
}
