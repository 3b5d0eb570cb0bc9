//! A store whose requests all run on one runtime, whichever runtime asks.
//!
//! The S3 client keeps a pool of connections, and each connection's I/O is driven by a task on
//! the runtime that opened it. The HTTP serving threads have runtimes of their own
//! (`server::HttpThreads`); without this, a cold query would open connections there that live
//! ingest and compaction then borrow, and that die with the serving threads at shutdown, under
//! the final flush. Here every request is spawned on the main runtime instead.
//!
//! Invariants:
//! - Every call reaches the inner store exactly once, on `runtime`; its result is returned
//!   unchanged. A request whose task is lost (the runtime shutting down) is an error.
//! - A call made on `runtime` itself runs in place (no task to spawn).
//! - A spawned request lives no longer than its caller: dropping the call (a query cut off by
//!   its timeout, a client gone) aborts the task, so abandoned reads do not pile up.

use crate::store::object::{LocalFile, ObjectInfo, Store, StoreError};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

#[derive(Debug)]
pub struct PinnedStore {
    inner: Arc<dyn Store>,
    runtime: Handle,
}

impl PinnedStore {
    pub fn new(inner: Arc<dyn Store>, runtime: Handle) -> Self {
        PinnedStore { inner, runtime }
    }

    /// Runs `request` (given the inner store) on `runtime` and waits for it: in place when
    /// called there, else as a task that is aborted if this call is dropped.
    async fn run<T, F>(&self, request: impl FnOnce(Arc<dyn Store>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let on_runtime = Handle::try_current().is_ok_and(|current| current.id() == self.runtime.id());
        if on_runtime {
            return request(self.inner.clone()).await;
        }
        let mut task = AbortOnDrop(self.runtime.spawn(request(self.inner.clone())));
        (&mut task.0).await.map_err(|e| StoreError::Other(format!("store request task lost: {e}")))?
    }
}

/// A task that is aborted when its handle is dropped (aborting a finished task does nothing).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait::async_trait]
impl Store for PinnedStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        let key = key.to_string();
        self.run(|store| async move { store.put(&key, body).await }).await
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        let (key, file) = (key.to_string(), file.clone());
        self.run(|store| async move { store.put_file(&key, &file).await }).await
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

    /// Records the thread each call reached the inner store on; `get` of "hang" never answers
    /// and reports when it is dropped.
    #[derive(Debug)]
    struct Recording {
        inner: DirStore,
        threads: std::sync::Mutex<Vec<(&'static str, Option<String>)>>,
        hung_dropped: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Recording {
        fn record(&self, call: &'static str) {
            self.threads.lock().unwrap().push((call, std::thread::current().name().map(String::from)));
        }
    }

    struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl Store for Recording {
        async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
            self.record("put");
            self.inner.put(key, body).await
        }
        async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
            self.record("get");
            if key == "hang" {
                let _dropped = SetOnDrop(self.hung_dropped.clone());
                std::future::pending::<()>().await;
            }
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
            self.record("get_range");
            self.inner.get_range(key, offset, len).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
            self.record("list");
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &str) -> Result<(), StoreError> {
            self.record("delete");
            self.inner.delete(key).await
        }
    }

    fn main_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("main-rt")
            .enable_all()
            .build()
            .unwrap()
    }

    fn recording(dir: &std::path::Path) -> Arc<Recording> {
        Arc::new(Recording {
            inner: DirStore::new(dir.to_path_buf()),
            threads: Default::default(),
            hung_dropped: Default::default(),
        })
    }

    #[test]
    fn a_call_on_the_pinned_runtime_runs_in_place() {
        let (main, dir) = (main_runtime(), tempfile::tempdir().unwrap());
        let store = Arc::new(PinnedStore::new(recording(dir.path()), main.handle().clone()));
        let (caller, request) = main
            .block_on(main.spawn(async move {
                let request = store.run(|_| async { Ok(tokio::task::try_id()) }).await.unwrap();
                (tokio::task::try_id(), request)
            }))
            .unwrap();
        assert!(caller.is_some());
        assert_eq!(request, caller, "the request ran in the caller's task, not a spawned one");
    }

    #[test]
    fn a_dropped_call_aborts_its_request() {
        let (main, dir) = (main_runtime(), tempfile::tempdir().unwrap());
        let inner = recording(dir.path());
        let store = PinnedStore::new(inner.clone(), main.handle().clone());
        let reached = || !inner.threads.lock().unwrap().is_empty();
        other_runtime().block_on(async {
            let call = store.get("hang");
            tokio::pin!(call);
            // Wait (boundedly) until the request reached the store, then drop the call.
            for _ in 0..500 {
                tokio::select! {
                    _ = &mut call => panic!("the hung request answered"),
                    _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                }
                if reached() {
                    return;
                }
            }
            panic!("the request never reached the store");
        });
        // The abort is asynchronous: wait (boundedly) for the main runtime to drop the request.
        for _ in 0..500 {
            if inner.hung_dropped.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the request of a dropped call is still running");
    }

    /// The other runtime a test calls from (not the pinned one).
    fn other_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn requests_from_another_runtime_run_on_the_pinned_one() {
        let (main, dir) = (main_runtime(), tempfile::tempdir().unwrap());
        let inner = recording(dir.path());
        let store = PinnedStore::new(inner.clone(), main.handle().clone());
        other_runtime().block_on(async {
            store.put("a/b", Bytes::from_static(b"hello")).await.unwrap();
            assert_eq!(store.get("a/b").await.unwrap(), Bytes::from_static(b"hello"));
            assert_eq!(store.get_range("a/b", 1, 3).await.unwrap(), Bytes::from_static(b"ell"));
            assert_eq!(store.list("a/").await.unwrap(), vec![ObjectInfo { key: "a/b".into(), size: 5 }]);
            store.delete("a/b").await.unwrap();
            assert!(matches!(store.get("a/b").await, Err(StoreError::NotFound { .. })));
        });
        // Every call reached the inner store as a task of the pinned runtime.
        let threads = inner.threads.lock().unwrap().clone();
        let calls: Vec<&str> = threads.iter().map(|(call, _)| *call).collect();
        assert_eq!(calls, ["put", "get", "get_range", "list", "delete", "get"]);
        assert!(threads.iter().all(|(_, thread)| thread.as_deref() == Some("main-rt")), "{threads:?}");
    }
}
