//! What every sandbox of the process shares, and the settings it is made from: the checked Pyodide
//! files, the HTTPS fetcher and the wheel cache, the package layer, the Pyodide memory snapshot,
//! Pyodide's JavaScript as served and its WebAssembly compiled once, the V8 startup snapshot. The
//! engine (`mod.rs`) fills it in once; sandboxes only read it.

use std::sync::{Arc, Mutex, OnceLock};

use deno_core::v8;

use crate::assets::{AssetError, Assets};
pub use crate::config::{BootMode, EngineSettings};
use crate::fetch::{self, Fetcher};
use crate::packages::{PackageSource, Packages};
use crate::sandbox::cow;
use crate::sandbox::prepared::layer;
use crate::sandbox::prepared::modules;
use crate::sandbox::prepared::snapshots::Snapshots;
use crate::sandbox::prepared::wasm::WasmModules;
use crate::upstream::Upstreams;

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
    /// A session image that cannot be restored (malformed, or naming what it may not).
    #[error("the session image cannot be restored: {0}")]
    Image(#[from] crate::sandbox::image::ImageError),
    #[error("giving back a sandbox's memory failed: {0}")]
    Memory(#[from] crate::sandbox::pages::PagesError),
}

/// What every sandbox shares.
pub(crate) struct EngineShared {
    /// The configuration's engine settings, as the config crate makes them (`[engine]` and the
    /// keys it gathers): the one type a new engine key is added to.
    pub settings: EngineSettings,
    /// Where lock-file wheels come from (`package_base_url`, parsed once).
    pub package_source: PackageSource,
    /// The upstream MCP servers sandboxes may call (none: `import upstream` finds nothing).
    pub upstreams: Option<Arc<Upstreams>>,
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
    pub fn new(
        settings: EngineSettings,
        upstreams: Option<Arc<Upstreams>>,
        assets: Arc<Assets>,
    ) -> Result<Self, EngineError> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandbox-io")
            .enable_all()
            .build()?;
        let fetcher = Fetcher::new(
            settings.allowed_hosts.clone(),
            &settings.host_grants,
            &settings.extra_ca_certs,
            io.handle().clone(),
        )?;
        let package_source = settings
            .package_base_url
            .as_deref()
            .map_or_else(PackageSource::default_cdn, PackageSource::parse);
        let packages = Packages::new(package_source.clone(), assets.clone(), fetcher.clone());
        Ok(Self {
            settings,
            package_source,
            upstreams,
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
