//! The S3 store against a real Garage (started by scripts/test.sh through scripts/garage.sh): the
//! same contract the directory store meets, the retry policy under injected faults and against a
//! dead endpoint, and the index publishing a whole import into the bucket.
//!
//! Every test works under its own fresh prefix, so the tests run in parallel and never see each
//! other's objects. Without Garage's environment the tests fail (they never skip).

mod support;

use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::manifest::Manifest;
use backlinks::store::faulty::{Fault, FaultRule, FaultyStore, Operation, Outcome};
use backlinks::store::object::{ObjectInfo, Store, StoreError};
use backlinks::store::s3::{RetryPolicy, RetryingStore, S3Settings, S3Store, Secret};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";

use support::{garage_settings, required_env, unique_prefix};

fn garage(test: &str) -> S3Store {
    S3Store::new(garage_settings(test)).unwrap()
}

fn keys(infos: &[ObjectInfo]) -> Vec<&str> {
    infos.iter().map(|i| i.key.as_str()).collect()
}

fn short(result: Result<Bytes, StoreError>) -> (u64, u64) {
    match result {
        Err(StoreError::ShortRead { expected, got, .. }) => (expected, got),
        other => panic!("expected ShortRead, got {other:?}"),
    }
}

#[tokio::test]
async fn round_trip_and_not_found() {
    let store = garage("round-trip");
    store.put("tables/links/1.data", Bytes::from_static(b"hello world")).await.unwrap();
    assert_eq!(store.get("tables/links/1.data").await.unwrap(), Bytes::from_static(b"hello world"));
    store.put("empty", Bytes::new()).await.unwrap();
    assert_eq!(store.get("empty").await.unwrap(), Bytes::new());
    let big = Bytes::from((0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    store.put("big", big.clone()).await.unwrap();
    assert_eq!(store.get("big").await.unwrap(), big);
    assert!(
        matches!(store.get("tables/links/2.data").await, Err(StoreError::NotFound { key }) if key == "tables/links/2.data")
    );
    assert!(matches!(store.get("tables/links").await, Err(StoreError::NotFound { .. })));
    assert!(matches!(store.get_range("missing", 0, 1).await, Err(StoreError::NotFound { .. })));
    assert!(matches!(store.get_range("missing", 0, 0).await, Err(StoreError::NotFound { .. })));
}

#[tokio::test]
async fn ranges_are_exact_or_short_read() {
    let store = garage("ranges");
    store.put("obj", Bytes::from_static(b"0123456789")).await.unwrap();
    assert_eq!(store.get_range("obj", 0, 10).await.unwrap(), Bytes::from_static(b"0123456789"));
    assert_eq!(store.get_range("obj", 3, 4).await.unwrap(), Bytes::from_static(b"3456"));
    assert_eq!(store.get_range("obj", 9, 1).await.unwrap(), Bytes::from_static(b"9"));
    assert_eq!(store.get_range("obj", 10, 0).await.unwrap(), Bytes::new());
    assert_eq!(short(store.get_range("obj", 8, 5).await), (5, 2));
    assert_eq!(short(store.get_range("obj", 10, 1).await), (1, 0));
    assert_eq!(short(store.get_range("obj", 11, 1).await), (1, 0));
    assert_eq!(short(store.get_range("obj", 11, 0).await), (0, 0));
    assert_eq!(short(store.get_range("obj", 1, u64::MAX).await), (u64::MAX, 9));
    assert_eq!(short(store.get_range("obj", u64::MAX, 2).await), (2, 0));
}

#[tokio::test]
async fn list_filters_by_prefix_sorts_and_pages() {
    let store = Arc::new(garage("list"));
    for key in ["tables/links/10.meta", "tables/links/02.data", "tables/thresholds/1.meta", "CURRENT", "tablesX"] {
        store.put(key, Bytes::from(key.as_bytes().to_vec())).await.unwrap();
    }
    let all = store.list("").await.unwrap();
    assert_eq!(
        keys(&all),
        ["CURRENT", "tables/links/02.data", "tables/links/10.meta", "tables/thresholds/1.meta", "tablesX"]
    );
    assert_eq!(all[1].size, "tables/links/02.data".len() as u64);
    assert_eq!(keys(&store.list("tables/").await.unwrap()).len(), 3);
    assert_eq!(keys(&store.list("tables").await.unwrap()).len(), 4);
    assert_eq!(keys(&store.list("tables/links/1").await.unwrap()), ["tables/links/10.meta"]);
    assert!(store.list("nothing/here/").await.unwrap().is_empty());

    // More than one ListObjectsV2 page (1000 keys).
    const MANY: usize = 1234;
    let puts = futures::stream::iter(0..MANY)
        .map(|i| {
            let store = store.clone();
            async move { store.put(&format!("many/{i:05}"), Bytes::from(vec![1u8; i % 7])).await }
        })
        .buffer_unordered(32);
    assert!(puts.collect::<Vec<_>>().await.into_iter().all(|r| r.is_ok()));
    let many = store.list("many/").await.unwrap();
    assert_eq!(many.len(), MANY);
    let expected: Vec<String> = (0..MANY).map(|i| format!("many/{i:05}")).collect();
    assert_eq!(keys(&many), expected.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(many.iter().enumerate().all(|(i, info)| info.size == (i % 7) as u64));
    assert_eq!(store.list("many/011").await.unwrap().len(), 100);
    assert_eq!(store.list("").await.unwrap().len(), MANY + 5);
}

#[tokio::test]
async fn delete_removes_and_tolerates_missing() {
    let store = garage("delete");
    store.put("a/b", Bytes::from_static(b"x")).await.unwrap();
    store.delete("a/b").await.unwrap();
    assert!(matches!(store.get("a/b").await, Err(StoreError::NotFound { .. })));
    store.delete("a/b").await.unwrap();
    store.delete("never/was").await.unwrap();
    assert!(store.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn overwrite_of_current_is_whole() {
    let store = Arc::new(garage("current"));
    let bodies: Vec<Bytes> = (0..12u8).map(|i| Bytes::from(vec![i; 1 + 65_536 * i as usize])).collect();
    store.put("CURRENT", bodies[0].clone()).await.unwrap();
    let writer = {
        let (store, bodies) = (store.clone(), bodies.clone());
        tokio::spawn(async move {
            for body in bodies {
                store.put("CURRENT", body).await.unwrap();
            }
        })
    };
    while !writer.is_finished() {
        let seen = store.get("CURRENT").await.unwrap();
        assert!(bodies.contains(&seen), "torn read of {} bytes", seen.len());
    }
    writer.await.unwrap();
    assert_eq!(store.get("CURRENT").await.unwrap(), bodies[11]);
    assert_eq!(keys(&store.list("").await.unwrap()), ["CURRENT"]);
}

#[tokio::test]
async fn hostile_keys_are_rejected_before_any_request() {
    let store = garage("hostile");
    let long = "k".repeat(1000);
    for key in ["../x", "/abs", "a//b", "a/./b", "", "a b", "a\\b", long.as_str()] {
        let put = store.put(key, Bytes::from_static(b"x")).await;
        assert!(matches!(put, Err(StoreError::InvalidKey { .. })), "put {key:?}: {put:?}");
        assert!(matches!(store.get(key).await, Err(StoreError::InvalidKey { .. })));
        assert!(matches!(store.get_range(key, 0, 1).await, Err(StoreError::InvalidKey { .. })));
        assert!(matches!(store.delete(key).await, Err(StoreError::InvalidKey { .. })));
    }
    assert!(matches!(store.list("../").await, Err(StoreError::InvalidKey { .. })));
    assert!(matches!(store.list("/etc").await, Err(StoreError::InvalidKey { .. })));
    assert_eq!(store.attempts(), 0, "no request was sent");
}

fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy { max_attempts, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(40), seed: 9 }
}

#[tokio::test]
async fn retries_ride_out_injected_faults() {
    let mut settings = garage_settings("retry-faults");
    settings.retry = quick_retries(1);
    let flaky = FaultRule::new(Fault::Error).operations(&[Operation::Get, Operation::Put]).probability(0.4);
    let store =
        RetryingStore::new(FaultyStore::new(S3Store::new(settings).unwrap(), 21, vec![flaky]), quick_retries(12))
            .unwrap();
    for i in 0..20u8 {
        store.put(&format!("k{i}"), Bytes::from(vec![i; 10])).await.unwrap();
        assert_eq!(store.get(&format!("k{i}")).await.unwrap(), Bytes::from(vec![i; 10]));
    }
    let log = store.inner().log();
    let injected = log.iter().filter(|r| matches!(r.outcome, Outcome::Injected(_))).count();
    assert!(injected >= 5, "p = 0.4 over 40+ calls injected only {injected}");
    assert_eq!(log.len(), 40 + injected, "each injected failure cost exactly one more attempt");
    assert_eq!(store.inner().inner().attempts() as usize, 40, "injected failures never reached Garage");

    // Every attempt fails: exactly max_attempts attempts, then the retryable error.
    let always = FaultRule::new(Fault::Error).operations(&[Operation::Get]);
    let mut settings = garage_settings("retry-always");
    settings.retry = quick_retries(1);
    let store =
        RetryingStore::new(FaultyStore::new(S3Store::new(settings).unwrap(), 22, vec![always]), quick_retries(6))
            .unwrap();
    let error = store.get("k").await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert_eq!(store.inner().log().len(), 6);
}

#[tokio::test]
async fn a_put_whose_answer_is_lost_still_happened() {
    let rules = vec![
        FaultRule::new(Fault::DropAfter).key_prefix("after/"),
        FaultRule::new(Fault::DropBefore).key_prefix("before/"),
        FaultRule::new(Fault::TruncatedBody).key_prefix("cut/"),
    ];
    let store = FaultyStore::new(garage("drops"), 23, rules);
    let reset = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Io { source, .. }) if source.kind() == ErrorKind::ConnectionReset);
    assert!(reset(store.put("after/x", Bytes::from_static(b"a")).await));
    assert!(reset(store.put("before/x", Bytes::from_static(b"b")).await));
    assert_eq!(store.inner().get("after/x").await.unwrap(), Bytes::from_static(b"a"));
    assert!(matches!(store.inner().get("before/x").await, Err(StoreError::NotFound { .. })));
    store.put("cut/x", Bytes::from_static(b"0123456789")).await.unwrap();
    assert!(
        matches!(store.get_range("cut/x", 2, 6).await, Err(StoreError::ShortRead { expected: 6, got, .. }) if got < 6)
    );
}

#[tokio::test]
async fn a_dead_endpoint_fails_after_bounded_attempts_and_time() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let settings = S3Settings {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        retry: quick_retries(4),
        timeout: Duration::from_secs(2),
        ..garage_settings("dead")
    };
    let store = S3Store::new(settings).unwrap();
    let started = Instant::now();
    let error = store.get("CURRENT").await.unwrap_err();
    assert!(
        matches!(&error, StoreError::Io { source, .. } if source.kind() == ErrorKind::ConnectionRefused),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert_eq!(store.attempts(), 4);
    // Three backoffs of at most 5, 10 and 20 ms, and refused connections: well under a second.
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_refused_request_is_not_retried() {
    let settings = S3Settings {
        credentials: Some(("GK0123456789abcdef01234567".into(), Secret::new("00".repeat(32)))),
        retry: quick_retries(5),
        ..garage_settings("forbidden")
    };
    let store = S3Store::new(settings).unwrap();
    let error = store.get("CURRENT").await.unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    assert_eq!(store.attempts(), 1, "a 4xx is final");
}

#[tokio::test]
async fn small_get_latency() {
    let store = garage("latency");
    store.put("small", Bytes::from_static(b"a small object")).await.unwrap();
    let mut samples = Vec::with_capacity(100);
    for _ in 0..100 {
        let started = Instant::now();
        assert_eq!(store.get("small").await.unwrap().len(), 14);
        samples.push(started.elapsed());
    }
    samples.sort_unstable();
    let (p50, p99) = (samples[49], samples[98]);
    eprintln!("S3 small GET against local Garage: p50 {p50:?}, p99 {p99:?}");
    assert!(p50 < Duration::from_millis(250), "p50 {p50:?}");
    assert_eq!(store.attempts(), 101);
}

#[tokio::test]
async fn index_publishes_an_import_into_the_bucket() {
    let data_dir = tempfile::tempdir().unwrap();
    let store = Arc::new(garage("index"));
    let index = Arc::new(Index::open(data_dir.path(), store.clone(), IndexOptions::default(), 5).unwrap());
    let writer = index.clone();
    let report = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(CAPTURE).unwrap();
        import_lines(&writer, std::io::BufReader::new(file))
    })
    .await
    .unwrap()
    .unwrap();
    assert!(report.applied > 0, "{report:?}");
    let name = index.publish_manifest().await.unwrap();

    assert_eq!(store.get("CURRENT").await.unwrap(), Bytes::from(name.clone().into_bytes()));
    let body = store.get(&format!("manifests/{name}")).await.unwrap();
    let manifest = Manifest::decode(&name, &body).unwrap();
    assert!(!manifest.tables.is_empty());
    let sizes: BTreeMap<String, u64> =
        store.list("tables/").await.unwrap().into_iter().map(|o| (o.key, o.size)).collect();
    let mut expected = BTreeMap::new();
    for table in &manifest.tables {
        expected.insert(format!("tables/{}/{}.data", table.tree, table.id), table.data_len);
        expected.insert(format!("tables/{}/{}.meta", table.tree, table.id), table.meta_len);
    }
    assert_eq!(sizes, expected, "the bucket holds exactly the manifest's tables, at their sizes");
    let manifests: Vec<String> = store.list("manifests/").await.unwrap().into_iter().map(|o| o.key).collect();
    assert_eq!(manifests, [format!("manifests/{name}")]);
    // Nothing lands outside the bucket layout of DESIGN.md.
    let layout = ["CURRENT", "manifests/", "tables/", "outlines/", "checkpoints/"];
    for object in store.list("").await.unwrap() {
        assert!(layout.iter().any(|p| object.key.starts_with(p)), "unexpected object {}", object.key);
    }
}

#[test]
fn the_binary_imports_into_s3() {
    let bucket = required_env("BACKLINKS_TEST_S3_BUCKET");
    let data_dir = tempfile::tempdir().unwrap();
    let prefix = unique_prefix("cli");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_backlinks"))
        .args(["import", "--store", &format!("s3://{bucket}/{prefix}/"), "--data-dir"])
        .arg(data_dir.path())
        .arg(CAPTURE)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "import failed: {stderr}");
    assert!(!stderr.contains(&required_env("AWS_SECRET_ACCESS_KEY")), "the secret leaked into the log");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let manifest = summary["manifest"].as_str().unwrap().to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = S3Store::new(S3Settings { prefix, ..garage_settings("cli-check") }).unwrap();
    let current = runtime.block_on(store.get("CURRENT")).unwrap();
    assert_eq!(current, Bytes::from(manifest.into_bytes()));
}
