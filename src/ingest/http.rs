//! One small HTTP(S) client for everything ingest downloads: Jetstream's zstd dictionary, XRPC
//! listings (`listHosts`, `listRepos`), repository CARs (`getRepo`) and DID documents.
//!
//! Built on hyper-util's pooled client with rustls (ring, the platform's roots), the same TLS stack
//! the S3 client and the websocket use, so no second TLS library is linked.
//!
//! Invariants:
//! - Every request has a deadline (`timeout`), covering the headers and the whole body.
//! - A body is never buffered beyond its caller's `max_bytes`: a longer one is an error, not a
//!   truncated success.
//! - Only `http` and `https` URLs are fetched; redirects are not followed (XRPC does not use them).
//! - The answer carries the status, `Retry-After` (seconds, capped) and the body; deciding what a
//!   status means (retry, give up, record) is the caller's business.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// Longest `Retry-After` honoured; a server asking for more gets this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Idle pooled connections kept per host.
const POOL_IDLE_PER_HOST: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("bad URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: timed out after {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },
    #[error("{url}: body longer than {max_bytes} bytes")]
    TooLarge { url: String, max_bytes: usize },
}

impl FetchError {
    /// Worth trying again later: the network or the server may recover; a bad URL or an
    /// oversized body will not.
    pub fn is_transient(&self) -> bool {
        matches!(self, FetchError::Timeout { .. } | FetchError::Transport { .. })
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
        let value: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        Some(value.get("error")?.as_str()?.chars().take(128).collect())
    }
}

/// A cloneable client (the pool is shared).
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    user_agent: Arc<str>,
}

impl HttpClient {
    pub fn new() -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let tls = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
        let inner = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(POOL_IDLE_PER_HOST).build(connector);
        let user_agent = Arc::from(concat!("backlinks/", env!("CARGO_PKG_VERSION")));
        HttpClient { inner, user_agent }
    }

    /// GETs `url` and reads at most `max_bytes` of body, all within `timeout`.
    pub async fn get(&self, url: &str, max_bytes: usize, timeout: Duration) -> Result<Response, FetchError> {
        let uri = parse_url(url)?;
        let request = http::Request::get(uri)
            .header(http::header::USER_AGENT, self.user_agent.as_ref())
            .body(Empty::new())
            .map_err(|e| FetchError::BadUrl { url: url.into(), reason: e.to_string() })?;
        let exchange = async {
            let response =
                self.inner.request(request).await.map_err(|e| transport(url, &e as &dyn std::error::Error))?;
            let status = response.status().as_u16();
            let retry_after = response.headers().get(http::header::RETRY_AFTER).and_then(parse_retry_after);
            let body = Limited::new(response.into_body(), max_bytes).collect().await.map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    FetchError::TooLarge { url: url.into(), max_bytes }
                } else {
                    transport(url, e.as_ref())
                }
            })?;
            let body = body.to_bytes();
            assert!(body.len() <= max_bytes, "Limited let a longer body through");
            Ok(Response { status, retry_after, body })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| FetchError::Timeout { url: url.into(), after: timeout })?
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
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

/// The error and its causes on one line (hyper's own message alone says little).
fn transport(url: &str, error: &dyn std::error::Error) -> FetchError {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    FetchError::Transport { url: url.into(), reason }
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

    /// A one-connection server that answers every request with `response`.
    async fn serve_once(response: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 4096];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(response).await;
            let _ = socket.shutdown().await;
        });
        format!("http://{address}/xrpc/x")
    }

    #[tokio::test]
    async fn reads_status_retry_after_and_body() {
        let url = serve_once(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 43\r\n\r\n{\"error\":\"RateLimitExceeded\",\"message\":\"x\"}").await;
        let response = HttpClient::new().get(&url, 1024, Duration::from_secs(5)).await.unwrap();
        assert_eq!(response.status, 429);
        assert_eq!(response.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(response.xrpc_error().as_deref(), Some("RateLimitExceeded"));
        assert!(!response.is_success());
    }

    #[tokio::test]
    async fn refuses_bodies_over_the_limit() {
        let url = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789").await;
        let error = HttpClient::new().get(&url, 9, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(error, FetchError::TooLarge { max_bytes: 9, .. }), "{error}");
        assert!(!error.is_transient());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_a_transient_error() {
        let url = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this").await;
        let error = HttpClient::new().get(&url, 1024, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(error, FetchError::Transport { .. }), "{error}");
        assert!(error.is_transient());
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
