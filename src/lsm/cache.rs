//! What readers keep in memory between queries, within a byte budget: decoded frames, or the part
//! of one that a small key's lookup needs (`CachedFrame`; a hit skips the read and the decode),
//! and the pages of paged metas (`table::MetaCache`: filter pages
//! and frame-index chunks; a meta is never resident whole, so memory does not grow with the index).
//! Caches of several trees may share one `Budget`: the tree queries use takes what the others
//! leave (a server answering listBacklinks has little use for the forward tree's share).
//!
//! Invariants:
//! - Bounded: the values of every cache of a budget together never exceed its `capacity_bytes`
//!   (counted by `CacheValue::bytes`) but for the moment of an insert racing another (each frees
//!   room before it adds): a key has one set of `WAYS` slots, a newer value replaces the older
//!   one of its key or else the set's oldest, and a clock frees room when the budget needs it,
//!   emptying the next set of each member cache in turn (cheap, and a hot value is simply read
//!   again).
//! - A set is made when a value first goes in it or a counted lookup finds it missing: a cache
//!   nothing is kept in (a writer's) costs a pointer a set, not the set.
//! - A key is (table serial, index); serials are unique per process and never reused, so a value
//!   of a retired table can never be served for another table. Retired tables' values age out
//!   like any other.
//! - Only values that decoded and passed their checksums are inserted.
//! - A `CachedFrame` part holds every entry of its frame whose key lies in its span, so a reader
//!   that asks for keys inside the span finds all of theirs; a reader of whole frames never takes
//!   a part.

use crate::lsm::entry::{Entry, within};
use crate::model::ids::RecordId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

/// Source of table serials (cache keys).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A fresh serial for a table handle.
pub fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

type Key = (u64, u32);

/// A value a `BudgetCache` holds: cheap to clone, and the memory it stands for.
pub trait CacheValue: Clone {
    /// The size the cache's slots are made for: a cache of `capacity` bytes has room for about
    /// `capacity / TYPICAL_BYTES` values before slots, not bytes, run out.
    const TYPICAL_BYTES: usize;
    fn bytes(&self) -> usize;
}

/// A frame as the frame cache holds it: every entry, or only the entries of a span of keys. A
/// lookup of a key that fills a small part of its frame keeps only that part (`of_keys`): such
/// keys are most of what queries ask for, and their whole frames (16 KiB decoded, where the key's
/// entries are often one or two of 64 bytes) would let the cache hold a few thousand of them.
#[derive(Debug)]
pub struct CachedFrame<E> {
    /// `None`: the whole frame. `Some((lo, hi))`: exactly the frame's entries whose key is in
    /// `lo..=hi` (none, when the frame holds none of those keys).
    keys: Option<(RecordId, RecordId)>,
    entries: Box<[E]>,
}

/// A frame whose key's entries are at most this share of it is kept as that key's part.
const PART_SHARE_DIVISOR: usize = 4;

impl<E: Entry> CachedFrame<E> {
    pub fn whole(entries: Vec<E>) -> Arc<Self> {
        Arc::new(CachedFrame { keys: None, entries: entries.into() })
    }

    /// What to cache of a decoded `frame` read for the keys `lo..=hi`: their entries when they
    /// are a small part of it, else the whole frame.
    pub fn of_keys(frame: Vec<E>, (lo, hi): (RecordId, RecordId)) -> Arc<Self> {
        debug_assert!(lo <= hi, "an empty span of keys");
        let part = within(&frame, &E::min_for_key(lo), &E::max_for_key(hi));
        if part.len() * PART_SHARE_DIVISOR > frame.len() {
            return Self::whole(frame);
        }
        Arc::new(CachedFrame { keys: Some((lo, hi)), entries: part.into() })
    }

    /// True when it holds every entry of the frame whose key is in `lo..=hi`.
    pub fn holds(&self, (lo, hi): (RecordId, RecordId)) -> bool {
        self.keys.is_none_or(|(from, through)| from <= lo && hi <= through)
    }

    pub fn is_whole(&self) -> bool {
        self.keys.is_none()
    }
}

impl<E> std::ops::Deref for CachedFrame<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        &self.entries
    }
}

/// Slots of a frame cache are made for small parts of frames (a whole frame counts as many).
const TYPICAL_FRAME_BYTES: usize = 1 << 10;

impl<E: Entry> CacheValue for Arc<CachedFrame<E>> {
    const TYPICAL_BYTES: usize = TYPICAL_FRAME_BYTES;
    fn bytes(&self) -> usize {
        std::mem::size_of_val(self.entries.as_ref()) + std::mem::size_of::<CachedFrame<E>>()
    }
}

/// Values per set: a key may live in any slot of the one set its hash names.
const WAYS: usize = 4;

/// One set: up to `WAYS` keyed values, and which slot the next insert replaces when all are
/// taken (round robin: the oldest insertion of the set).
#[derive(Debug)]
struct Set<V> {
    slots: [Option<(Key, V)>; WAYS],
    next: usize,
    /// Lookups of this set that found their key, and that did not: counted under the set's lock
    /// (a shared counter would be one more cache line every reader writes).
    hits: u64,
    misses: u64,
}

/// A set made when a value first goes in it (or a lookup of it is counted): a cache's sets are
/// sized for its whole budget, which the caches of six trees share, and the sets of a cache
/// little used (a writer's, which caches nothing) would otherwise take some 128 bytes each
/// (18 MiB of an import's heap at the default budgets, by heaptrack) for no value.
type LazySet<V> = OnceLock<Box<Mutex<Set<V>>>>;

fn set_made<V>(lazy: &LazySet<V>) -> &Mutex<Set<V>> {
    lazy.get_or_init(|| Box::new(Mutex::new(Set { slots: std::array::from_fn(|_| None), next: 0, hits: 0, misses: 0 })))
}

/// Memory that one or more caches share.
pub struct Budget {
    capacity_bytes: usize,
    /// Bytes the members hold together.
    bytes: AtomicUsize,
    members: RwLock<Vec<Weak<dyn Evict>>>,
    /// Sets of all members: a full turn of the clock.
    sets: AtomicUsize,
    /// Which member the clock empties a set of next.
    turn: AtomicUsize,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget").field("capacity_bytes", &self.capacity_bytes).field("bytes", &self.bytes).finish()
    }
}

/// A member of a budget, as the budget's clock sees it.
trait Evict: Send + Sync {
    /// Empties the set at the member's hand and moves the hand on.
    fn empty_next_set(&self);
}

impl Budget {
    pub fn new(capacity_bytes: usize) -> Arc<Self> {
        Arc::new(Budget {
            capacity_bytes,
            bytes: AtomicUsize::new(0),
            members: RwLock::new(Vec::new()),
            sets: AtomicUsize::new(0),
            turn: AtomicUsize::new(0),
        })
    }

    /// Bytes all members hold.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    fn join(&self, member: Weak<dyn Evict>, sets: usize) {
        self.members.write().expect("budget poisoned").push(member);
        self.sets.fetch_add(sets, Ordering::Relaxed);
    }

    /// Empties sets of the members in turn until `size` more bytes fit (or a full turn of every
    /// member's sets has passed: everything was freed).
    fn make_room(&self, size: usize) {
        let fits = || self.bytes() + size <= self.capacity_bytes;
        if fits() {
            return; // the usual case: no lock of the member list
        }
        let members = self.members.read().expect("budget poisoned");
        for _ in 0..self.sets.load(Ordering::Relaxed) {
            if fits() {
                return;
            }
            let turn = self.turn.fetch_add(1, Ordering::Relaxed) % members.len();
            if let Some(member) = members[turn].upgrade() {
                member.empty_next_set();
            }
        }
    }
}

/// A set-associative cache: a key lives in one of the `WAYS` slots of the set its hash names,
/// each set behind its own lock (readers of different sets never wait for each other, and a hit
/// takes one short, uncontended lock). When the values' bytes would pass the budget, the
/// budget's clock empties sets until the new value fits.
#[derive(Debug)]
pub struct BudgetCache<V> {
    budget: Arc<Budget>,
    sets: Box<[LazySet<V>]>,
    /// Bytes this cache holds (its part of the budget's).
    bytes: AtomicUsize,
    hand: AtomicUsize,
}

/// Decoded frames (or their parts) of a tree's tables.
pub type FrameCache<E> = BudgetCache<Arc<CachedFrame<E>>>;

const MAX_SETS: usize = 1 << 20;

impl<V: CacheValue + Send + 'static> BudgetCache<V> {
    /// A cache with a budget of its own.
    pub fn new(capacity_bytes: usize) -> Arc<Self> {
        Self::within(&Budget::new(capacity_bytes))
    }

    /// A cache sharing `budget` with its other members (sized as if it held all of it).
    pub fn within(budget: &Arc<Budget>) -> Arc<Self> {
        let sets = (budget.capacity_bytes / V::TYPICAL_BYTES.max(1) / WAYS).clamp(1, MAX_SETS).next_power_of_two();
        let cache = Arc::new(BudgetCache {
            budget: budget.clone(),
            sets: (0..sets).map(|_| OnceLock::new()).collect(),
            bytes: AtomicUsize::new(0),
            hand: AtomicUsize::new(0),
        });
        let member: Weak<dyn Evict> = Arc::downgrade(&cache) as Weak<BudgetCache<V>>;
        budget.join(member, sets);
        cache
    }

    fn set_of(&self, key: Key) -> &LazySet<V> {
        // Fibonacci hashing of both halves: serials and indexes are small consecutive numbers.
        let mixed = key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(key.1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        &self.sets[(mixed >> 32) as usize & (self.sets.len() - 1)]
    }

    /// The value if cached.
    pub fn get(&self, serial: u64, index: u32) -> Option<V> {
        self.with(serial, index, V::clone)
    }

    /// `f` of the value if cached, without cloning it (the set stays locked meanwhile: `f` must
    /// be short).
    pub fn with<T>(&self, serial: u64, index: u32, f: impl FnOnce(&V) -> T) -> Option<T> {
        self.look_up(serial, index, |found| {
            let answer = found.map(f);
            let hit = answer.is_some();
            (answer, Some(hit))
        })
    }

    /// `with`, counted as neither a hit nor a miss: a writer's scan looks for what queries left
    /// here but never caches what it reads, so its lookups say nothing of how the cache serves
    /// queries (counted, every filter page of every flush's lookups was a miss).
    pub fn peek<T>(&self, serial: u64, index: u32, f: impl FnOnce(&V) -> T) -> Option<T> {
        self.look_up(serial, index, |found| (found.map(f), None))
    }

    /// The value if cached and `usable` says it will do (a hit), else whether a value that will
    /// not do is cached (both a miss).
    pub fn get_usable(&self, serial: u64, index: u32, usable: impl FnOnce(&V) -> bool) -> Result<V, bool> {
        self.look_up(serial, index, |found| match found {
            Some(value) if usable(value) => (Ok(value.clone()), Some(true)),
            other => (Err(other.is_some()), Some(false)),
        })
    }

    /// `answer` of the key's value (if cached) under its set's lock, counted as a hit, a miss or
    /// neither as `answer` says.
    fn look_up<T>(&self, serial: u64, index: u32, answer: impl FnOnce(Option<&V>) -> (T, Option<bool>)) -> T {
        let key = (serial, index);
        let lazy = self.set_of(key);
        let Some(set) = lazy.get() else {
            let (answer, hit) = answer(None);
            if hit.is_some() {
                set_made(lazy).lock().expect("cache poisoned").misses += 1;
            }
            return answer;
        };
        let mut set = set.lock().expect("cache poisoned");
        let (answer, hit) = answer(set.slots.iter().flatten().find(|(k, _)| *k == key).map(|(_, value)| value));
        match hit {
            Some(true) => set.hits += 1,
            Some(false) => set.misses += 1,
            None => {}
        }
        answer
    }

    /// Keeps a value (replacing one of the same key, else the set's oldest), emptying other sets
    /// in turn first if the budget needs it.
    pub fn insert(&self, serial: u64, index: u32, value: V) {
        let (key, size) = ((serial, index), value.bytes());
        if size > self.budget.capacity_bytes {
            return;
        }
        self.budget.make_room(size);
        let mut set = set_made(self.set_of(key)).lock().expect("cache poisoned");
        let at = match set.slots.iter().position(|slot| slot.as_ref().is_some_and(|(k, _)| *k == key)) {
            Some(at) => at,
            None => set.slots.iter().position(Option::is_none).unwrap_or_else(|| {
                let at = set.next;
                set.next = (at + 1) % WAYS;
                at
            }),
        };
        if let Some((_, old)) = set.slots[at].replace((key, value)) {
            self.released(old.bytes());
        }
        self.bytes.fetch_add(size, Ordering::AcqRel);
        self.budget.bytes.fetch_add(size, Ordering::AcqRel);
    }

    fn released(&self, size: usize) {
        self.bytes.fetch_sub(size, Ordering::AcqRel);
        self.budget.bytes.fetch_sub(size, Ordering::AcqRel);
    }

    /// Bytes this cache holds.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// Lookups that found their key, and that did not, since the cache was made.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let sets = self.sets.iter().filter_map(|set| Some(set.get()?.lock().expect("cache poisoned")));
        sets.fold((0, 0), |(hits, misses), set| (hits + set.hits, misses + set.misses))
    }
}

impl<V> Drop for BudgetCache<V> {
    /// The values go with the cache: the budget no longer counts them.
    fn drop(&mut self) {
        self.budget.bytes.fetch_sub(*self.bytes.get_mut(), Ordering::AcqRel);
    }
}

impl<V: CacheValue + Send + 'static> Evict for BudgetCache<V> {
    fn empty_next_set(&self) {
        let hand = self.hand.fetch_add(1, Ordering::Relaxed) & (self.sets.len() - 1);
        let Some(set) = self.sets[hand].get() else { return };
        let mut set = set.lock().expect("cache poisoned");
        for (_, old) in set.slots.iter_mut().filter_map(Option::take) {
            self.released(old.bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{RecordId, Revocation};

    fn frame(n: u64) -> Arc<CachedFrame<Revocation>> {
        CachedFrame::whole((0..n).map(|i| Revocation { source: RecordId::repo(i), rev: i }).collect())
    }

    /// Sets are made as they are used: a writer's peek makes none, a counted miss makes its
    /// set (and is counted), an insert its set.
    #[test]
    fn a_set_is_made_when_first_used() {
        let cache = FrameCache::new(64 << 20);
        let made = |cache: &FrameCache<Revocation>| cache.sets.iter().filter(|set| set.get().is_some()).count();
        assert!(cache.sets.len() > 1_000);
        assert_eq!(cache.peek(1, 0, |frame| frame.len()), None);
        assert_eq!(made(&cache), 0);
        assert!(cache.get(1, 0).is_none());
        assert_eq!((made(&cache), cache.hits_and_misses()), (1, (0, 1)));
        cache.insert(2, 0, frame(4));
        cache.insert(2, 0, frame(5));
        assert_eq!(cache.get(2, 0).unwrap().len(), 5);
        assert!((1..=2).contains(&made(&cache)));
        assert_eq!(cache.hits_and_misses(), (1, 1));
    }

    #[test]
    fn stays_within_capacity() {
        let cache = FrameCache::new(32 * 10);
        cache.insert(1, 0, frame(4));
        assert_eq!(cache.get(1, 0).unwrap().len(), 4);
        cache.insert(1, 1, frame(4));
        cache.insert(2, 0, frame(4)); // 12 entries > 10: room is made
        assert!(cache.bytes() <= 32 * 10);
        assert_eq!(cache.get(2, 0).unwrap().len(), 4, "the newest value is kept");
        cache.insert(3, 0, frame(11)); // larger than the whole cache: not kept
        assert!(cache.get(3, 0).is_none());
        assert_eq!(cache.hits_and_misses(), (2, 1));
        // Values of the size slots are made for (4 KiB): 256 fit in 1 MiB.
        let big = FrameCache::<Revocation>::new(1 << 20);
        for i in 0..1_000u32 {
            big.insert(u64::from(i % 7), i, frame(128));
            assert!(big.bytes() <= 1 << 20);
        }
        let kept = (0..1_000u32).filter(|&i| big.get(u64::from(i % 7), i).is_some()).count();
        assert!((150..=256).contains(&kept), "a full cache keeps about what fits: {kept}");
        assert_eq!(big.with(9, 9, |v| v.len()), None);
    }

    #[test]
    fn a_peek_finds_what_a_lookup_finds_and_is_not_counted() {
        let cache = FrameCache::new(1 << 20);
        cache.insert(1, 0, frame(4));
        assert_eq!(cache.peek(1, 0, |v| v.len()), Some(4));
        assert_eq!(cache.peek(1, 1, |v| v.len()), None);
        assert_eq!(cache.hits_and_misses(), (0, 0));
        assert_eq!(cache.with(1, 0, |v| v.len()), Some(4));
        assert_eq!(cache.with(1, 1, |v| v.len()), None);
        assert_eq!(cache.hits_and_misses(), (1, 1));
    }

    #[test]
    fn a_key_is_replaced_and_never_confused_with_another() {
        let cache = FrameCache::new(1 << 20);
        cache.insert(5, 1, frame(2));
        cache.insert(5, 1, frame(3));
        assert_eq!(cache.get(5, 1).unwrap().len(), 3);
        assert_eq!(cache.bytes(), frame(3).bytes());
        for i in 0..1_000u32 {
            if let Some(found) = cache.get(6, i) {
                panic!("key (6, {i}) found {found:?}");
            }
        }
    }

    /// Caches of two value types in one budget: either may hold nearly all of it while the
    /// other is idle, together they never pass it, and room for one is made from both.
    #[test]
    fn caches_sharing_a_budget_stay_within_it_together() {
        use crate::model::ids::Backlink;
        let budget = Budget::new(1 << 20);
        let (revocations, links) = (FrameCache::<Revocation>::within(&budget), FrameCache::<Backlink>::within(&budget));
        let links_frame = |n: u64| {
            CachedFrame::whole(
                (0..n)
                    .map(|i| Backlink {
                        target: RecordId::repo(i),
                        source: RecordId::repo(i),
                        location: 1,
                        source_rev: i,
                    })
                    .collect(),
            )
        };
        for i in 0..1_000u32 {
            revocations.insert(1, i, frame(128)); // 4 KiB each
            assert!(budget.bytes() <= 1 << 20);
        }
        assert!(revocations.bytes() > (1 << 20) / 2, "alone, one cache uses the budget: {}", revocations.bytes());
        for i in 0..1_000u32 {
            links.insert(2, i, links_frame(64)); // 4 KiB each
            assert!(budget.bytes() <= 1 << 20);
            assert_eq!(budget.bytes(), revocations.bytes() + links.bytes());
        }
        assert!(links.bytes() > revocations.bytes(), "the cache in use took room from the idle one");
        assert!(links.get(2, 999).is_some());
        drop(revocations);
        assert_eq!(budget.bytes(), links.bytes(), "a dropped member gives its bytes back");
        for i in 1_000..2_000u32 {
            links.insert(2, i, links_frame(64));
            assert!(budget.bytes() <= 1 << 20);
        }
        assert!(links.bytes() > (1 << 20) / 2, "the remaining member uses the budget: {}", links.bytes());
    }

    #[test]
    fn serials_are_unique() {
        assert_ne!(next_serial(), next_serial());
    }
}
