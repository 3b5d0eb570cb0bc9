//! The smoke pass `cargo test --all-targets` runs: every subcommand on a 3,000-event workload
//! from the real `backlinks-workload` binary, imported by the real `backlinks` binary, with
//! sub-second load phases. It checks answers and rounds, never speed.

use crate::{cold, figures, load, sqlite};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_backlinks-workload");
const BACKLINKS: &str = env!("CARGO_BIN_EXE_backlinks");
const EVENTS: &str = "3000";

pub fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (file, data, db, targets) =
        (dir.path().join("w.jsonl"), dir.path().join("data"), dir.path().join("baseline.db"), dir.path().join("t"));
    let workload = Command::new(WORKLOAD).args(["--seed", "5", "--events", EVENTS, "--out"]).arg(&file).output()?;
    anyhow::ensure!(workload.status.success(), "workload: {}", String::from_utf8_lossy(&workload.stderr));
    let import = Command::new(BACKLINKS).arg("import").arg("--data-dir").arg(&data).arg(&file).output()?;
    anyhow::ensure!(import.status.success(), "import: {}", String::from_utf8_lossy(&import.stderr));

    let parsed = figures::parse_rate(&file)?;
    assert_eq!(parsed["events"], 3000);
    let loaded = sqlite::load(&file, &db)?;
    assert!(loaded["live_links"].as_i64().unwrap() > 2_000, "{loaded}");
    let picked = sqlite::pick_targets(&db, &targets, 50, 1)?;
    assert!(picked["targets"].as_u64().unwrap() >= 50, "{picked}");
    let targets = load::read_targets(&targets)?;

    let checked = figures::check(&data, &db, &targets, targets.len())?;
    assert_eq!(checked["differing"], 0, "backlinks and the baseline disagree: {checked}");
    let quick = load::LoadArgs { connections: 4, seconds: 0.2, warmup: 0.1, server_pid: None };
    for report in
        [load::inproc(&data, &targets, &quick)?, load::sqlite(&db, &targets, &quick)?, http(&data, &targets, &quick)?]
    {
        assert_eq!(report["errors"], 0, "{report}");
        assert!(report["queries"].as_u64().unwrap() > 0, "{report}");
    }
    let cold = cold::run(&data, &targets, 2, 10)?;
    assert!(cold["max_serial_rounds"].as_u64().unwrap() <= 2, "{cold}");
    let bucket = figures::bucket(&data, &db, None)?;
    assert!(bucket["bytes_per_live_link"].as_f64().unwrap() > 0.0, "{bucket}");
    let filter = figures::filter(&data, 20_000)?;
    assert!(filter["fpr_measured"].as_f64().unwrap() < 0.05, "{filter}");
    println!("suite smoke pass: ok ({} targets, answers agree)", targets.len());
    Ok(())
}

/// Starts `backlinks serve --no-ingest` on a free port, runs the HTTP load, stops the server.
fn http(data: &Path, targets: &[String], args: &load::LoadArgs) -> anyhow::Result<serde_json::Value> {
    let mut child = Command::new(BACKLINKS)
        .args(["serve", "--no-ingest", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line)?;
    let report = match line.trim().strip_prefix("listening on http://") {
        Some(addr) => load::http(addr, targets, args),
        None => Err(anyhow::anyhow!("serve printed {line:?}")),
    };
    child.kill()?;
    child.wait()?;
    report
}
