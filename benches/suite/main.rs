//! The benchmark suite of issue 7: the pieces of `scripts/bench.sh` that need Rust. Each
//! subcommand measures one thing on one generated workload (or the index and SQLite baseline
//! built from it) and prints one JSON object on stdout; the script collects them.
//!
//! `cargo bench --bench suite -- SUBCOMMAND ...` runs one measurement; with no subcommand (as
//! `cargo test --all-targets` runs it) it makes a smoke pass over every subcommand on a tiny
//! workload and checks that backlinks and the SQLite baseline give the same answers.
//!
//! Invariants:
//! - Every measurement is bounded: by a duration (`--seconds`), a count (`--queries`,
//!   `--probes`) or the size of the input file.
//! - Nothing here is a timed assertion: the smoke pass checks answers and round counts only.

mod cold;
mod cpu;
mod figures;
mod load;
mod smoke;
mod sqlite;
mod study;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "suite", about = "backlinks benchmark pieces (see scripts/bench.sh)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bare serde_json::Value parse rate of a JSON-lines file (the physical limit of import).
    Parse { file: PathBuf },
    /// Loads the links of a Jetstream v1 file into a SQLite database (the baseline).
    SqliteLoad { file: PathBuf, db: PathBuf },
    /// Picks query targets with 1..=100 live backlinks from the baseline, in three bands.
    Targets {
        db: PathBuf,
        out: PathBuf,
        #[arg(long, default_value_t = 1_000)]
        per_band: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Warm listBacklinks load against a running `backlinks serve` over HTTP/1.1 keep-alive.
    Http {
        addr: String,
        targets: PathBuf,
        #[command(flatten)]
        load: load::LoadArgs,
    },
    /// The same load on the index in-process (no HTTP), for a like-for-like ratio with SQLite.
    Inproc {
        data_dir: PathBuf,
        targets: PathBuf,
        #[command(flatten)]
        load: load::LoadArgs,
    },
    /// The same load on the SQLite baseline, one connection per client.
    SqliteQuery {
        db: PathBuf,
        targets: PathBuf,
        #[command(flatten)]
        load: load::LoadArgs,
    },
    /// Cold listBacklinks from the bucket with a fixed latency per object-store request.
    Cold {
        data_dir: PathBuf,
        targets: PathBuf,
        #[arg(long, default_value_t = 20)]
        rtt_ms: u64,
        #[arg(long, default_value_t = 200)]
        queries: usize,
    },
    /// Bucket bytes per live link (after garbage collection) and write amplification.
    Bucket {
        data_dir: PathBuf,
        db: PathBuf,
        /// Bytes the import process wrote to the filesystem (from `/usr/bin/time -v`).
        #[arg(long)]
        fs_written: Option<u64>,
    },
    /// Key-filter lookup time and false-positive rate on the index's own tables.
    Filter {
        data_dir: PathBuf,
        #[arg(long, default_value_t = 1_000_000)]
        probes: usize,
    },
    /// Bytes per entry of the largest link table under other frame encodings (a study).
    Study {
        data_dir: PathBuf,
        #[arg(long, default_value_t = 2_000_000)]
        entries: usize,
    },
    /// Checks that backlinks and the baseline answer the same for the first `count` targets.
    Check {
        data_dir: PathBuf,
        db: PathBuf,
        targets: PathBuf,
        #[arg(long, default_value_t = 300)]
        count: usize,
    },
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` appends --bench; `cargo test --all-targets` passes no subcommand at all.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if args.get(1).is_none_or(|a| a.starts_with('-')) {
        return smoke::run();
    }
    let report = run(Cli::parse_from(args).command)?;
    println!("{report}");
    Ok(())
}

fn run(command: Command) -> anyhow::Result<serde_json::Value> {
    match command {
        Command::Parse { file } => figures::parse_rate(&file),
        Command::SqliteLoad { file, db } => sqlite::load(&file, &db),
        Command::Targets { db, out, per_band, seed } => sqlite::pick_targets(&db, &out, per_band, seed),
        Command::Http { addr, targets, load } => load::http(&addr, &load::read_targets(&targets)?, &load),
        Command::Inproc { data_dir, targets, load } => load::inproc(&data_dir, &load::read_targets(&targets)?, &load),
        Command::SqliteQuery { db, targets, load } => load::sqlite(&db, &load::read_targets(&targets)?, &load),
        Command::Cold { data_dir, targets, rtt_ms, queries } => {
            cold::run(&data_dir, &load::read_targets(&targets)?, rtt_ms, queries)
        }
        Command::Bucket { data_dir, db, fs_written } => figures::bucket(&data_dir, &db, fs_written),
        Command::Filter { data_dir, probes } => figures::filter(&data_dir, probes),
        Command::Study { data_dir, entries } => study::run(&data_dir, entries),
        Command::Check { data_dir, db, targets, count } => {
            figures::check(&data_dir, &db, &load::read_targets(&targets)?, count)
        }
    }
}
