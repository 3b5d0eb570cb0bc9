//! The bounded two-way cache of one outline kind (id <-> string), compact enough to hold the
//! network's accounts: about `52 + len` bytes per pair (a 16-byte slot, its 4 bytes in the clock
//! and two index buckets at half load) instead of ~145 with an `Arc<str>` per string and two
//! `HashMap`s, where a `did:plc` DID's `len` is 15, not 32 (`plc`: the arena keeps it packed).
//!
//! The cache also holds the kind's new strings until they are persisted ("pinned": never evicted),
//! so a new string is stored in memory once, not in a pending map and again in the cache.
//!
//! Invariants:
//! - At most `capacity` pairs, except while more than that are pinned: pinned pairs are added
//!   even to a full cache (evicting unpinned ones while there are any), and `shrink_to_capacity`
//!   evicts back down to `max(capacity, pinned)`.
//!   Every pair has one slot, one bucket in `by_value` and one in `by_id`; every occupied bucket
//!   names a live slot whose value (or id) hashes to it. `clock` lists every unpinned slot once
//!   and no pinned one, so the pinned slots are the others.
//! - Values live back to back in `arena`, each as `Kept`: a `did:plc` DID packed, any other
//!   value as written; a slot says which, so a value that happens to be 15 bytes long is never
//!   taken for a packed one. Lookups pack the string they look for and compare kept bytes; the
//!   value index hashes kept bytes. An evicted value stays there as garbage until the arena
//!   is rewritten, which happens as soon as garbage passes half the live bytes, so the arena holds
//!   at most 1.5 times the live bytes (plus one value).
//! - Both indexes are `base::positions` tables of slot numbers (linear probing, at most 3/4 full,
//!   backward-shift deletion, a hash tag beside each slot).
//! - Eviction is clock (second chance) over `clock`, the unpinned slots alone: a hit sets the
//!   slot's bit under the read lock; an insert into a full cache sweeps the hand forward over
//!   `clock`, clearing set bits, to the first clear one. It only sweeps when `clock` is not
//!   empty, and each step clears a bit, so it ends within two turns of `clock` whatever the
//!   number of pinned slots. (With more new strings than the capacity nearly every slot is
//!   pinned: a sweep over all slots would pass each of them on every insert.)

use super::plc;
use crate::base::positions::PositionIndex;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_64;

/// Slots are numbered in 32 bits (the bucket's low half, minus the empty marker).
const MAX_CAPACITY: usize = u32::MAX as usize - 1;

/// One pair in 16 bytes (the cache holds millions): its id, and one word that packs where its
/// value lies in the arena with the pair's flags.
#[derive(Debug)]
struct Slot {
    id: u64,
    /// `start << START_SHIFT | len << LEN_SHIFT | flags`. Atomic for the referenced bit alone,
    /// which hits set under the read lock; every other change holds the write lock.
    word: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16, "a slot is an id and one word");

/// The clock's bit: used since the hand last passed.
const REFERENCED: u64 = 1;
/// Not yet persisted: never evicted.
const PINNED: u64 = 1 << 1;
/// The arena holds the value as a packed `did:plc` DID.
const PACKED: u64 = 1 << 2;
const LEN_SHIFT: u32 = 3;
/// No kind allows a string over 2 KiB (`OutlineKind::max_len`), so 16 bits hold any length.
const LEN_BITS: u32 = 16;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;
/// Arena offsets get the word's top 45 bits.
const START_SHIFT: u32 = LEN_SHIFT + LEN_BITS;

/// The word's bits for an arena offset.
fn start_bits(start: usize) -> u64 {
    assert!((start as u64) < 1 << (64 - START_SHIFT), "an arena offset of {start}");
    (start as u64) << START_SHIFT
}

fn len_of(word: u64) -> usize {
    ((word >> LEN_SHIFT) & LEN_MASK) as usize
}

impl Slot {
    fn new(id: u64, start: usize, len: usize, pinned: bool, packed: bool) -> Self {
        assert!(len as u64 <= LEN_MASK, "a cached value of {len} bytes");
        let flags = if pinned { PINNED } else { 0 } | if packed { PACKED } else { 0 };
        let word = start_bits(start) | (len as u64) << LEN_SHIFT | flags;
        Self { id, word: AtomicU64::new(word) }
    }

    fn word(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    fn len(&self) -> usize {
        len_of(self.word())
    }

    /// Where the value lies in the arena (one load: a hit may set the referenced bit meanwhile).
    fn range(&self) -> std::ops::Range<usize> {
        let word = self.word();
        let start = (word >> START_SHIFT) as usize;
        start..start + len_of(word)
    }

    fn pinned(&self) -> bool {
        self.word() & PINNED != 0
    }

    fn packed(&self) -> bool {
        self.word() & PACKED != 0
    }

    fn unpin(&mut self) {
        *self.word.get_mut() &= !PINNED;
    }

    /// Points the slot at `start` (the arena was rewritten), keeping its length and flags.
    fn move_to(&mut self, start: usize) {
        let word = self.word.get_mut();
        *word = start_bits(start) | (*word & ((1 << START_SHIFT) - 1));
    }

    /// Tells the clock the slot was used. Only the first use writes: readers on other cores
    /// keep their copy of the slot's cache line instead of taking it from each other on every
    /// lookup.
    fn mark_referenced(&self) {
        if self.word() & REFERENCED == 0 {
            self.word.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }

    /// Clears the referenced bit and tells whether it was set (the clock's second chance).
    fn take_referenced(&mut self) -> bool {
        let word = self.word.get_mut();
        let was = *word & REFERENCED != 0;
        *word &= !REFERENCED;
        was
    }
}

/// A value as the arena keeps it.
#[derive(Clone, Copy)]
enum Kept<'a> {
    Packed(plc::Packed),
    Text(&'a [u8]),
}

/// Bytes the arena takes for `value`.
pub(super) fn kept_len(value: &str) -> usize {
    Kept::of(value).bytes().len()
}

impl<'a> Kept<'a> {
    fn of(value: &'a str) -> Self {
        plc::pack(value).map_or(Kept::Text(value.as_bytes()), Kept::Packed)
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Kept::Packed(packed) => packed,
            Kept::Text(text) => text,
        }
    }

    fn is_packed(&self) -> bool {
        matches!(self, Kept::Packed(_))
    }
}

/// A cached string: borrowed from the arena, or a packed DID written out.
pub(super) enum CachedStr<'a> {
    Borrowed(&'a str),
    Unpacked(plc::Text),
}

impl Deref for CachedStr<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            CachedStr::Borrowed(value) => value,
            CachedStr::Unpacked(text) => text.as_str(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Cache {
    capacity: usize,
    slots: Vec<Slot>,
    arena: Vec<u8>,
    /// Bytes of `arena` no slot points at.
    garbage: usize,
    by_value: PositionIndex,
    by_id: PositionIndex,
    /// The unpinned slots, in the clock's order.
    clock: Vec<u32>,
    /// The clock's next candidate: an index into `clock`.
    hand: usize,
    /// Holds every string of its kind that outlines.db stores (see the outline invariants).
    pub complete: bool,
}

impl Cache {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity <= MAX_CAPACITY, "outline cache capacity {capacity} over the slot numbering");
        Self {
            capacity,
            slots: Vec::new(),
            arena: Vec::new(),
            garbage: 0,
            by_value: PositionIndex::new(),
            by_id: PositionIndex::new(),
            clock: Vec::new(),
            hand: 0,
            complete: false,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The memory it takes: slots, arena (garbage included), both indexes and the clock.
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot>()
            + self.arena.capacity()
            + self.by_value.memory_bytes()
            + self.by_id.memory_bytes()
            + self.clock.capacity() * size_of::<u32>()
    }

    pub fn id_of(&self, value: &str) -> Option<u64> {
        let wanted = Kept::of(value);
        let holds_wanted = |slot: usize| {
            let slot = &self.slots[slot];
            slot.packed() == wanted.is_packed() && self.bytes(slot) == wanted.bytes()
        };
        let slot = &self.slots[self.by_value.find(xxh3_64(wanted.bytes()), holds_wanted)?];
        slot.mark_referenced();
        Some(slot.id)
    }

    /// Reads what lookups of `values` will read, for all of them at once and one kind of line
    /// after another: their home buckets, then the slots those name, then the first byte of each
    /// slot's value. In a cache larger than the CPU's, a lookup is three misses of memory one
    /// after another (the bucket names the slot, the slot the value); here each loop's loads do
    /// not depend on each other, so the CPU has many in flight. Changes nothing; `hashes` is
    /// scratch space.
    pub fn warm<'v>(&self, values: impl Iterator<Item = &'v str>, hashes: &mut Vec<u64>) {
        const NONE: u64 = u64::MAX;
        hashes.clear();
        hashes.extend(values.map(|value| xxh3_64(Kept::of(value).bytes())));
        for hash in hashes.iter_mut() {
            *hash = self.by_value.home_candidate(*hash).map_or(NONE, |slot| slot as u64);
        }
        for slot in hashes.iter_mut().filter(|slot| **slot != NONE) {
            *slot = self.slots[*slot as usize].range().start as u64;
        }
        let touched =
            hashes.iter().filter(|start| **start != NONE).fold(0u8, |sum, &start| sum ^ self.arena[start as usize]);
        std::hint::black_box(touched);
    }

    pub fn value_of(&self, id: u64) -> Option<Arc<str>> {
        self.get(id).map(|value| Arc::from(&*value))
    }

    /// The cached string of `id` (borrowed unless it is kept packed).
    pub fn get(&self, id: u64) -> Option<CachedStr<'_>> {
        let slot = &self.slots[self.slot_of_id(id)?];
        slot.mark_referenced();
        Some(self.value_of_slot(slot))
    }

    /// Adds the pair unless its id is cached already (ids and strings are one-to-one, so a cached
    /// id always comes with the same string), evicting the clock's victim when full.
    pub fn insert(&mut self, id: u64, value: &str) {
        if self.capacity > 0 && self.slot_of_id(id).is_none() {
            self.add(id, Kept::of(value), false);
        }
    }

    /// Adds a new, not yet persisted pair that stays until `unpin`, whatever the capacity.
    pub fn insert_pinned(&mut self, id: u64, value: &str) {
        assert!(self.slot_of_id(id).is_none(), "a new id is not cached yet");
        self.add_pinned(id, Kept::of(value));
    }

    /// The value of a pinned pair (`persist` writes it).
    pub fn pinned_value(&self, id: u64) -> Option<CachedStr<'_>> {
        self.slot_of_id(id).filter(|&slot| self.slots[slot].pinned()).map(|slot| self.value(slot))
    }

    /// Makes a pinned pair an ordinary cached one (it is persisted now).
    pub fn unpin(&mut self, id: u64) {
        let slot = self.slot_of_id(id).expect("a pinned id is cached");
        assert!(self.slots[slot].pinned(), "unpin of a pair that is not pinned");
        self.slots[slot].unpin();
        self.clock.push(slot as u32);
    }

    /// Evicts down to `capacity` pairs, or to the pinned ones if more than that are pinned (after
    /// more were pinned at once than the cache holds): keeps every pinned pair and the last
    /// unpinned slots, rebuilding the arena and both indexes. Cheap when nothing is over.
    pub fn shrink_to_capacity(&mut self) {
        if self.slots.len() <= self.capacity.max(self.pinned()) {
            return;
        }
        let mut shrunk = Cache::new(self.capacity);
        for slot in (0..self.slots.len()).filter(|&slot| self.slots[slot].pinned()) {
            shrunk.add_pinned(self.slots[slot].id, self.kept(slot));
        }
        let room = self.capacity.saturating_sub(self.pinned());
        for slot in (0..self.slots.len()).rev().filter(|&slot| !self.slots[slot].pinned()).take(room) {
            shrunk.add(self.slots[slot].id, self.kept(slot), false);
        }
        *self = shrunk;
    }

    fn slot_of_id(&self, id: u64) -> Option<usize> {
        self.by_id.find(hash_id(id), |slot| self.slots[slot].id == id)
    }

    fn pinned(&self) -> usize {
        self.slots.len() - self.clock.len()
    }

    fn add_pinned(&mut self, id: u64, value: Kept<'_>) {
        self.add(id, value, true);
    }

    fn add(&mut self, id: u64, value: Kept<'_>, pinned: bool) {
        let full = self.slots.len() >= self.capacity && !self.clock.is_empty();
        let slot = if full { self.reuse_slot(id, value, pinned) } else { self.push_slot(id, value, pinned) };
        self.index_slot(slot);
        debug_assert_eq!(self.by_value.len(), self.slots.len());
        debug_assert_eq!(self.by_id.len(), self.slots.len());
    }

    fn push_slot(&mut self, id: u64, value: Kept<'_>, pinned: bool) -> usize {
        let start = self.append(value.bytes());
        self.slots.push(Slot::new(id, start, value.bytes().len(), pinned, value.is_packed()));
        let slot = self.slots.len() - 1;
        if !pinned {
            self.clock.push(slot as u32);
        }
        slot
    }

    fn reuse_slot(&mut self, id: u64, value: Kept<'_>, pinned: bool) -> usize {
        self.complete = false;
        let victim = self.clock_victim(pinned);
        self.unindex_slot(victim);
        self.garbage += self.slots[victim].len();
        let start = self.append(value.bytes());
        self.slots[victim] = Slot::new(id, start, value.bytes().len(), pinned, value.is_packed());
        self.compact_arena_if_wasteful();
        victim
    }

    /// Takes the clock's victim: the first unpinned slot from the hand whose bit is clear. A slot
    /// that is to hold a pinned pair leaves the clock (the last one takes its place); otherwise
    /// the hand moves past it.
    fn clock_victim(&mut self, pinned: bool) -> usize {
        assert!(!self.clock.is_empty(), "a victim is taken only from a clock with slots");
        self.hand %= self.clock.len();
        while self.slots[self.clock[self.hand] as usize].take_referenced() {
            self.hand = (self.hand + 1) % self.clock.len();
        }
        let victim = self.clock[self.hand] as usize;
        debug_assert!(!self.slots[victim].pinned(), "the clock holds unpinned slots only");
        if pinned {
            self.clock.swap_remove(self.hand);
        } else {
            self.hand += 1;
        }
        victim
    }

    fn index_slot(&mut self, slot: usize) {
        let (value_hash, id_hash) = (value_hash_of(&self.arena, &self.slots[slot]), hash_id(self.slots[slot].id));
        let slots = &self.slots;
        let arena = &self.arena;
        let value_of = |i: usize| value_hash_of(arena, &slots[i]);
        self.by_value.insert(value_hash, slot, value_of);
        self.by_id.insert(id_hash, slot, |i| hash_id(slots[i].id));
    }

    fn unindex_slot(&mut self, slot: usize) {
        let (value_hash, id_hash) = (value_hash_of(&self.arena, &self.slots[slot]), hash_id(self.slots[slot].id));
        let slots = &self.slots;
        let arena = &self.arena;
        self.by_value.remove(value_hash, slot, |i| value_hash_of(arena, &slots[i]));
        self.by_id.remove(id_hash, slot, |i| hash_id(slots[i].id));
    }

    fn append(&mut self, bytes: &[u8]) -> usize {
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        start
    }

    /// Rewrites the arena with only the live values once garbage passes half of them. The
    /// indexes hold slot numbers, not offsets, so only the slots change.
    fn compact_arena_if_wasteful(&mut self) {
        let live = self.arena.len() - self.garbage;
        if self.garbage <= live / 2 {
            return;
        }
        let mut arena = Vec::with_capacity(live + live / 4);
        for slot in &mut self.slots {
            let old = slot.range();
            slot.move_to(arena.len());
            arena.extend_from_slice(&self.arena[old]);
        }
        assert_eq!(arena.len(), live, "every live byte copied once");
        self.garbage = 0;
        self.arena = arena;
    }

    fn value(&self, slot: usize) -> CachedStr<'_> {
        self.value_of_slot(&self.slots[slot])
    }

    fn value_of_slot(&self, slot: &Slot) -> CachedStr<'_> {
        match self.kept_of_slot(slot) {
            Kept::Packed(packed) => CachedStr::Unpacked(plc::Text::unpack(&packed)),
            Kept::Text(text) => {
                CachedStr::Borrowed(std::str::from_utf8(text).expect("the arena holds whole UTF-8 strings"))
            }
        }
    }

    fn kept(&self, slot: usize) -> Kept<'_> {
        self.kept_of_slot(&self.slots[slot])
    }

    fn kept_of_slot(&self, slot: &Slot) -> Kept<'_> {
        match slot.packed() {
            true => Kept::Packed(self.bytes(slot).try_into().expect("a packed value is 15 bytes")),
            false => Kept::Text(self.bytes(slot)),
        }
    }

    /// The value's kept bytes: lookups compare these, skipping the UTF-8 check a `&str` needs.
    fn bytes(&self, slot: &Slot) -> &[u8] {
        &self.arena[slot.range()]
    }
}

fn value_hash_of(arena: &[u8], slot: &Slot) -> u64 {
    xxh3_64(&arena[slot.range()])
}

/// Ids come from our own sequences (never from the network), so a multiply-and-fold mixes them
/// well enough and nobody can choose them to crowd one run of buckets.
fn hash_id(id: u64) -> u64 {
    let product = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    product ^ (product >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn clock_gives_referenced_entries_a_second_chance() {
        let mut cache = Cache::new(2);
        cache.insert(1, "one");
        cache.insert(2, "two");
        assert_eq!(cache.id_of("one"), Some(1));
        cache.insert(3, "three"); // evicts "two": "one" was referenced
        assert_eq!(cache.id_of("two"), None);
        assert_eq!(cache.value_of(2), None);
        assert_eq!(cache.value_of(1).as_deref(), Some("one"));
        assert_eq!(cache.value_of(3).as_deref(), Some("three"));
        let mut none = Cache::new(0);
        none.insert(1, "one");
        assert_eq!(none.id_of("one"), None);
    }

    /// Warming reads, it does not use: a warmed entry is evicted as if it had not been, where a
    /// lookup would have given it a second chance. Values not cached, a packed DID and an empty
    /// cache are warmed without harm.
    #[test]
    fn warming_is_not_a_use() {
        let did = "did:plc:abcdefghijklmnopqrstuvwx";
        let mut scratch = Vec::new();
        Cache::new(4).warm([did, "absent"].into_iter(), &mut scratch);
        let mut cache = Cache::new(2);
        cache.insert(1, did);
        cache.insert(2, "two");
        cache.warm([did, "two", "absent", "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz"].into_iter(), &mut scratch);
        cache.insert(3, "three");
        assert_eq!((cache.id_of(did), cache.id_of("two")), (None, Some(2)), "the oldest went, warmed or not");
        assert_eq!(cache.id_of("two"), Some(2));
        cache.warm(["three"].into_iter(), &mut scratch);
        cache.insert(4, "four");
        assert_eq!((cache.id_of("three"), cache.id_of("two")), (None, Some(2)), "the warmed one went");
    }

    #[test]
    fn a_slot_word_keeps_each_field_apart() {
        let far = (1usize << (64 - START_SHIFT)) - 1;
        let mut slot = Slot::new(7, far, 2048, true, true);
        assert_eq!((slot.range(), slot.pinned(), slot.packed()), (far..far + 2048, true, true));
        slot.mark_referenced();
        slot.move_to(3);
        assert_eq!((slot.range(), slot.pinned(), slot.packed()), (3..2051, true, true));
        assert!(slot.take_referenced(), "moving keeps the clock's bit");
        assert!(!slot.take_referenced());
        slot.unpin();
        assert_eq!((slot.id, slot.range(), slot.pinned(), slot.packed()), (7, 3..2051, false, true));
        let plain = Slot::new(1, 0, LEN_MASK as usize, false, false);
        assert_eq!((plain.range(), plain.pinned(), plain.packed()), (0..LEN_MASK as usize, false, false));
    }

    #[test]
    fn the_arena_stays_within_one_and_a_half_times_the_live_bytes() {
        let mut cache = Cache::new(1_000);
        for id in 0..50_000u64 {
            cache.insert(id + 1, &format!("did:plc:{id:024}"));
            let live: usize = cache.slots.iter().map(Slot::len).sum();
            assert_eq!(cache.arena.len() - cache.garbage, live, "garbage is counted exactly");
            assert!(cache.arena.len() <= live + live / 2 + 64, "arena {} for {live} live", cache.arena.len());
        }
        assert_eq!(cache.len(), 1_000);
        assert_eq!(cache.id_of(&format!("did:plc:{:024}", 49_999)), Some(50_000));
    }

    /// `clock` lists exactly the unpinned slots, each once.
    fn assert_clock_holds_the_unpinned_slots(cache: &Cache) {
        let mut clock: Vec<usize> = cache.clock.iter().map(|&slot| slot as usize).collect();
        clock.sort_unstable();
        let unpinned: Vec<usize> = (0..cache.slots.len()).filter(|&slot| !cache.slots[slot].pinned()).collect();
        assert_eq!(clock, unpinned);
    }

    /// The `did:plc` DID whose packed bytes end in `n`.
    fn plc_did(n: u64) -> String {
        let mut packed = [0u8; plc::PACKED_LEN];
        packed[plc::PACKED_LEN - 8..].copy_from_slice(&n.to_be_bytes());
        plc::unpack(&packed)
    }

    #[test]
    fn plc_dids_are_kept_packed_and_never_taken_for_other_values() {
        let mut cache = Cache::new(100);
        for id in 1..=10u64 {
            cache.insert(id, &plc_did(id));
        }
        assert_eq!(cache.arena.len(), 10 * plc::PACKED_LEN, "15 bytes a did:plc DID");
        let text = "abcdefghijklmno"; // 15 bytes: the packed bytes of `lookalike`
        let lookalike = plc::unpack(text.as_bytes().try_into().unwrap());
        cache.insert(11, text);
        cache.insert_pinned(12, &lookalike);
        cache.insert(13, "did:plc:notbase32_0189aaaaaa"); // kept as written
        for (id, value) in (1..=10u64).map(|id| (id, plc_did(id))).chain([
            (11, text.to_string()),
            (12, lookalike.clone()),
            (13, "did:plc:notbase32_0189aaaaaa".to_string()),
        ]) {
            assert_eq!(cache.id_of(&value), Some(id), "{value}");
            assert_eq!(cache.value_of(id).as_deref(), Some(value.as_str()));
            assert_eq!(cache.get(id).as_deref(), Some(value.as_str()));
        }
        assert_eq!(cache.pinned_value(12).as_deref(), Some(lookalike.as_str()));
        assert_eq!(cache.id_of(&plc_did(99)), None);
    }

    #[test]
    fn id_hashes_spread_sequential_ids_over_homes_and_tags() {
        let ids: Vec<u64> = (1..=4096u64).map(|counter| crate::model::ids::OUTLINED_BIT | counter).collect();
        let homes: std::collections::HashSet<u64> = ids.iter().map(|id| hash_id(*id) & 4095).collect();
        let tags: std::collections::HashSet<u64> = ids.iter().map(|id| hash_id(*id) >> 52).collect();
        // A random function fills 1 - 1/e of them (2,589); a degenerate hash far fewer.
        assert!(homes.len() > 2_400, "{} of 4096 homes used", homes.len());
        assert!(tags.len() > 2_400, "{} of 4096 12-bit tag prefixes used", tags.len());
    }

    #[test]
    fn pinned_pairs_outlive_the_capacity_until_unpinned() {
        let mut cache = Cache::new(2);
        for id in 1..=5u64 {
            cache.insert_pinned(id, &format!("did:plc:{id}"));
        }
        cache.insert(9, "did:plc:nine"); // evicts nothing pinned: none is unpinned
        for id in 1..=5u64 {
            assert_eq!(cache.pinned_value(id).as_deref(), Some(format!("did:plc:{id}").as_str()));
            assert_eq!(cache.id_of(&format!("did:plc:{id}")), Some(id));
        }
        assert_eq!(cache.pinned_value(9).as_deref(), None, "not pinned");
        for id in 1..=5u64 {
            cache.unpin(id);
        }
        cache.shrink_to_capacity();
        assert_eq!(cache.len(), 2);
        assert_eq!((1..=9u64).filter(|id| cache.value_of(*id).is_some()).count(), 2);
    }

    proptest! {
        /// Pinned pairs are never lost, whatever else is inserted, and a cache shrinks back to
        /// its capacity once they are unpinned.
        #[test]
        fn pinned_pairs_are_never_evicted(
            capacity in 0usize..8,
            rounds in prop::collection::vec(prop::collection::vec((any::<bool>(), 0u64..1_000), 0..30), 1..6),
        ) {
            let mut cache = Cache::new(capacity);
            let mut next_id = 1_000u64;
            for round in rounds {
                let mut pinned = Vec::new();
                for (pin, id) in round {
                    if pin {
                        next_id += 1;
                        cache.insert_pinned(next_id, &format!("new{next_id}"));
                        pinned.push(next_id);
                    } else {
                        cache.insert(id, &format!("old{id}"));
                    }
                    for id in &pinned {
                        let value = format!("new{id}");
                        let found = cache.pinned_value(*id);
                        prop_assert_eq!(found.as_deref(), Some(value.as_str()));
                        prop_assert_eq!(cache.id_of(&value), Some(*id));
                    }
                    prop_assert!(cache.len() <= capacity.max(pinned.len() + capacity));
                    assert_clock_holds_the_unpinned_slots(&cache);
                }
                pinned.iter().for_each(|id| cache.unpin(*id));
                assert_clock_holds_the_unpinned_slots(&cache);
                cache.shrink_to_capacity();
                prop_assert!(cache.len() <= capacity);
                assert_clock_holds_the_unpinned_slots(&cache);
            }
        }


        /// Against a plain map of the pairs ever inserted: every answer is right or "not cached",
        /// the newest pair is always cached, and the cache never holds more than its capacity.
        #[test]
        fn answers_agree_with_a_plain_map(
            capacity in 0usize..40,
            operations in prop::collection::vec((0u64..120, any::<bool>(), 0usize..4), 1..600),
        ) {
            let mut cache = Cache::new(capacity);
            let mut truth: HashMap<u64, String> = HashMap::new();
            for (id, lookup, width) in operations {
                let value = if width == 3 { plc_did(id) } else { format!("{}{id}", "x".repeat(width * 7)) };
                let value = truth.entry(id).or_insert(value).clone();
                if lookup {
                    if let Some(found) = cache.id_of(&value) { prop_assert_eq!(found, id); }
                    if let Some(found) = cache.value_of(id) { prop_assert_eq!(&*found, value.as_str()); }
                } else {
                    cache.insert(id, &value);
                    if capacity > 0 {
                        prop_assert_eq!(cache.id_of(&value), Some(id));
                        let found = cache.value_of(id);
                        prop_assert_eq!(found.as_deref(), Some(value.as_str()));
                    }
                }
                prop_assert!(cache.len() <= capacity);
                prop_assert_eq!(cache.by_value.len(), cache.len());
                prop_assert_eq!(cache.by_id.len(), cache.len());
                assert_clock_holds_the_unpinned_slots(&cache);
            }
            for (id, value) in &truth {
                prop_assert_eq!(cache.id_of(value).is_some(), cache.value_of(*id).is_some());
            }
        }
    }
}
