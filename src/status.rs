//! The HTML pages: the status page (`/`) and the result page of its query form
//! (`/ui/backlinks?target=...`). Plain server-rendered HTML with inline CSS: no script, no external
//! asset, nothing that needs `Accept: text/html`.
//!
//! Invariants:
//! - Every string that reaches the page (targets, URIs, locations, messages) goes through
//!   `escape`, so no index content can inject markup.
//! - The facts are gathered by the caller (wall clock and uptime injected), so rendering is a pure
//!   function of its inputs.

use crate::count::Count;
use crate::index::Index;
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
.error{color:#a4161a}footer{margin-top:2rem;color:#5b6478;font-size:.9rem}a{color:#0b5cad}";

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
    page("backlinks status", &body)
}

/// The result page of the query form: the count, the page grouped by location, and a link to the
/// next page.
pub fn render_results(target: &str, limit: usize, page_items: &ListPage, count: &Count) -> String {
    let mut body = format!("<h1>Backlinks</h1>{}", query_form(target, limit));
    let approximate = if count.approximate { "about " } else { "" };
    let noun = if count.total == 1 { "backlink" } else { "backlinks" };
    let _ = write!(body, "<p id=\"total\">{approximate}{} {noun} to <code>{}</code></p>", count.total, escape(target));
    if page_items.items.is_empty() {
        body.push_str("<p id=\"empty\">No backlinks on this page.</p>");
    } else {
        body.push_str("<table id=\"results\"><thead><tr><th>location</th><th>source</th></tr></thead><tbody>");
        for (location, uri) in &page_items.items {
            let _ = write!(
                body,
                "<tr><td class=\"location\">{}</td><td class=\"source\">{}</td></tr>",
                escape(location),
                escape(uri)
            );
        }
        body.push_str("</tbody></table>");
    }
    if let Some(cursor) = &page_items.cursor {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("target", target)
            .append_pair("limit", &limit.to_string())
            .append_pair("cursor", cursor)
            .finish();
        let _ = write!(body, "<p><a id=\"next\" href=\"/ui/backlinks?{}\">next page</a></p>", escape(&query));
    }
    page(&format!("backlinks to {target}"), &body)
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
        let following = IngestMode::Following { source: "wss://j<x>".into() };
        let html = render_status(&facts(following, Some(Duration::from_secs(75))));
        assert!(html.contains("<dd id=\"ingest\">wss://j&lt;x&gt; &middot; lag 1m 15s</dd>"), "{html}");
    }

    #[test]
    fn results_escape_everything_and_link_the_next_page() {
        let page = ListPage {
            items: vec![("$.subject".into(), "at://did:plc:x/a.b.c/<script>".into())],
            cursor: Some("01ab".into()),
        };
        let count =
            Count { total: 1, by_location: BTreeMap::new(), distinct_dids: 1, approximate: false, ..Count::default() };
        let html = render_results("did:plc:\"x\"", 5, &page, &count);
        assert!(html.contains("<td class=\"source\">at://did:plc:x/a.b.c/&lt;script&gt;</td>"), "{html}");
        assert!(html.contains("<p id=\"total\">1 backlink to <code>did:plc:&quot;x&quot;</code></p>"), "{html}");
        assert!(
            html.contains("href=\"/ui/backlinks?target=did%3Aplc%3A%22x%22&amp;limit=5&amp;cursor=01ab\""),
            "{html}"
        );
        assert!(html.contains("value=\"did:plc:&quot;x&quot;\""));
        let empty = render_results("did:plc:x", 5, &ListPage::default(), &Count::default());
        assert!(empty.contains("<p id=\"total\">0 backlinks to") && empty.contains("id=\"empty\""));
        assert!(!empty.contains("id=\"next\""));
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
