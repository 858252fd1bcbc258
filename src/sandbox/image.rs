//! A session's image: what a saved session is made of, as the engine produces and restores it —
//! Pyodide's memory snapshot of the interpreter (variables, functions, imported modules), the files
//! under /workspace (named relative to it), /tmp and /home/pyodide (named by absolute path), and the
//! record of the shared libraries of native extension modules it loaded from the package layer
//! (relinked at the same bases on restore, as the snapshot with pre-imported packages is). The store
//! seals it (`store::seal`); this is the plain payload. Also here: what an image may name of the
//! JavaScript world ([`check_references`], [`REALM_GLOBALS`]).
//!
//! Not carried (a session holding any of them is refused with the reason): packages installed during
//! the session (their libraries are not the layer's), JavaScript objects held from Python other than
//! those [`check_references`] allows, pending asyncio tasks, open files.

use bytes::Bytes;

/// The first bytes of an image payload (its format's version).
const MAGIC: &[u8; 8] = b"CIMSES\0\x02";

/// A session's saved state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionImage {
    /// Pyodide's memory snapshot of the session's interpreter.
    pub memory: Bytes,
    /// The files under /workspace (paths relative to it) and their bytes.
    pub files: Vec<(String, Vec<u8>)>,
    /// The record of the shared libraries to relink (JSON, see `isolate/ops/dylink.js`), if it
    /// loaded any.
    pub dylibs: Option<String>,
    /// The snapshot `memory` holds the differences from (`flavor:digest`, see
    /// `prepared/session_base.rs`); `None`: `memory` is whole.
    pub base: Option<String>,
}

impl SessionImage {
    /// The payload: magic, the memory, each file (path and bytes), the library record and the base
    /// snapshot's name (each empty: none), lengths as u64 LE; in parts, so that the memory and the
    /// files are not copied.
    pub fn encode(self) -> Vec<Bytes> {
        let mut parts = Vec::with_capacity(4 + 2 * self.files.len());
        let mut head = Vec::with_capacity(16);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(self.memory.len() as u64).to_le_bytes());
        parts.push(head.into());
        parts.push(self.memory);
        let mut small = (self.files.len() as u64).to_le_bytes().to_vec();
        for (path, data) in self.files {
            put(&mut small, path.as_bytes());
            small.extend_from_slice(&(data.len() as u64).to_le_bytes());
            parts.push(std::mem::take(&mut small).into());
            parts.push(data.into());
        }
        put(&mut small, self.dylibs.as_deref().unwrap_or("").as_bytes());
        put(&mut small, self.base.as_deref().unwrap_or("").as_bytes());
        parts.push(small.into());
        parts
    }

    /// The image in `payload`, if it is one of this format (the memory is not copied out of it).
    pub fn decode(payload: Bytes) -> Result<Self, ImageError> {
        use ImageError::Malformed;
        let mut rest: &[u8] = payload
            .strip_prefix(MAGIC)
            .ok_or(Malformed("not a session image of this format"))?;
        let memory = payload.slice_ref(take(&mut rest)?);
        let count = u64::from_le_bytes(take_n(&mut rest)?);
        let mut files = Vec::new();
        for _ in 0..count {
            let path = String::from_utf8(take(&mut rest)?.to_vec())
                .map_err(|_| Malformed("a file path is not UTF-8"))?;
            files.push((path, take(&mut rest)?.to_vec()));
        }
        let dylibs = String::from_utf8(take(&mut rest)?.to_vec())
            .map_err(|_| Malformed("the library record is not UTF-8"))?;
        let base = String::from_utf8(take(&mut rest)?.to_vec())
            .map_err(|_| Malformed("the base snapshot's name is not UTF-8"))?;
        if !rest.is_empty() {
            return Err(Malformed("trailing bytes after the base snapshot's name"));
        }
        Ok(Self {
            memory,
            files,
            dylibs: (!dylibs.is_empty()).then_some(dylibs),
            base: (!base.is_empty()).then_some(base),
        })
    }
}

/// The own global properties a sandbox's realm may have once booted, and the only global names a
/// session image may refer to (see [`check_references`]): the ECMAScript built-ins, the Web APIs
/// `web.js` installs, and what Pyodide leaves. A boot removes every other global before Pyodide
/// starts (`sealRealm` in `pyodide.js`) and ends with Rust's check that none is left
/// (`isolate/realm.rs`), on every path: fresh, parked then finished, restored and forked.
#[rustfmt::skip]
pub const REALM_GLOBALS: &[&str] = &[
    // ECMAScript (V8 15)
    "AggregateError", "Array", "ArrayBuffer", "AsyncDisposableStack", "Atomics", "BigInt",
    "BigInt64Array", "BigUint64Array", "Boolean", "DataView", "Date", "DisposableStack", "Error",
    "EvalError", "FinalizationRegistry", "Float16Array", "Float32Array", "Float64Array",
    "Function", "Infinity", "Int16Array", "Int32Array", "Int8Array", "Intl", "Iterator", "JSON",
    "Map", "Math", "NaN", "Number", "Object", "Promise", "Proxy", "RangeError", "ReferenceError",
    "Reflect", "RegExp", "Set", "SharedArrayBuffer", "String", "SuppressedError", "Symbol",
    "SyntaxError", "Temporal", "TypeError", "URIError", "Uint16Array", "Uint32Array",
    "Uint8Array", "Uint8ClampedArray", "WeakMap", "WeakRef", "WeakSet", "WebAssembly",
    "decodeURI", "decodeURIComponent", "encodeURI", "encodeURIComponent", "escape", "eval",
    "globalThis", "isFinite", "isNaN", "parseFloat", "parseInt", "undefined", "unescape",
    // Web APIs (web.js)
    "AbortController", "AbortSignal", "Headers", "MessageChannel", "Request", "Response",
    "TextDecoder", "TextEncoder", "URL", "URLSearchParams", "atob", "btoa", "clearInterval",
    "clearTimeout", "console", "crypto", "fetch", "performance", "queueMicrotask", "setInterval",
    "setTimeout",
    // Pyodide's reader of its files and the lock file's wheels (pyodide.js; Rust serves only those)
    "readbuffer",
];

/// Why bytes are not a session image this build can restore, or what in one is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Not this format, cut short, or otherwise malformed: what is wrong.
    #[error("{0}")]
    Malformed(&'static str),
    /// Its memory refers to a JavaScript object an image may not name ([`check_references`]).
    #[error("the image refers to a JavaScript object a session image may not name")]
    Refused,
}

/// The longest header (Pyodide's record of the JavaScript objects Python holds) an image may have.
const MAX_HEADER_JSON: usize = 16 << 20;
/// Pyodide's memory snapshot magic number (the header's first u32).
const SNAPSHOT_MAGIC: u32 = 1_886_286_592;
/// Where the header's JSON starts.
const HEADER_JSON_AT: usize = 48;

/// Checks what a session image's memory (Pyodide's snapshot header, at its start) refers to of the
/// JavaScript world: each object Python held must be one of the few an image may name — nothing,
/// Pyodide's API object or its `abortSignalAny`, the output streams, or a global of
/// [`REALM_GLOBALS`] or one of its own properties (`["Math", "floor"]`). A path resolved against
/// the global object (Pyodide's own `{path}` form) is never accepted: a restore would resolve it
/// before the realm is checked. Decided here, in Rust, before a restore starts and when an image is
/// made: whatever the session's code made of Pyodide's serializer, an image names nothing else.
pub fn check_references(memory: &[u8]) -> Result<(), ImageError> {
    use ImageError::{Malformed, Refused};
    let word = |i: usize| {
        memory
            .get(i * 4..i * 4 + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(Malformed("the image's memory header is cut short"))
    };
    if word(0)? != SNAPSHOT_MAGIC {
        return Err(Malformed(
            "the image's memory is not a Pyodide memory snapshot",
        ));
    }
    let header_len = word(1)? as usize;
    let json_len = word(2)? as usize;
    if json_len > MAX_HEADER_JSON || HEADER_JSON_AT + json_len > header_len.min(memory.len()) {
        return Err(Malformed("the image's memory header is malformed"));
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Header {
        hiwire_keys: Vec<Option<Held>>,
        immortal_keys: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    enum Held {
        #[serde(rename = "API")]
        Api(bool),
        #[serde(rename = "abortSignalAny")]
        AbortSignalAny(bool),
        #[serde(rename = "serialized")]
        Serialized(Token),
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Token {
        Stream(String),
        Path(Vec<String>),
    }
    let json = &memory[HEADER_JSON_AT..HEADER_JSON_AT + json_len];
    let header: Header = serde_json::from_slice(json).map_err(|_| {
        Malformed("the image's record of the JavaScript objects Python holds is malformed")
    })?;
    let _ = header.immortal_keys;
    for held in header.hiwire_keys.iter().flatten() {
        let allowed = match held {
            Held::Api(flag) | Held::AbortSignalAny(flag) => *flag,
            Held::Serialized(Token::Stream(name)) => name == "stdout" || name == "stderr",
            Held::Serialized(Token::Path(path)) => match path.as_slice() {
                [] => true,
                [global] | [global, _] => REALM_GLOBALS.contains(&global.as_str()),
                _ => false,
            },
        };
        if !allowed {
            return Err(Refused);
        }
    }
    Ok(())
}

/// `parts` (a payload in parts) as one buffer.
pub fn join(parts: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    out.into()
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn take_n<const N: usize>(rest: &mut &[u8]) -> Result<[u8; N], ImageError> {
    let (head, tail) = rest
        .split_first_chunk::<N>()
        .ok_or(ImageError::Malformed("the image is cut short"))?;
    *rest = tail;
    Ok(*head)
}

fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], ImageError> {
    let len = usize::try_from(u64::from_le_bytes(take_n(rest)?))
        .map_err(|_| ImageError::Malformed("a length overflows"))?;
    if rest.len() < len {
        return Err(ImageError::Malformed("the image is cut short"));
    }
    let (head, tail) = rest.split_at(len);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::{SessionImage, join};
    use bytes::Bytes;

    #[test]
    fn an_image_round_trips_and_a_cut_one_is_refused() {
        let image = SessionImage {
            memory: vec![7; 1000].into(),
            files: vec![
                ("a.txt".into(), b"hello".to_vec()),
                ("dir/b.bin".into(), vec![0; 3]),
            ],
            dylibs: Some("{\"loads\":[]}".into()),
            base: Some("plain:00ff".into()),
        };
        let payload = join(&image.clone().encode());
        assert_eq!(SessionImage::decode(payload.clone()).unwrap(), image);
        for cut in [0, 8, 20, payload.len() - 1] {
            assert!(SessionImage::decode(payload.slice(..cut)).is_err(), "{cut}");
        }
        let mut longer = payload.to_vec();
        longer.push(0);
        assert!(SessionImage::decode(Bytes::from(longer)).is_err());
    }
}
