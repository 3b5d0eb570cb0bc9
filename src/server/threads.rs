//! The public listener's threads: one acceptor and `http_threads` serving threads.
//!
//! The acceptor (a task on the caller's runtime) takes connections under the `max_connections`
//! limit - a connection over it waits in the kernel's accept backlog - and hands each to the
//! serving thread with the fewest open connections. Every serving thread runs a single-threaded
//! runtime, so a connection lives on one thread from accept to close: no work stealing and no
//! wake-ups across cores per request, which on 2 cores serves markedly more warm queries a second
//! than one multi-threaded runtime running the same code (BENCHMARKS.md, "serving threads").
//!
//! Invariants:
//! - At most `max_connections` connections are open at once, over all threads: the acceptor
//!   takes a permit before it accepts, and the permit lives as long as the connection.
//! - Handing over is bounded: each thread's queue holds at most `HANDOFF_QUEUE` connections; a
//!   full queue makes the acceptor wait (and new connections wait in the backlog).
//! - Stopping stops accepting, lets every thread finish its open requests (axum's graceful
//!   shutdown), and returns once every thread has ended. A thread that ends by itself stops the
//!   whole listener with an error rather than leaving its share of connections unserved.

use super::{GuardedStream, MAX_MAX_CONNECTIONS, ServerOptions};
use axum::Router;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Most serving threads.
pub const MAX_HTTP_THREADS: usize = 256;
/// Accepted connections waiting for one serving thread to take them.
const HANDOFF_QUEUE: usize = 64;
/// Threads for blocking work per serving thread (tokio's default is 512).
const BLOCKING_THREADS: usize = 32;

/// A connection on its way from the acceptor to a serving thread.
struct Handoff {
    stream: std::net::TcpStream,
    addr: SocketAddr,
    place: Place,
}

/// A connection's place: its permit under the connection limit and its count on its thread,
/// both given back when the connection closes.
pub(super) struct Place {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One serving thread, as the acceptor sees it.
struct Worker {
    queue: mpsc::Sender<Handoff>,
    open: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<io::Result<()>>,
}

/// The running listener.
pub struct HttpThreads {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    acceptor: tokio::task::JoinHandle<Vec<Worker>>,
}

impl HttpThreads {
    /// Binds `listen` and starts the acceptor (on the current runtime) and `threads` serving
    /// threads, each serving `router`.
    pub async fn start(listen: &str, threads: usize, router: Router, options: &ServerOptions) -> io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let idle_timeout = options.idle_timeout();
        let workers = (0..threads.clamp(1, MAX_HTTP_THREADS))
            .map(|i| Worker::start(i, addr, router.clone(), idle_timeout, stopped.clone()))
            .collect::<io::Result<Vec<_>>>()?;
        let permits = Arc::new(Semaphore::new(options.max_connections.clamp(1, MAX_MAX_CONNECTIONS)));
        let acceptor = tokio::spawn(accept_until_stopped(listener, permits, workers, stopped));
        Ok(HttpThreads { addr, stop, acceptor })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then stops accepting, waits for every thread to
    /// finish its open requests, and reports the first thread that failed. A serving thread that
    /// ends by itself ends serving too (an error: a supervisor restarts the process).
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let HttpThreads { stop, mut acceptor, .. } = self;
        let (workers, thread_ended) = tokio::select! {
            // A thread that ended is reported even when the shutdown came at the same time.
            biased;
            workers = &mut acceptor => {
                let _ = stop.send(true);
                (workers, true)
            }
            () = shutdown => {
                let _ = stop.send(true);
                (acceptor.await, false)
            }
        };
        let workers = workers.map_err(io::Error::other)?;
        let joined = tokio::task::spawn_blocking(move || {
            let ends: Vec<io::Result<()>> = workers.into_iter().map(Worker::join).collect();
            ends.into_iter().collect::<io::Result<()>>()
        })
        .await
        .map_err(io::Error::other)?;
        match (joined, thread_ended) {
            (Err(error), _) => Err(error),
            (Ok(()), true) => Err(io::Error::other("an HTTP serving thread ended by itself")),
            (Ok(()), false) => Ok(()),
        }
    }

    /// `serve_until` a shutdown that has already come.
    pub async fn stop(self) -> io::Result<()> {
        self.serve_until(async {}).await
    }
}

impl Worker {
    fn start(
        index: usize,
        addr: SocketAddr,
        router: Router,
        idle_timeout: Duration,
        stopped: watch::Receiver<bool>,
    ) -> io::Result<Self> {
        let (queue, handed) = mpsc::channel(HANDOFF_QUEUE);
        let open = Arc::new(AtomicUsize::new(0));
        let listener = HandedOver { handed, idle_timeout, addr };
        let thread = std::thread::Builder::new()
            .name(format!("http-{index}"))
            .spawn(move || serve_handed_over(listener, router, stopped))?;
        Ok(Worker { queue, open, thread })
    }

    fn join(self) -> io::Result<()> {
        drop(self.queue);
        self.thread.join().map_err(|_| io::Error::other("an HTTP thread panicked"))?
    }
}

/// Accepts (a permit first, so a connection over the limit waits in the backlog) and hands each
/// connection to the thread with the fewest open ones, until `stopped` or until a thread has
/// ended; returns the workers.
async fn accept_until_stopped(
    mut listener: tokio::net::TcpListener,
    permits: Arc<Semaphore>,
    workers: Vec<Worker>,
    mut stopped: watch::Receiver<bool>,
) -> Vec<Worker> {
    let accept = async {
        loop {
            let permit = permits.clone().acquire_owned().await.expect("the connection semaphore is never closed");
            // TcpListener's own accept logs and retries errors (such as running out of descriptors).
            let (stream, addr) = axum::serve::Listener::accept(&mut listener).await;
            let Ok(stream) = stream.into_std() else { continue };
            let worker = workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)).expect("at least one thread");
            worker.open.fetch_add(1, Ordering::Relaxed);
            let place = Place { _permit: permit, open: worker.open.clone() };
            if worker.queue.send(Handoff { stream, addr, place }).await.is_err() {
                tracing::error!("an HTTP serving thread has ended; no longer accepting");
                return;
            }
        }
    };
    tokio::select! {
        () = accept => {}
        _ = stopped.wait_for(|stop| *stop) => {}
    }
    workers
}

/// A serving thread: its own single-threaded runtime serving the connections it is handed.
fn serve_handed_over(listener: HandedOver, router: Router, mut stopped: watch::Receiver<bool>) -> io::Result<()> {
    // `spawn_blocking` work started here gets a bounded pool per thread (query reads of local
    // table files up to `INLINE_READ_BYTES` run inline, and store requests on the main runtime,
    // so little reaches it); synchronous work (an outline missing from the cache, read from
    // SQLite) still holds up the thread's other connections while it runs.
    let runtime =
        tokio::runtime::Builder::new_current_thread().max_blocking_threads(BLOCKING_THREADS).enable_all().build()?;
    runtime.block_on(async move {
        let stop = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        axum::serve(listener, router).with_graceful_shutdown(stop).await
    })
}

/// What a serving thread's `axum::serve` accepts from: the connections handed to it.
struct HandedOver {
    handed: mpsc::Receiver<Handoff>,
    idle_timeout: Duration,
    /// The acceptor's address (the connections' local address).
    addr: SocketAddr,
}

impl axum::serve::Listener for HandedOver {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // Closed only after the stop signal, which ends the serve loop before it asks again.
            let Some(handoff) = self.handed.recv().await else { std::future::pending().await };
            match tokio::net::TcpStream::from_std(handoff.stream) {
                Ok(stream) => return (GuardedStream::new(stream, handoff.place, self.idle_timeout), handoff.addr),
                Err(error) => tracing::warn!(%error, "could not take over an accepted connection"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Asks `GET /` on an open connection and returns the body (the serving thread's name).
    async fn ask(stream: &mut tokio::net::TcpStream) -> String {
        stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut response = Vec::new();
        loop {
            let mut chunk = [0u8; 512];
            let read = stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "closed before answering");
            response.extend_from_slice(&chunk[..read]);
            let text = String::from_utf8_lossy(&response).to_string();
            if let Some((_, body)) = text.split_once("\r\n\r\n")
                && body.starts_with("http-")
                && body.len() == "http-0".len()
            {
                return body.to_string();
            }
        }
    }

    fn thread_name_router() -> Router {
        Router::new().route("/", get(|| async { std::thread::current().name().unwrap_or("none").to_string() }))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_spread_over_the_threads_and_stay_on_theirs() {
        let options = ServerOptions::default();
        let http = HttpThreads::start("127.0.0.1:0", 2, thread_name_router(), &options).await.unwrap();
        let mut connections = Vec::new();
        let mut first_answers = Vec::new();
        for _ in 0..4 {
            let mut stream = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
            first_answers.push(ask(&mut stream).await);
            connections.push(stream);
        }
        // The fewest open connections first: 0, 1, 0, 1.
        assert_eq!(first_answers, ["http-0", "http-1", "http-0", "http-1"]);
        for (stream, first) in connections.iter_mut().zip(&first_answers) {
            for _ in 0..3 {
                assert_eq!(&ask(stream).await, first, "a connection moved threads");
            }
        }
        // A closed connection frees its place: the next one goes where the fewest are open.
        connections.remove(1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut stream = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        assert_eq!(ask(&mut stream).await, "http-1");
        drop((stream, connections));
        http.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stop_ends_every_thread_and_accepts_no_more() {
        let http = HttpThreads::start("127.0.0.1:0", 3, thread_name_router(), &ServerOptions::default()).await.unwrap();
        let addr = http.local_addr();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut stream).await.starts_with("http-"));
        drop(stream);
        tokio::time::timeout(Duration::from_secs(10), http.stop()).await.expect("stop returns").unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still accepting after stop");
    }

    /// A serving thread that has ended (its queue's receiving end gone) ends serving with an
    /// error as soon as a connection is handed to it, though no shutdown came; the live thread
    /// is stopped and joined all the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_that_ended_by_itself_ends_serving_with_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let (queue, handed) = mpsc::channel(HANDOFF_QUEUE);
        drop(handed);
        let ended = Worker { queue, open: Arc::new(AtomicUsize::new(0)), thread: std::thread::spawn(|| Ok(())) };
        let alive = Worker::start(1, addr, thread_name_router(), Duration::from_secs(5), stopped.clone()).unwrap();
        // Both have no connection open, and the first of equals is picked: the ended one.
        let acceptor =
            tokio::spawn(accept_until_stopped(listener, Arc::new(Semaphore::new(8)), vec![ended, alive], stopped));
        let http = HttpThreads { addr, stop, acceptor };
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let served = tokio::time::timeout(Duration::from_secs(10), http.serve_until(std::future::pending())).await;
        let error = served.expect("serving ended without a shutdown").unwrap_err();
        assert!(error.to_string().contains("ended by itself"), "{error}");
    }
}
