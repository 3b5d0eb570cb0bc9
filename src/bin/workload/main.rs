//! `backlinks-workload`: writes a seeded stream of Jetstream v1 JSON lines shaped like the real
//! network, for `backlinks import` benchmarks (`scripts/bench.sh`).
//!
//! The mix follows the public firehose: mostly likes, then posts (replies with root and parent
//! strong references, quotes via `embed.record`, mentions and web links via facets, images, and
//! link cards to web pages), follows, reposts, blocks, profile updates (some with a pinned post), a few
//! percent deletes and record updates, account deactivations, reactivations and deletions, and
//! identity events. Liked, reposted, replied and quoted posts, followed, blocked and mentioned
//! accounts and linked pages are Zipf-popular; record keys are TIDs of the event time, like the real ones.
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
//! - A like, repost, follow or block is its author's first of that subject (`pairs`), as on the
//!   network, unless a small workload runs out of subjects (counted: `repeated_pairs`).
//! - Bounded: at most `MAX_EVENTS` events, `MAX_ACCOUNTS` accounts and `MAX_POSTS` older posts;
//!   memory is three fixed rings of recent records and accounts, two bits per account, the
//!   pairs' filter (at most 512 MiB) and one line buffer, whatever the size.

mod generator;
mod pairs;
#[cfg(test)]
mod tests;

use backlinks::base::rng::splitmix64;
use clap::Parser;
use generator::Generator;
use pairs::Pairs;
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
/// Draws of a like's, repost's, follow's or block's subject before one its author already gave
/// one is taken anyway (`pairs`).
const PAIR_DRAWS: usize = 16;
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
    /// Links to web pages: link cards and link facets.
    pages: u64,
    reposts: u64,
    follows: u64,
    blocks: u64,
    profiles: u64,
    deletes: u64,
    updates: u64,
    account_events: u64,
    identity_events: u64,
    /// Likes, reposts, follows and blocks that repeat their author's pair: only when
    /// `PAIR_DRAWS` draws found no new subject.
    repeated_pairs: u64,
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
        "mentions": counts.mentions, "pages": counts.pages, "reposts": counts.reposts, "follows": counts.follows, "blocks": counts.blocks,
        "profiles": counts.profiles, "deletes": counts.deletes, "updates": counts.updates,
        "account_events": counts.account_events, "identity_events": counts.identity_events,
        "repeated_pairs": counts.repeated_pairs,
    });
    eprintln!("{summary}");
    Ok(())
}
