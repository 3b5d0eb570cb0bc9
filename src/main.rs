//! The `backlinks` command line: serve, import, backfill, query.

use anyhow::{Context, bail};
use backlinks::compactor::Compactor;
use backlinks::config::{DEFAULT_JETSTREAM, DEFAULT_LISTEN, FileConfig};
use backlinks::index::{Index, IndexError, IndexOptions};
use backlinks::ingest::import_lines_with;
use backlinks::ingest::live::{Instance, LiveIngest, LiveOptions};
use backlinks::lease::WriterLease;
use backlinks::metrics::{MeteredStore, Metrics};
use backlinks::query::list_backlinks;
use backlinks::server::systemd::{Notifier, feed_watchdog, watchdog_interval};
use backlinks::server::{ServerOptions, app, parse_list_query};
use backlinks::status::IngestMode;
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
    /// Object store: file:///PATH (default <data-dir>/bucket) or s3://BUCKET/PREFIX.
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
    /// Queries served at once; one more gets an immediate 503 (default 64).
    #[arg(long, env = "BACKLINKS_MAX_CONCURRENT_QUERIES")]
    max_concurrent_queries: Option<usize>,
    /// Stop a query after this many milliseconds with a 503 (default 10000).
    #[arg(long, env = "BACKLINKS_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: Option<u64>,
    /// Cache-Control max-age of query answers, in seconds (default 5).
    #[arg(long, env = "BACKLINKS_CACHE_MAX_AGE_SECS")]
    cache_max_age_secs: Option<u64>,
    /// Entries countBacklinks reads before it estimates (default 65536).
    #[arg(long, env = "BACKLINKS_COUNT_EXACT_LIMIT")]
    count_exact_limit: Option<usize>,
    /// Print the effective configuration (TOML, secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
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
    let store = open_store(store_url.as_deref(), &data_dir, &file)?;
    Ok(Setup { file, data_dir, store })
}

fn open_store(url: Option<&str>, data_dir: &std::path::Path, file: &FileConfig) -> anyhow::Result<Arc<dyn Store>> {
    match url {
        None => Ok(Arc::new(DirStore::new(data_dir.join("bucket")))),
        Some(url) if url.starts_with("file://") => Ok(Arc::new(DirStore::new(PathBuf::from(&url["file://".len()..])))),
        Some(url) if url.starts_with("s3://") => {
            let env = |name: &str| std::env::var(name).ok();
            let mut settings = backlinks::store::s3::S3Settings::resolve(url, &file.s3_keys(), &env)?;
            settings.retry.seed = entropy_seed();
            Ok(Arc::new(backlinks::store::s3::S3Store::new(settings)?))
        }
        Some(url) => bail!("unsupported store URL {url:?}: expected file:///PATH or s3://BUCKET/PREFIX"),
    }
}

/// Wall-clock milliseconds, read only here at the top and passed down (GC and retirement times).
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
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
    if args.print_config {
        print!("{}", effective_config(&args)?);
        return Ok(());
    }
    let setup = setup(&args.common)?;
    let config = serve_config(&args, &setup.file);
    let (read_only, no_ingest) = (config.read_only == Some(true), config.no_ingest == Some(true));
    let ingesting = !no_ingest && !read_only;
    let metrics = Arc::new(Metrics::new());
    let setup = Setup { store: Arc::new(MeteredStore::new(setup.store.clone(), metrics.clone())), ..setup };
    // A replica writes its own data directory (the manifests it follows), so it takes its lock too.
    let index = open_index(&setup, false)?;
    // A live writer takes the bucket prefix's lease before it touches the bucket (as import does).
    let lease = match ingesting {
        true => {
            let owner = backlinks::lease::owner_id(&setup.data_dir, entropy_seed())?;
            Some(WriterLease::acquire(setup.store.clone(), &owner, unix_ms(), LEASE_TTL_MS, LEASE_SETTLE).await?)
        }
        false => None,
    };
    if index.restore_if_empty(unix_ms()).await? {
        tracing::info!(position = ?index.position(), "restored the data directory from the bucket");
    }
    if read_only {
        start_following(index.clone(), REPLICA_POLL);
    }
    let live = match lease {
        Some(lease) => Some(start_live_ingest(&index, &config, lease)?),
        None => None,
    };
    if let Some((live, _)) = &live {
        metrics.attach_ingest(live.status.clone());
    }
    let ingest = match &live {
        Some((_, source)) => IngestMode::Following { source: source.clone() },
        None if read_only => IngestMode::ReadOnly,
        None => IngestMode::ImportOnly,
    };
    let options = ServerOptions { ingest, ..ServerOptions::from_config(&config)? };
    let notifier = Notifier::new(std::env::var_os("NOTIFY_SOCKET").as_deref()).context("NOTIFY_SOCKET")?.map(Arc::new);
    let listen = config.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, data_dir = %setup.data_dir.display(), "serving");
    if let Some(notifier) = &notifier {
        notify_systemd(notifier, &format!("READY=1\nSTATUS=serving on http://{addr}"));
        start_watchdog(notifier.clone(), index.clone());
    }
    let ingest_stopped = live.as_ref().map(|(live, _)| live.stopped());
    let shutdown = async move {
        match ingest_stopped {
            // An ingest that stops by itself has failed: stop serving too, so a supervisor restarts us.
            Some(stopped) => tokio::select! { _ = shutdown_signal(notifier.clone()) => {}, _ = stopped => {} },
            None => shutdown_signal(notifier.clone()).await,
        }
    };
    axum::serve(listener, app(index, options, metrics)).with_graceful_shutdown(shutdown).await?;
    if let Some((live, _)) = live {
        tokio::task::spawn_blocking(move || live.stop()).await?.context("live ingest")?;
    }
    Ok(())
}

/// Follows the configured Jetstream instances (default: the public ones, v2 first) from the
/// index's durable cursor. Returns the ingest and the preferred instance's URL.
fn start_live_ingest(
    index: &Arc<Index>,
    config: &FileConfig,
    lease: WriterLease,
) -> anyhow::Result<(LiveIngest, String)> {
    let urls = config.jetstream.clone().unwrap_or_else(|| DEFAULT_JETSTREAM.iter().map(|s| s.to_string()).collect());
    let instances = urls.iter().map(|url| Instance::parse(url)).collect::<Result<Vec<_>, _>>()?;
    let mut options = LiveOptions::new(instances, entropy_seed());
    if let Some(secs) = config.max_unflushed_secs {
        options.max_unflushed_ms = secs.clamp(1, 3_600) * 1_000;
    }
    if let Some(secs) = config.publish_interval_secs {
        options.publish_every_ms = secs.clamp(1, 30) * 1_000;
    }
    let source = urls.first().cloned().unwrap_or_default();
    let live =
        LiveIngest::start(index.clone(), options, Some(lease), Arc::new(unix_ms), tokio::runtime::Handle::current())?;
    Ok((live, source))
}

/// The config file's keys with the serve flags and `BACKLINKS_*` variables applied (flags win).
fn serve_config(args: &ServeArgs, file: &FileConfig) -> FileConfig {
    let jetstream = if args.jetstream.is_empty() { file.jetstream.clone() } else { Some(args.jetstream.clone()) };
    FileConfig {
        data_dir: args.common.data_dir.clone().or(file.data_dir.clone()),
        store: args.common.store.clone().or(file.store.clone()),
        listen: args.listen.clone().or(file.listen.clone()),
        jetstream,
        no_ingest: Some(args.no_ingest || file.no_ingest.unwrap_or(false)),
        read_only: Some(args.read_only || file.read_only.unwrap_or(false)),
        max_concurrent_queries: args.max_concurrent_queries.or(file.max_concurrent_queries),
        request_timeout_ms: args.request_timeout_ms.or(file.request_timeout_ms),
        cache_max_age_secs: args.cache_max_age_secs.or(file.cache_max_age_secs),
        count_exact_limit: args.count_exact_limit.or(file.count_exact_limit),
        ..file.clone()
    }
}

/// `serve --print-config`: every setting in effect, as TOML, with secrets redacted. Keys only the
/// file sets (the S3 ones, say) are shown as the file has them.
fn effective_config(args: &ServeArgs) -> anyhow::Result<String> {
    let path = args.common.config.as_deref();
    let config = serve_config(args, &FileConfig::load(path)?);
    let (engine, server) = (config.index_options()?, ServerOptions::from_config(&config)?);
    let data_dir = config.data_dir.clone().unwrap_or_else(|| PathBuf::from("data"));
    let store = config.store.clone().unwrap_or_else(|| format!("file://{}", data_dir.join("bucket").display()));
    let jetstream =
        config.jetstream.clone().unwrap_or_else(|| DEFAULT_JETSTREAM.iter().map(|s| s.to_string()).collect());
    let mut table = backlinks::config::load_table(path)?;
    let mut set = |key: &str, value: toml::Value| {
        table.insert(key.to_string(), value);
    };
    set("data_dir", data_dir.display().to_string().into());
    set("store", store.into());
    set("listen", config.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.to_string()).into());
    set("jetstream", toml::Value::Array(jetstream.into_iter().map(toml::Value::from).collect()));
    set("no_ingest", config.no_ingest.unwrap_or(false).into());
    set("read_only", config.read_only.unwrap_or(false).into());
    set("memtable_bytes", (engine.memtable_bytes as i64).into());
    set("frame_bytes", (engine.table.frame_bytes as i64).into());
    set("zstd_level", i64::from(engine.table.zstd_level).into());
    set("filter_fpr", engine.table.filter_fpr.into());
    set("outline_cache_entries", (engine.outline_cache_entries as i64).into());
    set("max_concurrent_queries", (server.max_concurrent_queries as i64).into());
    set("request_timeout_ms", (server.request_timeout.as_millis() as i64).into());
    set("cache_max_age_secs", (server.cache_max_age.as_secs() as i64).into());
    set("count_exact_limit", (server.count.exact_scan_limit as i64).into());
    backlinks::config::redact_secrets(&mut table);
    Ok(toml::to_string(&table)?)
}

fn notify_systemd(notifier: &Notifier, state: &str) {
    if let Err(e) = notifier.notify(state) {
        tracing::warn!(error = %e, state, "systemd notification failed");
    }
}

/// Feeds systemd's watchdog (when `WATCHDOG_USEC` asks for it) while the catalog answers.
fn start_watchdog(notifier: Arc<Notifier>, index: Arc<Index>) {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    if let Some(every) = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id()) {
        tracing::info!(?every, "feeding the systemd watchdog");
        tokio::spawn(feed_watchdog(notifier, every, move || index.catalog.position().is_ok()));
    }
}

async fn shutdown_signal(notifier: Option<Arc<Notifier>>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    if let Some(notifier) = &notifier {
        notify_systemd(notifier, "STOPPING=1");
    }
}

/// How long a writer's lease on the bucket prefix lasts without renewal, and how long a new
/// writer waits before reading its lease back (see `backlinks::lease`).
const LEASE_TTL_MS: u64 = 60_000;
const LEASE_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// How often a replica (`serve --read-only`) checks the bucket's CURRENT.
const REPLICA_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// A replica's loop: follow every manifest the writer publishes.
fn start_following(index: Arc<Index>, every: std::time::Duration) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            match index.follow_current(unix_ms()).await {
                Ok(true) => tracing::info!(position = ?index.position(), "followed a new manifest"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "following the bucket failed; retrying"),
            }
        }
    });
}

async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let index = open_index(&setup, false)?;
    let owner = backlinks::lease::owner_id(&setup.data_dir, entropy_seed())?;
    let lease = WriterLease::acquire(setup.store.clone(), &owner, unix_ms(), LEASE_TTL_MS, LEASE_SETTLE).await?;
    index.restore_if_empty(unix_ms()).await?;
    let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    // Merges run on the compactor's thread while the import goes on.
    let compactor = Compactor::spawn(index.clone(), tokio::runtime::Handle::current(), Arc::new(unix_ms));
    let (writer, runtime) = (index.clone(), tokio::runtime::Handle::current());
    let report = tokio::task::spawn_blocking(move || {
        let mut lease = lease;
        let mut after_flush = |_: &Index| {
            compactor.nudge();
            runtime.block_on(lease.renew(unix_ms())).map_err(|e| IndexError::Lease(e.to_string()))
        };
        let report = import_lines_with(&writer, std::io::BufReader::with_capacity(1 << 20, file), &mut after_flush);
        let merges = compactor.finish();
        report.and_then(|report| Ok((report, lease, merges?)))
    })
    .await??;
    let (report, lease, merges) = report;
    let manifest = index.publish_manifest().await?;
    lease.release().await?;
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
        "compactions": merges,
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
