//! The one assembly point: turns the validated configuration into everything the process runs — the
//! logging, the tokio runtime, the metrics, the engine, the worker pool, the snippet catalog, the
//! tool handler and the transport settings. `serve`, `--stdio` and `exec` all start from here, and
//! this is the only module that reads the configuration type's fields.

use std::path::PathBuf;
use std::time::Instant;

use crate::config::{self, AppConfig, Loaded, LogFormat};
use crate::packages::PackageSource;
use crate::pool::{ExecPool, PoolConfig};
use crate::sandbox::{BootMode, Engine, EngineConfig, EngineError};
use crate::sessions::{Sessions, SessionsConfig};
use crate::tools::snippets::Catalog;
use crate::tools::{CodeInterpreter, ToolOptions};
use crate::transport::auth::BearerAuth;
use crate::transport::{self, HttpSettings};

/// The engine settings of a configuration.
pub fn engine_config(config: &AppConfig) -> EngineConfig {
    EngineConfig {
        asset_dir: if config.asset_dir.is_empty() {
            crate::assets::Assets::default_dir()
        } else {
            PathBuf::from(&config.asset_dir)
        },
        allowed_hosts: config.allowed_hosts.clone(),
        memory_limit_mb: config.workers.memory_limit_mb,
        wasm_memory_limit_mb: config.workers.wasm_memory_limit_mb,
        package_source: if config.package_base_url.is_empty() {
            PackageSource::default_cdn()
        } else {
            PackageSource::parse(&config.package_base_url)
        },
        runtime_package_installation: config.runtime_package_installation,
        preinstall_packages: config.preinstall_packages.clone(),
        preimport_modules: config.preimport_modules.clone(),
        preimport_preinstalled: config.preimport_preinstalled,
        package_cache_dir: PathBuf::from(&config.package_cache_dir),
        package_index_urls: config.package_index_urls.clone(),
        extra_ca_certs: config.extra_ca_certs.iter().map(PathBuf::from).collect(),
        boot: match config.workers.boot {
            config::BootMode::Snapshot => BootMode::Snapshot,
            config::BootMode::Full => BootMode::Full,
        },
        sandbox_memory_limit_mb: config.workers.sandbox_memory_limit_mb,
        setup_timeout: std::time::Duration::from_secs(config.workers.setup_timeout_s),
    }
}

/// The pool sizing of a configuration.
pub fn pool_config(config: &AppConfig) -> PoolConfig {
    PoolConfig {
        max_workers: config.workers.max_workers as usize,
        queue_capacity: config.workers.queue_capacity as usize,
        prewarmed_workers: config.workers.prewarmed() as usize,
        ready_sandboxes: config.workers.ready_sandboxes as usize,
    }
}

/// The HTTP transport's settings of a configuration.
pub fn http_settings(config: &AppConfig) -> anyhow::Result<HttpSettings> {
    Ok(HttpSettings {
        bind_addr: config.bind_addr.parse()?,
        allowed_hosts: (!config.skip_host_header_verification)
            .then(|| config.http_allowed_hosts.clone()),
        allowed_origins: config.http_allowed_origins.clone(),
        limits: config.input_limits,
        auth: match config.auth.bearer_tokens_file.as_str() {
            "" => None,
            path => Some(std::sync::Arc::new(BearerAuth::load(
                std::path::Path::new(path),
            )?)),
        },
        replica_id: config.replica_id.clone(),
    })
}

/// The visible snippet catalog, or `None` when the snippet tools are disabled.
pub fn catalog(config: &AppConfig) -> Option<Catalog> {
    config
        .code_snippets
        .enabled
        .then(|| Catalog::new(&config.code_snippets, config.search.min_hits))
}

/// The engine of a configuration (assets checked, snapshots and package layer ready).
pub fn engine(config: &AppConfig) -> Result<Engine, EngineError> {
    Engine::new(engine_config(config))
}

/// The running parts behind the transports.
pub struct App {
    pub pool: ExecPool,
    pub sessions: Option<Sessions>,
    pub interpreter: CodeInterpreter,
}

/// The session settings of a configuration.
pub fn sessions_config(config: &AppConfig) -> SessionsConfig {
    let s = &config.sessions;
    SessionsConfig {
        max_sessions: s.max_sessions as usize,
        queue_capacity: s.queue_capacity as usize,
        idle_timeout: std::time::Duration::from_secs(s.idle_timeout_s),
        max_lifetime: std::time::Duration::from_secs(s.max_lifetime_s),
        replica_id: config.replica_id.clone(),
    }
}

impl App {
    /// Start-up in the specified order: assets checked (engine), workers started and prewarmed
    /// workers' Pyodide initialised and acknowledged (pool), then the tool handler. Blocking: only
    /// then may anything listen.
    pub fn start(config: &AppConfig) -> anyhow::Result<Self> {
        let started = Instant::now();
        let engine = engine(config)?;
        let sessions = config.sessions.enabled.then(|| {
            Sessions::new(
                std::sync::Arc::new(engine.clone()),
                sessions_config(config),
                std::sync::Arc::new(crate::sessions::SystemClock),
            )
        });
        let pool = ExecPool::start(std::sync::Arc::new(engine), pool_config(config))?;
        tracing::info!(
            max_workers = config.workers.max_workers,
            prewarmed_workers = config.workers.prewarmed(),
            ready_sandboxes = config.workers.ready_sandboxes,
            queue_capacity = config.workers.queue_capacity,
            startup_ms = started.elapsed().as_millis() as u64,
            "workers ready"
        );
        let interpreter = CodeInterpreter::new(
            pool.clone(),
            config.input_limits,
            catalog(config),
            ToolOptions {
                sessions: sessions.clone(),
                preinstall_packages: config.preinstall_packages.clone(),
                runtime_installation: config.runtime_package_installation,
                network: !config.allowed_hosts.is_empty(),
                max_inline_image_bytes: config.results.max_inline_image_kb * 1024,
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
pub fn serve(loaded: Loaded, stdio: bool) -> anyhow::Result<i32> {
    let config = loaded.config;
    init_logging(config.log_format, "info,rmcp=warn");
    let runtime = tokio_runtime(loaded.tokio_worker_threads)?;
    runtime.block_on(async {
        if stdio {
            let app = tokio::task::block_in_place(|| App::start(&config))?;
            transport::serve_stdio(app.interpreter, app.pool, app.sessions).await
        } else {
            let settings = http_settings(&config)?;
            // The metrics listener starts before Python initialisation; metrics do not imply
            // readiness.
            if config.integrations.prometheus.enabled {
                crate::telemetry::start(
                    &config.integrations.prometheus,
                    config.workers.queue_capacity,
                )
                .await?;
            }
            let app = tokio::task::block_in_place(|| App::start(&config))?;
            transport::serve_http(app.interpreter, app.pool, app.sessions, settings).await
        }
    })?;
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
