//! The sync endpoints backfill calls, and what their answers mean:
//! `com.atproto.sync.listHosts` (a relay's upstream PDSes), `com.atproto.sync.listRepos` (a host's
//! repositories) and `com.atproto.sync.getRepo` (one repository as a CAR). Which host a
//! repository may be fetched from is the identity's business (`identity::resolve`), not a listing's.
//!
//! Invariants:
//! - Every answer is classified into exactly one [`Failure`] kind or a success; the caller's retry
//!   policy depends only on that kind.
//! - A listing page is bounded (`MAX_LISTING_BYTES`, at most `PAGE_LIMIT` entries asked for) and
//!   every DID in it is validated before it reaches repos.db; invalid entries are counted, skipped.
//! - A listing cursor that does not move is an error (a server bug would otherwise loop forever).
//! - A CAR is held in memory up to `spill_bytes` and in an unnamed file past that, never whole in
//!   memory when large.

use crate::ingest::backfill::repos::RepoStatus;
use crate::model::syntax::validate_did;
use crate::model::tid::parse_tid;
use crate::net::http::{FetchError, HttpClient, Limits, Response};
use crate::net::spill::{MemoryBudget, SpillSink, Spilled};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Entries asked for per listing page (the lexicons' maximum).
pub const PAGE_LIMIT: usize = 1000;
/// Largest listing page or DID document read.
pub const MAX_LISTING_BYTES: usize = 4 << 20;
/// Longest hostname accepted from a relay.
const MAX_HOSTNAME_LEN: usize = 253;

/// Why a call did not succeed, by what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Slow down; try again after the server's `Retry-After` when it gave one.
    #[error("rate limited (HTTP 429)")]
    RateLimited { retry_after: Option<Duration> },
    /// Network trouble, a 5xx, a cut body: try again later.
    #[error("{0}")]
    Transient(String),
    /// The repository is not available, for a recorded reason: do not retry.
    #[error("repository {}", .0.as_str())]
    Unavailable(RepoStatus),
    /// Anything else (a 4xx, a malformed answer): recorded, not retried.
    #[error("{0}")]
    Permanent(String),
    /// What was served failed verification (the snapshot, or the identity behind it): recorded
    /// as `rejected` with the check that failed (`reason`), tried again only much later.
    #[error("{message}")]
    Rejected { reason: &'static str, message: String },
    /// The host is paused by its circuit breaker (until the instant given, or for the rest of the
    /// run): not the repository's fault, so no attempt is counted.
    #[error("host paused after repeated failures")]
    HostPaused { until: Option<tokio::time::Instant> },
}

impl Failure {
    /// Whether this failure says something about the host that served it (and counts towards
    /// pausing it): transport trouble, server errors, malformed answers, forgeries.
    pub fn counts_against_host(&self) -> bool {
        matches!(self, Failure::Transient(_) | Failure::Permanent(_) | Failure::Rejected { .. })
    }
}

impl From<FetchError> for Failure {
    fn from(error: FetchError) -> Self {
        match error {
            // An identity that sends us to a loopback, private or metadata address is hostile.
            FetchError::Refused { .. } => Failure::Rejected { reason: "forbidden_address", message: error.to_string() },
            _ if error.is_transient() => Failure::Transient(error.to_string()),
            _ => Failure::Permanent(error.to_string()),
        }
    }
}

/// Classifies a non-2xx answer.
pub fn classify(response: &Response) -> Failure {
    let xrpc = response.xrpc_error();
    if response.status == 429 {
        return Failure::RateLimited { retry_after: response.retry_after };
    }
    if let Some(status) = xrpc.as_deref().and_then(RepoStatus::from_account_status) {
        return Failure::Unavailable(status);
    }
    match response.status {
        404 => Failure::Unavailable(RepoStatus::NotFound),
        408 | 500..=599 => Failure::Transient(format!("HTTP {}", response.status)),
        status => Failure::Permanent(format!("HTTP {status} {}", xrpc.unwrap_or_default())),
    }
}

/// One entry of a `listRepos` page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRepo {
    pub did: String,
    pub rev: Option<u64>,
    /// `None` when active.
    pub inactive: Option<RepoStatus>,
}

/// One page of a listing and the cursor of the next (`None` at the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
    /// Entries dropped as invalid.
    pub invalid: usize,
}

/// A listing page: `listRepos` names its entries `repos`, `listHosts` names them `hosts`.
#[derive(Deserialize)]
struct RawPage<E> {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(alias = "repos", alias = "hosts")]
    entries: Vec<E>,
}

#[derive(Deserialize)]
struct RawRepo {
    did: String,
    #[serde(default)]
    rev: Option<String>,
    #[serde(default)]
    active: Option<bool>,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
struct RawHost {
    hostname: String,
    #[serde(default)]
    status: Option<String>,
}

/// `https://host` with no trailing slash; a bare hostname gets `scheme`.
pub fn base_url(host: &str, scheme: &str) -> String {
    let host = host.trim_end_matches('/');
    if host.starts_with("http://") || host.starts_with("https://") {
        host.to_string()
    } else {
        format!("{scheme}://{host}")
    }
}

fn listing_url(base: &str, method: &str, cursor: Option<&str>) -> String {
    let mut url = format!("{base}/xrpc/{method}?limit={PAGE_LIMIT}");
    if let Some(cursor) = cursor {
        url.push_str("&cursor=");
        url.extend(form_urlencoded::byte_serialize(cursor.as_bytes()));
    }
    url
}

async fn get_json(http: &HttpClient, url: &str, timeout: Duration) -> Result<Response, Failure> {
    let response = http.get(url, Limits::new(MAX_LISTING_BYTES, timeout)).await?;
    if response.is_success() { Ok(response) } else { Err(classify(&response)) }
}

fn check_cursor(previous: Option<&str>, next: Option<String>, items: usize) -> Result<Option<String>, Failure> {
    // An empty page ends the listing whatever cursor it carries; a cursor that repeats would loop.
    let next = next.filter(|_| items > 0);
    if next.is_some() && next.as_deref() == previous {
        return Err(Failure::Permanent("listing cursor did not advance".into()));
    }
    Ok(next)
}

/// One page of listing `method` on `base`: the entries `keep` accepts, the others counted.
async fn fetch_page<E: serde::de::DeserializeOwned, T>(
    http: &HttpClient,
    base: &str,
    method: &str,
    cursor: Option<&str>,
    timeout: Duration,
    keep: impl Fn(E) -> Option<T>,
) -> Result<Page<T>, Failure> {
    let response = get_json(http, &listing_url(base, method, cursor), timeout).await?;
    let page: RawPage<E> =
        serde_json::from_slice(&response.body).map_err(|e| Failure::Permanent(format!("{method}: {e}")))?;
    let total = page.entries.len();
    let items: Vec<T> = page.entries.into_iter().filter_map(keep).collect();
    Ok(Page { next: check_cursor(cursor, page.cursor, total)?, invalid: total - items.len(), items })
}

/// One page of `com.atproto.sync.listRepos` on `base`.
pub async fn list_repos(
    http: &HttpClient,
    base: &str,
    cursor: Option<&str>,
    timeout: Duration,
) -> Result<Page<ListedRepo>, Failure> {
    fetch_page(http, base, "com.atproto.sync.listRepos", cursor, timeout, listed_repo).await
}

fn listed_repo(raw: RawRepo) -> Option<ListedRepo> {
    validate_did(&raw.did).ok()?;
    let inactive = match raw.active {
        Some(false) => {
            Some(raw.status.as_deref().and_then(RepoStatus::from_account_status).unwrap_or(RepoStatus::Deactivated))
        }
        _ => None,
    };
    Some(ListedRepo { did: raw.did, rev: raw.rev.as_deref().and_then(parse_tid), inactive })
}

/// One page of `com.atproto.sync.listHosts` on a relay: the hostnames worth listing (banned and
/// offline hosts are left out).
pub async fn list_hosts(
    http: &HttpClient,
    relay: &str,
    cursor: Option<&str>,
    timeout: Duration,
) -> Result<Page<String>, Failure> {
    fetch_page(http, relay, "com.atproto.sync.listHosts", cursor, timeout, listed_host).await
}

fn listed_host(raw: RawHost) -> Option<String> {
    let reachable = !matches!(raw.status.as_deref(), Some("banned" | "offline"));
    (reachable && valid_hostname(&raw.hostname)).then_some(raw.hostname)
}

/// A hostname (optionally with a port): letters, digits, `-`, `.`, `:`; no path, no scheme.
fn valid_hostname(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_HOSTNAME_LEN
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':'))
}

/// Where a downloaded CAR goes: memory up to `memory_bytes` (within the budget shared by every
/// download), an unnamed file in `directory` past that.
#[derive(Clone, Debug)]
pub struct CarSpill {
    pub memory_bytes: usize,
    pub budget: Arc<MemoryBudget>,
    pub directory: PathBuf,
}

/// `com.atproto.sync.getRepo` for `did` on `base`: the CAR, kept as `spill` says.
pub async fn get_repo(
    http: &HttpClient,
    base: &str,
    did: &str,
    limits: Limits,
    spill: &CarSpill,
) -> Result<Spilled, Failure> {
    let url = format!(
        "{base}/xrpc/com.atproto.sync.getRepo?did={}",
        form_urlencoded::byte_serialize(did.as_bytes()).collect::<String>()
    );
    let mut sink = SpillSink::new(spill.memory_bytes, &spill.budget, &spill.directory);
    let (status, retry_after) = http.get_into(&url, limits, &mut sink).await?;
    let body = sink.finish().map_err(|e| Failure::Transient(format!("spilling the CAR: {e}")))?;
    if (200..300).contains(&status) {
        return Ok(body);
    }
    // An error body is at most `MAX_ERROR_BODY`; one that spilled is not worth reading back.
    let body = match body {
        Spilled::Memory(bytes, _) => bytes.into(),
        Spilled::File { .. } => bytes::Bytes::new(),
    };
    Err(classify(&Response { status, retry_after, body }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn response(status: u16, body: &str) -> Response {
        Response { status, retry_after: None, body: Bytes::from(body.to_string()) }
    }

    #[test]
    fn answers_are_classified_by_what_to_do() {
        assert_eq!(classify(&response(429, "")), Failure::RateLimited { retry_after: None });
        assert_eq!(classify(&response(503, "")), Failure::Transient("HTTP 503".into()));
        assert_eq!(
            classify(&response(400, r#"{"error":"RepoTakendown","message":"gone"}"#)),
            Failure::Unavailable(RepoStatus::Takendown)
        );
        assert_eq!(classify(&response(400, r#"{"error":"RepoNotFound"}"#)), Failure::Unavailable(RepoStatus::NotFound));
        assert_eq!(classify(&response(404, "")), Failure::Unavailable(RepoStatus::NotFound));
        assert_eq!(
            classify(&response(400, r#"{"error":"InvalidRequest"}"#)),
            Failure::Permanent("HTTP 400 InvalidRequest".into())
        );
    }

    #[test]
    fn listed_repos_are_validated_and_inactive_ones_marked() {
        let ok = RawRepo { did: "did:plc:abc".into(), rev: Some("3l3qo2vutsw2b".into()), active: None, status: None };
        assert_eq!(listed_repo(ok).unwrap().rev, parse_tid("3l3qo2vutsw2b"));
        let bad = RawRepo { did: "nope".into(), rev: None, active: None, status: None };
        assert!(listed_repo(bad).is_none());
        let gone =
            RawRepo { did: "did:plc:abc".into(), rev: None, active: Some(false), status: Some("takendown".into()) };
        assert_eq!(listed_repo(gone).unwrap().inactive, Some(RepoStatus::Takendown));
        let silent = RawRepo { did: "did:plc:abc".into(), rev: None, active: Some(false), status: None };
        assert_eq!(listed_repo(silent).unwrap().inactive, Some(RepoStatus::Deactivated));
    }

    #[test]
    fn pages_of_both_listings_parse_and_drop_unusable_hosts() {
        let repos: RawPage<RawRepo> =
            serde_json::from_str(r#"{"cursor":"c","repos":[{"did":"did:plc:a","head":"x","rev":"3l3qo2vutsw2b"}]}"#)
                .unwrap();
        assert_eq!((repos.cursor.as_deref(), repos.entries.len()), (Some("c"), 1));
        let hosts: RawPage<RawHost> = serde_json::from_str(
            r#"{"hosts":[{"hostname":"pds.example.com"},{"hostname":"gone.example","status":"banned"},{"hostname":"a/b"}]}"#,
        )
        .unwrap();
        let kept: Vec<String> = hosts.entries.into_iter().filter_map(listed_host).collect();
        assert_eq!(kept, vec!["pds.example.com".to_string()]);
    }

    #[test]
    fn cursors_must_advance_and_empty_pages_end_listings() {
        assert_eq!(check_cursor(None, Some("a".into()), 3).unwrap(), Some("a".into()));
        assert_eq!(
            check_cursor(Some("a"), Some("a".into()), 3),
            Err(Failure::Permanent("listing cursor did not advance".into()))
        );
        assert_eq!(check_cursor(Some("a"), Some("b".into()), 0).unwrap(), None);
    }

    #[test]
    fn urls_and_hostnames() {
        assert_eq!(base_url("pds.example.com", "https"), "https://pds.example.com");
        assert_eq!(base_url("http://127.0.0.1:9/", "https"), "http://127.0.0.1:9");
        assert_eq!(
            listing_url("https://r", "com.atproto.sync.listRepos", Some("a b&c")),
            "https://r/xrpc/com.atproto.sync.listRepos?limit=1000&cursor=a+b%26c"
        );
        assert!(valid_hostname("pds.example.com:2583"));
        assert!(!valid_hostname("evil.com/path"));
        assert!(!valid_hostname(""));
    }
}
