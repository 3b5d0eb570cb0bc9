//! A store whose requests all run on one runtime, whichever runtime asks.
//!
//! The S3 client keeps a pool of connections, and each connection's I/O is driven by a task on
//! the runtime that opened it. The HTTP serving threads have runtimes of their own
//! (`server::HttpThreads`); without this, a cold query would open connections there that live
//! ingest and compaction then borrow, and that die with the serving threads at shutdown, under
//! the final flush. Here every request is spawned on the main runtime instead.
//!
//! Invariants: every call reaches the inner store exactly once, on `runtime`; its result is
//! returned unchanged. A request whose task is lost (the runtime shutting down) is an error.

use crate::store::object::{ObjectInfo, Store, StoreError};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use tokio::runtime::Handle;

#[derive(Debug)]
pub struct PinnedStore {
    inner: Arc<dyn Store>,
    runtime: Handle,
}

impl PinnedStore {
    pub fn new(inner: Arc<dyn Store>, runtime: Handle) -> Self {
        PinnedStore { inner, runtime }
    }

    /// Runs `request` (given the inner store) as a task on `runtime` and waits for it.
    async fn run<T, F>(&self, request: impl FnOnce(Arc<dyn Store>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let task = self.runtime.spawn(request(self.inner.clone()));
        task.await.map_err(|e| StoreError::Other(format!("store request task lost: {e}")))?
    }
}

#[async_trait::async_trait]
impl Store for PinnedStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        let key = key.to_string();
        self.run(|store| async move { store.put(&key, body).await }).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let key = key.to_string();
        self.run(|store| async move { store.get(&key).await }).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let key = key.to_string();
        self.run(|store| async move { store.get_range(&key, offset, len).await }).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let prefix = prefix.to_string();
        self.run(|store| async move { store.list(&prefix).await }).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.run(|store| async move { store.delete(&key).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dir::DirStore;

    #[test]
    fn requests_from_another_runtime_run_on_the_pinned_one() {
        let main = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("main-rt")
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = PinnedStore::new(Arc::new(DirStore::new(dir.path().to_path_buf())), main.handle().clone());
        let other = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        other.block_on(async {
            store.put("a/b", Bytes::from_static(b"hello")).await.unwrap();
            assert_eq!(store.get("a/b").await.unwrap(), Bytes::from_static(b"hello"));
            assert_eq!(store.get_range("a/b", 1, 3).await.unwrap(), Bytes::from_static(b"ell"));
            assert_eq!(store.list("a/").await.unwrap(), vec![ObjectInfo { key: "a/b".into(), size: 5 }]);
            store.delete("a/b").await.unwrap();
            assert!(matches!(store.get("a/b").await, Err(StoreError::NotFound { .. })));
            // The request ran as a task of the pinned runtime.
            let thread = store.run(|_| async { Ok(std::thread::current().name().map(String::from)) }).await.unwrap();
            assert_eq!(thread.as_deref(), Some("main-rt"));
        });
    }
}
