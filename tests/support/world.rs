//! The world backfill tests run in: the real repository CARs of the fixtures, the same records
//! re-signed under test identities (for backfills that verify signatures), the JSON rules'
//! answers for them, and the index's answers to compare.
#![allow(dead_code)]

use super::car_writer::rehome;
use super::pds_server::{SyncServer, SyncServerBuilder};
use super::plc::TestIdentity;
use super::run;
use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::repo::{CarLimits, Expect, Repo, read_repo_bytes};
use backlinks::query::{ListParams, list_backlinks};
use backlinks::store::dir::DirStore;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car");

/// Every whole real repository CAR in the fixtures (each a different DID; the partial slice is
/// a negative case of `car_fixtures`).
pub const CARS: &[&str] = &[
    "jetstream/repo.car",
    "indigo/fakermaker.repo.car",
    "indigo/paul_staging.repo.car",
    "indigo/greenground.repo.car",
    "indigo/divy.repo",
    "indigo/bafyreieovfuizojpw3zresz7sx3nk4trm2by23pt5rxbey3jme4uo5ogiu.car",
    "repo-stream/little.car",
    "repo-stream/tiny.car",
    "repo-stream/empty.car",
    "rsky/valid_repo.car",
];

/// A fixture CAR read with hashes and structure checked (no key: these are not signatures tests).
pub fn read_car(bytes: &[u8]) -> Repo {
    let any = Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };
    read_repo_bytes(bytes, &CarLimits::default(), &any).unwrap()
}

pub fn car_path(name: &str) -> String {
    format!("{DATA}/{name}")
}

pub fn car_bytes(name: &str) -> Vec<u8> {
    std::fs::read(car_path(name)).unwrap()
}

/// Every record of every CAR as a Jetstream v1 create, the input of the JSON rules.
pub fn json_lines(cars: &[Vec<u8>]) -> String {
    let mut out = String::new();
    let mut time_us = 1_700_000_000_000_000i64;
    for car in cars {
        let Repo { commit, records, .. } = read_car(car);
        for record in records {
            time_us += 1;
            let event = serde_json::json!({
                "did": commit.did, "time_us": time_us, "kind": "commit",
                "commit": { "rev": commit.rev, "operation": "create", "collection": record.collection,
                            "rkey": record.rkey, "record": record.record.as_ref(), "cid": record.cid },
            });
            out.push_str(&event.to_string());
            out.push('\n');
        }
    }
    out
}

/// Every link target the records of `cars` name, as query targets.
pub fn targets(cars: &[Vec<u8>]) -> BTreeSet<String> {
    let mut targets = BTreeSet::new();
    for car in cars {
        let Repo { records, .. } = read_car(car);
        for record in &records {
            for link in extract_links(&record.record, &ExtractLimits::default()).links {
                targets.insert(link.target.to_string());
            }
        }
    }
    targets
}

pub type Answers = BTreeMap<String, Vec<(String, String)>>;

/// Every (location, source) backlink of every target, paged through, from the index in `dir`
/// (whose bucket is `dir/bucket`).
pub fn answers(dir: &Path, targets: &BTreeSet<String>) -> Answers {
    answers_with_bucket(dir, &dir.join("bucket"), targets)
}

pub fn answers_with_bucket(dir: &Path, bucket: &Path, targets: &BTreeSet<String>) -> Answers {
    let store = Arc::new(DirStore::new(bucket.to_path_buf()));
    let options = IndexOptions { read_only: true, ..IndexOptions::default() };
    let index = Index::open(dir, store, options, 1).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out = Answers::new();
    for target in targets {
        let mut params = ListParams::new(target.clone());
        params.limit = 7;
        let mut all = Vec::new();
        loop {
            let page = runtime.block_on(list_backlinks(&index, &params)).unwrap();
            all.extend(page.items);
            match page.cursor {
                Some(cursor) => params.cursor = Some(backlinks::query::Cursor::decode(&cursor).unwrap()),
                None => break,
            }
        }
        all.sort();
        if !all.is_empty() {
            out.insert(target.clone(), all);
        }
    }
    out
}

/// Imports the JSON rendering of `cars` into a fresh index; returns its answers.
pub fn json_rule_answers(cars: &[Vec<u8>], scratch: &Path, targets: &BTreeSet<String>) -> Answers {
    let lines = scratch.join("records.jsonl");
    std::fs::write(&lines, json_lines(cars)).unwrap();
    let dir = scratch.join("json");
    let (ok, _, stderr) = run(&["import", "--data-dir", dir.to_str().unwrap(), lines.to_str().unwrap()]);
    assert!(ok, "import failed: {stderr}");
    answers(&dir, targets)
}

pub fn summary(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{stdout:?}: {e}"))
}

pub fn link_count(answers: &Answers) -> usize {
    answers.values().map(Vec::len).sum()
}

/// The fixture repositories that hold a whole tree, re-signed under test identities: the same
/// records, byte for byte, in repositories whose signatures the backfill can check.
pub struct World {
    pub identities: Vec<TestIdentity>,
    pub cars: Vec<Vec<u8>>,
}

/// The revision every re-signed repository is at (2024, in the past).
pub const RESIGNED_REV: &str = "3kznmn7xqxl22";

impl World {
    pub fn new(names: &[&str]) -> Self {
        let identities: Vec<TestIdentity> = (0..names.len()).map(|i| TestIdentity::new(i as u8 + 1)).collect();
        let cars = names
            .iter()
            .zip(&identities)
            .map(|(name, identity)| rehome(&car_bytes(name), &identity.did, RESIGNED_REV, &identity.key))
            .collect();
        World { identities, cars }
    }

    /// A PLC directory that places every identity on the PDS `pds_of(index)` names.
    pub async fn directory(&self, pds_of: impl Fn(usize) -> String) -> SyncServer {
        self.directory_builder(pds_of).start().await
    }

    /// The same directory answering only its bulk export.
    pub async fn export_only_directory(&self, pds_of: impl Fn(usize) -> String) -> SyncServer {
        self.directory_builder(pds_of).export_only().start().await
    }

    fn directory_builder(&self, pds_of: impl Fn(usize) -> String) -> SyncServerBuilder {
        let mut builder = SyncServerBuilder::new();
        for (i, identity) in self.identities.iter().enumerate() {
            builder = builder.plc_log(&identity.did, identity.audit_log(&pds_of(i)));
        }
        builder
    }
}
