//! A flipped bit in any object - a table's `.data` or `.meta` (in the bucket or its local copy), a
//! manifest, an outline range - is caught by its checksum, logged, counted by kind and place, and
//! answered with an error naming the object, never served as data; `backlinks verify` names it too
//! and exits non-zero. A corrupt local copy of an uploaded table is replaced by the bucket's.
//! The last test does it end to end with the real binary: HTTP 500s, `/metrics`, `verify`'s exit.

mod support;

use backlinks::base::corruption::{ObjectKind, Place, corrupt_objects};
use backlinks::count::{CountOptions, count_backlinks};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::query::{ListParams, QueryError, list_backlinks};
use backlinks::store::dir::DirStore;
use backlinks::verify::{Status, verify_bucket, verify_local};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use support::{BIN, CAPTURE};

/// The capture's liked post and the like that links to it.
const TARGET: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
const LIKE: &str = "at://did:plc:mcc5yghbk7tixqryac2yxku7/app.bsky.feed.like/3mmoojp7etg2g";

/// The corruption counters are process-wide: tests that read them take turns.
static COUNTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One frame per table (so every flipped data bit is in the frame a query reads), no decoded-frame
/// cache (every query reads the bytes).
fn options(cache_bytes: u64) -> IndexOptions {
    IndexOptions { cache_bytes, frame_cache_bytes: 0, ..IndexOptions::default() }
}

struct Setup {
    root: tempfile::TempDir,
    index: Index,
}

impl Setup {
    /// Imports the capture into `<root>/writer`; publishes (uploading every table, then trimming
    /// local copies to `cache_bytes`) when `publish`.
    async fn new(cache_bytes: u64, publish: bool) -> Self {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(DirStore::new(root.path().join("bucket")));
        let index = Index::open(&root.path().join("writer"), store, options(cache_bytes), 1).unwrap();
        import_lines(&index, std::fs::read(CAPTURE).unwrap().as_slice()).unwrap();
        if publish {
            index.publish_manifest().await.unwrap();
        }
        Setup { root, index }
    }

    fn bucket(&self) -> PathBuf {
        self.root.path().join("bucket")
    }

    /// The one object (bucket-relative key) under `dir` whose name ends with `suffix`.
    fn bucket_key(&self, dir: &str, suffix: &str) -> String {
        let found = files_under(&self.bucket().join(dir), suffix);
        assert_eq!(found.len(), 1, "objects under {dir} ending {suffix}: {found:?}");
        let name = found[0].file_name().unwrap().to_str().unwrap();
        format!("{dir}/{name}")
    }

    fn local_file(&self, suffix: &str) -> PathBuf {
        let found = files_under(&self.root.path().join("writer/state/tables/links"), suffix);
        assert_eq!(found.len(), 1, "local links files ending {suffix}: {found:?}");
        found[0].clone()
    }

    /// Opens a new, empty data directory on the same bucket and restores it.
    async fn restore_fresh(&self, name: &str) -> Result<Index, backlinks::index::IndexError> {
        let store = Arc::new(DirStore::new(self.bucket()));
        let index = Index::open(&self.root.path().join(name), store, options(1 << 30), 2)?;
        index.restore_if_empty(10).await?;
        Ok(index)
    }
}

fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_str().is_some_and(|p| p.ends_with(suffix)))
        .collect();
    found.sort();
    found
}

/// Flips bit `at % 8` of byte `at` of `path`; returns the original bytes.
fn flip(path: &Path, at: usize) -> Vec<u8> {
    let original = std::fs::read(path).unwrap();
    let mut bytes = original.clone();
    bytes[at] ^= 1 << (at % 8);
    std::fs::write(path, bytes).unwrap();
    original
}

/// Byte offsets spread over a file of `len` bytes: the first, the last and some between.
fn spread(len: usize) -> Vec<usize> {
    let mut offsets: Vec<usize> = (0..len).step_by((len / 12).max(1)).collect();
    offsets.push(len - 1);
    offsets
}

async fn list(index: &Index) -> Result<Vec<(String, String)>, QueryError> {
    Ok(list_backlinks(index, &ListParams::new(TARGET)).await?.items)
}

async fn count(index: &Index) -> Result<u64, QueryError> {
    Ok(count_backlinks(index, &ListParams::new(TARGET), CountOptions::default()).await?.total)
}

fn expected() -> Vec<(String, String)> {
    vec![("$.subject".to_string(), LIKE.to_string())]
}

/// The error must be an internal one that names `object`.
fn assert_names<T: std::fmt::Debug>(result: Result<T, QueryError>, object: &str) {
    match result {
        Err(QueryError::Internal(message)) => {
            assert!(message.contains(&format!("corrupt object {object}")), "{message}")
        }
        other => panic!("expected an internal error naming {object}, got {other:?}"),
    }
}

/// What `verify_bucket` says about each object that is not ok.
async fn bucket_problems(bucket: &Path) -> Vec<(String, &'static str)> {
    let report = verify_bucket(&DirStore::new(bucket.to_path_buf())).await;
    report
        .checked
        .into_iter()
        .filter(|c| c.status != Status::Ok)
        .map(|c| {
            let word = match c.status {
                Status::Corrupt(_) => "corrupt",
                Status::Missing => "missing",
                Status::Unreadable(_) => "unreadable",
                Status::Ok => unreachable!(),
            };
            (c.object, word)
        })
        .collect()
}

#[tokio::test]
async fn a_flipped_bit_in_a_bucket_data_file_is_a_named_error_never_data() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(0, true).await;
    let key = setup.bucket_key("tables/links", ".data");
    let path = setup.bucket().join(&key);
    assert!(files_under(&setup.root.path().join("writer/state/tables/links"), ".data").is_empty(), "evicted");
    assert_eq!(list(&setup.index).await.unwrap(), expected());
    assert_eq!(bucket_problems(&setup.bucket()).await, []);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    for at in spread(len) {
        let before = corrupt_objects(ObjectKind::Data, Place::Bucket);
        let original = flip(&path, at);
        assert_names(list(&setup.index).await, &key);
        assert_names(count(&setup.index).await, &key);
        assert_eq!(corrupt_objects(ObjectKind::Data, Place::Bucket), before + 2, "flip at {at}");
        assert_eq!(bucket_problems(&setup.bucket()).await, [(key.clone(), "corrupt")], "flip at {at}");
        std::fs::write(&path, original).unwrap();
    }
    assert_eq!(list(&setup.index).await.unwrap(), expected(), "the good bytes answer again");
    assert_eq!(count(&setup.index).await.unwrap(), 1);
}

#[tokio::test]
async fn a_corrupt_local_copy_of_an_uploaded_table_is_replaced_by_the_buckets() {
    let _turn = COUNTERS.lock().await;
    let flipped = |path: &Path| drop(flip(path, 40));
    let truncated = |path: &Path| std::fs::File::options().write(true).open(path).unwrap().set_len(10).unwrap();
    for (damage, harm) in [("a flipped bit", &flipped as &dyn Fn(&Path)), ("a truncated file", &truncated)] {
        let setup = Setup::new(1 << 30, true).await;
        let local = setup.local_file(".data");
        let before = corrupt_objects(ObjectKind::Data, Place::Local);
        harm(&local);
        assert_eq!(list(&setup.index).await.unwrap(), expected(), "{damage}: served from the bucket's copy");
        assert_eq!(corrupt_objects(ObjectKind::Data, Place::Local), before + 1, "{damage}");
        assert!(!local.exists(), "{damage}: the bad local copy is deleted");
        assert_eq!(count(&setup.index).await.unwrap(), 1);
        assert_eq!(corrupt_objects(ObjectKind::Data, Place::Local), before + 1, "{damage}: reported once");
        assert_eq!(bucket_problems(&setup.bucket()).await, []);
    }
}

#[tokio::test]
async fn a_corrupt_local_copy_that_is_the_only_copy_is_an_error_and_is_never_uploaded() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(1 << 30, false).await;
    setup.index.flush().unwrap();
    let local = setup.local_file(".data");
    let before = corrupt_objects(ObjectKind::Data, Place::Local);
    flip(&local, 30);
    assert_names(list(&setup.index).await, "tables/links/");
    let error = setup.index.publish_manifest().await.unwrap_err().to_string();
    assert!(error.contains("corrupt object tables/links/") && error.contains("(local copy"), "{error}");
    assert_eq!(corrupt_objects(ObjectKind::Data, Place::Local), before + 2, "the query and the upload");
    assert!(local.exists(), "the only copy is kept");
    let links = setup.bucket().join("tables/links");
    assert!(!links.exists() || files_under(&links, ".data").is_empty(), "the corrupt table reached the bucket");
    let report = verify_local(&setup.root.path().join("writer")).await.unwrap();
    let corrupt: Vec<&str> =
        report.checked.iter().filter(|c| matches!(c.status, Status::Corrupt(_))).map(|c| c.object.as_str()).collect();
    assert_eq!(corrupt.len(), 1, "{}", report.render());
    assert!(
        corrupt[0].ends_with(&format!("{}", local.strip_prefix(setup.root.path().join("writer")).unwrap().display()))
    );
}

/// A flip after the resident part (which the open checked) lands in a filter page, an index chunk
/// or the whole-file checksum: only the upload's check reads those, and it refuses every one.
#[tokio::test]
async fn a_flipped_bit_anywhere_in_a_local_meta_not_yet_uploaded_keeps_it_from_the_bucket() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(1 << 30, false).await;
    setup.index.flush().unwrap();
    let local = setup.local_file(".meta");
    let bytes = std::fs::read(&local).unwrap();
    let resident = backlinks::lsm::table::resident_len::<backlinks::model::ids::Backlink>(&bytes).unwrap() as usize;
    let mut offsets: Vec<usize> = spread(bytes.len()).into_iter().filter(|&at| at >= resident).collect();
    offsets.push(resident);
    for at in offsets {
        let before = corrupt_objects(ObjectKind::Meta, Place::Local);
        let original = flip(&local, at);
        let error = setup.index.publish_manifest().await.unwrap_err().to_string();
        assert!(error.contains("corrupt object tables/links/") && error.contains(".meta (local copy"), "{at}: {error}");
        assert_eq!(corrupt_objects(ObjectKind::Meta, Place::Local), before + 1, "flip at {at}: reported once");
        let links = setup.bucket().join("tables/links");
        assert!(
            !links.exists() || files_under(&links, ".meta").is_empty(),
            "flip at {at}: the meta reached the bucket"
        );
        std::fs::write(&local, original).unwrap();
    }
    setup.index.publish_manifest().await.unwrap();
    assert_eq!(bucket_problems(&setup.bucket()).await, []);
}

#[tokio::test]
async fn a_flipped_bit_in_a_meta_fails_the_restore_before_it_changes_anything() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(0, true).await;
    let key = setup.bucket_key("tables/links", ".meta");
    let path = setup.bucket().join(&key);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    for (i, at) in spread(len).into_iter().enumerate() {
        let before = corrupt_objects(ObjectKind::Meta, Place::Bucket);
        let original = flip(&path, at);
        let error = setup.restore_fresh(&format!("restore-{i}")).await.err().expect("the restore must fail");
        assert!(error.to_string().contains(&format!("corrupt object {key}")), "flip at {at}: {error}");
        assert_eq!(corrupt_objects(ObjectKind::Meta, Place::Bucket), before + 1);
        let data = key.replace(".meta", ".data");
        assert_eq!(bucket_problems(&setup.bucket()).await, [(key.clone(), "corrupt"), (data, "unreadable")]);
        std::fs::write(&path, original).unwrap();
        // Nothing was committed: the same directory restores once the object is good again.
        let restored = setup.restore_fresh(&format!("restore-{i}")).await.unwrap();
        assert_eq!(list(&restored).await.unwrap(), expected());
    }
}

#[tokio::test]
async fn a_flipped_bit_in_a_local_meta_stops_the_open_and_names_the_file() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(1 << 30, true).await;
    let Setup { root, index } = setup;
    drop(index);
    let meta = files_under(&root.path().join("writer/state/tables/links"), ".meta")[0].clone();
    let before = corrupt_objects(ObjectKind::Meta, Place::Local);
    flip(&meta, 17);
    let store = Arc::new(DirStore::new(root.path().join("bucket")));
    let error = Index::open(&root.path().join("writer"), store, options(1 << 30), 3).err().expect("open must fail");
    let name = meta.file_name().unwrap().to_str().unwrap();
    assert!(error.to_string().contains(&format!("corrupt object tables/links/{name}")), "{error}");
    assert_eq!(corrupt_objects(ObjectKind::Meta, Place::Local), before + 1);
    let report = verify_local(&root.path().join("writer")).await.unwrap();
    assert!(
        report
            .render()
            .contains(&format!("CORRUPT    {}/state/tables/links/{name}", root.path().join("writer").display()))
    );
}

#[tokio::test]
async fn a_flipped_bit_in_a_manifest_or_an_outline_range_fails_the_restore_naming_it() {
    let _turn = COUNTERS.lock().await;
    let setup = Setup::new(0, true).await;
    let manifest = setup.bucket_key("manifests", "");
    let outline = setup.bucket_key("outlines/did", "");
    for (key, kind) in [(manifest, ObjectKind::Manifest), (outline, ObjectKind::Outline)] {
        let path = setup.bucket().join(&key);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        for at in spread(len) {
            let before = corrupt_objects(kind, Place::Bucket);
            let original = flip(&path, at);
            let error = setup.restore_fresh("restore").await.err().expect("the restore must fail");
            assert!(error.to_string().contains(&format!("corrupt object {key}")), "flip at {at}: {error}");
            assert_eq!(corrupt_objects(kind, Place::Bucket), before + 1, "{key} flip at {at}");
            assert_eq!(bucket_problems(&setup.bucket()).await, [(key.clone(), "corrupt")], "flip at {at}");
            std::fs::write(&path, original).unwrap();
        }
    }
    let restored = setup.restore_fresh("restore").await.unwrap();
    assert_eq!(list(&restored).await.unwrap(), expected());
}

/// GET `path` on `addr`: (status, body).
fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string())
}

/// `backlinks verify --data-dir DIR`: (success, stdout).
fn verify_cli(data: &Path) -> (bool, String) {
    let out = Command::new(BIN).args(["verify", "--data-dir"]).arg(data).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn end_to_end_the_server_answers_500_naming_the_object_and_verify_fails() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No local cache: every read of table data goes to the bucket.
    let import = Command::new(BIN)
        .args(["import", "--data-dir"])
        .arg(&data)
        .arg(CAPTURE)
        .env("BACKLINKS_CACHE_BYTES", "0")
        .output()
        .unwrap();
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));
    let (clean, report) = verify_cli(&data);
    assert!(clean, "{report}");
    assert!(report.ends_with(" 0 corrupt, 0 missing, 0 unreadable\n"), "{report}");

    let key = format!(
        "tables/links/{}",
        files_under(&data.join("bucket/tables/links"), ".data")[0].file_name().unwrap().to_str().unwrap()
    );
    flip(&data.join("bucket").join(&key), 25);
    // The server's log (stderr) holds what its clients are not told.
    let log = dir.path().join("serve.log");
    let mut command = Command::new(BIN);
    command.args(["serve", "--no-ingest", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&data);
    command.env_remove("NOTIFY_SOCKET").stdout(std::process::Stdio::piped());
    command.stderr(std::fs::File::create(&log).unwrap());
    let mut child = command.spawn().unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut first).unwrap();
    let addr = first.trim().strip_prefix("listening on http://").unwrap().to_string();
    let target: String = form_urlencoded::byte_serialize(TARGET.as_bytes()).collect();
    let mut ids = Vec::new();
    for endpoint in ["listBacklinks", "countBacklinks"] {
        let (status, body) = http_get(&addr, &format!("/xrpc/blue.cerulea.backlinks.{endpoint}?target={target}"));
        assert_eq!(status, 500, "{endpoint}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"], "InternalServerError");
        let message = body["message"].as_str().unwrap();
        assert!(!message.contains("tables/") && !message.contains("corrupt"), "the client learns nothing: {message}");
        let id = message.split("(id ").nth(1).and_then(|rest| rest.split(')').next()).expect("an error id");
        ids.push(id.to_string());
        assert!(!body.to_string().contains(LIKE), "corrupt data must not be served");
    }
    let (_, metrics) = http_get(&addr, "/metrics");
    assert!(metrics.contains("backlinks_corrupt_objects_total{kind=\"data\",place=\"bucket\"} 2\n"), "{metrics}");
    assert!(metrics.contains("backlinks_corrupt_objects_total{kind=\"meta\",place=\"local\"} 0\n"), "{metrics}");
    child.kill().unwrap();
    child.wait().unwrap();
    // The log line with each id names the object.
    let log = std::fs::read_to_string(&log).unwrap();
    for id in &ids {
        let line =
            log.lines().find(|line| line.contains(id.as_str())).unwrap_or_else(|| panic!("{id} not logged:\n{log}"));
        assert!(line.contains(&format!("corrupt object {key}: frame")), "{line}");
    }

    let (clean, report) = verify_cli(&data);
    assert!(!clean, "verify must exit non-zero: {report}");
    let corrupt: Vec<&str> = report.lines().filter(|l| l.starts_with("CORRUPT")).collect();
    assert_eq!(corrupt.len(), 1, "{report}");
    assert!(corrupt[0].starts_with(&format!("CORRUPT    {key}: frame")), "{report}");
    assert!(report.ends_with(" 1 corrupt, 0 missing, 0 unreadable\n"), "{report}");
}
