//! The ops of the package layer (`layer.js`): its file index, directories and blob that a sandbox
//! copies into MEMFS (or maps, see `cow.rs`), its `loadedPackages`, its shared libraries compiled
//! once per process, and, for the installer sandbox that builds it, the files and packages an
//! installation added.

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::pyodide::may_map;
use super::{Role, boot, boot_mut, state};
use crate::sandbox::prepared::wasm::ModuleError;

/// The package layer's file index: (absolute path, offset in the blob, length).
#[op2]
#[serde]
pub(super) fn op_sandbox_layer_index(
    op_state: &mut OpState,
) -> Result<Vec<(String, u32, u32)>, JsErrorBox> {
    boot(op_state).booting("op_sandbox_layer_index")?;
    let s = state(op_state);
    Ok(s.shared
        .layer
        .get()
        .map(|l| l.index.clone())
        .unwrap_or_default())
}

/// The entries of one directory of the package layer: (name, is a directory, offset in the blob,
/// length). Also after boot: a sandbox makes the layer's directories when first looked up.
#[op2]
#[serde]
pub(super) fn op_sandbox_layer_dir(
    op_state: &mut OpState,
    #[string] path: &str,
) -> Vec<crate::sandbox::prepared::layer::Child> {
    state(op_state)
        .shared
        .layer
        .get()
        .map(|l| l.children(path).to_vec())
        .unwrap_or_default()
}

/// The package layer's file contents, back to back, as a new ArrayBuffer that the sandbox owns
/// (mapped copy-on-write: see `cow.rs`).
#[op2]
pub(super) fn op_sandbox_layer_blob<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    boot(op_state).booting("op_sandbox_layer_blob")?;
    let map = may_map(op_state);
    let s = state(op_state);
    match s.shared.layer.get() {
        Some(layer) => layer
            .contents
            .array_buffer(scope, map, &s.budget)
            .map(Into::into),
        None => Ok(v8::ArrayBuffer::new(scope, 0).into()),
    }
}

/// Pyodide `loadedPackages` entries of the package layer.
#[op2]
#[serde]
pub(super) fn op_sandbox_layer_loaded(
    op_state: &mut OpState,
) -> Result<Vec<(String, String)>, JsErrorBox> {
    boot(op_state).booting("op_sandbox_layer_loaded")?;
    let s = state(op_state);
    Ok(s.shared
        .layer
        .get()
        .map(|l| l.loaded_packages.clone())
        .unwrap_or_default())
}

/// The shared library at `path` of the package layer, compiled once per process (start-up only: a
/// sandbox restored from a snapshot with pre-imported packages relinks them, see `dylink.js`).
#[op2]
pub(super) fn op_sandbox_layer_module<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[string] path: &str,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    boot(op_state).booting("op_sandbox_layer_module")?;
    let s = state(op_state);
    let shared = s.shared.clone();
    let layer = shared
        .layer
        .get()
        .ok_or_else(|| JsErrorBox::generic("no package layer"))?;
    if !layer.has_file(path) {
        return Err(JsErrorBox::generic(format!(
            "{path} is not in the package layer"
        )));
    }
    shared
        .wasm_modules
        .compile_named(scope, &format!("layer:{path}"), || {
            layer.file(path).map_err(ModuleError::Unreadable)
        })
        .map(Into::into)
        .map_err(|e| JsErrorBox::type_error(e.to_string()))
}

/// What the installer has captured so far; an error in any other role.
fn installer_captures(op_state: &mut OpState) -> Result<&mut super::Captured, JsErrorBox> {
    let b = boot_mut(op_state);
    b.booting("the installer's captures")?;
    match &mut b.role {
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
