//! The ops of one call's lifecycle (call.js): the code and the input files in, the captured output,
//! the start of the user's clock, the runner's report and the new files under /workspace out. What
//! comes back from the sandbox is bounded here (see `output.rs`), not in JavaScript or Python.

use std::sync::Arc;
use std::sync::atomic::AtomicI32;

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::{call_mut, call_state, state_mut};
use crate::sandbox::isolate::output::Report;
use crate::sandbox::isolate::watchdog::Phase;
use crate::sandbox::prepared::memory_snapshot::SharedSnapshot;
use crate::sandbox::prepared::session_base;

#[op2]
#[string]
pub(super) fn op_sandbox_code(op_state: &mut OpState) -> Result<String, JsErrorBox> {
    call_mut(op_state)
        .code
        .take()
        .ok_or_else(|| JsErrorBox::generic("no code to run"))
}

/// The `call` op group's state across calls: whether the sandbox is a session's, and its interrupt
/// buffer.
#[derive(Default)]
pub(crate) struct SessionState {
    /// The sandbox keeps its interpreter between calls (a session).
    pub persistent: bool,
    /// A session's interrupt buffer (Pyodide raises KeyboardInterrupt when it reads 2), shared
    /// with the watchdog; handed to Pyodide at the session's first call.
    pub interrupt: Option<Arc<AtomicI32>>,
    /// Whether Pyodide has been given the interrupt buffer.
    pub interrupt_installed: bool,
    /// The snapshot a session's image is saved as the differences from, and its name (see
    /// `prepared/session_base.rs`); `None`: the image holds the whole memory.
    pub image_base: Option<(Arc<SharedSnapshot>, String)>,
}

/// How this call runs: `persistent` (a session's: the namespace is kept, changed files return too),
/// `gridRows` (rows of a table's grid data, 0: none) and, for a session's first call, `interrupt`, the SharedArrayBuffer Pyodide polls for
/// interrupts (the watchdog writes to it from its own thread).
#[op2]
pub(super) fn op_sandbox_call_options<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let grid_rows = call_mut(op_state).grid_rows;
    let s = op_state.borrow_mut::<SessionState>();
    let options = v8::Object::new(scope);
    let persistent = v8::Boolean::new(scope, s.persistent);
    let set = |scope: &mut v8::PinScope<'s, 'i>, name: &str, value: v8::Local<'s, v8::Value>| {
        let key = v8::String::new(scope, name).ok_or_else(|| JsErrorBox::generic("no memory"))?;
        options
            .set(scope, key.into(), value)
            .ok_or_else(|| JsErrorBox::generic("cannot build the call's options"))
    };
    set(scope, "persistent", persistent.into())?;
    let grid_rows = v8::Integer::new_from_unsigned(scope, grid_rows);
    set(scope, "gridRows", grid_rows.into())?;
    if let Some(buffer) = s.interrupt.clone()
        && !std::mem::replace(&mut s.interrupt_installed, true)
    {
        let data = Arc::into_raw(buffer);
        // SAFETY: the 4 bytes of the leaked Arc's AtomicI32 stay valid until V8 calls
        // `release_interrupt` with the same pointer, which takes the Arc back once.
        let store = unsafe {
            v8::SharedArrayBuffer::new_backing_store_from_ptr(
                data.cast_mut().cast(),
                std::mem::size_of::<AtomicI32>(),
                release_interrupt,
                std::ptr::null_mut(),
            )
        };
        let sab = v8::SharedArrayBuffer::with_backing_store(scope, &store.make_shared());
        set(scope, "interrupt", sab.into())?;
    }
    Ok(options.into())
}

unsafe extern "C" fn release_interrupt(
    data: *mut std::ffi::c_void,
    _: usize,
    _: *mut std::ffi::c_void,
) {
    // SAFETY: the pointer `op_sandbox_call_options` leaked, given back once.
    drop(unsafe { Arc::from_raw(data.cast_const().cast::<AtomicI32>()) });
}

/// One regular file of the session's /workspace that `inspect` lists, with its size; false once the
/// listing is full (see `Listing`: the bounds are kept here, whatever the JavaScript sends).
#[op2(fast)]
pub(super) fn op_sandbox_file_listed(
    op_state: &mut OpState,
    #[string] path: String,
    size: f64,
) -> bool {
    call_mut(op_state).listing.push(path, size)
}

/// What `inspect` read: status 0 (the bytes), 1 (no such file) or 2 (over the size limit).
#[op2(fast)]
pub(super) fn op_sandbox_file_read(op_state: &mut OpState, status: u32, #[buffer] data: &[u8]) {
    call_mut(op_state).read = Some((status, data.to_vec()));
}

/// One rich output the runner published (a JSON bundle), or `clear`; kept within the limits.
#[op2(fast)]
pub(super) fn op_sandbox_display(op_state: &mut OpState, #[string] text: &str) {
    let s = call_mut(op_state);
    if let Some(note) = s.displays.publish(text) {
        s.stderr.push(note.as_bytes());
        if let Some(live) = &s.live {
            live.push(2, note.as_bytes());
        }
    }
}

/// The runner's report; the first one counts, capped to the limits.
#[op2]
pub(super) fn op_sandbox_report(op_state: &mut OpState, #[serde] report: Report) {
    let s = call_mut(op_state);
    if s.report.is_none() {
        s.report = Some(report.capped());
    }
}

/// What ended `run()` with an exception (see `runtime.js`), as text; the first one counts.
#[op2(fast)]
pub(super) fn op_sandbox_glue_error(op_state: &mut OpState, #[string] text: &str) {
    let s = call_mut(op_state);
    if s.glue_error.is_none() {
        s.glue_error =
            Some(crate::sandbox::isolate::output::cap_text(text.to_string(), 2000, false).0);
    }
}

/// The largest record of shared libraries a session image carries (thousands of libraries).
const MAX_DYLIB_RECORD: usize = 4 << 20;

/// One part of a session's image (see `saveImage` in call.js): `kind` 0 the memory snapshot, 1 a
/// file under /workspace at `name` (its bytes), 2 why the session cannot be saved (`name`), 3 the
/// record of the shared libraries it loaded (`name`, JSON; empty: none), 4 the heap that follows the
/// memory snapshot's header (part 0): read in place, straight from the WebAssembly memory, and kept
/// as the pages that differ from the session's base snapshot when it has one.
#[op2(fast)]
pub(super) fn op_sandbox_image_part(
    op_state: &mut OpState,
    kind: u32,
    #[string] name: &str,
    #[buffer] data: &[u8],
) -> Result<(), JsErrorBox> {
    let base = match kind {
        4 => op_state.borrow::<SessionState>().image_base.clone(),
        _ => None,
    };
    let image = &mut call_mut(op_state).image;
    match kind {
        // What the header names of the JavaScript world is Rust's to decide, whatever the code made
        // of Pyodide's serializer.
        0 => match crate::sandbox::image::check_references(data) {
            Ok(()) => image.memory = Some(data.to_vec()),
            Err(reason) => image.refused = Some(reason.to_string()),
        },
        1 => image.files.push((name.to_string(), data.to_vec())),
        2 => {
            image.refused =
                Some(crate::sandbox::isolate::output::cap_text(name.to_string(), 2000, false).0)
        }
        // (The sandbox's code can reach the recording: a record is bounded, and checked again
        // when it is relinked.)
        3 if name.len() > MAX_DYLIB_RECORD => {
            image.refused = Some("its record of shared libraries is too large".into())
        }
        3 => image.dylibs = (!name.is_empty()).then(|| name.to_string()),
        4 => {
            let Some(mut memory) = image.memory.take() else {
                if image.refused.is_some() {
                    return Ok(());
                }
                return Err(JsErrorBox::type_error("the heap came before the header"));
            };
            match base {
                Some((base, name)) => {
                    memory = session_base::diff(base.bytes(), &memory, data)
                        .map_err(JsErrorBox::generic)?;
                    image.base = Some(name);
                }
                None => {
                    memory.try_reserve_exact(data.len()).map_err(|_| {
                        JsErrorBox::generic("no memory to copy the session's heap into")
                    })?;
                    memory.extend_from_slice(data);
                }
            }
            image.memory = Some(memory);
        }
        _ => return Err(JsErrorBox::type_error("unknown image part")),
    }
    Ok(())
}

/// Pyodide failed fatally (its `on_fatal` hook, or `call.js` finding its API disabled): the
/// interpreter can run nothing more. The first cause counts.
#[op2(fast)]
pub(super) fn op_sandbox_fatal(op_state: &mut OpState, #[string] text: &str) {
    let s = state_mut(op_state);
    if s.fatal.is_none() {
        s.fatal = Some(crate::sandbox::isolate::output::cap_text(text.to_string(), 2000, false).0);
    }
    // Nothing of the call can still run: it is stopped now rather than at its deadline.
    if let Some(watchdog) = &call_state(op_state).watchdog {
        watchdog.fatal();
    }
}

#[op2(fast)]
pub(super) fn op_sandbox_write(op_state: &mut OpState, fd: u32, #[buffer] data: &[u8]) -> u32 {
    let s = call_mut(op_state);
    match fd {
        1 => s.stdout.push(data),
        _ => s.stderr.push(data),
    }
    if let Some(live) = &s.live {
        live.push(fd, data);
    }
    data.len() as u32
}

/// The user's code starts now: `timeout_ms` runs from here (the set-up's budget ends). Only once.
#[op2(fast)]
pub(super) fn op_sandbox_start_clock(op_state: &mut OpState) {
    state_mut(op_state).user_code_ran = true;
    let s = call_mut(op_state);
    if s.user_started {
        return;
    }
    s.user_started = true;
    if let Some(watchdog) = &s.watchdog {
        watchdog.arm(Phase::User, s.user_timeout);
    }
}

#[op2(fast)]
#[smi]
pub(super) fn op_sandbox_input_file_count(op_state: &mut OpState) -> u32 {
    call_state(op_state).input_files.len() as u32
}

/// Input file `index` as `[path, ArrayBuffer]`, the buffer charged to the sandbox's memory budget;
/// each file is handed over once.
#[op2]
pub(super) fn op_sandbox_input_file<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[smi] index: u32,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let budget = op_state.borrow::<super::SandboxState>().budget.clone();
    let entry = call_mut(op_state)
        .input_files
        .get_mut(index as usize)
        .ok_or_else(|| JsErrorBox::range_error("no such input file"))?;
    let data = entry.1.take().unwrap_or_default();
    let path = v8::String::new(scope, &entry.0)
        .ok_or_else(|| JsErrorBox::generic("the input file's path is too long"))?;
    let buffer = budget.array_buffer(scope, data)?;
    Ok(v8::Array::new_with_elements(scope, &[path.into(), buffer.into()]).into())
}

/// Whether a new file of `size` bytes (as the sandbox's file system says) may still be returned.
#[op2(fast)]
pub(super) fn op_sandbox_offer_file(op_state: &mut OpState, size: f64) -> bool {
    let size = if size.is_finite() && size >= 0.0 {
        size as u64
    } else {
        u64::MAX
    };
    call_mut(op_state).files.offer(size)
}

#[op2(fast)]
pub(super) fn op_sandbox_collect_file(
    op_state: &mut OpState,
    #[string] path: String,
    #[buffer] data: &[u8],
) {
    call_mut(op_state).files.collect(path, data);
}
