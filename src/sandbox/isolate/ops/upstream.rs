//! The ops behind `upstream.py`: the catalog of granted upstream tools, one call, one cancellation.
//! Every decision is Rust's (`crate::upstream`): code that reaches these ops from `import js` gains
//! nothing over calling the Python functions. Replies are JSON envelopes (`{"ok": ...}` or
//! `{"error": {"kind", "message"}}`), so no failure of an upstream becomes a JavaScript exception.

use std::cell::RefCell;
use std::rc::Rc;

use deno_core::{OpState, op2};
use deno_error::JsErrorBox;

use super::{call_state, state};

/// How long after the call's deadline an upstream call is cut, if the watchdog has not ended it
/// (as for fetch: the call then ends as a timeout, not as a Python exception).
const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(500);

/// The servers and granted tools, as JSON (see `Upstreams::catalog_json`).
#[op2]
#[string]
pub(super) fn op_sandbox_upstream_catalog(op_state: &mut OpState) -> String {
    match &state(op_state).shared.upstreams {
        Some(upstreams) => upstreams.catalog_json(),
        None => r#"{"servers":[]}"#.to_string(),
    }
}

/// One call of `server`'s `tool` with `args` (a JSON object), numbered `id` by the sandbox; only
/// while user code runs.
#[op2]
#[string]
pub(super) async fn op_sandbox_upstream_call(
    op_state: Rc<RefCell<OpState>>,
    #[string] server: String,
    #[string] tool: String,
    #[string] args: String,
    #[smi] id: u32,
) -> Result<String, JsErrorBox> {
    let (upstreams, call, deadline, pending) = {
        let op_state = op_state.borrow();
        let c = call_state(&op_state);
        if !c.user_started || c.report.is_some() {
            return Err(JsErrorBox::generic(
                "upstream tools can be called only while the code runs",
            ));
        }
        let s = state(&op_state);
        let Some(upstreams) = s.shared.upstreams.clone() else {
            return Err(JsErrorBox::generic(
                "no upstream MCP servers are configured on this server",
            ));
        };
        let deadline = c
            .watchdog
            .as_ref()
            .and_then(|w| w.deadline())
            .map(|d| d + DEADLINE_SLACK);
        (
            upstreams,
            c.upstream.clone(),
            deadline,
            s.upstream_pending.clone(),
        )
    };
    let _pending = Pending::new(pending);
    Ok(upstreams
        .call(call, &server, &tool, &args, id, deadline)
        .await)
}

/// Cancels the running call `id` (an asyncio task cancelled in Python).
#[op2(fast)]
pub(super) fn op_sandbox_upstream_cancel(op_state: &mut OpState, #[smi] id: u32) {
    call_state(op_state).upstream.cancel_one(id);
}

/// Counts one call as pending while its op runs (also when its future is dropped).
struct Pending(Rc<std::cell::Cell<u32>>);

impl Pending {
    fn new(count: Rc<std::cell::Cell<u32>>) -> Self {
        count.set(count.get().saturating_add(1));
        Self(count)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}
