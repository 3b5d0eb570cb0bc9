//! `extract_links` against real data:
//! - every record of a real Jetstream v1 capture (tests/data/jetstream), with the expected links
//!   written out by hand from the rules of docs/design.md;
//! - every at-uri, DID and strong-reference field reachable from the record lexicons
//!   (tests/data/lexicons): a walk of each record schema predicts the location of each such field,
//!   builds a record holding a value there, and checks that exactly that link comes out.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use backlinks::extract::{ExtractLimits, ExtractStats, Link, extract_links};
use backlinks::model::syntax::LinkTarget;
use serde_json::{Map, Value, json};

fn data_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// (a) The Jetstream capture.

const fn record(did: &'static str, collection: &'static str, rkey: &'static str) -> LinkTarget<'static> {
    LinkTarget::Record { did, collection, rkey }
}

/// (collection, rkey) of each commit with a record, and its links in first-seen order.
type ExpectedRecord = (&'static str, &'static str, &'static [(LinkTarget<'static>, &'static str)]);

const POST: &str = "app.bsky.feed.post";

const EXPECTED_JETSTREAM: [ExpectedRecord; 7] = [
    (
        "app.bsky.feed.like",
        "3mmoojp7etg2g",
        &[(record("did:plc:vfnmgxg2yscfliemmcxzyfyh", POST, "3mmoodizfwc2j"), "$.subject")],
    ),
    (
        "app.bsky.feed.post",
        "3mmoojp4cd223",
        &[
            (record("did:plc:j76trmiofvaxxpvx2vnb2vwf", POST, "3mmojbrjwbs26"), "$.reply.parent"),
            (record("did:plc:j76trmiofvaxxpvx2vnb2vwf", POST, "3mmojbrjwbs26"), "$.reply.root"),
        ],
    ),
    (
        "app.bsky.feed.repost",
        "3mmoojpbade2i",
        &[(record("did:plc:hjloomm2tkve3pmfgbxegl3v", POST, "3mmood3a6hc25"), "$.subject")],
    ),
    ("app.bsky.graph.follow", "3mmoojocxvr2s", &[(LinkTarget::Did("did:plc:anc6s2kher6ltrhhglxrzxsa"), "$.subject")]),
    // Avatar and banner blobs hold CIDs (`$link`), which are never links.
    (
        "app.bsky.actor.profile",
        "self",
        &[(record("did:plc:o6t5vwyr7ae73foww7bgye4r", POST, "3meuab5it2s2g"), "$.pinnedPost")],
    ),
    // The websocket URL contains a percent-encoded DID inside a URL: not a link.
    (
        "place.stream.broadcast.origin",
        "did:plc:qlhxnyjaacdu5jvapiqtbgqg::did:web:prod-sea0.stream.place",
        &[
            (LinkTarget::Did("did:web:stream.place"), "$.broadcaster"),
            (LinkTarget::Did("did:web:prod-sea0.stream.place"), "$.server"),
            (LinkTarget::Did("did:plc:qlhxnyjaacdu5jvapiqtbgqg"), "$.streamer"),
        ],
    ),
    ("app.bsky.graph.block", "3mmoojpduny2w", &[(LinkTarget::Did("did:plc:pgsrzsvisagr7wfqasmu3cgf"), "$.subject")]),
];

#[test]
fn jetstream_capture_records_give_the_expected_links() {
    let text = read(&data_dir("jetstream/golden_v1.jsonl"));
    let events: Vec<Value> =
        text.lines().map(|line| serde_json::from_str(line).expect("each line is one JSON event")).collect();
    assert_eq!(events.len(), 10);
    let commits_with_records: Vec<&Value> =
        events.iter().filter(|event| event["kind"] == "commit" && event["commit"].get("record").is_some()).collect();
    assert_eq!(commits_with_records.len(), EXPECTED_JETSTREAM.len());

    for (event, (collection, rkey, expected_links)) in commits_with_records.into_iter().zip(EXPECTED_JETSTREAM) {
        let commit = &event["commit"];
        assert_eq!((commit["collection"].as_str(), commit["rkey"].as_str()), (Some(collection), Some(rkey)));
        let extraction = extract_links(&commit["record"], &ExtractLimits::default());
        let expected: Vec<Link> =
            expected_links.iter().map(|&(target, location)| Link { target, location: location.to_string() }).collect();
        assert_eq!(extraction.links, expected, "{collection}/{rkey}");
        assert_eq!(extraction.stats, ExtractStats::default(), "{collection}/{rkey}");
    }
}

// ---------------------------------------------------------------------------------------------
// (b) The lexicon walk.

const STRONG_REF: &str = "com.atproto.repo.strongRef";
const PROBE_DID: &str = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";
const PROBE_URI: &str = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3jzfcijpj2z2a";
const PROBE_CID: &str = "bafyreiaxf7tgbfydx3465sckitq6v564thxe2wwydbi7cwxbxvgssje3em";
const PROBE_RECORD: LinkTarget<'static> = record(PROBE_DID, POST, "3jzfcijpj2z2a");

/// JSON nesting the walk may build. Lexicons can be recursive; this and the refusal to enter a
/// definition already being walked keep the walk finite. It stays below the extraction depth limit.
const MAX_PROBE_NESTING: usize = 16;

/// Every lexicon document, by NSID.
struct Lexicons {
    documents: HashMap<String, Value>,
}

impl Lexicons {
    fn load(dir: &Path) -> Self {
        let mut documents = HashMap::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("lexicon dir is readable") {
                let path = entry.expect("dir entry").path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|extension| extension == "json") {
                    let document: Value = serde_json::from_str(&read(&path)).expect("lexicon is JSON");
                    let id = document["id"].as_str().expect("lexicon has an id").to_string();
                    documents.insert(id, document);
                }
            }
        }
        Self { documents }
    }

    fn definition(&self, def: &DefId) -> Option<&Value> {
        self.documents.get(&def.nsid)?.get("defs")?.get(&def.name)
    }

    /// NSIDs of the lexicons whose main definition is a record, sorted.
    fn record_lexicons(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .documents
            .iter()
            .filter(|(_, document)| document["defs"]["main"]["type"] == "record")
            .map(|(id, _)| id.as_str())
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// One lexicon definition: `nsid#name`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DefId {
    nsid: String,
    name: String,
}

impl DefId {
    /// Resolves a `ref` written in lexicon `current`: `#name`, `nsid#name` or `nsid` (main).
    fn resolve(current: &str, reference: &str) -> Self {
        let (nsid, name) = reference.split_once('#').unwrap_or((reference, "main"));
        let nsid = if nsid.is_empty() { current } else { nsid };
        DefId { nsid: nsid.to_string(), name: name.to_string() }
    }

    /// The `$type` a value of this definition carries in a union.
    fn type_name(&self) -> String {
        if self.name == "main" { self.nsid.clone() } else { format!("{}#{}", self.nsid, self.name) }
    }

    fn is_strong_ref(&self) -> bool {
        self.nsid == STRONG_REF && self.name == "main"
    }
}

/// How the probe record is built from its root, one level at a time.
#[derive(Debug, Clone)]
enum Step {
    /// An object holding the rest under this key.
    Field(String),
    /// An array holding the rest as its only element.
    Element,
    /// The object built so far is a union member with this `$type`.
    Typed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Leaf {
    AtUri,
    Did,
    StrongRef,
}

#[derive(Debug)]
struct Probe {
    lexicon: String,
    steps: Vec<Step>,
    leaf: Leaf,
    /// Where the rules put the link, worked out by the walk.
    location: String,
}

impl Probe {
    fn build_record(&self) -> Value {
        let mut value = match self.leaf {
            Leaf::AtUri => json!(PROBE_URI),
            Leaf::Did => json!(PROBE_DID),
            Leaf::StrongRef => json!({"uri": PROBE_URI, "cid": PROBE_CID}),
        };
        for step in self.steps.iter().rev() {
            value = match step {
                Step::Field(name) => Value::Object(Map::from_iter([(name.clone(), value)])),
                Step::Element => Value::Array(vec![value]),
                Step::Typed(type_name) => {
                    value
                        .as_object_mut()
                        .expect("a union member is an object")
                        .insert("$type".into(), json!(type_name));
                    value
                }
            };
        }
        value.as_object_mut().expect("a record is an object").insert("$type".into(), json!(self.lexicon));
        value
    }

    fn expected_target(&self) -> LinkTarget<'static> {
        match self.leaf {
            Leaf::AtUri | Leaf::StrongRef => PROBE_RECORD,
            Leaf::Did => LinkTarget::Did(PROBE_DID),
        }
    }
}

/// Walks one record schema, collecting a probe per link-bearing field.
struct SchemaWalk<'l> {
    lexicons: &'l Lexicons,
    lexicon: String,
    steps: Vec<Step>,
    location: String,
    /// Definitions being walked, outermost first: entering one again would loop.
    active: Vec<DefId>,
    probes: Vec<Probe>,
}

impl<'l> SchemaWalk<'l> {
    fn run(lexicons: &'l Lexicons, lexicon: &str) -> Vec<Probe> {
        let main = DefId { nsid: lexicon.to_string(), name: "main".to_string() };
        let schema = &lexicons.definition(&main).expect("record lexicon has a main def")["record"];
        let mut walk = SchemaWalk {
            lexicons,
            lexicon: lexicon.to_string(),
            steps: Vec::new(),
            location: "$".to_string(),
            active: vec![main],
            probes: Vec::new(),
        };
        walk.schema(lexicon, schema);
        walk.probes
    }

    fn emit(&mut self, leaf: Leaf) {
        let probe =
            Probe { lexicon: self.lexicon.clone(), steps: self.steps.clone(), leaf, location: self.location.clone() };
        self.probes.push(probe);
    }

    fn nesting(&self) -> usize {
        self.steps.iter().filter(|step| !matches!(step, Step::Typed(_))).count()
    }

    /// Walks `schema`, written in lexicon `current`, for a value at the current location.
    fn schema(&mut self, current: &str, schema: &Value) {
        match schema["type"].as_str() {
            Some("object") => self.object(current, schema),
            Some("array") => self.array(current, &schema["items"]),
            Some("union") => {
                for member in union_members(current, schema) {
                    self.steps.push(Step::Typed(member.type_name()));
                    self.definition(&member);
                    self.steps.pop();
                }
            }
            Some("ref") => self.definition(&DefId::resolve(current, schema["ref"].as_str().expect("ref is a string"))),
            Some("string") => match schema["format"].as_str() {
                Some("at-uri") => self.emit(Leaf::AtUri),
                Some("did") => self.emit(Leaf::Did),
                _ => {}
            },
            _ => {}
        }
    }

    fn object(&mut self, current: &str, schema: &Value) {
        let Some(properties) = schema["properties"].as_object() else { return };
        if self.nesting() >= MAX_PROBE_NESTING {
            return;
        }
        for (name, property) in properties {
            let mark = self.location.len();
            self.location.push('.');
            self.location.push_str(name);
            self.steps.push(Step::Field(name.clone()));
            self.schema(current, property);
            self.steps.pop();
            self.location.truncate(mark);
        }
    }

    /// Array elements: `[]`, except union members, which carry their `$type` and so get `[T]`.
    fn array(&mut self, current: &str, items: &Value) {
        if self.nesting() >= MAX_PROBE_NESTING {
            return;
        }
        let mark = self.location.len();
        if items["type"] == "union" {
            for member in union_members(current, items) {
                self.location.push_str(&format!("[{}]", member.type_name()));
                self.steps.extend([Step::Element, Step::Typed(member.type_name())]);
                self.definition(&member);
                self.steps.truncate(self.steps.len() - 2);
                self.location.truncate(mark);
            }
        } else {
            self.location.push_str("[]");
            self.steps.push(Step::Element);
            self.schema(current, items);
            self.steps.pop();
            self.location.truncate(mark);
        }
    }

    /// A referenced definition, at the current location. A strong reference is a leaf.
    fn definition(&mut self, def: &DefId) {
        if def.is_strong_ref() {
            self.emit(Leaf::StrongRef);
            return;
        }
        if self.active.contains(def) {
            return;
        }
        let Some(schema) = self.lexicons.definition(def) else { return };
        self.active.push(def.clone());
        self.schema(&def.nsid.clone(), schema);
        self.active.pop();
    }
}

/// The members of a union schema, as definitions.
fn union_members(current: &str, union: &Value) -> Vec<DefId> {
    let references = union["refs"].as_array().map(Vec::as_slice).unwrap_or_default();
    references.iter().filter_map(Value::as_str).map(|reference| DefId::resolve(current, reference)).collect()
}

#[test]
fn every_link_field_of_every_record_lexicon_is_found_where_predicted() {
    let lexicons = Lexicons::load(&data_dir("lexicons"));
    assert_eq!(lexicons.documents.len(), 43);
    let record_lexicons = lexicons.record_lexicons();
    assert_eq!(record_lexicons.len(), 26);

    let mut checked: BTreeMap<Leaf, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for lexicon in record_lexicons {
        for probe in SchemaWalk::run(&lexicons, lexicon) {
            let record = probe.build_record();
            let extraction = extract_links(&record, &ExtractLimits::default());
            let expected = vec![Link { target: probe.expected_target(), location: probe.location.clone() }];
            if extraction.links != expected || extraction.stats != ExtractStats::default() {
                failures.push(format!("{lexicon} {probe:?}: got {:?} {:?}", extraction.links, extraction.stats));
            }
            *checked.entry(probe.leaf).or_default() += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("lexicon fields checked: {checked:?}");
    let expected_counts = BTreeMap::from([(Leaf::AtUri, 11), (Leaf::Did, 10), (Leaf::StrongRef, 15)]);
    assert_eq!(checked, expected_counts);
}

#[test]
fn the_walk_predicts_the_well_known_bluesky_locations() {
    let lexicons = Lexicons::load(&data_dir("lexicons"));
    // Sorted, so that the check does not depend on the map order of serde_json.
    let locations = |lexicon: &str| -> Vec<String> {
        let mut locations: Vec<String> =
            SchemaWalk::run(&lexicons, lexicon).into_iter().map(|probe| probe.location).collect();
        locations.sort();
        locations
    };
    assert_eq!(locations("app.bsky.feed.like"), ["$.subject", "$.via"]);
    assert_eq!(locations("app.bsky.graph.follow"), ["$.subject", "$.via"]);
    assert_eq!(
        locations("app.bsky.feed.post"),
        [
            "$.embed.external.associatedRefs[]",
            "$.embed.media.external.associatedRefs[]",
            "$.embed.record",
            "$.embed.record.record",
            "$.facets[].features[app.bsky.richtext.facet#mention].did",
            "$.reply.parent",
            "$.reply.root",
        ]
    );
    assert_eq!(
        locations("app.bsky.feed.threadgate"),
        ["$.allow[app.bsky.feed.threadgate#listRule].list", "$.hiddenReplies[]", "$.post"]
    );
    assert_eq!(
        locations("app.bsky.graph.starterpack"),
        ["$.descriptionFacets[].features[app.bsky.richtext.facet#mention].did", "$.feeds[].uri", "$.list"]
    );
}
