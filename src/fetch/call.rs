//! What one call's requests share (their count in flight, the bytes received, the token that aborts
//! them, the bodies not yet handed over), and the process-wide cache of package artifacts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use super::FetchResponse;
use crate::protocol::limits::{MAX_FETCH_CACHE_BYTES, MAX_FETCHES_IN_FLIGHT};

/// Successful header-less GET responses for package artifacts (wheels and source archives), by
/// normalised URL, most recently used last.
#[derive(Default)]
pub(super) struct ArtifactCache {
    entries: Vec<(String, Arc<FetchResponse>)>,
    pub(super) bytes: usize,
}

impl ArtifactCache {
    pub(super) fn get(&mut self, key: &str) -> Option<Arc<FetchResponse>> {
        let at = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(at);
        let hit = entry.1.clone();
        self.entries.push(entry);
        Some(hit)
    }

    pub(super) fn insert(&mut self, key: String, response: Arc<FetchResponse>) {
        let len = response.body.len();
        if len > MAX_FETCH_CACHE_BYTES || self.entries.iter().any(|(k, _)| *k == key) {
            return;
        }
        while self.bytes + len > MAX_FETCH_CACHE_BYTES && !self.entries.is_empty() {
            let (_, evicted) = self.entries.remove(0);
            self.bytes -= evicted.body.len();
        }
        self.bytes += len;
        self.entries.push((key, response));
    }
}

/// One call's outbound requests: how many are in flight, how many response bytes it received, and
/// the token that aborts them all when the call ends (also when this is dropped).
#[derive(Default)]
pub struct CallFetches {
    pub(super) cancel: CancellationToken,
    pub(super) in_flight: Arc<AtomicUsize>,
    pub(super) received: Arc<AtomicU64>,
    /// Response bodies not yet handed to JavaScript, by id, each with what must live as long as it
    /// is held (the sandbox's charge for it).
    bodies: Mutex<HashMap<u32, (Vec<u8>, Charge)>>,
    next_body: AtomicUsize,
}

/// What must live as long as a kept body (the sandbox's charge for it).
pub type Charge = Box<dyn std::any::Any + Send>;

impl CallFetches {
    /// Aborts every request of the call.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Keeps a response body, and `charge` with it, until JavaScript takes it; its id.
    pub fn keep_body(&self, body: Vec<u8>, charge: Charge) -> u32 {
        let id = self.next_body.fetch_add(1, Ordering::SeqCst) as u32;
        self.bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (body, charge));
        id
    }

    /// The response body kept as `id`, once (its charge dropped).
    pub fn take_body(&self, id: u32) -> Option<Vec<u8>> {
        self.bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .map(|(body, _charge)| body)
    }

    /// The response body kept as `id` copied into `out`, once; refused (and kept) unless `out` is
    /// exactly as long.
    pub fn take_body_into(&self, id: u32, out: &mut [u8]) -> Result<(), &'static str> {
        let mut bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        let (body, _) = bodies.get(&id).ok_or("no such response body")?;
        if body.len() != out.len() {
            return Err("the buffer is not the body's length");
        }
        out.copy_from_slice(body);
        bodies.remove(&id);
        Ok(())
    }
}

impl Drop for CallFetches {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Counts one request in flight for a call until dropped.
pub(super) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    /// One more request of `call` in flight, or `None` when it has its most already.
    pub(super) fn enter(call: &CallFetches) -> Option<Self> {
        if call.in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_FETCHES_IN_FLIGHT {
            call.in_flight.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Self(call.in_flight.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
