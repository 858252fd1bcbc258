//! The ops of Pyodide's plumbing (pyodide.js): boot parameters, the memory snapshot to restore (or the
//! one taken), Pyodide's WebAssembly compiled once per process, the function-table wrapper modules,
//! the sandbox's count of copy-on-write mappings, and the runtime files and verified wheels that
//! Pyodide's shell path reads. The package layer's ops are in `layer.rs`.

use std::sync::Arc;

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::{Phase, Role, boot, boot_mut, call_state, state, state_mut};
use crate::protocol::limits::shown;
use crate::sandbox::pages::address_range;
use crate::sandbox::pages::mapping::advise_huge_pages;
use crate::sandbox::pages::{RestoredMemory, spare};
use crate::sandbox::prepared::layer::LayerOrigin;
use crate::sandbox::prepared::memory_snapshot::{Pages, SharedSnapshot};
use crate::sandbox::prepared::wasm::CodegenAllowed;

/// The `pyodide` op group's state: what the isolate exists for, where it is in its life, and the
/// copy-on-write mappings it was given.
pub(crate) struct BootState {
    pub role: Role,
    pub phase: Phase,
    /// How many copy-on-write mappings it was given (see `cow.rs`); past `MAX_MAPPINGS` it gets copies.
    pub mappings: u32,
    /// The part of this sandbox's WebAssembly memory the memory snapshot was restored into, if it
    /// was mapped there, or copied into the memory the budget holds (`pages/restored.rs`): the
    /// pages an idle sandbox gives back, or the next sandbox's spare when this one is dropped.
    pub restored: Option<RestoredMemory>,
    /// Whether the snapshot's bytes were handed out (`op_sandbox_snapshot` serves them once: a
    /// session image's Python runs while Pyodide restores it and must not get them again).
    pub snapshot_taken: bool,
    /// Whether the memory was restored (`op_sandbox_restore_memory` runs once, for the same reason:
    /// a second restore would take spare memory and map the image again under the running one).
    pub memory_restored: bool,
}

impl BootState {
    pub fn new(role: Role) -> Self {
        Self {
            role,
            phase: Phase::Booting,
            mappings: 0,
            restored: None,
            snapshot_taken: false,
            memory_restored: false,
        }
    }

    /// An error unless the sandbox is still booting: for ops that only Pyodide's start-up needs,
    /// whose JavaScript callers stay reachable from user code afterwards.
    pub fn booting(&self, op: &str) -> Result<(), JsErrorBox> {
        match self.phase {
            Phase::Booting => Ok(()),
            Phase::Booted => Err(JsErrorBox::generic(format!(
                "{op} is only available while the sandbox starts"
            ))),
        }
    }

    /// The memory snapshot this sandbox restores, if it is a sandbox that restores one.
    pub fn restore_from(&self) -> Option<&Arc<SharedSnapshot>> {
        match &self.role {
            Role::Sandbox { snapshot, .. } => snapshot.as_ref(),
            _ => None,
        }
    }
}

/// Boot parameters for `loadPyodide`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BootConfig {
    lock_file: String,
    runner_source: &'static str,
    notebook_source: &'static str,
    display_source: &'static str,
    upstream_source: &'static str,
    http_source: &'static str,
    /// Whether upstream MCP servers are configured (`import upstream` finds them).
    upstream: bool,
    /// Boot with Pyodide's snapshot bookkeeping on, so that the state can be saved later.
    saveable: bool,
    /// DataFrames displayed as Markdown show at most this many rows and columns.
    table_rows: u64,
    table_columns: u64,
    /// Where a figure-N.html gets plotly.js ("cdn", "inline" or a URL).
    figure_plotly_js: String,
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
    /// Snapshot maker only: the modules to import before the snapshot (empty: none, and the package
    /// layer is not copied in).
    preimport: Vec<String>,
    /// The record of the shared libraries in the snapshot being restored (JSON, see `dylink.js`),
    /// when it was taken with pre-imported modules.
    relink: Option<String>,
    /// Why `import micropip` fails, on a server whose package layer has none (else null).
    micropip_unavailable: Option<&'static str>,
    env: std::collections::BTreeMap<&'static str, &'static str>,
    /// The globals a sandbox's realm keeps (`image::REALM_GLOBALS`); every other one is removed
    /// before Pyodide starts.
    globals: &'static [&'static str],
    /// Whether the snapshot being restored is a session's image (nothing is reseeded).
    image: bool,
}

#[op2]
#[serde]
pub(super) fn op_sandbox_boot_config(op_state: &mut OpState) -> Result<BootConfig, JsErrorBox> {
    let b = boot(op_state);
    b.booting("op_sandbox_boot_config")?;
    let s = state(op_state);
    Ok(BootConfig {
        lock_file: s.shared.assets.lock_json.to_string(),
        runner_source: super::RUNNER_PY,
        notebook_source: super::NOTEBOOK_PY,
        display_source: super::DISPLAY_PY,
        upstream_source: super::UPSTREAM_PY,
        http_source: super::HTTP_PY,
        upstream: s.shared.upstreams.is_some(),
        saveable: matches!(b.role, Role::Sandbox { saveable: true, .. }),
        table_rows: s.shared.settings.table_rows,
        table_columns: s.shared.settings.table_columns,
        figure_plotly_js: s.shared.settings.figure_plotly_js.clone(),
        auto_load: s.shared.settings.runtime_package_installation,
        kind: b.role.name(),
        load_snapshot: b.restore_from().is_some(),
        requirements: if matches!(b.role, Role::Installer { .. }) {
            s.shared.settings.preinstall_packages.clone()
        } else {
            Vec::new()
        },
        index_urls: s.shared.settings.package_index_urls.clone(),
        preimport: match &b.role {
            Role::MemorySnapshotMaker { preimport, .. } => preimport.clone(),
            _ => Vec::new(),
        },
        relink: b
            .restore_from()
            .and_then(|snapshot| snapshot.dylibs())
            .map(|record| record.json().to_string()),
        micropip_unavailable: s
            .shared
            .layer
            .get()
            .is_some_and(|layer| layer.origin == LayerOrigin::Offline)
            .then_some(MICROPIP_UNAVAILABLE),
        env: [
            ("HOME", "/home/pyodide"),
            ("LANG", "C.UTF-8"),
            ("PYTHONIOENCODING", "utf-8"),
        ]
        .into_iter()
        .collect(),
        globals: crate::sandbox::image::REALM_GLOBALS,
        image: b
            .restore_from()
            .is_some_and(|snapshot| snapshot.is_session()),
    })
}

/// The engine's memory snapshot for `loadPyodide({_loadSnapshot})`: an ArrayBuffer over the bytes
/// every isolate shares (not a copy). `runtime.js` detaches it as soon as Pyodide has restored.
#[op2]
pub(super) fn op_sandbox_snapshot<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let b = boot_mut(op_state);
    b.booting("op_sandbox_snapshot")?;
    if std::mem::replace(&mut b.snapshot_taken, true) {
        return Err(JsErrorBox::generic("the memory snapshot was taken already"));
    }
    let snapshot = b
        .restore_from()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?
        .clone();
    // A session's image holds its own interpreter, whose code has run: from the restore on, any of
    // its JavaScript and Python may be that code's (what it compiles is not kept for others, its
    // set-up runs within its timeout).
    if snapshot.is_session() {
        state_mut(op_state).user_code_ran = true;
    }
    let (buffer, mapping) = snapshot.array_buffer(scope);
    if let Some(mapping) = mapping {
        state(op_state)
            .budget
            .keep_until_disposed(Box::new(mapping));
    }
    Ok(buffer.into())
}

/// Pyodide's snapshot restore, done by Rust: makes this instance's memory equal to the engine
/// snapshot's linear memory (found at `memory_offset` of the snapshot), writing only the pages that
/// hold data and clearing any zero page that instantiation wrote to, or mapping it copy-on-write (see
/// `SharedSnapshot::restore_into`). On a pool worker the memory takes the last sandbox's pages first
/// and, from the end of the restore, the kernel records the pages written (`pages/spare.rs`).
#[op2(fast)]
pub(super) fn op_sandbox_restore_memory(
    op_state: &mut OpState,
    #[buffer] heap: &mut [u8],
    memory_offset: u32,
) -> Result<(), JsErrorBox> {
    let b = boot_mut(op_state);
    b.booting("op_sandbox_restore_memory")?;
    if std::mem::replace(&mut b.memory_restored, true) {
        return Err(JsErrorBox::generic("the memory was restored already"));
    }
    let snapshot = b
        .restore_from()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?
        .clone();
    let started = std::time::Instant::now();
    // The memory may have grown since it was registered (a pre-imported snapshot's or a session
    // image's is larger than Pyodide's start-up): the new part is a mapping of its own, which needs
    // the advice too.
    advise_huge_pages(address_range(heap));
    // Copied (not mapped) into Python's memory as the budget holds it: the pages of the last
    // sandbox this thread dropped can take the place of fresh ones, which the kernel would clear
    // only for the copy to overwrite them.
    let base = heap.as_ptr() as usize;
    let copied_into_memory =
        !snapshot.maps_memory() && state(op_state).budget.wasm_memory_data() == Some(base);
    let restored_len = snapshot
        .byte_len()
        .checked_sub(memory_offset as usize)
        .filter(|len| *len <= heap.len());
    let reused = restored_len
        .filter(|_| copied_into_memory)
        .and_then(|len| spare::take_into(&mut heap[..len], snapshot.id()));
    // Reused pages: only those the last sandbox wrote, if the kernel recorded them, else all
    // compared.
    let pages = match &reused {
        None => Pages::Fresh,
        Some(reused) => reused
            .written
            .as_deref()
            .map_or(Pages::Reused, Pages::ReusedWritten),
    };
    let mapped = snapshot
        .restore_into(heap, memory_offset as usize, pages)
        .map_err(JsErrorBox::generic)?;
    let b = boot_mut(op_state);
    if let Some(mapped) = mapped {
        // SAFETY: the mapping `restore_into` just made over the start of this sandbox's
        // WebAssembly memory, which the budget keeps mapped until after the isolate is disposed
        // (so longer than the boot state holding this value), and which only the isolate touches,
        // on this thread, never while an op (or the sandbox's drop) holds the boot state.
        b.restored = Some(unsafe { RestoredMemory::mapped(&mut heap[..mapped.len()]) });
    } else if let Some(len) = restored_len.filter(|_| copied_into_memory) {
        // SAFETY: `heap[..len]` is this sandbox's WebAssembly memory as its budget holds it
        // (private anonymous memory, read-write, `copied_into_memory`), every byte of it now the
        // snapshot's, kept and touched as above; the sandbox's drop hands it on as a spare before
        // the isolate is disposed, and V8 then only unmaps it.
        b.restored = Some(unsafe { RestoredMemory::copied(&mut heap[..len], snapshot.id()) });
    }
    tracing::trace!(
        ms = started.elapsed().as_secs_f64() * 1e3,
        "snapshot memory restored"
    );
    Ok(())
}

/// Snapshot maker only: the snapshot taken, and the record of its shared libraries (empty: none).
#[op2(fast)]
pub(super) fn op_sandbox_store_snapshot(
    op_state: &mut OpState,
    #[buffer] data: &[u8],
    #[string] dylibs: String,
) -> Result<(), JsErrorBox> {
    let b = boot_mut(op_state);
    b.booting("op_sandbox_store_snapshot")?;
    match &mut b.role {
        Role::MemorySnapshotMaker { taken, .. } => {
            *taken = Some(super::TakenSnapshot {
                bytes: data.to_vec(),
                dylibs: (!dylibs.is_empty()).then_some(dylibs),
            });
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
    boot(op_state).booting("op_sandbox_wasm_module")?;
    let s = state(op_state);
    let shared = s.shared.clone();
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
/// The longest list of signatures a wrapper module is made for (the start-up's has ~260).
const MAX_WRAPPER_SIGNATURES: usize = 4096;

/// The module that wraps JavaScript functions with these signatures (comma-separated) for the
/// function table (see `src/sandbox/prepared/modules/wrappers.rs`), compiled once per engine and
/// list. Start-up only; the cache's lock is not held while a module is built or compiled.
#[op2]
pub(super) fn op_sandbox_wrapper_module<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[string] signatures: &str,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    boot(op_state).booting("op_sandbox_wrapper_module")?;
    let s = state(op_state);
    let shared = s.shared.clone();
    let cached = {
        let cache = shared
            .wrapper_modules
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        cache
            .iter()
            .find(|(key, _)| key == signatures)
            .and_then(|(_, compiled)| v8::WasmModuleObject::from_compiled_module(scope, compiled))
    };
    if let Some(module) = cached {
        return Ok(module.into());
    }
    let list: Vec<&str> = signatures.split(',').collect();
    if list.len() > MAX_WRAPPER_SIGNATURES {
        return Err(JsErrorBox::range_error("too many signatures"));
    }
    let bytes = crate::sandbox::prepared::modules::wrappers::module_bytes(&list)
        .ok_or_else(|| JsErrorBox::type_error("not a list of Emscripten signatures"))?;
    let module = {
        let _allowed = CodegenAllowed::new();
        v8::WasmModuleObject::compile(scope, &bytes)
    }
    .ok_or_else(|| JsErrorBox::generic("the wrapper module does not compile"))?;
    let mut cache = shared
        .wrapper_modules
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if cache.len() < MAX_WRAPPER_MODULES && !cache.iter().any(|(key, _)| key == signatures) {
        cache.push((signatures.to_string(), module.get_compiled_module()));
    }
    Ok(module.into())
}

/// A WebAssembly module compiled from `bytes` for this sandbox: the only way to compile WebAssembly
/// once the sandbox has booted (`pyodide.js` routes `WebAssembly.Module`, `compile` and
/// `instantiate` here). Refuses modules that define a memory of their own; the libraries of a call's
/// imports are compiled once per process (see `wasm.rs`), anything compiled after user code has run
/// only for this sandbox.
#[op2]
pub(super) fn op_sandbox_compile_wasm<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[anybuffer] bytes: &[u8],
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let s = state(op_state);
    // Before any user code has run in this interpreter, what is compiled is Pyodide's own or a
    // verified lock-file wheel's library (a call's imports being loaded): kept for every sandbox.
    // Afterwards it may be anything the code made: compiled for this sandbox only.
    let keep = !s.user_code_ran;
    let shared = s.shared.clone();
    shared
        .wasm_modules
        .compile(scope, bytes, keep)
        .map(Into::into)
        .map_err(|e| JsErrorBox::type_error(e.to_string()))
}

/// Registers Python's WebAssembly memory (its buffer) with the sandbox's memory budget, and asks
/// Linux to back it with transparent huge pages: restoring the snapshot writes its whole linear
/// memory at once, and 2 MiB pages turn thousands of page faults (and as many frees when the isolate
/// goes) into a few. Start-up only; the first memory registered is the one that counts.
#[op2(fast)]
pub(super) fn op_sandbox_main_memory(
    op_state: &mut OpState,
    memory: v8::Local<v8::Value>,
) -> Result<(), JsErrorBox> {
    boot(op_state).booting("op_sandbox_main_memory")?;
    let s = state(op_state);
    let buffer = v8::Local::<v8::ArrayBuffer>::try_from(memory)
        .map_err(|_| JsErrorBox::type_error("not the memory's buffer"))?;
    let store = buffer.get_backing_store();
    if let Some(data) = store.data()
        && store.byte_length() > 0
    {
        let start = data.as_ptr() as usize;
        advise_huge_pages(start..start + store.byte_length());
    }
    s.budget.set_wasm_memory(store);
    Ok(())
}

/// Whether `bytes` more still fit the sandbox's memory budget (MEMFS asks before it grows a file,
/// and fails the write with ENOSPC if not; the allocator enforces the budget in any case).
#[op2(fast)]
pub(super) fn op_sandbox_memory_room(op_state: &mut OpState, bytes: f64) -> bool {
    let bytes = if bytes.is_finite() && bytes >= 0.0 {
        bytes as usize
    } else {
        usize::MAX
    };
    state(op_state).budget.has_room(bytes)
}

/// How many copy-on-write mappings one sandbox gets (its boot needs two): user code can ask for the
/// standard library again and again, and each mapping is one more of the process's limited memory
/// mappings, while a copy only counts against the sandbox's own memory.
const MAX_MAPPINGS: u32 = 8;

/// Whether this sandbox may get one more copy-on-write mapping (counted if so).
pub(super) fn may_map(op_state: &mut OpState) -> bool {
    let b = boot_mut(op_state);
    b.mappings += 1;
    b.mappings <= MAX_MAPPINGS
}

/// Installer only: progress messages go to the server log.
#[op2(fast)]
pub(super) fn op_sandbox_log(op_state: &mut OpState, #[string] message: &str) {
    if matches!(boot(op_state).role, Role::Installer { .. }) {
        tracing::info!(target: "code_interpreter_mcp::packages", "{}", message.trim());
    }
}

/// Why micropip cannot be imported on a server that started without a package source.
pub(crate) const MICROPIP_UNAVAILABLE: &str = "micropip is unavailable: the server started without a reachable package source (package_base_url), so its package layer holds no micropip; restart the server with a reachable package source to install packages";

/// Serves the standard library or a lock-file wheel (verified) by name, as a new ArrayBuffer that the
/// sandbox owns (the standard library maps the engine's copy-on-write: see `cow.rs`; copies are
/// charged to the sandbox's memory budget). A wheel not yet in the engine's cache is read or
/// downloaded within the call's deadline. (The Wasm module never comes through here: `pyodide.js`
/// hands Pyodide a sentinel and `op_sandbox_wasm_module` the compiled module.)
#[op2]
pub(super) fn op_sandbox_read_asset<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[string] path: String,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let name = path.strip_prefix("/pyodide/").unwrap_or(&path);
    if name == "python_stdlib.zip" {
        let map = may_map(op_state);
        let s = state(op_state);
        return s
            .shared
            .stdlib
            .array_buffer(scope, map, &s.budget)
            .map(Into::into);
    }
    let s = state(op_state);
    let file_name = name.rsplit('/').next().unwrap_or(name);
    let Some(package) = s.shared.assets.lock_by_file.get(file_name) else {
        return Err(JsErrorBox::type_error(format!(
            "{} is not a Pyodide runtime file",
            shown(&path)
        )));
    };
    // micropip only ever comes from the package layer, where the installation policy is added to it.
    let offline = s
        .shared
        .layer
        .get()
        .is_some_and(|layer| layer.origin == LayerOrigin::Offline);
    if package.name == "micropip" && offline {
        return Err(JsErrorBox::generic(MICROPIP_UNAVAILABLE));
    }
    if !op_state.borrow::<super::WebState>().downloads_enabled {
        return Err(JsErrorBox::generic(
            "Runtime package installation is disabled: package downloads are refused",
        ));
    }
    let deadline = call_state(op_state)
        .watchdog
        .as_ref()
        .and_then(|w| w.deadline());
    let bytes = s
        .shared
        .packages
        .wheel(file_name, deadline)
        .map_err(|e| JsErrorBox::generic(e.to_string()))?
        .to_vec();
    Ok(s.budget.array_buffer(scope, bytes)?.into())
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
            "{} is not a Pyodide runtime text file",
            shown(&path)
        ))),
    }
}
