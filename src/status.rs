//! The HTML pages: the status page (`/`), which also documents every endpoint with an example
//! that runs, and the explorer, the result page of its query form (`/ui/backlinks?target=...`):
//! totals by collection and location, the page of sources with their times, each source a link
//! to its own backlinks, and paging, and where live push runs, a button that follows the target
//! live. Plain server-rendered HTML with inline CSS: no external asset, nothing that needs
//! `Accept: text/html`, and no script but the explorer's one constant `LIVE_SCRIPT`, which reads
//! the target from a data attribute (so nothing from the index is ever written into a script).
//!
//! Invariants:
//! - Every string that reaches the page (targets, URIs, locations, messages) goes through
//!   `escape`, so no index content can inject markup; every link built from one is URL-encoded
//!   first.
//! - The examples name records of the Jetstream capture shipped in `tests/data/jetstream` (the
//!   README's first steps import it), so on that index each one answers something.
//! - The facts are gathered by the caller (wall clock and uptime injected), so rendering is a pure
//!   function of its inputs.

use crate::base::dates::format_rfc3339_us;
use crate::count::Count;
use crate::index::Index;
use crate::model::tid::parse_tid;
use crate::query::ListPage;
use std::fmt::Write;
use std::time::Duration;

/// Where the index's data comes from, as the status page reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestMode {
    /// No live ingest: the index holds what `backlinks import` / `backfill` wrote.
    ImportOnly,
    /// A replica serving a bucket that another process writes.
    ReadOnly,
    /// Following a live stream.
    Following { source: String },
}

/// Everything the status page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusFacts {
    pub version: &'static str,
    pub uptime: Duration,
    pub ingest: IngestMode,
    /// How far behind the stream the index is (only while following, once an event arrived).
    pub lag: Option<Duration>,
    pub clock: u64,
    pub tables: u64,
    pub entries: u64,
    /// Bytes of uploaded table files (data and meta), from the catalog.
    pub bucket_bytes: u64,
    pub pending_uploads: u64,
}

impl StatusFacts {
    /// Reads the catalog (blocking: SQLite). `now_us` is the wall clock in microseconds since the
    /// epoch, the unit of the ingest cursor.
    pub fn gather(index: &Index, ingest: IngestMode, uptime: Duration, now_us: i64) -> Result<Self, String> {
        let records = index.catalog.tables().map_err(|e| e.to_string())?;
        let position = index.position();
        let lag = match (&ingest, position.cursor) {
            (IngestMode::Following { .. }, Some(cursor)) => {
                Some(Duration::from_micros(now_us.saturating_sub(cursor).max(0) as u64))
            }
            _ => None,
        };
        let uploaded = records.iter().filter(|r| r.uploaded);
        Ok(StatusFacts {
            version: env!("CARGO_PKG_VERSION"),
            uptime,
            ingest,
            lag,
            clock: position.clock,
            tables: records.len() as u64,
            entries: records.iter().map(|r| r.entries).sum(),
            bucket_bytes: uploaded.map(|r| r.data_len + r.meta_len).sum(),
            pending_uploads: records.iter().filter(|r| !r.uploaded).count() as u64,
        })
    }
}

/// Escapes text for HTML element content and double-quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `3d 04h 05m 06s`, leading zero units left out.
pub fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let (days, hours, minutes, seconds) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m {seconds:02}s"),
        (0, _, _) => format!("{hours}h {minutes:02}m {seconds:02}s"),
        _ => format!("{days}d {hours:02}h {minutes:02}m {seconds:02}s"),
    }
}

/// `1.5 MiB`: binary units, one decimal above bytes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

const STYLE: &str = "body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1d2433}\
h1{font-size:1.6rem;margin:0 0 1rem}h2{font-size:1.15rem;margin:1.5rem 0 .5rem}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1.5rem;margin:0}dt{color:#5b6478}dd{margin:0}\
form{display:flex;gap:.5rem;flex-wrap:wrap;align-items:center}input[type=text]{flex:1;min-width:20rem;padding:.4rem}\
input,button{font:inherit}button{padding:.4rem 1rem}table{border-collapse:collapse;width:100%}\
td,th{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #dde1ea;word-break:break-all}\
.error{color:#a4161a}.num{text-align:right}#summary{margin-bottom:1.5rem}.time{white-space:nowrap;color:#5b6478}code{word-break:break-all}footer{margin-top:2rem;color:#5b6478;font-size:.9rem}a{color:#0b5cad}";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>{body}\
         <footer>backlinks {} &middot; <a href=\"/\">status</a> &middot; <a href=\"/metrics\">metrics</a> \
         &middot; <a href=\"/xrpc/_health\">health</a> &middot; <a href=\"/lexicons\">lexicons</a></footer>\
         </body></html>\n",
        escape(title),
        env!("CARGO_PKG_VERSION")
    )
}

/// The query form, prefilled with `target` and `limit`.
fn query_form(target: &str, limit: usize) -> String {
    format!(
        "<form id=\"query\" method=\"get\" action=\"/ui/backlinks\">\
         <input type=\"text\" id=\"target\" name=\"target\" required value=\"{}\" \
         placeholder=\"at://did:plc:.../app.bsky.feed.post/..., did:plc:... or https://...\" aria-label=\"target\">\
         <input type=\"number\" id=\"limit\" name=\"limit\" min=\"1\" max=\"{}\" value=\"{limit}\" aria-label=\"limit\">\
         <button type=\"submit\">List backlinks</button></form>",
        escape(target),
        crate::query::MAX_LIMIT
    )
}

fn ingest_text(facts: &StatusFacts) -> String {
    match &facts.ingest {
        IngestMode::ImportOnly => "import only (not following a stream)".to_string(),
        IngestMode::ReadOnly => "read-only replica (another process writes the bucket)".to_string(),
        IngestMode::Following { source } => match facts.lag {
            Some(lag) => format!("{} &middot; lag {}", escape(source), format_duration(lag)),
            None => format!("{} &middot; no event yet", escape(source)),
        },
    }
}

/// The status page.
pub fn render_status(facts: &StatusFacts) -> String {
    let mut body = String::from("<h1>backlinks</h1><dl id=\"facts\">");
    let rows = [
        ("version", escape(facts.version)),
        ("uptime", format_duration(facts.uptime)),
        ("ingest", ingest_text(facts)),
        ("ingest clock", facts.clock.to_string()),
        ("tables", facts.tables.to_string()),
        ("entries", facts.entries.to_string()),
        ("bucket", format!("{} uploaded, {} tables pending", format_bytes(facts.bucket_bytes), facts.pending_uploads)),
    ];
    for (name, value) in rows {
        let id = name.replace(' ', "-");
        let _ = write!(body, "<dt>{name}</dt><dd id=\"{id}\">{value}</dd>");
    }
    body.push_str("</dl><h2>Who links here?</h2>");
    body.push_str(&query_form("", crate::query::DEFAULT_LIMIT));
    body.push_str(&endpoint_docs());
    page("backlinks status", &body)
}

/// A post of the shipped capture that one like links to.
const EXAMPLE_POST: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
/// A post of the shipped capture that one reply links to, as its parent and as its root.
const EXAMPLE_THREAD: &str = "at://did:plc:j76trmiofvaxxpvx2vnb2vwf/app.bsky.feed.post/3mmojbrjwbs26";
/// An account of the shipped capture that one follow links to.
const EXAMPLE_ACCOUNT: &str = "did:plc:anc6s2kher6ltrhhglxrzxsa";

/// An endpoint of the status page's list: its path, what it answers (HTML), and the query
/// parameters of its example.
pub type Endpoint = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// Every endpoint the public listener serves.
pub const ENDPOINTS: [Endpoint; 17] = [
    (
        "/xrpc/blue.cerulea.backlinks.listBacklinks",
        "Who links to a record, an account or a URL: sources grouped by location, newest first; \
         <code>collection</code>, <code>location</code>, <code>limit</code>, <code>cursor</code>, \
         <code>reverse</code>.",
        &[("target", EXAMPLE_POST), ("limit", "10")],
    ),
    (
        "/xrpc/blue.cerulea.backlinks.countBacklinks",
        "How many live backlinks, in all and by location.",
        &[("target", EXAMPLE_ACCOUNT)],
    ),
    (
        "/xrpc/blue.microcosm.links.getBacklinks",
        "Constellation's: the records linking from one <code>collection:path</code>.",
        &[("subject", EXAMPLE_POST), ("source", "app.bsky.feed.like:subject.uri")],
    ),
    (
        "/xrpc/blue.microcosm.links.getBacklinksCount",
        "Constellation's: how many records link from that source.",
        &[("subject", EXAMPLE_POST), ("source", "app.bsky.feed.like:subject.uri")],
    ),
    (
        "/xrpc/blue.microcosm.links.getBacklinkDids",
        "Constellation's: the accounts linking from that source.",
        &[("subject", EXAMPLE_ACCOUNT), ("source", "app.bsky.graph.follow:subject")],
    ),
    (
        "/xrpc/blue.microcosm.links.getManyToMany",
        "Constellation's: the records linking from that source (oldest first), each with the other \
         subjects it links to at <code>pathToOther</code> (for list items: who else is on the lists); \
         <code>linkDid</code>, <code>otherSubject</code>, <code>limit</code>, <code>cursor</code>.",
        &[
            ("subject", EXAMPLE_THREAD),
            ("source", "app.bsky.feed.post:reply.parent.uri"),
            ("pathToOther", "reply.root.uri"),
        ],
    ),
    (
        "/xrpc/blue.microcosm.links.getManyToManyCounts",
        "Constellation's: those records grouped by their other subject, with records and accounts.",
        &[
            ("subject", EXAMPLE_THREAD),
            ("source", "app.bsky.feed.post:reply.parent.uri"),
            ("pathToOther", "reply.root.uri"),
        ],
    ),
    (
        "/links",
        "Constellation's REST: the linking records.",
        &[("target", EXAMPLE_POST), ("collection", "app.bsky.feed.like"), ("path", ".subject.uri")],
    ),
    (
        "/links/count",
        "Constellation's REST: how many linking records.",
        &[("target", EXAMPLE_POST), ("collection", "app.bsky.feed.like"), ("path", ".subject.uri")],
    ),
    (
        "/links/distinct-dids",
        "Constellation's REST: the linking accounts.",
        &[("target", EXAMPLE_ACCOUNT), ("collection", "app.bsky.graph.follow"), ("path", ".subject")],
    ),
    (
        "/links/count/distinct-dids",
        "Constellation's REST: how many linking accounts.",
        &[("target", EXAMPLE_ACCOUNT), ("collection", "app.bsky.graph.follow"), ("path", ".subject")],
    ),
    (
        "/links/all",
        "Constellation's REST: every collection and path linking to a target, with records and accounts.",
        &[("target", EXAMPLE_POST)],
    ),
    ("/links/all/count", "Constellation's REST: the same, records only.", &[("target", EXAMPLE_POST)]),
    ("/ui/backlinks", "This explorer's result page.", &[("target", EXAMPLE_POST)]),
    ("/xrpc/_health", "Liveness, the ingest clock and cursor.", &[]),
    ("/metrics", "Prometheus metrics.", &[]),
    ("/lexicons", "The lexicon of every XRPC method (each at <code>/lexicons/NSID.json</code>).", &[]),
];

/// The websockets live push serves (where live ingest runs): path, what it sends, and the query
/// of its example (shown for a websocket client, not as a link: a browser cannot follow one).
pub const WEBSOCKETS: [Endpoint; 2] = [
    (
        "/xrpc/blue.cerulea.backlinks.subscribeBacklinks",
        "Live push: every link created or deleted toward the filter's targets, and accounts hidden \
         or shown, one JSON frame each; <code>target</code>, <code>targetPrefix</code>, \
         <code>targetDid</code>, <code>collection</code>, <code>location</code>, and \
         <code>cursor</code> to replay from the local change log first.",
        &[("target", EXAMPLE_POST)],
    ),
    (
        "/subscribe",
        "Spacedust's: new links for <code>wantedSubjects</code>, <code>wantedSubjectDids</code>, \
         <code>wantedSources</code>, held 21 s unless <code>instant=true</code>.",
        &[("wantedSubjects", EXAMPLE_POST), ("instant", "true")],
    ),
];

/// A link to `path` with `pairs` as its query string.
fn href(path: &str, pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return path.to_string();
    }
    let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    format!("{path}?{query}")
}

/// Every endpoint, what it answers, and an example to click.
fn endpoint_docs() -> String {
    let mut html = String::from(
        "<h2>Endpoints</h2><p>Every answer is JSON; bad parameters get an XRPC 400 \
         <code>{\"error\":\"InvalidRequest\",\"message\":...}</code>. The examples name records of the \
         Jetstream capture in the project's <code>tests/data/jetstream</code>.</p>\
         <table id=\"endpoints\"><thead><tr><th>endpoint</th><th>answers</th><th>example</th></tr></thead><tbody>",
    );
    endpoint_rows(&mut html, &ENDPOINTS, |example| format!("<a class=\"example\" href=\"{example}\">{example}</a>"));
    html.push_str(
        "</tbody></table><h3>Websockets</h3><p>Where this server follows a stream; connect with a \
         websocket client (the explorer's result page has <em>Follow live</em>).</p>\
         <table id=\"websockets\"><thead><tr><th>endpoint</th><th>sends</th><th>example</th></tr></thead><tbody>",
    );
    endpoint_rows(&mut html, &WEBSOCKETS, |example| {
        format!("<code class=\"websocket-example\">ws://HOST{example}</code>")
    });
    html.push_str("</tbody></table>");
    html
}

/// A table row per endpoint; `example` shows its escaped example URL.
fn endpoint_rows(html: &mut String, endpoints: &[Endpoint], example: impl Fn(&str) -> String) {
    for (path, what, pairs) in endpoints {
        let shown = example(&escape(&href(path, pairs)));
        let _ = write!(html, "<tr><td><code>{path}</code></td><td>{what}</td><td>{shown}</td></tr>");
    }
}

/// The explorer's live follow: a websocket to subscribeBacklinks for the section's
/// `data-target`, each event a row on top (at most 200), sources as explorer links. The page's
/// `follow=1` starts it at once, and `since=CURSOR` replays from a cursor first.
const LIVE_SCRIPT: &str = r##"(function () {
  var section = document.getElementById("live");
  var rows = document.querySelector("#live-events tbody");
  var status = document.getElementById("live-status");
  var button = document.getElementById("follow");
  var socket = null;
  function cell(row, text) { var td = row.insertCell(); td.textContent = text; return td; }
  button.addEventListener("click", function () {
    if (socket) { socket.close(); socket = null; button.textContent = "Follow live"; status.textContent = "stopped"; return; }
    var scheme = location.protocol === "https:" ? "wss:" : "ws:";
    var url = scheme + "//" + location.host + "/xrpc/blue.cerulea.backlinks.subscribeBacklinks?target=" + encodeURIComponent(section.dataset.target);
    var since = new URLSearchParams(location.search).get("since");
    if (since) { url += "&cursor=" + encodeURIComponent(since); }
    socket = new WebSocket(url);
    button.textContent = "Stop";
    status.textContent = "connecting";
    socket.onopen = function () { status.textContent = "following"; };
    socket.onclose = function () { status.textContent = "closed"; };
    socket.onmessage = function (message) {
      var event = JSON.parse(message.data);
      var row = rows.insertRow(0);
      row.className = "live-" + event.op;
      cell(row, new Date(event.time_us / 1000).toISOString());
      cell(row, event.op);
      if (event.op === "create" || event.op === "delete") {
        cell(row, event.location);
        var link = document.createElement("a");
        link.href = "/ui/backlinks?target=" + encodeURIComponent(event.source);
        link.textContent = event.source;
        cell(row, "").appendChild(link);
      } else {
        cell(row, event.status || "");
        cell(row, event.did || event.message || "");
      }
      while (rows.rows.length > 200) { rows.deleteRow(rows.rows.length - 1); }
    };
  });
  if (new URLSearchParams(location.search).get("follow") === "1") { button.click(); }
})();"##;

/// The live follow section of the explorer for `target`.
fn live_section(target: &str) -> String {
    format!(
        r#"<section id="live" data-target="{}"><h2>Live</h2><p><button type="button" id="follow">Follow live</button> <span id="live-status"></span></p><table id="live-events"><thead><tr><th>time</th><th>event</th><th>location</th><th>source</th></tr></thead><tbody></tbody></table></section><script>{LIVE_SCRIPT}</script>"#,
        escape(target)
    )
}

/// The result page of the query form: the count, the totals by collection and location, the page
/// of sources (each with its time and a link to its own backlinks), and links to the first and
/// next pages. `paged` says whether this page came from a cursor; `live` whether this server
/// pushes (then the page can follow the target live).
pub fn render_results(
    target: &str,
    limit: usize,
    paged: bool,
    page_items: &ListPage,
    count: &Count,
    live: bool,
) -> String {
    let mut body = format!("<h1>Backlinks</h1>{}", query_form(target, limit));
    let approximate = if count.approximate { "about " } else { "" };
    let noun = if count.total == 1 { "backlink" } else { "backlinks" };
    let _ = write!(body, "<p id=\"total\">{approximate}{} {noun} to <code>{}</code></p>", count.total, escape(target));
    body.push_str(&summary_table(count));
    if page_items.items.is_empty() {
        body.push_str("<p id=\"empty\">No backlinks on this page.</p>");
    } else {
        body.push_str(
            "<table id=\"results\"><thead><tr><th>time</th><th>location</th><th>source</th></tr></thead><tbody>",
        );
        for (location, uri) in &page_items.items {
            let _ = write!(
                body,
                "<tr><td class=\"time\">{}</td><td class=\"location\">{}</td><td class=\"source\"><a href=\"{}\">{}</a></td></tr>",
                record_time(uri),
                escape(location),
                escape(&explorer_href(uri, limit, None)),
                escape(uri)
            );
        }
        body.push_str("</tbody></table>");
    }
    let mut paging = Vec::new();
    if paged {
        paging.push(format!("<a id=\"first\" href=\"{}\">first page</a>", escape(&explorer_href(target, limit, None))));
    }
    if let Some(cursor) = &page_items.cursor {
        let next = explorer_href(target, limit, Some(cursor));
        paging.push(format!("<a id=\"next\" href=\"{}\">next page</a>", escape(&next)));
    }
    if !paging.is_empty() {
        let _ = write!(body, "<p id=\"paging\">{}</p>", paging.join(" &middot; "));
    }
    if live {
        body.push_str(&live_section(target));
    }
    page(&format!("backlinks to {target}"), &body)
}

/// The explorer's page for `target`.
fn explorer_href(target: &str, limit: usize, cursor: Option<&str>) -> String {
    let limit = limit.to_string();
    let mut pairs = vec![("target", target), ("limit", limit.as_str())];
    pairs.extend(cursor.map(|cursor| ("cursor", cursor)));
    href("/ui/backlinks", &pairs)
}

/// When the record at `uri` was written, from its record key when that is a TID (a TID counts
/// microseconds since 1970 above its 10 clock-id bits); empty for any other key.
fn record_time(uri: &str) -> String {
    let rkey = uri.rsplit('/').next().unwrap_or_default();
    match parse_tid(rkey) {
        Some(tid) => format_rfc3339_us((tid >> 10) as i64),
        None => String::new(),
    }
}

/// Live records and accounts by (collection, location), as the count found them.
fn summary_table(count: &Count) -> String {
    if count.by_source.is_empty() {
        return String::new();
    }
    let mut html = String::from(
        "<table id=\"summary\"><thead><tr><th>collection</th><th>location</th>\
         <th class=\"num\">records</th><th class=\"num\">accounts</th></tr></thead><tbody>",
    );
    for ((collection, location), figures) in &count.by_source {
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=\"location\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(collection),
            escape(location),
            figures.records,
            figures.distinct_dids
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// The result page for a query that could not run.
pub fn render_error(target: &str, message: &str) -> String {
    let body = format!(
        "<h1>Backlinks</h1>{}<p class=\"error\" id=\"error\">{}</p>",
        query_form(target, crate::query::DEFAULT_LIMIT),
        escape(message)
    );
    page("backlinks: error", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn facts(ingest: IngestMode, lag: Option<Duration>) -> StatusFacts {
        StatusFacts {
            version: "9.9.9",
            uptime: Duration::from_secs(3 * 3600 + 4 * 60 + 5),
            ingest,
            lag,
            clock: 42,
            tables: 3,
            entries: 1234,
            bucket_bytes: 3 << 20,
            pending_uploads: 1,
        }
    }

    #[test]
    fn status_page_shows_every_fact() {
        let html = render_status(&facts(IngestMode::ImportOnly, None));
        for expected in [
            "<dd id=\"version\">9.9.9</dd>",
            "<dd id=\"uptime\">3h 04m 05s</dd>",
            "<dd id=\"ingest\">import only (not following a stream)</dd>",
            "<dd id=\"ingest-clock\">42</dd>",
            "<dd id=\"tables\">3</dd>",
            "<dd id=\"entries\">1234</dd>",
            "<dd id=\"bucket\">3.0 MiB uploaded, 1 tables pending</dd>",
            "<form id=\"query\" method=\"get\" action=\"/ui/backlinks\">",
        ] {
            assert!(html.contains(expected), "missing {expected} in {html}");
        }
        assert!(!html.contains("<script"), "no script on the page");
        for (path, _, _) in ENDPOINTS.iter().chain(&WEBSOCKETS) {
            assert!(html.contains(&format!("<tr><td><code>{path}</code></td>")), "{path} documented");
        }
        let example = "href=\"/links?target=at%3A%2F%2Fdid%3Aplc%3Avfnmgxg2yscfliemmcxzyfyh%2Fapp.bsky.feed.post%2F3mmoodizfwc2j&amp;collection=app.bsky.feed.like&amp;path=.subject.uri\"";
        assert!(html.contains(example), "{html}");
        let following = IngestMode::Following { source: "wss://j<x>".into() };
        let html = render_status(&facts(following, Some(Duration::from_secs(75))));
        assert!(html.contains("<dd id=\"ingest\">wss://j&lt;x&gt; &middot; lag 1m 15s</dd>"), "{html}");
    }

    #[test]
    fn results_escape_everything_and_link_the_next_page() {
        let page = ListPage {
            items: vec![
                ("$.subject".into(), "at://did:plc:x/a.b.c/<script>".into()),
                ("$.reply.root".into(), "at://did:plc:y/app.bsky.feed.post/3mmoojp4cd223".into()),
            ],
            cursor: Some("01ab".into()),
        };
        let by_source = BTreeMap::from([(
            ("a.b.<c>".to_string(), "$.subject".to_string()),
            crate::count::SourceCount { records: 7, distinct_dids: 3 },
        )]);
        let count = Count { total: 1, distinct_dids: 1, by_source, ..Count::default() };
        let html = render_results("did:plc:\"x\"", 5, false, &page, &count, false);
        assert!(!html.contains("<script"), "no script without live push");
        let live = render_results("did:plc:\"x\"", 5, false, &page, &count, true);
        assert!(live.contains("<section id=\"live\" data-target=\"did:plc:&quot;x&quot;\">"), "{live}");
        assert_eq!(live.matches("<script>").count(), 1);
        let escaped_source = "at://did:plc:x/a.b.c/&lt;script&gt;";
        let source_href = "/ui/backlinks?target=at%3A%2F%2Fdid%3Aplc%3Ax%2Fa.b.c%2F%3Cscript%3E&amp;limit=5";
        assert!(
            html.contains(&format!("<td class=\"source\"><a href=\"{source_href}\">{escaped_source}</a></td>")),
            "{html}"
        );
        assert!(html.contains("<td class=\"time\"></td>"), "no time for a key that is not a TID: {html}");
        assert!(html.contains("<td class=\"time\">2026-05-25T14:23:28.756000Z</td>"), "a TID's time: {html}");
        assert!(html.contains("<p id=\"total\">1 backlink to <code>did:plc:&quot;x&quot;</code></p>"), "{html}");
        let summary = "<tr><td>a.b.&lt;c&gt;</td><td class=\"location\">$.subject</td><td class=\"num\">7</td><td class=\"num\">3</td></tr>";
        assert!(html.contains(summary), "{html}");
        assert!(
            html.contains("href=\"/ui/backlinks?target=did%3Aplc%3A%22x%22&amp;limit=5&amp;cursor=01ab\""),
            "{html}"
        );
        assert!(!html.contains("id=\"first\""), "the first page links to no first page");
        assert!(html.contains("value=\"did:plc:&quot;x&quot;\""));
        let later = render_results("did:plc:x", 5, true, &ListPage::default(), &Count::default(), false);
        assert!(later.contains("<a id=\"first\" href=\"/ui/backlinks?target=did%3Aplc%3Ax&amp;limit=5\">"), "{later}");
        let empty = render_results("did:plc:x", 5, false, &ListPage::default(), &Count::default(), false);
        assert!(empty.contains("<p id=\"total\">0 backlinks to") && empty.contains("id=\"empty\""));
        assert!(!empty.contains("id=\"next\"") && !empty.contains("id=\"summary\""));
        let error = render_error("<b>", "invalid target: <b>");
        assert!(error.contains("<p class=\"error\" id=\"error\">invalid target: &lt;b&gt;</p>"));
    }

    #[test]
    fn durations_and_bytes_read_naturally() {
        assert_eq!(format_duration(Duration::from_secs(9)), "9s");
        assert_eq!(format_duration(Duration::from_secs(65)), "1m 05s");
        assert_eq!(format_duration(Duration::from_secs(90_061)), "1d 01h 01m 01s");
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(u64::MAX), "16384.0 PiB");
    }
}
