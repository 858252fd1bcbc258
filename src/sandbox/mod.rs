//! The execution engine: one request in, one result out, each in a fresh sandbox — a new
//! `deno_core::JsRuntime` (its own V8 isolate), a new Pyodide interpreter and a new Emscripten MEMFS
//! whose `/workspace` is the working directory. Nothing survives a call.
//!
//! [`Engine`] holds what all sandboxes share (the Pyodide files, the package cache, the HTTPS fetcher);
//! [`Engine::boot`] makes a ready [`Sandbox`]; [`Sandbox::execute`] runs one request and consumes it.
//! A sandbox is not `Send`: boot and execute it on one dedicated thread, never on an async runtime.

mod cow;
pub mod fetch;
pub mod layer;
mod modules;
mod ops;
mod output;
mod snapshot;
mod startup;
mod watchdog;
mod wrappers;

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use deno_core::{JsRuntime, RuntimeOptions, v8};
use serde::{Deserialize, Serialize};

pub use fetch::{Fetcher, MAX_RESPONSE_BYTES};
pub use output::{
    MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_RETURNED_TOTAL_BYTES, MAX_STREAM_BYTES,
    OutputFile,
};

use crate::assets::{AssetError, Assets};
use crate::packages::{PackageSource, Packages};
use ops::SandboxState;
use watchdog::Watchdog;

/// The Python half of an execution, evaluated once per sandbox.
pub(crate) const RUNNER_PY: &str = include_str!("py/runner.py");

/// Appended to micropip's `__init__.py` in the package layer: index URLs and the installation policy.
const MICROPIP_POLICY_PY: &str = include_str!("py/micropip_policy.py");

/// The largest final-expression string returned (64 KiB), applied by the Python runner.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// Makes `runtime.js` register its entry points with Rust (see `__sandboxEntry` there).
const ENTRY: &str = "__sandboxEntry()";

/// The longest a sandbox (or the snapshot maker) may take to start.
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// 1 MB in the configuration's sense.
const MB: u64 = 1024 * 1024;

/// Engine settings; the server fills them from its configuration.
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

/// What an isolate boots for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootKind {
    /// A sandbox that runs one request.
    Sandbox,
    /// Boots once at start-up to take the memory snapshot.
    SnapshotMaker,
    /// Boots once at start-up to install packages into the package layer.
    Installer,
}

/// How a sandbox's interpreter comes to life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMode {
    /// Restore the Pyodide memory snapshot the engine took at start-up.
    Snapshot,
    /// Run CPython's whole start-up in every sandbox.
    Full,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            asset_dir: Assets::default_dir(),
            allowed_hosts: default_allowed_hosts(),
            memory_limit_mb: 512,
            wasm_memory_limit_mb: 2048,
            package_source: PackageSource::default_cdn(),
            runtime_package_installation: true,
            preinstall_packages: Vec::new(),
            package_cache_dir: PathBuf::from(".code-interpreter-mcp-package-cache"),
            package_index_urls: Vec::new(),
            extra_ca_certs: Vec::new(),
            boot: BootMode::Snapshot,
        }
    }
}

/// The outbound HTTPS hosts allowed by default: the Pyodide CDN and the Python Package Index's API and
/// file hosts.
pub fn default_allowed_hosts() -> Vec<String> {
    ["cdn.jsdelivr.net", "pypi.org", "files.pythonhosted.org"]
        .into_iter()
        .map(String::from)
        .collect()
}

/// A file placed under /workspace before the code runs.
#[derive(Debug, Clone)]
pub struct InputFile {
    /// Path relative to /workspace (validated by the caller).
    pub path: String,
    pub content: Vec<u8>,
}

/// One execution request.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub code: String,
    pub files: Vec<InputFile>,
    pub timeout: Duration,
}

/// What kind of failure an [`ExecError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// The Python code raised.
    Python,
    /// `timeout_ms` ran out.
    Timeout,
    /// The sandbox itself failed (boot, heap budget, engine error).
    Runtime,
    /// The request was rejected before execution (server).
    Validation,
    /// The queue was full (server).
    Overload,
}

/// A structured error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExecError {
    pub kind: ErrorKind,
    #[serde(rename = "type")]
    pub error_type: String,
    pub message: String,
    pub traceback: Option<String>,
}

impl ExecError {
    pub fn new(kind: ErrorKind, error_type: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            error_type: error_type.to_string(),
            message: message.into(),
            traceback: None,
        }
    }
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExecResult {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// `str()` of the final expression; `None` when there is none or it is `None`.
    pub result: Option<String>,
    pub files: Vec<OutputFile>,
    pub error: Option<ExecError>,
    pub timed_out: bool,
    pub output_truncated: bool,
}

impl ExecResult {
    /// A failed result with no output.
    pub fn failure(error: ExecError) -> Self {
        Self {
            success: false,
            stdout: String::new(),
            stderr: String::new(),
            result: None,
            files: Vec::new(),
            timed_out: error.kind == ErrorKind::Timeout,
            error: Some(error),
            output_truncated: false,
        }
    }
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
    pub snapshot: std::sync::OnceLock<snapshot::SharedSnapshot>,
    /// The package layer copied into every sandbox (micropip and the preinstalled packages).
    pub layer: std::sync::OnceLock<Arc<layer::PackageLayer>>,
    /// The package layer's file contents, as every sandbox maps them (copy-on-write).
    pub layer_bytes: std::sync::OnceLock<cow::CowBytes>,
    /// Pyodide's standard library zip, as every sandbox maps it (copy-on-write).
    pub stdlib: cow::CowBytes,
    /// Pyodide's WebAssembly module as V8 compiled it once; every isolate instantiates this.
    pub compiled_wasm: std::sync::OnceLock<v8::CompiledWasmModule>,
    /// The modules that wrap JavaScript functions for the function table (see `wrappers`), by list of
    /// signatures: in practice one, the start-up's.
    pub wrapper_modules: std::sync::Mutex<Vec<(String, v8::CompiledWasmModule)>>,
    /// Pyodide's JavaScript modules as served, and their V8 code caches.
    modules: Arc<modules::Modules>,
    /// The V8 startup snapshot every isolate starts from.
    startup_snapshot: std::sync::OnceLock<&'static [u8]>,
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

static V8_FLAGS: Once = Once::new();

impl Engine {
    /// Checks the assets and prepares what sandboxes share. The first engine of the process also sets
    /// V8's process-wide flags, among them the WebAssembly memory cap.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        Self::create(config, true)
    }

    /// `use_stored`: restore from the snapshot stored under `package_cache_dir` if there is one.
    fn create(config: EngineConfig, use_stored: bool) -> Result<Self, EngineError> {
        let assets = Arc::new(Assets::load(&config.asset_dir)?);
        V8_FLAGS.call_once(|| {
            let pages = config.wasm_memory_limit_mb.saturating_mul(MB) / 65536;
            let mut flags = vec![
                "code-interpreter-mcp".into(),
                format!("--wasm-max-mem-pages={pages}"),
                // Compile every JS function when its script is compiled: the V8 startup snapshot (or,
                // without one, the shared code cache) then holds all of Pyodide's functions and no
                // isolate compiles them lazily again (measured with the code cache: sandbox creation
                // median 128-148 ms -> 106-108 ms).
                "--no-lazy".into(),
                // A sandbox lives for one call. Its heap grows to about 20 MB during start-up: a
                // young generation and a first old-generation limit that hold that avoid the several
                // scavenges and the mark-compact V8 would otherwise run in every sandbox.
                "--min-semi-space-size=16".into(),
                "--initial-old-space-size=64".into(),
                // Start-up runs a few loops thousands of times, once per sandbox; with V8's default
                // thresholds each isolate optimises them again (Maglev/TurboFan on background
                // threads), work thrown away with the isolate. Ten times higher thresholds leave
                // start-up to the interpreter and baseline code while code that keeps running (a
                // user's loop calling into JavaScript) still gets optimised.
                "--invocation-count-for-maglev=4000".into(),
                "--invocation-count-for-maglev-osr=1000".into(),
                "--invocation-count-for-osr=5000".into(),
                "--invocation-count-for-early-optimization=300".into(),
                // Nor does baseline (Sparkplug) code outlive its isolate: compiling and installing
                // it for start-up code that runs once per sandbox cost more than it saved (A/B over
                // 4×80 sandboxes: creation median 30.6 → 29.4 ms; a loop of 20,000 calls from
                // Python into JavaScript ran as fast without it, 57.6 vs 56.6 ms).
                "--no-sparkplug".into(),
                // WebAssembly is the opposite case: its optimised code lives in the module that all
                // isolates share, but V8 counts a function's use towards optimising it per instance,
                // so code that each sandbox's start-up runs a moderate amount stayed in the baseline
                // tier (Liftoff) in every sandbox. A budget 13 times smaller than the default gets
                // it optimised during the first sandboxes, once for the process (A/B over 3×100
                // sandboxes: creation median 29.6 → 28.3 ms).
                "--wasm-tiering-budget=1000000".into(),
            ];
            // For profiling and diagnosis only (e.g. "--perf-basic-prof"); not a configuration key.
            if let Ok(extra) = std::env::var("CODE_INTERPRETER_MCP_V8_FLAGS") {
                flags.extend(extra.split_whitespace().map(String::from));
            }
            let unknown = deno_core::v8_set_flags(flags);
            if unknown.len() > 1 {
                tracing::warn!(?unknown, "V8 did not recognise some flags");
            }
            // Initialise V8 in its normal mode now: if the first isolate were the startup
            // snapshot's, deno_core would set V8 up for snapshotting (single-threaded, with a fixed
            // random seed) for the whole process.
            JsRuntime::init_platform(None);
        });
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
        let boot = config.boot;
        let stdlib = cow::CowBytes::new(&assets.stdlib);
        let mut engine = Self {
            shared: Arc::new(EngineShared {
                config,
                modules: Arc::new(modules::Modules::new(&assets)),
                assets,
                fetcher,
                packages,
                snapshot: std::sync::OnceLock::new(),
                layer: std::sync::OnceLock::new(),
                compiled_wasm: std::sync::OnceLock::new(),
                wrapper_modules: std::sync::Mutex::new(Vec::new()),
                layer_bytes: std::sync::OnceLock::new(),
                stdlib,
                startup_snapshot: std::sync::OnceLock::new(),
                _io: IoRuntime(Some(io)),
            }),
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
        if boot == BootMode::Full {
            engine.prepare_layer()?;
            return Ok(engine);
        }
        // The snapshot holds no package state, so it is taken (or read back) while the package
        // layer is prepared.
        let cache_dir = engine.shared.config.package_cache_dir.clone();
        let key = snapshot::key(&engine.shared.assets, &engine.shared.modules);
        let stored = if use_stored {
            snapshot::load(&cache_dir, &key)
        } else {
            None
        };
        let maker = match stored {
            Some(_) => None,
            None => Some(engine.spawn_snapshot_maker()?),
        };
        let layer = engine.prepare_layer();
        let taken = maker.map(|m| m.join());
        layer?;
        match (stored, taken) {
            (Some(bytes), _) => {
                let len = bytes.len();
                let _ = engine
                    .shared
                    .snapshot
                    .set(snapshot::SharedSnapshot::new(bytes));
                // Trust a stored snapshot only once a sandbox has booted from it.
                match engine.boot() {
                    Ok(_) => tracing::info!(
                        bytes = len,
                        "Pyodide memory snapshot read from package_cache_dir"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "the stored Pyodide snapshot does not boot; taking a new one");
                        snapshot::discard(&cache_dir, &key);
                        return Self::create(engine.shared.config.clone(), false);
                    }
                }
            }
            (None, Some(taken)) => {
                let bytes = taken?;
                snapshot::store(&cache_dir, &key, &bytes);
                let _ = engine
                    .shared
                    .snapshot
                    .set(snapshot::SharedSnapshot::new(bytes));
            }
            (None, None) => unreachable!("a snapshot maker runs when none is stored"),
        }
        Ok(engine)
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
            .map(|r| layer::requirement_name(r))
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
        let source = describe_source(&self.shared.config.package_source);
        std::thread::Builder::new()
            .name("package-installer".into())
            .stack_size(8 * 1024 * 1024)
            .spawn(move || {
                let sandbox = Sandbox::boot_as(shared, BootKind::Installer)?;
                let state = sandbox.runtime.op_state();
                let captured = std::mem::take(
                    &mut state.borrow_mut().borrow_mut::<SandboxState>().captured,
                );
                Ok::<_, EngineError>(captured)
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
            .spawn(move || Sandbox::make_snapshot(shared))?;
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
        Sandbox::boot(self.shared.clone())
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

/// A booted, never-used sandbox.
pub struct Sandbox {
    runtime: JsRuntime,
    tokio: tokio::runtime::Runtime,
    heap_exhausted: Arc<AtomicBool>,
    boot_time: Duration,
    used: bool,
}

/// A new isolate for `kind`, from the engine's V8 startup snapshot, made in `tokio`'s context (V8
/// posts delayed tasks to the runtime that is current when the isolate is created).
pub(crate) fn new_runtime(
    shared: &Arc<EngineShared>,
    kind: BootKind,
    tokio: &tokio::runtime::Runtime,
) -> Result<JsRuntime, EngineError> {
    let heap_bytes =
        usize::try_from(shared.config.memory_limit_mb.saturating_mul(MB)).unwrap_or(usize::MAX);
    let _context = tokio.enter();
    startup::isolate_starting();
    JsRuntime::try_new(RuntimeOptions {
        extensions: vec![ops::sandbox::init(shared.clone(), kind)],
        module_loader: Some(Rc::new(modules::AssetModuleLoader(shared.modules.clone()))),
        create_params: Some(v8::CreateParams::default().heap_limits(0, heap_bytes)),
        startup_snapshot: shared.startup_snapshot.get().copied(),
        ..Default::default()
    })
    .map_err(|e| EngineError::Boot(e.to_string()))
}

impl Sandbox {
    /// Boots an interpreter only to snapshot its memory.
    fn make_snapshot(shared: Arc<EngineShared>) -> Result<Vec<u8>, EngineError> {
        let sandbox = Self::boot_as(shared, BootKind::SnapshotMaker)?;
        let state = sandbox.runtime.op_state();
        let bytes = state
            .borrow_mut()
            .borrow_mut::<SandboxState>()
            .snapshot_out
            .take();
        bytes.ok_or_else(|| EngineError::Boot("no memory snapshot was produced".into()))
    }

    fn boot(shared: Arc<EngineShared>) -> Result<Self, EngineError> {
        Self::boot_as(shared, BootKind::Sandbox)
    }

    fn boot_as(shared: Arc<EngineShared>, kind: BootKind) -> Result<Self, EngineError> {
        let started = Instant::now();
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut runtime = new_runtime(&shared, kind, &tokio)?;
        // runtime.js hands over its entry points (it may have run long ago, for the startup snapshot).
        runtime
            .execute_script("<sandbox>", ENTRY)
            .map_err(|e| EngineError::Boot(e.to_string()))?;

        let heap_exhausted = Arc::new(AtomicBool::new(false));
        {
            let handle = runtime.v8_isolate().thread_safe_handle();
            let flag = heap_exhausted.clone();
            runtime.add_near_heap_limit_callback(move |current, _initial| {
                flag.store(true, Ordering::SeqCst);
                handle.terminate_execution();
                // Room to unwind; the isolate is discarded afterwards.
                current + current / 2
            });
        }

        let boot = {
            let state = runtime.op_state();
            let state = state.borrow();
            let entry = state.borrow::<SandboxState>().entry.as_ref();
            entry
                .map(|e| e.boot.clone())
                .ok_or_else(|| EngineError::Boot("runtime.js did not register".into()))?
        };
        // A sandbox that has not started within BOOT_DEADLINE never will (e.g. a Pyodide that cannot
        // read its standard library); the installer may take as long as its downloads need.
        let watchdog = (kind != BootKind::Installer).then(|| {
            let w = Watchdog::start(runtime.v8_isolate().thread_safe_handle(), BOOT_DEADLINE);
            let _ = w.sender().send(watchdog::WatchMsg::Arm(Instant::now()));
            w
        });
        let wake = watchdog.as_ref().map(|w| w.wake.clone());
        let call = runtime.call(&boot);
        let booted = tokio.block_on(async {
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r),
                _ = async {
                    match &wake {
                        Some(wake) => wake.notified().await,
                        None => std::future::pending().await,
                    }
                } => None,
            }
        });
        if watchdog.as_ref().is_some_and(|w| w.fired()) || booted.is_none() {
            return Err(EngineError::Boot(format!(
                "Pyodide did not finish starting within {} s",
                BOOT_DEADLINE.as_secs()
            )));
        }
        drop(watchdog);
        booted
            .expect("checked above")
            .map_err(|e| {
                if heap_exhausted.load(Ordering::SeqCst) {
                    EngineError::Boot(format!(
                        "the V8 heap budget (workers.memory_limit_mb = {} MiB) is too small to start Pyodide",
                        shared.config.memory_limit_mb
                    ))
                } else {
                    // What Python or Emscripten printed usually says more than the JS exception.
                    let state = runtime.op_state();
                    let state = state.borrow();
                    let s = state.borrow::<SandboxState>();
                    let printed = format!("{}{}", s.stdout.text(), s.stderr.text());
                    let printed = printed.trim();
                    let tail = &printed[printed.floor_char_boundary(printed.len().saturating_sub(1000))..];
                    if tail.is_empty() {
                        EngineError::Boot(e.to_string())
                    } else {
                        EngineError::Boot(format!("{e}; output: {tail}"))
                    }
                }
            })?;
        if !shared.config.runtime_package_installation {
            runtime
                .op_state()
                .borrow_mut()
                .borrow_mut::<SandboxState>()
                .downloads_enabled = false;
        }
        // Output printed while booting is not the user's.
        {
            let state = runtime.op_state();
            let mut state = state.borrow_mut();
            let s = state.borrow_mut::<SandboxState>();
            s.stdout = output::CappedBuffer::new(MAX_STREAM_BYTES);
            s.stderr = output::CappedBuffer::new(MAX_STREAM_BYTES);
        }
        Ok(Self {
            runtime,
            tokio,
            heap_exhausted,
            boot_time: started.elapsed(),
            used: false,
        })
    }

    /// Finishes the garbage collection that booting started, for a sandbox prepared ahead of a call:
    /// otherwise its mark-compact pause (measured 4-6 ms) lands in the first milliseconds of the
    /// user's code. Costs ~15 ms of CPU, so callers that run code right away skip it.
    pub fn collect_garbage(&mut self) {
        self.runtime.v8_isolate().low_memory_notification();
    }

    /// How long booting took.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// Runs one request. The sandbox is consumed: its isolate is discarded afterwards.
    pub fn execute(mut self, request: ExecRequest) -> ExecResult {
        self.run(request)
    }

    /// Runs one request and leaves the used sandbox to the caller, who drops it (tearing down the
    /// isolate takes a while) after the result has been handed on. A sandbox runs one request only;
    /// a second call returns a runtime error.
    pub fn run(&mut self, request: ExecRequest) -> ExecResult {
        if std::mem::replace(&mut self.used, true) {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "a sandbox runs one request only",
            ));
        }
        let timeout_ms = request.timeout.as_millis();
        let watchdog = Watchdog::start(
            self.runtime.v8_isolate().thread_safe_handle(),
            request.timeout,
        );
        let (run, memory_limit_mb) = {
            let state = self.runtime.op_state();
            let mut state = state.borrow_mut();
            let s = state.borrow_mut::<SandboxState>();
            s.code = Some(request.code);
            s.input_files = request
                .files
                .into_iter()
                .map(|f| (f.path, Some(f.content)))
                .collect();
            s.watchdog = Some(watchdog.sender());
            let run = s.entry.as_ref().map(|e| e.run.clone());
            (run, s.shared.config.memory_limit_mb)
        };
        let Some(run) = run else {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "the sandbox has no run entry point",
            ));
        };

        let wake = watchdog.wake.clone();
        let runtime = &mut self.runtime;
        let outcome = self.tokio.block_on(async {
            let call = runtime.call(&run);
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r),
                _ = wake.notified() => None,
            }
        });
        let timed_out = watchdog.fired();
        drop(watchdog);

        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        let s = state.borrow_mut::<SandboxState>();
        let report: Option<Report> = s.report.take().and_then(|j| serde_json::from_str(&j).ok());
        let files = std::mem::take(&mut s.files);
        let mut result = ExecResult {
            success: false,
            stdout: s.stdout.text(),
            stderr: s.stderr.text(),
            result: None,
            output_truncated: s.stdout.truncated() || s.stderr.truncated() || files.truncated(),
            files: files.into_files(),
            error: None,
            timed_out,
        };

        if timed_out {
            result.error = Some(ExecError::new(
                ErrorKind::Timeout,
                "TimeoutError",
                format!("execution exceeded timeout_ms = {timeout_ms} ms and was stopped"),
            ));
        } else if self.heap_exhausted.load(Ordering::SeqCst) {
            result.error = Some(ExecError::new(
                ErrorKind::Runtime,
                "MemoryLimitExceeded",
                format!(
                    "the sandbox exhausted its V8 heap budget (workers.memory_limit_mb = {memory_limit_mb} MiB)"
                ),
            ));
        } else {
            match (outcome, report) {
                (Some(Ok(_)), Some(report)) => {
                    result.success = report.success;
                    result.result = report.result;
                    result.output_truncated |= report.result_truncated;
                    result.error = report.error.map(|e| ExecError {
                        kind: ErrorKind::Python,
                        error_type: e.error_type,
                        message: e.message,
                        traceback: Some(e.traceback),
                    });
                }
                (Some(Err(e)), _) => {
                    result.error = Some(ExecError::new(
                        ErrorKind::Runtime,
                        "SandboxError",
                        stalled_or(e.to_string()),
                    ));
                }
                _ => {
                    result.error = Some(ExecError::new(
                        ErrorKind::Runtime,
                        "SandboxError",
                        "the sandbox ended without a result",
                    ));
                }
            }
        }
        result
    }
}

/// `package_base_url` as an operator wrote it.
fn describe_source(source: &PackageSource) -> String {
    match source {
        PackageSource::Dir(dir) => dir.display().to_string(),
        PackageSource::Url(url) => url.clone(),
    }
}

fn stalled_or(message: String) -> String {
    if message.contains("Promise resolution is still pending") {
        "the code awaited something that can never complete (the event loop ran out of work)".into()
    } else {
        message
    }
}

/// What `runtime.js` reports after running the Python runner.
#[derive(Deserialize)]
struct Report {
    success: bool,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    result_truncated: bool,
    #[serde(default)]
    error: Option<PyError>,
}

#[derive(Deserialize)]
struct PyError {
    #[serde(rename = "type")]
    error_type: String,
    message: String,
    traceback: String,
}
