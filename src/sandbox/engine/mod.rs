//! The engine: it prepares, at start-up, what the process's sandboxes share (the parts in
//! [`crate::sandbox::prepared`]), partly by booting sandboxes itself (the snapshot makers, the
//! package installer, the pre-import check), and then hands sandboxes out: [`Engine::boot`] makes a
//! ready [`Sandbox`]; a session's are saved and restored as images (`session_images.rs`, over
//! `src/sandbox/prepared/session_base.rs`).

mod session_images;

use std::sync::Arc;
use std::time::Instant;

use crate::assets::Assets;
use crate::sandbox::isolate::Sandbox;
use crate::sandbox::isolate::ops::{Role, TakenSnapshot};
use crate::sandbox::isolate::startup;
use crate::sandbox::pages::c_heap;
use crate::sandbox::pages::spare;
use crate::sandbox::prepared::memory_snapshot::{
    DylibRecord, SharedSnapshot, SnapshotMemory, SnapshotOrigin,
};
use crate::sandbox::prepared::shared::{BootMode, EngineError, EngineSettings, EngineShared};
use crate::sandbox::prepared::snapshots::{Flavor, PreimportedSet};
use crate::sandbox::prepared::{layer, snapshot_files};
use crate::sandbox::types::{ErrorKind, ErrorType, ExecError, ExecRequest, ExecResult};
use crate::upstream::Upstreams;

/// Appended to micropip's `__init__.py` in the package layer: index URLs and the installation policy.
const MICROPIP_POLICY_PY: &str = include_str!("micropip_policy.py");

/// Run in a sandbox restored from a snapshot with pre-imported modules before it is trusted.
const PREIMPORT_CHECK_PY: &str = include_str!("preimport_check.py");

/// Run before that check when sandboxes map the snapshot's memory: the steps whose pages make the
/// working set (see `pages/mapped_image.rs`).
const WORKING_SET_PY: &str = include_str!("working_set.py");

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
    pub fn new(settings: EngineSettings) -> Result<Self, EngineError> {
        Self::with_upstreams(settings, None)
    }

    /// As [`Engine::new`], with the upstream MCP servers its sandboxes may call.
    pub fn with_upstreams(
        settings: EngineSettings,
        upstreams: Option<Arc<Upstreams>>,
    ) -> Result<Self, EngineError> {
        let asset_dir = settings
            .asset_dir
            .clone()
            .unwrap_or_else(Assets::default_dir);
        let assets = Arc::new(Assets::load(&asset_dir)?);
        crate::sandbox::prepared::startup::init_v8(settings.wasm_memory_limit_mb);
        c_heap::tune();
        let mut engine = Self {
            shared: Arc::new(EngineShared::new(settings, upstreams, assets)?),
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
        match engine.shared.settings.boot {
            BootMode::Full => engine.prepare_layer()?,
            BootMode::Snapshot => {
                let key = engine.prepare_memory_snapshot()?;
                engine.prepare_preimported_snapshot(&key);
            }
        }
        Ok(engine)
    }

    /// Reads back this build's stored memory snapshot or takes one, while the package layer is
    /// prepared (the snapshot holds no package state). A stored snapshot is trusted only once a
    /// sandbox has booted from it; one that does not boot is discarded and a fresh one taken.
    fn prepare_memory_snapshot(&self) -> Result<String, EngineError> {
        let cache_dir = &self.shared.settings.package_cache_dir;
        let key = snapshot_files::key(
            &self.shared.assets,
            &self.shared.modules,
            &crate::sandbox::isolate::ops::glue(),
        );
        let stored = snapshot_files::load(cache_dir, Flavor::Plain, &key);
        let maker = match stored {
            Some(_) => None,
            None => Some(self.spawn_snapshot_maker(Vec::new())?),
        };
        let layer = self.prepare_layer();
        let taken = maker.map(SnapshotMaker::join);
        layer?;
        let (snapshot, origin) = match (stored, taken) {
            (_, Some(taken)) => {
                let bytes = taken?.bytes;
                let on_disk = snapshot_files::store(cache_dir, Flavor::Plain, &key, &bytes);
                (
                    Arc::new(SharedSnapshot::new(bytes)),
                    SnapshotOrigin::Taken { on_disk },
                )
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
                        (candidate, SnapshotOrigin::ReadBack)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the stored Pyodide snapshot does not boot; taking a new one");
                        snapshot_files::discard(cache_dir, Flavor::Plain, &key);
                        let bytes = self.spawn_snapshot_maker(Vec::new())?.join()?.bytes;
                        let on_disk = snapshot_files::store(cache_dir, Flavor::Plain, &key, &bytes);
                        (
                            Arc::new(SharedSnapshot::new(bytes)),
                            SnapshotOrigin::Taken { on_disk },
                        )
                    }
                }
            }
            (None, None) => unreachable!("a snapshot maker runs when none is stored"),
        };
        self.shared.snapshots.set_plain(snapshot, origin);
        Ok(key)
    }

    /// The modules of the snapshot with pre-imported modules: `preimport_modules`, then (with
    /// `preimport_preinstalled`, in snapshot boot) the top-level modules of `preinstall_packages`
    /// that the package layer holds (a package whose module has another name than the lock file
    /// knows is left out rather than failing the snapshot).
    fn preimport_list(&self) -> Vec<String> {
        let config = &self.shared.settings;
        let mut modules = config.preimport_modules.clone();
        if !config.preimport_preinstalled || config.boot != BootMode::Snapshot {
            return modules;
        }
        let Some(layer) = self.shared.layer.get() else {
            return modules;
        };
        for requirement in &config.preinstall_packages {
            let derived = crate::packages::top_level_modules(
                requirement,
                &self.shared.assets.imports_by_package,
            );
            for module in derived {
                let top = module.split('.').next().unwrap_or(&module);
                if !layer.has_top_level_module(top) {
                    tracing::info!(requirement = %requirement, module = %module, "not pre-imported: the package layer has no such module");
                } else if !modules.contains(&module) {
                    modules.push(module);
                }
            }
        }
        modules
    }

    /// With `preimport_modules` (or `preimport_preinstalled`) configured, makes the snapshot
    /// sandboxes restore with those modules already imported (read back from `package_cache_dir` or
    /// taken now, after the package layer), and trusts it only once a sandbox booted from it finds
    /// them working. Whatever fails here only warns: sandboxes then restore the plain snapshot and
    /// import as usual.
    fn prepare_preimported_snapshot(&self, plain_key: &str) {
        let modules = &self.preimport_list();
        if modules.is_empty() {
            return;
        }
        if !self.shared.modules.dylink_hooks() {
            tracing::warn!(
                "this Pyodide's dynamic linker cannot be hooked: no snapshot with pre-imported modules"
            );
            return;
        }
        let Some(layer) = self.shared.layer.get() else {
            return;
        };
        let started = Instant::now();
        let cache_dir = &self.shared.settings.package_cache_dir;
        let key = snapshot_files::preimported_key(plain_key, layer.digest(), modules);
        let stored = snapshot_files::load(cache_dir, Flavor::Preimported, &key)
            .and_then(snapshot_files::decode_preimported);
        let reused = stored.is_some();
        let taken = match stored {
            Some(found) => Ok(found),
            None => self
                .spawn_snapshot_maker(modules.clone())
                .and_then(SnapshotMaker::join)
                .and_then(|taken| match taken.dylibs.and_then(DylibRecord::parse) {
                    Some(dylibs) => Ok((taken.bytes, dylibs)),
                    None => Err(EngineError::Boot(
                        "no record of its shared libraries".into(),
                    )),
                }),
        };
        let (bytes, dylibs) = match taken {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, modules = ?modules, "cannot take the snapshot with pre-imported modules; sandboxes import them when asked");
                return;
            }
        };
        if !reused {
            let _ = snapshot_files::store(
                cache_dir,
                Flavor::Preimported,
                &key,
                &snapshot_files::encode_preimported(&bytes, &dylibs),
            );
        }
        let packages = PreimportedSet::new(dylibs.modules().iter().cloned());
        let config = &self.shared.settings;
        let memory = if config.map_snapshot_memory {
            SnapshotMemory::Mapped
        } else if config.give_back_idle_memory {
            SnapshotMemory::CopiedFromFile
        } else {
            SnapshotMemory::Copied
        };
        let candidate = Arc::new(SharedSnapshot::with_dylibs(bytes, dylibs, memory));
        match self.check_preimported(&candidate, modules) {
            Ok(()) => {
                tracing::info!(
                    modules = ?modules,
                    bytes = candidate.byte_len(),
                    reused,
                    ms = started.elapsed().as_millis() as u64,
                    "snapshot with pre-imported modules ready"
                );
                self.shared.snapshots.set_preimported(candidate, packages);
            }
            Err(e) => {
                snapshot_files::discard(cache_dir, Flavor::Preimported, &key);
                tracing::warn!(error = %e, modules = ?modules, "the snapshot with pre-imported modules does not work; sandboxes import them when asked");
            }
        }
    }

    /// Boots a sandbox from `snapshot` and checks that the pre-imported modules are there and work.
    fn check_preimported(
        &self,
        snapshot: &Arc<SharedSnapshot>,
        modules: &[String],
    ) -> Result<(), String> {
        let mut sandbox = Sandbox::boot(self.shared.clone(), Some(snapshot.clone()))
            .map_err(|e| e.to_string())?;
        let modules = serde_json::to_string(modules).map_err(|e| e.to_string())?;
        // A mapped memory's working set is what this call writes: everyday steps first.
        let warm = if snapshot.maps_memory() {
            format!("{WORKING_SET_PY}\nwarm()\n")
        } else {
            String::new()
        };
        let result = sandbox.run(
            ExecRequest {
                code: format!("{warm}{PREIMPORT_CHECK_PY}\ncheck({modules})"),
                files: Vec::new(),
                timeout: std::time::Duration::from_secs(30),
                ..Default::default()
            },
            None,
        );
        match (&result.error, result.result.as_deref()) {
            (None, Some("ok")) => {}
            (Some(e), _) => return Err(e.traceback.clone().unwrap_or_else(|| e.message.clone())),
            (None, other) => return Err(format!("the check returned {other:?}")),
        }
        // What this restore and call wrote of the mapped memory, every later sandbox gets copied
        // up front (see pages/mapped_image.rs).
        if snapshot.image().is_some() {
            let bytes = sandbox.measure_working_set();
            tracing::debug!(
                mib = bytes as f64 / f64::from(1 << 20),
                "working set of the pre-imported snapshot's memory"
            );
        }
        Ok(())
    }

    /// Makes the package layer ready: reuses the one under `package_cache_dir` when its key matches,
    /// otherwise boots an installer sandbox that loads micropip and installs `preinstall_packages`,
    /// and stores the result (in memory only, with a warning, if the directory cannot be written).
    fn prepare_layer(&self) -> Result<(), EngineError> {
        let started = Instant::now();
        let config = &self.shared.settings;
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
                let captured = match self.run_installer() {
                    Ok(captured) => captured,
                    // Nothing the operator asked for failed: start without micropip.
                    Err(e) if config.preinstall_packages.is_empty() => {
                        tracing::warn!(
                            error = %e,
                            "no package source reachable: starting without micropip (importing it fails; restart with a reachable package_base_url to install packages)"
                        );
                        layer::Captured::default()
                    }
                    Err(e) => return Err(e),
                };
                if captured.files.is_empty() {
                    (captured, layer::LayerOrigin::Offline)
                } else {
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
        if !patched_micropip && origin != layer::LayerOrigin::Offline {
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
        let source = self.shared.package_source.to_string();
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
    fn spawn_snapshot_maker(&self, preimport: Vec<String>) -> Result<SnapshotMaker, EngineError> {
        let shared = self.shared.clone();
        let started = Instant::now();
        let handle = std::thread::Builder::new()
            .name("snapshot-maker".into())
            .stack_size(8 * 1024 * 1024)
            .spawn(move || {
                let sandbox = Sandbox::boot_as(
                    shared,
                    Role::MemorySnapshotMaker {
                        preimport,
                        taken: None,
                    },
                )?;
                sandbox
                    .take_role(|role| match role {
                        Role::MemorySnapshotMaker { taken, .. } => taken.take(),
                        _ => None,
                    })
                    .ok_or_else(|| EngineError::Boot("no memory snapshot was produced".into()))
            })?;
        Ok(SnapshotMaker { handle, started })
    }

    /// The settings the engine was made with.
    pub fn settings(&self) -> &EngineSettings {
        &self.shared.settings
    }

    /// The upstream MCP servers its sandboxes may call, if any.
    pub fn upstreams(&self) -> Option<&Arc<Upstreams>> {
        self.shared.upstreams.as_ref()
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
        self.boot_flavor(Flavor::Plain)
    }

    /// Gives the C heap's free memory back to the system (see `pages/c_heap.rs`), and this thread's
    /// spare sandbox memory (see `keep_spare_memory_on_this_thread`); the pool calls it on a worker
    /// with nothing to do.
    pub fn release_free_memory(&self) {
        spare::release();
        c_heap::release_free();
    }

    /// This thread (a pool worker, which boots a sandbox right after it drops one) keeps the pages
    /// of a dropped sandbox's restored memory for the next sandbox it boots, instead of having the
    /// kernel clear fresh ones (see `pages/spare.rs`).
    pub fn keep_spare_memory_on_this_thread(&self) {
        spare::keep_on_this_thread();
    }

    /// How many sandboxes (in the process) restored their snapshot into such pages.
    pub fn spare_memory_reuses(&self) -> u64 {
        spare::taken()
    }

    /// How many of those (in the process) rewrote only the pages the last sandbox wrote, as the
    /// kernel recorded them (see `pages/written.rs`).
    pub fn spare_memory_recorded_reuses(&self) -> u64 {
        spare::taken_recorded()
    }

    /// Whether this system lets the engine record which pages a sandbox wrote (userfaultfd with
    /// asynchronous write-protection); without it, reused pages are compared one by one.
    pub fn records_sandbox_writes(&self) -> bool {
        spare::can_record_writes()
    }

    /// Like [`release_free_memory`](Self::release_free_memory), at most once a second in the
    /// process: for what drops sandboxes often (session threads).
    pub fn release_free_memory_now_and_then(&self) {
        c_heap::release_free_now_and_then();
    }

    /// The kind of sandbox that serves `code` best (see `snapshots.rs`).
    pub fn flavor_for(&self, code: &str) -> Flavor {
        self.shared.snapshots.flavor_for(code)
    }

    /// Boots a fresh sandbox of `flavor`: with the pre-imported modules when asked and there is a
    /// snapshot of them (falling back, with a warning, to the plain snapshot if it does not restore).
    pub fn boot_flavor(&self, flavor: Flavor) -> Result<Sandbox, EngineError> {
        let snapshots = &self.shared.snapshots;
        if flavor == Flavor::Preimported
            && let Some(snapshot) = snapshots.get(Flavor::Preimported)
        {
            match Sandbox::boot(self.shared.clone(), Some(snapshot.clone())) {
                Ok(sandbox) => return Ok(sandbox),
                Err(e) => tracing::warn!(
                    error = %e,
                    "a sandbox did not restore the snapshot with pre-imported modules; booting it from the plain snapshot"
                ),
            }
        }
        Sandbox::boot(self.shared.clone(), snapshots.get(Flavor::Plain).cloned())
    }

    /// Whether sandboxes start with pre-imported modules (`preimport_modules`, `preimport_preinstalled`).
    pub fn preimported(&self) -> bool {
        self.shared.snapshots.get(Flavor::Preimported).is_some()
    }

    /// Where the plain memory snapshot came from (`None` in full boot, which has none).
    pub fn snapshot_origin(&self) -> Option<SnapshotOrigin> {
        self.shared.snapshots.origin()
    }

    /// Boots a sandbox (of the flavor that serves it) and runs `request` in it. Start-up failures
    /// become a runtime error result.
    pub fn execute(&self, request: ExecRequest) -> ExecResult {
        match self.boot_flavor(self.flavor_for(&request.code)) {
            Ok(sandbox) => sandbox.execute(request),
            Err(e) => ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                ErrorType::SandboxStartupError,
                e.to_string(),
            )),
        }
    }
}

/// A snapshot being taken on its own thread.
struct SnapshotMaker {
    handle: std::thread::JoinHandle<Result<TakenSnapshot, EngineError>>,
    started: Instant,
}

impl SnapshotMaker {
    fn join(self) -> Result<TakenSnapshot, EngineError> {
        let taken = self
            .handle
            .join()
            .map_err(|_| EngineError::Boot("the snapshot maker panicked".into()))?
            .map_err(|e| {
                EngineError::Boot(format!("taking the Pyodide memory snapshot failed: {e}"))
            })?;
        tracing::info!(
            bytes = taken.bytes.len(),
            preimported = taken.dylibs.is_some(),
            ms = self.started.elapsed().as_millis() as u64,
            "Pyodide memory snapshot taken"
        );
        Ok(taken)
    }
}
