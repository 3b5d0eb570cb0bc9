//! Real signed data against the verifier: the repository CARs that come with their DID documents,
//! and the relay's signed firehose frames with their accounts' keys (`tests/data/car/indigo`,
//! `tests/data/firehose`; SOURCE.md in each says where they come from).
//!
//! Of the four CARs with a document, one passes every check and three cannot, each for a reason
//! the checks are right about; each verdict is asserted, with what shows the reason.

#[path = "support/car_writer.rs"]
mod car_writer;

use backlinks::identity::document::parse_document;
use backlinks::identity::keys::PublicKey;
use backlinks::ingest::repo::{CarError, CarLimits, Expect, read_commit, read_repo_bytes};
use data_encoding::BASE64_NOPAD;
use ipld_core::ipld::Ipld;
use serde_json::Value;

const INDIGO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car/indigo");
const FIREHOSE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/firehose");
/// Every fixture is older than this (2026-12-01).
const NOW_US: i64 = 1_796_083_200_000_000;

/// The CAR and the signing key of the document beside it (the document's own DID).
fn car_and_key(name: &str, car: &str) -> (Vec<u8>, String, PublicKey) {
    let car = std::fs::read(format!("{INDIGO}/{car}")).unwrap();
    let document = std::fs::read(format!("{INDIGO}/{name}.didDoc.json")).unwrap();
    let did = serde_json::from_slice::<Value>(&document).unwrap()["id"].as_str().unwrap().to_string();
    let identity = parse_document(&did, &document, &|_, _| false).unwrap();
    (car, did, identity.signing_key.expect("a usable key"))
}

fn expect<'a>(did: &'a str, key: &'a PublicKey) -> Expect<'a> {
    Expect { did: Some(did), key: Some(key), now_us: NOW_US, deadline: None }
}

/// The commit block's unsigned DAG-CBOR and its signature.
fn commit_parts(car: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let any = Expect { did: None, key: None, now_us: NOW_US, deadline: None };
    let repo = read_repo_bytes(car, &CarLimits::default(), &any).unwrap();
    let blocks = car_writer::raw_blocks(car);
    let commit = blocks.iter().find(|(_, bytes)| {
        let value: Ipld = serde_ipld_dagcbor::from_slice(bytes).unwrap_or(Ipld::Null);
        matches!(&value, Ipld::Map(fields) if fields.get("did") == Some(&Ipld::String(repo.commit.did.clone())) && fields.contains_key("sig"))
    });
    let Ipld::Map(mut fields) = serde_ipld_dagcbor::from_slice(commit.unwrap().1).unwrap() else { unreachable!() };
    let Some(Ipld::Bytes(sig)) = fields.remove("sig") else { panic!("no sig") };
    (serde_ipld_dagcbor::to_vec(&Ipld::Map(fields)).unwrap(), sig)
}

#[test]
fn paul_staging_passes_every_check_with_its_document() {
    let (car, did, key) = car_and_key("paul_staging", "paul_staging.repo.car");
    let repo = read_repo_bytes(&car, &CarLimits::default(), &expect(&did, &key)).unwrap();
    assert!(repo.signed, "signature verified");
    assert_eq!(repo.commit.did, did);
    assert_eq!(repo.records.len(), 185);
}

#[test]
fn fakermaker_is_refused_for_a_high_s_signature_that_is_otherwise_valid() {
    let (car, did, key) = car_and_key("fakermaker", "fakermaker.repo.car");
    let error = read_repo_bytes(&car, &CarLimits::default(), &expect(&did, &key)).unwrap_err();
    assert!(matches!(&error, CarError::BadSignature(reason) if reason.contains("low-S")), "{error}");
    // The same signature with s normalized verifies: the key is right, the encoding is not
    // (atproto requires low-S on both curves).
    let (unsigned, sig) = commit_parts(&car);
    let normalized = p256::ecdsa::Signature::from_slice(&sig).unwrap().normalize_s();
    key.verify(&unsigned, &normalized.to_bytes()).unwrap();
}

#[test]
fn greenground_is_signed_by_its_documents_key_but_the_document_is_another_dids() {
    let (car, document_did, key) = car_and_key("greenground", "greenground.repo.car");
    let error = read_repo_bytes(&car, &CarLimits::default(), &expect(&document_did, &key)).unwrap_err();
    assert!(matches!(error, CarError::WrongDid { .. }), "{error}");
    // The key was bsky.social's shared signing key in 2023: it does sign the commit of the CAR's
    // own DID, which a document of that DID would have named.
    let commit_did = "did:plc:kzcqyc3unb33eh5sxzsfs25z";
    let repo = read_repo_bytes(&car, &CarLimits::default(), &expect(commit_did, &key)).unwrap();
    assert!(repo.signed);
}

#[test]
fn the_localhost_fixture_does_not_verify_with_the_key_beside_it() {
    let (car, did, key) = car_and_key(
        "did_plc_z5vnbioquyhivxirw3bbljmu",
        "bafyreieovfuizojpw3zresz7sx3nk4trm2by23pt5rxbey3jme4uo5ogiu.car",
    );
    let error = read_repo_bytes(&car, &CarLimits::default(), &expect(&did, &key)).unwrap_err();
    assert!(matches!(error, CarError::BadSignature(_)), "{error}");
}

/// `{"$bytes": base64}` as the firehose fixtures write blocks.
fn bytes_field(value: &Value) -> Vec<u8> {
    let text = value["$bytes"].as_str().unwrap().trim_end_matches('=');
    BASE64_NOPAD.decode(text.as_bytes()).unwrap()
}

#[test]
fn every_signed_relay_frame_verifies_with_its_accounts_key() {
    let mut verified = 0;
    for entry in std::fs::read_dir(FIREHOSE).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let fixture: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let keys: Vec<(String, PublicKey)> = fixture["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|account| {
                let identity = &account["identity"];
                let multikey = identity["keys"]["atproto"]["publicKeyMultibase"].as_str().unwrap();
                (identity["did"].as_str().unwrap().to_string(), PublicKey::from_multikey(multikey).unwrap())
            })
            .collect();
        for message in fixture["messages"].as_array().unwrap() {
            let (header, body) = (&message["frame"]["header"], &message["frame"]["body"]);
            let did = match header["t"].as_str() {
                Some("#commit") => body["repo"].as_str().unwrap(),
                Some("#sync") => body["did"].as_str().unwrap(),
                _ => continue,
            };
            let key = &keys.iter().find(|(account, _)| account == did).unwrap().1;
            let blocks = bytes_field(&body["blocks"]);
            let (commit, signed) = read_commit(&blocks, &CarLimits::default(), &expect(did, key))
                .unwrap_or_else(|e| panic!("{}: seq {}: {e}", path.display(), body["seq"]));
            assert!(signed);
            // Two frames of rev_ordering carry a body rev that is not their commit's: the relay
            // drops them, and so would a consumer that compares.
            let body_rev = body["rev"].as_str().unwrap();
            assert!(commit.rev == body_rev || message["drop"] == true, "{}: seq {}", path.display(), body["seq"]);
            verified += 1;
        }
    }
    assert_eq!(verified, 26, "25 #commit and 1 #sync frames");
}

#[test]
fn a_frame_with_one_changed_byte_fails() {
    let fixture: Value =
        serde_json::from_slice(&std::fs::read(format!("{FIREHOSE}/post_lifecycle.json")).unwrap()).unwrap();
    let account = &fixture["accounts"][0]["identity"];
    let key = PublicKey::from_multikey(account["keys"]["atproto"]["publicKeyMultibase"].as_str().unwrap()).unwrap();
    let did = account["did"].as_str().unwrap();
    let mut blocks = bytes_field(&fixture["messages"][0]["frame"]["body"]["blocks"]);
    let last = blocks.len() - 1;
    blocks[last] ^= 1;
    let error = read_commit(&blocks, &CarLimits::default(), &expect(did, &key)).unwrap_err();
    assert!(matches!(error, CarError::BadHash { .. }), "{error}");
    let other = PublicKey::from_multikey("zQ3shdADPnggw3JH3JFg2parVSUsf2T9CLKKNBxViuc94PNsm").unwrap();
    let blocks = bytes_field(&fixture["messages"][0]["frame"]["body"]["blocks"]);
    let error = read_commit(&blocks, &CarLimits::default(), &expect(did, &other)).unwrap_err();
    assert!(matches!(error, CarError::BadSignature(_)), "another account's key: {error}");
}
