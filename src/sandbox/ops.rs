//! The `sandbox` deno_core extension: every op the sandbox's JavaScript may call. Ops are the only
//! door from the isolate to Rust; each one does a single narrow thing (append captured output, fill a
//! buffer with OS randomness, fetch from an allowlisted host, serve a Pyodide runtime file, ...).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Instant;

use base64::Engine as _;
use deno_core::{OpState, ToJsBuffer, op2, v8};
use deno_error::JsErrorBox;

use super::layer::Captured;
use super::output::{CappedBuffer, FileCollector, MAX_STREAM_BYTES};
use super::watchdog::WatchMsg;
use super::{BootKind, EngineShared};

/// The JavaScript entry points registered by `runtime.js`.
pub(crate) struct EntryPoints {
    pub boot: v8::Global<v8::Function>,
    pub run: v8::Global<v8::Function>,
}

/// Per-sandbox state kept in the isolate's `OpState`.
pub(crate) struct SandboxState {
    pub shared: Arc<EngineShared>,
    pub started: Instant,
    pub stdout: CappedBuffer,
    pub stderr: CappedBuffer,
    pub entry: Option<EntryPoints>,
    pub code: Option<String>,
    pub input_files: Vec<(String, Option<Vec<u8>>)>,
    pub files: FileCollector,
    pub report: Option<String>,
    pub watchdog: Option<Sender<WatchMsg>>,
    /// Whether wheels and HTTPS downloads may still be fetched (false once runtime installation is
    /// disabled and initialisation is over).
    pub downloads_enabled: bool,
    /// What this isolate boots for.
    pub kind: BootKind,
    /// The snapshot it produced (snapshot maker).
    pub snapshot_out: Option<Vec<u8>>,
    /// The files and package records it installed (installer).
    pub captured: Captured,
    /// How many copy-on-write mappings it was given (see `cow.rs`); past `MAX_MAPPINGS` it gets copies.
    pub mappings: u32,
}

impl SandboxState {
    pub fn new(shared: Arc<EngineShared>) -> Self {
        Self {
            shared,
            started: Instant::now(),
            stdout: CappedBuffer::new(MAX_STREAM_BYTES),
            stderr: CappedBuffer::new(MAX_STREAM_BYTES),
            entry: None,
            code: None,
            input_files: Vec::new(),
            files: FileCollector::default(),
            report: None,
            watchdog: None,
            downloads_enabled: true,
            kind: BootKind::Sandbox,
            snapshot_out: None,
            captured: Captured::default(),
            mappings: 0,
        }
    }
}

deno_core::extension!(
    sandbox,
    ops = [
        op_sandbox_atob,
        op_sandbox_boot_config,
        op_sandbox_btoa,
        op_sandbox_code,
        op_sandbox_collect_file,
        op_sandbox_decode,
        op_sandbox_fetch,
        op_sandbox_input_file,
        op_sandbox_input_file_count,
        op_sandbox_layer_blob,
        op_sandbox_layer_capture,
        op_sandbox_layer_capture_loaded,
        op_sandbox_layer_index,
        op_sandbox_layer_loaded,
        op_sandbox_log,
        op_sandbox_now,
        op_sandbox_wasm_module,
        op_sandbox_wrapper_module,
        op_sandbox_huge_pages,
        op_sandbox_restore_memory,
        op_sandbox_offer_file,
        op_sandbox_random_fill,
        op_sandbox_read_asset,
        op_sandbox_read_asset_text,
        op_sandbox_register,
        op_sandbox_report,
        op_sandbox_snapshot,
        op_sandbox_start_clock,
        op_sandbox_store_snapshot,
        op_sandbox_url_parse,
        op_sandbox_write,
        op_sandbox_yield,
    ],
    esm_entry_point = "ext:sandbox/runtime.js",
    esm = [dir "src/sandbox/js", "runtime.js"],
    options = { shared: Arc<EngineShared>, kind: BootKind },
    state = |state, options| {
        let mut sandbox = SandboxState::new(options.shared);
        sandbox.kind = options.kind;
        state.put(sandbox);
    },
);

fn state(op_state: &OpState) -> &SandboxState {
    op_state.borrow::<SandboxState>()
}

fn state_mut(op_state: &mut OpState) -> &mut SandboxState {
    op_state.borrow_mut::<SandboxState>()
}

#[op2]
fn op_sandbox_register(
    op_state: &mut OpState,
    #[scoped] boot: v8::Global<v8::Function>,
    #[scoped] run: v8::Global<v8::Function>,
) -> Result<(), JsErrorBox> {
    let s = state_mut(op_state);
    if s.entry.is_some() {
        return Err(JsErrorBox::generic("entry points are already registered"));
    }
    s.entry = Some(EntryPoints { boot, run });
    Ok(())
}

/// Boot parameters for `loadPyodide`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BootConfig {
    lock_file: String,
    runner_source: &'static str,
    auto_load: bool,
    /// "sandbox", "snapshot" (boot only to take a memory snapshot) or "installer" (boot only to
    /// build the package layer).
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
fn op_sandbox_boot_config(op_state: &mut OpState) -> BootConfig {
    let s = state(op_state);
    BootConfig {
        lock_file: s.shared.assets.lock_json.to_string(),
        runner_source: super::RUNNER_PY,
        auto_load: s.shared.config.runtime_package_installation,
        kind: match s.kind {
            BootKind::Sandbox => "sandbox",
            BootKind::SnapshotMaker => "snapshot",
            BootKind::Installer => "installer",
        },
        load_snapshot: s.kind == BootKind::Sandbox && s.shared.snapshot.get().is_some(),
        requirements: if s.kind == BootKind::Installer {
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
fn op_sandbox_snapshot<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let shared = state(op_state).shared.clone();
    let snapshot = shared
        .snapshot
        .get()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?;
    Ok(snapshot.array_buffer(scope).into())
}

/// Pyodide's snapshot restore, done by Rust: makes this instance's memory equal to the engine
/// snapshot's linear memory (found at `memory_offset` of the snapshot), writing only the pages that
/// hold data and clearing any zero page that instantiation wrote to (see `SharedSnapshot::restore_into`).
#[op2(fast)]
fn op_sandbox_restore_memory(
    op_state: &mut OpState,
    #[buffer] heap: &mut [u8],
    memory_offset: u32,
) -> Result<(), JsErrorBox> {
    let shared = state(op_state).shared.clone();
    let snapshot = shared
        .snapshot
        .get()
        .ok_or_else(|| JsErrorBox::generic("no memory snapshot"))?;
    snapshot
        .restore_into(heap, memory_offset as usize)
        .map_err(JsErrorBox::generic)
}

#[op2(fast)]
fn op_sandbox_store_snapshot(
    op_state: &mut OpState,
    #[buffer] data: &[u8],
) -> Result<(), JsErrorBox> {
    let s = state_mut(op_state);
    if s.kind != BootKind::SnapshotMaker {
        return Err(JsErrorBox::generic("this sandbox does not take snapshots"));
    }
    s.snapshot_out = Some(data.to_vec());
    Ok(())
}

/// Pyodide's WebAssembly module, compiled once per process: the first caller compiles it and keeps
/// V8's compiled module; every later isolate re-creates its module object from that without compiling
/// (and shares the code V8 has since optimised).
#[op2]
fn op_sandbox_wasm_module<'s, 'i>(
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
fn op_sandbox_wrapper_module<'s, 'i>(
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
    let bytes = super::wrappers::module_bytes(&list)
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
fn op_sandbox_huge_pages(#[buffer] memory: &mut [u8]) {
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
fn op_sandbox_layer_index(op_state: &mut OpState) -> Vec<(String, u32, u32)> {
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
fn op_sandbox_layer_blob<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let map = may_map(op_state);
    let shared = &state(op_state).shared;
    let blob = shared.layer_bytes.get_or_init(|| {
        let blob = shared.layer.get().map(|l| l.blob.as_slice());
        super::cow::CowBytes::new(blob.unwrap_or_default())
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
fn op_sandbox_layer_loaded(op_state: &mut OpState) -> Vec<(String, String)> {
    state(op_state)
        .shared
        .layer
        .get()
        .map(|l| l.loaded_packages.clone())
        .unwrap_or_default()
}

/// Installer only: one file the installation added.
#[op2(fast)]
fn op_sandbox_layer_capture(
    op_state: &mut OpState,
    #[string] path: String,
    #[buffer] data: &[u8],
) -> Result<(), JsErrorBox> {
    let s = state_mut(op_state);
    if s.kind != BootKind::Installer {
        return Err(JsErrorBox::generic(
            "this sandbox does not build the package layer",
        ));
    }
    s.captured.files.push((path, data.to_vec()));
    Ok(())
}

/// Installer only: the `loadedPackages` entries the installation added.
#[op2]
fn op_sandbox_layer_capture_loaded(
    op_state: &mut OpState,
    #[serde] loaded: Vec<(String, String)>,
) -> Result<(), JsErrorBox> {
    let s = state_mut(op_state);
    if s.kind != BootKind::Installer {
        return Err(JsErrorBox::generic(
            "this sandbox does not build the package layer",
        ));
    }
    s.captured.loaded_packages = loaded;
    Ok(())
}

/// Installer only: progress messages go to the server log.
#[op2(fast)]
fn op_sandbox_log(op_state: &mut OpState, #[string] message: &str) {
    if state(op_state).kind == BootKind::Installer {
        tracing::info!(target: "code_interpreter_mcp::packages", "{}", message.trim());
    }
}

#[op2]
#[string]
fn op_sandbox_code(op_state: &mut OpState) -> Result<String, JsErrorBox> {
    state_mut(op_state)
        .code
        .take()
        .ok_or_else(|| JsErrorBox::generic("no code to run"))
}

#[op2(fast)]
fn op_sandbox_report(op_state: &mut OpState, #[string] json: String) {
    state_mut(op_state).report = Some(json);
}

#[op2(fast)]
fn op_sandbox_write(op_state: &mut OpState, fd: u32, #[buffer] data: &[u8]) -> u32 {
    let s = state_mut(op_state);
    match fd {
        1 => s.stdout.push(data),
        _ => s.stderr.push(data),
    }
    data.len() as u32
}

/// Resolves on the next turn of the event loop: a zero-delay task (timers have a 1 ms floor).
#[op2(async(deferred), fast)]
async fn op_sandbox_yield() {}

#[op2(fast)]
fn op_sandbox_random_fill(#[buffer] data: &mut [u8]) -> Result<(), JsErrorBox> {
    getrandom::fill(data)
        .map_err(|e| JsErrorBox::generic(format!("OS randomness unavailable: {e}")))
}

#[op2(fast)]
fn op_sandbox_now(op_state: &mut OpState) -> f64 {
    state(op_state).started.elapsed().as_secs_f64() * 1000.0
}

/// Arms the timeout watchdog: user code starts now.
#[op2(fast)]
fn op_sandbox_start_clock(op_state: &mut OpState) {
    if let Some(tx) = &state(op_state).watchdog {
        let _ = tx.send(WatchMsg::Arm(Instant::now()));
    }
}

#[op2(fast)]
#[smi]
fn op_sandbox_input_file_count(op_state: &mut OpState) -> u32 {
    state(op_state).input_files.len() as u32
}

#[op2]
#[serde]
fn op_sandbox_input_file(
    op_state: &mut OpState,
    #[smi] index: u32,
) -> Result<(String, ToJsBuffer), JsErrorBox> {
    let entry = state_mut(op_state)
        .input_files
        .get_mut(index as usize)
        .ok_or_else(|| JsErrorBox::range_error("no such input file"))?;
    let data = entry.1.take().unwrap_or_default();
    Ok((entry.0.clone(), data.into()))
}

#[op2(fast)]
fn op_sandbox_offer_file(op_state: &mut OpState, #[string] _path: &str, size: f64) -> bool {
    state_mut(op_state).files.offer(size as u64)
}

#[op2(fast)]
fn op_sandbox_collect_file(op_state: &mut OpState, #[string] path: String, #[buffer] data: &[u8]) {
    state_mut(op_state).files.collect(path, data);
}

/// Serves the standard library or a lock-file wheel (verified) by name, as a new ArrayBuffer that the
/// sandbox owns (the standard library maps the engine's copy-on-write: see `cow.rs`). (The Wasm
/// module never comes through here: `runtime.js` hands Pyodide a sentinel and `op_sandbox_wasm_module`
/// the compiled module.)
#[op2]
fn op_sandbox_read_asset<'s, 'i>(
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
fn op_sandbox_read_asset_text(
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

#[op2]
#[string]
fn op_sandbox_decode(
    #[string] label: String,
    #[buffer] data: &[u8],
    fatal: bool,
    ignore_bom: bool,
) -> Result<String, JsErrorBox> {
    let encoding = encoding_rs::Encoding::for_label(label.as_bytes()).ok_or_else(|| {
        JsErrorBox::range_error(format!("the encoding label {label:?} is not supported"))
    })?;
    let (text, had_errors) = if ignore_bom {
        encoding.decode_without_bom_handling(data)
    } else {
        encoding.decode_with_bom_removal(data)
    };
    if fatal && had_errors {
        return Err(JsErrorBox::type_error("the encoded data is not valid"));
    }
    let decoded = text.into_owned();
    Ok(decoded)
}

#[op2]
#[string]
fn op_sandbox_btoa(#[string] data: String) -> Result<String, JsErrorBox> {
    let bytes: Option<Vec<u8>> = data
        .chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect();
    let bytes = bytes.ok_or_else(|| {
        JsErrorBox::new(
            "InvalidCharacterError",
            "btoa: the string contains characters outside Latin-1",
        )
    })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[op2]
#[string]
fn op_sandbox_atob(#[string] data: String) -> Result<String, JsErrorBox> {
    let cleaned: String = data
        .chars()
        .filter(|c| !matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r'))
        .collect();
    // Padding is optional, but only in its canonical place.
    let body = if cleaned.len().is_multiple_of(4) {
        cleaned
            .strip_suffix("==")
            .or_else(|| cleaned.strip_suffix('='))
            .unwrap_or(&cleaned)
    } else {
        &cleaned
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let bytes = engine.decode(body.as_bytes()).map_err(|_| {
        JsErrorBox::new(
            "InvalidCharacterError",
            "atob: the string is not valid Base64",
        )
    })?;
    Ok(bytes.into_iter().map(char::from).collect())
}

#[derive(serde::Serialize)]
struct UrlParts {
    href: String,
    origin: String,
    protocol: String,
    username: String,
    password: String,
    host: String,
    hostname: String,
    port: String,
    pathname: String,
    search: String,
    hash: String,
}

#[op2]
#[serde]
fn op_sandbox_url_parse(
    #[string] href: String,
    #[string] base: Option<String>,
) -> Result<UrlParts, JsErrorBox> {
    let invalid = || JsErrorBox::type_error(format!("Invalid URL: {href:?}"));
    let url = match base {
        Some(base) => url::Url::parse(&base)
            .and_then(|b| b.join(&href))
            .map_err(|_| invalid())?,
        None => url::Url::parse(&href).map_err(|_| invalid())?,
    };
    let nonempty = |prefix: &str, s: Option<&str>| match s {
        Some(s) if !s.is_empty() => format!("{prefix}{s}"),
        _ => String::new(),
    };
    let hostname = url.host_str().unwrap_or("").to_string();
    let port = url.port().map(|p| p.to_string()).unwrap_or_default();
    Ok(UrlParts {
        href: url.as_str().to_string(),
        origin: url.origin().ascii_serialization(),
        protocol: format!("{}:", url.scheme()),
        username: url.username().to_string(),
        password: url.password().unwrap_or("").to_string(),
        host: if port.is_empty() {
            hostname.clone()
        } else {
            format!("{hostname}:{port}")
        },
        hostname,
        port,
        pathname: url.path().to_string(),
        search: nonempty("?", url.query()),
        hash: nonempty("#", url.fragment()),
    })
}

#[op2]
#[serde]
async fn op_sandbox_fetch(
    op_state: Rc<RefCell<OpState>>,
    #[string] url: String,
    #[string] method: String,
    #[serde] headers: Vec<(String, String)>,
    #[serde] body: Option<deno_core::JsBuffer>,
) -> Result<JsResponse, JsErrorBox> {
    let (fetcher, enabled) = {
        let op_state = op_state.borrow();
        let s = state(&op_state);
        (s.shared.fetcher.clone(), s.downloads_enabled)
    };
    if !enabled {
        return Err(JsErrorBox::generic(
            super::fetch::FetchError::Disabled.to_string(),
        ));
    }
    let r = fetcher
        .fetch(url, method, headers, body.map(|b| b.to_vec()))
        .await
        .map_err(|e| JsErrorBox::generic(e.to_string()))?;
    Ok(JsResponse {
        status: r.status,
        status_text: r.status_text,
        url: r.url,
        redirected: r.redirected,
        headers: r.headers,
        body: r.body.into(),
    })
}

/// A fetch response as handed to JavaScript.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsResponse {
    status: u16,
    status_text: String,
    url: String,
    redirected: bool,
    headers: Vec<(String, String)>,
    body: ToJsBuffer,
}
