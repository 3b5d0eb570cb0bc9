//! The real binary as a managed service. Under a fake systemd (a Unix datagram socket named by
//! `NOTIFY_SOCKET`, and `WATCHDOG_USEC`), `serve --no-ingest` must send `READY=1` once it listens,
//! `WATCHDOG=1` at half the watchdog interval, and `STOPPING=1` on SIGTERM. And
//! `serve --print-config` must print the effective configuration (file, then `BACKLINKS_*`
//! variables, then flags) with secrets redacted, and exit without serving. The packaging that
//! relies on this is checked too: the unit file (notify, watchdog, restart, sandbox), the example
//! config (valid, every key documented) and the Dockerfile (two stages, unprivileged, a volume).

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_backlinks");

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Receives datagrams until one starts with `prefix` or `deadline` passes; returns it.
fn receive(socket: &UnixDatagram, prefix: &str, deadline: Instant) -> String {
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                if message.starts_with(prefix) {
                    return message;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("receiving notifications: {e}"),
        }
    }
    panic!("no {prefix} notification within the deadline");
}

#[test]
fn serve_notifies_ready_feeds_the_watchdog_and_says_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-ingest", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start serve");
    let stdout = child.stdout.take().unwrap();
    let service = Service(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on http://").expect("listening line").to_string();

    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = receive(&socket, "READY=1", deadline);
    assert_eq!(ready, format!("READY=1\nSTATUS=serving on http://{addr}"));
    // Two keep-alives 100 ms apart (half of 200 ms), not one burst.
    let first = Instant::now();
    assert_eq!(receive(&socket, "WATCHDOG=1", deadline), "WATCHDOG=1");
    assert_eq!(receive(&socket, "WATCHDOG=1", deadline), "WATCHDOG=1");
    assert_eq!(receive(&socket, "WATCHDOG=1", deadline), "WATCHDOG=1");
    assert!(first.elapsed() >= Duration::from_millis(150), "keep-alives are paced: {:?}", first.elapsed());

    let pid = service.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert_eq!(receive(&socket, "STOPPING=1", deadline), "STOPPING=1");
}

#[test]
fn without_notify_socket_serve_runs_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-ingest", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start serve");
    let stdout = child.stdout.take().unwrap();
    let _service = Service(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line:?}");
}

#[test]
fn print_config_shows_the_effective_settings_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("backlinks.toml");
    let text = "data_dir = \"/srv/backlinks\"\nlisten = \"0.0.0.0:1\"\nmax_concurrent_queries = 3\n\
                s3_access_key_id = \"GK123\"\ns3_secret_access_key = \"hunter2\"\n";
    std::fs::write(&config, text).unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--print-config", "--listen", "127.0.0.1:9", "--config"])
        .arg(&config)
        .env("BACKLINKS_REQUEST_TIMEOUT_MS", "1234")
        .env_remove("BACKLINKS_LISTEN")
        .env_remove("BACKLINKS_DATA_DIR")
        .env_remove("BACKLINKS_MAX_CONCURRENT_QUERIES")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(!printed.contains("hunter2"), "{printed}");
    let table: toml::Table = printed.parse().unwrap_or_else(|e| panic!("not TOML: {e}\n{printed}"));
    let text = |key: &str| table[key].as_str().map(str::to_string);
    let number = |key: &str| table[key].as_integer();
    assert_eq!(text("s3_secret_access_key").as_deref(), Some("<redacted>"));
    assert_eq!(text("s3_access_key_id").as_deref(), Some("GK123"));
    assert_eq!(text("listen").as_deref(), Some("127.0.0.1:9"), "the flag wins over the file");
    assert_eq!(text("data_dir").as_deref(), Some("/srv/backlinks"), "from the file");
    assert_eq!(text("store").as_deref(), Some("file:///srv/backlinks/bucket"), "the default store");
    assert_eq!(number("max_concurrent_queries"), Some(3), "from the file");
    assert_eq!(number("request_timeout_ms"), Some(1234), "from the environment");
    assert_eq!(number("cache_max_age_secs"), Some(5), "a default");
    assert_eq!(number("memtable_bytes"), Some(64 << 20), "a default");
    assert_eq!(table["no_ingest"].as_bool(), Some(false));
    assert!(table["jetstream"].as_array().is_some_and(|j| !j.is_empty()));

    let bad = Command::new(BIN).args(["serve", "--print-config", "--max-concurrent-queries", "0"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("max_concurrent_queries must be between 1 and 4096"));
}

/// `key=value` lines of a unit file (the last one of a key wins, as in systemd).
fn unit_values(text: &str) -> std::collections::HashMap<String, Vec<String>> {
    let mut values: std::collections::HashMap<String, Vec<String>> = Default::default();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.starts_with('[')) {
        if let Some((key, value)) = line.split_once('=') {
            values.entry(key.to_string()).or_default().push(value.to_string());
        }
    }
    values
}

#[test]
fn the_unit_file_asks_for_notify_a_watchdog_restarts_and_a_sandbox() {
    let unit = unit_values(&std::fs::read_to_string("config/backlinks.service").unwrap());
    let one = |key: &str| unit.get(key).and_then(|v| v.last()).map(String::as_str);
    assert_eq!(one("Type"), Some("notify"));
    assert_eq!(one("Restart"), Some("on-failure"));
    assert!(one("WatchdogSec").is_some_and(|w| w.ends_with('s')), "a watchdog interval");
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("User", "backlinks"),
        ("IPAddressDeny", "link-local"),
    ] {
        assert_eq!(one(key), Some(value), "{key}");
    }
    // The data dir the service is told to use must be writable under ProtectSystem=strict.
    let exec = one("ExecStart").unwrap();
    let data_dir = exec.split("--data-dir ").nth(1).unwrap().split_whitespace().next().unwrap();
    let writable = one("ReadWritePaths").unwrap();
    assert!(data_dir.starts_with(writable), "{data_dir} is under ReadWritePaths={writable}");
}

#[test]
fn the_example_config_is_valid_and_documents_every_key() {
    let output = Command::new(BIN)
        .args(["serve", "--config", "config/backlinks.example.toml", "--print-config"])
        .env_remove("BACKLINKS_LISTEN")
        .env_remove("BACKLINKS_DATA_DIR")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let example = std::fs::read_to_string("config/backlinks.example.toml").unwrap();
    let table: toml::Table = String::from_utf8(output.stdout).unwrap().parse().unwrap();
    for key in table.keys() {
        let documented = example.lines().any(|l| {
            let l = l.trim_start_matches(['#', ' ']);
            l.starts_with(&format!("{key} =")) || l.starts_with(&format!("{key} = "))
        });
        assert!(documented, "config key {key} is not in config/backlinks.example.toml");
    }
    for key in ["s3_endpoint", "s3_region", "s3_access_key_id", "s3_secret_access_key", "s3_force_path_style"] {
        assert!(example.contains(&format!("# {key} =")), "{key} is documented");
    }
}

#[test]
fn the_dockerfile_builds_in_two_stages_and_runs_unprivileged() {
    let dockerfile = std::fs::read_to_string("Dockerfile").unwrap();
    assert_eq!(dockerfile.matches("\nFROM ").count(), 2, "a build stage and a runtime stage");
    // Everything the build reads (include_str! of lexicons, migrations, bench targets).
    for copied in ["COPY src ", "COPY migrations ", "COPY lexicons ", "COPY benches ", "COPY Cargo.toml Cargo.lock "] {
        assert!(dockerfile.contains(copied), "{copied}");
    }
    assert!(dockerfile.contains("\nUSER backlinks\n"));
    assert!(dockerfile.contains("VOLUME [\"/var/lib/backlinks\"]"));
    assert!(dockerfile.contains("BACKLINKS_DATA_DIR=/var/lib/backlinks/data"));
}
