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
use backlinks::store::faulty::{Fault, FaultRule, FaultyStore, Operation, Outcome, RequestRecord};
use backlinks::store::object::{Store, StoreError};
use backlinks::store::retry::{RetryPolicy, RetryingStore};
use backlinks::store::s3::{S3Settings, S3Store, Secret};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";

use support::store_contract::{self as contract, keys};
use support::{garage_settings, required_env, unique_prefix};

fn garage(test: &str) -> S3Store {
    S3Store::new(garage_settings(test)).unwrap()
}

#[tokio::test]
async fn round_trip_and_not_found() {
    contract::round_trip_and_not_found(&garage("round-trip")).await;
}

#[tokio::test]
async fn put_file_sends_exactly_the_checked_file() {
    contract::put_file_sends_exactly_the_checked_file(&garage("put-file")).await;
}

#[tokio::test]
async fn ranges_are_exact_or_short_read() {
    contract::ranges_are_exact_or_short_read(&garage("ranges")).await;
}

#[tokio::test]
async fn list_filters_by_prefix_sorts_and_pages() {
    let store = Arc::new(garage("list"));
    contract::list_filters_by_prefix_and_sorts(store.as_ref()).await;

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
    contract::delete_removes_and_tolerates_missing(&garage("delete")).await;
}

#[tokio::test]
async fn overwrite_of_current_is_whole() {
    contract::overwrite_of_current_is_whole(Arc::new(garage("current")), 12, 65_536).await;
}

#[tokio::test]
async fn hostile_keys_are_rejected_before_any_request() {
    let store = garage("hostile");
    contract::hostile_keys_are_rejected(&store).await;
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
    // Streamed uploads ride out the same faults.
    let dir = tempfile::tempdir().unwrap();
    for i in 0..8u8 {
        let path = dir.path().join(format!("f{i}"));
        std::fs::write(&path, vec![i; 300_000]).unwrap();
        store.put_file(&format!("f{i}"), &contract::hashed(&path)).await.unwrap();
        assert_eq!(store.get(&format!("f{i}")).await.unwrap(), Bytes::from(vec![i; 300_000]));
    }
    let streamed_fault = |r: &RequestRecord| {
        r.operation == Operation::Put && r.key.starts_with('f') && matches!(r.outcome, Outcome::Injected(_))
    };
    assert!(store.inner().log().iter().any(streamed_fault), "no fault was injected into the streamed uploads");

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
    // Nothing lands outside the bucket layout of docs/format.md.
    let layout = ["CURRENT", "manifests/", "tables/", "outlines/", "accounts/", "checkpoints/"];
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

/// A rejected secret, at the most verbose log level: the binary fails with an error that says
/// the bucket refused it, and neither the wrong secret nor the right one appears anywhere in its
/// output (errors, logs, the SDK's own tracing).
#[test]
fn a_rejected_secret_fails_clearly_and_never_reaches_the_output() {
    let bucket = required_env("BACKLINKS_TEST_S3_BUCKET");
    let right = required_env("AWS_SECRET_ACCESS_KEY");
    let wrong = "wrongwrongwrong0123456789abcdef0123456789abcdef0123456789abcd";
    let data_dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_backlinks"))
        .args(["import", "--store", &format!("s3://{bucket}/{}/", unique_prefix("bad-secret")), "--data-dir"])
        .arg(data_dir.path())
        .arg(CAPTURE)
        .env("AWS_SECRET_ACCESS_KEY", wrong)
        .env("RUST_LOG", "trace")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!output.status.success(), "a wrong secret was accepted");
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!printed.contains(wrong), "the rejected secret leaked into the output");
    assert!(!printed.contains(&right), "the real secret leaked into the output");
    let error = printed.lines().find(|l| l.starts_with("Error:")).unwrap_or_default();
    assert!(error.contains("403") && error.contains("AccessDenied"), "no clear error: {printed}");
    assert!(printed.len() > 1000, "trace logging was not on, so the check proved little");
}
