//! The reference model the engine tests compare with: a plain map of live records (by indexes
//! into each test's universe of DIDs, collections and rkeys) and their (target, location) links,
//! plus the accounts that are hidden.

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// (did, collection, rkey) indexes of a record in a test's universe.
pub type RecordKey = (usize, usize, usize);

#[derive(Default)]
pub struct Model {
    pub records: BTreeMap<RecordKey, BTreeSet<(String, String)>>,
    pub hidden: HashSet<usize>,
}

impl Model {
    /// Sorted live (source URI, location) pairs linking to `target`; `uri` names a record.
    pub fn backlinks(&self, target: &str, uri: impl Fn(&RecordKey) -> String) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, links) in self.records.iter().filter(|(key, _)| !self.hidden.contains(&key.0)) {
            let source = uri(key);
            out.extend(
                links.iter().filter(|(t, _)| t == target).map(|(_, location)| (source.clone(), location.clone())),
            );
        }
        out.sort();
        out
    }

    /// An account deletion: every record of the account goes, and it is no longer hidden.
    pub fn delete_account(&mut self, did: usize) {
        self.records.retain(|(owner, _, _), _| *owner != did);
        self.hidden.remove(&did);
    }
}
