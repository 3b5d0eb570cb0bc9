//! A test-only atproto sync server (axum) that plays a relay (`listHosts`), a PDS (`listRepos`,
//! `getRepo` from fixture CARs) and a PLC directory (`GET /<did>`), with faults injected by a
//! deterministic plan: 429s with `Retry-After`, 500s, honest short bodies (a cut CAR) and
//! connections dropped mid-body. It counts what it served so a test can kill a client mid-way.

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
    /// DID -> PDS URL for the PLC directory role.
    plc: HashMap<String, String>,
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
    plc: HashMap<String, String>,
    plan: FaultPlan,
    page_size: usize,
    delay: Duration,
    fail_first_listing: bool,
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
        }
    }

    /// Serves `car` under the DID of its commit, listed with the commit's revision.
    pub fn repo(mut self, car: Vec<u8>) -> Self {
        let (commit, _, _) = backlinks::ingest::car::read_repo_bytes(&car, &Default::default()).expect("a fixture CAR");
        self.repos.insert(commit.did, (commit.rev, Bytes::from(car)));
        self
    }

    pub fn hosts(mut self, hosts: Vec<String>) -> Self {
        self.hosts = hosts;
        self
    }

    pub fn plc(mut self, did: &str, pds: &str) -> Self {
        self.plc.insert(did.to_string(), pds.to_string());
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
            .route("/{did}", get(plc_document))
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
    }
}

async fn plc_document(State(shared): State<Arc<Shared>>, Path(did): Path<String>) -> Response {
    match shared.plc.get(&did) {
        Some(pds) => axum::Json(serde_json::json!({
            "id": did,
            "service": [{ "id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": pds }],
        }))
        .into_response(),
        None => (StatusCode::NOT_FOUND, "no such DID").into_response(),
    }
}
