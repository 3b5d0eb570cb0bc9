//! The object-store contract (`backlinks::store::object::Store`) as reusable checks: every
//! backend (the local directory, S3 against Garage) runs the same ones on an empty store.

use backlinks::store::object::{HashingReader, LocalFile, ObjectInfo, Store, StoreError};
use bytes::Bytes;
use std::sync::Arc;

pub fn keys(infos: &[ObjectInfo]) -> Vec<&str> {
    infos.iter().map(|i| i.key.as_str()).collect()
}

fn short(result: Result<Bytes, StoreError>) -> (u64, u64) {
    match result {
        Err(StoreError::ShortRead { expected, got, .. }) => (expected, got),
        other => panic!("expected ShortRead, got {other:?}"),
    }
}

pub async fn round_trip_and_not_found(store: &dyn Store) {
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
    // A "directory" is not an object.
    assert!(matches!(store.get("tables/links").await, Err(StoreError::NotFound { .. })));
    assert!(matches!(store.get_range("missing", 0, 1).await, Err(StoreError::NotFound { .. })));
    assert!(matches!(store.get_range("missing", 0, 0).await, Err(StoreError::NotFound { .. })));
}

pub async fn ranges_are_exact_or_short_read(store: &dyn Store) {
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

pub async fn list_filters_by_prefix_and_sorts(store: &dyn Store) {
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
    assert_eq!(keys(&store.list("tables/t").await.unwrap()), ["tables/thresholds/1.meta"]);
    assert!(store.list("nothing/here/").await.unwrap().is_empty());
}

pub async fn delete_removes_and_tolerates_missing(store: &dyn Store) {
    store.put("a/b", Bytes::from_static(b"x")).await.unwrap();
    store.delete("a/b").await.unwrap();
    assert!(matches!(store.get("a/b").await, Err(StoreError::NotFound { .. })));
    store.delete("a/b").await.unwrap();
    store.delete("never/was").await.unwrap();
    assert!(store.list("").await.unwrap().is_empty());
}

/// A reader racing `versions` overwrites of CURRENT only ever sees one of the bodies, whole.
pub async fn overwrite_of_current_is_whole(store: Arc<dyn Store>, versions: u8, step_bytes: usize) {
    let bodies: Vec<Bytes> = (0..versions).map(|i| Bytes::from(vec![i; 1 + step_bytes * i as usize])).collect();
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
    assert_eq!(&store.get("CURRENT").await.unwrap(), bodies.last().unwrap());
    assert_eq!(keys(&store.list("").await.unwrap()), ["CURRENT"]);
}

/// Every operation refuses a hostile key (path escapes, empty segments, odd characters, 1000
/// bytes) before it does anything.
pub async fn hostile_keys_are_rejected(store: &dyn Store) {
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
}

/// The file at `path` as a caller that checked it would name it.
pub fn hashed(path: &std::path::Path) -> LocalFile {
    let mut hashing = HashingReader::new(std::fs::File::open(path).unwrap());
    let len = std::io::copy(&mut hashing, &mut std::io::sink()).unwrap();
    LocalFile { path: path.to_owned(), len, sha256: hashing.finish() }
}

/// `put_file` writes exactly the bytes its caller checked, and a file that is not those (another
/// length, other bytes of the same length, no file at all) writes nothing.
pub async fn put_file_sends_exactly_the_checked_file(store: &dyn Store) {
    let dir = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
    let path = dir.path().join("table.data");
    std::fs::write(&path, &body).unwrap();
    let checked = hashed(&path);
    assert_eq!(checked.len, body.len() as u64);
    store.put_file("tables/links/1.data", &checked).await.unwrap();
    assert_eq!(store.get("tables/links/1.data").await.unwrap(), Bytes::from(body.clone()));
    let mut changed = body.clone();
    changed[4_000_000] ^= 1;
    let other = dir.path().join("other.data");
    std::fs::write(&other, &changed).unwrap();
    let wrong = [
        LocalFile { len: checked.len - 1, ..checked.clone() },
        LocalFile { len: checked.len + 1, ..checked.clone() },
        LocalFile { len: 0, ..checked.clone() },
        LocalFile { path: other, ..checked.clone() },
    ];
    for file in &wrong {
        // Refused by the store itself or, for other bytes streamed to S3, by the server.
        let outcome = store.put_file("tables/links/2.data", file).await;
        assert!(outcome.is_err(), "{file:?} was written");
    }
    let missing =
        store.put_file("tables/links/2.data", &LocalFile { path: dir.path().join("missing"), ..checked }).await;
    assert!(matches!(&missing, Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound));
    assert!(matches!(store.get("tables/links/2.data").await, Err(StoreError::NotFound { .. })));
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let empty = hashed(&empty);
    store.put_file("empty", &empty).await.unwrap();
    assert_eq!(store.get("empty").await.unwrap(), Bytes::new());
    assert!(matches!(store.put_file("../x", &empty).await, Err(StoreError::InvalidKey { .. })));
}
