//! The object-store contract on the local directory store (`tests/s3_garage.rs` runs the same
//! checks against Garage), plus what only a directory can get wrong: paths through files,
//! a missing root, leftover temporary files.

mod support;

use backlinks::store::dir::DirStore;
use backlinks::store::object::{Store, StoreError};
use bytes::Bytes;
use std::sync::Arc;
use support::store_contract as contract;

fn store() -> (tempfile::TempDir, DirStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = DirStore::new(dir.path().join("bucket"));
    (dir, store)
}

#[tokio::test]
async fn round_trip_and_not_found() {
    let (_dir, store) = store();
    contract::round_trip_and_not_found(&store).await;
    // A path through a file is not an object either.
    assert!(matches!(store.get("empty/x").await, Err(StoreError::NotFound { .. })));
}

#[tokio::test]
async fn put_file_sends_exactly_the_checked_file() {
    let (_dir, store) = store();
    contract::put_file_sends_exactly_the_checked_file(&store).await;
}

#[tokio::test]
async fn ranges_are_exact_or_short_read() {
    let (_dir, store) = store();
    contract::ranges_are_exact_or_short_read(&store).await;
}

#[tokio::test]
async fn list_filters_by_prefix_and_sorts() {
    let (_dir, store) = store();
    contract::list_filters_by_prefix_and_sorts(&store).await;
    assert!(DirStore::new("/nonexistent/backlinks-test".into()).list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn delete_removes_and_tolerates_missing() {
    let (_dir, store) = store();
    contract::delete_removes_and_tolerates_missing(&store).await;
}

#[tokio::test]
async fn overwrite_is_whole_and_leaves_no_temp_files() {
    let (_dir, store) = store();
    let store = Arc::new(store);
    contract::overwrite_of_current_is_whole(store.clone(), 20, 4096).await;
    let names: Vec<_> = std::fs::read_dir(store.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["CURRENT"]);
    store.put("CURRENT", Bytes::from_static(b"x")).await.unwrap();
}

#[tokio::test]
async fn hostile_keys_are_rejected_and_nothing_is_written() {
    let (dir, store) = store();
    contract::hostile_keys_are_rejected(&store).await;
    // Nothing was written anywhere, not even the store's root.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
