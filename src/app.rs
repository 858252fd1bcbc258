//! The one assembly point: turns the validated configuration into everything the process runs — the
//! logging, the tokio runtime, the metrics, the engine, the worker pool, the snippet catalog, the
//! tool handler and the transport settings, from the validated [`Settings`]. `serve`, `--stdio`,
//! `exec` and `prepare` all start from here, and this is the only module that maps settings into the
//! parts.

use std::sync::Arc;
use std::time::Instant;

use crate::apps::Views;
use crate::config::{EngineSettings, LogFormat, Settings};
use crate::pool::ExecPool;
use crate::sandbox::{Engine, EngineError};
use crate::sessions::{Durability, Sessions, SystemClock};
use crate::store::Store;
use crate::tools::snippets::Catalog;
use crate::tools::{CodeInterpreter, ToolOptions};
use crate::transport::auth::BearerAuth;
use crate::transport::{self, HttpSettings};
use crate::upstream::Upstreams;

/// The HTTP transport's settings.
pub fn http_settings(settings: &Settings) -> anyhow::Result<HttpSettings> {
    let http = &settings.http;
    Ok(HttpSettings {
        bind_addr: http.bind_addr,
        allowed_hosts: http.allowed_hosts.clone(),
        allowed_origins: http.allowed_origins.clone(),
        limits: http.input_limits,
        tokens: match &http.bearer_tokens_file {
            None => None,
            Some(path) => Some(Arc::new(BearerAuth::load(path, http.named_tokens)?)),
        },
        oauth: http.oauth.clone(),
        extra_ca_certs: settings.engine.extra_ca_certs.clone(),
        replica_id: settings.replica_id.clone(),
        quotas: settings.quotas.clone(),
    })
}

/// The engine (assets checked, snapshots and package layer ready).
pub fn engine(settings: &EngineSettings) -> Result<Engine, EngineError> {
    Engine::new(settings.clone())
}

/// The session store `store_url` names (`off`: none), for images of the engine `image_key`; an
/// error (a start-up error, exit status 2) when it names no usable store. The default directory
/// that cannot be used (a read-only package cache) means none, with a warning.
pub fn session_store(
    settings: &Settings,
    store_url: &str,
    image_key: &str,
) -> anyhow::Result<Option<Durability>> {
    if store_url.eq_ignore_ascii_case("off") {
        tracing::info!("sessions.store_url = off: sessions live in memory only");
        return Ok(None);
    }
    let engine = &settings.engine;
    // (The package cache may be configured relative to the working directory.)
    let default_dir = std::path::absolute(engine.package_cache_dir.join("sessions"))?;
    let store = match Store::open(store_url, &default_dir, image_key) {
        Ok(store) => store,
        // The default directory may be read-only (a container's baked package cache): sessions
        // then live in memory only, as with `off`; a store the operator named must work.
        Err(e) if store_url.is_empty() => {
            tracing::warn!(error = %e, "no session store: the default directory cannot be used; sessions live in memory only (set sessions.store_url)");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(store = store.location(), "session store");
    // An image holds the interpreter's memory and the session's files (in the sandbox's memory).
    let max_image_bytes = (engine.wasm_memory_limit_mb + engine.sandbox_memory_limit_mb + 16) << 20;
    Ok(Some(Durability::new(
        store,
        &settings.replica_id,
        max_image_bytes,
    )))
}

/// The running parts behind the transports.
pub struct App {
    pub pool: ExecPool,
    pub sessions: Option<Sessions>,
    pub interpreter: CodeInterpreter,
}

impl App {
    /// Start-up in the specified order: assets checked (engine), workers started and prewarmed
    /// workers' Pyodide initialised and acknowledged (pool), then the tool handler. Blocking: only
    /// then may anything listen.
    pub fn start(settings: &Settings) -> anyhow::Result<Self> {
        let started = Instant::now();
        // The views' scripts are checked before anything boots: a missing one is a start-up error.
        let apps = match &settings.apps {
            Some(apps) => Some(Arc::new(Views::load(
                apps.asset_dir.as_deref(),
                apps.grid_rows,
            )?)),
            None => None,
        };
        let upstreams = Upstreams::start(&settings.upstream, &settings.engine.extra_ca_certs)?;
        let engine = Engine::with_upstreams(settings.engine.clone(), upstreams.clone())?;
        let sessions = match &settings.sessions {
            Some(config) => {
                let durability = session_store(settings, &config.store_url, engine.image_key())?;
                Some(Sessions::new(
                    Arc::new(engine.clone()),
                    config.clone(),
                    &settings.replica_id,
                    Arc::new(SystemClock),
                    durability,
                ))
            }
            None => None,
        };
        let workers = settings.workers;
        let pool = ExecPool::start(Arc::new(engine), workers)?;
        tracing::info!(
            max_workers = workers.max_workers,
            prewarmed_workers = workers.prewarmed_workers,
            ready_sandboxes = workers.ready_sandboxes,
            queue_capacity = workers.queue_capacity,
            startup_ms = started.elapsed().as_millis() as u64,
            "workers ready"
        );
        let interpreter = CodeInterpreter::new(
            pool.clone(),
            settings.http.input_limits,
            settings
                .snippets
                .as_ref()
                .map(|s| Catalog::new(&s.catalog, s.min_hits)),
            ToolOptions {
                sessions: sessions.clone(),
                preinstall_packages: settings.engine.preinstall_packages.clone(),
                runtime_installation: settings.engine.runtime_package_installation,
                network: !settings.engine.allowed_hosts.is_empty(),
                max_inline_image_bytes: settings.max_inline_image_bytes,
                max_text_chars: settings.max_text_chars,
                structured_content: settings.structured_content,
                tasks: settings.tasks.map(crate::tools::tasks::Tasks::new),
                upstreams,
                apps,
                quotas: crate::tools::quotas::Quotas::new(settings.quotas.base),
            },
        );
        Ok(Self {
            pool,
            sessions,
            interpreter,
        })
    }
}

/// Runs the MCP server (HTTP, or stdio) until Ctrl-C, SIGTERM or the end of standard input; returns
/// the process exit status.
/// `warnings`: what loading the configuration found to change (logged once logging is set up).
pub fn serve(settings: &Settings, stdio: bool, warnings: &[String]) -> anyhow::Result<i32> {
    init_logging(settings.log_format, "info,rmcp=warn");
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let runtime = tokio_runtime(settings.tokio_worker_threads)?;
    if let Some(traces) = &settings.traces {
        let client = crate::fetch::trusting(&settings.engine.extra_ca_certs)?
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        crate::telemetry::traces::install(traces, client, runtime.handle().clone())?;
    }
    runtime.block_on(async {
        if stdio {
            let app = tokio::task::block_in_place(|| App::start(settings))?;
            transport::serve_stdio(app.interpreter, app.pool, app.sessions).await
        } else {
            let http = http_settings(settings)?;
            // The metrics listener starts before Python initialisation; metrics do not imply
            // readiness.
            if let Some(addr) = settings.prometheus {
                crate::telemetry::start(addr, settings.workers.queue_capacity as u64).await?;
                if settings.principal_metric_label {
                    crate::telemetry::label_principals();
                }
            }
            let app = tokio::task::block_in_place(|| App::start(settings))?;
            transport::serve_http(app.interpreter, app.pool, app.sessions, http).await
        }
    })?;
    // The last spans go out while the runtime their exports run on still runs.
    runtime.block_on(async { tokio::task::block_in_place(crate::telemetry::traces::shutdown) });
    // Whatever still blocks a thread of the runtime then (stdio's read of standard input, which a
    // signal does not end) does not hold the process: the shutdown's work is done.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(0)
}

/// Log lines on stderr, filtered by `RUST_LOG` (else `default`), as text or JSON.
pub(crate) fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Json => subscriber.json().init(),
        LogFormat::Text => subscriber.init(),
    }
}

/// The main runtime: `TOKIO_WORKER_THREADS` threads, else the available parallelism and at least 4.
fn tokio_runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match threads {
        Some(n) => {
            if n < 4 {
                tracing::warn!(threads = n, "TOKIO_WORKER_THREADS is below 4; honoured");
            }
            n
        }
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .max(4),
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
}
