//! The engine: what every sandbox of the process shares, made once — the checked Pyodide files, the
//! HTTPS fetcher and the wheel cache, the V8 startup snapshot, the package layer, the Pyodide memory
//! snapshot (taken now, or read back from `package_cache_dir` and trusted once a sandbox boots from
//! it), Pyodide's compiled WebAssembly. [`Engine::boot`] makes a ready [`Sandbox`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use deno_core::v8;

use super::isolate::Sandbox;
use super::memory_snapshot::{self, SharedSnapshot};
use super::ops::Role;
use super::types::{ErrorKind, ExecError, ExecRequest, ExecResult};
use super::{cow, layer, modules, startup};
use crate::assets::{AssetError, Assets};
use crate::fetch::{self, Fetcher};
use crate::packages::{PackageSource, Packages};

/// Appended to micropip's `__init__.py` in the package layer: index URLs and the installation policy.
const MICROPIP_POLICY_PY: &str = include_str!("micropip_policy.py");

/// Engine settings; the application fills them from its configuration (see `app::engine_config`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Directory with the pinned Pyodide npm package files.
    pub asset_dir: PathBuf,
    /// HTTPS hosts sandboxes may fetch from (subdomains included).
    pub allowed_hosts: Vec<String>,
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
    /// Where the durable package layer is kept.
    pub package_cache_dir: PathBuf,
    /// micropip index URLs (empty: micropip's default, the Python Package Index).
    pub package_index_urls: Vec<String>,
    /// PEM files trusted for HTTPS in addition to the system and built-in roots.
    pub extra_ca_certs: Vec<PathBuf>,
    /// How sandboxes start.
    pub boot: BootMode,
}

/// How a sandbox's interpreter comes to life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMode {
    /// Restore the Pyodide memory snapshot the engine took at start-up.
    Snapshot,
    /// Run CPython's whole start-up in every sandbox.
    Full,
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
    /// The Pyodide memory snapshot sandboxes restore (snapshot boot mode).
    pub snapshot: OnceLock<Arc<SharedSnapshot>>,
    /// The package layer copied into every sandbox (micropip and the preinstalled packages).
    pub layer: OnceLock<Arc<layer::PackageLayer>>,
    /// The package layer's file contents, as every sandbox maps them (copy-on-write).
    pub layer_bytes: OnceLock<cow::CowBytes>,
    /// Pyodide's standard library zip, as every sandbox maps it (copy-on-write).
    pub stdlib: cow::CowBytes,
    /// Pyodide's WebAssembly module as V8 compiled it once; every isolate instantiates this.
    pub compiled_wasm: OnceLock<v8::CompiledWasmModule>,
    /// The modules that wrap JavaScript functions for the function table (see `modules::wrappers`),
    /// by list of signatures: in practice one, the start-up's.
    pub wrapper_modules: Mutex<Vec<(String, v8::CompiledWasmModule)>>,
    /// Pyodide's JavaScript modules as served, and their V8 code caches.
    pub modules: Arc<modules::Modules>,
    /// The V8 startup snapshot every isolate starts from.
    pub startup_snapshot: OnceLock<&'static [u8]>,
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

/// The engine: creates sandboxes. Cheap to clone and `Send + Sync`.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<EngineShared>,
    /// Keeps V8's read-only heap shared between sandboxes (see `startup::Keeper`).
    _keeper: Option<Arc<startup::Keeper>>,
}

impl Engine {
    /// Checks the assets and prepares what sandboxes share: the V8 startup snapshot, the package
    /// layer and, in snapshot mode, the Pyodide memory snapshot. The first engine of the process also
    /// sets V8's process-wide flags, among them the WebAssembly memory cap.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        let assets = Arc::new(Assets::load(&config.asset_dir)?);
        startup::init_v8(config.wasm_memory_limit_mb);
        let mut engine = Self {
            shared: Arc::new(EngineShared::new(config, assets)?),
            _keeper: None,
        };
        // Every isolate of this engine, the ones below included, starts from the V8 startup snapshot.
        match startup::get_or_make(&engine.shared) {
            Ok(bytes) => {
                let _ = engine.shared.startup_snapshot.set(bytes);
                engine._keeper = startup::Keeper::start(&engine.shared).map(Arc::new);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "no V8 startup snapshot; every sandbox evaluates Pyodide's JavaScript itself"
            ),
        }
        match engine.shared.config.boot {
            BootMode::Full => engine.prepare_layer()?,
            BootMode::Snapshot => engine.prepare_memory_snapshot()?,
        }
        Ok(engine)
    }

    /// Reads back this build's stored memory snapshot or takes one, while the package layer is
    /// prepared (the snapshot holds no package state). A stored snapshot is trusted only once a
    /// sandbox has booted from it; one that does not boot is discarded and a fresh one taken.
    fn prepare_memory_snapshot(&self) -> Result<(), EngineError> {
        let cache_dir = &self.shared.config.package_cache_dir;
        let key = memory_snapshot::key(&self.shared.assets, &self.shared.modules);
        let stored = memory_snapshot::load(cache_dir, &key);
        let maker = match stored {
            Some(_) => None,
            None => Some(self.spawn_snapshot_maker()?),
        };
        let layer = self.prepare_layer();
        let taken = maker.map(SnapshotMaker::join);
        layer?;
        let snapshot = match (stored, taken) {
            (_, Some(taken)) => {
                let bytes = taken?;
                memory_snapshot::store(cache_dir, &key, &bytes);
                Arc::new(SharedSnapshot::new(bytes))
            }
            (Some(bytes), None) => {
                let len = bytes.len();
                let candidate = Arc::new(SharedSnapshot::new(bytes));
                match Sandbox::boot(self.shared.clone(), Some(candidate.clone())) {
                    Ok(_) => {
                        tracing::info!(
                            bytes = len,
                            "Pyodide memory snapshot read from package_cache_dir"
                        );
                        candidate
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the stored Pyodide snapshot does not boot; taking a new one");
                        memory_snapshot::discard(cache_dir, &key);
                        let bytes = self.spawn_snapshot_maker()?.join()?;
                        memory_snapshot::store(cache_dir, &key, &bytes);
                        Arc::new(SharedSnapshot::new(bytes))
                    }
                }
            }
            (None, None) => unreachable!("a snapshot maker runs when none is stored"),
        };
        let _ = self.shared.snapshot.set(snapshot);
        Ok(())
    }

    /// Makes the package layer ready: reuses the one under `package_cache_dir` when its key matches,
    /// otherwise boots an installer sandbox that loads micropip and installs `preinstall_packages`,
    /// and stores the result (in memory only, with a warning, if the directory cannot be written).
    fn prepare_layer(&self) -> Result<(), EngineError> {
        let started = Instant::now();
        let config = &self.shared.config;
        let key = layer::LayerKey::new(&config.preinstall_packages);
        let names: Vec<String> = config
            .preinstall_packages
            .iter()
            .map(|r| crate::packages::requirement_name(r))
            .collect();
        let cache_dir = &config.package_cache_dir;
        let reused = match layer::load(cache_dir, &key) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "the package layer on disk cannot be used; rebuilding it");
                None
            }
        };
        let (captured, origin) = match reused {
            Some(captured) => (captured, layer::LayerOrigin::Reused),
            None => {
                tracing::info!(
                    packages = ?names,
                    dir = %cache_dir.display(),
                    "building the package layer (micropip and preinstall_packages)"
                );
                let captured = self.run_installer()?;
                let origin = match layer::store(cache_dir, &key, &captured) {
                    Ok(()) => layer::LayerOrigin::Built,
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "cannot write the package layer to package_cache_dir; keeping it in memory for this process"
                        );
                        layer::LayerOrigin::BuiltInMemory
                    }
                };
                (captured, origin)
            }
        };
        let disabled = !config.runtime_package_installation;
        let policy = format!(
            "{MICROPIP_POLICY_PY}\n_code_interpreter_mcp_policy({}, {})\n",
            serde_json::to_string(&config.package_index_urls).unwrap_or_else(|_| "[]".into()),
            if disabled { "True" } else { "False" },
        );
        let mut patched_micropip = false;
        let layer = layer::PackageLayer::from_files(
            captured.files,
            captured.loaded_packages,
            origin,
            |path, mut data| {
                if path.ends_with("/site-packages/micropip/__init__.py") {
                    patched_micropip = true;
                    data.extend_from_slice(policy.as_bytes());
                }
                data
            },
        )
        .map_err(EngineError::Packages)?;
        if !patched_micropip {
            return Err(EngineError::Packages(
                "the package layer holds no micropip (delete package_cache_dir to rebuild it)"
                    .into(),
            ));
        }
        tracing::info!(
            origin = ?origin,
            packages = ?names,
            files = layer.index.len(),
            bytes = layer.bytes(),
            ms = started.elapsed().as_millis() as u64,
            "package layer ready"
        );
        let _ = self.shared.layer.set(Arc::new(layer));
        Ok(())
    }

    /// Boots the installer sandbox on a thread of its own and returns what it installed.
    fn run_installer(&self) -> Result<layer::Captured, EngineError> {
        let shared = self.shared.clone();
        let source = self.shared.config.package_source.to_string();
        std::thread::Builder::new()
            .name("package-installer".into())
            .stack_size(8 * 1024 * 1024)
            .spawn(move || {
                let sandbox = Sandbox::boot_as(
                    shared,
                    Role::Installer {
                        captured: layer::Captured::default(),
                    },
                )?;
                Ok::<_, EngineError>(sandbox.take_role(|role| match role {
                    Role::Installer { captured } => std::mem::take(captured),
                    _ => layer::Captured::default(),
                }))
            })?
            .join()
            .map_err(|_| EngineError::Packages("the package installer panicked".into()))?
            .map_err(|e| {
                let e = match e {
                    EngineError::Boot(m) => m,
                    other => other.to_string(),
                };
                EngineError::Packages(format!(
                    "{e} (wheels of Pyodide packages, micropip included, come from package_base_url = {source}; other downloads must be on allowed_hosts)"
                ))
            })
    }

    /// Starts booting one interpreter, before any user code exists, only to snapshot its memory; on
    /// a thread of its own (one isolate per thread at a time).
    fn spawn_snapshot_maker(&self) -> Result<SnapshotMaker, EngineError> {
        let shared = self.shared.clone();
        let started = Instant::now();
        let handle = std::thread::Builder::new()
            .name("snapshot-maker".into())
            .stack_size(8 * 1024 * 1024)
            .spawn(move || {
                let sandbox = Sandbox::boot_as(shared, Role::MemorySnapshotMaker { taken: None })?;
                sandbox
                    .take_role(|role| match role {
                        Role::MemorySnapshotMaker { taken } => taken.take(),
                        _ => None,
                    })
                    .ok_or_else(|| EngineError::Boot("no memory snapshot was produced".into()))
            })?;
        Ok(SnapshotMaker { handle, started })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The size of the V8 startup snapshot sandboxes start from, if there is one.
    pub fn startup_snapshot_bytes(&self) -> Option<usize> {
        self.shared.startup_snapshot.get().map(|s| s.len())
    }

    /// Where the package layer came from at start-up (reused from disk or built now).
    pub fn layer_origin(&self) -> Option<layer::LayerOrigin> {
        self.shared.layer.get().map(|l| l.origin)
    }

    /// Boots a fresh sandbox: new isolate, new Pyodide, locked-down globals.
    pub fn boot(&self) -> Result<Sandbox, EngineError> {
        Sandbox::boot(self.shared.clone(), self.shared.snapshot.get().cloned())
    }

    /// Boots a sandbox and runs `request` in it. Start-up failures become a runtime error result.
    pub fn execute(&self, request: ExecRequest) -> ExecResult {
        match self.boot() {
            Ok(sandbox) => sandbox.execute(request),
            Err(e) => ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxStartupError",
                e.to_string(),
            )),
        }
    }
}

impl EngineShared {
    /// What sandboxes share before any snapshot or layer exists.
    fn new(config: EngineConfig, assets: Arc<Assets>) -> Result<Self, EngineError> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandbox-io")
            .enable_all()
            .build()?;
        let fetcher = Fetcher::new(
            config.allowed_hosts.clone(),
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
            snapshot: OnceLock::new(),
            layer: OnceLock::new(),
            compiled_wasm: OnceLock::new(),
            wrapper_modules: Mutex::new(Vec::new()),
            layer_bytes: OnceLock::new(),
            startup_snapshot: OnceLock::new(),
            _io: IoRuntime(Some(io)),
        })
    }
}

/// A snapshot being taken on its own thread.
struct SnapshotMaker {
    handle: std::thread::JoinHandle<Result<Vec<u8>, EngineError>>,
    started: Instant,
}

impl SnapshotMaker {
    fn join(self) -> Result<Vec<u8>, EngineError> {
        let bytes = self
            .handle
            .join()
            .map_err(|_| EngineError::Boot("the snapshot maker panicked".into()))?
            .map_err(|e| {
                EngineError::Boot(format!("taking the Pyodide memory snapshot failed: {e}"))
            })?;
        tracing::info!(
            bytes = bytes.len(),
            ms = self.started.elapsed().as_millis() as u64,
            "Pyodide memory snapshot taken"
        );
        Ok(bytes)
    }
}
