//! Test identities: did:plc DIDs made the way the directory makes them (a signed genesis
//! operation whose hash is the DID), moved to a PDS by a signed update, and served as the audit
//! log the resolver checks. Signing is the test's (k256 with a fixed key); checking is the
//! server's own code, which shares nothing with this.
#![allow(dead_code)]

use super::car_writer::{cid_of, signing_key};
use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use ipld_core::ipld::Ipld;
use k256::ecdsa::SigningKey;
use k256::ecdsa::signature::hazmat::PrehashSigner;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A did:plc identity with its keys and its signed genesis operation.
pub struct TestIdentity {
    pub did: String,
    /// The repository's signing key (`verificationMethods.atproto`).
    pub key: SigningKey,
    rotation: SigningKey,
    genesis: Value,
}

impl TestIdentity {
    /// The identity of `seed` (its signing key is `signing_key(seed)`), created pointing at a PDS
    /// that does not exist.
    pub fn new(seed: u8) -> Self {
        let key = signing_key(seed);
        let rotation = signing_key(seed.wrapping_add(128));
        let genesis = sign(operation(&rotation, &key, "https://nowhere.invalid", None), &rotation);
        let digest = Sha256::digest(serde_ipld_dagcbor::to_vec(&to_ipld(&genesis)).unwrap());
        let did = format!("did:plc:{}", &BASE32_NOPAD.encode(&digest).to_ascii_lowercase()[..24]);
        TestIdentity { did, key, rotation, genesis }
    }

    /// The audit log (`/<did>/log/audit`) of the identity moved to `pds`, signed by its rotation
    /// key, or by `signer` in place of it (a forged move).
    pub fn audit_log(&self, pds: &str) -> Value {
        self.audit_log_signed_by(pds, &self.rotation)
    }

    pub fn audit_log_signed_by(&self, pds: &str, signer: &SigningKey) -> Value {
        let update = sign(operation(&self.rotation, &self.key, pds, Some(cid(&self.genesis))), signer);
        json!([self.entry(&self.genesis, "2024-01-01T00:00:00.000Z"), self.entry(&update, "2024-01-02T00:00:00.000Z"),])
    }

    fn entry(&self, operation: &Value, created_at: &str) -> Value {
        json!({ "did": self.did, "operation": operation, "cid": cid(operation), "nullified": false, "createdAt": created_at })
    }
}

fn did_key(key: &SigningKey) -> String {
    format!("did:key:{}", super::car_writer::multikey(key))
}

fn operation(rotation: &SigningKey, key: &SigningKey, pds: &str, prev: Option<String>) -> Value {
    json!({
        "type": "plc_operation",
        "rotationKeys": [did_key(rotation)],
        "verificationMethods": { "atproto": did_key(key) },
        "alsoKnownAs": [],
        "services": { "atproto_pds": { "type": "AtprotoPersonalDataServer", "endpoint": pds } },
        "prev": prev,
    })
}

/// The operation with its `sig`: ECDSA over the SHA-256 of its DAG-CBOR.
fn sign(mut operation: Value, key: &SigningKey) -> Value {
    let digest = Sha256::digest(serde_ipld_dagcbor::to_vec(&to_ipld(&operation)).unwrap());
    let signature: k256::ecdsa::Signature = key.sign_prehash(&digest).unwrap();
    operation["sig"] = Value::String(BASE64URL_NOPAD.encode(&signature.to_bytes()));
    operation
}

fn cid(operation: &Value) -> String {
    cid_of(&to_ipld(operation)).to_string()
}

/// JSON as DAG-CBOR data (operations hold only strings, lists, maps and null).
fn to_ipld(value: &Value) -> Ipld {
    match value {
        Value::Null => Ipld::Null,
        Value::String(s) => Ipld::String(s.clone()),
        Value::Array(items) => Ipld::List(items.iter().map(to_ipld).collect()),
        Value::Object(fields) => Ipld::Map(fields.iter().map(|(k, v)| (k.clone(), to_ipld(v))).collect()),
        other => panic!("not in a PLC operation: {other}"),
    }
}
