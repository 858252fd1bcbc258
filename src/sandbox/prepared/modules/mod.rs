//! The ES modules a sandbox may load — only Pyodide's two JavaScript files, by fixed `asset:` URLs —
//! with a V8 code cache shared by every isolate of the process: the first isolate compiles each module
//! and hands V8's cache to the engine; later isolates skip parsing the module source. (Isolates that
//! start from the V8 startup snapshot, see `startup.rs`, find both modules already evaluated.)
//!
//! `pyodide.asm.mjs` is served with seven changes, each applied only where the pinned source has
//! exactly the expected code: Emscripten's dynamic linker gets the lazy Global Offset Table in
//! `lazy_got.js` (about a quarter of a sandbox's start-up saved), a lazily filled symbol table
//! (`lazy_imports.js`) and the cheaper function-table helpers in `function_table.js`; its
//! signature conversion makes a view of the exports instead of a copy (`exports_view.js`);
//! Pyodide's snapshot restore calls `Module.sandboxRestoreMemory` when the sandbox provides it (a
//! copy that skips zero pages); a restored sandbox skips package-index steps the snapshot holds; and
//! the loader of shared libraries calls hooks that record and replay where each library went (for
//! snapshots with pre-imported packages, see `src/sandbox/isolate/ops/dylink.js`).
//! `pyodide.mjs` compiles a small WebAssembly module when first needed instead of while it is
//! evaluated, which lets it be evaluated into the V8 startup snapshot (no WebAssembly there), and
//! compiles it synchronously; it also lets MEMFS own the standard library it is handed, and it
//! instantiates Pyodide before it awaits the memory snapshot (so a session's sandbox can be parked
//! before its snapshot is chosen).

pub(crate) mod wrappers;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deno_core::{
    ModuleLoadOptions, ModuleLoadReferrer, ModuleLoadResponse, ModuleLoader, ModuleResolveResponse,
    ModuleSource, ModuleSourceCode, ModuleSpecifier, ModuleType, RequestedModuleType,
    ResolutionKind, SourceCodeCacheInfo, resolve_import,
};
use deno_error::JsErrorBox;

use crate::assets::Assets;

/// The lazy GOT: the code inserted into pyodide.asm.mjs and the call sites it takes over, each an
/// exact piece of the pinned Pyodide's source that must occur exactly once.
const LAZY_GOT_JS: &str = include_str!("lazy_got.js");
const LAZY_GOT_CALL_SITES: [(&str, &str); 3] = [
    // receiveInstance(): fill only the main module's own imports.
    (
        "updateGOT(origExports);LDSO.init();",
        "initLazyGOT(origExports);LDSO.init();",
    ),
    // A side module imports a symbol: the main module's export, if it has one.
    (
        "get(weakImports,symName){var rtn=GOT[symName];",
        "get(weakImports,symName){var rtn=GOT[symName]??materializeGOT(symName);",
    ),
    // A side module's exports never replace the main module's.
    (
        "var value=exports[symName];var existingEntry=GOT[symName]&&",
        "var value=exports[symName];materializeGOT(symName);var existingEntry=GOT[symName]&&",
    ),
];

/// The main module's exports enter Emscripten's symbol table lazily (lazy_imports.js).
const LAZY_IMPORTS_JS: &str = include_str!("lazy_imports.js");
const LAZY_IMPORTS_CALL_SITE: (&str, &str) = (
    "var origExports=wasmExports;mergeLibSymbols(wasmExports,\"main\");",
    "var origExports=wasmExports;wasmImports=sandboxLazyImports(wasmImports,wasmExports);",
);

/// Emscripten's function-table helpers, replaced by those in function_table.js.
const FUNCTION_TABLE_JS: &str = include_str!("function_table.js");
const FUNCTION_TABLE_CALL_SITES: [(&str, &str); 8] = [
    (
        "var getFunctionAddress=func=>{if(!functionsInTableMap){functionsInTableMap=new WeakMap;updateTableMap(0,wasmTable.length)}return functionsInTableMap.get(func)||0};",
        "var getFunctionAddress=sandboxGetFunctionAddress;",
    ),
    (
        "var addFunction=(func,sig)=>{var rtn=getFunctionAddress(func);if(rtn){return rtn}var ret=getEmptyTableSlot();try{setWasmTableEntry(ret,func)}catch(err){if(!(err instanceof TypeError)){throw err}var wrapped=convertJsFunctionToWasm(func,sig);setWasmTableEntry(ret,wrapped)}functionsInTableMap.set(func,ret);return ret};",
        "var addFunction=sandboxAddFunction;",
    ),
    (
        "var module=new WebAssembly.Module(bytes);var instance=new WebAssembly.Instance(module,{e:{f:func}});",
        "var module=sandboxWrapperModule(sig,bytes);var instance=new WebAssembly.Instance(module,{e:{f:func}});",
    ),
    (
        "return addFunction(trampolineInstance.exports.trampoline_call)}",
        "return sandboxAddNewFunction(trampolineInstance.exports.trampoline_call)}",
    ),
    (
        "var reportUndefinedSymbols=()=>{",
        "var reportUndefinedSymbols=sandboxReportUndefinedSymbols;var emscriptenReportUndefinedSymbols=()=>{",
    ),
    // A shared library's exported functions get the slots a relinked snapshot recorded, if it did.
    (
        "if(typeof value==\"function\"){newValue=addFunction(value)}",
        "if(typeof value==\"function\"){newValue=sandboxAddExport(symName,value)}",
    ),
    // A library's slots enter the map only once the table has been read (the read covers them).
    (
        "updateTableMap(tableBase,metadata.tableSize);moduleExports=relocateExports(",
        "if(sandboxTableRead){updateTableMap(tableBase,metadata.tableSize)}moduleExports=relocateExports(",
    ),
    // The GOT handler records each entry it makes unresolved.
    (
        "if(!rtn){rtn=GOT[symName]=new WebAssembly.Global({value:\"i32\",mutable:true},-1)}",
        "if(!rtn){rtn=GOT[symName]=new WebAssembly.Global({value:\"i32\",mutable:true},-1);(sandboxUnresolvedGOT??=[]).push(symName)}",
    ),
];

/// applySignatureConversions() without its copy of every export (exports_view.js).
const EXPORTS_VIEW_JS: &str = include_str!("exports_view.js");
const SIGNATURE_CONVERSIONS: &str =
    "function applySignatureConversions(wasmExports){wasmExports=Object.assign({},wasmExports);";

/// Hooks in Emscripten's `loadWebAssemblyModule`, called through `Module.sandboxDylink` when the
/// sandbox sets it (see `src/sandbox/isolate/ops/dylink.js`): the snapshot maker records where each
/// shared library of a pre-imported package went (memory base, table base, order), and a restored
/// sandbox relinks the same libraries at the same bases without running their relocations or
/// constructors again (the restored memory already holds what they did).
const DYLINK_HOOK_SITES: [(&str, &str); 6] = [
    (
        "var memoryBase=metadata.memorySize?alignMemory(getMemory(metadata.memorySize+memAlign),memAlign):0;",
        "var __sd=Module[\"sandboxDylink\"];var memoryBase=__sd?.memoryBase?.(libName,metadata,wasmTable.length);if(memoryBase===undefined)memoryBase=metadata.memorySize?alignMemory(getMemory(metadata.memorySize+memAlign),memAlign):0;",
    ),
    (
        "var tableBase=metadata.tableSize?wasmTable.length:0;",
        "var tableBase=metadata.tableSize?wasmTable.length:0;__sd?.allocated?.(libName,metadata,memoryBase,tableBase);",
    ),
    (
        "function postInstantiation(module,instance){",
        "function postInstantiation(module,instance){__sd?.instantiated?.(libName,metadata,memoryBase,tableBase);",
    ),
    (
        "var applyRelocs=moduleExports[\"__wasm_apply_data_relocs\"];if(applyRelocs){",
        "var applyRelocs=moduleExports[\"__wasm_apply_data_relocs\"];if(applyRelocs&&!__sd?.skipInit?.(libName)){",
    ),
    (
        "var init=moduleExports[\"__wasm_call_ctors\"];if(init){",
        "var init=moduleExports[\"__wasm_call_ctors\"];if(init&&!__sd?.skipInit?.(libName)){",
    ),
    (
        "init()}else{addOnPostCtor(init)}}return moduleExports}",
        "init()}else{addOnPostCtor(init)}}__sd?.loaded?.(libName,moduleExports,wasmTable.length,flags);return moduleExports}",
    ),
];

/// `asm_js` with the dynamic-linker hooks, or `None` if this Pyodide's loader differs from the one
/// they were written for (then no pre-imported snapshot is made).
fn with_dylink_hooks(asm_js: &str) -> Option<String> {
    replace_each_once(asm_js, DYLINK_HOOK_SITES)
}

/// The snapshot restore: `API.restoreSnapshot` copies the whole linear memory with `HEAP8.set`.
const SPARSE_RESTORE_CALL_SITE: (&str, &str) = (
    "return Module.HEAP8.set(t),l",
    "return(Module.sandboxRestoreMemory?Module.sandboxRestoreMemory(t):Module.HEAP8.set(t)),l",
);

/// pyodide.mjs compiles its JsvError helper (a tiny WebAssembly module) in an async function that it
/// calls while the module is evaluated; the change calls it on first use instead.
const LAZY_JSV_ERROR_CALL_SITES: [(&str, &str); 2] = [
    (
        "var ge=async function(){",
        "var ge,geStart=async function(){",
    ),
    (
        "}();async function K(){let e=await ge;",
        "};async function K(){let e=await(ge??=geStart());",
    ),
];

/// pyodide.mjs copies the standard library into MEMFS; with this change MEMFS owns the buffer it is
/// handed, which is the sandbox's own (a copy-on-write mapping, see `cow.rs`).
const STDLIB_OWNED_CALL_SITE: (&str, &str) = (
    "n.FS.writeFile(`/lib/python${i}${s}.zip`,r)",
    "n.FS.writeFile(`/lib/python${i}${s}.zip`,r,{canOwn:!0})",
);

/// pyodide.mjs compiles and instantiates that helper asynchronously, a round trip through V8's task
/// queue for a module of 60 bytes; the change does both synchronously.
const SYNC_JSV_ERROR_CALL_SITE: (&str, &str) = (
    "let t=await WebAssembly.compile(G);return await WebAssembly.instantiate(t)",
    "return new WebAssembly.Instance(new WebAssembly.Module(G))",
);

/// loadPyodide awaits its memory snapshot before it instantiates Pyodide's WebAssembly; the change
/// instantiates first, so a sandbox can be parked before its snapshot is chosen (`park` in
/// `pyodide.js`, which also sets `noInitialRun`, as the snapshot step would have before).
const INSTANTIATE_FIRST_CALL_SITE: (&str, &str) = (
    "s=await ke(t,n),r=await Re(i,n);",
    "r=await Re(i,n),s=await ke(t,n);",
);

/// `pyodide.mjs` with the lazy JsvError helper, or `None` if the change does not apply (then the
/// module cannot go into the V8 startup snapshot).
fn with_lazy_jsv_error(loader_js: &str) -> Option<String> {
    replace_each_once(loader_js, LAZY_JSV_ERROR_CALL_SITES)
}

/// `pyodide.mjs` as sandboxes are served it, and whether it can go into the V8 startup snapshot
/// (`with_lazy_jsv_error` applied). The other changes apply where they can, with a warning where not.
fn serve_loader_js(loader_js: &str) -> (String, bool) {
    let (out, snapshottable) = match with_lazy_jsv_error(loader_js) {
        Some(patched) => (patched, true),
        None => (loader_js.to_string(), false),
    };
    let changes: [(Change, &str); 3] = [
        (
            |js| replace_each_once(js, [INSTANTIATE_FIRST_CALL_SITE]),
            "does not load its snapshot as expected; session sandboxes are not parked ahead",
        ),
        (
            |js| replace_each_once(js, [STDLIB_OWNED_CALL_SITE]),
            "does not install the standard library as expected; it copies it",
        ),
        (
            |js| replace_each_once(js, [SYNC_JSV_ERROR_CALL_SITE]),
            "does not compile its JsvError helper as expected; it compiles it asynchronously",
        ),
    ];
    (apply_changes("pyodide.mjs", out, &changes), snapshottable)
}

/// `pyodide.asm.mjs` with the lazy GOT, or `None` if this Pyodide's source does not have the expected
/// call sites.
fn with_lazy_got(asm_js: &str) -> Option<String> {
    let definitions = "var updateGOT=";
    let definitions_to = format!("{LAZY_GOT_JS}{definitions}");
    let sites = LAZY_GOT_CALL_SITES
        .into_iter()
        .chain([(definitions, definitions_to.as_str())]);
    replace_each_once(asm_js, sites)
}

/// `source` with each `from` replaced by its `to`, or `None` unless each `from` occurs exactly once.
fn replace_each_once<'a>(
    source: &str,
    sites: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    let mut out = source.to_string();
    for (from, to) in sites {
        if out.matches(from).count() != 1 {
            return None;
        }
        out = out.replacen(from, to, 1);
    }
    Some(out)
}

/// `asm_js` with function_table.js's helpers in place of Emscripten's, or `None` if this Pyodide's
/// source does not have the expected helpers.
fn with_function_table(asm_js: &str) -> Option<String> {
    // The helpers are function declarations: wherever they stand in the module function, they exist
    // before any of its code runs. They go next to the new addFunction.
    let definition = FUNCTION_TABLE_CALL_SITES[1].1;
    let with_helpers = format!("{FUNCTION_TABLE_JS}{definition}");
    let sites = FUNCTION_TABLE_CALL_SITES
        .into_iter()
        .chain([(definition, with_helpers.as_str())]);
    replace_each_once(asm_js, sites)
}

/// `asm_js` with the main module's exports entering the symbol table lazily, or `None` if this
/// Pyodide's source does not merge them as expected.
fn with_lazy_imports(asm_js: &str) -> Option<String> {
    let definition = "var mergeLibSymbols=";
    let with_helper = format!("{LAZY_IMPORTS_JS}{definition}");
    replace_each_once(
        asm_js,
        [LAZY_IMPORTS_CALL_SITE, (definition, with_helper.as_str())],
    )
}

/// `asm_js` whose snapshot restore calls `Module.sandboxRestoreMemory`, or `None` if this Pyodide's
/// source does not restore as expected.
fn with_sparse_restore(asm_js: &str) -> Option<String> {
    replace_each_once(asm_js, [SPARSE_RESTORE_CALL_SITE])
}

/// `asm_js` whose applySignatureConversions() makes a view of the exports instead of a copy, or
/// `None` if this Pyodide's source does not convert them as expected.
fn with_exports_view(asm_js: &str) -> Option<String> {
    // The names the function assigns: `wasmExports["name"]=` up to its return.
    let body_start = asm_js.find(SIGNATURE_CONVERSIONS)? + SIGNATURE_CONVERSIONS.len();
    let body = &asm_js[body_start..];
    let body = &body[..body.find("return wasmExports}")?];
    let assignment = "wasmExports[\"";
    let names: Vec<&str> = body
        .match_indices(assignment)
        .filter_map(|(at, _)| {
            let rest = &body[at + assignment.len()..];
            let name = &rest[..rest.find('"')?];
            rest[name.len()..].starts_with("\"]=").then_some(name)
        })
        .collect();
    if names.is_empty() || names.iter().any(|n| n.contains(['\\', '\n'])) {
        return None;
    }
    let list = names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(",");
    let view = format!(
        "{EXPORTS_VIEW_JS}function applySignatureConversions(wasmExports){{wasmExports=sandboxExportsView(wasmExports,[{list}]);"
    );
    replace_each_once(asm_js, [(SIGNATURE_CONVERSIONS, view.as_str())])
}

/// Pyodide's package-index set-up ends by giving the interpreter the lock file's import names and by
/// listing site-packages for installed packages. A sandbox restored from the memory snapshot already
/// has the former (the snapshot was taken after it, and its key covers the lock file), and its
/// site-packages is still empty (the package layer comes afterwards, with its own records); with
/// `Module.sandboxRestored` set, the change skips both (~1.1 ms).
const RESTORED_PACKAGE_INDEX_CALL_SITE: (&str, &str) = (
    "API._pyodide._importhook.register_module_not_found_hook(API._import_name_to_package_name),API.package_loader.init_loaded_packages()}",
    "Module.sandboxRestored||(API._pyodide._importhook.register_module_not_found_hook(API._import_name_to_package_name),API.package_loader.init_loaded_packages())}",
);

/// `asm_js` that skips the package-index steps a restored sandbox already has, or `None` if this
/// Pyodide's source does not end its package-index set-up as expected.
fn with_restored_package_index(asm_js: &str) -> Option<String> {
    replace_each_once(asm_js, [RESTORED_PACKAGE_INDEX_CALL_SITE])
}

/// Emscripten tells a library's data symbols (immutable globals) from mutable ones by assigning each
/// its own value and catching the TypeError: ~1,000 exceptions per pre-imported sandbox, each with
/// a stack trace (~2 ms together). The change keeps the test and captures no stack for them.
const IMMUTABLE_GLOBAL_CHECK: (&str, &str) = (
    "var isImmutableGlobal=val=>{if(val instanceof WebAssembly.Global){try{val.value=val.value}catch{return true}}return false};",
    "var isImmutableGlobal=val=>{if(val instanceof WebAssembly.Global){var limit=Error.stackTraceLimit;Error.stackTraceLimit=0;try{val.value=val.value}catch{return true}finally{Error.stackTraceLimit=limit}}return false};",
);

/// A shared library's `env` imports resolve through a proxy whose handler asks the symbol table
/// (`wasmImports`, itself a proxy: see lazy_imports.js) three times per name (`in`, then two
/// reads); ~9,000 names per pre-imported sandbox's relinking. The change reads each once. (It
/// differs only for a name present with the value `undefined`, which the symbol table never holds.)
const SINGLE_IMPORT_LOOKUP: (&str, &str) = (
    "if(prop in wasmImports&&!wasmImports[prop].stub){var res=wasmImports[prop];return res}",
    "var res=wasmImports[prop];if(res!==undefined&&!res.stub){return res}",
);

/// One change to a served module: the patched source, or `None` where it does not apply.
type Change = fn(&str) -> Option<String>;

/// `pyodide.asm.mjs` as sandboxes are served it: each change that applies to this source, with a
/// warning for each that does not.
fn serve_asm_js(asm_js: &str) -> String {
    let changes: [(Change, &str); 9] = [
        (
            with_lazy_got,
            "does not have the expected dynamic-linker code; linking eagerly",
        ),
        (
            with_lazy_imports,
            "does not merge the main module's exports as expected; merging them eagerly",
        ),
        (
            with_function_table,
            "does not have the expected function-table helpers; keeping Emscripten's",
        ),
        (
            with_exports_view,
            "does not convert export signatures as expected; copying the exports",
        ),
        (
            with_restored_package_index,
            "does not set up its package index as expected; restored sandboxes repeat it",
        ),
        (
            with_sparse_restore,
            "does not have the expected snapshot restore; copying all of the memory",
        ),
        (
            with_dylink_hooks,
            "does not load shared libraries as expected; no snapshot with pre-imported packages",
        ),
        (
            |js| replace_each_once(js, [SINGLE_IMPORT_LOOKUP]),
            "does not resolve library imports as expected; each reads the symbol table three times",
        ),
        (
            |js| replace_each_once(js, [IMMUTABLE_GLOBAL_CHECK]),
            "does not tell immutable globals as expected; each test captures a stack trace",
        ),
    ];
    apply_changes("pyodide.asm.mjs", asm_js.to_string(), &changes)
}

/// `source` (the file `name`) with each change that applies to it, with a warning for each that
/// does not.
fn apply_changes(name: &str, mut source: String, changes: &[(Change, &str)]) -> String {
    for (change, otherwise) in changes {
        match change(&source) {
            Some(patched) => source = patched,
            None => tracing::warn!("{name} {otherwise} (slower sandbox start-up)"),
        }
    }
    source
}

/// A V8 code cache and the hash of the module source it belongs to.
type CacheEntry = (u64, Arc<[u8]>);

/// The module sources (prepared once per engine) and their code caches by module URL.
pub(crate) struct Modules {
    sources: HashMap<ModuleSpecifier, (Arc<str>, u64)>,
    cache: Mutex<HashMap<String, CacheEntry>>,
    /// Whether the modules may be evaluated into a V8 startup snapshot.
    snapshottable: bool,
    /// Which of our changes took, read once from the sources served (see the methods).
    dylink_hooks: bool,
    sparse_restore: bool,
    parking: bool,
}

impl Modules {
    pub fn new(assets: &Assets) -> Self {
        let asm_js: Arc<str> = serve_asm_js(&assets.asm_js).into();
        let (loader_js, snapshottable) = serve_loader_js(&assets.loader_js);
        let loader_js: Arc<str> = loader_js.into();
        let dylink_hooks = asm_js.contains(DYLINK_HOOK_SITES[0].1);
        let sparse_restore = asm_js.contains(SPARSE_RESTORE_CALL_SITE.1);
        let parking = loader_js.contains(INSTANTIATE_FIRST_CALL_SITE.1);
        let mut sources = HashMap::new();
        for (name, source) in [("pyodide.mjs", loader_js), ("pyodide.asm.mjs", asm_js)] {
            let specifier =
                ModuleSpecifier::parse(&format!("asset:///{name}")).expect("static URL");
            let hash = source_hash(&source);
            sources.insert(specifier, (source, hash));
        }
        Self {
            sources,
            cache: Mutex::default(),
            snapshottable,
            dylink_hooks,
            sparse_restore,
            parking,
        }
    }
}

impl Modules {
    /// Whether the modules may be evaluated into a V8 startup snapshot: pyodide.mjs must not start
    /// compiling WebAssembly while it is evaluated (see `serve_loader_js`).
    pub fn snapshottable(&self) -> bool {
        self.snapshottable
    }

    /// Whether a sandbox can relink shared libraries at recorded bases (the dynamic-linker hooks
    /// applied), which a snapshot with pre-imported packages needs.
    pub fn dylink_hooks(&self) -> bool {
        self.dylink_hooks
    }

    /// Whether Pyodide's snapshot restore hands the memory to the sandbox (`sandboxRestoreMemory`)
    /// instead of copying the snapshot's bytes itself, which a session image's restore needs (its
    /// snapshot's bytes are only the header).
    pub fn sparse_restore(&self) -> bool {
        self.sparse_restore
    }

    /// Whether a sandbox can be parked before its memory snapshot is chosen: Pyodide's loader
    /// instantiates its WebAssembly before it awaits the snapshot.
    pub fn parking(&self) -> bool {
        self.parking
    }

    /// A fingerprint of every module source served.
    pub fn fingerprint(&self) -> u64 {
        let mut hashes: Vec<(&str, u64)> = self
            .sources
            .iter()
            .map(|(specifier, (_, hash))| (specifier.as_str(), *hash))
            .collect();
        hashes.sort();
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        hashes.hash(&mut hasher);
        hasher.finish()
    }

    /// The source served as `asset:///{name}` (empty for any other name).
    pub fn source(&self, name: &str) -> &str {
        ModuleSpecifier::parse(&format!("asset:///{name}"))
            .ok()
            .and_then(|specifier| self.sources.get(&specifier))
            .map_or("", |(source, _)| source)
    }
}

/// Serves `asset:///pyodide.mjs` and `asset:///pyodide.asm.mjs`; refuses every other module.
pub(crate) struct AssetModuleLoader(pub Arc<Modules>);

/// A fingerprint of a module source, so a cache is only offered for the source it was made from (V8
/// would reject a mismatching cache anyway).
fn source_hash(source: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut hasher);
    hasher.finish()
}

impl ModuleLoader for AssetModuleLoader {
    fn resolve(
        &self,
        specifier: &str,
        referrer: &str,
        _kind: ResolutionKind,
    ) -> ModuleResolveResponse {
        resolve_import(specifier, referrer).map_err(JsErrorBox::from_err)
    }

    fn load(
        &self,
        specifier: &ModuleSpecifier,
        _referrer: Option<&ModuleLoadReferrer>,
        options: ModuleLoadOptions,
    ) -> ModuleLoadResponse {
        let Some((source, hash)) = self.0.sources.get(specifier) else {
            return ModuleLoadResponse::Sync(Err(JsErrorBox::generic(format!(
                "module {specifier} is not available in the sandbox"
            ))));
        };
        if !matches!(options.requested_module_type, RequestedModuleType::None) {
            return ModuleLoadResponse::Sync(Err(JsErrorBox::generic(format!(
                "module {specifier} is JavaScript"
            ))));
        }
        let data = self
            .0
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(specifier.as_str())
            .filter(|(h, _)| h == hash)
            .map(|(_, bytes)| Cow::Owned(bytes.to_vec()));
        ModuleLoadResponse::Sync(Ok(ModuleSource::new(
            ModuleType::JavaScript,
            ModuleSourceCode::String(source.clone().into()),
            specifier,
            Some(SourceCodeCacheInfo { hash: *hash, data }),
        )))
    }

    fn code_cache_ready(
        &self,
        specifier: ModuleSpecifier,
        hash: u64,
        code_cache: &[u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
        self.0
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(specifier.to_string(), (hash, code_cache.into()));
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_change_applies_to_the_pinned_pyodide() {
        let Ok(assets) = crate::assets::Assets::load(&crate::assets::Assets::default_dir()) else {
            panic!("the pinned Pyodide files are needed (npm ci)");
        };
        let patched = super::with_lazy_got(&assets.asm_js).expect("call sites found");
        assert!(patched.contains("initLazyGOT(origExports);LDSO.init();"));
        assert!(patched.contains("var lazyGOTMainExports"));
        assert!(super::with_lazy_got("var updateGOT=1").is_none());
        let (loader, snapshottable) = super::serve_loader_js(&assets.loader_js);
        assert!(snapshottable);
        assert!(loader.contains("await(ge??=geStart())"));
        assert!(loader.contains(super::STDLIB_OWNED_CALL_SITE.1));
        assert!(loader.contains(super::SYNC_JSV_ERROR_CALL_SITE.1));
        assert!(loader.contains(super::INSTANTIATE_FIRST_CALL_SITE.1));
        assert!(!super::serve_loader_js("var ge=1").1);
        let served = super::serve_asm_js(&assets.asm_js);
        assert!(served.contains("var lazyGOTMainExports"));
        assert!(served.contains(super::SPARSE_RESTORE_CALL_SITE.1));
        for (_, to) in super::DYLINK_HOOK_SITES {
            assert!(served.contains(to), "{to}");
        }
        assert!(served.contains(super::RESTORED_PACKAGE_INDEX_CALL_SITE.1));
        assert!(served.contains(super::IMMUTABLE_GLOBAL_CHECK.1));
        assert!(served.contains(super::SINGLE_IMPORT_LOOKUP.1));
        assert!(served.contains("function sandboxAddFunction(func, sig)"));
        assert!(served.contains(super::LAZY_IMPORTS_CALL_SITE.1));
        assert!(served.contains("function sandboxLazyImports(imports, mainExports)"));
        for (from, _) in super::FUNCTION_TABLE_CALL_SITES {
            assert!(!served.contains(from));
        }
        // The 20 exports Emscripten wraps get own properties in the view.
        assert!(!served.contains(super::SIGNATURE_CONVERSIONS));
        let view = "wasmExports=sandboxExportsView(wasmExports,[\"malloc\",\"__errno_location\",";
        assert!(served.contains(view));
        let list = &served[served.find(view).unwrap()..];
        assert_eq!(list[..list.find(']').unwrap()].matches(',').count(), 20);
        assert!(
            super::with_exports_view(&super::SIGNATURE_CONVERSIONS.replace("assign", "x"))
                .is_none()
        );
    }
}
