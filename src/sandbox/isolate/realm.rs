//! The check every boot path ends with — fresh, parked then finished, restored from a session's
//! image, forked — that the user realm reaches nothing a fresh sandbox cannot: its global object
//! holds only the globals of `image::REALM_GLOBALS` (deno_core's `Deno`, `__bootstrap` and every
//! host object are gone), and the two prototypes every object and array inherits from carry no
//! index properties (an index accessor there re-enters deno_core's callbacks). Read from Rust
//! through V8's API: no JavaScript runs, so nothing a restored image's Python left behind can answer
//! for the realm. The objects Python holds are checked by the boot itself for saveable sandboxes
//! (`checkHeld` in `image.js`), against the names Rust allows (`image::check_references`).

use deno_core::{JsRuntime, v8};

use crate::protocol::limits::shown;
use crate::sandbox::image::REALM_GLOBALS;

/// Why the booted realm reaches more than a fresh sandbox's, if it does.
pub(crate) fn check(runtime: &mut JsRuntime) -> Result<(), String> {
    deno_core::scope!(scope, runtime);
    let context = scope.get_current_context();
    let global = context.global(scope);
    for name in own_keys(scope, global)? {
        if name.is_symbol() {
            continue;
        }
        let name = name.to_rust_string_lossy(scope);
        if !REALM_GLOBALS.contains(&name.as_str()) {
            return Err(format!(
                "the sandbox's realm has a global a fresh sandbox does not ({})",
                shown(&name)
            ));
        }
    }
    for constructor in ["Object", "Array"] {
        let prototype = prototype_of(scope, global, constructor)
            .ok_or_else(|| format!("the sandbox's realm has no {constructor}.prototype"))?;
        if own_keys(scope, prototype)?.iter().any(|k| k.is_number()) {
            return Err(format!(
                "{constructor}.prototype has index properties, which a fresh sandbox's does not"
            ));
        }
    }
    Ok(())
}

/// `object`'s own property keys (strings, symbols and indices, as numbers), read without running
/// JavaScript.
fn own_keys<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    object: v8::Local<'s, v8::Object>,
) -> Result<Vec<v8::Local<'s, v8::Value>>, String> {
    let args = v8::GetPropertyNamesArgs {
        mode: v8::KeyCollectionMode::OwnOnly,
        property_filter: v8::PropertyFilter::ALL_PROPERTIES,
        index_filter: v8::IndexFilter::IncludeIndices,
        key_conversion: v8::KeyConversionMode::KeepNumbers,
    };
    let keys = object
        .get_own_property_names(scope, args)
        .ok_or("the sandbox's realm cannot be read")?;
    (0..keys.length())
        .map(|i| {
            keys.get_index(scope, i)
                .ok_or_else(|| "the sandbox's realm cannot be read".to_string())
        })
        .collect()
}

/// `global[constructor].prototype`, read as data properties only (an accessor is not called).
fn prototype_of<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    global: v8::Local<'s, v8::Object>,
    constructor: &str,
) -> Option<v8::Local<'s, v8::Object>> {
    let constructor = data_property(scope, global, constructor)?;
    let constructor = v8::Local::<v8::Object>::try_from(constructor).ok()?;
    let prototype = data_property(scope, constructor, "prototype")?;
    v8::Local::<v8::Object>::try_from(prototype).ok()
}

/// `object`'s own data property `name`, if it has one that is not an accessor.
fn data_property<'s>(
    scope: &mut v8::PinScope<'s, '_>,
    object: v8::Local<'s, v8::Object>,
    name: &str,
) -> Option<v8::Local<'s, v8::Value>> {
    let key = v8::String::new(scope, name)?;
    let descriptor = object.get_own_property_descriptor(scope, key.into())?;
    let descriptor = v8::Local::<v8::Object>::try_from(descriptor).ok()?;
    let value = v8::String::new(scope, "value")?;
    if !descriptor.has_own_property(scope, value.into())? {
        return None;
    }
    descriptor.get(scope, value.into())
}
