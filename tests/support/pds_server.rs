//! A test-only atproto sync server (axum) that plays a relay (`listHosts`), a PDS (`listRepos`,
//! `getRepo` from CARs) and a PLC directory (`GET /<did>/log/audit` and the bulk `/export`), with
//! faults injected by a
//! deterministic plan: 429s with `Retry-After`, 500s, honest short bodies (a cut CAR),
//! connections dropped mid-body, endless error bodies, bodies a byte a second; and, for attacks,
//! a listing that never ends. It counts what it served so a test can kill a client mid-way, and
//! what it was asked, so a test can show a host was never asked.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `Retry-After: 1`.
    RateLimit,
    /// 500 with an XRPC error body.
    ServerError,
    /// 200 with the first half of the CAR and an honest length.
    ShortBody,
    /// 200 declaring the whole length, then the connection ends after half.
    DroppedConnection,
    /// 500 with a body that never ends.
    EndlessErrorBody,
    /// 200 with the CAR at one byte a second.
    Trickle,
}

/// Faults by (did, attempt number starting at 1); `None` answers normally.
pub type FaultPlan = Arc<dyn Fn(&str, u32) -> Option<Fault> + Send + Sync>;

pub fn no_faults() -> FaultPlan {
    Arc::new(|_, _| None)
}

/// Every fault kind on the first attempts of some repositories (chosen by a hash of the DID),
/// the third attempt always clean: a client with at least 3 attempts gets everything.
pub fn mixed_faults(seed: u64) -> FaultPlan {
    Arc::new(move |did, attempt| {
        let h = did.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let kinds = [Fault::RateLimit, Fault::ServerError, Fault::ShortBody, Fault::DroppedConnection];
        match attempt {
            1 if h % 5 != 0 => Some(kinds[(h >> 8) as usize % 4]),
            2 if h % 3 == 0 => Some(kinds[(h >> 16) as usize % 4]),
            _ => None,
        }
    })
}

#[derive(Default)]
pub struct Counters {
    /// getRepo answers with a whole CAR.
    pub repos_served: AtomicU64,
    /// getRepo requests, whatever the answer.
    pub get_repo_calls: AtomicU64,
    pub faults: AtomicU64,
    pub listings: AtomicU64,
    /// The shortest wait, in milliseconds, between a 429 and the next getRepo of the same DID
    /// (`u64::MAX` until one is seen): `Retry-After: 1` asks for at least 1,000.
    pub min_wait_after_429_ms: AtomicU64,
}

impl Counters {
    fn new() -> Self {
        Counters { min_wait_after_429_ms: AtomicU64::new(u64::MAX), ..Counters::default() }
    }
}

struct Shared {
    /// DID -> (commit revision, CAR bytes), in DID order (listRepos pages through it).
    repos: BTreeMap<String, (String, Bytes)>,
    /// Hostnames listHosts answers with.
    hosts: Vec<String>,
    /// DID -> audit log, for the PLC directory role.
    plc: HashMap<String, serde_json::Value>,
    /// listRepos invents new DIDs and a new cursor on every page, forever.
    endless_listing: bool,
    /// The PLC directory answers only its bulk export (per-DID logs are 404).
    export_only: bool,
    plan: FaultPlan,
    attempts: Mutex<HashMap<String, u32>>,
    /// When each DID was last answered 429.
    rate_limited_at: Mutex<HashMap<String, std::time::Instant>>,
    page_size: usize,
    delay: Duration,
    /// The first listRepos call fails with a 500 (listings must retry).
    fail_first_listing: AtomicU64,
    counters: Arc<Counters>,
}

pub struct SyncServer {
    pub url: String,
    pub counters: Arc<Counters>,
}

/// Configures a server before it starts.
pub struct SyncServerBuilder {
    repos: BTreeMap<String, (String, Bytes)>,
    hosts: Vec<String>,
    plc: HashMap<String, serde_json::Value>,
    plan: FaultPlan,
    page_size: usize,
    delay: Duration,
    fail_first_listing: bool,
    endless_listing: bool,
    export_only: bool,
}

impl SyncServerBuilder {
    pub fn new() -> Self {
        SyncServerBuilder {
            repos: BTreeMap::new(),
            hosts: Vec::new(),
            plc: HashMap::new(),
            plan: no_faults(),
            page_size: 3,
            delay: Duration::ZERO,
            fail_first_listing: false,
            endless_listing: false,
            export_only: false,
        }
    }

    /// Serves `car` under the DID of its commit, listed with the commit's revision.
    pub fn repo(mut self, car: Vec<u8>) -> Self {
        let any = backlinks::ingest::repo::Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };
        let commit =
            backlinks::ingest::repo::read_repo_bytes(&car, &Default::default(), &any).expect("a fixture CAR").commit;
        self.repos.insert(commit.did, (commit.rev, Bytes::from(car)));
        self
    }

    pub fn hosts(mut self, hosts: Vec<String>) -> Self {
        self.hosts = hosts;
        self
    }

    /// Serves `car` under `did` at `rev`, whatever it holds (a forgery, a broken CAR).
    pub fn repo_as(mut self, did: &str, rev: &str, car: Vec<u8>) -> Self {
        self.repos.insert(did.to_string(), (rev.to_string(), Bytes::from(car)));
        self
    }

    /// Serves `log` as the audit log of `did` (the PLC directory role).
    pub fn plc_log(mut self, did: &str, log: serde_json::Value) -> Self {
        self.plc.insert(did.to_string(), log);
        self
    }

    pub fn endless_listing(mut self) -> Self {
        self.endless_listing = true;
        self
    }

    /// The PLC directory role answers `/export` only: a client must keep its own copy.
    pub fn export_only(mut self) -> Self {
        self.export_only = true;
        self
    }

    pub fn faults(mut self, plan: FaultPlan) -> Self {
        self.plan = plan;
        self
    }

    /// Every getRepo answer waits this long first (so a test can kill a client mid-way).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn fail_first_listing(mut self) -> Self {
        self.fail_first_listing = true;
        self
    }

    /// Starts on a free loopback port in the current runtime.
    pub async fn start(self) -> SyncServer {
        let counters = Arc::new(Counters::new());
        let shared = Arc::new(Shared {
            repos: self.repos,
            hosts: self.hosts,
            plc: self.plc,
            endless_listing: self.endless_listing,
            export_only: self.export_only,
            plan: self.plan,
            attempts: Mutex::default(),
            rate_limited_at: Mutex::default(),
            page_size: self.page_size,
            delay: self.delay,
            fail_first_listing: AtomicU64::new(u64::from(self.fail_first_listing)),
            counters: counters.clone(),
        });
        let app = Router::new()
            .route("/xrpc/com.atproto.sync.listHosts", get(list_hosts))
            .route("/xrpc/com.atproto.sync.listRepos", get(list_repos))
            .route("/xrpc/com.atproto.sync.getRepo", get(get_repo))
            .route("/{did}/log/audit", get(plc_audit_log))
            .route("/export", get(plc_export))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        SyncServer { url, counters }
    }
}

impl Default for SyncServerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn xrpc_error(status: StatusCode, error: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": error, "message": "injected by the test server" })))
        .into_response()
}

async fn list_hosts(State(shared): State<Arc<Shared>>, Query(query): Query<HashMap<String, String>>) -> Response {
    shared.counters.listings.fetch_add(1, Ordering::Relaxed);
    let start: usize = query.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let page: Vec<_> = shared
        .hosts
        .iter()
        .skip(start)
        .take(1)
        .map(|h| serde_json::json!({ "hostname": h, "status": "active" }))
        .collect();
    let next = (start + 1 < shared.hosts.len()).then(|| (start + 1).to_string());
    axum::Json(serde_json::json!({ "hosts": page, "cursor": next })).into_response()
}

async fn list_repos(State(shared): State<Arc<Shared>>, Query(query): Query<HashMap<String, String>>) -> Response {
    shared.counters.listings.fetch_add(1, Ordering::Relaxed);
    if shared.fail_first_listing.swap(0, Ordering::Relaxed) == 1 {
        return xrpc_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError");
    }
    let after = query.get("cursor").cloned().unwrap_or_default();
    if shared.endless_listing {
        let page_number: u64 = after.parse().unwrap_or(0) + 1;
        let page: Vec<_> = (0..shared.page_size)
            .map(|i| serde_json::json!({ "did": format!("did:plc:endless{page_number:08}x{i:04}"), "active": true }))
            .collect();
        return axum::Json(serde_json::json!({ "repos": page, "cursor": page_number.to_string() })).into_response();
    }
    let page: Vec<_> = shared
        .repos
        .iter()
        .filter(|(did, _)| **did > after)
        .take(shared.page_size)
        .map(|(did, (rev, _))| serde_json::json!({ "did": did, "head": "bafyreib2rxk3rh6kzwq", "rev": rev, "active": true }))
        .collect();
    let next = page.last().and_then(|r| r["did"].as_str()).map(str::to_string);
    axum::Json(serde_json::json!({ "repos": page, "cursor": next })).into_response()
}

async fn get_repo(State(shared): State<Arc<Shared>>, Query(query): Query<HashMap<String, String>>) -> Response {
    let did = query.get("did").cloned().unwrap_or_default();
    shared.counters.get_repo_calls.fetch_add(1, Ordering::Relaxed);
    let Some((_, car)) = shared.repos.get(&did).cloned() else {
        return xrpc_error(StatusCode::BAD_REQUEST, "RepoNotFound");
    };
    if let Some(limited_at) = shared.rate_limited_at.lock().unwrap().remove(&did) {
        let waited = limited_at.elapsed().as_millis() as u64;
        shared.counters.min_wait_after_429_ms.fetch_min(waited, Ordering::Relaxed);
    }
    let attempt = {
        let mut attempts = shared.attempts.lock().unwrap();
        let n = attempts.entry(did.clone()).or_insert(0);
        *n += 1;
        *n
    };
    tokio::time::sleep(shared.delay).await;
    let fault = (shared.plan)(&did, attempt);
    if fault.is_some() {
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
    }
    let half = car.slice(..car.len() / 2);
    match fault {
        None => {
            shared.counters.repos_served.fetch_add(1, Ordering::Relaxed);
            ([(header::CONTENT_TYPE, "application/vnd.ipld.car")], car).into_response()
        }
        Some(Fault::RateLimit) => {
            shared.rate_limited_at.lock().unwrap().insert(did.clone(), std::time::Instant::now());
            let mut response = xrpc_error(StatusCode::TOO_MANY_REQUESTS, "RateLimitExceeded");
            response.headers_mut().insert(header::RETRY_AFTER, "1".parse().unwrap());
            response
        }
        Some(Fault::ServerError) => xrpc_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
        Some(Fault::ShortBody) => ([(header::CONTENT_TYPE, "application/vnd.ipld.car")], half).into_response(),
        Some(Fault::DroppedConnection) => {
            let stream = futures::stream::iter([Ok::<_, std::io::Error>(half)]);
            let mut response = Response::new(Body::from_stream(stream));
            response.headers_mut().insert(header::CONTENT_LENGTH, car.len().to_string().parse().unwrap());
            response
        }
        Some(Fault::EndlessErrorBody) => {
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            let stream = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
            let mut response = Response::new(Body::from_stream(stream));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
        Some(Fault::Trickle) => {
            let bytes = car.to_vec();
            let stream = futures::stream::unfold(0usize, move |at| {
                let byte = bytes.get(at).copied();
                async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    byte.map(|b| (Ok::<_, std::io::Error>(Bytes::from(vec![b])), at + 1))
                }
            });
            let mut response = Response::new(Body::from_stream(stream));
            response.headers_mut().insert(header::CONTENT_LENGTH, car.len().to_string().parse().unwrap());
            response
        }
    }
}

/// A listener that accepts connections and only counts them: the target of a forged address,
/// to show that nothing ever connected.
pub struct AcceptCounter {
    pub address: std::net::SocketAddr,
    pub accepted: Arc<AtomicU64>,
}

impl AcceptCounter {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                drop(socket);
            }
        });
        AcceptCounter { address, accepted }
    }
}

async fn plc_audit_log(State(shared): State<Arc<Shared>>, Path(did): Path<String>) -> Response {
    match shared.plc.get(&did).filter(|_| !shared.export_only) {
        Some(log) => axum::Json(log.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "DID not registered").into_response(),
    }
}

/// `/export?after=SEQ&count=N`: every log's operations as sequenced JSON lines (DIDs in order,
/// each log in its order), those after `after`, at most `count` (1,000).
async fn plc_export(State(shared): State<Arc<Shared>>, Query(query): Query<HashMap<String, String>>) -> Response {
    let after: u64 = query.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let count: usize = query.get("count").and_then(|c| c.parse().ok()).unwrap_or(1000).min(1000);
    let mut dids: Vec<&String> = shared.plc.keys().collect();
    dids.sort();
    let entries = dids.into_iter().flat_map(|did| shared.plc[did].as_array().cloned().unwrap_or_default());
    let lines: Vec<String> = entries
        .enumerate()
        .map(|(i, mut entry)| {
            let fields = entry.as_object_mut().unwrap();
            fields.remove("nullified");
            fields.insert("seq".into(), (i as u64 + 1).into());
            fields.insert("type".into(), "sequenced_op".into());
            (i as u64 + 1, entry.to_string())
        })
        .filter(|(seq, _)| *seq > after)
        .take(count)
        .map(|(_, line)| line)
        .collect();
    ([(header::CONTENT_TYPE, "application/jsonlines")], lines.join("\n")).into_response()
}
