//! A session's image: what a saved session is made of, as the engine produces and restores it —
//! Pyodide's memory snapshot of the interpreter (variables, functions, imported pure-Python modules)
//! and the files under /workspace. The store seals it (`store::seal`); this is the plain payload.
//!
//! Not carried yet (a session holding any of them is refused with the reason): shared libraries of
//! native extension modules, packages installed during the session, JavaScript objects held from
//! Python.

/// The first bytes of an image payload (its format's version).
const MAGIC: &[u8; 8] = b"CIMSES\0\x01";

/// A session's saved state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionImage {
    /// Pyodide's memory snapshot of the session's interpreter.
    pub memory: Vec<u8>,
    /// The files under /workspace (paths relative to it) and their bytes.
    pub files: Vec<(String, Vec<u8>)>,
}

impl SessionImage {
    /// The payload: magic, the memory, then each file (path and bytes), lengths as u64 LE.
    pub fn encode(&self) -> Vec<u8> {
        let size = self.memory.len()
            + self
                .files
                .iter()
                .map(|(p, d)| p.len() + d.len() + 16)
                .sum::<usize>();
        let mut out = Vec::with_capacity(size + 32);
        out.extend_from_slice(MAGIC);
        put(&mut out, &self.memory);
        out.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        for (path, data) in &self.files {
            put(&mut out, path.as_bytes());
            put(&mut out, data);
        }
        out
    }

    /// The image in `payload`, if it is one of this format.
    pub fn decode(payload: &[u8]) -> Result<Self, String> {
        let mut rest = payload
            .strip_prefix(MAGIC)
            .ok_or("not a session image of this format")?;
        let memory = take(&mut rest)?.to_vec();
        let count = u64::from_le_bytes(take_n(&mut rest)?);
        let mut files = Vec::new();
        for _ in 0..count {
            let path = String::from_utf8(take(&mut rest)?.to_vec())
                .map_err(|_| "a file path is not UTF-8")?;
            files.push((path, take(&mut rest)?.to_vec()));
        }
        if !rest.is_empty() {
            return Err("trailing bytes after the last file".into());
        }
        Ok(Self { memory, files })
    }
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
    use super::SessionImage;

    #[test]
    fn an_image_round_trips_and_a_cut_one_is_refused() {
        let image = SessionImage {
            memory: vec![7; 1000],
            files: vec![
                ("a.txt".into(), b"hello".to_vec()),
                ("dir/b.bin".into(), vec![0; 3]),
            ],
        };
        let payload = image.encode();
        assert_eq!(SessionImage::decode(&payload).unwrap(), image);
        for cut in [0, 8, 20, payload.len() - 1] {
            assert!(SessionImage::decode(&payload[..cut]).is_err(), "{cut}");
        }
        let mut longer = payload.clone();
        longer.push(0);
        assert!(SessionImage::decode(&longer).is_err());
    }
}
