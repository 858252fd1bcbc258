//! The engine: makes what every sandbox of the process shares (`shared.rs`) once — the V8 startup
//! snapshot, the package layer, the Pyodide memory snapshot (taken now, or read back from
//! `package_cache_dir` and trusted once a sandbox boots from it) — and then sandboxes:
//! [`Engine::boot`] makes a ready [`Sandbox`].

use std::sync::Arc;
use std::time::Instant;

use super::isolate::Sandbox;
use super::memory_snapshot::{self, SharedSnapshot};
use super::ops::Role;
use super::shared::{BootMode, EngineConfig, EngineError, EngineShared};
use super::types::{ErrorKind, ExecError, ExecRequest, ExecResult};
use super::{layer, startup};
use crate::assets::Assets;

/// Appended to micropip's `__init__.py` in the package layer: index URLs and the installation policy.
const MICROPIP_POLICY_PY: &str = include_str!("micropip_policy.py");

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
        let key = memory_snapshot::key(
            &self.shared.assets,
            &self.shared.modules,
            &super::ops::glue(),
        );
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
