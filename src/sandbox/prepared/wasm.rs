//! WebAssembly in a sandbox, under Rust's control. V8 asks the embedder before it compiles any
//! WebAssembly ([`allow_codegen`]); a sandbox isolate says yes only while it boots and while
//! [`WasmModules::compile`] runs for it. That is the one path left after boot (`pyodide.js` routes
//! `WebAssembly.Module`, `compile` and `instantiate` through it): it refuses modules that define a
//! memory of their own (a sandbox has exactly one, Python's, which counts against its memory budget)
//! and oversized ones. Modules compiled before any user code ran in the sandbox (Pyodide's own, and
//! the libraries of the verified lock-file wheels a call's imports load) are compiled once per
//! process, keyed by the sha256 of their bytes: a package's extension modules are compiled by the
//! first sandbox that loads them and only instantiated by the others. Anything compiled after user
//! code ran may be the user's own and is not kept: it lives and dies with its sandbox, so no client
//! can grow the process by compiling modules.

use std::cell::Cell;
use std::sync::Mutex;

use deno_core::v8;
use sha2::{Digest, Sha256};

thread_local! {
    /// Whether the isolate running on this thread may compile WebAssembly now.
    static CODEGEN_ALLOWED: Cell<bool> = const { Cell::new(false) };
}

/// Allows WebAssembly compilation on this thread until the guard is dropped.
pub(crate) struct CodegenAllowed(bool);

impl CodegenAllowed {
    pub fn new() -> Self {
        Self(CODEGEN_ALLOWED.with(|c| c.replace(true)))
    }
}

impl Drop for CodegenAllowed {
    fn drop(&mut self) {
        CODEGEN_ALLOWED.with(|c| c.set(self.0));
    }
}

/// V8's question before compiling WebAssembly from bytes in a sandbox isolate.
pub(crate) unsafe extern "C" fn allow_codegen(
    _context: v8::Local<v8::Context>,
    _source: v8::Local<v8::String>,
) -> bool {
    CODEGEN_ALLOWED.with(Cell::get)
}

/// The largest WebAssembly module a sandbox may compile (scipy's largest is ~20 MiB).
pub(crate) const MAX_MODULE_BYTES: usize = 128 * 1024 * 1024;
/// How many compiled modules the process keeps, and their wire bytes in all.
const MAX_CACHED_MODULES: usize = 512;
const MAX_CACHED_BYTES: usize = 1024 * 1024 * 1024;

/// Why a module was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ModuleError {
    #[error(
        "the WebAssembly module is {0} bytes; at most {MAX_MODULE_BYTES} are compiled in the sandbox"
    )]
    TooLarge(usize),
    #[error(
        "the WebAssembly module defines a memory of its own; modules in the sandbox may only import the interpreter's memory"
    )]
    DefinesMemory,
    #[error("not a valid WebAssembly module: {0}")]
    Invalid(String),
    #[error("the WebAssembly module could not be read: {0}")]
    Unreadable(String),
}

/// Checks a module's structure before it is compiled: size, and no memory definitions.
pub(crate) fn check_module(bytes: &[u8]) -> Result<(), ModuleError> {
    if bytes.len() > MAX_MODULE_BYTES {
        return Err(ModuleError::TooLarge(bytes.len()));
    }
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| ModuleError::Invalid(e.message().to_string()))? {
            wasmparser::Payload::MemorySection(memories) if memories.count() > 0 => {
                return Err(ModuleError::DefinesMemory);
            }
            _ => {}
        }
    }
    Ok(())
}

/// `bytes` checked and compiled for the calling isolate (not cached).
fn compile_checked<'s>(
    scope: &v8::PinScope<'s, '_>,
    bytes: &[u8],
) -> Result<v8::Local<'s, v8::WasmModuleObject>, ModuleError> {
    check_module(bytes)?;
    let _allowed = CodegenAllowed::new();
    v8::WasmModuleObject::compile(scope, bytes)
        .ok_or_else(|| ModuleError::Invalid("V8 could not compile it".into()))
}

/// Compiled modules by the sha256 of their bytes, shared by every isolate of the engine.
#[derive(Default)]
pub(crate) struct WasmModules {
    cache: Mutex<Cache>,
    /// Modules of fixed bytes by name (see `compile_named`).
    named: Mutex<std::collections::HashMap<String, v8::CompiledWasmModule>>,
}

#[derive(Default)]
struct Cache {
    /// Most recently used last.
    entries: Vec<([u8; 32], v8::CompiledWasmModule, usize)>,
    bytes: usize,
}

impl WasmModules {
    /// A module object of the calling isolate for `bytes`: from the cache, or checked and compiled
    /// now (and cached only with `keep`).
    pub fn compile<'s>(
        &self,
        scope: &v8::PinScope<'s, '_>,
        bytes: &[u8],
        keep: bool,
    ) -> Result<v8::Local<'s, v8::WasmModuleObject>, ModuleError> {
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(module) = self.cached(scope, &key) {
            return Ok(module);
        }
        let module = compile_checked(scope, bytes)?;
        if keep {
            self.insert(key, module.get_compiled_module(), bytes.len());
        }
        Ok(module)
    }

    /// Like [`compile`](Self::compile), for bytes that never change under `name` for the life of
    /// the engine (the package layer's libraries): kept by name apart from the content cache, so the
    /// bytes are not hashed, and never evicted (the layer is fixed).
    pub fn compile_named<'s>(
        &self,
        scope: &v8::PinScope<'s, '_>,
        name: &str,
        bytes: impl FnOnce() -> Result<Vec<u8>, ModuleError>,
    ) -> Result<v8::Local<'s, v8::WasmModuleObject>, ModuleError> {
        let found = self
            .named
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .and_then(|compiled| v8::WasmModuleObject::from_compiled_module(scope, compiled));
        if let Some(module) = found {
            return Ok(module);
        }
        let module = compile_checked(scope, &bytes()?)?;
        self.named
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), module.get_compiled_module());
        Ok(module)
    }

    fn cached<'s>(
        &self,
        scope: &v8::PinScope<'s, '_>,
        key: &[u8; 32],
    ) -> Option<v8::Local<'s, v8::WasmModuleObject>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let at = cache.entries.iter().position(|(k, _, _)| k == key)?;
        let entry = cache.entries.remove(at);
        let module = v8::WasmModuleObject::from_compiled_module(scope, &entry.1);
        cache.entries.push(entry);
        module
    }

    fn insert(&self, key: [u8; 32], module: v8::CompiledWasmModule, len: usize) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.entries.iter().any(|(k, _, _)| *k == key) {
            return;
        }
        while !cache.entries.is_empty()
            && (cache.entries.len() >= MAX_CACHED_MODULES || cache.bytes + len > MAX_CACHED_BYTES)
        {
            let (_, _, evicted) = cache.entries.remove(0);
            cache.bytes -= evicted;
        }
        cache.bytes += len;
        cache.entries.push((key, module, len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module with a type section and, optionally, a memory section with one memory.
    fn module(with_memory: bool) -> Vec<u8> {
        let mut bytes = b"\0asm\x01\0\0\0".to_vec();
        if with_memory {
            // Section 5 (memory), 3 bytes: one memory, limits flag 0, minimum 1 page.
            bytes.extend([5, 3, 1, 0, 1]);
        }
        bytes
    }

    #[test]
    fn modules_that_define_a_memory_or_are_malformed_are_refused() {
        assert!(check_module(&module(false)).is_ok());
        assert!(matches!(
            check_module(&module(true)),
            Err(ModuleError::DefinesMemory)
        ));
        assert!(matches!(
            check_module(b"\0asm\x01\0\0\0\x05\x09"),
            Err(ModuleError::Invalid(_))
        ));
        assert!(matches!(
            check_module(b"not wasm"),
            Err(ModuleError::Invalid(_))
        ));
    }

    #[test]
    fn codegen_is_allowed_only_inside_a_guard() {
        assert!(!CODEGEN_ALLOWED.with(Cell::get));
        {
            let _outer = CodegenAllowed::new();
            assert!(CODEGEN_ALLOWED.with(Cell::get));
            {
                let _inner = CodegenAllowed::new();
            }
            assert!(
                CODEGEN_ALLOWED.with(Cell::get),
                "the inner guard restores the outer state"
            );
        }
        assert!(!CODEGEN_ALLOWED.with(Cell::get));
    }
}
