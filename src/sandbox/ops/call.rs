//! The ops of one call's lifecycle (call.js): the code and the input files in, the captured output,
//! the start of the user's clock, the runner's report and the new files under /workspace out. What
//! comes back from the sandbox is bounded here (see `output.rs`), not in JavaScript or Python.

use deno_core::{OpState, op2, v8};
use deno_error::JsErrorBox;

use super::{state, state_mut};
use crate::sandbox::output::Report;
use crate::sandbox::watchdog::Phase;

#[op2]
#[string]
pub(super) fn op_sandbox_code(op_state: &mut OpState) -> Result<String, JsErrorBox> {
    state_mut(op_state)
        .code
        .take()
        .ok_or_else(|| JsErrorBox::generic("no code to run"))
}

/// The runner's report; the first one counts, capped to the limits.
#[op2]
pub(super) fn op_sandbox_report(op_state: &mut OpState, #[serde] report: Report) {
    let s = state_mut(op_state);
    if s.report.is_none() {
        s.report = Some(report.capped());
    }
}

/// What ended `run()` with an exception (see `runtime.js`), as text; the first one counts.
#[op2(fast)]
pub(super) fn op_sandbox_glue_error(op_state: &mut OpState, #[string] text: &str) {
    let s = state_mut(op_state);
    if s.glue_error.is_none() {
        s.glue_error = Some(crate::sandbox::output::cap_text(text.to_string(), 2000, false).0);
    }
}

#[op2(fast)]
pub(super) fn op_sandbox_write(op_state: &mut OpState, fd: u32, #[buffer] data: &[u8]) -> u32 {
    let s = state_mut(op_state);
    match fd {
        1 => s.stdout.push(data),
        _ => s.stderr.push(data),
    }
    data.len() as u32
}

/// The user's code starts now: `timeout_ms` runs from here (the set-up's budget ends). Only once.
#[op2(fast)]
pub(super) fn op_sandbox_start_clock(op_state: &mut OpState) {
    let s = state_mut(op_state);
    if s.user_started {
        return;
    }
    s.user_started = true;
    if let Some(watchdog) = &s.watchdog {
        watchdog.arm(Phase::User, s.user_timeout);
    }
}

#[op2(fast)]
#[smi]
pub(super) fn op_sandbox_input_file_count(op_state: &mut OpState) -> u32 {
    state(op_state).input_files.len() as u32
}

/// Input file `index` as `[path, ArrayBuffer]`, the buffer charged to the sandbox's memory budget;
/// each file is handed over once.
#[op2]
pub(super) fn op_sandbox_input_file<'s, 'i>(
    scope: &mut v8::PinScope<'s, 'i>,
    op_state: &mut OpState,
    #[smi] index: u32,
) -> Result<v8::Local<'s, v8::Value>, JsErrorBox> {
    let s = state_mut(op_state);
    let budget = s.budget.clone();
    let entry = s
        .input_files
        .get_mut(index as usize)
        .ok_or_else(|| JsErrorBox::range_error("no such input file"))?;
    let data = entry.1.take().unwrap_or_default();
    let path = v8::String::new(scope, &entry.0)
        .ok_or_else(|| JsErrorBox::generic("the input file's path is too long"))?;
    let buffer = budget.array_buffer(scope, data)?;
    Ok(v8::Array::new_with_elements(scope, &[path.into(), buffer.into()]).into())
}

/// Whether a new file of `size` bytes (as the sandbox's file system says) may still be returned.
#[op2(fast)]
pub(super) fn op_sandbox_offer_file(op_state: &mut OpState, size: f64) -> bool {
    let size = if size.is_finite() && size >= 0.0 {
        size as u64
    } else {
        u64::MAX
    };
    state_mut(op_state).files.offer(size)
}

#[op2(fast)]
pub(super) fn op_sandbox_collect_file(
    op_state: &mut OpState,
    #[string] path: String,
    #[buffer] data: &[u8],
) {
    state_mut(op_state).files.collect(path, data);
}
