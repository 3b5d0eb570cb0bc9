//! HTTP: the XRPC endpoints, the constellation-compatible ones, lexicons, metrics and the status
//! page, on axum, with the manners of a public service.
//!
//! Manners (outermost first): response compression (gzip or zstd, as the client accepts), CORS
//! open to any origin for reading (GET, HEAD), then one middleware (`manners`) for a
//! `Cache-Control` on every response and, around every query route, a guard that admits at most
//! `max_concurrent_queries` at once - the next one gets an immediate 503 `ServiceUnavailable`
//! instead of a place in an unbounded queue - and cuts a query off at `request_timeout`, also
//! with a 503. (The guard is a tokio semaphore rather than tower's `ConcurrencyLimit` +
//! `LoadShed` + `Timeout`: those queue, or answer with bodies that are not XRPC errors.)
//!
//! Limits on the public listener (`HttpThreads`, `refusal`): at most `max_connections`
//! open connections (the next waits in the kernel's accept backlog, costing nothing here), at
//! most `max_connections_per_address` from one IP address (more are closed at once); a request
//! head must arrive whole within `header_read_timeout` of the connection's start or its previous
//! answer (a client sending headers a byte at a time is cut off); a connection with no byte read
//! or written for `idle_timeout` (twice the request timeout, so a running query always answers
//! first) is closed; a request target longer than `MAX_URI_BYTES` gets a 414 and a request with a
//! body a 413 (no endpoint takes one, and none is ever read); hyper bounds the request head
//! (about 400 KiB, at most 100 headers).
//!
//! Invariants:
//! - The public listener has no mutating endpoint: every route answers GET (and HEAD) only;
//!   any other method gets a 405 XRPC error and changes nothing.
//! - Every error is an XRPC error body `{"error", "message"}` with a 4xx/5xx status, CORS headers
//!   and `Cache-Control: no-store` (an error must not be cached as if it were the answer).
//! - An internal error tells the client nothing of the server (paths, object keys, store
//!   errors): a generic 500 with an error id, which the log line with the details carries too.
//! - Nothing depends on the `Accept` header.
//! - A query string has at most `MAX_QUERY_PAIRS` parameters.

use crate::config::{ConfigError, FileConfig};
use crate::constellation::many::{self, GET_MANY_TO_MANY, GET_MANY_TO_MANY_COUNTS};
use crate::constellation::{self, GET_BACKLINK_DIDS, GET_BACKLINKS, GET_BACKLINKS_COUNT, rest};
use crate::count::{CountOptions, count_backlinks, count_backlinks_named, parse_count_query};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::push::hub::Hub;
use crate::query::{ListParams, QueryError, list_backlinks};
use crate::status::{IngestMode, StatusFacts, render_error, render_results, render_status};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{Any, CorsLayer};

mod subscribe;
pub mod systemd;
mod threads;
pub use subscribe::{SPACEDUST_SUBSCRIBE, SUBSCRIBE_BACKLINKS};
pub use threads::{HttpThreads, MAX_HTTP_THREADS};

pub const LIST_BACKLINKS: &str = "/xrpc/blue.cerulea.backlinks.listBacklinks";
pub const COUNT_BACKLINKS: &str = "/xrpc/blue.cerulea.backlinks.countBacklinks";
/// The result page of the status page's query form.
pub const UI_BACKLINKS: &str = "/ui/backlinks";

/// Most parameters one query string may carry.
pub const MAX_QUERY_PAIRS: usize = 256;

pub const DEFAULT_MAX_CONCURRENT_QUERIES: usize = 64;
pub const MAX_MAX_CONCURRENT_QUERIES: usize = 4096;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const MAX_MAX_CONNECTIONS: usize = 65_536;
/// Open connections one IP address may hold (behind a reverse proxy, raise it to
/// `max_connections`: every client then shares the proxy's address).
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// Time a client has to send a whole request head.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest idle timeout of a connection, whatever the request timeout.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest request target (path and query string) accepted.
pub const MAX_URI_BYTES: usize = 32 * 1024;
pub const DEFAULT_CACHE_MAX_AGE: Duration = Duration::from_secs(5);
pub const MAX_CACHE_MAX_AGE: Duration = Duration::from_secs(86_400);
/// Lexicons change only with a release.
const LEXICON_MAX_AGE_SECS: u64 = 3600;

/// The lexicon of every endpoint, by NSID, as kept in `lexicons/`.
pub const LEXICONS: [(&str, &str); 7] = [
    ("blue.cerulea.backlinks.listBacklinks", include_str!("../../lexicons/blue/cerulea/backlinks/listBacklinks.json")),
    (
        "blue.cerulea.backlinks.countBacklinks",
        include_str!("../../lexicons/blue/cerulea/backlinks/countBacklinks.json"),
    ),
    ("blue.microcosm.links.getBacklinks", include_str!("../../lexicons/blue/microcosm/links/getBacklinks.json")),
    (
        "blue.microcosm.links.getBacklinksCount",
        include_str!("../../lexicons/blue/microcosm/links/getBacklinksCount.json"),
    ),
    ("blue.microcosm.links.getBacklinkDids", include_str!("../../lexicons/blue/microcosm/links/getBacklinkDids.json")),
    ("blue.microcosm.links.getManyToMany", include_str!("../../lexicons/blue/microcosm/links/getManyToMany.json")),
    (
        "blue.microcosm.links.getManyToManyCounts",
        include_str!("../../lexicons/blue/microcosm/links/getManyToManyCounts.json"),
    ),
];

/// The lexicons of the websocket subscriptions (their `main` is a `subscription`, not a query).
pub const SUBSCRIPTION_LEXICONS: [(&str, &str); 1] = [(
    "blue.cerulea.backlinks.subscribeBacklinks",
    include_str!("../../lexicons/blue/cerulea/backlinks/subscribeBacklinks.json"),
)];

/// Every lexicon served under `/lexicons`.
fn all_lexicons() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    LEXICONS.iter().chain(SUBSCRIPTION_LEXICONS.iter())
}

/// Limits and facts the server runs with.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Queries admitted at once; more get an immediate 503.
    pub max_concurrent_queries: usize,
    /// A query still running after this gets a 503.
    pub request_timeout: Duration,
    /// Open connections at once; more wait to be accepted.
    pub max_connections: usize,
    /// Open connections from one IP address; more are closed at once.
    pub max_connections_per_address: usize,
    /// Time a client has to send a whole request head, from the connection's start or its
    /// previous answer.
    pub header_read_timeout: Duration,
    /// Threads serving HTTP connections (see `HttpThreads`).
    pub http_threads: usize,
    /// `max-age` of successful query answers.
    pub cache_max_age: Duration,
    pub count: CountOptions,
    pub ingest: IngestMode,
    /// When the process started (for the uptime on the status page).
    pub started: Instant,
    /// The wall clock (injected so tests can fix it).
    pub wall_clock: fn() -> SystemTime,
    /// Live push's hub, where live ingest runs with push on.
    pub push: Option<PushHandle>,
}

/// The hub subscribers join, and the runtime their connections run on (see `push::hub`).
#[derive(Clone)]
pub struct PushHandle {
    pub hub: Arc<Hub>,
    pub delivery: tokio::runtime::Handle,
}

impl std::fmt::Debug for PushHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PushHandle")
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_concurrent_queries: DEFAULT_MAX_CONCURRENT_QUERIES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            http_threads: default_http_threads(),
            cache_max_age: DEFAULT_CACHE_MAX_AGE,
            count: CountOptions::default(),
            ingest: IngestMode::ImportOnly,
            started: Instant::now(),
            wall_clock: SystemTime::now,
            push: None,
        }
    }
}

impl ServerOptions {
    /// The limits from the config file's keys (defaults for absent ones), validated.
    pub fn from_config(file: &FileConfig) -> Result<Self, ConfigError> {
        let mut options = ServerOptions::default();
        let bounded = |name: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(value)
            } else {
                Err(ConfigError::Invalid(format!("{name} must be between {min} and {max}, got {value}")))
            }
        };
        if let Some(n) = file.max_concurrent_queries {
            options.max_concurrent_queries =
                bounded("max_concurrent_queries", n as u64, 1, MAX_MAX_CONCURRENT_QUERIES as u64)? as usize;
        }
        if let Some(ms) = file.request_timeout_ms {
            let ms = bounded("request_timeout_ms", ms, 1, MAX_REQUEST_TIMEOUT.as_millis() as u64)?;
            options.request_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = file.max_connections {
            options.max_connections = bounded("max_connections", n as u64, 1, MAX_MAX_CONNECTIONS as u64)? as usize;
        }
        if let Some(n) = file.max_connections_per_address {
            options.max_connections_per_address =
                bounded("max_connections_per_address", n as u64, 1, MAX_MAX_CONNECTIONS as u64)? as usize;
        }
        if let Some(secs) = file.header_read_timeout_secs {
            options.header_read_timeout = Duration::from_secs(bounded("header_read_timeout_secs", secs, 1, 300)?);
        }
        if let Some(n) = file.http_threads {
            options.http_threads = bounded("http_threads", n as u64, 1, MAX_HTTP_THREADS as u64)? as usize;
        }
        if let Some(secs) = file.cache_max_age_secs {
            options.cache_max_age =
                Duration::from_secs(bounded("cache_max_age_secs", secs, 0, MAX_CACHE_MAX_AGE.as_secs())?);
        }
        if let Some(n) = file.count_exact_limit {
            let (min, max) = (crate::count::MIN_EXACT_SCAN_LIMIT as u64, crate::count::MAX_EXACT_SCAN_LIMIT as u64);
            options.count.exact_scan_limit = bounded("count_exact_limit", n as u64, min, max)? as usize;
        }
        Ok(options)
    }
}

/// One serving thread per core the process may use.
fn default_http_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_HTTP_THREADS)
}

impl ServerOptions {
    /// How long a connection may stay silent (no byte read or written) before it is closed:
    /// longer than any query may run, so a query always answers first.
    pub fn idle_timeout(&self) -> Duration {
        self.request_timeout.saturating_mul(2).max(MIN_IDLE_TIMEOUT)
    }
}

/// What every handler shares, behind one `Arc`: axum clones the state for every middleware and
/// handler of every request, and one reference count is cheaper than five.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub index: Arc<Index>,
    pub options: Arc<ServerOptions>,
    pub metrics: Arc<Metrics>,
    permits: Arc<Semaphore>,
    /// `Cache-Control` of successful answers, built once (every query response carries it).
    cache_control: HeaderValue,
}

/// The router with default options and fresh metrics.
pub fn router(index: Arc<Index>) -> Router {
    app(index, ServerOptions::default(), Arc::new(Metrics::new()))
}

/// The whole HTTP surface.
pub fn app(index: Arc<Index>, options: ServerOptions, metrics: Arc<Metrics>) -> Router {
    let permits = Arc::new(Semaphore::new(options.max_concurrent_queries.max(1)));
    let max_age = options.cache_max_age.as_secs();
    let cache_control = HeaderValue::from_str(&format!("public, max-age={max_age}")).expect("ASCII header value");
    let state = AppState(Arc::new(Shared { index, options: Arc::new(options), metrics, permits, cache_control }));
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::HEAD])
        .allow_headers(Any)
        .max_age(Duration::from_secs(86_400));
    Router::new()
        .route("/", get(status_handler))
        .route("/xrpc/_health", get(health_handler))
        .route("/metrics", get(metrics_handler))
        .route("/lexicons", get(lexicon_list_handler))
        .route("/lexicons/{file}", get(lexicon_handler))
        .route(LIST_BACKLINKS, get(list_handler))
        .route(COUNT_BACKLINKS, get(count_handler))
        .route(GET_BACKLINKS, get(constellation_handler))
        .route(GET_BACKLINKS_COUNT, get(constellation_handler))
        .route(GET_BACKLINK_DIDS, get(constellation_handler))
        .route(GET_MANY_TO_MANY, get(constellation_handler))
        .route(GET_MANY_TO_MANY_COUNTS, get(constellation_handler))
        .route(rest::LINKS, get(constellation_handler))
        .route(rest::LINKS_COUNT, get(constellation_handler))
        .route(rest::LINKS_DISTINCT_DIDS, get(constellation_handler))
        .route(rest::LINKS_COUNT_DISTINCT_DIDS, get(constellation_handler))
        .route(rest::LINKS_ALL, get(constellation_handler))
        .route(rest::LINKS_ALL_COUNT, get(constellation_handler))
        .route(UI_BACKLINKS, get(ui_results_handler))
        .route(SUBSCRIBE_BACKLINKS, get(subscribe::subscribe_backlinks_handler))
        .route(SPACEDUST_SUBSCRIBE, get(subscribe::spacedust_subscribe_handler))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), manners))
        // CORS wraps the guard and the cache headers, so even a 503 is readable by a web page;
        // a preflight offers reading only, so a page can never be allowed to write.
        .layer(cors)
        .layer(CompressionLayer::new().gzip(true).zstd(true))
        .with_state(state)
}

/// An XRPC error response.
#[derive(Debug)]
pub struct XrpcError {
    status: StatusCode,
    error: &'static str,
    message: String,
}

impl XrpcError {
    pub fn invalid_request(message: impl Into<String>) -> Self {
        XrpcError { status: StatusCode::BAD_REQUEST, error: "InvalidRequest", message: message.into() }
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        XrpcError { status: StatusCode::SERVICE_UNAVAILABLE, error: "ServiceUnavailable", message: message.into() }
    }
}

impl IntoResponse for XrpcError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.error, "message": self.message });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<QueryError> for XrpcError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::InvalidRequest(message) => XrpcError::invalid_request(message),
            QueryError::Internal(details) => XrpcError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                error: "InternalServerError",
                message: internal_error(&details),
            },
        }
    }
}

/// Logs an internal error's details under a fresh id; returns what the client is told.
fn internal_error(details: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut seed = crate::base::clock::unix_ms() ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 48;
    let id = format!("{:016x}", crate::base::rng::splitmix64(&mut seed));
    tracing::error!(error_id = %id, details, "internal error answering a request");
    format!("internal error (id {id}); the server's log has the details")
}

/// Decodes a raw query string into at most `MAX_QUERY_PAIRS` (name, value) pairs.
pub fn query_pairs(raw: Option<&str>) -> Result<Vec<(String, String)>, QueryError> {
    let pairs = form_urlencoded::parse(raw.unwrap_or("").as_bytes()).take(MAX_QUERY_PAIRS + 1);
    let pairs: Vec<(String, String)> = pairs.map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    if pairs.len() > MAX_QUERY_PAIRS {
        return Err(QueryError::InvalidRequest(format!("at most {MAX_QUERY_PAIRS} query parameters")));
    }
    Ok(pairs)
}

/// Parses a raw query string into validated listBacklinks parameters.
pub fn parse_list_query(raw: Option<&str>) -> Result<ListParams, QueryError> {
    let pairs = query_pairs(raw)?;
    ListParams::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// The metric label of a read (GET, HEAD) of a query route; `None` for anything else (another
/// method gets its 405 without taking a query's place).
fn query_endpoint(method: &Method, path: &str) -> Option<&'static str> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    Some(match path {
        LIST_BACKLINKS => "listBacklinks",
        COUNT_BACKLINKS => "countBacklinks",
        GET_BACKLINKS => "getBacklinks",
        GET_BACKLINKS_COUNT => "getBacklinksCount",
        GET_BACKLINK_DIDS => "getBacklinkDids",
        GET_MANY_TO_MANY => "getManyToMany",
        GET_MANY_TO_MANY_COUNTS => "getManyToManyCounts",
        rest::LINKS => "links",
        rest::LINKS_COUNT => "links/count",
        rest::LINKS_DISTINCT_DIDS => "links/distinct-dids",
        rest::LINKS_COUNT_DISTINCT_DIDS => "links/count/distinct-dids",
        rest::LINKS_ALL => "links/all",
        rest::LINKS_ALL_COUNT => "links/all/count",
        UI_BACKLINKS => "ui",
        _ => return None,
    })
}

/// The request's manners inside CORS, in one middleware: the request limits, the query guard
/// around reads of query routes, then `Cache-Control` on whatever came back. One middleware
/// keeps the order of the checks in one place.
async fn manners(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let mut response = match refusal(&request) {
        Some(refused) => refused.into_response(),
        None => match query_endpoint(request.method(), request.uri().path()) {
            Some(endpoint) => guarded_query(&state, endpoint, request, next).await,
            None => next.run(request).await,
        },
    };
    set_cache_control(&state, &mut response);
    response
}

/// Admits a query if a permit is free (else 503 at once), bounds its time, and measures it.
async fn guarded_query(state: &AppState, endpoint: &'static str, request: Request, next: Next) -> Response {
    let Ok(_permit) = state.permits.clone().try_acquire_owned() else {
        state.metrics.count_rejection(endpoint, "capacity");
        let limit = state.options.max_concurrent_queries;
        return XrpcError::service_unavailable(format!("over capacity: {limit} queries are running; retry shortly"))
            .into_response();
    };
    let started = Instant::now();
    match tokio::time::timeout(state.options.request_timeout, next.run(request)).await {
        Ok(response) => {
            state.metrics.observe_query(endpoint, started.elapsed());
            response
        }
        Err(_) => {
            state.metrics.count_rejection(endpoint, "timeout");
            let limit = state.options.request_timeout;
            XrpcError::service_unavailable(format!("the query took longer than {limit:?} and was stopped"))
                .into_response()
        }
    }
}

/// Success is cacheable for `cache_max_age` unless the handler said otherwise; errors never are.
fn set_cache_control(state: &AppState, response: &mut Response) {
    let value = if !response.status().is_success() {
        HeaderValue::from_static("no-store")
    } else if response.headers().contains_key(CACHE_CONTROL) {
        return;
    } else {
        state.cache_control.clone()
    };
    response.headers_mut().insert(CACHE_CONTROL, value);
}

async fn list_handler(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, XrpcError> {
    let params = parse_list_query(raw.as_deref())?;
    let page = list_backlinks(&state.index, &params).await?;
    // Serialized straight from the page: the hottest answer skips building a `Value`.
    Ok(([(CONTENT_TYPE, HeaderValue::from_static("application/json"))], page.to_json_bytes()).into_response())
}

async fn count_handler(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<serde_json::Value>, XrpcError> {
    let params = parse_count_query(&query_pairs(raw.as_deref())?)?;
    let count = count_backlinks(&state.index, &params, state.options.count).await?;
    Ok(Json(count.to_json()))
}

/// Every constellation endpoint, XRPC and REST: parse by the path's rules, answer its JSON.
async fn constellation_handler(
    State(state): State<AppState>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Result<Json<serde_json::Value>, XrpcError> {
    use constellation::rest::{self, parse_links_query, parse_target_query};
    let pairs = query_pairs(raw.as_deref())?;
    let (index, count) = (&state.index, state.options.count);
    let xrpc = || constellation::parse_query(&pairs);
    let body = match uri.path() {
        GET_BACKLINKS => constellation::get_backlinks(index, &xrpc()?, count, "records").await?,
        GET_BACKLINKS_COUNT => constellation::get_backlinks_count(index, &xrpc()?, count, false).await?,
        GET_BACKLINK_DIDS => constellation::get_backlink_dids(index, &xrpc()?, count).await?,
        GET_MANY_TO_MANY => many::get_many_to_many(index, &many::parse_many_query(&pairs, "linkDid")?).await?,
        GET_MANY_TO_MANY_COUNTS => {
            many::get_many_to_many_counts(index, &many::parse_many_query(&pairs, "did")?, count).await?
        }
        rest::LINKS => rest::links(index, &parse_links_query(&pairs)?, count).await?,
        rest::LINKS_COUNT => rest::links_count(index, &parse_links_query(&pairs)?, count).await?,
        rest::LINKS_DISTINCT_DIDS => rest::distinct_dids(index, &parse_links_query(&pairs)?, count).await?,
        rest::LINKS_COUNT_DISTINCT_DIDS => rest::count_distinct_dids(index, &parse_links_query(&pairs)?, count).await?,
        rest::LINKS_ALL => rest::links_all(index, &parse_target_query(&pairs)?, count, false).await?,
        rest::LINKS_ALL_COUNT => rest::links_all(index, &parse_target_query(&pairs)?, count, true).await?,
        other => return Err(QueryError::Internal(format!("{other} is routed to no constellation endpoint")).into()),
    };
    Ok(Json(body))
}

async fn health_handler(State(state): State<AppState>) -> Response {
    let position = state.index.position();
    let body = Json(serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "clock": position.clock,
        "cursor": position.cursor,
    }));
    ([(CACHE_CONTROL, "no-store")], body).into_response()
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(&state.index);
    ([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE), (CACHE_CONTROL, "no-store")], text).into_response()
}

async fn status_handler(State(state): State<AppState>) -> Result<Response, XrpcError> {
    let options = state.options.clone();
    let uptime = options.started.elapsed();
    let now_us = (options.wall_clock)()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let index = state.index.clone();
    let ingest = options.ingest.clone();
    let facts = tokio::task::spawn_blocking(move || StatusFacts::gather(&index, ingest, uptime, now_us))
        .await
        .map_err(|e| XrpcError::from(QueryError::Internal(format!("status task failed: {e}"))))?
        .map_err(QueryError::Internal)?;
    Ok(([(CACHE_CONTROL, "no-cache")], Html(render_status(&facts))).into_response())
}

/// The query form's target: runs listBacklinks and countBacklinks and renders both as HTML.
async fn ui_results_handler(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Response {
    let pairs = match query_pairs(raw.as_deref()) {
        Ok(pairs) => pairs,
        Err(e) => return (StatusCode::BAD_REQUEST, Html(render_error("", &e.to_string()))).into_response(),
    };
    let target = pairs.iter().find(|(k, _)| k == "target").map_or("", |(_, v)| v.as_str()).to_string();
    match ui_results(&state, &pairs).await {
        Ok(html) => Html(html).into_response(),
        Err(QueryError::InvalidRequest(message)) => {
            (StatusCode::BAD_REQUEST, Html(render_error(&target, &message))).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Html(render_error(&target, &internal_error(&e.to_string()))))
            .into_response(),
    }
}

async fn ui_results(state: &AppState, pairs: &[(String, String)]) -> Result<String, QueryError> {
    let params = ListParams::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let page = list_backlinks(&state.index, &params).await?;
    let count = count_backlinks_named(&state.index, &params, state.options.count, &|l| Some(l.into())).await?;
    let live = state.options.push.is_some();
    Ok(render_results(&params.target, params.limit, params.cursor.is_some(), &page, &count, live))
}

async fn lexicon_list_handler() -> Response {
    let names: Vec<&str> = all_lexicons().map(|(nsid, _)| *nsid).collect();
    let cache = format!("public, max-age={LEXICON_MAX_AGE_SECS}");
    ([(CACHE_CONTROL, cache)], Json(serde_json::json!({ "lexicons": names }))).into_response()
}

/// `GET /lexicons/<nsid>.json`: the lexicon exactly as kept in the repository.
async fn lexicon_handler(Path(file): Path<String>) -> Response {
    let nsid = file.strip_suffix(".json").unwrap_or(&file);
    match all_lexicons().find(|(name, _)| *name == nsid) {
        Some((_, text)) => {
            let cache = format!("public, max-age={LEXICON_MAX_AGE_SECS}");
            ([(CONTENT_TYPE, "application/json".to_string()), (CACHE_CONTROL, cache)], *text).into_response()
        }
        None => XrpcError { status: StatusCode::NOT_FOUND, error: "NotFound", message: format!("no lexicon {nsid:?}") }
            .into_response(),
    }
}

async fn method_not_allowed() -> XrpcError {
    let message = "this endpoint only answers GET: the public listener changes nothing".to_string();
    XrpcError { status: StatusCode::METHOD_NOT_ALLOWED, error: "MethodNotAllowed", message }
}

/// The error for a request over the limits, checked before routing: a request target longer than
/// `MAX_URI_BYTES` (414), or any body at all (413).
fn refusal(request: &Request) -> Option<XrpcError> {
    let uri_len = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI_BYTES {
        let message = format!("the request target is {uri_len} bytes; at most {MAX_URI_BYTES} are accepted");
        return Some(XrpcError { status: StatusCode::URI_TOO_LONG, error: "UriTooLong", message });
    }
    let declared = request.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    let has_body = declared.is_some_and(|v| v.trim() != "0")
        || request.headers().contains_key(axum::http::header::TRANSFER_ENCODING);
    has_body.then(|| {
        let message = "no endpoint takes a request body".to_string();
        XrpcError { status: StatusCode::PAYLOAD_TOO_LARGE, error: "PayloadTooLarge", message }
    })
}

async fn not_found() -> XrpcError {
    XrpcError { status: StatusCode::NOT_FOUND, error: "MethodNotImplemented", message: "no such endpoint".into() }
}

/// One accepted connection: holds its place under the connection limit, and fails its reads and
/// writes with `TimedOut` once it has been idle for `idle_timeout`.
///
/// Moving bytes only records the time; the timer is moved when it fires early (bytes moved since
/// it was set), so a busy connection touches the timer wheel once per `idle_timeout`, not on
/// every read and write.
pub(crate) struct GuardedStream {
    inner: tokio::net::TcpStream,
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_timeout: Duration,
    last_active: tokio::time::Instant,
    _place: threads::Place,
}

impl GuardedStream {
    fn new(inner: tokio::net::TcpStream, place: threads::Place, idle_timeout: Duration) -> Self {
        let idle = Box::pin(tokio::time::sleep(idle_timeout));
        GuardedStream { inner, idle, idle_timeout, last_active: tokio::time::Instant::now(), _place: place }
    }

    /// Bytes moved: the connection is not idle.
    fn touch(&mut self) {
        self.last_active = tokio::time::Instant::now();
    }

    /// Called when the socket has nothing to do: an error once `idle_timeout` has passed since
    /// bytes last moved.
    fn idle_expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        loop {
            if Future::poll(self.idle.as_mut(), cx).is_pending() {
                return Poll::Pending;
            }
            let deadline = self.last_active + self.idle_timeout;
            if deadline <= tokio::time::Instant::now() {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connection idle for too long",
                )));
            }
            self.idle.as_mut().reset(deadline); // active since it was set: wait for the rest
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Pending => self.idle_expired(cx),
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(result)
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            // A client that stops reading its answers is idle too.
            Poll::Pending => self.idle_expired(cx),
            Poll::Ready(result) => {
                if result.as_ref().is_ok_and(|written| *written > 0) {
                    self.touch();
                }
                Poll::Ready(result)
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
