//! The public listener's threads: one acceptor and `http_threads` serving threads.
//!
//! The acceptor (a task on the caller's runtime) takes connections under the `max_connections`
//! limit - a connection over it waits in the kernel's accept backlog - and hands each to the
//! serving thread with the fewest open connections. Every serving thread runs a single-threaded
//! runtime, so a connection lives on one thread from accept to close: no work stealing and no
//! wake-ups across cores per request, which on 2 cores serves markedly more warm queries a second
//! than one multi-threaded runtime running the same code (BENCHMARKS.md, "serving threads").
//!
//! Each serving thread runs hyper's HTTP/1 connection loop itself (not `axum::serve`, which sets
//! no timer and so no deadline on reading a request head), with `header_read_timeout`.
//!
//! Invariants:
//! - At most `max_connections` connections are open at once, over all threads: the acceptor
//!   takes a permit before it accepts, and the permit lives as long as the connection.
//! - At most `max_connections_per_address` of them come from one IP address (IPv4-mapped IPv6
//!   counted as IPv4): one more is closed as soon as it is accepted, so one client cannot take the
//!   places of all others.
//! - A request head arrives whole within `header_read_timeout` of the connection's start or of
//!   its previous answer, or the connection is closed.
//! - Handing over is bounded: each thread's queue holds at most `HANDOFF_QUEUE` connections; a
//!   full queue makes the acceptor wait (and new connections wait in the backlog).
//! - Stopping stops accepting, lets every thread finish its open requests (hyper's graceful
//!   shutdown), and returns once every thread has ended. A thread that ends by itself stops the
//!   whole listener with an error rather than leaving its share of connections unserved.

use super::{GuardedStream, MAX_MAX_CONNECTIONS, ServerOptions};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
    place: Place,
}

/// A connection's place: its permit under the connection limit, its count on its thread and its
/// count for its address, all given back when the connection closes.
pub(super) struct Place {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
    _address: AddressPlace,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Open connections per IP address, bounded.
struct PerAddress {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's count for its address.
struct AddressPlace {
    counts: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    /// A place for one more connection from `ip`, if it has fewer than `limit` open.
    fn take(counts: &Arc<PerAddress>, ip: IpAddr) -> Option<AddressPlace> {
        let ip = ip.to_canonical();
        let mut open = counts.open.lock().expect("per-address lock poisoned");
        let count = open.entry(ip).or_insert(0);
        if *count >= counts.limit {
            return None;
        }
        *count += 1;
        Some(AddressPlace { counts: counts.clone(), ip })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().expect("per-address lock poisoned");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip); // the map holds only addresses with connections open
            }
        }
    }
}

/// How each serving thread serves a connection.
#[derive(Clone, Copy)]
struct ConnectionLimits {
    idle_timeout: Duration,
    header_read_timeout: Duration,
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
        let limits =
            ConnectionLimits { idle_timeout: options.idle_timeout(), header_read_timeout: options.header_read_timeout };
        let workers = (0..threads.clamp(1, MAX_HTTP_THREADS))
            .map(|i| Worker::start(i, router.clone(), limits, stopped.clone()))
            .collect::<io::Result<Vec<_>>>()?;
        let places = Places {
            permits: Arc::new(Semaphore::new(options.max_connections.clamp(1, MAX_MAX_CONNECTIONS))),
            per_address: Arc::new(PerAddress {
                limit: options.max_connections_per_address.max(1),
                open: Mutex::default(),
            }),
        };
        let acceptor = tokio::spawn(accept_until_stopped(listener, places, workers, stopped));
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
        router: Router,
        limits: ConnectionLimits,
        stopped: watch::Receiver<bool>,
    ) -> io::Result<Self> {
        let (queue, handed) = mpsc::channel(HANDOFF_QUEUE);
        let open = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name(format!("http-{index}"))
            .spawn(move || serve_handed_over(handed, router, limits, stopped))?;
        Ok(Worker { queue, open, thread })
    }

    fn join(self) -> io::Result<()> {
        drop(self.queue);
        self.thread.join().map_err(|_| io::Error::other("an HTTP thread panicked"))?
    }
}

/// What the acceptor hands out: places under the connection limit and per address.
struct Places {
    permits: Arc<Semaphore>,
    per_address: Arc<PerAddress>,
}

/// Accepts (a permit first, so a connection over the limit waits in the backlog) and hands each
/// connection to the thread with the fewest open ones, until `stopped` or until a thread has
/// ended; returns the workers. A connection from an address that has its fill is closed at once.
async fn accept_until_stopped(
    mut listener: tokio::net::TcpListener,
    places: Places,
    workers: Vec<Worker>,
    mut stopped: watch::Receiver<bool>,
) -> Vec<Worker> {
    let accept = async {
        loop {
            let permit =
                places.permits.clone().acquire_owned().await.expect("the connection semaphore is never closed");
            // TcpListener's own accept logs and retries errors (such as running out of descriptors).
            let (stream, addr) = axum::serve::Listener::accept(&mut listener).await;
            let Some(address) = PerAddress::take(&places.per_address, addr.ip()) else {
                tracing::debug!(%addr, "connection closed: its address has too many open");
                continue;
            };
            let Ok(stream) = stream.into_std() else { continue };
            let worker = workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)).expect("at least one thread");
            worker.open.fetch_add(1, Ordering::Relaxed);
            let place = Place { _permit: permit, open: worker.open.clone(), _address: address };
            if worker.queue.send(Handoff { stream, place }).await.is_err() {
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
fn serve_handed_over(
    handed: mpsc::Receiver<Handoff>,
    router: Router,
    limits: ConnectionLimits,
    stopped: watch::Receiver<bool>,
) -> io::Result<()> {
    // `spawn_blocking` work started here gets a bounded pool per thread (query reads of local
    // table files up to `INLINE_READ_BYTES` run inline, and store requests on the main runtime,
    // so little reaches it); synchronous work (an outline missing from the cache, read from
    // SQLite) still holds up the thread's other connections while it runs.
    let runtime =
        tokio::runtime::Builder::new_current_thread().max_blocking_threads(BLOCKING_THREADS).enable_all().build()?;
    runtime.block_on(serve_connections(handed, router, limits, stopped));
    Ok(())
}

/// Serves every connection handed over until the stop signal (or until the acceptor is gone),
/// then lets the open ones finish what they are answering.
async fn serve_connections(
    mut handed: mpsc::Receiver<Handoff>,
    router: Router,
    limits: ConnectionLimits,
    mut stopped: watch::Receiver<bool>,
) {
    // Every connection task holds a clone of `open`; when the last is gone, all have ended.
    let (open, mut all_ended) = mpsc::channel::<()>(1);
    let (closing, _) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    loop {
        let handoff = tokio::select! {
            handoff = handed.recv() => match handoff {
                Some(handoff) => handoff,
                None => break,
            },
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let stream = match tokio::net::TcpStream::from_std(handoff.stream) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "could not take over an accepted connection");
                continue;
            }
        };
        let io = TokioIo::new(GuardedStream::new(stream, handoff.place, limits.idle_timeout));
        // With upgrades: the push endpoints turn the connection into a websocket (which then
        // lives in a task of its own, outside this shutdown).
        let connection = http.serve_connection(io, TowerToHyperService::new(router.clone())).with_upgrades();
        let (open, mut closing) = (open.clone(), closing.subscribe());
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = async { closing.wait_for(|closing| *closing).await.map(drop) } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(open);
        });
    }
    // Open connections finish what they are answering, then close.
    let _ = closing.send(true);
    drop(open);
    let _ = all_ended.recv().await;
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_address_gets_its_share_of_connections_and_no_more() {
        let options = ServerOptions { max_connections_per_address: 2, ..ServerOptions::default() };
        let http = HttpThreads::start("127.0.0.1:0", 1, thread_name_router(), &options).await.unwrap();
        let mut first = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        let mut second = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        assert!(ask(&mut first).await.starts_with("http-"));
        assert!(ask(&mut second).await.starts_with("http-"));
        let mut third = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        let mut byte = [0u8; 1];
        third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.ok();
        assert_eq!(third.read(&mut byte).await.unwrap_or(0), 0, "the third connection is closed unanswered");
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut fourth = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        assert!(ask(&mut fourth).await.starts_with("http-"), "a closed connection gives its place back");
        drop((second, third, fourth));
        http.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_head_sent_too_slowly_is_cut_off() {
        let options = ServerOptions { header_read_timeout: Duration::from_millis(300), ..ServerOptions::default() };
        let http = HttpThreads::start("127.0.0.1:0", 1, thread_name_router(), &options).await.unwrap();
        let mut slow = tokio::net::TcpStream::connect(http.local_addr()).await.unwrap();
        // Forty bytes, one every 50 ms: two seconds for a head that has 300 ms.
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n" {
            if slow.write_all(&[*byte]).await.is_err() {
                break; // already closed
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the connection was never closed");
        assert!(!String::from_utf8_lossy(&rest).contains("http-"), "a head that came too slowly was answered");
        http.stop().await.unwrap();
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
        let limits =
            ConnectionLimits { idle_timeout: Duration::from_secs(5), header_read_timeout: Duration::from_secs(5) };
        let alive = Worker::start(1, thread_name_router(), limits, stopped.clone()).unwrap();
        // Both have no connection open, and the first of equals is picked: the ended one.
        let places = Places {
            permits: Arc::new(Semaphore::new(8)),
            per_address: Arc::new(PerAddress { limit: 8, open: Mutex::default() }),
        };
        let acceptor = tokio::spawn(accept_until_stopped(listener, places, vec![ended, alive], stopped));
        let http = HttpThreads { addr, stop, acceptor };
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let served = tokio::time::timeout(Duration::from_secs(10), http.serve_until(std::future::pending())).await;
        let error = served.expect("serving ended without a shutdown").unwrap_err();
        assert!(error.to_string().contains("ended by itself"), "{error}");
    }
}
