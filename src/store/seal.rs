//! The sealed form of a session image: what the store holds. A versioned header in the clear (the
//! engine the image was made by, so that an image of another engine is refused before anything is
//! decrypted), then the payload's sha256 and the payload compressed with zstd, encrypted with
//! AES-256-GCM under a key derived from the session id (HKDF-SHA256) with the header as associated
//! data. The id is the only key: the store never holds a usable secret, and an image read with any
//! other id, or changed by one bit, is refused.
//!
//! ```text
//! "CIMIMG" 0x00 0x01 | u32 LE header length | header (JSON) | AES-256-GCM(sha256(payload) | zstd(payload)) + tag
//! ```

use bytes::Bytes;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first bytes of every sealed image: a name and the format's version (1).
const MAGIC: &[u8; 8] = b"CIMIMG\0\x01";
/// Domain separation of the key (HKDF salt and info) and of the name.
const KEY_SALT: &[u8] = b"code-interpreter-mcp session image key";
const KEY_INFO: &[u8] = b"v1";
const NAME_DOMAIN: &[u8] = b"code-interpreter-mcp session image name v1\0";
/// zstd's level: level 1 seals the 32 MB memory delta of a session holding a 1,000,000-row DataFrame
/// about twice as fast as level 3 for a slightly larger image (docs/durable-sessions.md).
pub const LEVEL: i32 = 1;
/// Payloads larger than this are compressed on two threads.
const COMPRESS_THREADS_FROM: usize = 4 << 20;
/// The largest header a sealed image may have.
const MAX_HEADER: usize = 64 * 1024;

/// What the header says, in the clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The engine key of the process that made the image (Pyodide files, glue, package layer).
    pub engine: String,
    /// When it was made, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The payload's length before compression.
    pub plain_len: u64,
    /// The AES-GCM nonce, hex (random per image).
    pub nonce: String,
    /// The image's place among its session's images, counting from 1 (0: made before images were
    /// counted); authenticated with the rest of the header, so that an older image put back in
    /// place of a newer one is recognised (see `Store::load`).
    #[serde(default)]
    pub generation: u64,
}

/// Why a sealed image was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("not a session image of this format")]
    Format,
    #[error("the image was made by another engine ({0})")]
    OtherEngine(String),
    #[error("the image does not open with this id, or was changed")]
    Sealed,
    #[error("the image is damaged: {0}")]
    Damaged(String),
    #[error("the image holds {0} bytes, more than the {1} allowed")]
    TooLarge(u64, u64),
    #[error(
        "the stored image is an older one (generation {0}) than the session's newest ({1}): it was put back, and is refused"
    )]
    Replayed(u64, u64),
    #[error("the stored image is not a regular file")]
    NotRegular,
}

/// The name under which a session's image is stored: a hash of the id (hex), which says nothing
/// about the id (listing or leaking the store reveals no session).
pub fn name(id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(NAME_DOMAIN);
    hash.update(id.as_bytes());
    hex::encode(hash.finalize())
}

fn key(id: &str) -> LessSafeKey {
    let prk = Salt::new(HKDF_SHA256, KEY_SALT).extract(id.as_bytes());
    // (Expanding 32 bytes from a SHA-256 PRK cannot fail.)
    let okm = prk
        .expand(&[KEY_INFO], &AES_256_GCM)
        .unwrap_or_else(|_| unreachable!("HKDF-SHA256 yields 32 bytes"));
    LessSafeKey::new(UnboundKey::from(okm))
}

/// Seals `payload` (in parts, as if joined) for session `id`, made by `engine`. The digest is
/// computed on a second thread while the payload is compressed.
pub fn seal(
    id: &str,
    engine: &str,
    created_ms: u64,
    generation: u64,
    payload: &[Bytes],
) -> Result<Vec<u8>, String> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| format!("no randomness for the nonce: {e}"))?;
    let plain_len: usize = payload.iter().map(Bytes::len).sum();
    let header = Header {
        engine: engine.to_string(),
        created_ms,
        plain_len: plain_len as u64,
        nonce: hex::encode(nonce),
        generation,
    };
    let header = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    let mut sealed = Vec::new();
    sealed
        .try_reserve(plain_len / 3 + header.len() + 1024)
        .map_err(|_| "no memory to seal the image")?;
    sealed.extend_from_slice(MAGIC);
    sealed.extend_from_slice(&(header.len() as u32).to_le_bytes());
    sealed.extend_from_slice(&header);
    let aad_len = sealed.len();
    sealed.extend_from_slice(&[0u8; 32]);
    let digest = std::thread::scope(|scope| {
        let hashing = scope.spawn(|| {
            let mut hash = Sha256::new();
            for part in payload {
                hash.update(part);
            }
            hash.finalize()
        });
        compress(payload, plain_len, &mut sealed)?;
        hashing
            .join()
            .map_err(|_| "hashing the image failed".to_string())
    })?;
    sealed[aad_len..aad_len + 32].copy_from_slice(&digest);
    let (aad, body) = sealed.split_at_mut(aad_len);
    let tag = key(id)
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&aad[..]),
            body,
        )
        .map_err(|_| "sealing failed".to_string())?;
    sealed.extend_from_slice(tag.as_ref());
    Ok(sealed)
}

/// Appends `payload`'s parts, compressed as one zstd frame, to `out`.
fn compress(payload: &[Bytes], plain_len: usize, out: &mut Vec<u8>) -> Result<(), String> {
    use std::io::Write;
    let failed = |e: std::io::Error| format!("compressing the image failed: {e}");
    let mut encoder = zstd::stream::Encoder::new(out, LEVEL).map_err(failed)?;
    encoder
        .set_pledged_src_size(Some(plain_len as u64))
        .map_err(failed)?;
    encoder.include_contentsize(true).map_err(failed)?;
    // Two compression threads (a large image's sealing is most of a save; level 1 on two threads
    // takes ~2/3 of one thread's time for the same size, docs/durable-sessions.md).
    if plain_len > COMPRESS_THREADS_FROM {
        encoder.multithread(2).map_err(failed)?;
    }
    for part in payload {
        encoder.write_all(part).map_err(failed)?;
    }
    encoder.finish().map_err(failed)?;
    Ok(())
}

/// The header of a sealed image, and where its encrypted part starts.
pub fn header(sealed: &[u8]) -> Result<(Header, usize), OpenError> {
    let rest = sealed.strip_prefix(MAGIC).ok_or(OpenError::Format)?;
    let (len, rest) = rest.split_first_chunk::<4>().ok_or(OpenError::Format)?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_HEADER || rest.len() < len {
        return Err(OpenError::Format);
    }
    let header: Header = serde_json::from_slice(&rest[..len]).map_err(|_| OpenError::Format)?;
    Ok((header, MAGIC.len() + 4 + len))
}

/// Opens `sealed` for session `id`: the payload and its generation, if it was made by `engine` for
/// this id, is intact, is at most `max_plain` bytes once decompressed, and is not older than
/// `newest` (the session's newest generation known).
pub fn open(
    id: &str,
    engine: &str,
    sealed: Bytes,
    max_plain: u64,
    newest: u64,
) -> Result<(Bytes, u64), OpenError> {
    let (header, start) = header(&sealed)?;
    if header.engine != engine {
        return Err(OpenError::OtherEngine(header.engine));
    }
    if header.plain_len > max_plain {
        return Err(OpenError::TooLarge(header.plain_len, max_plain));
    }
    let nonce: [u8; NONCE_LEN] = hex::decode(&header.nonce)
        .ok()
        .and_then(|n| n.try_into().ok())
        .ok_or(OpenError::Format)?;
    // (Decrypted in place: no copy when the bytes are the store's own.)
    let mut sealed = Vec::from(sealed);
    let (aad, body) = sealed.split_at_mut(start);
    let plain = key(id)
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&aad[..]),
            body,
        )
        .map_err(|_| OpenError::Sealed)?;
    // (The generation is known genuine only now: it is part of what the tag authenticates.)
    if header.generation < newest {
        return Err(OpenError::Replayed(header.generation, newest));
    }
    let (digest, compressed) = plain
        .split_first_chunk::<32>()
        .ok_or_else(|| OpenError::Damaged("no digest".into()))?;
    // Decompressed into at most the length the header states (more is an error).
    let capacity = usize::try_from(header.plain_len).map_err(|_| OpenError::Format)?;
    let payload = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress(compressed, capacity))
        .map_err(|e| OpenError::Damaged(e.to_string()))?;
    if payload.len() as u64 != header.plain_len {
        return Err(OpenError::Damaged(format!(
            "{} bytes where the header says {}",
            payload.len(),
            header.plain_len
        )));
    }
    if Sha256::digest(&payload).as_slice() != digest {
        return Err(OpenError::Damaged("sha256 mismatch".into()));
    }
    Ok((payload.into(), header.generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "r1.c2Vzc2lvbi1pZC1mb3ItdGVzdHMtMDEyMzQ1";

    fn payload() -> Vec<u8> {
        // Like a memory image: long zero runs between pages of data.
        let mut bytes = vec![0u8; 1 << 20];
        for (i, b) in bytes.iter_mut().enumerate().step_by(7).take(50_000) {
            *b = (i % 251) as u8;
        }
        bytes
    }

    #[test]
    fn a_sealed_image_opens_with_its_id_and_engine_only() {
        let payload = payload();
        let sealed = seal(ID, "engine-a", 1, 3, &[Bytes::from(payload.clone())]).unwrap();
        assert!(
            sealed.len() < payload.len() / 4,
            "compressed: {}",
            sealed.len()
        );
        assert_eq!(
            open(ID, "engine-a", sealed.clone().into(), 1 << 30, 0).unwrap(),
            (Bytes::from(payload), 3)
        );
        // Not when a newer generation of the session is known: it was put back.
        assert_eq!(
            open(ID, "engine-a", sealed.clone().into(), 1 << 30, 4),
            Err(OpenError::Replayed(3, 4))
        );
        assert_eq!(
            open(
                "r1.another-id",
                "engine-a",
                sealed.clone().into(),
                1 << 30,
                0
            ),
            Err(OpenError::Sealed)
        );
        assert_eq!(
            open(ID, "engine-b", sealed.clone().into(), 1 << 30, 0),
            Err(OpenError::OtherEngine("engine-a".into()))
        );
        assert_eq!(
            open(ID, "engine-a", sealed.clone().into(), 1000, 0),
            Err(OpenError::TooLarge(1 << 20, 1000))
        );
        // The payload is not readable in the sealed bytes, nor is the id.
        assert!(!sealed.windows(ID.len()).any(|w| w == ID.as_bytes()));
    }

    #[test]
    fn any_changed_byte_is_refused() {
        let sealed = seal(
            ID,
            "engine-a",
            1,
            1,
            &[
                Bytes::from_static(b"state of a "),
                Bytes::from_static(b"session"),
            ],
        )
        .unwrap();
        let (_, start) = header(&sealed).unwrap();
        for at in [0, 9, start - 2, start, start + 5, sealed.len() - 1] {
            let mut changed = sealed.clone();
            changed[at] ^= 0x40;
            assert!(
                open(ID, "engine-a", changed.into(), 1 << 20, 0).is_err(),
                "byte {at}"
            );
        }
        assert!(
            open(
                ID,
                "engine-a",
                sealed[..sealed.len() - 1].to_vec().into(),
                1 << 20,
                0
            )
            .is_err()
        );
        assert_eq!(
            open(ID, "engine-a", Bytes::new(), 1 << 20, 0),
            Err(OpenError::Format)
        );
    }

    #[test]
    fn names_are_stable_hex_and_say_nothing_of_the_id() {
        assert_eq!(name(ID), name(ID));
        assert_ne!(name(ID), name("r1.other"));
        assert_eq!(name(ID).len(), 64);
        assert!(name(ID).bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!name(ID).contains("r1"));
    }
}
