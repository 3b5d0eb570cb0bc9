//! Every writing command collects garbage as `serve` does: `import` and `backfill` into a bucket
//! that already holds tables retire some of them in their merges, keep them through the grace
//! period (a reader may still hold a manifest naming them), and delete them once it is over. The
//! real binary, a local-directory bucket, and the grace period set through the environment.

mod support;

use backlinks::manifest::Manifest;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::BIN;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_backlinks-workload");

/// Small memtables and a fan-in of two: every few hundred links flush, and two runs merge.
const CONFIG: &str = "memtable_bytes = 65536\ncompaction_fan_in = 2\n";

struct Setup {
    _dir: tempfile::TempDir,
    data: PathBuf,
    bucket: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("backlinks.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let (data, bucket) = (dir.path().join("data"), dir.path().join("bucket"));
        Setup { data, bucket, config, _dir: dir }
    }

    /// Runs `backlinks COMMAND --config .. --data-dir .. --store .. ARGS` with the grace period
    /// `gc_grace_secs` (the default when `None`); panics unless it succeeds.
    fn run(&self, command: &str, args: &[&str], gc_grace_secs: Option<u64>) {
        let mut cmd = Command::new(BIN);
        cmd.arg(command).arg("--config").arg(&self.config).arg("--data-dir").arg(&self.data);
        cmd.arg("--store").arg(format!("file://{}", self.bucket.display())).args(args);
        cmd.env_remove("BACKLINKS_GC_GRACE_SECS").env("RUST_LOG", "warn");
        if let Some(secs) = gc_grace_secs {
            cmd.env("BACKLINKS_GC_GRACE_SECS", secs.to_string());
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{command} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Every object under `tables/`.
    fn table_objects(&self) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        for tree in backlinks::model::ids::TreeKind::ALL.map(|kind| kind.name()) {
            let Ok(entries) = std::fs::read_dir(self.bucket.join("tables").join(tree)) else { continue };
            for entry in entries {
                found.insert(format!("tables/{tree}/{}", entry.unwrap().file_name().to_string_lossy()));
            }
        }
        found
    }

    /// The objects of the tables the bucket's CURRENT manifest names.
    fn named_objects(&self) -> BTreeSet<String> {
        let name = std::fs::read_to_string(self.bucket.join("CURRENT")).unwrap();
        let body = std::fs::read(self.bucket.join("manifests").join(&name)).unwrap();
        let manifest = Manifest::decode(&name, &body).unwrap();
        let keys = manifest
            .tables
            .iter()
            .flat_map(|t| ["data", "meta"].map(|ext| format!("tables/{}/{}.{ext}", t.tree, t.id)));
        keys.collect()
    }

    /// `backlinks query` for `target`, as JSON text.
    fn query(&self, target: &str) -> String {
        let out = Command::new(BIN)
            .args(["query", "--data-dir"])
            .arg(&self.data)
            .arg("--store")
            .arg(format!("file://{}", self.bucket.display()))
            .args([target, "--limit", "1000"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Checks the three stages of one writing command's garbage: after the first run the bucket
    /// holds exactly what its manifest names; a second run on more input retires some of those
    /// tables but keeps them (default grace); a third, with no grace, deletes exactly those.
    fn check_collection(
        &self,
        first: &dyn Fn(&Setup, Option<u64>),
        second: &dyn Fn(&Setup, Option<u64>),
        third: &dyn Fn(&Setup, Option<u64>),
    ) {
        first(self, None);
        let published = self.named_objects();
        assert_eq!(self.table_objects(), published, "after the first run the bucket holds what its manifest names");
        second(self, None);
        let retired: BTreeSet<String> = self.table_objects().difference(&self.named_objects()).cloned().collect();
        assert!(!retired.is_empty(), "the second run's merges retired some of the first run's tables");
        assert!(retired.is_subset(&published), "only published tables wait out their grace: {retired:?}");
        third(self, Some(0));
        assert_eq!(self.table_objects(), self.named_objects(), "with the grace over, retired tables are deleted");
        assert!(self.table_objects().is_disjoint(&retired));
    }
}

/// A seeded workload of `events` Jetstream lines, split into two files.
fn workload(dir: &Path, events: u64) -> (PathBuf, PathBuf) {
    let out = Command::new(WORKLOAD).args(["--seed", "5", "--events", &events.to_string()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&[u8]> = out.stdout.split_inclusive(|&b| b == b'\n').collect();
    let (a, b) = lines.split_at(lines.len() / 2);
    let (first, second) = (dir.join("first.jsonl"), dir.join("second.jsonl"));
    std::fs::write(&first, a.concat()).unwrap();
    std::fs::write(&second, b.concat()).unwrap();
    (first, second)
}

#[test]
fn import_collects_what_its_merges_retired_after_the_grace_period() {
    let setup = Setup::new();
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = workload(dir.path(), 6_000);
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let import = |file: PathBuf| {
        move |setup: &Setup, grace: Option<u64>| {
            setup.run("import", &[file.to_str().unwrap()], grace);
        }
    };
    setup.check_collection(&import(first.clone()), &import(second.clone()), &import(empty));

    // The collected index answers as one import of the same events does.
    let fresh = Setup::new();
    let both = dir.path().join("both.jsonl");
    std::fs::write(&both, [std::fs::read(&first).unwrap(), std::fs::read(&second).unwrap()].concat()).unwrap();
    fresh.run("import", &[both.to_str().unwrap()], None);
    let targets = authors(&both, 40);
    assert_eq!(targets.len(), 40);
    for target in targets {
        assert_eq!(setup.query(&target), fresh.query(&target), "{target}");
    }
}

/// The first `n` distinct authors (`"did"` of each line) of a workload file.
fn authors(file: &Path, n: usize) -> Vec<String> {
    let mut found = Vec::new();
    for line in std::fs::read_to_string(file).unwrap().lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        let did = event["did"].as_str().unwrap().to_string();
        if !found.contains(&did) {
            found.push(did);
        }
        if found.len() == n {
            break;
        }
    }
    found
}

#[test]
fn backfill_collects_what_its_merges_retired_after_the_grace_period() {
    let setup = Setup::new();
    let dir = tempfile::tempdir().unwrap();
    let cars: Vec<PathBuf> = (0..5)
        .map(|i| {
            let path = dir.path().join(format!("repo{i}.car"));
            let did = format!("did:plc:backfillgc{i:014}");
            std::fs::write(&path, support::car_writer::generated_repo(&did, 1_500)).unwrap();
            path
        })
        .collect();
    let backfill = |cars: &'static [usize], paths: &[PathBuf]| {
        let args: Vec<String> =
            cars.iter().flat_map(|&i| ["--car".to_string(), paths[i].display().to_string()]).collect();
        move |setup: &Setup, grace: Option<u64>| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            setup.run("backfill", &args, grace)
        }
    };
    setup.check_collection(&backfill(&[0, 1], &cars), &backfill(&[2, 3], &cars), &backfill(&[4], &cars));
}
