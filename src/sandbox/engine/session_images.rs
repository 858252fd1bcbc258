//! The engine's side of session images: a session's sandbox booted saveable against the snapshot
//! it starts from, restored from an image (its memory written as that snapshot's pages and the
//! changed ones), and the key an image is made and accepted by.

use std::sync::Arc;
use std::time::Instant;

use super::Engine;
use crate::sandbox::image::{SessionImage, check_references};
use crate::sandbox::isolate::Sandbox;
use crate::sandbox::isolate::boot::ParkedSandbox;
use crate::sandbox::prepared::memory_snapshot::{DylibRecord, SharedSnapshot, SnapshotMemory};
use crate::sandbox::prepared::shared::EngineError;
use crate::sandbox::prepared::snapshots::Flavor;
use crate::sandbox::prepared::{session_base, snapshot_files};

impl Engine {
    /// A session's sandbox booted as far as it goes before its snapshot is chosen (see
    /// `ParkedSandbox`), to be finished by `boot_session_flavor` or `restore_session` on this
    /// thread; `None` when this engine cannot park one (full boots, or a Pyodide whose loader does
    /// not instantiate first) or parking failed (logged).
    pub fn park_session(&self) -> Option<ParkedSandbox> {
        if self.shared.snapshots.get(Flavor::Plain).is_none() || !self.shared.modules.parking() {
            return None;
        }
        ParkedSandbox::park(self.shared.clone())
            .inspect_err(|e| tracing::warn!(error = %e, "a session sandbox could not be parked"))
            .ok()
    }

    /// Boots a session's sandbox of `flavor` (finishing `parked` when given), saveable as an image
    /// (see `Sandbox::save_image`) made of the pages that differ from the snapshot it started from.
    pub fn boot_session_flavor(
        &self,
        parked: Option<ParkedSandbox>,
        flavor: Flavor,
    ) -> Result<Sandbox, EngineError> {
        let based = self.image_base(flavor);
        let snapshot = based.as_ref().map(|(base, _)| base.clone());
        self.boot_session(parked, snapshot, based)
    }

    /// A session's sandbox restored from `snapshot` (finishing `parked` when given), saveable, its
    /// image saved against `based` (the snapshot it started from, and that snapshot's name) when it
    /// has one.
    fn boot_session(
        &self,
        parked: Option<ParkedSandbox>,
        snapshot: Option<Arc<SharedSnapshot>>,
        based: Option<(Arc<SharedSnapshot>, String)>,
    ) -> Result<Sandbox, EngineError> {
        let mut sandbox = match (parked, snapshot) {
            (Some(parked), Some(snapshot)) => parked.unpark(snapshot)?,
            (_, snapshot) => Sandbox::boot_saveable(self.shared.clone(), snapshot)?,
        };
        sandbox.keep_for_session();
        if let Some((base, name)) = based {
            sandbox.save_against(base, name);
        }
        Ok(sandbox)
    }

    /// The `flavor` snapshot and the name a session image based on it gives it (`flavor:digest`).
    pub(super) fn image_base(&self, flavor: Flavor) -> Option<(Arc<SharedSnapshot>, String)> {
        let base = self.shared.snapshots.get(flavor)?;
        let name = format!("{}:{}", flavor.name(), base.digest());
        Some((base.clone(), name))
    }

    /// A session's sandbox restored from `image`: its interpreter as it was saved, its files back
    /// under /workspace, saveable again. What the image names of the JavaScript world is checked
    /// first (`image::check_references`). An image based on a snapshot is restored without building
    /// its memory in one piece: the base's pages and the changed ones are written straight into
    /// the new sandbox's memory. `parked`, when given, is the sandbox finished from it.
    pub fn restore_session(
        &self,
        parked: Option<ParkedSandbox>,
        image: SessionImage,
    ) -> Result<Sandbox, EngineError> {
        let dylibs = match image.dylibs {
            Some(json) => Some(DylibRecord::parse(json).ok_or_else(|| {
                EngineError::Boot("the image's record of shared libraries is malformed".into())
            })?),
            None => None,
        };
        let mut based = None;
        let memory = match image.base {
            Some(named) => {
                let flavor = named
                    .split_once(':')
                    .and_then(|(f, _)| Flavor::named(f))
                    .ok_or_else(|| {
                        EngineError::Boot("the image names an unknown base snapshot".into())
                    })?;
                let (base, name) = self
                    .image_base(flavor)
                    .filter(|(_, name)| *name == named)
                    .ok_or_else(|| {
                        EngineError::Boot(
                            "the image was saved against a memory snapshot this server does not have (another build or package set)".into(),
                        )
                    })?;
                if !self.shared.modules.sparse_restore() {
                    return Err(EngineError::Boot(
                        "this Pyodide does not restore memory as expected, which restoring an image needs".into(),
                    ));
                }
                let max = usize::try_from(
                    (self.shared.settings.wasm_memory_limit_mb + 64).saturating_mul(1 << 20),
                )
                .unwrap_or(usize::MAX);
                let delta =
                    session_base::Delta::parse(image.memory, max).map_err(EngineError::Boot)?;
                check_references(delta.header())?;
                based = Some((base.clone(), name));
                SharedSnapshot::overlaid(base, delta, dylibs).map_err(EngineError::Boot)?
            }
            None => {
                check_references(&image.memory)?;
                let memory = image.memory.to_vec();
                match dylibs {
                    Some(dylibs) => {
                        SharedSnapshot::with_dylibs(memory, dylibs, SnapshotMemory::Copied)
                    }
                    None => SharedSnapshot::new(memory),
                }
            }
        };
        let prepared = Instant::now();
        let memory = Arc::new(memory.of_session());
        let mut sandbox = self.boot_session(parked, Some(memory), based)?;
        tracing::debug!(
            boot_ms = prepared.elapsed().as_secs_f64() * 1e3,
            "session sandbox booted from its image"
        );
        for (path, data) in image.files {
            sandbox
                .store_file(&path, data)
                .map_err(|e| EngineError::Boot(e.to_string()))?;
        }
        Ok(sandbox)
    }

    /// The key a session image is made and accepted by: this build's glue, the exact Pyodide files
    /// and the package layer (a process that differs in any of them refuses the image rather than
    /// restoring it wrongly).
    pub fn image_key(&self) -> &str {
        self.shared.image_key.get_or_init(|| {
            let plain = snapshot_files::key(
                &self.shared.assets,
                &self.shared.modules,
                &crate::sandbox::isolate::ops::glue(),
            );
            let layer = self
                .shared
                .layer
                .get()
                .map(|l| l.digest())
                .unwrap_or_default();
            snapshot_files::preimported_key(&plain, layer, &[])
        })
    }
}
