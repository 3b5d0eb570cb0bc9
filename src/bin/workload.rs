//! `backlinks-workload`: writes a seeded stream of Jetstream v1 JSON lines shaped like the real
//! network, for `backlinks import` benchmarks (`scripts/bench.sh`).
//!
//! The mix follows the public firehose: mostly likes, then posts (replies with root and parent
//! strong references, quotes via `embed.record`, mentions via facets, images and link cards that
//! hold no links), follows, reposts, blocks, profile updates (some with a pinned post), a few
//! percent deletes and record updates, account deactivations, reactivations and deletions, and
//! identity events. Liked, reposted, replied and quoted posts and followed, blocked and mentioned
//! accounts are Zipf-popular; record keys are TIDs of the event time, like the real ones.
//!
//! Invariants:
//! - Deterministic: the output is a function of the flags alone (no clock, no thread rng); the
//!   generator is splitmix64 seeded by `--seed`.
//! - Every line is one valid Jetstream v1 event that `backlinks import` applies (a test parses
//!   every line of a sample with the importer's parser).
//! - `links` in the summary is exactly the number of backlinks the extractor finds in the
//!   records written (creates and updates); a test checks it on a sample.
//! - Accounts behave as their PDS lets them: a deactivated account writes no record until it is
//!   reactivated, and a deleted one never writes again (it can still be linked to).
//! - Bounded: at most `MAX_EVENTS` events, `MAX_ACCOUNTS` accounts and `MAX_POSTS` older posts;
//!   memory is three fixed rings of recent records and accounts, two bits per account and one
//!   line buffer, whatever the size.

use backlinks::index::splitmix64;
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

const MAX_EVENTS: u64 = 1_000_000_000;
const MAX_ACCOUNTS: u64 = 100_000_000;
const MAX_POSTS: u64 = 1_000_000_000;
/// Events written when neither `--events` nor `--links` is given.
const DEFAULT_EVENTS: u64 = 1_000_000;
/// Recent records kept for deletes and updates, and recent posts kept as targets.
const RECENT_RECORDS: usize = 1 << 20;
const RECENT_POSTS: usize = 1 << 16;
/// Share of post targets (likes, reposts, replies, quotes) drawn from posts made during the stream.
const RECENT_TARGET_PERCENT: u64 = 35;
/// The stream starts at the time of the real capture in tests/data/jetstream (May 2026).
const START_US: u64 = 1_779_719_009_000_000;
/// Draws of an author before one that is deactivated or deleted is taken anyway (never needed at
/// the mix's rates: a few thousand accounts per million leave).
const AUTHOR_DRAWS: usize = 64;
/// Older posts are spaced this far apart before the start.
const OLD_POST_SPACING_US: u64 = 1_500_000;
/// Zipf exponent of account activity (how unevenly accounts write).
const ACTIVITY_ZIPF: f64 = 0.7;
/// Zipf exponent of account popularity (follows, blocks, mentions).
const POPULARITY_ZIPF: f64 = 1.0;

#[derive(Parser, Debug)]
#[command(name = "backlinks-workload", about = "Write a seeded, network-shaped Jetstream v1 JSON-lines workload")]
struct Args {
    /// Seed of the generator: the same flags give the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many events.
    #[arg(long)]
    events: Option<u64>,
    /// Stop once the records written hold this many backlinks.
    #[arg(long)]
    links: Option<u64>,
    /// Accounts that write and are linked to (default: a tenth of the size, at least 1,000).
    #[arg(long)]
    accounts: Option<u64>,
    /// Posts from before the stream that links may target (default: a quarter of the size).
    #[arg(long)]
    posts: Option<u64>,
    /// Zipf exponent of post popularity.
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Output file (default: standard output).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// The sizes the generator runs with, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shape {
    seed: u64,
    max_events: u64,
    max_links: u64,
    accounts: u64,
    posts: u64,
    post_zipf: f64,
}

impl Shape {
    fn from_args(args: &Args) -> Result<Self, String> {
        let size = args.events.or(args.links).unwrap_or(DEFAULT_EVENTS);
        let shape = Shape {
            seed: args.seed,
            max_events: args.events.unwrap_or(if args.links.is_some() { MAX_EVENTS } else { DEFAULT_EVENTS }),
            max_links: args.links.unwrap_or(u64::MAX),
            accounts: args.accounts.unwrap_or((size / 10).max(1_000)),
            posts: args.posts.unwrap_or((size / 4).max(1_000)),
            post_zipf: args.zipf,
        };
        shape.validate()?;
        Ok(shape)
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_EVENTS).contains(&self.max_events) {
            return Err(format!("--events must be 1..={MAX_EVENTS}"));
        }
        if !(2..=MAX_ACCOUNTS).contains(&self.accounts) {
            return Err(format!("--accounts must be 2..={MAX_ACCOUNTS}"));
        }
        if !(1..=MAX_POSTS).contains(&self.posts) {
            return Err(format!("--posts must be 1..={MAX_POSTS}"));
        }
        if !(0.0..=3.0).contains(&self.post_zipf) {
            return Err("--zipf must be between 0 and 3".into());
        }
        Ok(())
    }
}

/// Samples ranks `0..n` with probability about proportional to `1 / (rank + 1)^s`, by inverting the
/// continuous power law (one `exp`/`powf` per draw, no table).
#[derive(Debug, Clone, Copy)]
struct Zipf {
    n: u64,
    s: f64,
    /// `ln(n + 1)` when `s == 1`, else `(n + 1)^(1 - s) - 1`.
    span: f64,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let top = (n + 1) as f64;
        let span = if s == 1.0 { top.ln() } else { top.powf(1.0 - s) - 1.0 };
        Zipf { n, s, span }
    }

    /// The rank for a uniform `u` in `[0, 1)`.
    fn rank(&self, u: f64) -> u64 {
        let x = if self.s == 1.0 { (u * self.span).exp() } else { (u * self.span + 1.0).powf(1.0 / (1.0 - self.s)) };
        (x as u64).saturating_sub(1).min(self.n - 1)
    }
}

/// The collections the generator writes (the `u8` keeps the recent-record ring small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collection {
    Like,
    Post,
    Repost,
    Follow,
    Block,
}

impl Collection {
    fn nsid(self) -> &'static str {
        match self {
            Collection::Like => "app.bsky.feed.like",
            Collection::Post => "app.bsky.feed.post",
            Collection::Repost => "app.bsky.feed.repost",
            Collection::Follow => "app.bsky.graph.follow",
            Collection::Block => "app.bsky.graph.block",
        }
    }
}

/// What one event is; `MIX` gives each kind's share of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create(Collection),
    Profile,
    Delete,
    Update,
    Deactivate,
    Reactivate,
    DeleteAccount,
    Identity,
}

/// Shares in basis points (they sum to 10,000), after public Jetstream statistics.
const MIX: [(Kind, u32); 12] = [
    (Kind::Create(Collection::Like), 5_900),
    (Kind::Create(Collection::Post), 1_300),
    (Kind::Create(Collection::Follow), 1_100),
    (Kind::Create(Collection::Repost), 850),
    (Kind::Delete, 500),
    (Kind::Create(Collection::Block), 120),
    (Kind::Profile, 80),
    (Kind::Identity, 65),
    (Kind::Update, 50),
    (Kind::Deactivate, 20),
    (Kind::Reactivate, 10),
    (Kind::DeleteAccount, 5),
];

/// A record written earlier: who wrote it, where, and its TID record key.
#[derive(Debug, Clone, Copy)]
struct Written {
    author: u64,
    collection: Collection,
    rkey: u64,
}

/// A fixed-size ring that overwrites its oldest item.
struct Ring<T> {
    items: Vec<T>,
    capacity: usize,
    next: usize,
}

impl<T: Copy> Ring<T> {
    fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a ring needs room");
        Ring { items: Vec::with_capacity(capacity.min(1 << 16)), capacity, next: 0 }
    }

    fn push(&mut self, item: T) {
        if self.items.len() < self.capacity {
            self.items.push(item);
        } else {
            self.items[self.next] = item;
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// The item at `draw` modulo the filled length, if any.
    fn pick(&self, draw: u64) -> Option<T> {
        (!self.items.is_empty()).then(|| self.items[(draw % self.items.len() as u64) as usize])
    }
}

/// Which accounts may write: a bit set of deactivated accounts and one of deleted accounts, and
/// the recently deactivated ones, from which reactivations are drawn.
struct Standing {
    deactivated: Vec<u64>,
    deleted: Vec<u64>,
    recently_deactivated: Ring<u64>,
}

impl Standing {
    fn new(accounts: u64) -> Self {
        let words = accounts.div_ceil(64) as usize;
        Standing { deactivated: vec![0; words], deleted: vec![0; words], recently_deactivated: Ring::new(RECENT_POSTS) }
    }

    fn bit(set: &[u64], account: u64) -> bool {
        set[(account / 64) as usize] & (1 << (account % 64)) != 0
    }

    fn set(set: &mut [u64], account: u64, on: bool) {
        let word = &mut set[(account / 64) as usize];
        *word = if on { *word | 1 << (account % 64) } else { *word & !(1 << (account % 64)) };
    }

    fn may_write(&self, account: u64) -> bool {
        !self.is_deactivated(account) && !Self::bit(&self.deleted, account)
    }

    fn is_deactivated(&self, account: u64) -> bool {
        Self::bit(&self.deactivated, account)
    }

    fn deactivate(&mut self, account: u64) {
        Self::set(&mut self.deactivated, account, true);
        self.recently_deactivated.push(account);
    }

    fn reactivate(&mut self, account: u64) {
        Self::set(&mut self.deactivated, account, false);
    }

    fn delete(&mut self, account: u64) {
        Self::set(&mut self.deleted, account, true);
    }
}

/// Counts of what was written, for the summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counts {
    events: u64,
    links: u64,
    bytes: u64,
    likes: u64,
    posts: u64,
    replies: u64,
    quotes: u64,
    mentions: u64,
    reposts: u64,
    follows: u64,
    blocks: u64,
    profiles: u64,
    deletes: u64,
    updates: u64,
    account_events: u64,
    identity_events: u64,
}

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
const TID_ALPHABET: &[u8; 32] = backlinks::model::tid::TID_ALPHABET;
const WORDS: [&str; 32] = [
    "the", "a", "today", "just", "posted", "new", "art", "love", "this", "thread", "why", "is", "everyone", "so",
    "good", "morning", "coffee", "cat", "dog", "rain", "music", "book", "game", "night", "friends", "wow", "lol",
    "really", "think", "about", "ok", "🔥",
];

struct Generator {
    shape: Shape,
    rng: u64,
    time_us: u64,
    seq: u64,
    post_popularity: Zipf,
    account_popularity: Zipf,
    activity: Zipf,
    recent_records: Ring<Written>,
    recent_posts: Ring<(u64, u64)>,
    standing: Standing,
    counts: Counts,
    line: Vec<u8>,
}

impl Generator {
    fn new(shape: Shape) -> Self {
        Generator {
            shape,
            rng: shape.seed,
            time_us: START_US,
            seq: 30_000_000_000,
            post_popularity: Zipf::new(shape.posts, shape.post_zipf),
            account_popularity: Zipf::new(shape.accounts, POPULARITY_ZIPF),
            activity: Zipf::new(shape.accounts, ACTIVITY_ZIPF),
            recent_records: Ring::new(RECENT_RECORDS),
            recent_posts: Ring::new(RECENT_POSTS),
            standing: Standing::new(shape.accounts),
            counts: Counts::default(),
            line: Vec::with_capacity(4096),
        }
    }

    fn next(&mut self) -> u64 {
        splitmix64(&mut self.rng)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Writes events until either bound is reached; returns the counts.
    fn run(mut self, out: &mut impl Write) -> std::io::Result<Counts> {
        while self.counts.events < self.shape.max_events && self.counts.links < self.shape.max_links {
            self.line.clear();
            self.time_us += 200 + self.below(600);
            let kind = self.pick_kind();
            self.counts.links += self.write_event(kind);
            self.line.push(b'\n');
            out.write_all(&self.line)?;
            self.counts.events += 1;
            self.counts.bytes += self.line.len() as u64;
        }
        out.flush()?;
        Ok(self.counts)
    }

    fn pick_kind(&mut self) -> Kind {
        let mut draw = self.below(10_000) as u32;
        for (kind, share) in MIX {
            if draw < share {
                return kind;
            }
            draw -= share;
        }
        unreachable!("MIX sums to 10,000")
    }

    /// Writes one event into `line`; returns the backlinks its record holds.
    fn write_event(&mut self, kind: Kind) -> u64 {
        match kind {
            Kind::Create(collection) => self.create(collection),
            Kind::Profile => self.profile_update(),
            Kind::Delete => self.delete(),
            Kind::Update => self.update(),
            Kind::Deactivate => self.deactivate(),
            Kind::Reactivate => self.reactivate(),
            Kind::DeleteAccount => self.delete_account(),
            Kind::Identity => self.identity(),
        }
    }

    /// An account that may write: Zipf over accounts, scrambled so the busiest are not the most
    /// followed, drawn again (a bounded number of times) while deactivated or deleted.
    fn author(&mut self) -> u64 {
        let mut account = self.any_author();
        for _ in 0..AUTHOR_DRAWS {
            if self.standing.may_write(account) {
                break;
            }
            account = self.any_author();
        }
        account
    }

    fn any_author(&mut self) -> u64 {
        let u = self.uniform();
        let rank = self.activity.rank(u);
        (rank.wrapping_mul(2_654_435_761)) % self.shape.accounts
    }

    fn popular_account(&mut self) -> u64 {
        let u = self.uniform();
        self.account_popularity.rank(u)
    }

    /// A post to link to: (author, TID) of a Zipf-popular older post or a recent one.
    fn target_post(&mut self) -> (u64, u64) {
        if self.percent(RECENT_TARGET_PERCENT) {
            let draw = self.next();
            if let Some(post) = self.recent_posts.pick(draw) {
                return post;
            }
        }
        let u = self.uniform();
        let rank = self.post_popularity.rank(u);
        self.old_post(rank)
    }

    /// Older post `index` (0 is the newest): a fixed author and TID derived from the index.
    fn old_post(&self, index: u64) -> (u64, u64) {
        let mut state = index ^ self.shape.seed.rotate_left(17);
        let author = splitmix64(&mut state) % self.shape.accounts;
        let micros = START_US - (index + 1) * OLD_POST_SPACING_US;
        (author, record_tid(micros, splitmix64(&mut state)))
    }

    /// A new record key: a TID a little before the event time.
    fn new_rkey(&mut self) -> u64 {
        let lag = self.below(2_000_000);
        let draw = self.next();
        record_tid(self.time_us - lag, draw)
    }

    fn create(&mut self, collection: Collection) -> u64 {
        let author = self.author();
        let rkey = self.new_rkey();
        self.commit_head(author, "create", collection.nsid(), Some(rkey));
        let links = self.record(collection, author);
        self.commit_tail();
        self.recent_records.push(Written { author, collection, rkey });
        if collection == Collection::Post {
            self.recent_posts.push((author, rkey));
        }
        links
    }

    /// The record of `collection`, written after `"record":`; returns its backlinks.
    fn record(&mut self, collection: Collection, author: u64) -> u64 {
        match collection {
            Collection::Like => self.subject_record(Collection::Like, &mut |c| c.counts.likes += 1),
            Collection::Repost => self.subject_record(Collection::Repost, &mut |c| c.counts.reposts += 1),
            Collection::Follow => self.did_subject_record(Collection::Follow, &mut |c| c.counts.follows += 1),
            Collection::Block => self.did_subject_record(Collection::Block, &mut |c| c.counts.blocks += 1),
            Collection::Post => self.post_record(author),
        }
    }

    fn subject_record(&mut self, collection: Collection, count: &mut dyn FnMut(&mut Self)) -> u64 {
        count(self);
        self.type_and_created(collection.nsid());
        self.push(",\"subject\":");
        let (author, rkey) = self.target_post();
        self.strong_ref(author, rkey);
        self.push("}");
        1
    }

    fn did_subject_record(&mut self, collection: Collection, count: &mut dyn FnMut(&mut Self)) -> u64 {
        count(self);
        self.type_and_created(collection.nsid());
        self.push(",\"subject\":\"");
        let subject = self.popular_account();
        self.did(subject);
        self.push("\"}");
        1
    }

    /// A post: keys in DAG-CBOR order ($type, createdAt, embed, facets, langs, reply, text).
    fn post_record(&mut self, author: u64) -> u64 {
        self.counts.posts += 1;
        self.type_and_created("app.bsky.feed.post");
        let mut links = self.post_embed();
        links += self.post_facets(author);
        self.push(",\"langs\":[\"en\"]");
        if self.percent(45) {
            self.counts.replies += 1;
            let parent = self.target_post();
            let root = if self.percent(50) { parent } else { self.target_post() };
            self.push(",\"reply\":{\"parent\":");
            self.strong_ref(parent.0, parent.1);
            self.push(",\"root\":");
            self.strong_ref(root.0, root.1);
            self.push("}");
            links += 2;
        }
        self.push(",\"text\":\"");
        self.text(3, 30);
        self.push("\"}");
        links
    }

    /// Quotes (`embed.record`, or `embed.record.record` with media), images or a link card.
    fn post_embed(&mut self) -> u64 {
        match self.below(100) {
            0..=5 => {
                self.counts.quotes += 1;
                self.push(",\"embed\":{\"$type\":\"app.bsky.embed.record\",\"record\":");
                let (author, rkey) = self.target_post();
                self.strong_ref(author, rkey);
                self.push("}");
                1
            }
            6..=7 => {
                self.counts.quotes += 1;
                self.push(",\"embed\":{\"$type\":\"app.bsky.embed.recordWithMedia\",\"media\":");
                self.images();
                self.push(",\"record\":{\"$type\":\"app.bsky.embed.record\",\"record\":");
                let (author, rkey) = self.target_post();
                self.strong_ref(author, rkey);
                self.push("}}");
                1
            }
            8..=32 => {
                self.push(",\"embed\":");
                self.images();
                0
            }
            33..=40 => {
                self.push(",\"embed\":{\"$type\":\"app.bsky.embed.external\",\"external\":{\"description\":\"");
                self.text(2, 12);
                self.push("\",\"title\":\"");
                self.text(1, 6);
                self.push("\",\"uri\":\"https://example.com/");
                let page = self.below(1_000_000);
                self.number(page);
                self.push("\"}}");
                0
            }
            _ => 0,
        }
    }

    /// Mention facets (1..=3 distinct accounts other than the author) in 12 % of posts, link
    /// facets (no backlink) in 5 %.
    fn post_facets(&mut self, author: u64) -> u64 {
        let draw = self.below(100);
        if draw >= 17 {
            return 0;
        }
        self.push(",\"facets\":[");
        if draw >= 12 {
            self.push("{\"$type\":\"app.bsky.richtext.facet\",\"features\":[{\"$type\":\"app.bsky.richtext.facet#link\",\"uri\":\"https://example.org/a\"}],\"index\":{\"byteEnd\":20,\"byteStart\":0}}]");
            return 0;
        }
        let wanted = 1 + self.below(3);
        let mut mentioned: Vec<u64> = Vec::with_capacity(3);
        while (mentioned.len() as u64) < wanted {
            let account = self.popular_account();
            if account != author && !mentioned.contains(&account) {
                mentioned.push(account);
            }
        }
        for (i, account) in mentioned.iter().enumerate() {
            if i > 0 {
                self.push(",");
            }
            self.push("{\"$type\":\"app.bsky.richtext.facet\",\"features\":[{\"$type\":\"app.bsky.richtext.facet#mention\",\"did\":\"");
            self.did(*account);
            self.push("\"}],\"index\":{\"byteEnd\":");
            self.number(i as u64 * 20 + 18);
            self.push(",\"byteStart\":");
            self.number(i as u64 * 20);
            self.push("}}");
        }
        self.push("]");
        self.counts.mentions += mentioned.len() as u64;
        mentioned.len() as u64
    }

    fn images(&mut self) {
        self.push("{\"$type\":\"app.bsky.embed.images\",\"images\":[{\"alt\":\"\",\"aspectRatio\":{\"height\":1080,\"width\":1920},\"image\":{\"$type\":\"blob\",\"ref\":{\"$link\":\"");
        self.cid("bafkrei");
        self.push("\"},\"mimeType\":\"image/jpeg\",\"size\":");
        let size = 20_000 + self.below(900_000);
        self.number(size);
        self.push("}}]}");
    }

    /// A profile update (`self`), with a pinned post of the author's in 40 % of them.
    fn profile_update(&mut self) -> u64 {
        self.counts.profiles += 1;
        self.counts.updates += 1;
        let author = self.author();
        self.commit_head(author, "update", "app.bsky.actor.profile", None);
        self.push("{\"$type\":\"app.bsky.actor.profile\",\"avatar\":{\"$type\":\"blob\",\"ref\":{\"$link\":\"");
        self.cid("bafkrei");
        self.push("\"},\"mimeType\":\"image/jpeg\",\"size\":720303},\"createdAt\":\"");
        let created = self.time_us - 86_400_000_000;
        self.datetime(created);
        self.push("\",\"description\":\"");
        self.text(4, 20);
        self.push("\",\"displayName\":\"");
        self.text(1, 3);
        self.push("\"");
        let pinned = self.percent(40);
        if pinned {
            self.push(",\"pinnedPost\":");
            let rkey = self.new_rkey();
            self.strong_ref(author, rkey);
        }
        self.push("}");
        self.commit_tail();
        u64::from(pinned)
    }

    /// A recently written record whose author may still write.
    fn recent_record(&mut self) -> Option<Written> {
        let draw = self.next();
        self.recent_records.pick(draw).filter(|record| self.standing.may_write(record.author))
    }

    /// Deletes a recently written record (by its author).
    fn delete(&mut self) -> u64 {
        let Some(record) = self.recent_record() else { return self.create(Collection::Like) };
        self.counts.deletes += 1;
        self.commit_head(record.author, "delete", record.collection.nsid(), Some(record.rkey));
        self.push("}}");
        0
    }

    /// Rewrites a recently written record with new contents (new targets).
    fn update(&mut self) -> u64 {
        let Some(record) = self.recent_record() else { return self.create(Collection::Like) };
        self.counts.updates += 1;
        self.commit_head(record.author, "update", record.collection.nsid(), Some(record.rkey));
        let links = self.record(record.collection, record.author);
        self.commit_tail();
        links
    }

    fn deactivate(&mut self) -> u64 {
        let account = self.author();
        self.standing.deactivate(account);
        self.account(account, Some("deactivated"))
    }

    /// Reactivates a recently deactivated account (or, when there is none, says again that a
    /// writing account is active, as PDSs do).
    fn reactivate(&mut self) -> u64 {
        let draw = self.next();
        let account = match self.standing.recently_deactivated.pick(draw) {
            Some(account) if self.standing.is_deactivated(account) => account,
            _ => self.author(),
        };
        self.standing.reactivate(account);
        self.account(account, None)
    }

    fn delete_account(&mut self) -> u64 {
        let account = self.author();
        self.standing.delete(account);
        self.account(account, Some("deleted"))
    }

    /// An `#account` event: deactivated or deleted (`status`), or active again (`None`).
    fn account(&mut self, account: u64, status: Option<&str>) -> u64 {
        self.counts.account_events += 1;
        self.event_head(account, "account");
        self.push("\"account\":{\"active\":");
        self.push(if status.is_some() { "false" } else { "true" });
        self.push(",\"did\":\"");
        self.did(account);
        self.push("\",\"seq\":");
        self.seq_and_time();
        if let Some(status) = status {
            self.push(",\"status\":\"");
            self.push(status);
            self.push("\"");
        }
        self.push("}}");
        0
    }

    fn identity(&mut self) -> u64 {
        self.counts.identity_events += 1;
        let account = self.author();
        self.event_head(account, "identity");
        self.push("\"identity\":{\"did\":\"");
        self.did(account);
        self.push("\",\"handle\":\"u");
        self.number(account);
        self.push(".bsky.social\",\"seq\":");
        self.seq_and_time();
        self.push("}}");
        0
    }

    fn seq_and_time(&mut self) {
        self.seq += 1;
        self.number(self.seq);
        self.push(",\"time\":\"");
        self.datetime(self.time_us);
        self.push("\"");
    }

    /// `{"did":"…","time_us":…,"kind":"KIND",` (the caller writes the kind's object).
    fn event_head(&mut self, account: u64, kind: &str) {
        self.push("{\"did\":\"");
        self.did(account);
        self.push("\",\"time_us\":");
        self.number(self.time_us);
        self.push(",\"kind\":\"");
        self.push(kind);
        self.push("\",");
    }

    /// A commit up to `"record":` (or up to the rkey for a delete, whose caller closes it).
    fn commit_head(&mut self, author: u64, operation: &str, collection: &str, rkey: Option<u64>) {
        self.event_head(author, "commit");
        self.push("\"commit\":{\"rev\":\"");
        let draw = self.next();
        let rev = record_tid(self.time_us, draw);
        self.tid(rev);
        self.push("\",\"operation\":\"");
        self.push(operation);
        self.push("\",\"collection\":\"");
        self.push(collection);
        self.push("\",\"rkey\":\"");
        match rkey {
            Some(rkey) => self.tid(rkey),
            None => self.push("self"),
        }
        self.push("\"");
        if operation != "delete" {
            self.push(",\"record\":");
        }
    }

    /// After the record: the commit's CID, then the closing braces.
    fn commit_tail(&mut self) {
        self.push(",\"cid\":\"");
        self.cid("bafyrei");
        self.push("\"}}");
    }

    fn type_and_created(&mut self, nsid: &str) {
        self.push("{\"$type\":\"");
        self.push(nsid);
        self.push("\",\"createdAt\":\"");
        let created = self.time_us - self.below(3_000_000);
        self.datetime(created);
        self.push("\"");
    }

    /// `{"cid":"…","uri":"at://DID/app.bsky.feed.post/RKEY"}`
    fn strong_ref(&mut self, author: u64, rkey: u64) {
        self.push("{\"cid\":\"");
        self.cid("bafyrei");
        self.push("\",\"uri\":\"at://");
        self.did(author);
        self.push("/app.bsky.feed.post/");
        self.tid(rkey);
        self.push("\"}");
    }

    fn push(&mut self, text: &str) {
        self.line.extend_from_slice(text.as_bytes());
    }

    fn number(&mut self, mut value: u64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.line.extend_from_slice(&digits[at..]);
    }

    /// `did:plc:` and 24 base32 characters derived from the account number (and the seed).
    fn did(&mut self, account: u64) {
        let mut state = account ^ self.shape.seed.rotate_left(29);
        self.push("did:plc:");
        for _ in 0..2 {
            let bits = splitmix64(&mut state);
            self.line.extend((0..12).map(|i| BASE32[((bits >> (i * 5)) & 31) as usize]));
        }
    }

    fn tid(&mut self, value: u64) {
        self.line.extend((0..13).rev().map(|i| TID_ALPHABET[((value >> (i * 5)) & 31) as usize]));
    }

    /// A CIDv1-looking string: the prefix and base32 characters up to 59 in all.
    fn cid(&mut self, prefix: &str) {
        self.push(prefix);
        let mut left = 59 - prefix.len();
        while left > 0 {
            let bits = self.next();
            let take = left.min(12);
            self.line.extend((0..take).map(|i| BASE32[((bits >> (i * 5)) & 31) as usize]));
            left -= take;
        }
    }

    fn text(&mut self, min_words: u64, max_words: u64) {
        let words = min_words + self.below(max_words - min_words + 1);
        for i in 0..words {
            if i > 0 {
                self.push(" ");
            }
            let word = WORDS[self.below(WORDS.len() as u64) as usize];
            self.push(word);
        }
    }

    /// RFC 3339 UTC with milliseconds, as atproto records carry it.
    fn datetime(&mut self, micros: u64) {
        let text = format_datetime(micros);
        self.line.extend_from_slice(&text);
    }
}

/// A TID made at `micros` as the real network makes them, from a random draw. The reference PDS
/// takes a millisecond clock times 1,000 plus a counter of TIDs in that millisecond (nearly
/// always 0), and one clock id of 32 picked when it starts: of the 377 distinct TIDs in the
/// at:// links of the real CAR fixtures, 273 have microsecond digits below 10 and 371 a clock id
/// below 32. So 3 in 4 draws here are whole milliseconds, the rest any microsecond, and 63 in 64
/// take a clock id below 32, the rest any of the 1,024.
fn record_tid(micros: u64, draw: u64) -> u64 {
    let micros = if draw.is_multiple_of(4) { micros } else { micros - micros % 1_000 };
    let clock = if (draw >> 2).is_multiple_of(64) { draw >> 8 } else { (draw >> 8) & 31 };
    tid(micros, clock)
}

/// A TID from a microsecond time and a 10-bit clock id.
fn tid(micros: u64, clock: u64) -> u64 {
    ((micros << 10) | (clock & 0x3ff)) & !backlinks::model::tid::TID_TOP_BIT
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of a Unix time in microseconds, written digit by digit (no
/// allocation: the generator writes millions of them).
fn format_datetime(micros: u64) -> [u8; 24] {
    let millis = micros / 1_000;
    let (days, ms_of_day) = (millis / 86_400_000, millis % 86_400_000);
    let (year, month, day) = backlinks::ingest::frames::civil_from_days(days as i64);
    let fields = [
        (year as u64, 4),
        (month as u64, 2),
        (day as u64, 2),
        (ms_of_day / 3_600_000, 2),
        (ms_of_day / 60_000 % 60, 2),
        (ms_of_day / 1_000 % 60, 2),
        (ms_of_day % 1_000, 3),
    ];
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let starts = [0, 5, 8, 11, 14, 17, 20];
    for ((value, width), start) in fields.into_iter().zip(starts) {
        let mut value = value;
        for position in (start..start + width).rev() {
            out[position] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    out
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let shape = match Shape::from_args(&args) {
        Ok(shape) => shape,
        Err(message) => {
            eprintln!("backlinks-workload: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    match write_workload(shape, args.out.as_ref()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("backlinks-workload: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the generator into the file (or stdout) and prints a JSON summary on stderr.
fn write_workload(shape: Shape, out: Option<&PathBuf>) -> std::io::Result<()> {
    let started = Instant::now();
    let counts = match out {
        Some(path) => {
            Generator::new(shape).run(&mut std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?))?
        }
        None => Generator::new(shape).run(&mut std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock()))?,
    };
    let summary = serde_json::json!({
        "seed": shape.seed, "accounts": shape.accounts, "posts": shape.posts, "zipf": shape.post_zipf,
        "events": counts.events, "links": counts.links, "bytes": counts.bytes,
        "seconds": started.elapsed().as_secs_f64(),
        "likes": counts.likes, "posts_written": counts.posts, "replies": counts.replies, "quotes": counts.quotes,
        "mentions": counts.mentions, "reposts": counts.reposts, "follows": counts.follows, "blocks": counts.blocks,
        "profiles": counts.profiles, "deletes": counts.deletes, "updates": counts.updates,
        "account_events": counts.account_events, "identity_events": counts.identity_events,
    });
    eprintln!("{summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use backlinks::extract::{ExtractLimits, extract_links};
    use backlinks::ingest::jetstream::{Operation, parse_event};
    use std::collections::HashSet;

    fn shape(seed: u64, events: u64) -> Shape {
        Shape { seed, max_events: events, max_links: u64::MAX, accounts: 5_000, posts: 2_000, post_zipf: 1.0 }
    }

    fn generate(shape: Shape) -> (Vec<u8>, Counts) {
        let mut out = Vec::new();
        let counts = Generator::new(shape).run(&mut out).unwrap();
        (out, counts)
    }

    #[test]
    fn every_line_is_an_event_the_importer_applies_with_the_counted_links() {
        let (out, counts) = generate(shape(3, 20_000));
        let mut links = 0u64;
        let mut operations = [0u64; 5];
        for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let event = parse_event(line).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(line)));
            let slot = match &event.operation {
                Operation::Create(op) | Operation::Update(op) => {
                    links += extract_links(&op.record, &ExtractLimits::default()).links.len() as u64;
                    usize::from(matches!(event.operation, Operation::Update(_)))
                }
                Operation::Delete(_) => 2,
                Operation::Account { .. } => 3,
                Operation::Skip => 4,
            };
            operations[slot] += 1;
        }
        assert_eq!(counts.events, 20_000);
        assert_eq!(links, counts.links, "the summary counts exactly the links the extractor finds");
        assert_eq!(operations.iter().sum::<u64>(), 20_000);
        assert_eq!(operations[1], counts.updates);
        assert_eq!(operations[2], counts.deletes);
        assert_eq!(operations[3], counts.account_events);
        assert_eq!(operations[4], counts.identity_events);
        // The mix: likes 59 % and deletes 5 % (of 20,000 draws, within a few standard deviations).
        assert!((11_500..12_100).contains(&counts.likes), "likes {}", counts.likes);
        assert!((900..1_100).contains(&counts.deletes), "deletes {}", counts.deletes);
        assert!(counts.replies > 0 && counts.quotes > 0 && counts.mentions > 0 && counts.blocks > 0);
    }

    #[test]
    fn deactivated_and_deleted_accounts_write_nothing() {
        let (out, _) = generate(Shape { accounts: 300, ..shape(5, 60_000) });
        let (mut deactivated, mut deleted) = (HashSet::new(), HashSet::new());
        let (mut deactivations, mut reactivations, mut commits) = (0, 0, 0);
        for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let did = match parse_event(line).unwrap().operation {
                Operation::Account { did, active, status } => {
                    let did = did.into_owned();
                    match (active, status.as_deref()) {
                        (false, Some("deleted")) => deleted.insert(did),
                        (false, _) => {
                            deactivations += 1;
                            deactivated.insert(did)
                        }
                        (true, _) => {
                            reactivations += usize::from(deactivated.contains(&did));
                            deactivated.remove(&did)
                        }
                    };
                    continue;
                }
                Operation::Create(op) | Operation::Update(op) => op.record_ref.did.into_owned(),
                Operation::Delete(record_ref) => record_ref.did.into_owned(),
                Operation::Skip => continue,
            };
            commits += 1;
            assert!(!deleted.contains(&did), "a deleted account wrote: {}", String::from_utf8_lossy(line));
            assert!(!deactivated.contains(&did), "a deactivated account wrote: {}", String::from_utf8_lossy(line));
        }
        // 60,000 events: about 30 deletions, 120 deactivations and 60 reactivations of 300 accounts.
        assert!(
            deleted.len() >= 10 && deactivations >= 60 && reactivations >= 20,
            "{deleted:?} {deactivations} {reactivations}"
        );
        assert!(commits > 55_000, "{commits} commits");
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_seed_others() {
        let (a, _) = generate(shape(7, 2_000));
        let (b, _) = generate(shape(7, 2_000));
        let (c, _) = generate(shape(8, 2_000));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_link_bound_stops_the_stream() {
        let (_, counts) = generate(Shape { max_events: MAX_EVENTS, max_links: 5_000, ..shape(1, 0) });
        assert!((5_000..5_010).contains(&counts.links), "stopped at {} links", counts.links);
    }

    #[test]
    fn tids_match_the_crate_encoding() {
        for value in [0, 1, 31, 0x194a_947d_4aac_b00c, tid(START_US, 1023)] {
            let mut generator = Generator::new(shape(1, 1));
            generator.tid(value);
            assert_eq!(generator.line, backlinks::model::tid::format_tid(value).into_bytes());
        }
    }

    #[test]
    fn record_tids_are_spread_like_the_real_ones() {
        let mut state = 3;
        let micros = START_US + 123_456;
        let tids: Vec<u64> = (0..10_000).map(|_| record_tid(micros, splitmix64(&mut state))).collect();
        let whole_millis = tids.iter().filter(|&&t| (t >> 10) == micros - 456).count();
        let exact = tids.iter().filter(|&&t| (t >> 10) == micros).count();
        let small_clock = tids.iter().filter(|&&t| t & 0x3ff < 32).count();
        assert_eq!(whole_millis + exact, tids.len(), "only these two times");
        assert!((7_300..7_700).contains(&whole_millis), "{whole_millis} whole milliseconds");
        assert!((9_780..9_920).contains(&small_clock), "{small_clock} clock ids below 32");
        assert!(tids.iter().any(|&t| t & 0x3ff >= 512), "the other clock ids are drawn too");
    }

    #[test]
    fn datetimes_are_rfc3339_utc() {
        assert_eq!(&format_datetime(0), b"1970-01-01T00:00:00.000Z");
        assert_eq!(&format_datetime(1_779_719_008_778_123), b"2026-05-25T14:23:28.778Z");
        assert_eq!(&format_datetime(951_782_400_000_000), b"2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn zipf_ranks_are_in_range_and_skewed() {
        let zipf = Zipf::new(1_000, 1.0);
        assert_eq!(zipf.rank(0.0), 0);
        assert_eq!(zipf.rank(0.999_999_999), 999);
        let mut state = 5;
        let draws: Vec<u64> =
            (0..10_000).map(|_| zipf.rank((splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64)).collect();
        let top_ten = draws.iter().filter(|&&r| r < 10).count();
        // P(rank < 10) = ln(11) / ln(1001), about 35 %.
        assert!((3_200..3_750).contains(&top_ten), "top ten drew {top_ten}");
        let flatter = Zipf::new(1_000, 0.5);
        assert!(flatter.rank(0.5) > zipf.rank(0.5));
    }

    #[test]
    fn bad_sizes_are_refused() {
        let args = |events: Option<u64>, accounts: Option<u64>| Args {
            seed: 1,
            events,
            links: None,
            accounts,
            posts: None,
            zipf: 1.0,
            out: None,
        };
        assert!(Shape::from_args(&args(Some(0), None)).is_err());
        assert!(Shape::from_args(&args(Some(MAX_EVENTS + 1), None)).is_err());
        assert!(Shape::from_args(&args(None, Some(1))).is_err());
        assert_eq!(Shape::from_args(&args(None, None)).unwrap().max_events, DEFAULT_EVENTS);
    }
}
