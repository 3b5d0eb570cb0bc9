//! End to end with the real binary: `import` the real Jetstream capture (plus a tail of deletes,
//! updates and account events), `serve --no-ingest` on a free port, and check every target's
//! listBacklinks against the answers the rules of docs/design.md give, written out by hand below. Then
//! `backlinks query` must print exactly the same JSON, and bad parameters must get XRPC 400s.

mod support;

use serde_json::{Value, json};
use support::{CAPTURE, Server, run};

fn list_path(target: &str, extra: &str) -> String {
    let target: String = form_urlencoded::byte_serialize(target.as_bytes()).collect();
    format!("/xrpc/blue.cerulea.backlinks.listBacklinks?target={target}{extra}")
}

/// Every target in the capture and its backlinks by the rules (hand-derived from the 10 lines).
fn capture_expectations() -> Vec<(&'static str, Value)> {
    let like = "at://did:plc:mcc5yghbk7tixqryac2yxku7/app.bsky.feed.like/3mmoojp7etg2g";
    let reply = "at://did:plc:q235v55g5unth4zjjdpacfdr/app.bsky.feed.post/3mmoojp4cd223";
    let repost = "at://did:plc:eizxoqcsvvvarxeb3pjkblrp/app.bsky.feed.repost/3mmoojpbade2i";
    let follow = "at://did:plc:mxwlsvdgs6tn75lq6jrr2vp7/app.bsky.graph.follow/3mmoojocxvr2s";
    let profile = "at://did:plc:o6t5vwyr7ae73foww7bgye4r/app.bsky.actor.profile/self";
    let origin = "at://did:plc:qlhxnyjaacdu5jvapiqtbgqg/place.stream.broadcast.origin/did:plc:qlhxnyjaacdu5jvapiqtbgqg::did:web:prod-sea0.stream.place";
    let block = "at://did:plc:2lv5zdhr6aqncw46v7zgxbio/app.bsky.graph.block/3mmoojpduny2w";
    vec![
        ("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j", json!({"$.subject": [like]})),
        (
            "at://did:plc:j76trmiofvaxxpvx2vnb2vwf/app.bsky.feed.post/3mmojbrjwbs26",
            json!({"$.reply.parent": [reply], "$.reply.root": [reply]}),
        ),
        ("at://did:plc:hjloomm2tkve3pmfgbxegl3v/app.bsky.feed.post/3mmood3a6hc25", json!({"$.subject": [repost]})),
        ("did:plc:anc6s2kher6ltrhhglxrzxsa", json!({"$.subject": [follow]})),
        ("at://did:plc:o6t5vwyr7ae73foww7bgye4r/app.bsky.feed.post/3meuab5it2s2g", json!({"$.pinnedPost": [profile]})),
        ("did:web:stream.place", json!({"$.broadcaster": [origin]})),
        ("did:web:prod-sea0.stream.place", json!({"$.server": [origin]})),
        ("did:plc:qlhxnyjaacdu5jvapiqtbgqg", json!({"$.streamer": [origin]})),
        ("at://did:plc:qlhxnyjaacdu5jvapiqtbgqg", json!({"$.streamer": [origin]})),
        ("did:plc:pgsrzsvisagr7wfqasmu3cgf", json!({"$.subject": [block]})),
        // Not links: the websocket URL, CIDs, the record's own DID, unknown targets.
        ("did:plc:mcc5yghbk7tixqryac2yxku7", json!({})),
        ("at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2k", json!({})),
    ]
}

#[test]
fn import_then_serve_answers_every_capture_target_by_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_str = data.to_str().unwrap();
    let (ok, stdout, stderr) = run(&["import", "--data-dir", data_str, CAPTURE]);
    assert!(ok, "import failed: {stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["lines"], 10);
    assert_eq!(summary["applied"], 9, "8 commits and 1 account event");
    assert_eq!(summary["skipped"], 1, "the identity event");
    assert_eq!(summary["malformed"], 0);
    assert!(data.join("bucket/CURRENT").exists(), "import publishes a manifest");

    let server = Server::start(&data);
    let (status, health) = server.get("/xrpc/_health");
    assert_eq!((status, &health["status"]), (200, &json!("ok")));
    for (target, backlinks) in capture_expectations() {
        let (status, body) = server.get(&list_path(target, ""));
        assert_eq!(status, 200, "{target}: {body}");
        assert_eq!(body, json!({"backlinks": backlinks, "cursor": null}), "target {target}");
        let (ok, printed, stderr) = run(&["query", "--data-dir", data_str, target]);
        assert!(ok, "query {target}: {stderr}");
        assert_eq!(serde_json::from_str::<Value>(&printed).unwrap(), body, "query and serve differ for {target}");
    }
}

#[test]
fn deletes_updates_and_account_events_apply_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let input = dir.path().join("events.jsonl");
    let mut text = std::fs::read_to_string(CAPTURE).unwrap();
    let tail = [
        // The like is deleted.
        r#"{"did":"did:plc:mcc5yghbk7tixqryac2yxku7","time_us":1779719011000000,"kind":"commit","commit":{"rev":"3mmoojqaaaa2a","operation":"delete","collection":"app.bsky.feed.like","rkey":"3mmoojp7etg2g"}}"#,
        // The profile drops its pinned post.
        r#"{"did":"did:plc:o6t5vwyr7ae73foww7bgye4r","time_us":1779719011000001,"kind":"commit","commit":{"rev":"3mmoojqaaab2a","operation":"update","collection":"app.bsky.actor.profile","rkey":"self","record":{"$type":"app.bsky.actor.profile","displayName":"x"}}}"#,
        // The follower deactivates (hidden), the blocker deletes the account (revoked).
        r#"{"did":"did:plc:mxwlsvdgs6tn75lq6jrr2vp7","time_us":1779719011000002,"kind":"account","account":{"active":false,"did":"did:plc:mxwlsvdgs6tn75lq6jrr2vp7","seq":1,"status":"deactivated","time":"2026-05-25T14:23:30.000Z"}}"#,
        r#"{"did":"did:plc:2lv5zdhr6aqncw46v7zgxbio","time_us":1779719011000003,"kind":"account","account":{"active":false,"did":"did:plc:2lv5zdhr6aqncw46v7zgxbio","seq":2,"status":"deleted","time":"2026-05-25T14:23:30.000Z"}}"#,
        // Hostile lines: counted, never fatal.
        r#"{"did":"did:plc:2lv5zdhr6aqncw46v7zgxbio","time_us":1779719011000004,"kind":"commit","commit":{"operation":"create","collection":"app.bsky.graph.block","rkey":"../x","record":{}}}"#,
        "{\"truncated\": ",
    ];
    for line in tail {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&input, text).unwrap();
    let (ok, stdout, stderr) = run(&["import", "--data-dir", data.to_str().unwrap(), input.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!((summary["applied"].clone(), summary["malformed"].clone()), (json!(13), json!(2)));

    let server = Server::start(&data);
    let gone = [
        "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j",
        "at://did:plc:o6t5vwyr7ae73foww7bgye4r/app.bsky.feed.post/3meuab5it2s2g",
        "did:plc:anc6s2kher6ltrhhglxrzxsa",
        "did:plc:pgsrzsvisagr7wfqasmu3cgf",
    ];
    for target in gone {
        assert_eq!(server.get(&list_path(target, "")).1, json!({"backlinks": {}, "cursor": null}), "{target}");
    }
    let (_, still) = server.get(&list_path("did:plc:anc6s2kher6ltrhhglxrzxsa", "&limit=5"));
    assert_eq!(still["backlinks"], json!({}));
    let (_, kept) =
        server.get(&list_path("at://did:plc:hjloomm2tkve3pmfgbxegl3v/app.bsky.feed.post/3mmood3a6hc25", ""));
    assert_eq!(kept["backlinks"]["$.subject"].as_array().unwrap().len(), 1);
}

#[test]
fn bad_parameters_get_xrpc_400s() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ok, _, stderr) = run(&["import", "--data-dir", data.to_str().unwrap(), CAPTURE]);
    assert!(ok, "{stderr}");
    let server = Server::start(&data);
    let post = "at://did:plc:vfnmgxg2yscfliemmcxzyfyh/app.bsky.feed.post/3mmoodizfwc2j";
    let cases = [
        ("/xrpc/blue.cerulea.backlinks.listBacklinks".to_string(), "target"),
        (list_path("ftp://example.com", ""), "target"),
        (list_path("at://alice.example.com/app.bsky.feed.post/3mmoodizfwc2j", ""), "handle"),
        (list_path(post, "&limit=0"), "limit"),
        (list_path(post, "&limit=1001"), "limit"),
        (list_path(post, "&limit=ten"), "limit"),
        (list_path(post, "&cursor=zzz"), "cursor"),
        (list_path(post, "&reverse=maybe"), "reverse"),
        (list_path(post, "&collection=not%20an%20nsid"), "collection"),
        (list_path(post, "&location=subject"), "location"),
    ];
    for (path, word) in cases {
        let (status, body) = server.get(&path);
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"], "InvalidRequest", "{path}");
        let message = body["message"].as_str().unwrap();
        assert!(message.to_lowercase().contains(word), "{path}: message {message:?} should mention {word}");
    }
    let (status, body) = server.get("/xrpc/blue.cerulea.backlinks.noSuchMethod");
    assert_eq!((status, body["error"].as_str()), (404, Some("MethodNotImplemented")));
}

#[test]
fn a_second_writer_on_the_same_bucket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let store = format!("file://{}", bucket.display());
    let first = dir.path().join("first");
    let (ok, _, stderr) = run(&["import", "--data-dir", first.to_str().unwrap(), "--store", &store, CAPTURE]);
    assert!(ok, "{stderr}");
    assert!(!bucket.join("WRITER").exists(), "a finished import releases its lease");
    // A live writer's lease (another owner, far from expiry) blocks a second writer.
    let lease = json!({"owner": "someone-else", "host": "elsewhere", "pid": 4242, "expires_ms": u64::MAX / 2});
    std::fs::write(bucket.join("WRITER"), lease.to_string()).unwrap();
    let second = dir.path().join("second");
    let (ok, _, stderr) = run(&["import", "--data-dir", second.to_str().unwrap(), "--store", &store, CAPTURE]);
    assert!(!ok, "a second writer must refuse to start");
    assert!(stderr.contains("another backlinks writer holds this bucket prefix"), "{stderr}");
    assert!(stderr.contains("pid 4242"), "{stderr}");
}

/// The binary against the local Garage: `import --store s3://...`, then `serve` on an empty data
/// directory with the same store restores itself from the bucket alone and answers identically.
#[test]
fn serve_on_an_empty_data_dir_restores_from_garage() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = support::required_env("BACKLINKS_TEST_S3_BUCKET");
    let store = format!("s3://{bucket}/{}", support::unique_prefix("cli-restore"));
    let writer = dir.path().join("writer");
    let (ok, _, stderr) = run(&["import", "--data-dir", writer.to_str().unwrap(), "--store", &store, CAPTURE]);
    assert!(ok, "{stderr}");
    let empty = dir.path().join("empty");
    let server = Server::start_with(&empty, &["--store", &store]);
    for (target, backlinks) in capture_expectations() {
        let (status, body) = server.get(&list_path(target, ""));
        assert_eq!(status, 200, "{target}: {body}");
        assert_eq!(body, json!({"backlinks": backlinks, "cursor": null}), "restored answer for {target}");
    }
    assert!(
        !empty
            .join("state/tables/links")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().path().extension().is_some_and(|x| x == "data") }),
        "the restored server reads table data from the bucket by range"
    );
}

/// `import -` reads standard input, and uploads and publishes as it goes: while the pipe is
/// still open (half a generated workload in), tables and a manifest are already in the bucket; at
/// the end the index answers exactly as an import of the same file does.
#[test]
fn import_from_standard_input_publishes_before_its_input_ends() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (piped, from_file, workload) = (dir.path().join("piped"), dir.path().join("file"), dir.path().join("w.jsonl"));
    let generated = Command::new(env!("CARGO_BIN_EXE_backlinks-workload"))
        .args(["--events", "20000", "--seed", "3", "--out"])
        .arg(&workload)
        .status()
        .unwrap();
    assert!(generated.success());
    let lines = std::fs::read_to_string(&workload).unwrap();
    let (first, second) = lines.split_at(lines[..lines.len() / 2].rfind('\n').unwrap() + 1);
    let mut child = Command::new(support::BIN)
        .args(["import", "-", "--data-dir"])
        .arg(&piped)
        .env("BACKLINKS_PUBLISH_INTERVAL_SECS", "1")
        .env("BACKLINKS_MEMTABLE_BYTES", "65536")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(first.as_bytes()).unwrap();
    stdin.flush().unwrap();
    let (current, tables) = (piped.join("bucket/CURRENT"), piped.join("bucket/tables/links"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !current.exists() || std::fs::read_dir(&tables).map_or(0, |d| d.count()) == 0 {
        assert!(Instant::now() < deadline, "nothing uploaded and published while the input was still open");
        assert!(child.try_wait().unwrap().is_none(), "the import ended before its input did");
        std::thread::sleep(Duration::from_millis(100));
    }
    stdin.write_all(second.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let summary: Value =
        serde_json::from_slice(out.stdout.split(|&b| b == b'\n').find(|l| !l.is_empty()).unwrap()).unwrap();
    assert_eq!(summary["lines"], lines.lines().count(), "{summary}");

    let (ok, _, stderr) = run(&["import", "--data-dir", from_file.to_str().unwrap(), workload.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let (a, b) = (Server::start(&piped), Server::start(&from_file));
    let targets: Vec<String> = lines
        .lines()
        .take(2_000)
        .filter_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["commit"]["record"]["subject"]["uri"].as_str().map(String::from)
        })
        .collect();
    assert!(targets.len() > 100, "the workload links to posts");
    for target in &targets {
        assert_eq!(a.get(&list_path(target, "")), b.get(&list_path(target, "")), "{target}");
    }
}
