//! Memory snapshots on disk, under `package_cache_dir`, so a restart does not boot CPython from
//! scratch. The file name is a digest of everything that shapes the snapshot (the Pyodide files in
//! use, this build's JavaScript and Python glue, the crate version); a stale or damaged file is never
//! trusted blindly: it carries a sha256, and the engine test-boots a sandbox from it and takes a
//! fresh snapshot if that fails.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::assets::Assets;
use crate::sandbox::prepared::memory_snapshot::{DylibRecord, Flavor};
use crate::sandbox::prepared::modules::Modules;

/// The digest naming the snapshot file: this build's glue and the exact Pyodide files in use, with
/// Pyodide's JavaScript as sandboxes are served it (`modules`, with the lazy GOT). Computed once per
/// engine.
pub fn key(assets: &Assets, modules: &Modules, glue: &[&str]) -> String {
    let mut hash = Sha256::new();
    let parts: [&[u8]; 7] = [
        crate::assets::PYODIDE_VERSION.as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
        &assets.wasm,
        &assets.stdlib,
        modules.source("pyodide.mjs").as_bytes(),
        modules.source("pyodide.asm.mjs").as_bytes(),
        assets.lock_json.as_bytes(),
    ];
    for part in glue.iter().map(|g| g.as_bytes()).chain(parts) {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hex::encode(&hash.finalize()[..12])
}

/// The digest naming the snapshot with pre-imported modules: the plain snapshot's key, the package
/// layer it was taken with (every file's path and bytes: the libraries' bases depend on them) and the
/// modules imported.
pub fn preimported_key(plain_key: &str, layer_digest: &str, modules: &[String]) -> String {
    let mut hash = Sha256::new();
    for part in [plain_key, layer_digest]
        .into_iter()
        .chain(modules.iter().map(String::as_str))
    {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(&hash.finalize()[..12])
}

/// Each kind of snapshot has a directory of its own (storing one removes the other builds'
/// snapshots of its kind only). The plain one is taken right after CPython and the runner started;
/// the one with pre-imported modules after the package layer was copied in and modules were
/// imported, and its file starts with the record of its shared libraries (u64 length, JSON), then
/// Pyodide's snapshot.
fn dir(cache_dir: &Path, kind: Flavor) -> PathBuf {
    cache_dir.join(match kind {
        Flavor::Plain => "snapshot",
        Flavor::Preimported => "snapshot-preimported",
    })
}

/// A snapshot with pre-imported modules as stored: the record of its libraries, then its bytes.
pub fn encode_preimported(bytes: &[u8], dylibs: &DylibRecord) -> Vec<u8> {
    let json = dylibs.json().as_bytes();
    let mut out = Vec::with_capacity(8 + json.len() + bytes.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json);
    out.extend_from_slice(bytes);
    out
}

/// The (snapshot bytes, record) of a stored snapshot with pre-imported modules.
pub fn decode_preimported(mut stored: Vec<u8>) -> Option<(Vec<u8>, DylibRecord)> {
    let len = usize::try_from(u64::from_le_bytes(stored.get(..8)?.try_into().ok()?)).ok()?;
    let end = 8usize.checked_add(len)?;
    let dylibs = DylibRecord::parse(String::from_utf8(stored.get(8..end)?.to_vec()).ok()?)?;
    stored.drain(..end);
    Some((stored, dylibs))
}

/// The snapshot file for this build, if one was stored and its checksum (the file's last 32 bytes,
/// the sha256 of the rest) holds.
pub fn load(cache_dir: &Path, kind: Flavor, key: &str) -> Option<Vec<u8>> {
    let path = dir(cache_dir, kind).join(format!("{key}.bin"));
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

/// Stores `bytes` as this build's snapshot, removing snapshots of other builds; whether it was
/// stored. Failures only warn: the next start then takes a snapshot again.
pub fn store(cache_dir: &Path, kind: Flavor, key: &str, bytes: &[u8]) -> bool {
    let dir = dir(cache_dir, kind);
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
        let tmp = dir.join(format!(
            ".{name}.tmp-{}",
            crate::sandbox::prepared::layer::unique_suffix()
        ));
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
    if let Err(e) = &result {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot store the Pyodide snapshot; the next start takes it again");
    }
    result.is_ok()
}

/// Removes this build's stored snapshot (it failed to boot).
pub fn discard(cache_dir: &Path, kind: Flavor, key: &str) {
    let _ = std::fs::remove_file(dir(cache_dir, kind).join(format!("{key}.bin")));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preimported_snapshot_round_trips_and_its_key_covers_layer_and_modules() {
        let record = DylibRecord::parse("{\"loads\":[],\"modules\":[\"numpy\"]}".into()).unwrap();
        assert_eq!(record.modules(), ["numpy"]);
        let stored = encode_preimported(b"snapshot bytes", &record);
        assert_eq!(
            decode_preimported(stored),
            Some((b"snapshot bytes".to_vec(), record))
        );
        assert_eq!(
            DylibRecord::parse("{\"loads\":[]}".into()),
            None,
            "no modules: not a record"
        );
        assert_eq!(decode_preimported(vec![200, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(decode_preimported(vec![1, 2]), None);
        let modules = |list: &[&str]| list.iter().map(|m| m.to_string()).collect::<Vec<_>>();
        let key = preimported_key("plain", "layer", &modules(&["pandas"]));
        assert_eq!(
            key,
            preimported_key("plain", "layer", &modules(&["pandas"]))
        );
        for other in [
            preimported_key("plain2", "layer", &modules(&["pandas"])),
            preimported_key("plain", "layer2", &modules(&["pandas"])),
            preimported_key("plain", "layer", &modules(&["pandas", "numpy"])),
            preimported_key("plain", "layer", &modules(&["pandasnumpy"])),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn each_kind_of_snapshot_is_stored_apart() {
        let dir = std::env::temp_dir().join(format!("snapshot-kinds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        store(&dir, Flavor::Plain, "a", b"plain");
        store(&dir, Flavor::Preimported, "b", b"preimported");
        assert_eq!(
            load(&dir, Flavor::Plain, "a").as_deref(),
            Some(&b"plain"[..])
        );
        assert_eq!(
            load(&dir, Flavor::Preimported, "b").as_deref(),
            Some(&b"preimported"[..])
        );
        // Storing another build's plain snapshot leaves the other kind alone.
        store(&dir, Flavor::Plain, "c", b"plain 2");
        assert_eq!(load(&dir, Flavor::Plain, "a"), None);
        assert!(load(&dir, Flavor::Preimported, "b").is_some());
        discard(&dir, Flavor::Preimported, "b");
        assert_eq!(load(&dir, Flavor::Preimported, "b"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
