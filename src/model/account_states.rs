//! The accounts that are not active, by did, held compactly: what queries ask of every source
//! they return (is its account hidden?) and what a flush asks of every account it tallies.
//!
//! Invariants:
//! - `dids` is strictly increasing and `states` runs beside it; neither holds `Active` (an
//!   active account is simply absent).
//! - `recent` holds the changes since the sorted part was last rebuilt, `Active` among them to
//!   mask an account the sorted part still lists; a lookup asks it first.
//! - `recent` is folded into the sorted part once it reaches an eighth of it (or
//!   `MIN_RECENT`), so a change costs an amortized constant and the map about 9 bytes an
//!   account plus at most an eighth more in `recent`, against 18-37 bytes for a hash map of the
//!   same pairs (its buckets of 16 bytes at a load between 7/16 and 7/8).

use super::account::AccountState;
use std::collections::HashMap;

/// `recent` is folded in no sooner than this many changes (a small map never rebuilds often).
const MIN_RECENT: usize = 4096;
/// Bytes a `recent` entry takes in its hash map, slack included (for `memory_bytes`).
const RECENT_ENTRY_BYTES: usize = 24;

#[derive(Debug, Default)]
pub struct AccountStates {
    dids: Vec<u64>,
    states: Vec<AccountState>,
    recent: HashMap<u64, AccountState>,
}

impl AccountStates {
    /// The state of `did` (`Active` when it has none).
    pub fn get(&self, did: u64) -> AccountState {
        if let Some(state) = self.recent.get(&did) {
            return *state;
        }
        match self.dids.binary_search(&did) {
            Ok(at) => self.states[at],
            Err(_) => AccountState::Active,
        }
    }

    /// Whether `did`'s account is hidden (deactivated, suspended or taken down).
    pub fn is_hidden(&self, did: u64) -> bool {
        self.get(did).is_hidden()
    }

    /// Records `did`'s state (`Active` forgets it).
    pub fn set(&mut self, did: u64, state: AccountState) {
        self.recent.insert(did, state);
        if self.recent.len() >= MIN_RECENT.max(self.dids.len() / 8) {
            self.fold_recent();
        }
    }

    /// Adds a not-active account after every one held, as a catalog hands them over in did order
    /// (a map built this way never rebuilds).
    pub fn push_sorted(&mut self, did: u64, state: AccountState) {
        assert!(self.recent.is_empty(), "accounts are pushed before any is set");
        assert!(self.dids.last().is_none_or(|last| *last < did), "accounts are pushed in did order");
        if state != AccountState::Active {
            self.dids.push(did);
            self.states.push(state);
        }
    }

    /// Whether no account is held (active or not: a masked one counts until it is folded).
    pub fn is_empty(&self) -> bool {
        self.dids.is_empty() && self.recent.is_empty()
    }

    /// Bytes held (the vectors' capacity and `recent`'s entries), for `memory_use`.
    pub fn memory_bytes(&self) -> usize {
        self.dids.capacity() * size_of::<u64>()
            + self.states.capacity() * size_of::<AccountState>()
            + self.recent.capacity() * RECENT_ENTRY_BYTES
    }

    /// Merges `recent` into the sorted part in one pass (a change replaces the state it meets).
    fn fold_recent(&mut self) {
        let mut changes: Vec<(u64, AccountState)> = self.recent.drain().collect();
        changes.sort_unstable_by_key(|(did, _)| *did);
        let capacity = self.dids.len() + changes.len();
        let (mut dids, mut states) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
        let mut held = self.dids.iter().copied().zip(self.states.iter().copied()).peekable();
        let mut changes = changes.into_iter().peekable();
        loop {
            let next = match (held.peek(), changes.peek()) {
                (None, None) => break,
                (Some(_), None) => held.next(),
                (None, Some(_)) => changes.next(),
                (Some((held_did, _)), Some((changed_did, _))) => match held_did.cmp(changed_did) {
                    std::cmp::Ordering::Less => held.next(),
                    std::cmp::Ordering::Greater => changes.next(),
                    std::cmp::Ordering::Equal => {
                        held.next();
                        changes.next()
                    }
                },
            };
            let (did, state) = next.expect("a peeked side has a next");
            if state != AccountState::Active {
                dids.push(did);
                states.push(state);
            }
        }
        dids.shrink_to_fit();
        states.shrink_to_fit();
        self.recent.shrink_to(MIN_RECENT);
        (self.dids, self.states) = (dids, states);
        debug_assert!(self.dids.windows(2).all(|pair| pair[0] < pair[1]), "sorted, no did twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::rng::splitmix64;

    /// Random changes over a few thousand dids (u64's edges among them), checked against a hash
    /// map after every one: enough to fold `recent` many times.
    #[test]
    fn equals_a_hash_map_through_many_folds() {
        let mut seed = 7u64;
        let mut next = move || splitmix64(&mut seed);
        let mut states = AccountStates::default();
        let mut model: HashMap<u64, AccountState> = HashMap::new();
        let edges = [0, 1, 1 << 63, u64::MAX - 1, u64::MAX];
        for (i, did) in edges.into_iter().enumerate() {
            states.push_sorted(did, AccountState::ALL[1 + i % 5]);
            model.insert(did, AccountState::ALL[1 + i % 5]);
        }
        for step in 0..60_000u64 {
            let did = if step % 97 == 0 { edges[(step / 97) as usize % edges.len()] } else { next() % 9_000 };
            let state = AccountState::ALL[(next() % 6) as usize];
            states.set(did, state);
            model.insert(did, state);
            let probe = next() % 9_100;
            for did in [did, probe, edges[(step % 5) as usize]] {
                assert_eq!(states.get(did), model.get(&did).copied().unwrap_or(AccountState::Active), "did {did}");
            }
        }
        let held: Vec<(u64, AccountState)> = states.dids.iter().copied().zip(states.states.iter().copied()).collect();
        assert!(held.iter().all(|(_, state)| *state != AccountState::Active), "active accounts are dropped");
        assert!(states.recent.len() < MIN_RECENT, "recent was folded");
    }

    /// Folding keeps 9 bytes an account: a million hidden accounts in under 11 MiB.
    #[test]
    fn a_million_accounts_take_nine_bytes_each() {
        let mut states = AccountStates::default();
        (0..1_000_000u64).for_each(|did| states.set(did * 3, AccountState::Deactivated));
        assert!(states.memory_bytes() < 11 << 20, "{} bytes", states.memory_bytes());
        assert!(states.is_hidden(3 * 999_999) && !states.is_hidden(1));
    }
}
