//! What a flush's promotions write: the hot links and account tallies of the targets it
//! promotes, and their tallies, made from the targets' live backlinks a part at a time.
//!
//! A promoted target may have millions of backlinks (a big account's followers, when no count
//! asked for it sooner), and its hot links and account tallies are sorted otherwise than its
//! backlinks (by account): they go through external sorts, so that a promotion holds a bounded
//! number of entries (`IndexOptions::promotion_entries`) whatever the target's size.
//!
//! Invariants:
//! - Every live backlink of a promoted target gives one hot link; a visible one also gives an
//!   account tally of one record, and the account tallies written sum those of one identity
//!   (account, target, collection, location) into one (`consolidated`).
//! - Each promoted target gets its tallies, the whole target's even when none of its live
//!   backlinks is visible.
//! - A flush's own hot writes concern targets hot before it, its promotions others: the two
//!   sorted streams a table is written from never hold one identity twice (`merge_sorted`).

use super::{IndexError, io_err};
use crate::lsm::entry::Entry;
use crate::lsm::sorter::{Sorted, Sorter};
use crate::lsm::tree::Tree;
use crate::model::ids::{AccountTally, Backlink, HotLink, RecordId, Tally, TallyGroups};
use std::collections::BTreeMap;

/// Default of `IndexOptions::promotion_entries`: 4 MiB of each kind of entry a promotion sorts.
pub const DEFAULT_PROMOTION_ENTRIES: usize = 1 << 16;

/// The hot links and unit account tallies of a flush's promotions, as they are made.
pub(super) struct Promotions {
    links: Sorter<HotLink>,
    account_tallies: Sorter<AccountTally>,
    /// The promoted targets (those with a live backlink).
    targets: Vec<RecordId>,
    clock: u64,
}

/// What a flush's promotions write.
pub(super) struct Promoted {
    pub links: Sorted<HotLink>,
    /// Unit account tallies: `consolidated` makes the written ones.
    pub account_tallies: Sorted<AccountTally>,
    pub targets: Vec<RecordId>,
}

impl Promotions {
    pub fn new(hot: &Tree<HotLink>, account_tallies: &Tree<AccountTally>, entries: usize, clock: u64) -> Self {
        Promotions {
            links: Sorter::beside(hot, "promotion", entries),
            account_tallies: Sorter::beside(account_tallies, "promotion", entries),
            targets: Vec::new(),
            clock,
        }
    }

    /// Adds one live backlink of a promoted target; `visible` when its account is not hidden.
    pub fn add(&mut self, link: Backlink, visible: bool) -> Result<(), IndexError> {
        self.links.push(HotLink::of(link)).map_err(io_err(self.links.spill_path()))?;
        if visible {
            let group = (link.source.collection, link.location);
            let tally = AccountTally::of(link.source.did, link.target, group, self.clock, 1);
            self.account_tallies.push(tally).map_err(io_err(self.account_tallies.spill_path()))?;
        }
        Ok(())
    }

    /// `target`'s live backlinks were all added: it is promoted.
    pub fn promoted(&mut self, target: RecordId) {
        self.targets.push(target);
    }

    /// Sorts what was added; with the promoted targets' tallies, sorted.
    pub fn finish(self) -> Result<(Promoted, Vec<Tally>), IndexError> {
        let links = finish(self.links)?;
        let account_tallies = finish(self.account_tallies)?;
        let mut groups: BTreeMap<RecordId, TallyGroups> =
            self.targets.iter().map(|target| (*target, TallyGroups::default())).collect();
        for tally in consolidated(account_tallies.merged()) {
            groups.get_mut(&tally.target()).expect("an account tally of a promoted target").add(&tally);
        }
        check(&account_tallies)?;
        let mut tallies: Vec<Tally> =
            groups.into_iter().flat_map(|(target, groups)| groups.tallies(target, self.clock)).collect();
        tallies.sort_unstable();
        Ok((Promoted { links, account_tallies, targets: self.targets }, tallies))
    }
}

impl Promoted {
    /// Reports a read error of the sorts' spills met while their tables were written.
    pub fn check(&self) -> Result<(), IndexError> {
        check(&self.links)?;
        check(&self.account_tallies)
    }
}

/// Sorts what `sorter` was given.
pub(super) fn finish<E: Entry>(sorter: Sorter<E>) -> Result<Sorted<E>, IndexError> {
    let path = sorter.spill_path().to_path_buf();
    sorter.finish().map_err(io_err(&path))
}

/// Reports a read error of `sorted`'s spill met while a table was written from it.
pub(super) fn check<E: Entry>(sorted: &Sorted<E>) -> Result<(), IndexError> {
    sorted.check().map_err(io_err(sorted.spill_path()))
}

/// Account tallies in order, those of one identity summed into one.
pub(super) fn consolidated(tallies: impl Iterator<Item = AccountTally>) -> impl Iterator<Item = AccountTally> {
    let mut tallies = tallies.peekable();
    std::iter::from_fn(move || {
        let mut sum = tallies.next()?;
        while let Some(more) = tallies.next_if(|next| next.same_identity(&sum)) {
            sum.records += more.records;
        }
        Some(sum)
    })
}

/// Two sorted streams merged into one, in order.
pub(super) fn merge_sorted<E: Ord>(a: impl Iterator<Item = E>, b: impl Iterator<Item = E>) -> impl Iterator<Item = E> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sorted_keeps_order_and_every_item() {
        let merged: Vec<u32> = merge_sorted([1, 4, 4, 9].into_iter(), [0, 4, 5, 10, 11].into_iter()).collect();
        assert_eq!(merged, [0, 1, 4, 4, 4, 5, 9, 10, 11]);
        assert_eq!(merge_sorted(std::iter::empty(), [2, 3].into_iter()).collect::<Vec<u32>>(), [2, 3]);
    }

    #[test]
    fn consolidated_sums_the_records_of_one_identity() {
        let target = RecordId { rkey: 5, collection: 1, did: 2 };
        let unit = |account, location| AccountTally::of(account, target, (3, location), 7, 1);
        let tallies = [unit(1, 1), unit(1, 1), unit(1, 2), unit(2, 1), unit(2, 1), unit(2, 1)];
        let summed: Vec<(u64, u64, u64)> =
            consolidated(tallies.into_iter()).map(|t| (t.account, t.location, t.records)).collect();
        assert_eq!(summed, [(1, 1, 2), (1, 2, 1), (2, 1, 3)]);
    }
}
