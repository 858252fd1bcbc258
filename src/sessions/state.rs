//! What the manager keeps about each session (where it is, its holds, its durability) and the
//! guards that give back what a call or a creation holds when its future is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::thread::Job;
use super::{Caller, SessionId, durable};
use bytes::Bytes;

/// Where a session is.
pub(super) enum Place {
    /// In memory: the channel to its thread.
    Resident(mpsc::Sender<Job>),
    /// In the store. `leased`: this process already holds the lease and has the image (a session
    /// found in the store by its first call here).
    Spilled { leased: Option<Bytes> },
}

/// A session and what the manager tracks about it.
pub(super) struct Session {
    pub(super) id: SessionId,
    pub(super) caller: Caller,
    pub(super) created: Instant,
    /// When it was created, milliseconds since the Unix epoch (carried in its image).
    pub(super) created_ms: u64,
    pub(super) last_used: Mutex<Instant>,
    /// Jobs queued or running (each job holds one count until its thread is done with it, whether
    /// its caller waits or not; a call waiting for the session's resume counts too).
    pub(super) pending: Arc<AtomicUsize>,
    /// The stop flags of its calls that still have a caller (set when the session ends).
    pub(super) stops: Mutex<Vec<Arc<AtomicBool>>>,
    /// The session has ended: it takes no more calls (its thread drops what is queued).
    pub(super) dead: Arc<AtomicBool>,
    /// Where it is; held while it moves (a spill, a resume) and while a job is handed over.
    pub(super) place: tokio::sync::Mutex<Place>,
    /// It counts against `max_resident` (mirrors `place`, readable without its lock).
    pub(super) resident: AtomicBool,
    /// Why it cannot be saved, as of its last call (`None`: it can).
    pub(super) unsaveable: Mutex<Option<String>>,
    /// This process holds its lease in the store (it was resumed from there), renewed at.
    pub(super) leased: Mutex<Option<Instant>>,
    /// When its last spill failed in the store (it is not retried for `SPILL_RETRY`).
    pub(super) spill_failed: Mutex<Option<Instant>>,
}

impl Session {
    pub(super) fn touch(&self, now: Instant) {
        *lock(&self.last_used) = now;
    }

    pub(super) fn last_used(&self) -> Instant {
        *lock(&self.last_used)
    }

    /// Whether a spill may be tried now: it can be saved, and no spill failed in the store lately.
    pub(super) fn spillable(&self, now: Instant) -> bool {
        lock(&self.unsaveable).is_none()
            && lock(&self.spill_failed)
                .is_none_or(|at| now.saturating_duration_since(at) >= durable::SPILL_RETRY)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases a creation's slot when dropped.
pub(super) struct Starting<'a>(pub(super) &'a AtomicUsize);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Releases a principal's creation slot when dropped (its entry goes with its last one).
pub(super) struct StartingFor<'a>(
    pub(super) &'a Mutex<HashMap<Option<[u8; 32]>, usize>>,
    pub(super) Option<[u8; 32]>,
);

impl Drop for StartingFor<'_> {
    fn drop(&mut self) {
        let mut starting = lock(self.0);
        if let Some(n) = starting.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                starting.remove(&self.1);
            }
        }
    }
}

/// A place in memory (`max_resident`) for a sandbox being booted: given back when dropped, unless
/// [`kept`](Self::kept) for the session it became.
pub(super) struct ResidentSlot<'a>(pub(super) Option<&'a Mutex<usize>>);

impl ResidentSlot<'_> {
    pub(super) fn kept(mut self) {
        self.0 = None;
    }
}

impl Drop for ResidentSlot<'_> {
    fn drop(&mut self) {
        if let Some(count) = self.0 {
            *lock(count) -= 1;
        }
    }
}

/// A call's stop flag, registered with its session: set when the call's future is dropped before
/// its reply came (the caller went away), removed from the session either way.
pub(super) struct StopGuard {
    pub(super) session: Arc<Session>,
    pub(super) flag: Arc<AtomicBool>,
    pub(super) done: bool,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if !self.done {
            self.flag.store(true, Ordering::SeqCst);
        }
        lock(&self.session.stops).retain(|c| !Arc::ptr_eq(c, &self.flag));
    }
}
