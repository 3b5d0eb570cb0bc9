//! CAR files (`backfill --car`), usable offline: their CIDs and structure are always checked; the
//! commit's signature is checked when the DID's document is at hand, given with `--did-doc` or
//! resolved, and the summary counts which were verified and which only structurally checked.
//!
//! Invariants:
//! - A CAR file is read by position from the file, never whole into memory.
//! - A document given for the DID is binding: a CAR it does not verify is refused, and so is one
//!   when the document has no usable key. Without one, a resolved identity's key is used when
//!   resolution succeeds; when it cannot (offline), the file is indexed as structurally checked
//!   and says so.
//! - A file cannot be fetched again, so a file older than the live commits already applied is
//!   recorded `stale` and skipped.

use super::repos::{Listed, RepoStatus};
use super::{Backfill, BackfillError};
use crate::identity::document::{Identity, MAX_DOCUMENT_BYTES, parse_document};
use crate::identity::keys::PublicKey;
use crate::ingest::backfill::gate::SnapshotOutcome;
use crate::ingest::repo::{CarSource, Expect, Repo, peek_did, read_repo};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;

/// Where a CAR file's key came from.
enum KeySource {
    Document(PublicKey),
    Resolved(PublicKey),
    None(String),
}

impl Backfill {
    /// A CAR file: checked, then written through the gate like a fetched snapshot.
    pub(super) async fn index_car_file(&self, path: &Path) -> Result<(), BackfillError> {
        let car_error = |reason: String| BackfillError::CarFile { path: path.display().to_string(), reason };
        let file = std::fs::File::open(path).map_err(|e| car_error(e.to_string()))?;
        let length = file.metadata().map_err(|e| car_error(e.to_string()))?.len();
        if length > self.options.car.max_bytes {
            return Err(car_error(format!("larger than {} bytes", self.options.car.max_bytes)));
        }
        let file = std::sync::Arc::new(file);
        let limits = self.options.car.clone();
        let peek = (file.clone(), limits.clone());
        let did = tokio::task::spawn_blocking(move || peek_did(&CarSource::File(&peek.0), &peek.1))
            .await
            .map_err(|e| BackfillError::Task(e.to_string()))?
            .map_err(|e| car_error(e.to_string()))?;
        let key = match self.car_file_key(&did).await? {
            KeySource::Document(key) | KeySource::Resolved(key) => Some(key),
            KeySource::None(why) => {
                tracing::warn!(path = %path.display(), did, why, "CAR file indexed with its CIDs and structure checked, its signature not");
                None
            }
        };
        let (now_us, deadline) = (self.now_us(), Some(std::time::Instant::now() + self.options.parse_timeout));
        let expected = did.clone();
        let signed_key = key.clone();
        let Repo { commit, records, signed, .. } = tokio::task::spawn_blocking(move || {
            let expect = Expect { did: Some(&expected), key: signed_key.as_ref(), now_us, deadline };
            read_repo(&CarSource::File(&file), &limits, &expect)
        })
        .await
        .map_err(|e| BackfillError::Task(e.to_string()))?
        .map_err(|e| car_error(e.to_string()))?;
        let counter = if signed { &self.progress.verified } else { &self.progress.unverified };
        counter.fetch_add(1, Ordering::Relaxed);
        self.repos.offer(&[Listed { did: &did, host: "", rev: None, inactive: None }], self.now_ms())?;
        self.count_known()?;
        if !self.gate.begin(&did) {
            return Err(car_error(format!("{did} is already being backfilled")));
        }
        let gate = self.gate.clone();
        let (outcome, count) =
            tokio::task::spawn_blocking(move || gate.finish(&commit, &records).map(|o| (o, records.len())))
                .await
                .map_err(|e| BackfillError::Task(e.to_string()))??;
        self.progress.bytes.fetch_add(length, Ordering::Relaxed);
        if let SnapshotOutcome::Stale { .. } = outcome {
            self.repos.mark_settled(
                &did,
                RepoStatus::Stale,
                Some("CAR file older than live commits"),
                self.now_ms(),
            )?;
            tracing::warn!(path = %path.display(), did, "CAR file is older than live commits already applied; skipped");
        } else {
            self.record_outcome(&did, outcome, count)?;
        }
        self.flush_if_full().await
    }

    /// The key to check `did`'s CAR file with: its given document's, else its resolved one's.
    async fn car_file_key(&self, did: &str) -> Result<KeySource, BackfillError> {
        if let Some(identity) = self.given_documents()?.remove(did) {
            let key = identity.signing_key.ok_or_else(|| BackfillError::CarFile {
                path: format!("the DID document of {did}"),
                reason: "it has no usable signing key".into(),
            })?;
            return Ok(KeySource::Document(key));
        }
        Ok(match self.resolver.resolve(did).await {
            Ok(identity) => match &identity.signing_key {
                Some(key) => KeySource::Resolved(key.clone()),
                None => KeySource::None("the resolved DID document has no usable signing key".into()),
            },
            Err(e) => KeySource::None(format!("the DID could not be resolved: {e}")),
        })
    }

    /// The documents given with `--did-doc`, by the DID each names.
    fn given_documents(&self) -> Result<HashMap<String, Identity>, BackfillError> {
        let mut documents = HashMap::new();
        for path in &self.options.did_documents {
            let error = |reason: String| BackfillError::CarFile { path: path.display().to_string(), reason };
            let length = std::fs::metadata(path).map_err(|e| error(e.to_string()))?.len();
            if length > MAX_DOCUMENT_BYTES as u64 {
                return Err(error(format!("larger than {MAX_DOCUMENT_BYTES} bytes")));
            }
            let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
            let id: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| error(e.to_string()))?;
            let did = id.get("id").and_then(|v| v.as_str()).ok_or_else(|| error("no `id`".into()))?.to_string();
            // The operator handed this document over: any endpoint in it is theirs to name.
            let identity = parse_document(&did, &bytes, &|_, _| true).map_err(|e| error(e.to_string()))?;
            documents.insert(did, identity);
        }
        Ok(documents)
    }
}
