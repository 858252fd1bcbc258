//! A session's image: what a saved session is made of, as the engine produces and restores it —
//! Pyodide's memory snapshot of the interpreter (variables, functions, imported modules), the files
//! under /workspace, and the record of the shared libraries of native extension modules it loaded
//! from the package layer (relinked at the same bases on restore, as the snapshot with pre-imported
//! packages is). The store seals it (`store::seal`); this is the plain payload.
//!
//! Not carried (a session holding any of them is refused with the reason): packages installed during
//! the session (their libraries are not the layer's), JavaScript objects held from Python, pending
//! asyncio tasks.

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
    /// The record of the shared libraries to relink (JSON, see `ops/dylink.js`), if it loaded any.
    pub dylibs: Option<String>,
    /// The snapshot `memory` holds the differences from (`flavor:digest`, see
    /// `engine/session_base.rs`); `None`: `memory` is whole.
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
    pub fn decode(payload: Bytes) -> Result<Self, String> {
        let mut rest: &[u8] = payload
            .strip_prefix(MAGIC)
            .ok_or("not a session image of this format")?;
        let memory = payload.slice_ref(take(&mut rest)?);
        let count = u64::from_le_bytes(take_n(&mut rest)?);
        let mut files = Vec::new();
        for _ in 0..count {
            let path = String::from_utf8(take(&mut rest)?.to_vec())
                .map_err(|_| "a file path is not UTF-8")?;
            files.push((path, take(&mut rest)?.to_vec()));
        }
        let dylibs = String::from_utf8(take(&mut rest)?.to_vec())
            .map_err(|_| "the library record is not UTF-8")?;
        let base = String::from_utf8(take(&mut rest)?.to_vec())
            .map_err(|_| "the base snapshot's name is not UTF-8")?;
        if !rest.is_empty() {
            return Err("trailing bytes after the base snapshot's name".into());
        }
        Ok(Self {
            memory,
            files,
            dylibs: (!dylibs.is_empty()).then_some(dylibs),
            base: (!base.is_empty()).then_some(base),
        })
    }
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

fn take_n<const N: usize>(rest: &mut &[u8]) -> Result<[u8; N], String> {
    let (head, tail) = rest
        .split_first_chunk::<N>()
        .ok_or("the image is cut short")?;
    *rest = tail;
    Ok(*head)
}

fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let len =
        usize::try_from(u64::from_le_bytes(take_n(rest)?)).map_err(|_| "a length overflows")?;
    if rest.len() < len {
        return Err("the image is cut short".into());
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
