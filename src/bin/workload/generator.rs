//! The generator: one seeded stream of events, written as Jetstream v1 JSON lines.

use super::*;

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
const TID_ALPHABET: &[u8; 32] = backlinks::model::tid::TID_ALPHABET;
const WORDS: [&str; 32] = [
    "the", "a", "today", "just", "posted", "new", "art", "love", "this", "thread", "why", "is", "everyone", "so",
    "good", "morning", "coffee", "cat", "dog", "rain", "music", "book", "game", "night", "friends", "wow", "lol",
    "really", "think", "about", "ok", "🔥",
];

pub(crate) struct Generator {
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
    pairs: Pairs,
    counts: Counts,
    pub(crate) line: Vec<u8>,
}

impl Generator {
    pub(crate) fn new(shape: Shape) -> Self {
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
            pairs: Pairs::for_size(shape.max_events.min(shape.max_links)),
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
    pub(crate) fn run(mut self, out: &mut impl Write) -> std::io::Result<Counts> {
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
            Collection::Like => self.subject_record(Collection::Like, author, &mut |c| c.counts.likes += 1),
            Collection::Repost => self.subject_record(Collection::Repost, author, &mut |c| c.counts.reposts += 1),
            Collection::Follow => self.did_subject_record(Collection::Follow, author, &mut |c| c.counts.follows += 1),
            Collection::Block => self.did_subject_record(Collection::Block, author, &mut |c| c.counts.blocks += 1),
            Collection::Post => self.post_record(author),
        }
    }

    fn subject_record(&mut self, collection: Collection, author: u64, count: &mut dyn FnMut(&mut Self)) -> u64 {
        count(self);
        self.type_and_created(collection.nsid());
        self.push(",\"subject\":");
        let (subject_author, rkey) = self.new_pair(collection, author, Self::target_post);
        self.strong_ref(subject_author, rkey);
        self.push("}");
        1
    }

    fn did_subject_record(&mut self, collection: Collection, author: u64, count: &mut dyn FnMut(&mut Self)) -> u64 {
        count(self);
        self.type_and_created(collection.nsid());
        self.push(",\"subject\":\"");
        let (subject, _) = self.new_pair(collection, author, |generator| (generator.popular_account(), 0));
        self.did(subject);
        self.push("\"}");
        1
    }

    /// A subject `author` has not given `collection`'s record to yet, drawn by `draw` at most
    /// `PAIR_DRAWS` times: a small workload may run out of popular subjects, and then its last
    /// draw is taken, counted (or a new pair the filter took for an old one: rarer).
    fn new_pair(&mut self, collection: Collection, author: u64, draw: impl Fn(&mut Self) -> (u64, u64)) -> (u64, u64) {
        let mut subject = draw(self);
        for _ in 1..PAIR_DRAWS {
            if self.pairs.insert(collection as u64, author, subject) {
                return subject;
            }
            subject = draw(self);
        }
        if !self.pairs.insert(collection as u64, author, subject) {
            self.counts.repeated_pairs += 1;
        }
        subject
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
                self.push("\",\"uri\":\"");
                self.page_url();
                self.push("\"}}");
                1
            }
            _ => 0,
        }
    }

    /// A Zipf-popular web page (popular as accounts are: a few pages are shared by many).
    fn page_url(&mut self) {
        self.counts.pages += 1;
        let page = self.popular_account();
        self.push("https://news");
        self.number(page % 1_000);
        self.push(".example/articles/");
        self.number(page);
        self.push("?utm_source=bsky");
    }

    /// Mention facets (1..=3 distinct accounts other than the author) in 12 % of posts, link
    /// facets to a web page in 5 %.
    fn post_facets(&mut self, author: u64) -> u64 {
        let draw = self.below(100);
        if draw >= 17 {
            return 0;
        }
        self.push(",\"facets\":[");
        if draw >= 12 {
            self.push("{\"$type\":\"app.bsky.richtext.facet\",\"features\":[{\"$type\":\"app.bsky.richtext.facet#link\",\"uri\":\"");
            self.page_url();
            self.push("\"}],\"index\":{\"byteEnd\":20,\"byteStart\":0}}]");
            return 1;
        }
        // Other accounts than the author: a workload of two accounts has one to mention.
        let wanted = (1 + self.below(3)).min(self.shape.accounts - 1);
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

    pub(crate) fn tid(&mut self, value: u64) {
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
pub(crate) fn record_tid(micros: u64, draw: u64) -> u64 {
    let micros = if draw.is_multiple_of(4) { micros } else { micros - micros % 1_000 };
    let clock = if (draw >> 2).is_multiple_of(64) { draw >> 8 } else { (draw >> 8) & 31 };
    tid(micros, clock)
}

/// A TID from a microsecond time and a 10-bit clock id.
pub(crate) fn tid(micros: u64, clock: u64) -> u64 {
    ((micros << 10) | (clock & 0x3ff)) & !backlinks::model::tid::TID_TOP_BIT
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of a Unix time in microseconds, written digit by digit (no
/// allocation: the generator writes millions of them).
pub(crate) fn format_datetime(micros: u64) -> [u8; 24] {
    let millis = micros / 1_000;
    let (days, ms_of_day) = (millis / 86_400_000, millis % 86_400_000);
    let (year, month, day) = backlinks::base::dates::civil_from_days(days as i64);
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
