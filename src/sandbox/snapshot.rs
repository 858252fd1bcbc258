//! The Pyodide memory snapshot: held once per process in a V8 backing store that every isolate maps
//! without copying, and kept on disk under `package_cache_dir` so a restart does not boot CPython from
//! scratch. The file name is a digest of everything that shapes the snapshot (the Pyodide files in use,
//! this build's JavaScript and Python glue, the crate version); a stale or damaged file is never trusted
//! blindly: it carries a sha256, and the engine test-boots a sandbox from it and takes a fresh snapshot
//! if that fails.

use std::path::{Path, PathBuf};

use deno_core::v8;
use sha2::{Digest, Sha256};

use super::modules::Modules;
use crate::assets::Assets;

/// The snapshot bytes in a V8 backing store shared by every isolate.
pub(crate) struct SharedSnapshot {
    store: v8::SharedRef<v8::BackingStore>,
}

// SAFETY: a V8 BackingStore is reference-counted with atomic counts (std::shared_ptr) and may be used
// from any thread and isolate; its bytes are only read. Every isolate detaches its ArrayBuffer right
// after Pyodide has restored from it, before any user code runs, so no script can write to it.
unsafe impl Send for SharedSnapshot {}
unsafe impl Sync for SharedSnapshot {}

impl SharedSnapshot {
    pub fn new(bytes: Vec<u8>) -> Self {
        let store = v8::ArrayBuffer::new_backing_store_from_bytes(bytes.into_boxed_slice());
        Self {
            store: store.make_shared(),
        }
    }

    /// A new ArrayBuffer of the calling isolate over the shared bytes.
    pub fn array_buffer<'s>(&self, scope: &v8::PinScope<'s, '_>) -> v8::Local<'s, v8::ArrayBuffer> {
        v8::ArrayBuffer::with_backing_store(scope, &self.store)
    }
}

/// The digest naming the snapshot file: this build's glue and the exact Pyodide files in use, with
/// Pyodide's JavaScript as sandboxes are served it (`modules`, with the lazy GOT). Computed once per
/// engine.
pub fn key(assets: &Assets, modules: &Modules) -> String {
    let mut hash = Sha256::new();
    let parts: [&[u8]; 9] = [
        crate::assets::PYODIDE_VERSION.as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
        include_str!("js/runtime.js").as_bytes(),
        super::RUNNER_PY.as_bytes(),
        &assets.wasm,
        &assets.stdlib,
        modules.source("pyodide.mjs").as_bytes(),
        modules.source("pyodide.asm.mjs").as_bytes(),
        assets.lock_json.as_bytes(),
    ];
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    crate::packages::hex(&hash.finalize()[..12])
}

fn dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("snapshot")
}

/// The snapshot file for this build, if one was stored and its checksum (the file's last 32 bytes,
/// the sha256 of the rest) holds.
pub fn load(cache_dir: &Path, key: &str) -> Option<Vec<u8>> {
    let path = dir(cache_dir).join(format!("{key}.bin"));
    match std::fs::read(&path) {
        Ok(mut bytes) if bytes.len() > 32 => {
            let body = bytes.len() - 32;
            if Sha256::digest(&bytes[..body]).as_slice() != &bytes[body..] {
                tracing::warn!(path = %path.display(), "the stored Pyodide snapshot is damaged; taking a new one");
                return None;
            }
            bytes.truncate(body);
            Some(bytes)
        }
        Ok(_) => None,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the stored Pyodide snapshot");
            }
            None
        }
    }
}

/// Stores `bytes` as this build's snapshot, removing snapshots of other builds. Failures only warn:
/// the next start then takes a snapshot again.
pub fn store(cache_dir: &Path, key: &str, bytes: &[u8]) {
    let dir = dir(cache_dir);
    let name = format!("{key}.bin");
    let result = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let file = entry.file_name().to_string_lossy().into_owned();
            // Other builds' snapshots go; other writers' temporary files stay.
            if file != name && !file.starts_with('.') {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let tmp = dir.join(format!(".{name}.tmp-{}", super::layer::unique_suffix()));
        let write = || -> std::io::Result<()> {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.write_all(&Sha256::digest(bytes))?;
            file.sync_all()?;
            std::fs::rename(&tmp, dir.join(&name))
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    })();
    if let Err(e) = result {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot store the Pyodide snapshot; the next start takes it again");
    }
}

/// Removes this build's stored snapshot (it failed to boot).
pub fn discard(cache_dir: &Path, key: &str) {
    let _ = std::fs::remove_file(dir(cache_dir).join(format!("{key}.bin")));
}
