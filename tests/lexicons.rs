//! The lexicons in `lexicons/` against the server's real answers: a small validator for the part
//! of the lexicon schema language they use (object, array, string with formats, integer, boolean,
//! ref, unknown; required and nullable) checks every endpoint's JSON output, including estimates
//! and last pages. The validator is strict where lexicons are lenient: a field the schema does not
//! declare is an error, so the lexicons must document everything the server says. It is tested on
//! bad values too, so a lax validator cannot pass by accident.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use backlinks::count::CountOptions;
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::metrics::Metrics;
use backlinks::model::syntax::{parse_target, validate_did, validate_nsid, validate_record_key};
use backlinks::server::{LEXICONS, SUBSCRIPTION_LEXICONS, ServerOptions, app};
use backlinks::store::dir::DirStore;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tower::ServiceExt;

/// Deepest schema nesting the validator follows (refs included), so a cyclic ref cannot loop.
const MAX_DEPTH: usize = 32;

struct Lexicons {
    by_id: HashMap<String, Value>,
}

impl Lexicons {
    fn load() -> Self {
        let by_id = LEXICONS.iter().map(|(id, text)| (id.to_string(), serde_json::from_str(text).unwrap())).collect();
        Lexicons { by_id }
    }

    fn output_schema(&self, id: &str) -> &Value {
        &self.by_id[id]["defs"]["main"]["output"]["schema"]
    }

    /// Resolves `#name` (in `current`), `nsid#name` or `nsid` (its main).
    fn resolve(&self, current: &str, reference: &str) -> Result<(String, &Value), String> {
        let (id, name) = match reference.split_once('#') {
            Some(("", name)) => (current, name),
            Some((id, name)) => (id, name),
            None => (reference, "main"),
        };
        let def = self.by_id.get(id).map(|lexicon| &lexicon["defs"][name]).filter(|d| !d.is_null());
        def.map(|d| (id.to_string(), d)).ok_or_else(|| format!("unresolved ref {reference:?}"))
    }

    /// Checks `value` against `schema`; `path` names the place in errors.
    fn validate(&self, current: &str, schema: &Value, value: &Value, path: &str, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("{path}: schema nesting deeper than {MAX_DEPTH}"));
        }
        let fail = |what: String| Err(format!("{path}: {what}"));
        match schema["type"].as_str().unwrap_or("") {
            "object" => self.validate_object(current, schema, value, path, depth),
            "array" => {
                let Some(items) = value.as_array() else { return fail(format!("expected an array, got {value}")) };
                check_length(schema, items.len(), path)?;
                for (i, item) in items.iter().enumerate() {
                    self.validate(current, &schema["items"], item, &format!("{path}[{i}]"), depth + 1)?;
                }
                Ok(())
            }
            "string" => {
                let Some(text) = value.as_str() else { return fail(format!("expected a string, got {value}")) };
                check_length(schema, text.len(), path)?;
                check_format(schema["format"].as_str(), text).map_err(|e| format!("{path}: {e}"))
            }
            "integer" => {
                let Some(n) = value.as_i64() else { return fail(format!("expected an integer, got {value}")) };
                let below = schema["minimum"].as_i64().is_some_and(|min| n < min);
                let above = schema["maximum"].as_i64().is_some_and(|max| n > max);
                if below || above { fail(format!("{n} is out of range")) } else { Ok(()) }
            }
            "boolean" if value.is_boolean() => Ok(()),
            "boolean" => fail(format!("expected a boolean, got {value}")),
            "unknown" if value.is_object() => Ok(()),
            "unknown" => fail(format!("unknown must be an object, got {value}")),
            "ref" => {
                let reference = schema["ref"].as_str().ok_or_else(|| format!("{path}: ref without a target"))?;
                let (id, def) = self.resolve(current, reference)?;
                self.validate(&id, def, value, path, depth + 1)
            }
            other => fail(format!("unsupported schema type {other:?}")),
        }
    }

    fn validate_object(
        &self,
        current: &str,
        schema: &Value,
        value: &Value,
        path: &str,
        depth: usize,
    ) -> Result<(), String> {
        let Some(object) = value.as_object() else { return Err(format!("{path}: expected an object, got {value}")) };
        let names = |key: &str| -> Vec<&str> {
            schema[key].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
        };
        let (required, nullable) = (names("required"), names("nullable"));
        let properties = schema["properties"].as_object().cloned().unwrap_or_else(Map::new);
        for name in &required {
            if !object.contains_key(*name) {
                return Err(format!("{path}: missing required field {name:?}"));
            }
        }
        for (name, field) in object {
            let field_path = format!("{path}.{name}");
            let Some(field_schema) = properties.get(name) else {
                return Err(format!("{field_path}: field not declared in the lexicon"));
            };
            if field.is_null() {
                if !nullable.contains(&name.as_str()) {
                    return Err(format!("{field_path}: null but not nullable"));
                }
                continue;
            }
            self.validate(current, field_schema, field, &field_path, depth + 1)?;
        }
        Ok(())
    }
}

fn check_length(schema: &Value, len: usize, path: &str) -> Result<(), String> {
    let too_short = schema["minLength"].as_u64().is_some_and(|min| (len as u64) < min);
    let too_long = schema["maxLength"].as_u64().is_some_and(|max| (len as u64) > max);
    if too_short || too_long { Err(format!("{path}: length {len} out of bounds")) } else { Ok(()) }
}

fn check_format(format: Option<&str>, text: &str) -> Result<(), String> {
    match format {
        None => Ok(()),
        Some("did") => validate_did(text).map_err(|e| format!("not a did: {e}")),
        Some("nsid") => validate_nsid(text).map_err(|e| format!("not an nsid: {e}")),
        Some("record-key") => validate_record_key(text).map_err(|e| format!("not a record key: {e}")),
        Some("at-uri") => parse_target(text).map(|_| ()).map_err(|e| format!("not an at-uri: {e}")),
        Some(other) => Err(format!("unsupported format {other:?}")),
    }
}

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
    assert_eq!((files, on_disk), (6, 6), "every lexicon file is served");
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
    let check = |id: &str, value: Value| lexicons.validate(id, lexicons.output_schema(id), &value, "$", 0);
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
    assert!(lexicons.validate(links, &dangling, &json!({}), "$", 0).unwrap_err().contains("unresolved ref"));
    let odd = json!({"type": "blob"});
    assert!(lexicons.validate(links, &odd, &json!({}), "$", 0).unwrap_err().contains("unsupported schema type"));
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
        ];
        for (id, pairs) in cases {
            let body = get(router, id, &pairs).await;
            let result = lexicons.validate(id, lexicons.output_schema(id), &body, "$", 0);
            assert_eq!(result, Ok(()), "{id} {pairs:?}: {body}");
            approximate += usize::from(body["approximate"] == true);
            *checked.entry(id).or_default() += 1;
        }
    }
    assert_eq!(checked.len(), LEXICONS.len(), "every endpoint was checked");
    assert!(approximate >= 4, "estimates were checked too ({approximate})");
}
