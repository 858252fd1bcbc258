//! The V8 callbacks of a sandbox isolate that user code can reach, replacing deno_core's where those
//! can panic: a Rust panic inside a V8 callback cannot unwind and aborts the whole process.
//!
//! - WebAssembly streaming compilation (`WebAssembly.compileStreaming`, `instantiateStreaming`):
//!   deno_core's handler panics when no JavaScript handler was registered (none is: the sandbox has
//!   no `Response` bodies to stream). Here it is refused with a `TypeError`.
//! - The end of an asynchronous WebAssembly compilation: deno_core's resolves the promise with
//!   `unwrap()`, which panics when the isolate is being terminated (a timeout during
//!   `WebAssembly.compile`). Here a failed resolution is ignored: the isolate is going away.
//! - Whether WebAssembly may be compiled at all: see `wasm::allow_codegen`.
//! - Stack traces (`error.stack`): deno_core's formatter unwraps on strings V8 cannot hold (an error
//!   with a 512 MiB message) and hands user code V8's call-site objects with patched methods that
//!   unwrap. Here the trace is formatted in Rust, bounded, and `Error.prepareStackTrace` is not
//!   consulted (so user code never receives call-site objects).
//! - Dynamic `import()` once the sandbox has booted ([`after_boot`]): deno_core's error path unwraps
//!   values that user code can shape (a patched `Promise.prototype.then`, an error whose message is
//!   not a string). Nothing needs `import()` after boot, so it is refused outright.
//!
//! The other callbacks deno_core installs that user code reaches (promise rejections, `import.meta`)
//! were read for panics on user-controlled input; SECURITY.md lists what was checked and what else
//! the sandbox does about it (prototypes that cannot be extended, a watchdog that keeps terminating).

use deno_core::v8;

use crate::sandbox::prepared::wasm;

/// The longest stack trace text a sandbox gets, in UTF-16 units of each part read from V8.
const MAX_TRACE_PART: usize = 4096;
/// At most this many frames are formatted.
const MAX_TRACE_FRAMES: u32 = 64;

/// Installs the sandbox's callbacks on a new isolate (after deno_core installed its own).
pub(crate) fn install(isolate: &mut v8::Isolate) {
    isolate.set_wasm_streaming_callback(refuse_streaming);
    isolate.set_wasm_async_resolve_promise_callback(settle_wasm_promise);
    isolate.set_allow_wasm_code_generation_callback(wasm::allow_codegen);
    isolate.set_prepare_stack_trace_callback(format_stack);
    // deno_core has V8 capture a detailed stack trace with every error object, for uncaught
    // exceptions' messages; only its inspector reads them (error.stack comes from `format_stack`).
    // Pyodide's start-up makes ~1,000 errors (see `IMMUTABLE_GLOBAL_CHECK` in modules/mod.rs).
    isolate.set_capture_stack_trace_for_uncaught_exceptions(false, 0);
}

/// Once Pyodide has booted (its loader imports its own modules): `import()` is refused.
pub(crate) fn after_boot(isolate: &mut v8::Isolate) {
    isolate.set_host_import_module_dynamically_callback(refuse_import);
    isolate.set_host_import_module_with_phase_dynamically_callback(refuse_import_with_phase);
}

fn refuse_import<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    _options: v8::Local<'s, v8::Data>,
    _resource: v8::Local<'s, v8::Value>,
    _specifier: v8::Local<'s, v8::String>,
    _attributes: v8::Local<'s, v8::FixedArray>,
) -> Option<v8::Local<'s, v8::Promise>> {
    rejected_import(scope)
}

fn refuse_import_with_phase<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    _options: v8::Local<'s, v8::Data>,
    _resource: v8::Local<'s, v8::Value>,
    _specifier: v8::Local<'s, v8::String>,
    _phase: v8::ModuleImportPhase,
    _attributes: v8::Local<'s, v8::FixedArray>,
) -> Option<v8::Local<'s, v8::Promise>> {
    rejected_import(scope)
}

/// A promise rejected with a `TypeError`; `None` only while the isolate terminates.
fn rejected_import<'s>(scope: &mut v8::PinScope<'s, '_>) -> Option<v8::Local<'s, v8::Promise>> {
    let resolver = v8::PromiseResolver::new(scope)?;
    let message = v8::String::new(scope, "import() is not available in the sandbox")?;
    let error = v8::Exception::type_error(scope, message);
    resolver.reject(scope, error)?;
    Some(resolver.get_promise(scope))
}

/// `error.stack`: the error's string form and up to `MAX_TRACE_FRAMES` frames, each part at most
/// `MAX_TRACE_PART` units long. User code may run (the error's `toString`, getters): anything it
/// throws is caught here, and a termination leaves the trace short.
fn format_stack<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    error: v8::Local<'s, v8::Value>,
    callsites: v8::Local<'s, v8::Array>,
) -> v8::Local<'s, v8::Value> {
    v8::tc_scope!(let tc, scope);
    let mut text = error
        .to_string(tc)
        .map(|s| prefix(tc, s))
        .unwrap_or_else(|| "Error".to_string());
    for i in 0..callsites.length().min(MAX_TRACE_FRAMES) {
        let Some(site) = callsites.get_index(tc, i) else {
            break;
        };
        let Some(site) = site.to_string(tc) else {
            break;
        };
        text.push_str("\n    at ");
        text.push_str(&prefix(tc, site));
    }
    match v8::String::new(tc, &text) {
        Some(s) => s.into(),
        None => v8::undefined(tc).into(),
    }
}

/// The first `MAX_TRACE_PART` UTF-16 units of `s`, as Rust text (never the whole of a huge string).
fn prefix(isolate: &v8::Isolate, s: v8::Local<v8::String>) -> String {
    let mut units = vec![0u16; s.length().min(MAX_TRACE_PART)];
    s.write_v2(isolate, 0, &mut units, v8::WriteFlags::empty());
    let mut text = String::from_utf16_lossy(&units);
    if s.length() > MAX_TRACE_PART {
        text.push('…');
    }
    text
}

fn refuse_streaming<'a>(
    scope: &mut v8::PinScope<'a, '_>,
    _source: v8::Local<'a, v8::Value>,
    streaming: v8::WasmStreaming<false>,
) {
    let exception = v8::String::new(
        scope,
        "WebAssembly streaming compilation is not available in the sandbox; compile bytes instead",
    )
    .map(|message| v8::Exception::type_error(scope, message));
    streaming.abort(exception);
}

unsafe extern "C" fn settle_wasm_promise(
    _isolate: v8::UnsafeRawIsolatePtr,
    context: v8::Local<v8::Context>,
    resolver: v8::Local<v8::PromiseResolver>,
    result: v8::Local<v8::Value>,
    success: v8::WasmAsyncSuccess,
) {
    // SAFETY: V8 calls this with a live context of the isolate, on its thread.
    v8::callback_scope!(unsafe scope, context);
    // `None`: the isolate is terminating; there is nobody left to tell.
    let _ = if success == v8::WasmAsyncSuccess::Success {
        resolver.resolve(scope, result)
    } else {
        resolver.reject(scope, result)
    };
}
