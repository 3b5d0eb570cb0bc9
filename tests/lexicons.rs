//! The lexicons in `lexicons/` against the server's real answers: a small validator for the part
//! of the lexicon schema language they use (`support/lexicon.rs`, shared with the live push tests)
//! checks every endpoint's JSON output, including estimates and last pages. The validator is
//! strict where lexicons are lenient: a field the schema does not declare is an error, so the
//! lexicons must document everything the server says. It is tested on bad values too, so a lax
//! validator cannot pass by accident.

#[path = "support/lexicon.rs"]
mod lexicon;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use backlinks::count::CountOptions;
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::metrics::Metrics;
use backlinks::server::{LEXICONS, SUBSCRIPTION_LEXICONS, ServerOptions, app};
use backlinks::store::dir::DirStore;
use lexicon::Lexicons;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tower::ServiceExt;

#[test]
fn every_lexicon_is_well_formed_and_where_its_id_says() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lexicons");
    let mut files = 0;
    // Served as kept in the repository, and naming itself.
    let kept = |id: &str, text: &str| -> Value {
        let path = root.join(id.replace('.', "/") + ".json");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "{id} is served as kept in {}", path.display());
        let lexicon: Value = serde_json::from_str(text).unwrap();
        assert_eq!((lexicon["lexicon"].as_i64(), lexicon["id"].as_str()), (Some(1), Some(id)));
        lexicon
    };
    for (id, text) in LEXICONS {
        let lexicon = kept(id, text);
        let main = &lexicon["defs"]["main"];
        assert_eq!(main["type"], "query", "{id}");
        assert_eq!(main["output"]["encoding"], "application/json", "{id}");
        let parameters = &main["parameters"];
        assert_eq!(parameters["type"], "params", "{id}");
        let properties = parameters["properties"].as_object().unwrap();
        for required in parameters["required"].as_array().unwrap() {
            assert!(properties.contains_key(required.as_str().unwrap()), "{id}: required {required} undeclared");
        }
        for (name, schema) in properties {
            let kind = schema["type"].as_str().unwrap();
            let item = schema["items"]["type"].as_str();
            let allowed =
                matches!(kind, "string" | "integer" | "boolean") || (kind == "array" && item == Some("string"));
            assert!(allowed, "{id}: parameter {name} has type {kind}: params take scalars or arrays of strings");
        }
        files += 1;
    }
    for (id, text) in SUBSCRIPTION_LEXICONS {
        let lexicon = kept(id, text);
        let main = &lexicon["defs"]["main"];
        assert_eq!(main["type"], "subscription", "{id}");
        for reference in main["message"]["schema"]["refs"].as_array().unwrap() {
            let name = reference.as_str().unwrap().strip_prefix('#').unwrap();
            let def = &lexicon["defs"][name];
            assert_eq!(def["type"], "object", "{id}#{name}");
            for required in def["required"].as_array().unwrap() {
                assert!(def["properties"].get(required.as_str().unwrap()).is_some(), "{id}#{name}: {required}");
            }
        }
        files += 1;
    }
    let on_disk = walk(&root).len();
    assert_eq!((files, on_disk), (8, 8), "every lexicon file is served");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

#[test]
fn the_validator_rejects_what_the_schemas_forbid() {
    let lexicons = Lexicons::load();
    let check = |id: &str, value: Value| lexicons.validate(id, lexicons.output_schema(id), &value);
    let list = "blue.cerulea.backlinks.listBacklinks";
    let links = "blue.microcosm.links.getBacklinks";
    let dids = "blue.microcosm.links.getBacklinkDids";
    assert_eq!(check(list, json!({"backlinks": {}, "cursor": null})), Ok(()));
    let record =
        json!({"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "collection": "app.bsky.feed.like", "rkey": "3kaaaaaaaaaaa"});
    assert_eq!(check(links, json!({"total": 1, "records": [record], "cursor": "ab"})), Ok(()));
    let bad = [
        (list, json!({"backlinks": {}}), "missing required field \"cursor\""),
        (list, json!({"backlinks": [], "cursor": null}), "unknown must be an object"),
        (list, json!({"backlinks": {}, "cursor": 3}), "expected a string"),
        (list, json!({"backlinks": {}, "cursor": null, "extra": 1}), "not declared"),
        (links, json!({"total": null, "records": [], "cursor": null}), "null but not nullable"),
        (links, json!({"total": -1, "records": [], "cursor": null}), "out of range"),
        (links, json!({"total": 1.5, "records": [], "cursor": null}), "expected an integer"),
        (
            links,
            json!({"total": 0, "records": [{"did": "bob", "collection": "a.b.c", "rkey": "x"}], "cursor": null}),
            "not a did",
        ),
        (
            links,
            json!({"total": 0, "records": [{"did": "did:plc:x"}], "cursor": null}),
            "missing required field \"collection\"",
        ),
        (links, json!({"total": 0, "records": [], "cursor": null, "approximate": "yes"}), "expected a boolean"),
        (dids, json!({"total": 0, "linking_dids": "did:plc:x", "cursor": null}), "expected an array"),
    ];
    for (id, value, expected) in bad {
        let error = check(id, value.clone()).expect_err(&format!("{id} accepted {value}"));
        assert!(error.contains(expected), "{id} {value}: {error}");
    }
    let dangling = json!({"type": "ref", "ref": "#nope"});
    assert!(lexicons.validate(links, &dangling, &json!({})).unwrap_err().contains("unresolved ref"));
    let odd = json!({"type": "blob"});
    assert!(lexicons.validate(links, &odd, &json!({})).unwrap_err().contains("unsupported schema type"));
    // A ref to itself ends at the depth limit instead of looping.
    let looping = json!({"lexicon": 1, "id": "com.example.loop", "defs": {"main": {"type": "ref", "ref": "#main"}}});
    let looping = Lexicons::of(&[("com.example.loop", &looping.to_string())]);
    let error = looping.validate("com.example.loop", &json!({"type": "ref", "ref": "#main"}), &json!({})).unwrap_err();
    assert!(error.contains("schema nesting deeper than"), "{error}");
}

const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";
const LIKED: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
const REPLIED: &str = "at://did:plc:j76trmiofvaxxpvx2vnb2vwf/app.bsky.feed.post/3mmojbrjwbs26";
const FOLLOWED: &str = "did:plc:anc6s2kher6ltrhhglxrzxsa";
const UNKNOWN: &str = "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz";

async fn get(router: &axum::Router, path: &str, pairs: &[(&str, &str)]) -> Value {
    let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    let request = Request::get(format!("/xrpc/{path}?{query}")).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}?{query}");
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn real_answers_of_every_endpoint_match_their_lexicon() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DirStore::new(dir.path().join("bucket")));
    let index = Index::open(&dir.path().join("data"), store, IndexOptions::default(), 3).unwrap();
    import_lines(&index, std::io::BufReader::new(std::fs::File::open(CAPTURE).unwrap())).unwrap();
    let index = Arc::new(index);
    let exact = app(index.clone(), ServerOptions::default(), Arc::new(Metrics::new()));
    let estimating = ServerOptions { count: CountOptions { exact_scan_limit: 1 }, ..ServerOptions::default() };
    let estimating = app(index, estimating, Arc::new(Metrics::new()));
    let lexicons = Lexicons::load();
    let like = ("source", "app.bsky.feed.like:subject.uri");
    let reply = [("source", "app.bsky.feed.post:reply.parent.uri"), ("pathToOther", "reply.root.uri")];
    let mut checked = HashMap::<&str, usize>::new();
    let mut approximate = 0;
    for router in [&exact, &estimating] {
        let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
            ("blue.cerulea.backlinks.listBacklinks", vec![("target", LIKED)]),
            ("blue.cerulea.backlinks.listBacklinks", vec![("target", REPLIED), ("limit", "1")]),
            ("blue.cerulea.backlinks.listBacklinks", vec![("target", UNKNOWN)]),
            ("blue.cerulea.backlinks.countBacklinks", vec![("target", REPLIED)]),
            ("blue.cerulea.backlinks.countBacklinks", vec![("target", UNKNOWN)]),
            ("blue.microcosm.links.getBacklinks", vec![("subject", LIKED), like]),
            (
                "blue.microcosm.links.getBacklinks",
                vec![("subject", FOLLOWED), ("source", "app.bsky.graph.follow:subject")],
            ),
            ("blue.microcosm.links.getBacklinks", vec![("subject", UNKNOWN), like]),
            ("blue.microcosm.links.getBacklinksCount", vec![("subject", LIKED), like]),
            ("blue.microcosm.links.getBacklinkDids", vec![("subject", LIKED), like]),
            ("blue.microcosm.links.getBacklinkDids", vec![("subject", UNKNOWN), like]),
            ("blue.microcosm.links.getManyToMany", vec![("subject", REPLIED), reply[0], reply[1]]),
            ("blue.microcosm.links.getManyToMany", vec![("subject", UNKNOWN), reply[0], reply[1]]),
            ("blue.microcosm.links.getManyToManyCounts", vec![("subject", REPLIED), reply[0], reply[1]]),
        ];
        for (id, pairs) in cases {
            let body = get(router, id, &pairs).await;
            let result = lexicons.validate(id, lexicons.output_schema(id), &body);
            assert_eq!(result, Ok(()), "{id} {pairs:?}: {body}");
            approximate += usize::from(body["approximate"] == true);
            *checked.entry(id).or_default() += 1;
        }
    }
    assert_eq!(checked.len(), LEXICONS.len(), "every endpoint was checked");
    assert!(approximate >= 4, "estimates were checked too ({approximate})");
}
