//! One small HTTP(S) client for everything the server downloads: Jetstream's zstd dictionary,
//! XRPC listings, repository CARs, DID documents and PLC logs.
//!
//! Built on hyper-util's pooled client with rustls (ring, the platform's roots), the same TLS stack
//! the S3 client and the websocket use, with a DNS resolver that enforces an `AddressPolicy`.
//!
//! Invariants:
//! - Every request has a deadline (`Limits::timeout`) covering the headers and the whole body, and
//!   a body must keep arriving: silence for `stall` or an average below `min_bytes_per_sec` (after
//!   `RATE_GRACE`) ends it as `Slow`, so a host answering a byte at a time cannot hold a slot.
//! - A successful body is never buffered beyond `max_bytes` (a longer one is `TooLarge`, not a
//!   truncated success); an error body is read to `MAX_ERROR_BODY` at most and only its XRPC
//!   `error` and `message` are looked at.
//! - Only `http` and `https` URLs are fetched; redirects are not followed (XRPC does not use them);
//!   no connection reaches an address the policy refuses (`guard`).
//! - The answer carries the status, `Retry-After` (seconds, capped) and the body; deciding what a
//!   status means (retry, give up, record) is the caller's business.

use super::guard::{AddressPolicy, GuardedResolver};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest `Retry-After` honoured; a server asking for more gets this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Most bytes of an error answer read (its `{"error", "message"}` is all that is used).
pub const MAX_ERROR_BODY: usize = 64 << 10;
/// The time a body gets before its average rate is held to `min_bytes_per_sec`.
pub const RATE_GRACE: Duration = Duration::from_secs(10);
/// Idle pooled connections kept per host.
const POOL_IDLE_PER_HOST: usize = 8;

/// Bounds on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of a successful body.
    pub max_bytes: usize,
    /// Deadline of the whole exchange.
    pub timeout: Duration,
    /// Longest silence while the body arrives.
    pub stall: Duration,
    /// Slowest average rate accepted once `RATE_GRACE` has passed.
    pub min_bytes_per_sec: u64,
}

impl Limits {
    /// `max_bytes` within `timeout`, with the default stall (15 s) and rate (4 KiB/s).
    pub fn new(max_bytes: usize, timeout: Duration) -> Self {
        Limits { max_bytes, timeout, stall: Duration::from_secs(15), min_bytes_per_sec: 4 << 10 }
    }
}

/// Why a fetch failed. The URL is shown with any credentials in it redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("bad URL {:?}: {reason}", shown(.url))]
    BadUrl { url: String, reason: String },
    #[error("{}: refused: {reason}", shown(.url))]
    Refused { url: String, reason: String },
    #[error("{}: timed out after {after:?}", shown(.url))]
    Timeout { url: String, after: Duration },
    #[error("{}: too slow: {reason}", shown(.url))]
    Slow { url: String, reason: String },
    #[error("{}: {reason}", shown(.url))]
    Transport { url: String, reason: String },
    #[error("{}: body longer than {max_bytes} bytes", shown(.url))]
    TooLarge { url: String, max_bytes: usize },
    #[error("{}: {reason}", shown(.url))]
    Sink { url: String, reason: String },
}

fn shown(url: &str) -> std::borrow::Cow<'_, str> {
    crate::base::redact::redact_url(url)
}

impl FetchError {
    /// Worth trying again later: the network or the server may recover; a bad or refused URL,
    /// an oversized body or a failing sink will not.
    pub fn is_transient(&self) -> bool {
        matches!(self, FetchError::Timeout { .. } | FetchError::Transport { .. } | FetchError::Slow { .. })
    }
}

/// A complete answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// `Retry-After` in seconds, when present and numeric, capped at [`MAX_RETRY_AFTER`].
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The XRPC error name of a failed call (`{"error": "RepoNotFound", ...}`), if the body has one.
    pub fn xrpc_error(&self) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct XrpcError {
            error: String,
        }
        let parsed: XrpcError = serde_json::from_slice(&self.body).ok()?;
        Some(parsed.error.chars().take(128).collect())
    }
}

/// Where a streamed body goes, chunk by chunk.
pub trait BodySink {
    fn write(&mut self, chunk: &[u8]) -> std::io::Result<()>;
}

impl BodySink for Vec<u8> {
    fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.extend_from_slice(chunk);
        Ok(())
    }
}

/// A cloneable client (the pool is shared).
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, Empty<Bytes>>,
    policy: Arc<AddressPolicy>,
    user_agent: Arc<str>,
}

impl HttpClient {
    pub fn new(policy: AddressPolicy) -> Self {
        let policy = Arc::new(policy);
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let tls = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let mut http = HttpConnector::new_with_resolver(GuardedResolver::new(policy.clone()));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(POOL_IDLE_PER_HOST).build(connector);
        let user_agent = Arc::from(concat!("backlinks/", env!("CARGO_PKG_VERSION")));
        HttpClient { inner, policy, user_agent }
    }

    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// GETs `url` into memory.
    pub async fn get(&self, url: &str, limits: Limits) -> Result<Response, FetchError> {
        let mut body = Vec::new();
        let (status, retry_after) = self.get_into(url, limits, &mut body).await?;
        Ok(Response { status, retry_after, body: body.into() })
    }

    /// GETs `url`, handing a successful body to `sink` as it arrives (an error body is read to
    /// `MAX_ERROR_BODY` and handed over whole). Returns the status and `Retry-After`.
    pub async fn get_into(
        &self,
        url: &str,
        limits: Limits,
        sink: &mut (dyn BodySink + Send),
    ) -> Result<(u16, Option<Duration>), FetchError> {
        let uri = self.check_url(url)?;
        let request = http::Request::get(uri)
            .header(http::header::USER_AGENT, self.user_agent.as_ref())
            .body(Empty::new())
            .map_err(|e| FetchError::BadUrl { url: url.into(), reason: e.to_string() })?;
        let exchange = async {
            let response =
                self.inner.request(request).await.map_err(|e| transport(url, &e as &dyn std::error::Error))?;
            let status = response.status().as_u16();
            let retry_after = response.headers().get(http::header::RETRY_AFTER).and_then(parse_retry_after);
            let success = (200..300).contains(&status);
            let max_bytes = if success { limits.max_bytes } else { limits.max_bytes.min(MAX_ERROR_BODY) };
            match success {
                true => read_body(url, response.into_body(), limits, max_bytes, sink).await?,
                false => {
                    let mut error = Vec::new();
                    read_body(url, response.into_body(), limits, max_bytes, &mut error).await.or_else(|e| match e {
                        FetchError::TooLarge { .. } => Ok(()), // enough of it to name the error
                        other => Err(other),
                    })?;
                    sink.write(&error).map_err(|e| FetchError::Sink { url: url.into(), reason: e.to_string() })?;
                }
            }
            Ok((status, retry_after))
        };
        tokio::time::timeout(limits.timeout, exchange)
            .await
            .map_err(|_| FetchError::Timeout { url: url.into(), after: limits.timeout })?
    }

    /// The URL, parsed; an IP-literal host (which skips DNS, hence the resolver's check) must be
    /// one the policy permits.
    fn check_url(&self, url: &str) -> Result<http::Uri, FetchError> {
        let uri = parse_url(url)?;
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
            if !self.policy.permits(&SocketAddr::new(ip, port)) {
                return Err(FetchError::Refused { url: url.into(), reason: format!("{ip} is not a public address") });
            }
        }
        Ok(uri)
    }
}

/// Reads a body into `sink`, at most `max_bytes`, keeping it arriving (see `Limits`).
async fn read_body(
    url: &str,
    mut body: hyper::body::Incoming,
    limits: Limits,
    max_bytes: usize,
    sink: &mut (dyn BodySink + Send),
) -> Result<(), FetchError> {
    let started = Instant::now();
    let mut received = 0u64;
    loop {
        let slow = |reason: String| FetchError::Slow { url: url.into(), reason };
        let next = tokio::time::timeout(limits.stall, body.frame())
            .await
            .map_err(|_| slow(format!("nothing for {:?}", limits.stall)))?;
        let Some(frame) = next else { return Ok(()) };
        let frame = frame.map_err(|e| transport(url, &e as &dyn std::error::Error))?;
        let Ok(data) = frame.into_data() else { continue };
        received += data.len() as u64;
        let over = received.saturating_sub(max_bytes as u64) as usize;
        sink.write(&data[..data.len() - over])
            .map_err(|e| FetchError::Sink { url: url.into(), reason: e.to_string() })?;
        if over > 0 {
            return Err(FetchError::TooLarge { url: url.into(), max_bytes });
        }
        let owed = limits.min_bytes_per_sec.saturating_mul(started.elapsed().saturating_sub(RATE_GRACE).as_secs());
        if received < owed {
            return Err(slow(format!("{received} bytes in {:?}", started.elapsed())));
        }
    }
}

fn parse_url(url: &str) -> Result<http::Uri, FetchError> {
    let bad = |reason: &str| FetchError::BadUrl { url: url.into(), reason: reason.into() };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(uri),
        Some("http" | "https") => Err(bad("no host")),
        _ => Err(bad("only http and https URLs are fetched")),
    }
}

/// The error and its causes on one line (hyper's own message alone says little); a refusal of
/// the address guard (a name that resolves to no permitted address) is `Refused`.
fn transport(url: &str, error: &dyn std::error::Error) -> FetchError {
    let mut reason = error.to_string();
    let mut refused = false;
    let mut source = error.source();
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        refused |=
            cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
        source = cause.source();
    }
    match refused {
        true => FetchError::Refused { url: url.into(), reason },
        false => FetchError::Transport { url: url.into(), reason },
    }
}

/// `Retry-After: <seconds>`; the HTTP-date form would need the wall clock, so it is ignored (the
/// caller's own backoff applies).
fn parse_retry_after(value: &http::HeaderValue) -> Option<Duration> {
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection server on loopback that answers every request with `response`; returns
    /// the URL and the client allowed to reach it.
    async fn serve_once(response: &'static [u8]) -> (String, HttpClient) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 4096];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(response).await;
            let _ = socket.shutdown().await;
        });
        let client = HttpClient::new(AddressPolicy::with_allowed(&[address.to_string()]).unwrap());
        (format!("http://{address}/xrpc/x"), client)
    }

    fn limits(max_bytes: usize) -> Limits {
        Limits::new(max_bytes, Duration::from_secs(5))
    }

    #[tokio::test]
    async fn reads_status_retry_after_and_body() {
        let (url, client) = serve_once(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 43\r\n\r\n{\"error\":\"RateLimitExceeded\",\"message\":\"x\"}").await;
        let response = client.get(&url, limits(1024)).await.unwrap();
        assert_eq!(response.status, 429);
        assert_eq!(response.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(response.xrpc_error().as_deref(), Some("RateLimitExceeded"));
        assert!(!response.is_success());
    }

    #[tokio::test]
    async fn refuses_bodies_over_the_limit() {
        let (url, client) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789").await;
        let error = client.get(&url, limits(9)).await.unwrap_err();
        assert!(matches!(error, FetchError::TooLarge { max_bytes: 9, .. }), "{error}");
        assert!(!error.is_transient());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_a_transient_error() {
        let (url, client) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this").await;
        let error = client.get(&url, limits(1024)).await.unwrap_err();
        assert!(matches!(error, FetchError::Transport { .. }), "{error}");
        assert!(error.is_transient());
    }

    #[tokio::test]
    async fn an_endless_error_body_is_read_to_its_limit_only() {
        static BODY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let body = BODY.get_or_init(|| {
            let mut body = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 10000000\r\n\r\n".to_vec();
            body.extend(std::iter::repeat_n(b'x', 1 << 20));
            body
        });
        let (url, client) = serve_once(body).await;
        let response = client.get(&url, limits(64 << 20)).await.unwrap();
        assert_eq!(response.status, 500);
        assert_eq!(response.body.len(), MAX_ERROR_BODY);
        assert_eq!(response.xrpc_error(), None);
    }

    #[tokio::test]
    async fn loopback_and_metadata_addresses_are_refused_without_connecting() {
        let client = HttpClient::new(AddressPolicy::public_only());
        for url in
            ["http://127.0.0.1:9/x", "http://169.254.169.254/latest/meta-data/", "http://[::1]:9/", "https://10.0.0.1/"]
        {
            let error = client.get(url, limits(1024)).await.unwrap_err();
            assert!(matches!(error, FetchError::Refused { .. }), "{url}: {error}");
        }
        let error = client.get("http://localhost:9/x", limits(1024)).await.unwrap_err();
        assert!(matches!(error, FetchError::Refused { .. }), "{error}");
        assert!(error.to_string().contains("no permitted address"), "{error}");
    }

    #[test]
    fn errors_never_show_credentials() {
        let error = parse_url("ftp://user:hunter2@host/x").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let error = FetchError::Timeout { url: "https://u:hunter2@h/x".into(), after: Duration::from_secs(1) };
        assert_eq!(error.to_string(), "https://<redacted>@h/x: timed out after 1s");
    }

    #[test]
    fn only_http_urls_with_hosts_are_accepted() {
        assert!(parse_url("https://bsky.network/xrpc/com.atproto.sync.listHosts").is_ok());
        assert!(parse_url("file:///etc/passwd").is_err());
        assert!(parse_url("http:///nohost").is_err());
        assert!(parse_url("not a url").is_err());
    }

    #[test]
    fn retry_after_is_capped_and_dates_are_ignored() {
        let header = |s: &'static str| http::HeaderValue::from_static(s);
        assert_eq!(parse_retry_after(&header("30")), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after(&header("999999")), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after(&header("Wed, 21 Oct 2015 07:28:00 GMT")), None);
    }
}
