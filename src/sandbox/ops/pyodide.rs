//! The ops of Pyodide's plumbing (pyodide.js): boot parameters, the memory snapshot to restore (or the
//! one taken), Pyodide's WebAssembly compiled once per process, the function-table wrapper modules,
//! the package layer, the installer's captures, and the runtime files and verified wheels that
//! Pyodide's shell path reads.

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::{Role, state, state_mut};

/// Boot parameters for `loadPyodide`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BootConfig {
    lock_file: String,
    runner_source: &'static str,
    auto_load: bool,
    /// "sandbox", "snapshot" (boot only to take a memory snapshot) or "installer" (boot only to
    /// build the package layer); see `Role`.
    kind: &'static str,
    /// Restore the engine's memory snapshot instead of a full start-up.
    load_snapshot: bool,
    /// Installer only: the micropip requirements to install.
    requirements: Vec<String>,
    /// Installer only: micropip index URLs (empty: micropip's default).
    index_urls: Vec<String>,
    env: std::collections::BTreeMap<&'static str, &'static str>,
}

#[op2]
#[serde]
pub(super) fn op_sandbox_boot_config(op_state: &mut OpState) -> BootConfig {
    let s = state(op_state);
    BootConfig {
        lock_file: s.shared.assets.lock_json.to_string(),
        runner_source: super::RUNNER_PY,
        auto_load: s.shared.config.runtime_package_installation,
        kind: s.role.name(),
        load_snapshot: s.restore_from().is_some(),
        requirements: if matches!(s.role, Role::Installer { .. }) {
            s.shared.config.preinstall_packages.clone()
        } else {
            Vec::new()
        },
        index_urls: s.shared.config.package_index_urls.clone(),
        env: [
            ("HOME", "/home/pyodide"),
            ("LANG", "C.UTF-8"),
            ("PYTHONIOENCODING", "utf-8"),
        ]
        .into_iter()
        .collect(),
    }
}

/// The engine's memory snapshot for `loadPyodide({_loadSnapshot})`: an ArrayBuffer over the bytes
/// every isolate shares (not a copy). `runtime.js` detaches it as soon as Pyodide has restored.
#[op2]
pub(super) fn op_sandbox_snapshot<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let snapshot = state(op_state)
        .restore_from()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?;
    Ok(snapshot.array_buffer(scope).into())
}

/// Pyodide's snapshot restore, done by Rust: makes this instance's memory equal to the engine
/// snapshot's linear memory (found at `memory_offset` of the snapshot), writing only the pages that
/// hold data and clearing any zero page that instantiation wrote to (see `SharedSnapshot::restore_into`).
#[op2(fast)]
pub(super) fn op_sandbox_restore_memory(
    op_state: &mut OpState,
    #[buffer] heap: &mut [u8],
    memory_offset: u32,
) -> Result<(), JsErrorBox> {
    let snapshot = state(op_state)
        .restore_from()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?;
    snapshot
        .restore_into(heap, memory_offset as usize)
        .map_err(JsErrorBox::generic)
}

#[op2(fast)]
pub(super) fn op_sandbox_store_snapshot(
    op_state: &mut OpState,
    #[buffer] data: &[u8],
) -> Result<(), JsErrorBox> {
    match &mut state_mut(op_state).role {
        Role::MemorySnapshotMaker { taken } => {
            *taken = Some(data.to_vec());
            Ok(())
        }
        _ => Err(JsErrorBox::generic("this sandbox does not take snapshots")),
    }
}

/// Pyodide's WebAssembly module, compiled once per process: the first caller compiles it and keeps
/// V8's compiled module; every later isolate re-creates its module object from that without compiling
/// (and shares the code V8 has since optimised).
#[op2]
pub(super) fn op_sandbox_wasm_module<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let shared = state(op_state).shared.clone();
    if let Some(compiled) = shared.compiled_wasm.get()
        && let Some(module) = v8::WasmModuleObject::from_compiled_module(scope, compiled)
    {
        return Ok(module.into());
    }
    let module = v8::WasmModuleObject::compile(scope, &shared.assets.wasm)
        .ok_or_else(|| JsErrorBox::generic("pyodide.asm.wasm does not compile"))?;
    let _ = shared.compiled_wasm.set(module.get_compiled_module());
    Ok(module.into())
}

/// How many lists of signatures get a compiled wrapper module kept: the start-up's, with room to spare.
const MAX_WRAPPER_MODULES: usize = 4;

/// The module that wraps JavaScript functions with these signatures (comma-separated) for the
/// function table (see `wrappers.rs`), compiled once per engine and list.
#[op2]
pub(super) fn op_sandbox_wrapper_module<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[string] signatures: &str,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let shared = state(op_state).shared.clone();
    let mut cache = shared
        .wrapper_modules
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, compiled)) = cache.iter().find(|(key, _)| key == signatures)
        && let Some(module) = v8::WasmModuleObject::from_compiled_module(scope, compiled)
    {
        return Ok(module.into());
    }
    let list: Vec<&str> = signatures.split(',').collect();
    let bytes = crate::sandbox::modules::wrappers::module_bytes(&list)
        .ok_or_else(|| JsErrorBox::type_error("not a list of Emscripten signatures"))?;
    let module = v8::WasmModuleObject::compile(scope, &bytes)
        .ok_or_else(|| JsErrorBox::generic("the wrapper module does not compile"))?;
    if cache.len() < MAX_WRAPPER_MODULES {
        cache.push((signatures.to_string(), module.get_compiled_module()));
    }
    Ok(module.into())
}

/// Asks Linux to back a WebAssembly memory with transparent huge pages: restoring the snapshot writes
/// its whole linear memory at once, and 2 MiB pages turn thousands of page faults (and as many frees
/// when the isolate goes) into a few. Advice only: where the kernel has no huge pages, nothing changes.
#[op2(fast)]
pub(super) fn op_sandbox_huge_pages(#[buffer] memory: &mut [u8]) {
    #[cfg(target_os = "linux")]
    if !memory.is_empty() {
        // SAFETY: the range is exactly the memory's accessible bytes, which V8 keeps mapped while the
        // buffer is alive; MADV_HUGEPAGE changes no contents and no protection.
        unsafe {
            libc::madvise(
                memory.as_mut_ptr().cast(),
                memory.len(),
                libc::MADV_HUGEPAGE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = memory;
}

/// The package layer's file index: (absolute path, offset in the blob, length).
#[op2]
#[serde]
pub(super) fn op_sandbox_layer_index(op_state: &mut OpState) -> Vec<(String, u32, u32)> {
    state(op_state)
        .shared
        .layer
        .get()
        .map(|l| l.index.clone())
        .unwrap_or_default()
}

/// The package layer's file contents, back to back, as a new ArrayBuffer that the sandbox owns
/// (mapped copy-on-write: see `cow.rs`).
#[op2]
pub(super) fn op_sandbox_layer_blob<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let map = may_map(op_state);
    let shared = &state(op_state).shared;
    let blob = shared.layer_bytes.get_or_init(|| {
        let blob = shared.layer.get().map(|l| l.blob.as_slice());
        crate::sandbox::cow::CowBytes::new(blob.unwrap_or_default())
    });
    blob.array_buffer(scope, map)
        .map(Into::into)
        .map_err(|e| JsErrorBox::generic(format!("reading the package layer: {e}")))
}

/// How many copy-on-write mappings one sandbox gets (its boot needs two): user code can ask for the
/// standard library again and again, and each mapping is one more of the process's limited memory
/// mappings, while a copy only counts against the sandbox's own memory.
const MAX_MAPPINGS: u32 = 8;

/// Whether this sandbox may get one more copy-on-write mapping (counted if so).
fn may_map(op_state: &mut OpState) -> bool {
    let s = state_mut(op_state);
    s.mappings += 1;
    s.mappings <= MAX_MAPPINGS
}

/// Pyodide `loadedPackages` entries of the package layer.
#[op2]
#[serde]
pub(super) fn op_sandbox_layer_loaded(op_state: &mut OpState) -> Vec<(String, String)> {
    state(op_state)
        .shared
        .layer
        .get()
        .map(|l| l.loaded_packages.clone())
        .unwrap_or_default()
}

/// What the installer has captured so far; an error in any other role.
fn installer_captures(op_state: &mut OpState) -> Result<&mut super::Captured, JsErrorBox> {
    match &mut state_mut(op_state).role {
        Role::Installer { captured } => Ok(captured),
        _ => Err(JsErrorBox::generic(
            "this sandbox does not build the package layer",
        )),
    }
}

/// Installer only: one file the installation added.
#[op2(fast)]
pub(super) fn op_sandbox_layer_capture(
    op_state: &mut OpState,
    #[string] path: String,
    #[buffer] data: &[u8],
) -> Result<(), JsErrorBox> {
    installer_captures(op_state)?
        .files
        .push((path, data.to_vec()));
    Ok(())
}

/// Installer only: the `loadedPackages` entries the installation added.
#[op2]
pub(super) fn op_sandbox_layer_capture_loaded(
    op_state: &mut OpState,
    #[serde] loaded: Vec<(String, String)>,
) -> Result<(), JsErrorBox> {
    installer_captures(op_state)?.loaded_packages = loaded;
    Ok(())
}

/// Installer only: progress messages go to the server log.
#[op2(fast)]
pub(super) fn op_sandbox_log(op_state: &mut OpState, #[string] message: &str) {
    if matches!(state(op_state).role, Role::Installer { .. }) {
        tracing::info!(target: "code_interpreter_mcp::packages", "{}", message.trim());
    }
}

/// Serves the standard library or a lock-file wheel (verified) by name, as a new ArrayBuffer that the
/// sandbox owns (the standard library maps the engine's copy-on-write: see `cow.rs`). (The Wasm
/// module never comes through here: `runtime.js` hands Pyodide a sentinel and `op_sandbox_wasm_module`
/// the compiled module.)
#[op2]
pub(super) fn op_sandbox_read_asset<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[string] path: String,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let name = path.strip_prefix("/pyodide/").unwrap_or(&path);
    if name == "python_stdlib.zip" {
        let map = may_map(op_state);
        let stdlib = state(op_state).shared.stdlib.array_buffer(scope, map);
        return stdlib
            .map(Into::into)
            .map_err(|e| JsErrorBox::generic(format!("reading the standard library: {e}")));
    }
    let s = state(op_state);
    let file_name = name.rsplit('/').next().unwrap_or(name);
    if !s.shared.assets.lock_by_file.contains_key(file_name) {
        return Err(JsErrorBox::type_error(format!(
            "{path} is not a Pyodide runtime file"
        )));
    }
    if !s.downloads_enabled {
        return Err(JsErrorBox::generic(
            "Runtime package installation is disabled: package downloads are refused",
        ));
    }
    let bytes = s
        .shared
        .packages
        .wheel(file_name)
        .map_err(|e| JsErrorBox::generic(e.to_string()))?
        .to_vec();
    let store = v8::ArrayBuffer::new_backing_store_from_vec(bytes).make_shared();
    Ok(v8::ArrayBuffer::with_backing_store(scope, &store).into())
}

#[op2]
#[string]
pub(super) fn op_sandbox_read_asset_text(
    op_state: &mut OpState,
    #[string] path: String,
) -> Result<String, JsErrorBox> {
    let name = path.strip_prefix("/pyodide/").unwrap_or(&path);
    match name {
        "pyodide-lock.json" => Ok(state(op_state).shared.assets.lock_json.to_string()),
        _ => Err(JsErrorBox::type_error(format!(
            "{path} is not a Pyodide runtime text file"
        ))),
    }
}
