//! The ops of one call's lifecycle (call.js): the code and the input files in, the captured output,
//! the start of the timeout clock, the runner's report and the new files under /workspace out.

use std::time::Instant;

use deno_core::{OpState, ToJsBuffer, op2};
use deno_error::JsErrorBox;

use super::{state, state_mut};
use crate::sandbox::watchdog::WatchMsg;

#[op2]
#[string]
pub(super) fn op_sandbox_code(op_state: &mut OpState) -> Result<String, JsErrorBox> {
    state_mut(op_state)
        .code
        .take()
        .ok_or_else(|| JsErrorBox::generic("no code to run"))
}

#[op2(fast)]
pub(super) fn op_sandbox_report(op_state: &mut OpState, #[string] json: String) {
    state_mut(op_state).report = Some(json);
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

/// Arms the timeout watchdog: user code starts now.
#[op2(fast)]
pub(super) fn op_sandbox_start_clock(op_state: &mut OpState) {
    if let Some(tx) = &state(op_state).watchdog {
        let _ = tx.send(WatchMsg::Arm(Instant::now()));
    }
}

#[op2(fast)]
#[smi]
pub(super) fn op_sandbox_input_file_count(op_state: &mut OpState) -> u32 {
    state(op_state).input_files.len() as u32
}

#[op2]
#[serde]
pub(super) fn op_sandbox_input_file(
    op_state: &mut OpState,
    #[smi] index: u32,
) -> Result<(String, ToJsBuffer), JsErrorBox> {
    let entry = state_mut(op_state)
        .input_files
        .get_mut(index as usize)
        .ok_or_else(|| JsErrorBox::range_error("no such input file"))?;
    let data = entry.1.take().unwrap_or_default();
    Ok((entry.0.clone(), data.into()))
}

#[op2(fast)]
pub(super) fn op_sandbox_offer_file(
    op_state: &mut OpState,
    #[string] _path: &str,
    size: f64,
) -> bool {
    state_mut(op_state).files.offer(size as u64)
}

#[op2(fast)]
pub(super) fn op_sandbox_collect_file(
    op_state: &mut OpState,
    #[string] path: String,
    #[buffer] data: &[u8],
) {
    state_mut(op_state).files.collect(path, data);
}
