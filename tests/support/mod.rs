//! Shared by the tests that run the real binary: start `serve` on a free port, speak a little
//! HTTP to it, run one-shot commands. (Each test binary uses a different part of it.)
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_backlinks");
pub const CAPTURE: &str = "tests/data/jetstream/golden_v1.jsonl";

/// Runs the binary to completion: (success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).env_remove("NOTIFY_SOCKET").output().expect("run backlinks");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawns a `backlinks serve ...` command and waits for its first line, `listening on
/// http://ADDR`; returns the child and ADDR.
pub fn spawn_listening(command: &mut Command) -> (Child, String) {
    let mut child =
        command.env_remove("NOTIFY_SOCKET").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr =
        line.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, addr.to_string())
}

/// `backlinks serve --no-ingest` on a free loopback port, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[])
    }

    /// `start` with extra flags (`--store URL`, `--read-only`, ...).
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Self {
        let mut command = Command::new(BIN);
        command.args(["serve", "--no-ingest", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir).args(extra);
        let (child, addr) = spawn_listening(&mut command);
        Server { child, addr }
    }

    /// GET `path_and_query`; returns (status, JSON body).
    pub fn get(&self, path_and_query: &str) -> (u16, serde_json::Value) {
        let (status, body) = self.get_text(path_and_query);
        (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("body {body:?}: {e}")))
    }

    /// GET `path_and_query`; returns (status, body text).
    pub fn get_text(&self, path_and_query: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        write!(stream, "GET {path_and_query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("http response");
        (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string())
    }
}

/// `backlinks serve` following a Jetstream (live ingest), with a config file.
impl Server {
    pub fn start_live(data_dir: &Path, config: &Path, jetstream: &str) -> Self {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--jetstream", jetstream, "--config"])
            .arg(config)
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "warn");
        let (child, addr) = spawn_listening(&mut command);
        Server { child, addr }
    }

    /// The in-memory ingest cursor, from `/xrpc/_health` (`None` while it does not answer).
    pub fn cursor(&self) -> Option<i64> {
        let mut stream = TcpStream::connect(&self.addr).ok()?;
        write!(stream, "GET /xrpc/_health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let body: serde_json::Value = serde_json::from_str(response.split_once("\r\n\r\n")?.1).ok()?;
        body["cursor"].as_i64()
    }

    /// Peak resident memory of the server process, from /proc (Linux), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// SIGKILL, and wait for it.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM: a clean stop (flush, publish) and exit 0.
    pub fn terminate(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "serve exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An environment variable the Garage tests need; without it they fail (never skip).
pub fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/test.sh, which starts Garage (scripts/garage.sh)")
    })
}

/// A bucket prefix no other test (or earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("test/{test}-{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Settings for the local Garage (scripts/garage.sh) under a fresh prefix, resolved the way the
/// binary resolves them.
pub fn garage_settings(test: &str) -> backlinks::store::s3::S3Settings {
    use backlinks::store::s3::{S3ConfigKeys, S3Settings};
    let bucket = required_env("BACKLINKS_TEST_S3_BUCKET");
    required_env("AWS_ENDPOINT_URL");
    let url = format!("s3://{bucket}/{}", unique_prefix(test));
    let settings = S3Settings::resolve(&url, &S3ConfigKeys::default(), &|name| std::env::var(name).ok()).unwrap();
    assert!(settings.force_path_style, "a custom endpoint must default to path style");
    settings
}
pub mod car_writer;
pub mod jetstream_server;
pub mod model;
pub mod pds_server;
pub mod plc;
pub mod store_contract;
pub mod world;
