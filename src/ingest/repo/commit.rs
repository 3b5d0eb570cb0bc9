//! The signed commit at the root of a repository: its fields checked, its signature verified over
//! its unsigned form.
//!
//! Invariants:
//! - A commit is believed only for the DID that was asked for, with a `rev` that is a TID no more
//!   than `MAX_REV_SKEW_US` ahead of the injected "now" (version 3; version 2 commits, from before
//!   `rev` existed, carry none).
//! - The signature is checked over the DAG-CBOR of the commit without its `sig` field (the field
//!   absent, not null), by the key of the repository's DID document; without a key only the
//!   structure is vouched for, and the result says so.

use super::{CarError, Expect, RepoCommit};
use crate::model::tid::parse_tid;
use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;

/// How far ahead of the wall clock a commit's `rev` may be (clock skew between hosts).
pub const MAX_REV_SKEW_US: i64 = 5 * 60 * 1_000_000;

/// Decodes and checks the commit block: the commit, its MST root, and whether its signature was
/// verified (false: no key to check it with).
pub(super) fn check_commit(bytes: &[u8], expect: &Expect<'_>) -> Result<(RepoCommit, Cid, bool), CarError> {
    let bad = CarError::BadCommit;
    let Ipld::Map(mut fields) = serde_ipld_dagcbor::from_slice::<Ipld>(bytes).map_err(|e| bad(e.to_string()))? else {
        return Err(bad("commit is not a map".into()));
    };
    let did = match fields.get("did") {
        Some(Ipld::String(did)) => did.clone(),
        _ => return Err(bad("missing or non-string `did`".into())),
    };
    if let Some(expected) = expect.did
        && expected != did
    {
        return Err(CarError::WrongDid { expected: expected.to_string(), found: did.chars().take(256).collect() });
    }
    let version = match fields.get("version") {
        Some(Ipld::Integer(version @ 2..=3)) => *version as i64, // in 2..=3, so the cast is exact
        other => return Err(bad(format!("unsupported `version` {other:?}"))),
    };
    let data = match fields.get("data") {
        Some(Ipld::Link(cid)) => *cid,
        _ => return Err(bad("missing or non-link `data`".into())),
    };
    let rev = match (fields.get("rev"), version) {
        (Some(Ipld::String(rev)), _) if version == 2 || !rev.is_empty() => rev.clone(),
        (None, 2) => String::new(),
        _ => return Err(bad("missing or non-string `rev`".into())),
    };
    check_rev(&rev, expect.now_us)?;
    let Some(Ipld::Bytes(signature)) = fields.remove("sig") else {
        return Err(bad("missing or non-bytes `sig`".into()));
    };
    let signed = match expect.key {
        Some(key) => {
            let unsigned = serde_ipld_dagcbor::to_vec(&Ipld::Map(fields)).map_err(|e| bad(e.to_string()))?;
            key.verify(&unsigned, &signature).map_err(|e| CarError::BadSignature(e.to_string()))?;
            true
        }
        None => false,
    };
    Ok((RepoCommit { did, rev, data: data.to_string(), version }, data, signed))
}

/// A `rev` is a TID (or empty, in version 2) no later than `now_us` plus the allowed skew.
fn check_rev(rev: &str, now_us: i64) -> Result<(), CarError> {
    if rev.is_empty() {
        return Ok(());
    }
    let tid = parse_tid(rev).ok_or_else(|| CarError::BadCommit(format!("`rev` {rev:?} is not a TID")))?;
    let micros = (tid >> 10) as i64; // a TID's top bit is clear: the shift fits
    if micros > now_us.saturating_add(MAX_REV_SKEW_US) {
        return Err(CarError::RevInFuture { rev: rev.to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tid::format_tid;

    #[test]
    fn revs_past_the_allowed_skew_are_refused() {
        let now_us = 1_780_000_000_000_000;
        let rev = |micros: i64| format_tid((micros as u64) << 10);
        assert!(check_rev(&rev(now_us), now_us).is_ok());
        assert!(check_rev(&rev(now_us + MAX_REV_SKEW_US), now_us).is_ok());
        assert!(matches!(check_rev(&rev(now_us + MAX_REV_SKEW_US + 1), now_us), Err(CarError::RevInFuture { .. })));
        assert!(matches!(check_rev("not-a-tid", now_us), Err(CarError::BadCommit(_))));
        assert!(check_rev("", now_us).is_ok(), "version 2 commits carry none");
    }
}
