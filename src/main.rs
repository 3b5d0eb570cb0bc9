//! The `backlinks` command line: serve, import, backfill, query, verify.

use anyhow::{Context, bail};
use backlinks::base::clock::{system_clock, unix_ms};
use backlinks::config::{DEFAULT_JETSTREAM, DEFAULT_LISTEN, FileConfig};
use backlinks::index::{Index, IndexError, IndexOptions};
use backlinks::ingest::backfill::progress::BackfillProgress;
use backlinks::ingest::backfill::{self as backfills, Backfill, Source};
use backlinks::ingest::import_lines_with;
use backlinks::ingest::import_progress::{Backlog, ImportProgress};
use backlinks::ingest::live::{IdentityHook, Instance, LiveIngest, LiveOptions, PushFeed};
use backlinks::ingest::read_ahead::ReadAhead;
use backlinks::metrics::{MeteredStore, Metrics};
use backlinks::push::PushCounters;
use backlinks::push::feed::{Feed, FeedOptions};
use backlinks::push::hub::delivery_runtime;
use backlinks::push::hub::{Hub, HubOptions};
use backlinks::query::list_backlinks;
use backlinks::server::systemd::{Notifier, feed_watchdog, watchdog_interval};
use backlinks::server::{HttpThreads, PushHandle, ServerOptions, app, parse_list_query};
use backlinks::status::IngestMode;
use backlinks::store::dir::DirStore;
use backlinks::store::object::Store;
use backlinks::store::pinned::PinnedStore;
use backlinks::writer::{Finished, Writer, WriterOptions};
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
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
    /// Index whole repositories: CAR files, one repo, one PDS, or a whole relay's network.
    Backfill(BackfillArgs),
    /// Print the listBacklinks JSON for a target.
    Query(QueryArgs),
    /// Check the checksum of every object the current manifest names and of every local copy;
    /// prints one line per object and exits non-zero when anything is corrupt or missing.
    Verify(VerifyArgs),
}

#[derive(Args)]
struct VerifyArgs {
    #[command(flatten)]
    common: Common,
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
    /// Backfill every repository behind these relays while following the live stream.
    #[arg(long, env = "BACKLINKS_BACKFILL_RELAY", value_delimiter = ',')]
    backfill_relay: Vec<String>,
    /// Backfill every repository of these PDSes while following the live stream.
    #[arg(long, env = "BACKLINKS_BACKFILL_PDS", value_delimiter = ',')]
    backfill_pds: Vec<String>,
    /// Backfill these repositories (DIDs) while following the live stream.
    #[arg(long, env = "BACKLINKS_BACKFILL_REPO", value_delimiter = ',')]
    backfill_repo: Vec<String>,
    /// Print the effective configuration (TOML, secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Args)]
struct ImportArgs {
    #[command(flatten)]
    common: Common,
    /// Jetstream v1 JSON-lines file, or `-` for standard input (a generated workload piped in).
    file: PathBuf,
}

#[derive(Args)]
struct BackfillArgs {
    #[command(flatten)]
    common: Common,
    /// Every repository of every PDS a relay lists (listHosts, then listRepos and getRepo on each).
    #[arg(long, env = "BACKLINKS_BACKFILL_RELAY", value_delimiter = ',')]
    relay: Vec<String>,
    /// Every repository one PDS lists.
    #[arg(long, env = "BACKLINKS_BACKFILL_PDS", value_delimiter = ',')]
    pds: Vec<String>,
    /// One repository (a DID), fetched from the PDS its DID document names.
    #[arg(long, env = "BACKLINKS_BACKFILL_REPO", value_delimiter = ',')]
    repo: Vec<String>,
    /// A repository CAR file.
    #[arg(long, env = "BACKLINKS_BACKFILL_CAR", value_delimiter = ',')]
    car: Vec<PathBuf>,
    /// Repositories fetched at once (default 8).
    #[arg(long, env = "BACKLINKS_BACKFILL_CONCURRENCY")]
    concurrency: Option<usize>,
    /// Requests started per second on one PDS (default 5).
    #[arg(long, env = "BACKLINKS_BACKFILL_PER_HOST_PER_SECOND")]
    per_host_per_second: Option<f64>,
    /// The PLC directory that resolves did:plc identities (default https://plc.directory).
    #[arg(long, env = "BACKLINKS_PLC_URL")]
    plc_url: Option<String>,
    /// A DID document (file) to verify `--car` files of its DID with, offline (repeatable).
    #[arg(long, env = "BACKLINKS_BACKFILL_DID_DOC", value_delimiter = ',')]
    did_doc: Vec<PathBuf>,
    /// A private, loopback or link-local address (`IP` or `IP:port`) backfill may reach anyway:
    /// for local setups and tests (repeatable; default: public addresses only).
    #[arg(long, env = "BACKLINKS_BACKFILL_ALLOW_PRIVATE", value_delimiter = ',')]
    allow_private: Vec<String>,
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

/// The bucket prefix's writer for this data directory: its lease taken (as this directory's
/// owner), the directory restored from the bucket if it is new, merges started.
async fn start_writer(index: &Arc<Index>, setup: &Setup, options: WriterOptions) -> anyhow::Result<Writer> {
    let owner = backlinks::writer::lease::owner_id(&setup.data_dir, entropy_seed())?;
    let runtime = tokio::runtime::Handle::current();
    Ok(Writer::start(index.clone(), Some(&owner), system_clock(), options, runtime).await?)
}

fn main() -> anyhow::Result<()> {
    tune_malloc();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run())
}

/// Two glibc defaults that keep freed memory from going back to the system; both are set before
/// any thread starts, and the environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`) still
/// wins. Neither cost measurable speed (BENCHMARKS.md, issue 22).
/// - Arenas: glibc gives each thread that allocates its own (up to eight per core), and freed
///   memory stays in the arena it came from: with a dozen threads (runtime workers, HTTP threads,
///   the compactor, the blocking pool) a 100 M-link import held 858 MiB at its peak for a heap of
///   a fraction of that. Two arenas.
/// - Large blocks: glibc maps a block of 128 KiB or more on its own and unmaps it when freed, but
///   raises that threshold to the size of every such block freed (up to 32 MiB), after which the
///   merges' and flushes' buffers of a few MiB come from the heap and stay there when freed: a
///   100 M-link import's resident memory was 280 MiB at the median and 370-400 MiB at its peak,
///   and 218 and 339 MiB with the threshold fixed at 1 MiB.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (variable, parameter, value) in
        [("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2), ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 1 << 20)]
    {
        if std::env::var_os(variable).is_none() {
            // SAFETY: mallopt only sets an allocator parameter; no other thread exists yet.
            unsafe {
                libc::mallopt(parameter, value);
            }
        }
    }
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
        Command::Import(args) => import(args).await,
        Command::Backfill(args) => backfill(args).await,
        Command::Query(args) => query(args).await,
        Command::Verify(args) => verify(args).await,
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
    // Store requests run on this runtime even when a serving thread asks (see `PinnedStore`).
    let metered: Arc<dyn Store> = Arc::new(MeteredStore::new(setup.store.clone(), metrics.clone()));
    let setup = Setup { store: Arc::new(PinnedStore::new(metered, tokio::runtime::Handle::current())), ..setup };
    // A replica writes its own data directory (the manifests it follows), so it takes its lock too.
    let index = open_index(&setup, false)?;
    // A live writer takes the bucket prefix's lease before it touches the bucket (as import does).
    let writer = match ingesting {
        true => Some(start_writer(&index, &setup, config.writer_options()).await?),
        false => {
            // A server that only reads fetches metas on demand: it answers once it has the manifest.
            if index.restore_on_demand_if_empty(unix_ms()).await? {
                tracing::info!(position = ?index.position(), "restored the data directory from the bucket");
            }
            None
        }
    };
    if read_only {
        start_following(index.clone(), REPLICA_POLL);
    }
    let live = match writer {
        Some(writer) => {
            // Every live write goes through backfill's gate, so snapshots (now or later) and live
            // commits are ordered by revision.
            let backfill = open_backfill(&index, &setup.data_dir, &config).await?;
            let sources = backfill_sources(&config);
            if !sources.is_empty() {
                metrics.attach_backfill(backfill.progress.clone());
                tokio::spawn(backfill_beside_live(backfill.clone(), sources));
            }
            let push = start_push(&setup.data_dir, &config, &index)?;
            Some((start_live_ingest(writer, &config, &backfill, push.as_ref().map(|push| push.feed.clone()))?, push))
        }
        None => None,
    };
    let (live, push) = match live {
        Some((live, push)) => (Some(live), push),
        None => (None, None),
    };
    if let Some(push) = &push {
        metrics.attach_push(push.hub.counters().clone());
    }
    if let Some((live, _)) = &live {
        metrics.attach_ingest(live.status.clone());
    }
    let ingest = match &live {
        Some((_, source)) => IngestMode::Following { source: source.clone() },
        None if read_only => IngestMode::ReadOnly,
        None => IngestMode::ImportOnly,
    };
    // The hub and the subscribers' connections run on their own runtime, below ingest (see
    // `push::hub`); it stops without waiting for them when this function returns.
    let (push, _delivery) = match push {
        Some(Push { hub, delivery, .. }) => {
            let handle = delivery.handle().expect("push's runtime runs");
            (Some(PushHandle { hub, delivery: handle }), delivery)
        }
        None => (None, Background(None)),
    };
    let options = ServerOptions { ingest, push, ..ServerOptions::from_config(&config)? };
    let notifier = Notifier::new(std::env::var_os("NOTIFY_SOCKET").as_deref()).context("NOTIFY_SOCKET")?.map(Arc::new);
    let listen = config.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let threads = options.http_threads;
    let http = HttpThreads::start(&listen, threads, app(index.clone(), options.clone(), metrics), &options)
        .await
        .with_context(|| format!("starting the HTTP listener on {listen}"))?;
    let addr = http.local_addr();
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, threads, data_dir = %setup.data_dir.display(), "serving");
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
    // Live ingest stops (and flushes) whatever became of serving; serving's error comes first.
    let served = http.serve_until(shutdown).await.context("serving HTTP");
    if let Some((live, _)) = live {
        let stopped = tokio::task::spawn_blocking(move || live.stop()).await?.context("live ingest");
        if let (Err(error), Err(_)) = (&stopped, &served) {
            tracing::error!(error = format!("{error:#}"), "live ingest failed to stop");
        }
        return served.and(stopped);
    }
    served
}

/// A runtime that is shut down without waiting for its tasks when dropped (a runtime may not be
/// dropped the usual way inside another's task).
struct Background(Option<tokio::runtime::Runtime>);

impl Background {
    fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|runtime| runtime.handle().clone())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Follows the configured Jetstream instances (default: the public ones, v2 first) from the
/// index's durable cursor, writing through `writer`. Returns the ingest and the preferred
/// instance's URL.
fn start_live_ingest(
    writer: Writer,
    config: &FileConfig,
    backfill: &Arc<Backfill>,
    push: Option<PushFeed>,
) -> anyhow::Result<(LiveIngest, String)> {
    let urls = config.jetstream.clone().unwrap_or_else(|| DEFAULT_JETSTREAM.iter().map(|s| s.to_string()).collect());
    let instances = urls.iter().map(|url| Instance::parse(url)).collect::<Result<Vec<_>, _>>()?;
    let mut options = LiveOptions::new(instances, entropy_seed());
    options.gate = Some(backfill.gate().clone());
    options.push = push;
    let identities = backfill.clone();
    options.on_identity = Some(IdentityHook(Arc::new(move |did: &str| identities.forget_identity(did))));
    if let Some(secs) = config.max_unflushed_secs {
        options.max_unflushed_ms = secs.clamp(1, 3_600) * 1_000;
    }
    // Shown on the status page: never with credentials.
    let source = urls.first().map(|url| backlinks::base::redact::redact_url(url).into_owned()).unwrap_or_default();
    let live = LiveIngest::start(writer, options, system_clock(), tokio::runtime::Handle::current())?;
    Ok((live, source))
}

/// Live push: the feed ingest writes, the hub that follows it, and the runtime the hub and the
/// subscribers' connections run on.
struct Push {
    feed: PushFeed,
    hub: Arc<Hub>,
    /// In `Background` from the start: dropped on any path out of `serve`, it never blocks.
    delivery: Background,
}

/// Live push's feed (in `push/` under the data directory) and its hub, unless push is off.
fn start_push(data_dir: &Path, config: &FileConfig, index: &Index) -> anyhow::Result<Option<Push>> {
    let settings = config.push_settings()?;
    if !settings.enabled {
        return Ok(None);
    }
    let retain_us = settings.retain_hours as i64 * 3_600_000_000;
    let extract = index.extract_limits().clone();
    let options = FeedOptions::new(retain_us, settings.log_max_bytes, settings.recent_bytes, extract);
    let counters = Arc::new(PushCounters::default());
    let feed = Feed::open(&data_dir.join("push"), options, counters.clone()).context("opening the push log")?;
    let hub_options = HubOptions { max_subscribers: settings.max_subscribers, buffer_events: settings.buffer_events };
    let delivery = delivery_runtime().context("starting push delivery")?;
    let hub = Hub::start(feed.log(), hub_options, counters, delivery.handle());
    let delivery = Background(Some(delivery));
    Ok(Some(Push { feed: PushFeed(Arc::new(std::sync::Mutex::new(feed))), hub, delivery }))
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
        backfill_relay: flags_or(&args.backfill_relay, &file.backfill_relay),
        backfill_pds: flags_or(&args.backfill_pds, &file.backfill_pds),
        backfill_repo: flags_or(&args.backfill_repo, &file.backfill_repo),
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
    set("outline_map_bytes", (engine.outline_map_bytes as i64).into());
    set("frame_cache_bytes", (engine.frame_cache_bytes as i64).into());
    set("meta_cache_bytes", (engine.meta_cache_bytes as i64).into());
    set("hot_target_entries", (engine.hot_target_entries as i64).into());
    set("max_concurrent_queries", (server.max_concurrent_queries as i64).into());
    set("request_timeout_ms", (server.request_timeout.as_millis() as i64).into());
    set("max_connections", (server.max_connections as i64).into());
    set("max_connections_per_address", (server.max_connections_per_address as i64).into());
    set("header_read_timeout_secs", (server.header_read_timeout.as_secs() as i64).into());
    set("http_threads", (server.http_threads as i64).into());
    set("cache_max_age_secs", (server.cache_max_age.as_secs() as i64).into());
    set("count_exact_limit", (server.count.exact_scan_limit as i64).into());
    let push = config.push_settings()?;
    set("no_push", (!push.enabled).into());
    set("push_retain_hours", (push.retain_hours as i64).into());
    set("push_log_max_bytes", (push.log_max_bytes as i64).into());
    set("push_max_subscribers", (push.max_subscribers as i64).into());
    set("push_buffer_events", (push.buffer_events as i64).into());
    set("push_recent_bytes", (push.recent_bytes as i64).into());
    let writer = config.writer_options();
    set("gc_grace_secs", ((writer.gc_grace_ms / 1_000) as i64).into());
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

/// Bytes the import reads at a time, on its reading thread (four such chunks in flight).
const IMPORT_CHUNK_BYTES: usize = 256 << 10;

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
    // Merges run on the compactor's thread; uploads and manifests go on as the import does (a
    // task beside it ticks the writer), so local disk holds metas and the cache, not the index.
    let writer = Arc::new(tokio::sync::Mutex::new(start_writer(&index, &setup, setup.file.writer_options()).await?));
    let input: Box<dyn std::io::Read + Send> = match args.file.as_os_str() == "-" {
        true => Box::new(std::io::stdin()),
        false => Box::new(std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?),
    };
    let progress = Arc::new(ImportProgress::new(unix_ms()));
    let (stop_ticking, stopped) = tokio::sync::watch::channel(false);
    // What stopped the writer (a lost lease, say): the import stops at its next flush too.
    let writer_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let ticking = tokio::spawn(tick_while_importing(
        writer.clone(),
        (index.clone(), progress.clone()),
        stopped,
        writer_failure.clone(),
    ));
    let (importing, nudged, counted) = (index.clone(), writer.clone(), progress.clone());
    let imported = tokio::task::spawn_blocking(move || {
        let mut after_flush = |_: &Index| {
            if let Some(failure) = writer_failure.lock().expect("failure lock poisoned").clone() {
                return Err(IndexError::Background(format!("the writer failed: {failure}")));
            }
            nudged.blocking_lock().flushed();
            Ok(())
        };
        let input = ReadAhead::spawn(input, IMPORT_CHUNK_BYTES)
            .map_err(|source| IndexError::Io { path: "<input>".into(), source })?;
        import_lines_with(&importing, input, &mut after_flush, &counted)
    })
    .await;
    // Stopped between ticks, never inside one (a publish is not cut in half).
    let _ = stop_ticking.send(true);
    ticking.await??;
    let report = imported??;
    let writer = Arc::into_inner(writer).expect("the ticking task is gone").into_inner();
    let finished = writer.finish().await?;
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
        "flushSeconds": seconds(&index.counters.flush_micros),
        "tallySeconds": seconds(&index.counters.tally_micros),
        "tallyReadSeconds": {
            "hotLinksOfRecords": seconds(&index.counters.tally_reads.hot_link_keys_micros),
            "hotLinksOfAccounts": seconds(&index.counters.tally_reads.hot_link_accounts_micros),
            "revocations": seconds(&index.counters.tally_reads.revocations_micros),
            "accountTallies": seconds(&index.counters.tally_reads.account_tallies_micros),
            "promotions": seconds(&index.counters.tally_reads.promotions_micros),
        },
        "compactions": finished.merges,
        "compactionSeconds": seconds(&index.counters.compaction_micros),
        "clock": index.position().clock,
        "manifest": finished.manifest,
        "runs": index.run_count(),
    });
    println!("{summary}");
    Ok(())
}

/// Ticks the writer (lease, publish, GC) every second while an import runs, and shows progress:
/// a line rewritten on a terminal, a log line every `BACKFILL_LOG_EVERY_MS` otherwise; ends
/// between ticks once `stopped` says so, or at a tick that fails (its error left in `failure`).
async fn tick_while_importing(
    writer: Arc<tokio::sync::Mutex<Writer>>,
    (index, progress): (Arc<Index>, Arc<ImportProgress>),
    mut stopped: tokio::sync::watch::Receiver<bool>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
) -> anyhow::Result<()> {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut each_second = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut last_log_ms = unix_ms();
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => {
                if terminal {
                    eprintln!();
                }
                return Ok(());
            }
            _ = each_second.tick() => {}
        }
        if let Err(e) = writer.lock().await.tick().await {
            tracing::error!(error = %e, "the writer failed while importing");
            *failure.lock().expect("failure lock poisoned") = Some(e.to_string());
            return Err(e.into());
        }
        let backlog = Backlog { runs: index.run_count(), unuploaded_bytes: index.unuploaded_bytes().unwrap_or(0) };
        let now = unix_ms();
        if terminal {
            eprint!("\r{}", progress.line(now, backlog));
        } else if now.saturating_sub(last_log_ms) >= BACKFILL_LOG_EVERY_MS {
            last_log_ms = now;
            let (events, elapsed_ms) = progress.figures(now);
            let memory = index.memory_use().line();
            tracing::info!(progress = %progress.line(now, backlog), events, elapsed_ms, memory, "import");
        }
    }
}

/// A microsecond counter in seconds, to the millisecond.
fn seconds(micros: &std::sync::atomic::AtomicU64) -> f64 {
    (micros.load(std::sync::atomic::Ordering::Relaxed) / 1_000) as f64 / 1_000.0
}

/// The backfill command's settings: flags over the config file (and `BACKLINKS_*` variables).
fn backfill_config(args: &BackfillArgs, file: &FileConfig) -> FileConfig {
    FileConfig {
        backfill_relay: flags_or(&args.relay, &file.backfill_relay),
        backfill_pds: flags_or(&args.pds, &file.backfill_pds),
        backfill_repo: flags_or(&args.repo, &file.backfill_repo),
        backfill_car: flags_or(&args.car, &file.backfill_car),
        backfill_concurrency: args.concurrency.or(file.backfill_concurrency),
        backfill_per_host_per_second: args.per_host_per_second.or(file.backfill_per_host_per_second),
        plc_url: args.plc_url.clone().or(file.plc_url.clone()),
        backfill_did_doc: flags_or(&args.did_doc, &file.backfill_did_doc),
        backfill_allow_private: flags_or(&args.allow_private, &file.backfill_allow_private),
        ..file.clone()
    }
}

/// Repeatable flags win over the file's list when any is given.
fn flags_or<T: Clone>(flags: &[T], file: &Option<Vec<T>>) -> Option<Vec<T>> {
    if flags.is_empty() { file.clone() } else { Some(flags.to_vec()) }
}

fn backfill_sources(config: &FileConfig) -> Vec<Source> {
    let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
    let mut sources: Vec<Source> =
        config.backfill_car.clone().unwrap_or_default().into_iter().map(Source::Car).collect();
    sources.extend(list(&config.backfill_repo).into_iter().map(Source::Repo));
    sources.extend(list(&config.backfill_pds).into_iter().map(Source::Pds));
    sources.extend(list(&config.backfill_relay).into_iter().map(Source::Relay));
    sources
}

async fn open_backfill(
    index: &Arc<Index>,
    data_dir: &std::path::Path,
    config: &FileConfig,
) -> anyhow::Result<Arc<Backfill>> {
    let options = backfills::BackfillOptions { seed: entropy_seed(), ..config.backfill_options()? };
    Ok(backfills::open(index.clone(), data_dir, options, Arc::new(unix_ms)).await?)
}

/// Rejected repositories (with their reasons) the backfill summary names; repos.db has them all.
const REJECTED_IN_SUMMARY: usize = 20;
/// How often a terminal-less backfill logs its progress.
const BACKFILL_LOG_EVERY_MS: u64 = 30_000;
/// How often `serve` checkpoints repos.db while it backfills (live ingest publishes manifests).
const SERVE_CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

async fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let config = backfill_config(&args, &setup.file);
    let sources = backfill_sources(&config);
    if sources.is_empty() {
        bail!("nothing to backfill: give --relay, --pds, --repo or --car (or their config keys)");
    }
    let index = open_index(&setup, false)?;
    let mut writer = start_writer(&index, &setup, config.writer_options()).await?;
    let backfill = open_backfill(&index, &setup.data_dir, &config).await?;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let run = backfill.run(sources);
    tokio::pin!(run);
    let mut each_second = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut last_log_ms = unix_ms();
    let outcome = loop {
        tokio::select! {
            outcome = &mut run => break outcome,
            _ = each_second.tick() => {
                show_progress(&backfill.progress, terminal, &mut last_log_ms);
                // Merges keep up with what snapshots add; each manifest gets its repos.db checkpoint.
                writer.flushed();
                if writer.tick().await?.is_some() {
                    backfill.save_checkpoint().await?;
                }
            }
        }
    };
    if terminal {
        eprintln!("\r{}", backfill.progress.bar(unix_ms(), 30));
    }
    outcome?;
    let finished = writer.drain_and_publish().await?;
    let checkpoint = backfill.save_checkpoint().await?;
    writer.release().await?;
    println!("{}", backfill_summary(&backfill, &index, finished, checkpoint)?);
    Ok(())
}

fn show_progress(progress: &BackfillProgress, terminal: bool, last_log_ms: &mut u64) {
    let now = unix_ms();
    if terminal {
        eprint!("\r{}", progress.bar(now, 30));
    } else if now.saturating_sub(*last_log_ms) >= BACKFILL_LOG_EVERY_MS {
        *last_log_ms = now;
        tracing::info!(progress = %progress.line(now), "backfill");
    }
}

fn backfill_summary(
    backfill: &Backfill,
    index: &Index,
    finished: Finished,
    checkpoint: Option<String>,
) -> anyhow::Result<String> {
    let load = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
    let progress = &backfill.progress;
    let statuses: serde_json::Map<String, serde_json::Value> =
        backfill.repo_counts()?.into_iter().map(|(status, n)| (status.as_str().to_string(), n.into())).collect();
    Ok(serde_json::json!({
        "indexed": load(&progress.repos_done),
        "records": load(&progress.records),
        "links": load(&progress.links),
        "bytes": load(&progress.bytes),
        "retries": load(&progress.retries),
        "rateLimited": load(&progress.rate_limited),
        "verified": load(&progress.verified),
        "structurallyChecked": load(&progress.unverified),
        "rejected": progress.rejected(),
        "rejectedRepos": backfill.rejected(REJECTED_IN_SUMMARY)?,
        "pausedHosts": backfill.paused_hosts(),
        "listingsCapped": load(&progress.listings_capped),
        "plcDirectory": backfill.directory_figures()?.map(|(dids, stale, after)| {
            serde_json::json!({ "dids": dids, "stale": stale, "exportPosition": after })
        }),
        "repos": statuses,
        "compactions": finished.merges,
        "clock": index.position().clock,
        "manifest": finished.manifest,
        "checkpoint": checkpoint,
    })
    .to_string())
}

/// `serve`'s backfill: runs beside live ingest (which publishes manifests), checkpointing
/// repos.db every few minutes and logging progress; a failure is logged, serving goes on.
async fn backfill_beside_live(backfill: Arc<Backfill>, sources: Vec<Source>) {
    let run = backfill.run(sources);
    tokio::pin!(run);
    let mut checkpoint = tokio::time::interval(SERVE_CHECKPOINT_EVERY);
    let mut show = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut last_log_ms = unix_ms();
    loop {
        tokio::select! {
            outcome = &mut run => {
                match outcome {
                    Ok(()) => tracing::info!(progress = %backfill.progress.line(unix_ms()), "backfill finished"),
                    Err(e) => tracing::error!(error = %e, "backfill stopped"),
                }
                break;
            }
            _ = checkpoint.tick() => {
                if let Err(e) = backfill.save_checkpoint().await {
                    tracing::warn!(error = %e, "repos.db checkpoint failed; retrying later");
                }
            }
            _ = show.tick() => show_progress(&backfill.progress, false, &mut last_log_ms),
        }
    }
    if let Err(e) = backfill.save_checkpoint().await {
        tracing::warn!(error = %e, "final repos.db checkpoint failed");
    }
}

/// `backlinks verify`: the bucket's objects, then the local copies; a report line per object.
async fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let setup = setup(&args.common)?;
    let mut report = backlinks::verify::verify_bucket(setup.store.as_ref()).await;
    report.extend(backlinks::verify::verify_local(&setup.data_dir).await?);
    print!("{}", report.render());
    std::io::stdout().flush()?;
    if !report.is_clean() {
        bail!("verification failed: some objects are corrupt, missing or unreadable (see above)");
    }
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
