//! Session ids: minted from OS randomness (also the legacy-era MCP session ids), named by their
//! replica, and shortened for logs and errors (an id is its session's only credential).

use std::sync::Arc;

use base64::Engine as _;

/// A session's id as the manager keeps it. The whole id is its session's only credential: it
/// leaves this type only through [`SessionId::as_wire`] (for the client, the store, and lookups);
/// `Display` and `Debug` show [`short`] of it, so a log line or an error message cannot carry it
/// whole by accident.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// A new id for a session of `replica` (see [`mint_id`]).
    pub fn mint(replica: &str) -> Result<Self, getrandom::Error> {
        Ok(Self(mint_id(replica, ID_BYTES)?.into()))
    }

    /// An id as a client or the store gave it.
    pub fn from_wire(id: &str) -> Self {
        Self(id.into())
    }

    /// The whole id: what the client is given and the store is keyed by.
    pub fn as_wire(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(short(&self.0))
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({:?}…)", short(&self.0))
    }
}

/// Maps keyed by `SessionId` are looked up with the id a client sent.
impl std::borrow::Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_shows_only_its_short_form_and_is_whole_only_on_the_wire() {
        let id = SessionId::mint("r1").unwrap();
        let wire = id.as_wire().to_string();
        assert!(wire.starts_with("r1.") && wire.len() == 3 + 32, "{wire}");
        assert!(well_formed(&wire));
        assert_eq!(id.to_string(), short(&wire));
        assert_eq!(id.to_string().len(), 3 + 6);
        assert!(!format!("{id:?}").contains(&wire[3..12]), "{id:?}");
        assert!(!format!("{id}").contains(&wire[3..12]));
        // Looked up by the id a client sends; the same id from the wire is equal.
        let mut map = std::collections::HashMap::new();
        map.insert(id.clone(), 1);
        assert_eq!(map.get(wire.as_str()), Some(&1));
        assert_eq!(SessionId::from_wire(&wire), id);
    }
}
