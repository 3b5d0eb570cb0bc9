//! Constellation's endpoints through the real binary: a generated stream of likes, reposts,
//! follows and replies with mentions, link cards and link facets (creates, updates, deletes,
//! hidden and deleted accounts) is
//! imported with `backlinks import`, served with `backlinks serve`, and every endpoint's answer
//! for every target is checked against the reference model (tests/support/model.rs): the REST
//! family (`/links`, `/links/count`, `/links/distinct-dids`, `/links/count/distinct-dids`,
//! `/links/all`, `/links/all/count`) and the XRPC methods it mirrors, page by page, for posts,
//! accounts and web pages. The real capture's answers equal constellation's (written down from
//! its source in tests/data/constellation), and an account that links many times comes out of
//! the DID lists once.

mod support;

use backlinks::base::rng::splitmix64;
use backlinks::constellation::rest::constellation_path;
use backlinks::model::tid::format_tid;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use support::model::{Model, RecordKey};
use support::{Server, run};

const ACCOUNTS: usize = 24;
const POSTS: usize = 5;
const RKEYS: usize = 40;
const EVENTS: usize = 2_500;
/// (collection, how its record links): the shapes of the real ones.
const COLLECTIONS: [&str; 4] =
    ["app.bsky.feed.like", "app.bsky.feed.repost", "app.bsky.graph.follow", "app.bsky.feed.post"];

fn did(i: usize) -> String {
    format!("did:plc:{}", std::iter::repeat_n(char::from(b'a' + i as u8), 24).collect::<String>())
}

fn post(i: usize) -> String {
    format!("at://{}/app.bsky.feed.post/{}", did(i), format_tid(1_600_000_000_000_000 + i as u64))
}

fn url(i: usize) -> String {
    format!("https://example.com/article/{i}?ref=bsky")
}

fn rkey(i: usize) -> String {
    format_tid(1_700_000_000_000_000 + i as u64 * 1_000)
}

fn record_uri(&(d, c, r): &RecordKey) -> String {
    format!("at://{}/{}/{}", did(d), COLLECTIONS[c], rkey(r))
}

fn strong_ref(uri: &str) -> Value {
    json!({"uri": uri, "cid": "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em"})
}

/// A record of `collection` pointing at `a` (and `b`), and its (target, location) links.
fn record(collection: usize, a: usize, b: usize) -> (Value, BTreeSet<(String, String)>) {
    let links = |pairs: &[(String, &str)]| pairs.iter().map(|(t, l)| (t.clone(), l.to_string())).collect();
    match collection {
        0 | 1 => (json!({"subject": strong_ref(&post(a))}), links(&[(post(a), "$.subject")])),
        2 => (json!({"subject": did(a)}), links(&[(did(a), "$.subject")])),
        _ => {
            let mentions = [did(b), did(a)].map(|d| json!({"$type": "app.bsky.richtext.facet#mention", "did": d}));
            let mention = json!({"index": {"byteStart": 0, "byteEnd": 2}, "features": mentions});
            let web_link = json!({"index": {"byteStart": 3, "byteEnd": 5},
                                  "features": [{"$type": "app.bsky.richtext.facet#link", "uri": url(b)}]});
            let card = json!({"$type": "app.bsky.embed.external",
                              "external": {"uri": url(a), "title": "t", "description": "d"}});
            let record = json!({"text": "hi", "reply": {"root": strong_ref(&post(a)), "parent": strong_ref(&post(b))},
                                "facets": [mention, web_link], "embed": card});
            (
                record,
                links(&[
                    (post(a), "$.reply.root"),
                    (post(b), "$.reply.parent"),
                    (did(b), MENTION_AT),
                    (did(a), MENTION_AT),
                    (url(b), LINK_FACET_AT),
                    (url(a), CARD_AT),
                ]),
            )
        }
    }
}

const MENTION_AT: &str = "$.facets[].features[app.bsky.richtext.facet#mention].did";
const LINK_FACET_AT: &str = "$.facets[].features[app.bsky.richtext.facet#link].uri";
const CARD_AT: &str = "$.embed.external.uri";

/// Jetstream lines and the model they leave.
fn generate(seed: u64) -> (String, Model) {
    generate_with(seed, Creates::MayRepeat)
}

/// Whether a create may name a record that exists (its links then add to the record's), or is
/// sent as an update then, as a PDS would: a repository holds one record per key.
#[derive(Clone, Copy, PartialEq)]
enum Creates {
    MayRepeat,
    AsARepositoryHasThem,
}

fn generate_with(seed: u64, creates: Creates) -> (String, Model) {
    let mut state = seed;
    let mut next = |n: usize| (splitmix64(&mut state) % n as u64) as usize;
    let (mut lines, mut model) = (String::new(), Model::default());
    for i in 0..EVENTS {
        let time_us = 1_780_000_000_000_000u64 + i as u64;
        let (d, c, r) = (next(ACCOUNTS), next(COLLECTIONS.len()), next(RKEYS));
        let event = match next(20) {
            0 => {
                model.delete_account(d);
                account(d, time_us, false, Some("deleted"))
            }
            1 => {
                model.hidden.insert(d);
                account(d, time_us, false, Some("deactivated"))
            }
            2 => {
                model.hidden.remove(&d);
                account(d, time_us, true, None)
            }
            3..=5 => {
                model.records.remove(&(d, c, r));
                commit(d, time_us, json!({"operation": "delete", "collection": COLLECTIONS[c], "rkey": rkey(r)}))
            }
            kind => {
                let (value, links) = record(c, next(POSTS), next(POSTS));
                let exists = model.records.contains_key(&(d, c, r));
                let update = exists && (kind < 9 || creates == Creates::AsARepositoryHasThem);
                let entry = model.records.entry((d, c, r)).or_default();
                if update {
                    *entry = links;
                } else {
                    entry.extend(links);
                }
                let operation = if update { "update" } else { "create" };
                let body =
                    json!({"operation": operation, "collection": COLLECTIONS[c], "rkey": rkey(r), "record": value});
                commit(d, time_us, body)
            }
        };
        lines.push_str(&event.to_string());
        lines.push('\n');
    }
    (lines, model)
}

fn commit(d: usize, time_us: u64, mut body: Value) -> Value {
    body["rev"] = "3l3qo2vutsw2b".into();
    json!({"did": did(d), "time_us": time_us, "kind": "commit", "commit": body})
}

fn account(d: usize, time_us: u64, active: bool, status: Option<&str>) -> Value {
    let mut account = json!({"active": active, "did": did(d), "seq": 1, "time": "2024-01-01T00:00:00Z"});
    if let Some(status) = status {
        account["status"] = status.into();
    }
    json!({"did": did(d), "time_us": time_us, "kind": "account", "account": account})
}

fn query(path: &str, pairs: &[(&str, &str)]) -> String {
    let encoded = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    format!("{path}?{encoded}")
}

/// Every page of a paged endpoint: the items under `key`, and the totals each page gave.
fn every_page(server: &Server, path: &str, pairs: &[(&str, &str)], key: &str) -> (Vec<Value>, BTreeSet<u64>) {
    let (mut items, mut totals) = (Vec::new(), BTreeSet::new());
    for page in pages(server, path, pairs, "3") {
        items.extend(page[key].as_array().unwrap_or_else(|| panic!("{key} in {page}")).iter().cloned());
        totals.insert(page["total"].as_u64().unwrap_or_else(|| panic!("total in {page}")));
    }
    (items, totals)
}

fn record_of(item: &Value) -> String {
    format!(
        "at://{}/{}/{}",
        item["did"].as_str().unwrap(),
        item["collection"].as_str().unwrap(),
        item["rkey"].as_str().unwrap()
    )
}

/// The model's live (source, location) links to `target` from `collection` at `location`.
fn expected(model: &Model, target: &str, collection: &str, location: &str) -> Vec<String> {
    let links = model.backlinks(target, record_uri);
    links
        .into_iter()
        .filter(|(uri, l)| l == location && uri.split('/').nth(3) == Some(collection))
        .map(|(u, _)| u)
        .collect()
}

/// listBacklinks, every page, and countBacklinks for `target` against the model.
fn assert_own_endpoints_answer_the_model(server: &Server, model: &Model, target: &str) {
    let want: BTreeSet<(String, String)> = model.backlinks(target, record_uri).into_iter().collect();
    let (mut got, mut cursor) = (BTreeSet::new(), String::new());
    loop {
        let mut pairs = vec![("target", target), ("limit", "4")];
        if !cursor.is_empty() {
            pairs.push(("cursor", cursor.as_str()));
        }
        let (status, page) = server.get(&query("/xrpc/blue.cerulea.backlinks.listBacklinks", &pairs));
        assert_eq!(status, 200, "{target}: {page}");
        for (location, sources) in page["backlinks"].as_object().unwrap() {
            for source in sources.as_array().unwrap() {
                assert!(got.insert((source.as_str().unwrap().to_string(), location.clone())), "{target}: twice");
            }
        }
        match page["cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    assert_eq!(got, want, "{target}");
    let count = server.get(&query("/xrpc/blue.cerulea.backlinks.countBacklinks", &[("target", target)])).1;
    assert_eq!(count["total"], json!(want.len()), "{target}: {count}");
}

/// `backlinks import` of `lines` into a fresh data directory, then `backlinks serve` on it. The
/// smallest memtable the configuration allows makes the import flush many times, so that answers
/// come from several tables, with revocations in later tables than the links they kill.
fn import_and_serve(lines: &str) -> (tempfile::TempDir, Server) {
    import_and_serve_with(lines, "")
}

/// `import_and_serve` with more configuration for both commands.
fn import_and_serve_with(lines: &str, config_lines: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    std::fs::write(&events, lines).unwrap();
    let config = dir.path().join("backlinks.toml");
    std::fs::write(&config, format!("memtable_bytes = 65536\n{config_lines}")).unwrap();
    let data = dir.path().join("data");
    let (events, config, data) = (events.to_str().unwrap(), config.to_str().unwrap(), data.to_str().unwrap());
    let (ok, _, stderr) = run(&["import", events, "--config", config, "--data-dir", data]);
    assert!(ok, "{stderr}");
    let server = Server::start_with(std::path::Path::new(data), &["--config", config]);
    (dir, server)
}

#[test]
fn rest_and_xrpc_answers_equal_the_model() {
    let (lines, model) = generate(42);
    let (_dir, server) = import_and_serve(&lines);
    let targets: Vec<String> = (0..POSTS).map(post).chain((0..ACCOUNTS).map(did)).chain((0..POSTS).map(url)).collect();
    let mut checked = 0;
    for target in &targets {
        let is_record = target.starts_with("at://");
        // Every (collection, location) that can link to this kind of target, whether or not it does.
        let mut all = BTreeMap::new();
        for (collection, location) in [
            ("app.bsky.feed.like", "$.subject"),
            ("app.bsky.feed.repost", "$.subject"),
            ("app.bsky.graph.follow", "$.subject"),
            ("app.bsky.feed.post", "$.reply.root"),
            ("app.bsky.feed.post", "$.reply.parent"),
            ("app.bsky.feed.post", MENTION_AT),
            ("app.bsky.feed.post", LINK_FACET_AT),
            ("app.bsky.feed.post", CARD_AT),
        ] {
            let records = expected(&model, target, collection, location);
            let path = constellation_path(location, is_record).unwrap();
            let rest = [("target", target.as_str()), ("collection", collection), ("path", path.as_str())];
            let source = format!("{collection}:{}", &path[1..]);
            let xrpc = [("subject", target.as_str()), ("source", source.as_str())];
            let dids: BTreeSet<String> = records.iter().map(|uri| uri.split('/').nth(2).unwrap().to_string()).collect();
            let total = records.len() as u64;

            let (items, totals) = every_page(&server, "/links", &rest, "linking_records");
            let got: Vec<String> = items.iter().map(record_of).collect();
            let mut sorted = got.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), got.len(), "{target} {collection} {location}: a record twice");
            let mut want = records.clone();
            want.sort();
            assert_eq!(sorted, want, "{target} {collection} {location}");
            assert_eq!(totals, BTreeSet::from([total]), "{target} {collection} {location}");
            let (xrpc_items, _) = every_page(&server, "/xrpc/blue.microcosm.links.getBacklinks", &xrpc, "records");
            assert_eq!(xrpc_items, items, "getBacklinks pages as /links does");

            assert_eq!(server.get(&query("/links/count", &rest)).1, json!({"total": total}));
            let xrpc_count = server.get(&query("/xrpc/blue.microcosm.links.getBacklinksCount", &xrpc)).1;
            assert_eq!(xrpc_count, json!({"total": total}));
            let distinct = json!({"total": dids.len()});
            assert_eq!(server.get(&query("/links/count/distinct-dids", &rest)).1, distinct);
            let (linking, totals) = every_page(&server, "/links/distinct-dids", &rest, "linking_dids");
            let linking: BTreeSet<String> = linking.iter().map(|d| d.as_str().unwrap().to_string()).collect();
            assert_eq!((linking, totals), (dids.clone(), BTreeSet::from([dids.len() as u64])));

            if !records.is_empty() {
                let summary = json!({"records": records.len(), "distinct_dids": dids.len()});
                all.entry(collection.to_string()).or_insert_with(BTreeMap::new).insert(path.clone(), summary);
                checked += 1;
            }
        }
        let (status, links_all) = server.get(&query("/links/all", &[("target", target)]));
        assert_eq!((status, links_all), (200, json!({ "links": all })), "{target}");
        let counts: BTreeMap<_, BTreeMap<_, _>> = all
            .iter()
            .map(|(c, paths)| (c.clone(), paths.iter().map(|(p, s)| (p.clone(), s["records"].clone())).collect()))
            .collect();
        assert_eq!(server.get(&query("/links/all/count", &[("target", target)])).1, json!({ "links": counts }));
        assert_own_endpoints_answer_the_model(&server, &model, target);
    }
    // Every post has live likes, reposts and replies at root and parent; every account that can
    // be followed or mentioned is; every page is in a live card and a live link facet.
    assert_eq!(checked, POSTS * 4 + POSTS * 2 + POSTS * 2, "(target, collection, location) with live links");
}

/// Every post is hot here (promoted from 64 entries, and a count reads at most 16 entries whole):
/// its counts come from tallies, and every count endpoint's records and distinct accounts still
/// equal the model, exactly (no `approximate`), with `did` filters too; its linking DIDs, paged
/// three at a time, come out each once.
#[test]
fn hot_targets_count_records_and_accounts_exactly() {
    let (lines, model) = generate(43);
    let (_dir, server) = import_and_serve_with(&lines, "hot_target_entries = 64\ncount_exact_limit = 16\n");
    let groups = [
        ("app.bsky.feed.like", "$.subject"),
        ("app.bsky.feed.repost", "$.subject"),
        ("app.bsky.feed.post", "$.reply.root"),
        ("app.bsky.feed.post", "$.reply.parent"),
    ];
    let some: Vec<String> = (0..ACCOUNTS).step_by(5).map(did).collect();
    for target in (0..POSTS).map(post) {
        let mut all = BTreeMap::new();
        for (collection, location) in groups {
            let records = expected(&model, &target, collection, location);
            let dids: BTreeSet<&str> = records.iter().map(|uri| uri.split('/').nth(2).unwrap()).collect();
            let path = constellation_path(location, true).unwrap();
            let rest = [("target", target.as_str()), ("collection", collection), ("path", path.as_str())];
            assert_eq!(server.get(&query("/links/count", &rest)).1, json!({"total": records.len()}), "{target}");
            let distinct = server.get(&query("/links/count/distinct-dids", &rest)).1;
            assert_eq!(distinct, json!({"total": dids.len()}), "{target} {collection} {location}");
            let source = format!("{collection}:{}", &path[1..]);
            let mut xrpc = vec![("subject", target.as_str()), ("source", source.as_str())];
            xrpc.extend(some.iter().map(|d| ("did", d.as_str())));
            let from_some = records.iter().filter(|uri| some.iter().any(|d| uri.split('/').nth(2) == Some(d))).count();
            let count = server.get(&query("/xrpc/blue.microcosm.links.getBacklinksCount", &xrpc)).1;
            assert_eq!(count, json!({"total": from_some}), "{target} {collection} {location}, {} accounts", some.len());
            assert_each_did_once(&server, "/links/distinct-dids", &rest, &dids);
            let some_dids: BTreeSet<&str> = dids.iter().copied().filter(|d| some.iter().any(|s| s == d)).collect();
            assert_each_did_once(&server, "/xrpc/blue.microcosm.links.getBacklinkDids", &xrpc, &some_dids);
            if !records.is_empty() {
                let summary = json!({"records": records.len(), "distinct_dids": dids.len()});
                all.entry(collection.to_string()).or_insert_with(BTreeMap::new).insert(path.clone(), summary);
            }
        }
        assert_eq!(server.get(&query("/links/all", &[("target", &target)])).1, json!({ "links": all }), "{target}");
        let raw = server.get(&query("/xrpc/blue.cerulea.backlinks.countBacklinks", &[("target", &target)])).1;
        assert_eq!(raw["approximate"], json!(false), "{target}: {raw}");
        assert!(raw["total"].as_u64().unwrap() > 16, "{target} is past the scan limit: {raw}");
    }
}

/// The real capture through the real binary: every answer equals the one constellation gives for
/// the same events, as written down from its source in tests/data/constellation (SOURCE.md there).
#[test]
fn capture_answers_equal_constellations() {
    let capture = std::fs::read_to_string(support::CAPTURE).unwrap();
    let (_dir, server) = import_and_serve(&capture);
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/constellation/capture_answers.json");
    let cases: Vec<(String, Value)> = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(cases.len(), 21);
    for (request, constellation) in cases {
        let (status, ours) = server.get(&request);
        assert_eq!((status, &ours), (200, &constellation), "{request}");
    }
}

/// Every page of linking DIDs (three a page) exact, and together `expected`, each DID once.
fn assert_each_did_once(server: &Server, path: &str, pairs: &[(&str, &str)], expected: &BTreeSet<&str>) {
    let pages = pages(server, path, pairs, "3");
    let mut dids = Vec::new();
    for page in &pages {
        assert_eq!(page.get("approximate"), None, "{path} {pairs:?}: {page}");
        assert_eq!(page["total"], json!(expected.len()), "{path} {pairs:?}: {page}");
        dids.extend(page["linking_dids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()));
    }
    let once: BTreeSet<&str> = dids.iter().map(String::as_str).collect();
    assert_eq!((once.len(), &once), (dids.len(), expected), "{path} {pairs:?}");
}

/// One account likes a post fifty times among 23 others' likes: paged three at a time, every
/// account comes out exactly once, on getBacklinkDids and on `/links/distinct-dids` alike,
/// whether the post is read whole or counted from its tallies (hot).
#[test]
fn an_account_that_links_many_times_comes_out_once_over_all_pages() {
    let mut lines = String::new();
    let mut likers = BTreeSet::new();
    for i in 0..200 {
        let liker = if i % 4 == 0 { 0 } else { 1 + i % 23 };
        likers.insert(did(liker));
        let body = json!({"operation": "create", "collection": COLLECTIONS[0], "rkey": rkey(i),
                          "record": {"subject": strong_ref(&post(0))}});
        lines.push_str(&commit(liker, 1_780_000_000_000_000 + i as u64, body).to_string());
        lines.push('\n');
    }
    let likers: BTreeSet<&str> = likers.iter().map(String::as_str).collect();
    for config in ["", "hot_target_entries = 64\ncount_exact_limit = 16\n"] {
        let (_dir, server) = import_and_serve_with(&lines, config);
        let target = post(0);
        let xrpc = [("subject", target.as_str()), ("source", "app.bsky.feed.like:subject.uri")];
        let rest = [("target", target.as_str()), ("collection", COLLECTIONS[0]), ("path", ".subject.uri")];
        assert_each_did_once(&server, "/xrpc/blue.microcosm.links.getBacklinkDids", &xrpc, &likers);
        assert_each_did_once(&server, "/links/distinct-dids", &rest, &likers);
        let raw = server.get(&query("/xrpc/blue.cerulea.backlinks.countBacklinks", &[("target", &target)])).1;
        assert_eq!(raw["total"], json!(200), "{config:?}: {raw}");
    }
}

/// A like whose subject is a bare `{"uri": ...}` (no `cid`, so not a strong reference: `$.subject.uri`
/// here) beside five ordinary likes (`$.subject`): constellation spells both `.subject.uri`, and
/// `/links/all` counts them together, as `/links/count` does.
#[test]
fn links_all_counts_two_locations_of_one_path_together() {
    let mut lines = String::new();
    for liker in 0..6 {
        let subject = if liker == 5 { json!({"uri": post(0)}) } else { strong_ref(&post(0)) };
        let body = json!({"operation": "create", "collection": COLLECTIONS[0], "rkey": rkey(liker),
                          "record": {"subject": subject}});
        lines.push_str(&commit(liker, 1_780_000_000_000_000 + liker as u64, body).to_string());
        lines.push('\n');
    }
    let (_dir, server) = import_and_serve(&lines);
    let target = post(0);
    let rest = [("target", target.as_str()), ("collection", COLLECTIONS[0]), ("path", ".subject.uri")];
    assert_eq!(server.get(&query("/links/count", &rest)).1, json!({"total": 6}));
    let summary = json!({"links": {"app.bsky.feed.like": {".subject.uri": {"records": 6, "distinct_dids": 6}}}});
    assert_eq!(server.get(&query("/links/all", &[("target", &target)])).1, summary);
    let counts = json!({"links": {"app.bsky.feed.like": {".subject.uri": 6}}});
    assert_eq!(server.get(&query("/links/all/count", &[("target", &target)])).1, counts);
}

/// Every page of a paged endpoint, `limit` at a time, following the cursors to the end.
fn pages(server: &Server, path: &str, pairs: &[(&str, &str)], limit: &str) -> Vec<Value> {
    let (mut pages, mut cursor) = (Vec::new(), String::new());
    for _ in 0..1_000 {
        let mut paged = pairs.to_vec();
        paged.extend([("limit", limit), ("cursor", cursor.as_str())].into_iter().filter(|(_, v)| !v.is_empty()));
        let (status, page) = server.get(&query(path, &paged));
        assert_eq!(status, 200, "{path} {paged:?}: {page}");
        let next = page["cursor"].as_str().map(str::to_string);
        pages.push(page);
        match next {
            Some(next) => cursor = next,
            None => return pages,
        }
    }
    panic!("{path} never ended");
}

/// Every item of getManyToMany over all its pages (two items a page, so that pages end inside
/// a record's items): (join record URI, other subject).
fn every_item(server: &Server, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let pages = pages(server, "/xrpc/blue.microcosm.links.getManyToMany", pairs, "2");
    let items = pages.iter().flat_map(|page| page["items"].as_array().unwrap_or_else(|| panic!("items in {page}")));
    items.map(|item| (record_of(&item["linkRecord"]), item["otherSubject"].as_str().unwrap().to_string())).collect()
}

/// Every group of getManyToManyCounts over all its pages (two groups a page).
fn every_group(server: &Server, pairs: &[(&str, &str)]) -> BTreeMap<String, (u64, u64)> {
    let mut groups = BTreeMap::new();
    for page in pages(server, "/xrpc/blue.microcosm.links.getManyToManyCounts", pairs, "2") {
        for group in page["counts_by_other_subject"].as_array().unwrap_or_else(|| panic!("groups in {page}")) {
            let subject = group["subject"].as_str().unwrap().to_string();
            let counts = (group["total"].as_u64().unwrap(), group["distinct"].as_u64().unwrap());
            assert!(groups.insert(subject, counts).is_none(), "a group on two pages: {page}");
        }
    }
    groups
}

/// The join over the model: each visible record of `collection` that links to `subject` at
/// `at`, with each of its links at `to` that `wanted` names (none: every one but URLs), sorted.
fn joined(
    model: &Model,
    subject: &str,
    (collection, at): (&str, &str),
    to: &str,
    wanted: &[String],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, links) in model.records.iter().filter(|(key, _)| !model.hidden.contains(&key.0)) {
        if COLLECTIONS[key.1] != collection || !links.contains(&(subject.to_string(), at.to_string())) {
            continue;
        }
        let named = |target: &String| match wanted.is_empty() {
            true => !target.starts_with("https://"),
            false => wanted.contains(target),
        };
        let others = links.iter().filter(|(target, location)| location == to && named(target));
        out.extend(others.map(|(target, _)| (record_uri(key), target.clone())));
    }
    out.sort();
    out
}

/// getManyToMany and getManyToManyCounts through the real binary on the generated stream
/// (creates, updates, deletes, hidden and deleted accounts), against a brute-force join over the
/// model: replies from their root to their parent and to the accounts they mention, mentions to
/// the threads they are in, likes to their own subject, link cards named by `otherSubject`, and
/// the `linkDid` filter.
#[test]
fn many_to_many_answers_equal_a_join_over_the_model() {
    let (lines, model) = generate_with(7, Creates::AsARepositoryHasThem);
    let (_dir, server) = import_and_serve(&lines);
    let path = |location: &str, is_record: bool| constellation_path(location, is_record).unwrap()[1..].to_string();
    let posts: Vec<String> = (0..POSTS).map(post).collect();
    let accounts: Vec<String> = (0..ACCOUNTS).map(did).collect();
    let cards: Vec<String> = (0..2).map(url).collect();
    // (subjects, join collection, join location, subject is a record, other location, other is a record)
    let cases = [
        (&posts, "app.bsky.feed.post", "$.reply.root", true, "$.reply.parent", true),
        (&posts, "app.bsky.feed.post", "$.reply.parent", true, MENTION_AT, false),
        (&accounts, "app.bsky.feed.post", MENTION_AT, false, "$.reply.root", true),
        (&posts, "app.bsky.feed.like", "$.subject", true, "$.subject", true),
        (&posts, "app.bsky.feed.post", "$.reply.root", true, CARD_AT, false),
    ];
    let (mut items_seen, mut multi_item_records) = (0, 0);
    for (subjects, collection, at, subject_is_record, to, other_is_record) in cases {
        let source = format!("{collection}:{}", path(at, subject_is_record));
        let to_other = path(to, other_is_record);
        for subject in subjects {
            let base = [("subject", subject.as_str()), ("source", source.as_str()), ("pathToOther", to_other.as_str())];
            let got = every_item(&server, &base);
            let mut sorted = got.clone();
            sorted.sort();
            assert_eq!(sorted, joined(&model, subject, (collection, at), to, &[]), "{base:?}");
            sorted.dedup();
            assert_eq!(sorted.len(), got.len(), "{base:?}: an item twice");
            let times: Vec<&str> = got.iter().map(|(record, _)| record.rsplit('/').next().unwrap()).collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "{base:?}: join records oldest first");
            items_seen += got.len();
            let mut per_record: BTreeMap<&str, usize> = BTreeMap::new();
            got.iter().for_each(|(record, _)| *per_record.entry(record).or_default() += 1);
            multi_item_records += per_record.values().filter(|&&n| n > 1).count();

            // Counts: each join record under its first other subject (the first of its items).
            let mut want: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
            let mut counted = BTreeSet::new();
            for (record, other) in &got {
                if counted.insert(record.clone()) {
                    let group = want.entry(other.clone()).or_default();
                    group.0 += 1;
                    group.1.insert(record.split('/').nth(2).unwrap().to_string());
                }
            }
            let want: BTreeMap<String, (u64, u64)> =
                want.into_iter().map(|(subject, (n, dids))| (subject, (n, dids.len() as u64))).collect();
            assert_eq!(every_group(&server, &base), want, "{base:?}");

            // Named link cards; and join records of two accounts only.
            let mut named = base.to_vec();
            named.extend(cards.iter().map(|card| ("otherSubject", card.as_str())));
            let mut got = every_item(&server, &named);
            got.sort();
            assert_eq!(got, joined(&model, subject, (collection, at), to, &cards), "{named:?}");
            let mut two = base.to_vec();
            two.extend([("linkDid", accounts[0].as_str()), ("linkDid", accounts[1].as_str())]);
            let mut got = every_item(&server, &two);
            got.sort();
            let mut want = joined(&model, subject, (collection, at), to, &[]);
            want.retain(|(record, _)| accounts[..2].iter().any(|account| record.split('/').nth(2) == Some(account)));
            assert_eq!(got, want, "{two:?}");
        }
    }
    assert!(items_seen > 100, "the join found plenty ({items_seen})");
    assert!(multi_item_records > 5, "records with several others, paged across ({multi_item_records})");
}

/// A count reads at most `count_exact_limit` join records (3 here): a subject with more gets the
/// groups of its oldest 3 and `approximate`; one with fewer, the exact groups of the join over the
/// model.
#[test]
fn many_to_many_counts_read_at_most_the_exact_limit_of_join_records() {
    let (lines, model) = generate_with(7, Creates::AsARepositoryHasThem);
    let (_dir, server) = import_and_serve_with(&lines, "count_exact_limit = 3\n");
    let (mut exact, mut approximate) = (0, 0);
    for subject in (0..POSTS).map(post) {
        let base = [
            ("subject", subject.as_str()),
            ("source", "app.bsky.feed.post:reply.root.uri"),
            ("pathToOther", "reply.parent.uri"),
            ("limit", "1000"),
        ];
        let (status, page) = server.get(&query("/xrpc/blue.microcosm.links.getManyToManyCounts", &base));
        assert_eq!(status, 200, "{page}");
        // Each reply has one parent: its group.
        let joined = joined(&model, &subject, ("app.bsky.feed.post", "$.reply.root"), "$.reply.parent", &[]);
        let mut want: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
        for (record, parent) in &joined {
            let group = want.entry(parent.clone()).or_default();
            group.0 += 1;
            group.1.insert(record.split('/').nth(2).unwrap().to_string());
        }
        let groups = page["counts_by_other_subject"].as_array().unwrap();
        let total: u64 = groups.iter().map(|g| g["total"].as_u64().unwrap()).sum();
        if joined.len() > 3 {
            assert_eq!((page["approximate"].clone(), total), (json!(true), 3), "{subject}: {page}");
            for group in groups {
                let (records, _) = &want[group["subject"].as_str().unwrap()];
                assert!(group["total"].as_u64().unwrap() <= *records, "{subject}: {group}");
            }
            approximate += 1;
        } else {
            let want: Vec<Value> =
                want.iter().map(|(s, (n, dids))| json!({"subject": s, "total": n, "distinct": dids.len()})).collect();
            assert_eq!(page, json!({"counts_by_other_subject": want, "cursor": null}), "{subject}");
            exact += 1;
        }
    }
    assert!(approximate > 0 && exact + approximate == POSTS, "({exact} exact, {approximate} approximate)");
}
