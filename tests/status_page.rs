//! The status page in a real browser: import the real Jetstream capture with the binary, `serve`
//! it, load `/` in headless Chromium and read the DOM it built; follow every endpoint's example
//! link on it; then submit the page's query form the way a browser submits a GET form (the URL
//! made of the form's own action and field names) for a real target, check what the result page
//! shows, and follow its link to a source's own backlinks. Screenshots of the pages are kept in
//! `target/test-artifacts/`.
//!
//! Chromium is required: the test fails (it does not skip) when it is missing; `scripts/test.sh`
//! installs it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{BIN, CAPTURE, Server};

const LIKED: &str = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
const LIKE: &str = "at://did:plc:mcc5yghbk7tixqryac2yxku7/app.bsky.feed.like/3mmoojp7etg2g";
/// The time in the like's record key (a TID).
const LIKE_TIME: &str = "2026-05-25T14:23:28.856876Z";
/// The author of the reply that the status page's many-to-many examples find.
const REPLIER: &str = "did:plc:q235v55g5unth4zjjdpacfdr";
/// The account that follows the example account of the status page.
const FOLLOWER: &str = "did:plc:mxwlsvdgs6tn75lq6jrr2vp7";
/// Longest a single Chromium run may take before the test gives up on it.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(90);

fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn require_chromium() {
    let found = Command::new("chromium").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "chromium is missing: run scripts/test.sh, which installs it (apt-get install -y chromium)"
    );
}

/// Runs headless Chromium with a fresh profile and `action` (`--dump-dom` or `--screenshot=...`)
/// on `url`; returns its stdout.
fn chromium(action: &str, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1100,800",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(action)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run chromium");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > CHROMIUM_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {action} {url} within {CHROMIUM_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "chromium {action} {url} failed");
    String::from_utf8(output.stdout).unwrap()
}

fn screenshot(url: &str, name: &str) {
    let path = artifacts_dir().join(name);
    let _ = std::fs::remove_file(&path);
    chromium(&format!("--screenshot={}", path.display()), url);
    let png = std::fs::read(&path).unwrap_or_else(|e| panic!("no screenshot {}: {e}", path.display()));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name} is a PNG");
    assert!(png.len() > 5_000, "{name} is a real picture ({} bytes)", png.len());
}

/// The value of `attribute` in the first tag of `html` that starts with `tag_start`.
fn attribute<'a>(html: &'a str, tag_start: &str, attribute: &str) -> &'a str {
    let tag = &html[html.find(tag_start).unwrap_or_else(|| panic!("no {tag_start} in {html}"))..];
    let tag = &tag[..tag.find('>').unwrap()];
    let key = format!("{attribute}=\"");
    let value = &tag[tag.find(&key).unwrap_or_else(|| panic!("no {attribute} in {tag}")) + key.len()..];
    &value[..value.find('"').unwrap()]
}

/// Every example link of the status page answers 200, and each that asks the index about the
/// capture's liked post or followed account finds its like or its follower.
fn follow_every_example(server: &Server, dom: &str) {
    let mut followed = 0;
    for piece in dom.split("<a class=\"example\" href=\"").skip(1) {
        let href = piece[..piece.find('"').unwrap()].replace("&amp;", "&");
        let (status, body) = server.get_text(&href);
        assert_eq!(status, 200, "{href}: {body}");
        if href.contains("target=") || href.contains("subject=") {
            let liker = LIKE.split('/').nth(2).unwrap();
            let found =
                [liker, FOLLOWER, REPLIER, "\"total\":1", "app.bsky.feed.like"].iter().any(|text| body.contains(text));
            assert!(found, "{href}: {body}");
        }
        followed += 1;
    }
    assert_eq!(followed, 17, "one example per endpoint");
}

#[test]
fn the_status_page_and_its_query_form_work_in_headless_chromium() {
    require_chromium();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let import = Command::new(BIN).args(["import", "--data-dir"]).arg(&data).arg(CAPTURE).output().unwrap();
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));
    let server = Server::start(&data);
    let home = format!("http://{}/", server.addr);

    let dom = chromium("--dump-dom", &home);
    for expected in [
        format!("<dd id=\"version\">{}</dd>", env!("CARGO_PKG_VERSION")),
        "<dd id=\"ingest\">import only (not following a stream)</dd>".to_string(),
        "<dd id=\"ingest-clock\">9</dd>".to_string(),
        "<dd id=\"tables\">3</dd>".to_string(),
    ] {
        assert!(dom.contains(&expected), "{expected} missing from the status page DOM:\n{dom}");
    }
    // Both tables were uploaded by the import: some bytes, nothing pending.
    let bucket = &dom[dom.find("<dd id=\"bucket\">").expect("bucket fact") + "<dd id=\"bucket\">".len()..];
    let bucket = &bucket[..bucket.find("</dd>").unwrap()];
    assert!(bucket.ends_with(" uploaded, 0 tables pending") && !bucket.starts_with("0 B"), "bucket: {bucket}");
    screenshot(&home, "status_page.png");
    follow_every_example(&server, &dom);

    // Submit the form as a browser does: GET its action with its fields as the query string.
    let action = attribute(&dom, "<form id=\"query\"", "action");
    let target_field = attribute(&dom, "<input type=\"text\"", "name");
    let limit_field = attribute(&dom, "<input type=\"number\"", "name");
    assert_eq!(attribute(&dom, "<form id=\"query\"", "method"), "get");
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair(target_field, LIKED)
        .append_pair(limit_field, "100")
        .finish();
    let submitted = format!("http://{}{action}?{query}", server.addr);
    let result = chromium("--dump-dom", &submitted);
    assert!(result.contains(&format!("<p id=\"total\">1 backlink to <code>{LIKED}</code></p>")), "{result}");
    let like_page = format!(
        "/ui/backlinks?target={}&amp;limit=100",
        form_urlencoded::byte_serialize(LIKE.as_bytes()).collect::<String>()
    );
    let row = format!(
        "<tr><td class=\"time\">{LIKE_TIME}</td><td class=\"location\">$.subject</td>\
         <td class=\"source\"><a href=\"{like_page}\">{LIKE}</a></td></tr>"
    );
    assert!(result.contains(&row), "the like is listed with its time and a link to its own page:\n{result}");
    let summary = "<tr><td>app.bsky.feed.like</td><td class=\"location\">$.subject</td><td class=\"num\">1</td><td class=\"num\">1</td></tr>";
    assert!(result.contains(summary), "the summary by collection and location:\n{result}");
    assert!(result.contains(&format!("value=\"{LIKED}\"")), "the form keeps the target");
    assert!(!result.contains("id=\"next\""), "a single page has no next link");
    screenshot(&submitted, "status_page_results.png");
    let source_page = chromium("--dump-dom", &format!("http://{}{}", server.addr, like_page.replace("&amp;", "&")));
    assert!(source_page.contains(&format!("<p id=\"total\">0 backlinks to <code>{LIKE}</code></p>")), "{source_page}");

    // A bad target shows the XRPC message on the page.
    let bad = chromium("--dump-dom", &format!("http://{}{action}?{target_field}=nope", server.addr));
    assert!(bad.contains("<p class=\"error\" id=\"error\">invalid target"), "{bad}");
}
