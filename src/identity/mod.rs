//! Identities: whose repository is whose, signed by which key, served by which PDS.
//!
//! - `keys`: secp256k1 and P-256 public keys (Multikey, did:key, the legacy document forms) and
//!   the signatures they check;
//! - `document`: DID documents (the `#atproto` key and the `#atproto_pds` endpoint);
//! - `plc`: did:plc operation logs, checked by the method's rules;
//! - `directory`: a local copy of the PLC directory, kept from its bulk export by those rules;
//! - `resolve`: DIDs to identities, checked, through a bounded cache with expiry.
//!
//! Nothing here trusts a host: a document counts only for the DID it names, a PLC log only as far
//! as its signatures and rules hold.

pub mod directory;
pub mod document;
pub mod keys;
pub mod plc;
pub mod resolve;
