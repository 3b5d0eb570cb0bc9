//! The `backlinks` command line: serve, import, backfill, query.

use anyhow::{Context, bail};
use backlinks::config::{DEFAULT_LISTEN, FileConfig};
use backlinks::index::{Index, IndexOptions};
use backlinks::ingest::import_lines;
use backlinks::query::list_backlinks;
use backlinks::server::{parse_list_query, router};
use backlinks::store::dir::DirStore;
use backlinks::store::object::Store;
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "backlinks", version, about = "An AT Protocol backlink index")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the XRPC API (and, later, ingest the live network).
    Serve(ServeArgs),
    /// Apply every event of a Jetstream v1 JSON-lines file, flush, upload and publish.
    Import(ImportArgs),
    /// Index whole repositories (not built yet).
    Backfill(BackfillArgs),
    /// Print the listBacklinks JSON for a target.
    Query(QueryArgs),
}

#[derive(Args, Clone)]
struct Common {
    /// TOML config file; flags and BACKLINKS_* variables override its keys.
    #[arg(long, env = "BACKLINKS_CONFIG")]
    config: Option<PathBuf>,
    /// Local data directory (default ./data).
    #[arg(long, env = "BACKLINKS_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Object store: file:///PATH (default <data-dir>/bucket); s3://BUCKET/PREFIX comes later.
    #[arg(long, env = "BACKLINKS_STORE")]
    store: Option<String>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// Address to listen on (default 127.0.0.1:8080; port 0 picks a free port).
    #[arg(long, env = "BACKLINKS_LISTEN")]
    listen: Option<String>,
    /// Serve queries only; do not follow the firehose.
    #[arg(long, env = "BACKLINKS_NO_INGEST")]
    no_ingest: bool,
    /// Jetstream instances to follow, in order of preference.
    #[arg(long, env = "BACKLINKS_JETSTREAM", value_delimiter = ',')]
    jetstream: Vec<String>,
    /// Serve a bucket that another process writes.
    #[arg(long, env = "BACKLINKS_READ_ONLY")]
    read_only: bool,
}

#[derive(Args)]
struct ImportArgs {
    #[command(flatten)]
    common: Common,
    /// Jetstream v1 JSON-lines file.
    file: PathBuf,
}

#[derive(Args)]
struct BackfillArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    relay: Vec<String>,
    #[arg(long)]
    pds: Vec<String>,
    #[arg(long)]
    repo: Vec<String>,
    #[arg(long)]
    car: Vec<PathBuf>,
}

#[derive(Args)]
struct QueryArgs {
    #[command(flatten)]
    common: Common,
    /// at://DID/COLLECTION/RKEY, at://DID or a bare DID.
    target: String,
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long)]
    cursor: Option<String>,
    #[arg(long)]
    reverse: bool,
    /// Only sources in this collection (repeatable).
    #[arg(long)]
    collection: Vec<String>,
    /// Only links at this location (repeatable).
    #[arg(long)]
    location: Vec<String>,
}

/// The resolved settings shared by every command.
struct Setup {
    file: FileConfig,
    data_dir: PathBuf,
    store: Arc<dyn Store>,
}

fn setup(common: &Common) -> anyhow::Result<Setup> {
    let file = FileConfig::load(common.config.as_deref())?;
    let data_dir = common.data_dir.clone().or(file.data_dir.clone()).unwrap_or_else(|| PathBuf::from("data"));
    let store_url = common.store.clone().or(file.store.clone());
    let store = open_store(store_url.as_deref(), &data_dir)?;
    Ok(Setup { file, data_dir, store })
}

fn open_store(url: Option<&str>, data_dir: &std::path::Path) -> anyhow::Result<Arc<dyn Store>> {
    match url {
        None => Ok(Arc::new(DirStore::new(data_dir.join("bucket")))),
        Some(url) if url.starts_with("file://") => Ok(Arc::new(DirStore::new(PathBuf::from(&url["file://".len()..])))),
        Some(url) if url.starts_with("s3://") => bail!("the S3 store is not built yet; use file:///PATH or no --store"),
        Some(url) => bail!("unsupported store URL {url:?}: expected file:///PATH or s3://BUCKET/PREFIX"),
    }
}

/// Table-id randomness, drawn once here and injected (never drawn deep inside).
fn entropy_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn open_index(setup: &Setup, read_only: bool) -> anyhow::Result<Arc<Index>> {
    let options = IndexOptions { read_only, ..setup.file.index_options()? };
    let index = Index::open(&setup.data_dir, setup.store.clone(), options, entropy_seed())
        .with_context(|| format!("opening the index in {}", setup.data_dir.display()))?;
    Ok(Arc::new(index))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
        Command::Import(args) => import(args).await,
        Command::Backfill(_) => bail!("backfill is not built yet: it arrives with repository ingest"),
        Command::Query(args) => query(args).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let read_only = args.read_only || setup.file.read_only.unwrap_or(false);
    let no_ingest = args.no_ingest || setup.file.no_ingest.unwrap_or(false);
    let index = open_index(&setup, read_only)?;
    if !no_ingest && !read_only {
        tracing::warn!("live ingest is not built yet; serving the existing index only");
    }
    let listen = args.listen.or(setup.file.listen.clone()).unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, data_dir = %setup.data_dir.display(), "serving");
    axum::serve(listener, router(index)).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let index = open_index(&setup, false)?;
    let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let writer = index.clone();
    let report =
        tokio::task::spawn_blocking(move || import_lines(&writer, std::io::BufReader::with_capacity(1 << 20, file)))
            .await??;
    let manifest = index.publish_manifest().await?;
    for (line, reason) in &report.examples {
        tracing::warn!(line, %reason, "skipped malformed line");
    }
    let summary = serde_json::json!({
        "lines": report.lines,
        "applied": report.applied,
        "skipped": report.skipped,
        "malformed": report.malformed,
        "tooLong": report.too_long,
        "flushes": report.flushes,
        "clock": index.position().clock,
        "manifest": manifest,
    });
    println!("{summary}");
    Ok(())
}

async fn query(args: QueryArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let index = open_index(&setup, true)?;
    let mut pairs = vec![("target".to_string(), args.target.clone())];
    pairs.extend(args.limit.map(|l| ("limit".to_string(), l.to_string())));
    pairs.extend(args.cursor.clone().map(|c| ("cursor".to_string(), c)));
    pairs.extend(args.reverse.then(|| ("reverse".to_string(), "true".to_string())));
    pairs.extend(args.collection.iter().map(|c| ("collection".to_string(), c.clone())));
    pairs.extend(args.location.iter().map(|l| ("location".to_string(), l.clone())));
    let raw = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    let params = parse_list_query(Some(&raw)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let page = list_backlinks(&index, &params).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{}", serde_json::to_string(&page.to_json())?);
    Ok(())
}
