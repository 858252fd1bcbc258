//! What every sandbox of the process shares, and the settings it is made from: the checked Pyodide
//! files, the HTTPS fetcher and the wheel cache, the package layer, the Pyodide memory snapshot,
//! Pyodide's JavaScript as served and its WebAssembly compiled once, the V8 startup snapshot. The
//! engine (`mod.rs`) fills it in once; sandboxes only read it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use deno_core::v8;

use crate::assets::{AssetError, Assets};
pub use crate::config::BootMode;
use crate::fetch::{self, Fetcher};
use crate::packages::{PackageSource, Packages};
use crate::sandbox::cow;
use crate::sandbox::prepared::layer;
use crate::sandbox::prepared::modules;
use crate::sandbox::prepared::snapshots::Snapshots;
use crate::sandbox::prepared::wasm::WasmModules;
use crate::upstream::Upstreams;

/// Engine settings; the application fills them from its configuration (see `app::engine_config`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Directory with the pinned Pyodide npm package files.
    pub asset_dir: PathBuf,
    /// HTTPS hosts sandboxes may fetch from (subdomains included).
    pub allowed_hosts: Vec<String>,
    /// HTTPS hosts the operator grants to sandboxed code (`[[network.hosts]]`).
    pub host_grants: Vec<crate::config::HostGrant>,
    /// V8 heap budget per isolate, in MiB.
    pub memory_limit_mb: u64,
    /// Cap on one WebAssembly linear memory, in MiB (applies process-wide; see [`Engine::new`]).
    pub wasm_memory_limit_mb: u64,
    /// Where lock-file wheels come from.
    pub package_source: PackageSource,
    /// Load packages for recognised imports before the code runs and allow `micropip.install`.
    pub runtime_package_installation: bool,
    /// micropip requirements installed at start-up into the package layer.
    pub preinstall_packages: Vec<String>,
    /// Modules imported into a second memory snapshot that sandboxes restore instead of the plain
    /// one (empty: none).
    pub preimport_modules: Vec<String>,
    /// Pre-import the top-level modules of `preinstall_packages` too (snapshot boot only).
    pub preimport_preinstalled: bool,
    /// Where the durable package layer is kept.
    pub package_cache_dir: PathBuf,
    /// micropip index URLs (empty: micropip's default, the Python Package Index).
    pub package_index_urls: Vec<String>,
    /// PEM files trusted for HTTPS in addition to the system and built-in roots.
    pub extra_ca_certs: Vec<PathBuf>,
    /// How sandboxes start.
    pub boot: BootMode,
    /// Map the pre-imported snapshot's memory into sandboxes copy-on-write, its working set copied
    /// up front, instead of copying all of it (see `memory_image.rs`).
    pub map_snapshot_memory: bool,
    /// Keep the pre-imported snapshot's bytes in a sealed file even when the memory is copied, so
    /// that an idle ready sandbox can give back the pages it holds unchanged (`Sandbox::
    /// give_back_unchanged_memory`, called by the pool after `workers.idle_give_back_s`).
    pub give_back_idle_memory: bool,
    /// Memory budget per sandbox outside the V8 heap (see `memory.rs`), in MiB.
    pub sandbox_memory_limit_mb: u64,
    /// Time a call's set-up (input files, package loading) may take before its user code starts.
    pub setup_timeout: std::time::Duration,
    /// DataFrames and Series displayed as Markdown tables show at most this many rows and columns.
    pub table_rows: u64,
    pub table_columns: u64,
    /// Where a figure-N.html gets plotly.js: "cdn", "inline" or a URL (`results.figure_plotly_js`).
    pub figure_plotly_js: String,
    /// The upstream MCP servers sandboxes may call (none: `import upstream` finds nothing).
    pub upstreams: Option<Arc<Upstreams>>,
}

/// Why the engine could not be created or a sandbox could not boot.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Assets(#[from] AssetError),
    #[error("cannot create the engine's I/O runtime: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Http(#[from] fetch::ClientError),
    #[error("sandbox start-up failed: {0}")]
    Boot(String),
    #[error("preparing the package layer failed: {0}")]
    Packages(String),
}

/// What every sandbox shares.
pub(crate) struct EngineShared {
    pub config: EngineConfig,
    pub assets: Arc<Assets>,
    pub fetcher: Fetcher,
    pub packages: Packages,
    /// The Pyodide memory snapshots sandboxes restore, by kind (snapshot boot mode).
    pub snapshots: Snapshots,
    /// The package layer copied into every sandbox (micropip and the preinstalled packages).
    pub layer: OnceLock<Arc<layer::PackageLayer>>,
    /// Pyodide's standard library zip, as every sandbox maps it (copy-on-write).
    pub stdlib: cow::CowBytes,
    /// Pyodide's WebAssembly module as V8 compiled it once; every isolate instantiates this.
    pub compiled_wasm: OnceLock<v8::CompiledWasmModule>,
    /// The modules that wrap JavaScript functions for the function table (see `modules::wrappers`),
    /// by list of signatures: in practice one, the start-up's.
    pub wrapper_modules: Mutex<Vec<(String, v8::CompiledWasmModule)>>,
    /// Every other WebAssembly module sandboxes compile (packages' extension modules), by content.
    pub wasm_modules: WasmModules,
    /// Pyodide's JavaScript modules as served, and their V8 code caches.
    pub modules: Arc<modules::Modules>,
    /// The V8 startup snapshot every isolate starts from.
    pub startup_snapshot: OnceLock<&'static [u8]>,
    /// The key session images are made and accepted by (see `Engine::image_key`).
    pub image_key: OnceLock<String>,
    _io: IoRuntime,
}

/// The multi-thread runtime that performs sandbox network I/O; shut down without blocking.
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl EngineShared {
    /// What sandboxes share before any snapshot or layer exists.
    pub fn new(config: EngineConfig, assets: Arc<Assets>) -> Result<Self, EngineError> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandbox-io")
            .enable_all()
            .build()?;
        let fetcher = Fetcher::new(
            config.allowed_hosts.clone(),
            &config.host_grants,
            &config.extra_ca_certs,
            io.handle().clone(),
        )?;
        let packages = Packages::new(
            config.package_source.clone(),
            assets.clone(),
            fetcher.clone(),
        );
        Ok(Self {
            config,
            modules: Arc::new(modules::Modules::new(&assets)),
            stdlib: cow::CowBytes::new(&assets.stdlib),
            assets,
            fetcher,
            packages,
            snapshots: Snapshots::default(),
            layer: OnceLock::new(),
            compiled_wasm: OnceLock::new(),
            wrapper_modules: Mutex::new(Vec::new()),
            wasm_modules: WasmModules::default(),
            startup_snapshot: OnceLock::new(),
            image_key: OnceLock::new(),
            _io: IoRuntime(Some(io)),
        })
    }
}
