//! Session ids: minted from OS randomness (also the legacy-era MCP session ids), named by their
//! replica, and shortened for logs and errors (an id is its session's only credential).

use base64::Engine as _;

/// A session's id as logs show it: the replica prefix, if any, and six more characters. A prefix
/// that cannot be a replica name (`replica_id`: lower-case letters, digits and '-', at most 63) may
/// be another session's random part, which a client made into a prefix: of such an id only its
/// first eight characters.
pub fn short(id: &str) -> &str {
    let end = match id.split_once('.') {
        Some((replica, _)) if replica_name(replica) => replica.len() + 1 + 6,
        Some(_) => 8,
        None => 6,
    };
    &id[..id.floor_char_boundary(end.min(id.len()))]
}

/// Whether `name` can be a replica's name (as `replica_id` is checked).
fn replica_name(name: &str) -> bool {
    name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The replica named in a session id (the part before its first dot), if any.
pub fn replica_of(id: &str) -> Option<&str> {
    id.split_once('.').map(|(replica, _)| replica)
}

/// The replica an id names, as an error shows it: quoted, its first 8 characters only (the prefix
/// of an id a client made up may be another session's whole random part, and errors are logged).
pub fn shown_replica(owner: &str) -> String {
    let head: String = owner.chars().take(8).collect();
    let more = if owner.chars().count() > 8 { "…" } else { "" };
    format!("{}{more}", crate::protocol::limits::shown(&head))
}

/// A new id: `replica.` (when set), then `bytes` bytes of OS randomness, URL-safe Base64 without
/// padding (the alphabet has no dot). Session ids and legacy-era MCP session ids are made here.
pub fn mint_id(replica: &str, bytes: usize) -> Result<String, getrandom::Error> {
    let mut random = vec![0u8; bytes];
    getrandom::fill(&mut random)?;
    let random = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random);
    Ok(if replica.is_empty() {
        random
    } else {
        format!("{replica}.{random}")
    })
}

/// Random bytes in a session id (192 bits).
pub(super) const ID_BYTES: usize = 24;

/// Whether `id` has the shape of a minted session id (a replica prefix of at most 63 characters,
/// then 32 URL-safe Base64 characters): only such an id is looked up in the session store.
pub fn well_formed(id: &str) -> bool {
    let random = match id.split_once('.') {
        Some((replica, random)) => {
            if replica.is_empty() || replica.len() > 63 {
                return false;
            }
            random
        }
        None => id,
    };
    random.len() == 32
        && random
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
