//! did:plc: operation logs, checked. An identity's key and PDS come from the newest operation of
//! its log that the log's own rules let stand, whoever served the log.
//!
//! The rules (the PLC method's, as its interop vectors pin them; `tests/data/plc`):
//! - every operation is signed (ECDSA, low-S, 64 bytes in unpadded base64url) over the DAG-CBOR of
//!   itself without `sig`; its CID is the CIDv1 (dag-cbor, sha-256) of itself with `sig`;
//! - the genesis operation (`prev: null`) names the DID: `did:plc:` + the first 24 characters of
//!   base32(sha-256(signed genesis)); it is signed by one of its own rotation keys;
//! - a later operation names its parent by CID (`prev`) and is signed by one of the parent's
//!   rotation keys; a second child of the same parent (a fork) nullifies the first child and all
//!   after it, if it is signed by a key of strictly higher priority (earlier in the list) than the
//!   one that signed the first child, comes after the current head, and comes no more than 72 hours
//!   after every operation it nullifies;
//! - nothing follows a tombstone, no operation may name a nullified parent, and times increase;
//! - the legacy `create` genesis stands for rotation keys `[recoveryKey, signingKey]`, signing key
//!   `signingKey`, PDS `service`.
//!
//! Invariants:
//! - `PlcLog::apply` changes nothing when it refuses an operation.
//! - `PlcLog::prune` drops only what no later operation could name or nullify, so a pruned log
//!   accepts and refuses exactly what the whole log would.
//! - A log holds at most `MAX_LOG_OPERATIONS` operations, each at most `MAX_OPERATION_BYTES`.

use super::keys::PublicKey;
use crate::base::dates::parse_rfc3339_us;
use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use ipld_core::cid::Cid;
use ipld_core::cid::multihash::Multihash;
use ipld_core::ipld::Ipld;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Largest operation (its DAG-CBOR), as the directory enforces.
pub const MAX_OPERATION_BYTES: usize = 7_500;
/// Most operations one log may hold (real logs hold a handful).
pub const MAX_LOG_OPERATIONS: usize = 1_000;
/// How long after an operation a fork may still nullify it.
pub const NULLIFY_WINDOW_US: i64 = 72 * 3_600 * 1_000_000;
/// Most rotation keys an operation may list.
const MAX_ROTATION_KEYS: usize = 10;
const DAG_CBOR: u64 = 0x71;
const SHA2_256: u64 = 0x12;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlcError {
    #[error("operation {index}: {reason}")]
    Invalid { index: usize, reason: String },
    #[error("the log holds more than {MAX_LOG_OPERATIONS} operations")]
    TooLong,
    #[error("the log is empty")]
    Empty,
}

/// What the head of a log says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlcState {
    Active {
        /// `verificationMethods.atproto`; `None` when absent or not a usable key.
        signing_key: Option<PublicKey>,
        /// `services.atproto_pds.endpoint` (type `AtprotoPersonalDataServer`), as written.
        pds: Option<String>,
    },
    Tombstoned,
}

/// One accepted operation of a log.
#[derive(Clone, Debug)]
struct Accepted {
    cid: String,
    prev: Option<String>,
    created_us: i64,
    rotation_keys: Vec<PublicKey>,
    /// Only `rotation_keys[..allowed]` may sign a (further) child: the keys above the first
    /// child's signer, for a fork.
    allowed: usize,
    state: PlcState,
    nullified: bool,
}

impl Accepted {
    fn stored(&self) -> StoredOp {
        let (signing_key, pds, tombstoned) = match &self.state {
            PlcState::Active { signing_key, pds } => {
                (signing_key.as_ref().map(PublicKey::to_multikey), pds.clone(), false)
            }
            PlcState::Tombstoned => (None, None, true),
        };
        StoredOp {
            cid: self.cid.clone(),
            prev: self.prev.clone(),
            created_us: self.created_us,
            rotation_keys: self.rotation_keys.iter().map(PublicKey::to_multikey).collect(),
            allowed: self.allowed,
            signing_key,
            pds,
            tombstoned,
        }
    }

    fn from_stored(op: StoredOp) -> Result<Self, String> {
        let key = |text: &str| PublicKey::from_multikey(text).map_err(|e| format!("a stored key: {e}"));
        let rotation_keys = op.rotation_keys.iter().map(|k| key(k)).collect::<Result<Vec<_>, _>>()?;
        if op.allowed > rotation_keys.len() {
            return Err("more allowed keys than rotation keys".into());
        }
        let state = match op.tombstoned {
            true => PlcState::Tombstoned,
            false => PlcState::Active { signing_key: op.signing_key.as_deref().map(key).transpose()?, pds: op.pds },
        };
        Ok(Accepted {
            cid: op.cid,
            prev: op.prev,
            created_us: op.created_us,
            rotation_keys,
            allowed: op.allowed,
            state,
            nullified: false,
        })
    }
}

/// A DID's log as far as it was applied: every operation accepted, nullified ones marked.
#[derive(Clone, Debug)]
pub struct PlcLog {
    did: String,
    ops: Vec<Accepted>,
}

/// One log entry as `/log/audit` and `/export` give it.
#[derive(Clone, Debug)]
pub struct LogEntry<'a> {
    pub operation: &'a Value,
    /// The CID the directory gave, checked against the operation's own when present.
    pub cid: Option<&'a str>,
    pub created_at: &'a str,
}

impl PlcLog {
    pub fn new(did: &str) -> Self {
        PlcLog { did: did.to_string(), ops: Vec::new() }
    }

    /// The state of the current head; `None` before the genesis operation.
    pub fn state(&self) -> Option<&PlcState> {
        self.head().map(|op| &op.state)
    }

    /// Which operations (in the order applied) were nullified.
    pub fn nullified(&self) -> Vec<bool> {
        self.ops.iter().map(|op| op.nullified).collect()
    }

    fn head(&self) -> Option<&Accepted> {
        self.ops.iter().rev().find(|op| !op.nullified)
    }

    /// Checks one more operation against the log and accepts it, or refuses it with the reason
    /// (and leaves the log as it was).
    pub fn apply(&mut self, entry: &LogEntry<'_>) -> Result<(), String> {
        if self.ops.len() >= MAX_LOG_OPERATIONS {
            return Err(format!("the log already holds {MAX_LOG_OPERATIONS} operations"));
        }
        let op = Operation::parse(entry.operation)?;
        let cid = op.cid();
        if let Some(given) = entry.cid
            && given != cid
        {
            return Err(format!("the operation's CID is {cid}, not {given}"));
        }
        let created_us = parse_rfc3339_us(entry.created_at).ok_or("unreadable createdAt")?;
        match op.prev.clone() {
            None => self.accept_genesis(op, cid, created_us),
            Some(prev) => self.accept_child(op, prev, cid, created_us),
        }
    }

    fn accept_genesis(&mut self, op: Operation, cid: String, created_us: i64) -> Result<(), String> {
        if !self.ops.is_empty() {
            return Err("a genesis operation in the middle of the log".into());
        }
        let did = format!("did:plc:{}", &BASE32_NOPAD.encode(&Sha256::digest(&op.signed)).to_ascii_lowercase()[..24]);
        if did != self.did {
            return Err(format!("the genesis operation is that of {did}"));
        }
        let keys = op.rotation_keys.clone();
        signer_index(&keys, &op)?;
        self.ops.push(op.accepted(cid, created_us));
        Ok(())
    }

    fn accept_child(&mut self, op: Operation, prev: String, cid: String, created_us: i64) -> Result<(), String> {
        let parent = self.ops.iter().position(|p| p.cid == prev).ok_or_else(|| format!("unknown prev {prev}"))?;
        if self.ops[parent].nullified {
            return Err("its prev was nullified".into());
        }
        if self.ops[parent].state == PlcState::Tombstoned {
            return Err("its prev is a tombstone".into());
        }
        let head = self.head().expect("a log with a parent has a head");
        if created_us <= head.created_us {
            return Err("it is not later than the head of the log".into());
        }
        let allowed = &self.ops[parent].rotation_keys[..self.ops[parent].allowed];
        let signer = signer_index(allowed, &op)?;
        let children: Vec<usize> =
            (parent + 1..self.ops.len()).filter(|&i| !self.ops[i].nullified && self.ops[i].prev.is_some()).collect();
        // The non-nullified operations after the parent form its chain: a new child of the parent
        // nullifies all of them.
        if let Some(too_old) = children.iter().find(|&&i| created_us - self.ops[i].created_us > NULLIFY_WINDOW_US) {
            return Err(format!("it would nullify operation {too_old}, more than 72 hours older"));
        }
        for i in children {
            self.ops[i].nullified = true;
        }
        self.ops[parent].allowed = signer;
        self.ops.push(op.accepted(cid, created_us));
        Ok(())
    }
}

/// One accepted operation as the directory table stores it.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredOp {
    cid: String,
    prev: Option<String>,
    created_us: i64,
    rotation_keys: Vec<String>,
    allowed: usize,
    signing_key: Option<String>,
    pds: Option<String>,
    tombstoned: bool,
}

impl PlcLog {
    /// Drops what no later operation can name or nullify: nullified operations, and the chain
    /// before the newest operation created more than the nullification window before the head (a
    /// fork must come after the head, and may nullify only operations at most 72 hours older than
    /// itself, so none can reach past that operation).
    pub fn prune(&mut self) {
        self.ops.retain(|op| !op.nullified);
        let Some(head) = self.ops.last() else { return };
        let cutoff = head.created_us - NULLIFY_WINDOW_US;
        if let Some(anchor) = self.ops.iter().rposition(|op| op.created_us < cutoff) {
            self.ops.drain(..anchor);
        }
    }

    /// The log in the directory table's form (compact JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ops: Vec<StoredOp> = self.ops.iter().map(Accepted::stored).collect();
        serde_json::to_vec(&ops).expect("a log serializes")
    }

    /// A log read back from `to_bytes`.
    pub fn from_bytes(did: &str, bytes: &[u8]) -> Result<Self, String> {
        let ops: Vec<StoredOp> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let ops = ops.into_iter().map(Accepted::from_stored).collect::<Result<_, _>>()?;
        Ok(PlcLog { did: did.to_string(), ops })
    }
}

/// Applies a whole log (`/log/audit`): the state of its head, or the first operation refused.
/// Where the entries say which were nullified, that must agree.
pub fn audit(did: &str, entries: &[Value]) -> Result<(PlcLog, PlcState), PlcError> {
    if entries.len() > MAX_LOG_OPERATIONS {
        return Err(PlcError::TooLong);
    }
    let mut log = PlcLog::new(did);
    for (index, entry) in entries.iter().enumerate() {
        let invalid = |reason: String| PlcError::Invalid { index, reason };
        if entry.get("did").and_then(Value::as_str) != Some(did) {
            return Err(invalid("the entry is for another DID".into()));
        }
        let operation = entry.get("operation").ok_or_else(|| invalid("no operation".into()))?;
        let created_at =
            entry.get("createdAt").and_then(Value::as_str).ok_or_else(|| invalid("no createdAt".into()))?;
        let cid = entry.get("cid").and_then(Value::as_str);
        log.apply(&LogEntry { operation, cid, created_at }).map_err(invalid)?;
    }
    let claimed: Vec<Option<bool>> = entries.iter().map(|e| e.get("nullified").and_then(Value::as_bool)).collect();
    for (index, (claimed, actual)) in claimed.iter().zip(log.nullified()).enumerate() {
        if claimed.is_some_and(|claimed| claimed != actual) {
            return Err(PlcError::Invalid { index, reason: format!("the log says nullified = {claimed:?}") });
        }
    }
    let state = log.state().cloned().ok_or(PlcError::Empty)?;
    Ok((log, state))
}

/// An operation, parsed and encoded.
struct Operation {
    prev: Option<String>,
    rotation_keys: Vec<PublicKey>,
    state: PlcState,
    /// DAG-CBOR without `sig`, and with it.
    unsigned: Vec<u8>,
    signed: Vec<u8>,
    sig: Vec<u8>,
}

impl Operation {
    fn parse(value: &Value) -> Result<Self, String> {
        let fields = value.as_object().ok_or("the operation is not an object")?;
        let text = |name: &str| fields.get(name).and_then(Value::as_str);
        let sig_text = text("sig").ok_or("no sig")?;
        let sig =
            BASE64URL_NOPAD.decode(sig_text.as_bytes()).map_err(|e| format!("sig is not unpadded base64url: {e}"))?;
        let prev = match fields.get("prev") {
            Some(Value::Null) => None,
            Some(Value::String(prev)) => Some(prev.clone()),
            _ => return Err("prev is neither null nor a CID".into()),
        };
        let signed = to_dag_cbor(value)?;
        let mut without_sig = fields.clone();
        without_sig.remove("sig");
        let unsigned = to_dag_cbor(&Value::Object(without_sig))?;
        if signed.len() > MAX_OPERATION_BYTES {
            return Err(format!("the operation is larger than {MAX_OPERATION_BYTES} bytes"));
        }
        let (rotation_keys, state) = match text("type") {
            Some("plc_operation") => plc_operation(fields)?,
            Some("create") if prev.is_none() => legacy_create(fields)?,
            Some("plc_tombstone") if prev.is_some() => (Vec::new(), PlcState::Tombstoned),
            other => return Err(format!("unknown operation type {other:?}")),
        };
        Ok(Operation { prev, rotation_keys, state, unsigned, signed, sig })
    }

    fn cid(&self) -> String {
        let hash = Multihash::<64>::wrap(SHA2_256, &Sha256::digest(&self.signed)).expect("a 32-byte digest fits");
        Cid::new_v1(DAG_CBOR, hash).to_string()
    }

    fn accepted(self, cid: String, created_us: i64) -> Accepted {
        let allowed = self.rotation_keys.len();
        Accepted {
            cid,
            prev: self.prev,
            created_us,
            rotation_keys: self.rotation_keys,
            allowed,
            state: self.state,
            nullified: false,
        }
    }
}

/// The index of the first key of `keys` that signed `op`.
fn signer_index(keys: &[PublicKey], op: &Operation) -> Result<usize, String> {
    let digest: [u8; 32] = Sha256::digest(&op.unsigned).into();
    keys.iter()
        .position(|key| key.verify_digest(&digest, &op.sig).is_ok())
        .ok_or_else(|| "no allowed rotation key signed it".into())
}

fn plc_operation(fields: &serde_json::Map<String, Value>) -> Result<(Vec<PublicKey>, PlcState), String> {
    let keys = fields.get("rotationKeys").and_then(Value::as_array).ok_or("no rotationKeys")?;
    if keys.len() > MAX_ROTATION_KEYS {
        return Err(format!("more than {MAX_ROTATION_KEYS} rotation keys"));
    }
    let rotation_keys = keys
        .iter()
        .map(|key| {
            key.as_str()
                .ok_or("a rotation key is not a string")
                .and_then(|k| PublicKey::from_did_key(k).map_err(|_| "a rotation key is not a did:key"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let signing_key = fields
        .get("verificationMethods")
        .and_then(|methods| methods.get("atproto"))
        .and_then(Value::as_str)
        .and_then(|key| PublicKey::from_did_key(key).ok());
    let pds = fields
        .get("services")
        .and_then(|services| services.get("atproto_pds"))
        .filter(|service| service.get("type").and_then(Value::as_str) == Some("AtprotoPersonalDataServer"))
        .and_then(|service| service.get("endpoint")?.as_str())
        .map(str::to_string);
    Ok((rotation_keys, PlcState::Active { signing_key, pds }))
}

/// The legacy genesis: rotation keys `[recoveryKey, signingKey]`, the PDS `service` (with
/// `https://` added when it has no scheme, as the directory renders it).
fn legacy_create(fields: &serde_json::Map<String, Value>) -> Result<(Vec<PublicKey>, PlcState), String> {
    let key = |name: &str| {
        let text = fields.get(name).and_then(Value::as_str).ok_or(format!("no {name}"))?;
        PublicKey::from_did_key(text).map_err(|_| format!("{name} is not a did:key"))
    };
    let (signing, recovery) = (key("signingKey")?, key("recoveryKey")?);
    let pds = fields.get("service").and_then(Value::as_str).map(|service| {
        if service.starts_with("http://") || service.starts_with("https://") {
            service.to_string()
        } else {
            format!("https://{service}")
        }
    });
    Ok((vec![recovery, signing.clone()], PlcState::Active { signing_key: Some(signing), pds }))
}

/// The DAG-CBOR of a JSON operation (strings, lists, maps, null, booleans and integers only).
fn to_dag_cbor(value: &Value) -> Result<Vec<u8>, String> {
    serde_ipld_dagcbor::to_vec(&to_ipld(value, 0)?).map_err(|e| e.to_string())
}

fn to_ipld(value: &Value, depth: usize) -> Result<Ipld, String> {
    if depth > 8 {
        return Err("the operation nests too deep".into());
    }
    Ok(match value {
        Value::Null => Ipld::Null,
        Value::Bool(flag) => Ipld::Bool(*flag),
        Value::Number(number) => Ipld::Integer(number.as_i64().ok_or("a number that is not an integer")?.into()),
        Value::String(text) => Ipld::String(text.clone()),
        Value::Array(items) => Ipld::List(items.iter().map(|item| to_ipld(item, depth + 1)).collect::<Result<_, _>>()?),
        Value::Object(fields) => Ipld::Map(
            fields
                .iter()
                .map(|(key, field)| Ok((key.clone(), to_ipld(field, depth + 1)?)))
                .collect::<Result<BTreeMap<_, _>, String>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(kind: &str, name: &str) -> Vec<Value> {
        let path = format!("{}/tests/data/plc/audit_log/{kind}/{name}.json", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
    }

    fn did_of(entries: &[Value]) -> String {
        entries[0]["did"].as_str().unwrap().to_string()
    }

    fn active(state: &PlcState) -> (Option<String>, Option<String>) {
        match state {
            PlcState::Active { signing_key, pds } => (signing_key.as_ref().map(PublicKey::to_multikey), pds.clone()),
            PlcState::Tombstoned => panic!("tombstoned"),
        }
    }

    #[test]
    fn every_valid_log_is_accepted_with_its_state() {
        const BSKY_KEY: &str = "zQ3shXjHeiBuRCKmM36cuYnm7YEMzhGnCmCyW92sRJ9pribSF";
        let expected: [(&str, Option<(&str, &str)>); 10] = [
            ("log_bskyapp", Some((BSKY_KEY, "https://bsky.social"))),
            (
                "log_bnewbold_robocracy",
                Some(("zQ3shazA2airLo8gNJvxGMFZWPJDRkLGNR6mn9Txsc8YYndwy", "https://pds.robocracy.org")),
            ),
            ("log_legacy_dholms", Some((BSKY_KEY, "https://bsky.social"))),
            ("log_duplicate_rotation_keys", None),
            ("log_empty_rotation_keys", None),
            ("log_nullification", None),
            ("log_nullification_at_exactly_72h", None),
            ("log_nullification_nontrivial", None),
            ("log_nullified_tombstone", None),
            ("log_tombstone", None),
        ];
        for (name, key_and_pds) in expected {
            let entries = log("valid", name);
            let (log, state) = audit(&did_of(&entries), &entries).unwrap_or_else(|e| panic!("{name}: {e}"));
            let claimed: Vec<bool> = entries.iter().map(|e| e["nullified"].as_bool().unwrap()).collect();
            assert_eq!(log.nullified(), claimed, "{name}");
            match (name, key_and_pds) {
                ("log_tombstone", _) => assert_eq!(state, PlcState::Tombstoned),
                (_, Some((key, pds))) => assert_eq!(active(&state), (Some(key.into()), Some(pds.into())), "{name}"),
                _ => assert!(matches!(state, PlcState::Active { .. }), "{name}"),
            }
        }
    }

    /// Applies `entries` one at a time to a log pruned and stored (as the directory table keeps
    /// it) after each: the index of the first refused, or the final state.
    fn apply_pruned(did: &str, entries: &[Value]) -> Result<PlcState, usize> {
        let mut stored = PlcLog::new(did).to_bytes();
        for (index, entry) in entries.iter().enumerate() {
            let mut log = PlcLog::from_bytes(did, &stored).unwrap();
            let created_at = entry["createdAt"].as_str().unwrap();
            let entry = LogEntry { operation: &entry["operation"], cid: entry["cid"].as_str(), created_at };
            log.apply(&entry).map_err(|_| index)?;
            log.prune();
            stored = log.to_bytes();
        }
        Ok(PlcLog::from_bytes(did, &stored).unwrap().state().cloned().unwrap())
    }

    #[test]
    fn a_pruned_stored_log_decides_every_fixture_as_the_whole_log_does() {
        let fixtures = std::fs::read_dir(format!("{}/tests/data/plc/audit_log/valid", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
            .map(|entry| ("valid", entry.unwrap().path()))
            .chain(
                std::fs::read_dir(format!("{}/tests/data/plc/audit_log/invalid", env!("CARGO_MANIFEST_DIR")))
                    .unwrap()
                    .map(|entry| ("invalid", entry.unwrap().path())),
            );
        for (kind, path) in fixtures {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let entries = log(kind, &name);
            let did = did_of(&entries);
            let whole = audit(&did, &entries).map(|(_, state)| state).map_err(|e| match e {
                PlcError::Invalid { index, .. } => index,
                other => panic!("{name}: {other}"),
            });
            assert_eq!(apply_pruned(&did, &entries), whole, "{name}");
        }
    }

    #[test]
    fn pruning_keeps_the_head_and_what_a_fork_may_still_reach() {
        let entries = log("valid", "log_nullification_nontrivial");
        let (mut log, _) = audit(&did_of(&entries), &entries).unwrap();
        let before = log.ops.len();
        log.prune();
        assert!(log.ops.len() < before, "nullified operations go");
        assert!(log.ops.iter().all(|op| !op.nullified));
        let head = log.ops.last().unwrap().created_us;
        assert!(
            log.ops.iter().skip(1).all(|op| op.created_us >= head - NULLIFY_WINDOW_US),
            "one anchor at most before the window"
        );
    }

    #[test]
    fn every_invalid_log_is_refused_at_the_bad_operation() {
        for (name, bad_index) in [
            ("log_invalid_nullification_reused_key", 2),
            ("log_invalid_nullification_too_slow", 2),
            ("log_invalid_sig_b64_newline", 0),
            ("log_invalid_sig_b64_padding_bits", 0),
            ("log_invalid_sig_b64_padding_chars", 0),
            ("log_invalid_sig_der", 0),
            ("log_invalid_sig_k256_high_s", 0),
            ("log_invalid_sig_p256_high_s", 0),
            ("log_invalid_update_nullified", 4),
            ("log_invalid_update_tombstoned", 2),
        ] {
            let entries = log("invalid", name);
            match audit(&did_of(&entries), &entries) {
                Err(PlcError::Invalid { index, reason }) => assert_eq!(index, bad_index, "{name}: {reason}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_log_for_another_did_or_with_a_forged_cid_is_refused() {
        let mut entries = log("valid", "log_bskyapp");
        let error = audit("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", &entries).unwrap_err();
        assert!(matches!(error, PlcError::Invalid { index: 0, .. }), "{error}");
        let did = did_of(&entries);
        entries[1]["cid"] = Value::String("bafyreigcxay6ucqlwowfpu35alyxqtv3c4vsj7gmdtmnidsnqs6nblyarq".into());
        assert!(matches!(audit(&did, &entries), Err(PlcError::Invalid { index: 1, .. })));
        let mut entries = log("valid", "log_bskyapp");
        entries[1]["operation"]["services"]["atproto_pds"]["endpoint"] = Value::String("https://evil.example".into());
        entries[1]["cid"] = Value::Null;
        let error = audit(&did, &entries).unwrap_err().to_string();
        assert!(error.contains("no allowed rotation key signed it"), "{error}");
        assert_eq!(audit(&did, &[]).unwrap_err(), PlcError::Empty);
    }
}
