//! The `sandbox` deno_core extension: every op the sandbox's JavaScript may call, and the per-isolate
//! state they share. Ops are the only door from the isolate to Rust; each one does a single narrow
//! thing. They come in pairs with the JavaScript that calls them:
//! - [`web`] and `web.js`: the Web APIs Pyodide needs (encoding, URL, Base64, time, randomness, fetch;
//!   with `http.py`: urllib over the same fetch op);
//! - [`call`] and `call.js` (with `runner.py`): one call's lifecycle;
//! - [`pyodide`] and `pyodide.js`: booting Pyodide and the memory snapshot (with `dylink.js`: the
//!   shared libraries of a snapshot with pre-imported packages);
//! - [`layer`] and `layer.js`: the package layer in MEMFS, and the installer that builds it;
//! - [`upstream`] and `upstream.py`: calls to the upstream MCP servers' tools the operator granted.
//!
//! `runtime.js` is the extension's entry point: it imports the three modules and hands `boot` and
//! `run` to Rust through `op_sandbox_register`.

mod call;
mod layer;
mod pyodide;
mod upstream;
mod web;

pub(crate) use call::SessionState;
pub(crate) use pyodide::BootState;
pub(crate) use web::WebState;

use std::sync::Arc;
use std::time::Duration;

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use crate::fetch::CallFetches;
use crate::protocol::limits::MAX_STREAM_BYTES;
use crate::sandbox::isolate::output::{CappedBuffer, DisplayCollector, FileCollector, Report};
use crate::sandbox::isolate::watchdog::Arming;
use crate::sandbox::memory::MemoryBudget;
use crate::sandbox::prepared::layer::Captured;
use crate::sandbox::prepared::memory_snapshot::SharedSnapshot;
use crate::sandbox::prepared::shared::EngineShared;
use crate::upstream::CallUpstream;

/// The Python half of an execution, evaluated once per sandbox (or into the memory snapshot).
pub(crate) const RUNNER_PY: &str = include_str!("runner.py");
/// The runner's notebook syntax (magics, `!pip`), defined before it.
pub(crate) const NOTEBOOK_PY: &str = include_str!("notebook.py");
/// The runner's rich outputs (display, the IPython stand-in, plotly, figures), defined first.
pub(crate) const DISPLAY_PY: &str = include_str!("display.py");
/// `import upstream`: the granted upstream tools as Python functions, defined before the runner.
pub(crate) const UPSTREAM_PY: &str = include_str!("upstream.py");
/// urllib.request over the HTTPS op, defined before the runner.
pub(crate) const HTTP_PY: &str = include_str!("http.py");

/// The sandbox's JavaScript and Python glue as compiled into the binary (for the memory snapshot's
/// key: the snapshot is taken by this code).
pub(crate) fn glue() -> [&'static str; 14] {
    [
        include_str!("runtime.js"),
        include_str!("web.js"),
        include_str!("call.js"),
        include_str!("pyodide.js"),
        include_str!("park.js"),
        include_str!("dylink.js"),
        include_str!("layer.js"),
        include_str!("image.js"),
        include_str!("realm.js"),
        RUNNER_PY,
        NOTEBOOK_PY,
        DISPLAY_PY,
        UPSTREAM_PY,
        HTTP_PY,
    ]
}

/// The JavaScript entry points registered by `runtime.js`.
pub(crate) struct EntryPoints {
    pub boot: v8::Global<v8::Function>,
    pub run: v8::Global<v8::Function>,
    /// A session's files (see `inspect` in call.js).
    pub inspect: v8::Global<v8::Function>,
    /// A session's image (see `saveImage` in call.js).
    pub image: v8::Global<v8::Function>,
    /// Boots as far as Pyodide goes before it needs its memory snapshot (see `park` in park.js).
    pub park: v8::Global<v8::Function>,
    /// Lets a parked boot go on (see `unpark` in park.js).
    pub unpark: v8::Global<v8::Function>,
}

/// What an isolate exists for, with what only that role produces or consumes.
pub(crate) enum Role {
    /// A sandbox that runs one request, restoring this memory snapshot (none: a full start-up).
    Sandbox {
        snapshot: Option<Arc<SharedSnapshot>>,
        /// Booted so that its state can be saved as an image (a session's sandbox; see
        /// `Sandbox::save_image`).
        saveable: bool,
    },
    /// Boots once at start-up to take the memory snapshot, left here; with `preimport`, after the
    /// package layer is copied in and those modules are imported (with the record of the shared
    /// libraries they loaded, see `dylink.js`).
    MemorySnapshotMaker {
        preimport: Vec<String>,
        taken: Option<TakenSnapshot>,
    },
    /// Boots once at start-up to install packages into the package layer; what it installed.
    Installer { captured: Captured },
    /// The realm evaluated into the V8 startup snapshot: Pyodide's modules load, nothing boots.
    StartupSnapshot,
}

impl Role {
    /// The name `pyodide.js` knows the role by.
    fn name(&self) -> &'static str {
        match self {
            Role::Sandbox { .. } => "sandbox",
            Role::MemorySnapshotMaker { .. } => "snapshot",
            Role::Installer { .. } => "installer",
            Role::StartupSnapshot => "startup-snapshot",
        }
    }
}

/// What a snapshot maker produced: Pyodide's snapshot bytes and, when modules were pre-imported, the
/// record of the shared libraries in it (JSON, see `dylink.js`).
pub(crate) struct TakenSnapshot {
    pub bytes: Vec<u8>,
    pub dylibs: Option<String>,
}

/// Where a sandbox is in its life; ops that only booting needs refuse afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Pyodide is starting: no user code exists yet.
    Booting,
    /// Booted, waiting for its call (or running it).
    Booted,
}

/// Per-sandbox state every op group reads, kept in the isolate's `OpState`: what lives as long as
/// the sandbox. Each op group keeps what only it uses as a type of its own beside it in the
/// `OpState` ([`BootState`] for `pyodide`, [`WebState`] for `web`, [`SessionState`] for `call`),
/// and what one call uses is a [`CallState`], put into the `OpState` afresh for every call.
pub(crate) struct SandboxState {
    pub shared: Arc<EngineShared>,
    pub budget: Arc<MemoryBudget>,
    pub entry: Option<EntryPoints>,
    /// Whether user code has ever started in this interpreter: from then on any of its JavaScript
    /// and Python may have been changed by that code.
    pub user_code_ran: bool,
    /// Why Pyodide failed fatally (a WebAssembly trap, a stack overflow), once it has: the
    /// interpreter can run nothing more.
    pub fatal: Option<String>,
    /// Upstream calls whose answer JavaScript has not received yet (a session holding one cannot be
    /// saved).
    pub upstream_pending: std::rc::Rc<std::cell::Cell<u32>>,
}

/// What one call (or the boot, or one inspection of a session's files) reads and produces, kept in
/// the isolate's `OpState` beside [`SandboxState`] and replaced whole for every call.
pub(crate) struct CallState {
    pub stdout: CappedBuffer,
    pub stderr: CappedBuffer,
    pub code: Option<String>,
    pub input_files: Vec<(String, Option<Vec<u8>>)>,
    pub files: FileCollector,
    /// The call's rich outputs (`display()` and the like).
    pub displays: DisplayCollector,
    pub report: Option<Report>,
    /// The exception `run()` ended in, if it did (see `runtime.js`).
    pub glue_error: Option<String>,
    /// Arms the watchdog of the running call (and tells its deadline).
    pub watchdog: Option<Arming>,
    /// `timeout_ms` of the running call, armed when its user code starts.
    pub user_timeout: Duration,
    /// Whether the call's user code has started.
    pub user_started: bool,
    /// What `inspect` reported: the files listed, or one file read (status, bytes).
    pub listing: Listing,
    pub read: Option<(u32, Vec<u8>)>,
    /// What `saveImage` produced: the memory image and the session's files, or why not.
    pub image: ImageParts,
    /// The call's outbound requests (cancelled when the call ends).
    pub fetches: Arc<CallFetches>,
    /// The call's upstream tool calls: its budget, and what cancels them when it ends.
    pub upstream: Arc<CallUpstream>,
    /// Where the output also goes while the call runs, when its caller streams it.
    pub live: Option<Arc<crate::sandbox::types::LiveOutput>>,
    /// Rows of a table's grid data (see `ExecRequest::grid_rows`); 0: none.
    pub grid_rows: u32,
}

impl CallState {
    /// A call's state: its code, input files, `timeout_ms` and watchdog.
    pub fn new(
        code: Option<String>,
        input_files: Vec<(String, Option<Vec<u8>>)>,
        user_timeout: Duration,
        watchdog: Option<Arming>,
    ) -> Self {
        Self {
            stdout: CappedBuffer::new(MAX_STREAM_BYTES),
            stderr: CappedBuffer::new(MAX_STREAM_BYTES),
            code,
            input_files,
            files: FileCollector::default(),
            displays: DisplayCollector::default(),
            report: None,
            glue_error: None,
            watchdog,
            user_timeout,
            user_started: false,
            listing: Listing::default(),
            read: None,
            image: ImageParts::default(),
            fetches: Arc::default(),
            upstream: Arc::default(),
            live: None,
            grid_rows: 0,
        }
    }

    /// The state of no call (while booting, or between calls).
    pub fn idle() -> Self {
        Self::new(None, Vec::new(), Duration::ZERO, None)
    }
}

/// A session's image as `saveImage` hands it over: Pyodide's memory snapshot and the files under
/// /workspace, or why the session cannot be saved.
#[derive(Debug, Default)]
pub(crate) struct ImageParts {
    pub memory: Option<Vec<u8>>,
    pub files: Vec<(String, Vec<u8>)>,
    /// The record of the shared libraries to relink (JSON, see `dylink.js`).
    pub dylibs: Option<String>,
    /// The name of the snapshot `memory` holds the differences from (`None`: it is whole).
    pub base: Option<String>,
    pub refused: Option<String>,
}

/// A session's files as `inspect` lists them, bounded here whatever its JavaScript sends: at most
/// [`MAX_LISTED_FILES`] entries, each path at most `MAX_PATH_BYTES`.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub files: Vec<(String, u64)>,
    /// Files left out: past the count cap, or with a path over the path limit.
    pub left_out: u64,
    /// Whether the walk stopped early (the cap was reached).
    pub cut: bool,
}

/// Most files a session's listing holds.
pub(crate) const MAX_LISTED_FILES: usize = 1000;

impl Listing {
    /// Takes one entry; false once the listing is full (the walk should stop).
    pub fn push(&mut self, path: String, size: f64) -> bool {
        if self.files.len() >= MAX_LISTED_FILES {
            self.left_out += 1;
            self.cut = true;
            return false;
        }
        if path.len() > crate::protocol::limits::MAX_PATH_BYTES {
            self.left_out += 1;
            return true;
        }
        let size = if size.is_finite() && size > 0.0 {
            size as u64
        } else {
            0
        };
        self.files.push((path, size));
        true
    }
}

impl SandboxState {
    pub fn new(shared: Arc<EngineShared>, budget: Arc<MemoryBudget>) -> Self {
        Self {
            shared,
            budget,
            entry: None,
            user_code_ran: false,
            fatal: None,
            upstream_pending: Default::default(),
        }
    }
}

deno_core::extension!(
    sandbox,
    ops = [
        op_sandbox_register,
        call::op_sandbox_call_options,
        call::op_sandbox_code,
        call::op_sandbox_fatal,
        call::op_sandbox_file_listed,
        call::op_sandbox_file_read,
        call::op_sandbox_collect_file,
        call::op_sandbox_display,
        call::op_sandbox_glue_error,
        call::op_sandbox_image_part,
        call::op_sandbox_input_file,
        call::op_sandbox_input_file_count,
        call::op_sandbox_offer_file,
        call::op_sandbox_report,
        call::op_sandbox_start_clock,
        call::op_sandbox_write,
        pyodide::op_sandbox_boot_config,
        pyodide::op_sandbox_compile_wasm,
        pyodide::op_sandbox_main_memory,
        pyodide::op_sandbox_memory_room,
        layer::op_sandbox_layer_blob,
        layer::op_sandbox_layer_capture,
        layer::op_sandbox_layer_capture_loaded,
        layer::op_sandbox_layer_index,
        layer::op_sandbox_layer_dir,
        layer::op_sandbox_layer_loaded,
        layer::op_sandbox_layer_module,
        pyodide::op_sandbox_log,
        pyodide::op_sandbox_read_asset,
        pyodide::op_sandbox_read_asset_text,
        pyodide::op_sandbox_restore_memory,
        pyodide::op_sandbox_snapshot,
        pyodide::op_sandbox_store_snapshot,
        pyodide::op_sandbox_wasm_module,
        pyodide::op_sandbox_wrapper_module,
        upstream::op_sandbox_upstream_call,
        upstream::op_sandbox_upstream_cancel,
        upstream::op_sandbox_upstream_catalog,
        web::op_sandbox_atob,
        web::op_sandbox_btoa,
        web::op_sandbox_decode,
        web::op_sandbox_fetch,
        web::op_sandbox_fetch_body,
        web::op_sandbox_fetch_body_into,
        web::op_sandbox_now,
        web::op_sandbox_random_fill,
        web::op_sandbox_url_parse,
        web::op_sandbox_yield,
    ],
    esm_entry_point = "ext:sandbox/runtime.js",
    esm = [dir "src/sandbox/isolate/ops", "runtime.js", "web.js", "call.js", "pyodide.js", "park.js", "dylink.js", "layer.js", "image.js", "realm.js"],
    options = { shared: Arc<EngineShared>, role: Role, budget: Arc<MemoryBudget> },
    state = |state, options| {
        state.put(SandboxState::new(options.shared, options.budget));
        state.put(BootState::new(options.role));
        state.put(WebState::new());
        state.put(SessionState::default());
        state.put(CallState::idle());
    },
);

fn state(op_state: &OpState) -> &SandboxState {
    op_state.borrow::<SandboxState>()
}

fn state_mut(op_state: &mut OpState) -> &mut SandboxState {
    op_state.borrow_mut::<SandboxState>()
}

fn boot(op_state: &OpState) -> &BootState {
    op_state.borrow::<BootState>()
}

fn boot_mut(op_state: &mut OpState) -> &mut BootState {
    op_state.borrow_mut::<BootState>()
}

fn call_state(op_state: &OpState) -> &CallState {
    op_state.borrow::<CallState>()
}

fn call_mut(op_state: &mut OpState) -> &mut CallState {
    op_state.borrow_mut::<CallState>()
}

#[op2]
fn op_sandbox_register(
    op_state: &mut OpState,
    #[scoped] boot: v8::Global<v8::Function>,
    #[scoped] run: v8::Global<v8::Function>,
    #[scoped] inspect: v8::Global<v8::Function>,
    #[scoped] image: v8::Global<v8::Function>,
    #[scoped] park: v8::Global<v8::Function>,
    #[scoped] unpark: v8::Global<v8::Function>,
) -> Result<(), JsErrorBox> {
    op_state
        .borrow::<BootState>()
        .booting("op_sandbox_register")?;
    let s = state_mut(op_state);
    if s.entry.is_some() {
        return Err(JsErrorBox::generic("entry points are already registered"));
    }
    s.entry = Some(EntryPoints {
        boot,
        run,
        inspect,
        image,
        park,
        unpark,
    });
    Ok(())
}
