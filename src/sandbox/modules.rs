//! The ES modules a sandbox may load — only Pyodide's two JavaScript files, by fixed `asset:` URLs —
//! with a V8 code cache shared by every isolate of the process: the first isolate compiles each module
//! and hands V8's cache to the engine; later isolates skip parsing the module source.

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

/// A V8 code cache and the hash of the module source it belongs to.
type CacheEntry = (u64, Arc<[u8]>);

/// Code caches by module URL.
#[derive(Default)]
pub(crate) struct CodeCache(Mutex<HashMap<String, CacheEntry>>);

/// Serves `asset:///pyodide.mjs` and `asset:///pyodide.asm.mjs`; refuses every other module.
pub(crate) struct AssetModuleLoader {
    modules: HashMap<ModuleSpecifier, (Arc<str>, u64)>,
    cache: Arc<CodeCache>,
}

impl AssetModuleLoader {
    pub fn new(assets: &Assets, cache: Arc<CodeCache>) -> Self {
        let mut modules = HashMap::new();
        for (name, source) in [
            ("pyodide.mjs", &assets.loader_js),
            ("pyodide.asm.mjs", &assets.asm_js),
        ] {
            let specifier =
                ModuleSpecifier::parse(&format!("asset:///{name}")).expect("static URL");
            modules.insert(specifier, (source.clone(), source_hash(source)));
        }
        Self { modules, cache }
    }
}

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
        let Some((source, hash)) = self.modules.get(specifier) else {
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
            .cache
            .0
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
        self.cache
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(specifier.to_string(), (hash, code_cache.into()));
        Box::pin(async {})
    }
}
