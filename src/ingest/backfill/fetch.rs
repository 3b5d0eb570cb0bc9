//! One repository, fetched and verified: its identity resolved (signing key and PDS), its CAR
//! downloaded from that PDS and nowhere else, its commit checked against that key and everything
//! under it against the commit (`ingest::repo`).
//!
//! Invariants:
//! - Whatever host listed the repository, the CAR comes from the PDS its DID document names.
//! - Nothing is returned unless the commit's signature verified with the identity's key: an
//!   identity without a key or a PDS is rejected, not structurally trusted.
//! - A signature that fails with a cached key gets one fresh resolution (the key may have
//!   rotated); a second failure is a rejection.
//! - The host's slot is held only while downloading; checking runs on the blocking pool under
//!   its own deadline, reading the CAR from memory or from its spill file.

use super::xrpc::{self, Failure};
use super::{Backfill, car_failure};
use crate::identity::document::Identity;
use crate::identity::keys::PublicKey;
use crate::identity::resolve::ResolveError;
use crate::ingest::repo::{CarError, CarSource, Expect, Repo, read_repo};
use crate::net::http::Limits;
use crate::net::spill::Spilled;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A repository that passed every check.
pub struct Verified {
    pub repo: Repo,
    /// Bytes of its CAR.
    pub bytes: u64,
}

impl Backfill {
    /// Resolves `did`, fetches its repository from its own PDS and verifies it.
    pub(super) async fn fetch_verified(&self, did: &str) -> Result<Verified, Failure> {
        let identity = self.resolver.resolve(did).await.map_err(identity_failure)?;
        let (pds, key) = usable(&identity)?;
        let car = Arc::new(self.download(did, &pds).await?);
        let bytes = car.len();
        let mut checked = self.check(&car, did, &key).await;
        if let Err(CarError::BadSignature(_)) = &checked {
            // The key may have rotated since it was cached: one fresh look.
            self.resolver.forget(did);
            if let Ok(fresh) = self.resolver.resolve(did).await
                && let Some(fresh_key) = fresh.signing_key.clone()
                && fresh_key != key
            {
                checked = self.check(&car, did, &fresh_key).await;
            }
        }
        match checked {
            Ok(repo) => Ok(Verified { repo, bytes }),
            Err(error) => {
                let failure = car_failure(error);
                if failure.counts_against_host() && self.hosts.failed(&pds, &failure.to_string()) {
                    self.progress.host_pauses.fetch_add(1, Ordering::Relaxed);
                }
                Err(failure)
            }
        }
    }

    /// The CAR of `did` from `pds`, holding one of the host's slots and its pacing.
    async fn download(&self, did: &str, pds: &str) -> Result<Spilled, Failure> {
        let _slot = self.hosts.slot(pds).await.map_err(|until| Failure::HostPaused { until })?;
        self.limiter.acquire(pds).await;
        let limits = Limits {
            max_bytes: usize::try_from(self.options.car.max_bytes).unwrap_or(usize::MAX),
            timeout: self.options.fetch_timeout,
            stall: self.options.stall,
            min_bytes_per_sec: self.options.min_bytes_per_sec,
        };
        let fetched = xrpc::get_repo(&self.http, pds, did, limits, &self.spill).await;
        match &fetched {
            Ok(_) => self.hosts.succeeded(pds),
            Err(Failure::RateLimited { retry_after }) => {
                self.rate_limited(pds, *retry_after, 1);
            }
            Err(failure) if failure.counts_against_host() => {
                if self.hosts.failed(pds, &failure.to_string()) {
                    self.progress.host_pauses.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {}
        }
        fetched
    }

    /// Runs every check of `ingest::repo` on the blocking pool, under the parse deadline.
    async fn check(&self, car: &Arc<Spilled>, did: &str, key: &PublicKey) -> Result<Repo, CarError> {
        let (car, did, key, limits) = (car.clone(), did.to_string(), key.clone(), self.options.car.clone());
        let now_us = self.now_us();
        let deadline = Some(std::time::Instant::now() + self.options.parse_timeout);
        tokio::task::spawn_blocking(move || {
            let source = match car.as_ref() {
                Spilled::Memory(bytes, _) => CarSource::Memory(bytes),
                Spilled::File { file, .. } => CarSource::File(file),
            };
            read_repo(&source, &limits, &Expect { did: Some(&did), key: Some(&key), now_us, deadline })
        })
        .await
        .unwrap_or_else(|join| Err(CarError::Io(format!("the check stopped: {join}"))))
    }
}

/// The PDS and key of an identity, or why it cannot be backfilled.
fn usable(identity: &Identity) -> Result<(String, PublicKey), Failure> {
    let rejected = |message: &str| Failure::Rejected { reason: "identity", message: message.to_string() };
    let pds = identity.pds.clone().ok_or_else(|| rejected("the DID document names no usable PDS"))?;
    let key = identity.signing_key.clone().ok_or_else(|| rejected("the DID document has no usable signing key"))?;
    Ok((pds, key))
}

/// What a failed resolution means for the repository.
fn identity_failure(error: ResolveError) -> Failure {
    match error {
        ResolveError::Gone { .. } => Failure::Unavailable(super::repos::RepoStatus::NotFound),
        ResolveError::Invalid { .. } => Failure::Rejected { reason: "identity", message: error.to_string() },
        ResolveError::Transient { .. } => Failure::Transient(error.to_string()),
    }
}
