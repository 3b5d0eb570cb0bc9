//! Resolving a DID to its identity (signing key and PDS), checked, through a bounded cache.
//!
//! - `did:plc`: the local copy of the directory (`directory`), when it holds a fresh entry;
//!   otherwise the DID's whole operation log from the PLC directory (`/<did>/log/audit`), checked
//!   by the method's rules (`plc::audit`; the directory is not trusted to render the document),
//!   which then replaces the local entry.
//! - `did:web`: `https://<host>/.well-known/did.json`, hostname only (no port, no path), the
//!   document's `id` equal to the DID.
//!
//! Invariants:
//! - What a resolution returns was checked (`plc`, `document`); a PDS is a bare origin, https
//!   unless the address policy lets a local address be reached over plain http.
//! - The cache holds at most `cache_entries` identities, each for at most `ttl_ms` (injected
//!   clock); `forget` drops one at once, and marks its local directory entry stale (an
//!   `#identity` event, or a commit that failed to verify with a known key and deserves one fresh
//!   look from the directory itself).
//! - Every fetch goes through the guarded client: no DID can point the server at an internal
//!   address.

use super::directory::Directory;
use super::document::{Identity, MAX_DOCUMENT_BYTES, parse_document, pds_origin};
use super::plc::{PlcState, audit};
use crate::base::clock::Clock;
use crate::model::syntax::validate_did;
use crate::net::http::{FetchError, HttpClient, Limits};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest audit log read (a real log is a few KiB; the directory keeps at most a few hundred
/// operations of 7,500 bytes).
pub const MAX_AUDIT_LOG_BYTES: usize = 4 << 20;

#[derive(Clone, Debug)]
pub struct ResolverOptions {
    /// The PLC directory (or a mirror of it).
    pub plc_url: String,
    pub timeout: Duration,
    pub cache_entries: usize,
    pub ttl_ms: u64,
}

impl Default for ResolverOptions {
    fn default() -> Self {
        ResolverOptions {
            plc_url: "https://plc.directory".into(),
            timeout: Duration::from_secs(30),
            cache_entries: 100_000,
            ttl_ms: 3_600_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The identity does not exist (or no longer does): do not retry soon.
    #[error("{did}: {reason}")]
    Gone { did: String, reason: String },
    /// What was served is not a valid identity of the DID: recorded, retried much later.
    #[error("{did}: {reason}")]
    Invalid { did: String, reason: String },
    /// The network or the directory failed: try again later.
    #[error("{did}: {reason}")]
    Transient { did: String, reason: String },
}

/// Resolves DIDs, through a cache.
pub struct Resolver {
    http: HttpClient,
    options: ResolverOptions,
    clock: Clock,
    cache: Mutex<TtlCache>,
    directory: Option<Arc<Directory>>,
}

impl Resolver {
    pub fn new(http: HttpClient, options: ResolverOptions, clock: Clock) -> Self {
        let cache = Mutex::new(TtlCache::new(options.cache_entries));
        Resolver { http, options, clock, cache, directory: None }
    }

    /// Answers did:plc from `directory` first, and keeps it current with what it resolves.
    pub fn with_directory(mut self, directory: Arc<Directory>) -> Self {
        self.directory = Some(directory);
        self
    }

    /// The identity of `did`, from the cache while it is fresh.
    pub async fn resolve(&self, did: &str) -> Result<Arc<Identity>, ResolveError> {
        let now = (self.clock)();
        if let Some(identity) = self.cache.lock().expect("resolver cache poisoned").get(did, now) {
            return Ok(identity);
        }
        let identity = Arc::new(self.resolve_uncached(did).await?);
        self.cache.lock().expect("resolver cache poisoned").insert(did, identity.clone(), now + self.options.ttl_ms);
        Ok(identity)
    }

    /// Drops the cached identity of `did` (it changed, or a signature failed with it), and marks
    /// its local directory entry stale.
    pub fn forget(&self, did: &str) {
        self.cache.lock().expect("resolver cache poisoned").remove(did);
        if let Some(directory) = &self.directory
            && let Err(e) = directory.mark_stale(did)
        {
            tracing::warn!(did, error = %e, "could not mark a directory entry stale");
        }
    }

    async fn resolve_uncached(&self, did: &str) -> Result<Identity, ResolveError> {
        let invalid = |reason: String| ResolveError::Invalid { did: did.to_string(), reason };
        validate_did(did).map_err(|e| invalid(e.to_string()))?;
        if did.starts_with("did:plc:") {
            self.resolve_plc(did).await
        } else if let Some(host) = did.strip_prefix("did:web:") {
            self.resolve_web(did, host).await
        } else {
            Err(invalid("unsupported DID method".into()))
        }
    }

    async fn resolve_plc(&self, did: &str) -> Result<Identity, ResolveError> {
        let allow_http = |host: &str, port: u16| self.http.policy().permits_plain_http(host, port);
        if let Some(state) = self.local_entry(did) {
            return plc_identity(did, state, &allow_http);
        }
        let url = format!("{}/{did}/log/audit", self.options.plc_url.trim_end_matches('/'));
        let body = self.fetch(did, &url, MAX_AUDIT_LOG_BYTES).await?;
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&body)
            .map_err(|e| ResolveError::Invalid { did: did.into(), reason: format!("audit log: {e}") })?;
        let (log, state) =
            audit(did, &entries).map_err(|e| ResolveError::Invalid { did: did.into(), reason: e.to_string() })?;
        if let Some(directory) = &self.directory
            && let Err(e) = directory.store(did, &log)
        {
            tracing::warn!(did, error = %e, "could not store a resolved log in the local directory");
        }
        plc_identity(did, state, &allow_http)
    }

    /// The local directory's fresh entry for `did`, if it has one.
    fn local_entry(&self, did: &str) -> Option<PlcState> {
        match self.directory.as_ref()?.lookup(did) {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(did, error = %e, "local directory lookup failed; asking the directory");
                None
            }
        }
    }

    async fn resolve_web(&self, did: &str, host: &str) -> Result<Identity, ResolveError> {
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && host.contains('.')
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid_host {
            return Err(ResolveError::Invalid { did: did.into(), reason: "did:web is a hostname only".into() });
        }
        let url = format!("https://{}/.well-known/did.json", host.to_ascii_lowercase());
        let body = self.fetch(did, &url, MAX_DOCUMENT_BYTES).await?;
        let allow_http = |host: &str, port: u16| self.http.policy().permits_plain_http(host, port);
        parse_document(did, &body, &allow_http)
            .map_err(|e| ResolveError::Invalid { did: did.into(), reason: e.to_string() })
    }

    /// A successful body of `url`; 404 and 410 mean the identity is gone.
    async fn fetch(&self, did: &str, url: &str, max_bytes: usize) -> Result<bytes::Bytes, ResolveError> {
        let response = self.http.get(url, Limits::new(max_bytes, self.options.timeout)).await.map_err(|e| {
            let reason = e.to_string();
            match e {
                FetchError::Refused { .. } | FetchError::BadUrl { .. } | FetchError::TooLarge { .. } => {
                    ResolveError::Invalid { did: did.into(), reason }
                }
                _ => ResolveError::Transient { did: did.into(), reason },
            }
        })?;
        match response.status {
            200..=299 => Ok(response.body),
            404 | 410 => {
                Err(ResolveError::Gone { did: did.into(), reason: format!("{url} answered {}", response.status) })
            }
            status => Err(ResolveError::Transient { did: did.into(), reason: format!("{url} answered {status}") }),
        }
    }
}

/// The identity a PLC log's head gives, its PDS checked as an origin.
pub fn plc_identity(
    did: &str,
    state: PlcState,
    allow_http: &dyn Fn(&str, u16) -> bool,
) -> Result<Identity, ResolveError> {
    match state {
        PlcState::Tombstoned => Err(ResolveError::Gone { did: did.into(), reason: "tombstoned".into() }),
        PlcState::Active { signing_key, pds } => {
            let pds = pds.and_then(|endpoint| pds_origin(&endpoint, allow_http).ok());
            Ok(Identity { did: did.to_string(), signing_key, pds })
        }
    }
}

/// A bounded map with expiry; the oldest insertion goes first when it is full.
struct TtlCache {
    entries: HashMap<String, (Arc<Identity>, u64)>,
    order: VecDeque<String>,
    capacity: usize,
}

impl TtlCache {
    fn new(capacity: usize) -> Self {
        TtlCache { entries: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    fn get(&self, did: &str, now_ms: u64) -> Option<Arc<Identity>> {
        self.entries.get(did).filter(|(_, expires)| *expires > now_ms).map(|(identity, _)| identity.clone())
    }

    fn insert(&mut self, did: &str, identity: Arc<Identity>, expires_ms: u64) {
        if self.entries.insert(did.to_string(), (identity, expires_ms)).is_none() {
            self.order.push_back(did.to_string());
        }
        while self.entries.len() > self.capacity {
            let Some(oldest) = self.order.pop_front() else { break };
            self.entries.remove(&oldest);
        }
        // Keys removed by `remove` stay in `order` until they come up; bound that too.
        if self.order.len() > 2 * self.capacity {
            self.order.retain(|did| self.entries.contains_key(did));
        }
    }

    fn remove(&mut self, did: &str) {
        self.entries.remove(did);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(did: &str) -> Arc<Identity> {
        Arc::new(Identity { did: did.into(), signing_key: None, pds: None })
    }

    #[tokio::test]
    async fn the_local_directory_answers_until_the_identity_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let directory = Arc::new(Directory::open(&dir.path().join("plc.db")).unwrap());
        let path = format!("{}/tests/data/plc/audit_log/valid/log_bskyapp.json", env!("CARGO_MANIFEST_DIR"));
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let did = entries[0]["did"].as_str().unwrap();
        let (log, _) = audit(did, &entries).unwrap();
        directory.store(did, &log).unwrap();
        // A directory nobody may reach: only the local copy can answer.
        let options = ResolverOptions { plc_url: "http://127.0.0.1:9".into(), ..ResolverOptions::default() };
        let resolver =
            Resolver::new(HttpClient::new(crate::net::guard::AddressPolicy::public_only()), options, Arc::new(|| 0))
                .with_directory(directory);
        let identity = resolver.resolve(did).await.unwrap();
        assert_eq!(identity.pds.as_deref(), Some("https://bsky.social"));
        resolver.forget(did);
        let error = resolver.resolve(did).await.unwrap_err();
        assert!(matches!(error, ResolveError::Invalid { .. }), "forgotten: asked the (unreachable) directory: {error}");
    }

    #[test]
    fn the_cache_is_bounded_and_expires() {
        let mut cache = TtlCache::new(2);
        cache.insert("a", identity("a"), 100);
        cache.insert("b", identity("b"), 100);
        assert!(cache.get("a", 99).is_some());
        assert!(cache.get("a", 100).is_none(), "expired");
        cache.insert("c", identity("c"), 100);
        assert!(cache.get("a", 0).is_none(), "the oldest went first");
        assert!(cache.get("b", 0).is_some() && cache.get("c", 0).is_some());
        cache.remove("b");
        assert!(cache.get("b", 0).is_none());
        for i in 0..100 {
            cache.insert(&i.to_string(), identity("x"), 100);
            cache.remove(&i.to_string());
        }
        assert!(cache.order.len() <= 4 && cache.entries.len() <= 2);
    }
}
