//! What one execution's upstream calls share: how many each server has had (the per-execution
//! budget, counted before anything is sent), how many are in flight, and the token that cancels
//! them all when the execution ends (also when this is dropped). Like `fetch::CallFetches`, it is
//! replaced with every call's state, so nothing the sandbox does can reset it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use crate::telemetry::traces::TraceParent;

/// Upstream calls in flight at once from one execution, at most.
pub const MAX_IN_FLIGHT: usize = 8;

/// One execution's upstream calls.
#[derive(Default)]
pub struct CallUpstream {
    pub(super) cancel: CancellationToken,
    counts: Mutex<HashMap<String, u32>>,
    in_flight: AtomicUsize,
    /// The token of each call in flight, by the id the sandbox gave it.
    calls: Mutex<HashMap<u32, CancellationToken>>,
    /// The trace context of the execution (its calls are traced as its children).
    trace: Option<TraceParent>,
}

impl CallUpstream {
    /// The state of an execution traced under `trace`.
    pub fn traced(trace: Option<TraceParent>) -> Self {
        Self {
            cancel: CancellationToken::new(),
            counts: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            calls: Mutex::default(),
            trace,
        }
    }

    /// The execution's trace context, if it is traced.
    pub(super) fn trace(&self) -> Option<&TraceParent> {
        self.trace.as_ref()
    }

    /// Cancels every upstream call of the execution.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Counts one call to `server` against `max`; false once the budget is spent.
    pub(super) fn take(&self, server: &str, max: u32) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let used = counts.entry(server.to_string()).or_default();
        if *used >= max {
            return false;
        }
        *used += 1;
        true
    }

    /// Starts one call with the sandbox's `id`: its token (a child of the execution's), or `None`
    /// when [`MAX_IN_FLIGHT`] calls are already running or `id` is in use.
    pub(super) fn start(&self, id: u32) -> Option<(CancellationToken, Running<'_>)> {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if calls.contains_key(&id) || self.in_flight.load(Ordering::SeqCst) >= MAX_IN_FLIGHT {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let token = self.cancel.child_token();
        calls.insert(id, token.clone());
        Some((token, Running { call: self, id }))
    }

    /// Cancels the call `id`, if it is running.
    pub fn cancel_one(&self, id: u32) {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(token) = calls.get(&id) {
            token.cancel();
        }
    }
}

impl Drop for CallUpstream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// One running call; ends it when dropped.
pub(super) struct Running<'a> {
    call: &'a CallUpstream,
    id: u32,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.call
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        self.call.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
