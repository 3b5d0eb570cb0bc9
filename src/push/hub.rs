//! The hub: one task follows the change log and hands each event to the subscribers whose
//! filter it matches, through a bounded queue per subscriber.
//!
//! Routing goes through an index of the filters (exact targets, target DIDs, target prefixes by
//! length, and the subscribers with no target filter), so an event costs the subscribers it may
//! concern, not all of them. A route stands for the target filter it was made from, so a member
//! it leads to is asked only about its source filters (collection, location).
//!
//! Invariants:
//! - Ingest never waits for a subscriber, nor for the hub: the hub reads the log on delivery's
//!   runtime, and a subscriber whose queue is full is cut off (`Cut`, reason `too_slow`), never
//!   waited for.
//! - A member gets the events with cursors above its `after`, in cursor order, each once:
//!   `position` (the newest cursor handed out) only moves under the state lock, and `join`
//!   admits a subscriber only once it has read the log up to `position` itself.
//! - Account events (`hide`, `show`) concern every member, link events only some: a member's
//!   account events are held back until its next link event (then sent before it, in cursor
//!   order), until they have waited `HOLD_ACCOUNT_EVENTS`, or until it holds a share of its
//!   queue (`HELD_SHARE`). Order is kept and nothing is lost (a member that leaves with some
//!   held resumes from its last cursor, before them); only their latency grows, and a member
//!   wakes about once a hold for account events instead of in nearly every round.
//! - An account event is kept once for all members (`AccountEvents`), each member holding only
//!   how far it has taken them: it costs the hub one push, not one per member, until it is sent.
//!   The hub keeps those some member has not taken, fewer than a share of a queue after each
//!   round: a member holding that many, or holding them for a hold, takes them.
//! - At most `max_subscribers` subscriptions exist at once (`admit`).
//! - Delivery yields to ingest: the hub's task and the subscribers' connections run on
//!   `delivery_runtime`, whose threads run at `DELIVERY_NICE`, the lowest priority that still
//!   guarantees them a share (Linux's idle class starved them outright on a loaded machine).
//!   When the cores are busy (a catch-up at full speed) ingest goes first and delivery
//!   lags behind the log, to catch up once ingest is at the stream's pace; when they are not,
//!   delivery has all it needs. The hub runs among the connections and yields to them after each
//!   round, so a lag starves them all alike and cuts nobody off; only a connection slower than its
//!   peers fills its queue.

use super::entry::{Entry, PushEvent, collection_of_source};
use super::filter::{Filter, did_of_target};
use super::log::{LogReader, LogShared};
use super::{PushCounters, PushError};
use crate::base::priority::lower_this_thread;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// How long the hub waits for the log before looking whether it was dropped (its task also ends
/// with its runtime).
const HUB_WAIT: Duration = Duration::from_millis(200);
/// Once caught up, how long the hub lets the log gather more after it moves, so that a round
/// carries many events and each connection wakes and writes once for all of them (at four times
/// the network's rate it took 39 % of delivery's CPU off; events wait at most this long more).
const HUB_LINGER: Duration = Duration::from_millis(50);
/// Most log entries the hub dispatches in one round (then it lets the connections run).
const MAX_DISPATCH_ENTRIES: usize = 1_024;
/// How long an account event (`hide`, `show`) may wait for a member's next link event before it
/// is sent on its own. Account events match every filter, so sent at once they would wake every
/// member in nearly every round at full speed (half the frames of the benchmark's workload);
/// held, they ride along with the member's link events, or wake it once this long.
const HOLD_ACCOUNT_EVENTS: Duration = Duration::from_secs(1);
/// Most account events held for one member, past which they are sent at once: a small share of
/// its queue (`buffer_events / HELD_SHARE`), so that a batch with them never fills it alone.
const HELD_SHARE: usize = 4;
/// Most threads the delivery runtime runs (one per core below that).
const MAX_DELIVERY_THREADS: usize = 4;

/// Scheduling priority of delivery's threads (Linux nice 19 weighs 15 against the usual 1,024).
pub const DELIVERY_NICE: i32 = 19;

/// The runtime the hub and subscribers' connections run on, its threads at `DELIVERY_NICE`.
pub fn delivery_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(MAX_DELIVERY_THREADS))
        .thread_name("push-delivery")
        .on_thread_start(|| lower_this_thread(DELIVERY_NICE))
        .enable_all()
        .build()
}

#[derive(Debug, Clone, Copy)]
pub struct HubOptions {
    pub max_subscribers: usize,
    /// Events queued for one subscriber before it is cut off.
    pub buffer_events: usize,
}

/// One event for one subscriber: the entry it belongs to, its place there, and its
/// subscribeBacklinks frame (rendered once, shared by every subscriber it goes to).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub entry: Arc<Entry>,
    pub index: usize,
    pub frame: Utf8Bytes,
}

impl Delivery {
    pub fn event(&self) -> PushEvent<'_> {
        self.entry.event(self.index)
    }
}

/// Why and whether a subscriber was cut off.
#[derive(Debug, Default)]
pub struct Cut {
    reason: OnceLock<&'static str>,
    notify: Notify,
}

impl Cut {
    /// Cuts the subscriber off; false if it already was.
    fn cut(&self, reason: &'static str) -> bool {
        let first = self.reason.set(reason).is_ok();
        if first {
            self.notify.notify_one();
        }
        first
    }

    pub fn reason(&self) -> Option<&'static str> {
        self.reason.get().copied()
    }

    /// Resolves once cut.
    pub async fn wait(&self) {
        if self.reason().is_none() {
            self.notify.notified().await;
        }
    }
}

/// Where a member is kept in `Members`, from its joining to its leaving; routes name it so.
type Slot = u32;

struct Member {
    slot: Slot,
    filter: Filter,
    after: i64,
    queue: mpsc::UnboundedSender<Vec<Delivery>>,
    /// Events sent and not yet taken by the connection: never more than `buffer_events`.
    queued: Arc<AtomicUsize>,
    cut: Arc<Cut>,
    /// The sequence number (in `AccountEvents`) of the first account event it has not taken.
    accounts_taken: u64,
    /// What the round being dispatched gathered for it (sent, and emptied, at the round's end).
    batch: Vec<Delivery>,
    /// The number of the last link event it was offered: a member that several routes reach
    /// (its target, its target's DID, a prefix) is offered each event once.
    offered: u64,
}

impl Member {
    /// Its batch, naming it in `woken` when the round had gathered nothing for it yet.
    fn batch(&mut self, woken: &mut Vec<Slot>) -> &mut Vec<Delivery> {
        if self.batch.is_empty() {
            woken.push(self.slot);
        }
        &mut self.batch
    }

    /// Adds the account events it has not taken to its batch, in cursor order (those at or
    /// before its `after` were sent by its replay; a member cut off takes them and sends nothing).
    fn take_account_events(&mut self, accounts: &AccountEvents, woken: &mut Vec<Slot>) {
        if self.cut.reason().is_none() {
            for held in accounts.since(self.accounts_taken) {
                let event = held.delivery.event();
                debug_assert!(self.filter.matches(&event), "account events match every filter");
                if event.cursor() > self.after {
                    self.batch(woken).push(held.delivery.clone());
                }
            }
        }
        self.accounts_taken = accounts.end();
    }

    /// Offers it a link event its routes led to: it takes the event, after its account events,
    /// unless it was offered it already, the event is at or before its `after`, it is cut off,
    /// or its source filters do not hold. The routes stand for its target filters, so those are
    /// not looked at again.
    fn offer(
        &mut self,
        offer: &Offer<'_>,
        delivery: impl FnOnce() -> Delivery,
        accounts: &AccountEvents,
        woken: &mut Vec<Slot>,
    ) {
        if self.offered == offer.number {
            return;
        }
        self.offered = offer.number;
        if offer.cursor <= self.after
            || self.cut.reason().is_some()
            || !self.filter.wants_source(offer.collection, offer.location)
        {
            return;
        }
        debug_assert!(self.filter.matches(&offer.event), "routes lead only to members that want the target");
        self.take_account_events(accounts, woken);
        self.batch(woken).push(delivery());
    }

    /// Whether the account events it holds are due to be sent without a link event: it holds
    /// `limit` of them, or the first has waited `HOLD_ACCOUNT_EVENTS`.
    fn account_events_due(&self, accounts: &AccountEvents, now: Instant, limit: usize) -> bool {
        let held = accounts.end() - self.accounts_taken;
        held as usize >= limit
            || accounts
                .held_at(self.accounts_taken)
                .is_some_and(|since| now.duration_since(since) >= HOLD_ACCOUNT_EVENTS)
    }
}

/// A link event as routing offers it to members: numbered (`Member::offered`), with what their
/// source filters ask read once for all of them.
struct Offer<'e> {
    number: u64,
    event: PushEvent<'e>,
    cursor: i64,
    collection: &'e str,
    location: &'e str,
}

/// One account event kept for the members that have not taken it.
struct HeldEvent {
    delivery: Delivery,
    since: Instant,
}

/// The account events some member has not taken, in cursor order, each numbered by a sequence
/// that never goes back (the first one's number is `first`).
#[derive(Default)]
struct AccountEvents {
    first: u64,
    events: VecDeque<HeldEvent>,
}

impl AccountEvents {
    /// The sequence number the next account event gets.
    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    fn push(&mut self, delivery: Delivery, since: Instant) {
        debug_assert!(
            self.events.back().is_none_or(|last| last.delivery.event().cursor() < delivery.event().cursor()),
            "in cursor order"
        );
        self.events.push_back(HeldEvent { delivery, since });
    }

    /// The events from sequence number `from` on.
    fn since(&self, from: u64) -> impl Iterator<Item = &HeldEvent> {
        assert!(from >= self.first && from <= self.end(), "a member never takes events forgotten or not pushed yet");
        self.events.range((from - self.first) as usize..)
    }

    /// When the first event from sequence number `from` on was kept, if there is one.
    fn held_at(&self, from: u64) -> Option<Instant> {
        self.since(from).next().map(|held| held.since)
    }

    /// Forgets the events before `sequence` (every member has taken them).
    fn forget_before(&mut self, sequence: u64) {
        assert!(sequence <= self.end());
        while self.first < sequence {
            self.events.pop_front();
            self.first += 1;
        }
    }
}

/// The members, each in the slot it keeps from joining to leaving.
#[derive(Default)]
struct Members {
    slots: Vec<Option<Member>>,
    free: Vec<Slot>,
}

impl Members {
    /// Keeps the member built for its slot.
    fn insert(&mut self, member: impl FnOnce(Slot) -> Member) -> Slot {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                Slot::try_from(self.slots.len() - 1).expect("a u32 numbers every slot")
            }
        };
        let place = &mut self.slots[slot as usize];
        assert!(place.is_none(), "a free slot is empty");
        *place = Some(member(slot));
        slot
    }

    fn remove(&mut self, slot: Slot) -> Option<Member> {
        let member = self.slots.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(member)
    }

    fn get(&self, slot: Slot) -> Option<&Member> {
        self.slots.get(slot as usize)?.as_ref()
    }

    fn get_mut(&mut self, slot: Slot) -> Option<&mut Member> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    fn iter(&self) -> impl Iterator<Item = &Member> {
        self.slots.iter().flatten()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Member> {
        self.slots.iter_mut().flatten()
    }

    fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }
}

/// Which members a link's target may concern. A member is reached through an exact target, its
/// target's DID, or a prefix of it, exactly those of its target filters (or always, with none),
/// so a member a route leads to wants the target.
#[derive(Default)]
struct Routes {
    by_target: HashMap<String, Vec<Slot>>,
    by_did: HashMap<String, Vec<Slot>>,
    by_prefix: HashMap<String, Vec<Slot>>,
    /// Prefix lengths in use, with how many prefixes have each.
    prefix_lengths: BTreeMap<usize, usize>,
    every_target: Vec<Slot>,
}

fn add_route(map: &mut HashMap<String, Vec<Slot>>, key: &str, slot: Slot) {
    map.entry(key.to_string()).or_default().push(slot);
}

fn remove_route(map: &mut HashMap<String, Vec<Slot>>, key: &str, slot: Slot) {
    if let Some(slots) = map.get_mut(key) {
        slots.retain(|other| *other != slot);
        if slots.is_empty() {
            map.remove(key);
        }
    }
}

impl Routes {
    fn add(&mut self, slot: Slot, filter: &Filter) {
        if !filter.has_target_filters() {
            self.every_target.push(slot);
        }
        filter.targets.iter().for_each(|t| add_route(&mut self.by_target, t, slot));
        filter.dids.iter().for_each(|d| add_route(&mut self.by_did, d, slot));
        for prefix in &filter.prefixes {
            add_route(&mut self.by_prefix, prefix, slot);
            *self.prefix_lengths.entry(prefix.len()).or_default() += 1;
        }
    }

    fn remove(&mut self, slot: Slot, filter: &Filter) {
        self.every_target.retain(|other| *other != slot);
        filter.targets.iter().for_each(|t| remove_route(&mut self.by_target, t, slot));
        filter.dids.iter().for_each(|d| remove_route(&mut self.by_did, d, slot));
        for prefix in &filter.prefixes {
            remove_route(&mut self.by_prefix, prefix, slot);
            let count = self.prefix_lengths.get_mut(&prefix.len()).expect("added with its length");
            *count -= 1;
            if *count == 0 {
                self.prefix_lengths.remove(&prefix.len());
            }
        }
    }

    /// Visits the members a link to `target` may concern: once for each route that reaches
    /// it, so a member may be visited more than once.
    fn visit_candidates(&self, target: &str, mut visit: impl FnMut(Slot)) {
        let mut visit_all = |slots: Option<&Vec<Slot>>| slots.into_iter().flatten().for_each(|&slot| visit(slot));
        visit_all(Some(&self.every_target));
        visit_all(self.by_target.get(target));
        if let Some(did) = did_of_target(target) {
            visit_all(self.by_did.get(did));
        }
        for &len in self.prefix_lengths.keys() {
            if let Some(head) = target.get(..len) {
                visit_all(self.by_prefix.get(head));
            }
        }
    }
}

struct HubState {
    /// The newest cursor handed out (or skipped) by the hub.
    position: i64,
    members: Members,
    routes: Routes,
    accounts: AccountEvents,
    /// Link events offered to members so far (numbers each offer: `Member::offered`).
    offers: u64,
}

pub struct Hub {
    log: Arc<LogShared>,
    options: HubOptions,
    state: Mutex<HubState>,
    counters: Arc<PushCounters>,
}

/// A place under `max_subscribers`, held by a connection for its whole life.
pub struct Admission {
    counters: Arc<PushCounters>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.counters.subscribers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What `join` says.
pub enum Join {
    Joined(Subscription),
    /// The hub has handed out events past the given cursor: read the log further first.
    Behind,
}

/// A member of the hub: its queue, and its way back to change its filter or leave.
pub struct Subscription {
    hub: Arc<Hub>,
    slot: Slot,
    queue: mpsc::UnboundedReceiver<Vec<Delivery>>,
    queued: Arc<AtomicUsize>,
    pub cut: Arc<Cut>,
}

impl Subscription {
    /// The next events the hub queued, in cursor order (a batch of one or more); None once the
    /// hub is gone.
    pub async fn next_batch(&mut self) -> Option<Vec<Delivery>> {
        let batch = self.queue.recv().await?;
        self.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        Some(batch)
    }

    /// The events queued now, without waiting.
    #[cfg(test)]
    pub fn queued_now(&mut self) -> Vec<Delivery> {
        let mut events = vec![];
        while let Ok(batch) = self.queue.try_recv() {
            self.queued.fetch_sub(batch.len(), Ordering::Relaxed);
            events.extend(batch);
        }
        events
    }

    pub fn update(&self, filter: Filter) {
        let mut state = self.hub.lock();
        let HubState { members, routes, .. } = &mut *state;
        if let Some(member) = members.get_mut(self.slot) {
            routes.remove(self.slot, &member.filter);
            routes.add(self.slot, &filter);
            member.filter = filter;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.leave(self.slot);
    }
}

impl Hub {
    /// Starts the hub's task on `delivery` (the subscribers' runtime), following the log from
    /// its end.
    pub fn start(
        log: Arc<LogShared>,
        options: HubOptions,
        counters: Arc<PushCounters>,
        delivery: &tokio::runtime::Handle,
    ) -> Arc<Hub> {
        assert!(options.buffer_events > 0 && options.max_subscribers > 0);
        let position = log.end().last_cursor;
        let state = HubState {
            position,
            members: Members::default(),
            routes: Routes::default(),
            accounts: AccountEvents::default(),
            offers: 0,
        };
        let hub = Arc::new(Hub { log, options, state: Mutex::new(state), counters });
        delivery.spawn(follow_log(Arc::downgrade(&hub), position));
        hub
    }

    pub fn log(&self) -> &Arc<LogShared> {
        &self.log
    }

    pub fn counters(&self) -> &Arc<PushCounters> {
        &self.counters
    }

    /// The newest cursor handed out.
    pub fn position(&self) -> i64 {
        self.lock().position
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().expect("hub lock poisoned")
    }

    /// A place for one more subscriber, unless there are `max_subscribers` already.
    pub fn admit(&self) -> Option<Admission> {
        let admitted = self
            .counters
            .subscribers
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.options.max_subscribers as u64).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        admitted.then(|| Admission { counters: self.counters.clone() })
    }

    /// Joins the live flow for events after `after`, if the hub has not handed out any past it.
    pub fn join(self: &Arc<Self>, filter: Filter, after: i64) -> Join {
        let mut state = self.lock();
        if state.position > after {
            return Join::Behind;
        }
        let (queue, receiver) = mpsc::unbounded_channel();
        let (cut, queued) = (Arc::new(Cut::default()), Arc::new(AtomicUsize::new(0)));
        // Every account event kept was handed out (its cursor is at most `position`, so at most
        // `after`): none is for this member.
        let accounts_taken = state.accounts.end();
        let HubState { members, routes, .. } = &mut *state;
        let slot = members.insert(|slot| Member {
            slot,
            filter,
            after,
            queue,
            queued: queued.clone(),
            cut: cut.clone(),
            accounts_taken,
            batch: Vec::new(),
            offered: 0,
        });
        routes.add(slot, &members.get(slot).expect("just kept").filter);
        Join::Joined(Subscription { hub: self.clone(), slot, queue: receiver, queued, cut })
    }

    /// Joins the live flow from now on.
    pub fn join_live(self: &Arc<Self>, filter: Filter) -> Subscription {
        let after = self.position();
        match self.join(filter.clone(), after) {
            Join::Joined(subscription) => subscription,
            Join::Behind => self.join_live(filter),
        }
    }

    fn leave(&self, slot: Slot) {
        let mut state = self.lock();
        let HubState { members, routes, .. } = &mut *state;
        if let Some(member) = members.remove(slot) {
            routes.remove(slot, &member.filter);
        }
    }

    /// Hands the entries' events to the members they concern: one batch per member, so that a
    /// connection wakes and writes once for all it got (the more the hub lags, the larger the
    /// batches and the cheaper each event). A member woken by a batch gets the account events it
    /// holds too; one that is not, only once they have waited `HOLD_ACCOUNT_EVENTS` (with no
    /// entries, a dispatch only sends those).
    fn dispatch(&self, entries: Vec<Entry>) {
        let mut state = self.lock();
        let now = Instant::now();
        let mut woken: Vec<Slot> = Vec::new();
        for entry in entries {
            let entry = Arc::new(entry);
            route_entry(&mut state, &entry, now, &mut woken);
            state.position = state.position.max(entry.last_cursor());
        }
        self.send_due_account_events(&mut state, now, &mut woken);
        for slot in woken {
            let Some(member) = state.members.get_mut(slot) else { continue };
            let batch = std::mem::take(&mut member.batch);
            debug_assert!(!batch.is_empty(), "a member is woken by what it got");
            // An empty queue takes any batch (one entry may hold more events than a queue).
            let queued = member.queued.load(Ordering::Relaxed);
            if queued > 0 && queued + batch.len() > self.options.buffer_events {
                if member.cut.cut("too_slow") {
                    self.counters.cut_too_slow.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            member.queued.fetch_add(batch.len(), Ordering::Relaxed);
            // A closed queue is a connection on its way out: it leaves by itself.
            let _ = member.queue.send(batch);
        }
    }

    /// Adds the account events a member holds to its batch when it has one, or when they are
    /// due on their own; then forgets those every member has taken.
    fn send_due_account_events(&self, state: &mut HubState, now: Instant, woken: &mut Vec<Slot>) {
        let HubState { members, accounts, .. } = state;
        let (end, limit) = (accounts.end(), self.hold_limit());
        for member in members.iter_mut() {
            if member.accounts_taken < end
                && (!member.batch.is_empty() || member.account_events_due(accounts, now, limit))
            {
                member.take_account_events(accounts, woken);
            }
        }
        accounts.forget_before(members.iter().map(|member| member.accounts_taken).min().unwrap_or(end));
    }

    fn hold_limit(&self) -> usize {
        (self.options.buffer_events / HELD_SHARE).max(1)
    }

    /// Cuts every member off: the hub could not follow the log.
    fn cut_everyone(&self, reason: &'static str) {
        let state = self.lock();
        let counter = if reason == "behind" { &self.counters.cut_behind } else { &self.counters.cut_error };
        for member in state.members.iter() {
            if member.cut.cut(reason) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Adds the entry's events to the batches of the members they concern (rendering each event's
/// frame once, for all of them): a link event after the account events its member has not taken;
/// an account event is kept once, for every member to take (`send_due_account_events`).
fn route_entry(state: &mut HubState, entry: &Arc<Entry>, now: Instant, woken: &mut Vec<Slot>) {
    let HubState { members, routes, accounts, offers, .. } = state;
    for (index, event) in entry.events().enumerate() {
        let delivery = |frame: Utf8Bytes| Delivery { entry: entry.clone(), index, frame };
        let PushEvent::Link { link, source, cursor, .. } = event else {
            // With no member, nobody is owed it: a member joining later starts past it.
            if !members.is_empty() {
                accounts.push(delivery(event.to_json().into()), now);
            }
            continue;
        };
        *offers += 1;
        let offer = Offer {
            number: *offers,
            event,
            cursor,
            collection: collection_of_source(source),
            location: &link.location,
        };
        let mut frame: Option<Utf8Bytes> = None;
        routes.visit_candidates(&link.target, |slot| {
            let Some(member) = members.get_mut(slot) else { return };
            let render = || delivery(frame.get_or_insert_with(|| event.to_json().into()).clone());
            member.offer(&offer, render, accounts, woken);
        });
    }
}

/// The next entries published and not yet read: at most `MAX_DISPATCH_ENTRIES`, and no more
/// events than `events` (unless the first entry alone has more).
fn read_entries(reader: &mut LogReader, events: usize) -> Result<Vec<Entry>, PushError> {
    let (mut entries, mut read_events) = (vec![], 0);
    while entries.len() < MAX_DISPATCH_ENTRIES && read_events < events {
        match reader.next_entry()? {
            Some(entry) => {
                read_events += entry.event_count();
                entries.push(entry);
            }
            None => break,
        }
    }
    Ok(entries)
}

/// The hub's task: reads each new entry once and dispatches it in rounds, yielding to the
/// connections a round woke before the next, so that it never runs far ahead of delivery: when
/// delivery is starved of CPU the hub is too, and subscribers lag together instead of being cut
/// off as too slow. (Its reads are of the newest log bytes, in the page cache: they do not block
/// the runtime.)
async fn follow_log(hub: Weak<Hub>, from: i64) {
    let Some(log) = hub.upgrade().map(|hub| hub.log.clone()) else { return };
    let mut reader = LogReader::after(log.clone(), from);
    let mut last = from;
    loop {
        let Some(hub) = hub.upgrade() else { return };
        // Half a queue a round: a member that reads what it got between rounds is never cut off.
        match read_entries(&mut reader, hub.options.buffer_events / 2) {
            Ok(entries) if !entries.is_empty() => {
                last = entries.last().expect("not empty").last_cursor();
                hub.dispatch(entries);
                drop(hub);
                tokio::task::yield_now().await;
            }
            Ok(_) => {
                // Sends the account events that waited long enough for a link event.
                hub.dispatch(Vec::new());
                drop(hub);
                // Wakes now and then to see whether the hub is gone.
                if tokio::time::timeout(HUB_WAIT, log.published_past(last)).await.is_ok() {
                    tokio::time::sleep(HUB_LINGER).await;
                }
            }
            Err(error) => {
                tracing::error!(%error, "the push hub cannot read the change log; subscribers are cut off");
                hub.cut_everyone(if matches!(error, PushError::Behind) { "behind" } else { "log_error" });
                let end = log.end().last_cursor;
                hub.lock().position = end;
                reader = LogReader::after(log.clone(), end);
                last = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::entry::{Change, Link};
    use crate::push::log::{ChangeLog, LogOptions};

    fn filter(pairs: &[(&str, &str)]) -> Filter {
        Filter::from_pairs(pairs.iter().copied()).unwrap()
    }

    fn like(cursor: i64, target: &str) -> Entry {
        let created = vec![Link { target: target.into(), location: "$.subject".into() }];
        let source = format!("at://did:plc:liker/app.bsky.feed.like/{cursor}");
        let change = Change::Links { source, rev: None, account_before: None, deleted: vec![], created, kept: vec![] };
        Entry { first_cursor: cursor, time_us: cursor, identity: cursor as u64, change }
    }

    fn hide(cursor: i64) -> Entry {
        let change = Change::Hide { did: "did:plc:liker".into(), status: "deactivated".into() };
        Entry { first_cursor: cursor, time_us: cursor, identity: cursor as u64, change }
    }

    const POST: &str = "at://did:plc:bob/app.bsky.feed.post/3k";
    const OTHER: &str = "at://did:plc:eve/app.bsky.feed.post/3j";

    fn open_log(dir: &std::path::Path) -> ChangeLog {
        let options = LogOptions { segment_bytes: 1 << 20, retain_us: i64::MAX / 4, max_bytes: u64::MAX, pack: true };
        ChangeLog::open(dir, options).unwrap()
    }

    /// Appends and publishes the entries, then waits until the hub has handed them out.
    fn publish(log: &mut ChangeLog, hub: &Hub, entries: Vec<Entry>) {
        let last = entries.last().unwrap().last_cursor();
        for entry in &entries {
            log.append(entry).unwrap();
        }
        log.publish().unwrap();
        while hub.position() < last {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A hub following a log of its own (fields drop in order: the hub before its runtime). A
    /// test binds `_delivery` and `_dir`: left to `..`, they would drop at once, and the hub with them.
    struct Started {
        hub: Arc<Hub>,
        counters: Arc<PushCounters>,
        _delivery: tokio::runtime::Runtime,
        log: ChangeLog,
        _dir: tempfile::TempDir,
    }

    fn start_hub(options: HubOptions) -> Started {
        let dir = tempfile::tempdir().unwrap();
        let log = open_log(dir.path());
        let delivery = tokio::runtime::Runtime::new().unwrap();
        let counters = Arc::new(PushCounters::default());
        let hub = Hub::start(log.shared().clone(), options, counters.clone(), delivery.handle());
        Started { hub, counters, _delivery: delivery, log, _dir: dir }
    }

    /// Joins with the filter of `pairs` after `after`, which the hub has not handed out past.
    fn joined(hub: &Arc<Hub>, pairs: &[(&str, &str)], after: i64) -> Subscription {
        match hub.join(filter(pairs), after) {
            Join::Joined(subscription) => subscription,
            Join::Behind => panic!("the hub handed out events past {after}"),
        }
    }

    /// The cursors of the events queued for the subscription now.
    fn cursors(subscription: &mut Subscription) -> Vec<i64> {
        subscription.queued_now().iter().map(|d| d.event().cursor()).collect()
    }

    /// The slots the routes lead a link to `target` to, each once.
    fn candidates(routes: &Routes, target: &str) -> Vec<Slot> {
        let mut slots = vec![];
        routes.visit_candidates(target, |slot| slots.push(slot));
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    #[test]
    fn routes_find_exactly_the_members_a_target_may_concern() {
        let mut routes = Routes::default();
        routes.add(1, &filter(&[("target", POST)]));
        routes.add(2, &filter(&[("targetDid", "did:plc:bob")]));
        routes.add(3, &filter(&[("targetPrefix", "at://did:plc:bob/app.bsky.feed.")]));
        routes.add(4, &filter(&[("collection", "app.bsky.feed.like")]));
        routes.add(5, &filter(&[("targetPrefix", "at://did:plc:eve/"), ("target", POST)]));
        assert_eq!(candidates(&routes, POST), [1, 2, 3, 4, 5]);
        assert_eq!(candidates(&routes, OTHER), [4, 5]);
        assert_eq!(candidates(&routes, "did:plc:bob"), [2, 4]);
        routes.remove(5, &filter(&[("targetPrefix", "at://did:plc:eve/"), ("target", POST)]));
        routes.remove(3, &filter(&[("targetPrefix", "at://did:plc:bob/app.bsky.feed.")]));
        assert_eq!(candidates(&routes, POST), [1, 2, 4]);
        assert_eq!(candidates(&routes, OTHER), [4]);
        assert!(routes.prefix_lengths.is_empty() && routes.by_prefix.is_empty(), "nothing left behind");
    }

    #[test]
    fn a_member_several_routes_reach_gets_each_event_once_and_only_from_sources_it_wants() {
        let Started { hub, mut log, _delivery, _dir, .. } =
            start_hub(HubOptions { max_subscribers: 2, buffer_events: 16 });
        let every_route = [("target", POST), ("targetDid", "did:plc:bob"), ("targetPrefix", "at://did:plc:bob/")];
        let mut bob = joined(&hub, &every_route, 0);
        let reposts = [("target", POST), ("collection", "app.bsky.feed.repost")];
        let mut repost = joined(&hub, &reposts, 0);
        publish(&mut log, &hub, vec![like(1, POST), like(2, OTHER), like(3, POST)]);
        assert_eq!(cursors(&mut bob), [1, 3], "each event once, though three routes lead to it");
        assert_eq!(cursors(&mut repost), [0i64; 0], "likes are not from a collection it wants");
    }

    #[test]
    fn a_member_gets_what_comes_after_its_cursor_and_a_full_queue_cuts_it_off() {
        let Started { hub, counters, mut log, _delivery, _dir } =
            start_hub(HubOptions { max_subscribers: 2, buffer_events: 2 });
        let (first, second) = (hub.admit().unwrap(), hub.admit().unwrap());
        assert!(hub.admit().is_none(), "two at most");
        assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
        drop((first, second));
        let mut post = joined(&hub, &[("target", POST)], 0);
        let slow = joined(&hub, &[], 0);
        for (cursor, target) in [(1, POST), (2, OTHER), (3, POST)] {
            log.append(&like(cursor, target)).unwrap();
        }
        log.publish().unwrap();
        let wait = |n: i64| {
            while hub.position() < n {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait(3);
        assert_eq!(cursors(&mut post), [1, 3], "only its target's events, in order");
        assert_eq!(slow.cut.reason(), Some("too_slow"), "three events for a queue of two");
        assert_eq!(counters.cut_too_slow.load(Ordering::Relaxed), 1, "counted once");
        assert!(matches!(hub.join(filter(&[]), 2), Join::Behind), "events past 2 were handed out");
        let mut late = joined(&hub, &[], 3);
        log.append(&like(4, OTHER)).unwrap();
        log.publish().unwrap();
        wait(4);
        assert_eq!(cursors(&mut late), [4]);
        assert_eq!(cursors(&mut post), [0i64; 0], "not its target");
        // A replay that read the log past the hub joins with its own cursor: nothing twice.
        let mut ahead = joined(&hub, &[], 5);
        for cursor in [5, 6] {
            log.append(&like(cursor, OTHER)).unwrap();
        }
        log.publish().unwrap();
        wait(6);
        assert_eq!(cursors(&mut ahead), [6]);
    }

    #[test]
    fn account_events_wait_for_a_link_event_a_hold_or_a_share_of_the_queue() {
        let Started { hub, mut log, _delivery, _dir, .. } =
            start_hub(HubOptions { max_subscribers: 2, buffer_events: 16 });
        let mut post = joined(&hub, &[("target", POST)], 0);
        let mut other = joined(&hub, &[("target", OTHER)], 0);
        let started = Instant::now();
        publish(&mut log, &hub, vec![hide(1), like(2, POST), hide(3)]);
        assert_eq!(cursors(&mut post), [1, 2, 3], "held account events go before a link event, in order");
        if started.elapsed() < HOLD_ACCOUNT_EVENTS {
            assert_eq!(cursors(&mut other), [0i64; 0], "held: no link event for it yet");
        }
        let mut waited = vec![];
        while waited.len() < 2 && started.elapsed() < HOLD_ACCOUNT_EVENTS * 10 {
            std::thread::sleep(Duration::from_millis(20));
            waited.extend(cursors(&mut other));
        }
        assert_eq!(waited, [1, 3], "sent on their own once they have waited the hold");
        assert!(started.elapsed() >= HOLD_ACCOUNT_EVENTS);
        let held_at_most = 16 / HELD_SHARE;
        publish(&mut log, &hub, (4..4 + held_at_most as i64).map(hide).collect());
        assert_eq!(cursors(&mut other).len(), held_at_most, "a share of the queue is sent at once");
    }

    #[test]
    fn an_account_event_is_kept_once_for_every_member_and_forgotten_once_all_took_it() {
        let Started { hub, mut log, _delivery, _dir, .. } =
            start_hub(HubOptions { max_subscribers: 100, buffer_events: 64 });
        let kept = || hub.lock().accounts.events.len();
        publish(&mut log, &hub, vec![hide(1)]);
        assert_eq!(kept(), 0, "nobody is owed an account event made before anyone joined");
        let mut members: Vec<Subscription> = (0..50).map(|_| joined(&hub, &[("target", OTHER)], 1)).collect();
        let mut ahead = joined(&hub, &[("target", OTHER)], 4);
        let started = Instant::now();
        publish(&mut log, &hub, (2..=5).map(hide).collect());
        assert_eq!(kept(), 4, "four account events kept once, not once per member");
        if started.elapsed() < HOLD_ACCOUNT_EVENTS {
            let queued = |member: &Subscription| member.queued.load(Ordering::Relaxed);
            assert!(members.iter().all(|member| queued(member) == 0), "held for a link event");
        }
        publish(&mut log, &hub, vec![like(6, OTHER)]);
        for member in &mut members {
            assert_eq!(cursors(member), [2, 3, 4, 5, 6], "in order, the account events first");
        }
        assert_eq!(cursors(&mut ahead), [5, 6], "nothing at or before its cursor");
        assert_eq!(kept(), 0, "every member took them");
        // A member that no link event reaches: what is kept stays under a share of a queue.
        let mut quiet = joined(&hub, &[("target", POST)], 6);
        drop(members);
        let limit = hub.hold_limit();
        publish(&mut log, &hub, (7..7 + 3 * limit as i64).map(hide).collect());
        assert!(kept() < limit, "{} kept for a member that takes them a share at a time", kept());
        let got = cursors(&mut quiet);
        assert_eq!(got, (7..7 + 3 * limit as i64).collect::<Vec<_>>()[..got.len()], "in order, from its cursor");
        assert!(got.len() >= 2 * limit);
        let got = cursors(&mut ahead);
        assert_eq!(got.first(), Some(&7), "nothing at or before its cursor twice: {got:?}");
    }

    #[test]
    fn the_hub_lets_its_subscribers_read_before_it_dispatches_more() {
        // On one thread the hub and a subscriber share the CPU as they would when delivery is
        // starved: a burst of many times the queue's size must not cut the subscriber off.
        let dir = tempfile::tempdir().unwrap();
        let mut log = open_log(dir.path());
        let delivery = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let counters = Arc::new(PushCounters::default());
        let options = HubOptions { max_subscribers: 1, buffer_events: 2 };
        let hub = Hub::start(log.shared().clone(), options, counters.clone(), delivery.handle());
        let mut subscription = joined(&hub, &[], 0);
        const BURST: i64 = 1_000;
        for cursor in 1..=BURST {
            log.append(&like(cursor, POST)).unwrap();
        }
        log.publish().unwrap();
        let received = delivery.block_on(async {
            let mut received = vec![];
            while received.len() < BURST as usize && subscription.cut.reason().is_none() {
                match tokio::time::timeout(Duration::from_secs(10), subscription.next_batch()).await {
                    Ok(Some(batch)) => received.extend(batch.iter().map(|d| d.event().cursor())),
                    _ => break,
                }
            }
            received
        });
        assert_eq!(subscription.cut.reason(), None, "never cut off while it keeps reading");
        assert_eq!(received, (1..=BURST).collect::<Vec<_>>());
    }
}
