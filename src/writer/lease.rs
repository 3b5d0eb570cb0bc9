//! One writer per bucket prefix, enforced by the writer itself.
//!
//! The bucket has no conditional PUT (Garage ignores `If-None-Match`), so the writer cannot
//! take a lock atomically. Instead it keeps a lease object, `WRITER`, naming its owner id (a
//! random id kept in its data directory) and an expiry time, and renews it while it writes:
//! - a writer refuses to start while another owner's lease is unexpired, with an error that
//!   names that owner's host and pid and says when the lease runs out;
//! - the same data directory (a restart after a crash) takes its own lease back at once;
//! - a crashed writer's lease can be taken over once it expires;
//! - after writing its lease a writer waits `settle` and reads it back: if two writers started
//!   in the same instant, at most one finds its own lease there and the other stops. The window
//!   that remains (both reading back before either writes) is the price of having no
//!   conditional write; operators start one writer per prefix (systemd does) and replicas with
//!   `--read-only`, which never take the lease.

use crate::store::object::{Store, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

pub const LEASE_KEY: &str = "WRITER";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBody {
    pub owner: String,
    pub host: String,
    pub pid: u32,
    pub expires_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "another backlinks writer holds this bucket prefix (owner {owner}, host {host}, pid {pid}) until {expires_ms} \
         (unix ms); one writer per prefix: stop it, wait for its lease to expire, or run this one with --read-only"
    )]
    Held { owner: String, host: String, pid: u32, expires_ms: u64 },
    #[error("lost the writer lease to owner {0} while starting; another writer started at the same moment")]
    Lost(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone)]
pub struct WriterLease {
    store: Arc<dyn Store>,
    body: LeaseBody,
    ttl_ms: u64,
}

impl WriterLease {
    /// Takes the lease for `owner` at `now_ms`, or fails if another owner holds it.
    pub async fn acquire(
        store: Arc<dyn Store>,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
        settle: Duration,
    ) -> Result<Self, LeaseError> {
        if let Some(held) = read(store.as_ref()).await?
            && held.owner != owner
            && held.expires_ms > now_ms
        {
            return Err(LeaseError::Held {
                owner: held.owner,
                host: held.host,
                pid: held.pid,
                expires_ms: held.expires_ms,
            });
        }
        let body = LeaseBody {
            owner: owner.to_string(),
            host: std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown".into()),
            pid: std::process::id(),
            expires_ms: now_ms.saturating_add(ttl_ms),
        };
        let lease = WriterLease { store, body, ttl_ms };
        lease.write().await?;
        tokio::time::sleep(settle).await;
        match read(lease.store.as_ref()).await? {
            Some(found) if found.owner == owner => Ok(lease),
            Some(found) => Err(LeaseError::Lost(found.owner)),
            None => Err(LeaseError::Lost("(deleted)".into())),
        }
    }

    /// Extends the lease from `now_ms`; call well within the lease time.
    pub async fn renew(&mut self, now_ms: u64) -> Result<(), LeaseError> {
        if let Some(found) = read(self.store.as_ref()).await?
            && found.owner != self.body.owner
        {
            return Err(LeaseError::Lost(found.owner));
        }
        self.body.expires_ms = now_ms.saturating_add(self.ttl_ms);
        self.write().await
    }

    /// Gives the lease up (if it is still ours), so the next writer need not wait for expiry.
    pub async fn release(self) -> Result<(), LeaseError> {
        if read(self.store.as_ref()).await?.is_some_and(|found| found.owner == self.body.owner) {
            self.store.delete(LEASE_KEY).await?;
        }
        Ok(())
    }

    async fn write(&self) -> Result<(), LeaseError> {
        let body = serde_json::to_vec(&self.body).expect("a lease serializes");
        Ok(self.store.put(LEASE_KEY, body.into()).await?)
    }
}

/// The lease in the bucket; an unreadable one counts as expired (it can only be garbage).
async fn read(store: &dyn Store) -> Result<Option<LeaseBody>, LeaseError> {
    match store.get(LEASE_KEY).await {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// This data directory's writer id: created once (from `seed`), then read back on every start.
pub fn owner_id(data_dir: &std::path::Path, seed: u64) -> std::io::Result<String> {
    let path = data_dir.join("writer-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let mut state = seed;
            let id = format!("{:016x}", crate::base::rng::splitmix64(&mut state));
            crate::base::durable::write_durably(&path, id.as_bytes())?;
            Ok(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dir::DirStore;

    const TTL: u64 = 60_000;

    #[tokio::test]
    async fn a_second_writer_is_refused_until_release_or_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(DirStore::new(dir.path().to_path_buf()));
        let settle = Duration::ZERO;
        let first = WriterLease::acquire(store.clone(), "aaaa", 1_000, TTL, settle).await.unwrap();
        let refused = WriterLease::acquire(store.clone(), "bbbb", 2_000, TTL, settle).await.unwrap_err();
        assert!(matches!(refused, LeaseError::Held { ref owner, .. } if owner == "aaaa"), "{refused}");
        assert!(refused.to_string().contains("one writer per prefix"));
        // The same owner (a restart of the same data directory) takes it back at once.
        let mut again = WriterLease::acquire(store.clone(), "aaaa", 3_000, TTL, settle).await.unwrap();
        again.renew(4_000).await.unwrap();
        // Expired: another owner may take over a crashed writer's lease.
        let taken = WriterLease::acquire(store.clone(), "bbbb", 4_000 + TTL + 1, TTL, settle).await.unwrap();
        assert!(matches!(again.renew(4_000 + TTL + 2).await, Err(LeaseError::Lost(ref o)) if o == "bbbb"));
        // Release frees it immediately; releasing a lease someone else holds deletes nothing.
        first.release().await.unwrap();
        assert!(WriterLease::acquire(store.clone(), "cccc", 5_000 + TTL, TTL, settle).await.is_err());
        taken.release().await.unwrap();
        WriterLease::acquire(store.clone(), "cccc", 5_000 + TTL, TTL, settle).await.unwrap();
    }

    #[test]
    fn owner_id_is_stable_per_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let id = owner_id(dir.path(), 1).unwrap();
        assert_eq!(owner_id(dir.path(), 2).unwrap(), id);
        assert_eq!(id.len(), 16);
    }
}
