//! How a call ended, decided once from what was observed (the watchdog's stop, what `run()` returned,
//! the runner's report, the memory flags, a fatal interpreter error) by who caused it: a pure function
//! with a table-driven test. Anything the user's code caused is `python` (or `timeout`, or
//! `cancelled`); `runtime` is left for the server's own faults. For a sandbox kept for a session it
//! also says whether the sandbox can run anything more ([`SandboxEnd`]), as a type: no message text
//! decides it.

use crate::sandbox::isolate::output::Report;
use crate::sandbox::isolate::watchdog::{INTERRUPT_GRACE, Interrupt, Phase, Stop};
use crate::sandbox::types::{ErrorKind, ErrorType, ExecError, SandboxEnd};

/// What was observed of one call.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// Why the watchdog stopped the call, if it did.
    pub stopped: Option<Stop>,
    /// How `run()` ended: `None` when the watchdog ended the wait first, else `Ok`, or the exception
    /// it ended in (deno_core's, or the glue's own as `runtime.js` handed it over).
    pub returned: Option<Result<(), String>>,
    /// The runner's report, if it made one.
    pub report: Option<Report>,
    /// This call's user code started.
    pub user_started: bool,
    /// User code had run in this interpreter before this call (a session's later calls): any of
    /// the sandbox's JavaScript and Python may have been changed by it.
    pub tainted: bool,
    pub heap_exhausted: bool,
    pub budget_exceeded: bool,
    /// Why Pyodide failed fatally, if it did.
    pub fatal: Option<String>,
    /// The sandbox is kept for a session.
    pub session: bool,
}

/// The settings error messages name.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub timeout_ms: u128,
    pub setup_timeout_s: u64,
    /// The set-up was bounded by `timeout_ms` too (a session whose code has run).
    pub setup_within_timeout: bool,
    pub memory_limit_mb: u64,
    pub sandbox_memory_limit_mb: u64,
}

/// What the call's result says.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The runner's report stands; `collect_failure` says why the files could not be collected
    /// after it (the code changed the JavaScript environment).
    Reported {
        report: Report,
        collect_failure: Option<String>,
    },
    /// The call failed with this error.
    Failed(ExecError),
}

/// A call's classification.
#[derive(Debug)]
pub(crate) struct Classified {
    pub verdict: Verdict,
    pub timed_out: bool,
    /// A session's sandbox that can run nothing more, and why.
    pub end: Option<SandboxEnd>,
}

/// Classifies one call.
pub(crate) fn classify(observed: Observed, limits: Limits) -> Classified {
    let timed_out = matches!(
        observed.stopped,
        Some(Stop::Deadline(_) | Stop::Interrupted(Interrupt::Timeout))
    );
    let session = observed.session;
    let (verdict, end) = match stopped(&observed, &limits) {
        Some(stopped) => stopped,
        None => finished(observed),
    };
    // Only a session's sandbox lives on after a call; a stopped one-call sandbox is dropped anyway.
    let end = end.filter(|_| session);
    let verdict = match (verdict, end) {
        (Verdict::Failed(mut error), Some(_)) => {
            error.message.push_str("; the session has ended");
            Verdict::Failed(error)
        }
        (verdict, _) => verdict,
    };
    Classified {
        verdict,
        timed_out,
        end,
    }
}

fn fail(kind: ErrorKind, error_type: ErrorType, message: String) -> Verdict {
    Verdict::Failed(ExecError::new(kind, error_type, message))
}

/// A call that something stopped, or whose interpreter died: the error says what.
fn stopped(observed: &Observed, limits: &Limits) -> Option<(Verdict, Option<SandboxEnd>)> {
    let timeout_ms = limits.timeout_ms;
    Some(match observed.stopped {
        // Nothing but the code runs in the interpreter: whatever crashed it, the code caused, and
        // however the call then ended, the interpreter is gone.
        _ if observed.fatal.is_some() || observed.stopped == Some(Stop::Fatal) => (
            fail(
                ErrorKind::Python,
                ErrorType::InterpreterCrashed,
                format!(
                    "the Python interpreter failed fatally ({}): usually a WebAssembly stack overflow \
from code nested too deeply (split long expressions, lower the recursion), or a crash in a native \
extension; the interpreter cannot be used any more",
                    observed.fatal.as_deref().unwrap_or("no cause was given")
                ),
            ),
            Some(SandboxEnd::Crashed),
        ),
        Some(Stop::Interrupted(Interrupt::Timeout)) => (
            fail(
                ErrorKind::Timeout,
                ErrorType::TimeoutError,
                format!(
                    "execution exceeded timeout_ms = {timeout_ms} ms and was interrupted \
(KeyboardInterrupt); the session's state is kept"
                ),
            ),
            None,
        ),
        Some(Stop::Interrupted(Interrupt::Cancel)) => (
            fail(
                ErrorKind::Cancelled,
                ErrorType::Cancelled,
                "the client cancelled the call; the code was interrupted (KeyboardInterrupt) and the \
session's state is kept"
                    .into(),
            ),
            None,
        ),
        Some(Stop::Deadline(Phase::User)) if observed.session => (
            fail(
                ErrorKind::Timeout,
                ErrorType::TimeoutError,
                format!(
                    "execution exceeded timeout_ms = {timeout_ms} ms and did not stop within {} s of \
its interrupt (a long call outside Python); it was terminated",
                    INTERRUPT_GRACE.as_secs()
                ),
            ),
            Some(SandboxEnd::Timeout),
        ),
        Some(Stop::Deadline(Phase::User)) => (
            fail(
                ErrorKind::Timeout,
                ErrorType::TimeoutError,
                format!("execution exceeded timeout_ms = {timeout_ms} ms and was stopped"),
            ),
            None,
        ),
        Some(Stop::Deadline(_)) => (
            fail(
                ErrorKind::Timeout,
                ErrorType::SetupTimeout,
                setup_timeout_message(limits),
            ),
            Some(SandboxEnd::SetupTimeout),
        ),
        _ if observed.budget_exceeded || observed.stopped == Some(Stop::MemoryBudget) => (
            fail(
                ErrorKind::Python,
                ErrorType::MemoryLimitExceeded,
                format!(
                    "the sandbox exceeded its memory budget (workers.sandbox_memory_limit_mb = {} MiB: \
ArrayBuffers, in-memory files, network responses and Python's WebAssembly memory together)",
                    limits.sandbox_memory_limit_mb
                ),
            ),
            Some(SandboxEnd::Memory),
        ),
        _ if observed.heap_exhausted => (
            fail(
                ErrorKind::Python,
                ErrorType::MemoryLimitExceeded,
                format!(
                    "the sandbox exhausted its V8 heap budget (workers.memory_limit_mb = {} MiB)",
                    limits.memory_limit_mb
                ),
            ),
            Some(SandboxEnd::Memory),
        ),
        Some(Stop::Cancelled) => (
            fail(
                ErrorKind::Cancelled,
                ErrorType::Cancelled,
                "the client cancelled the call; its execution was stopped".into(),
            ),
            Some(SandboxEnd::Cancelled),
        ),
        _ => return None,
    })
}

fn setup_timeout_message(limits: &Limits) -> String {
    if limits.setup_within_timeout {
        format!(
            "setting up the call (writing its input files, loading the packages its imports need) \
exceeded its budget and was stopped: in a session whose code has already run, set-up is bounded by \
timeout_ms = {} ms too (at most workers.setup_timeout_s = {} s)",
            limits.timeout_ms, limits.setup_timeout_s
        )
    } else {
        format!(
            "setting up the call (writing its input files, loading the packages its imports need) \
exceeded workers.setup_timeout_s = {} s and was stopped",
            limits.setup_timeout_s
        )
    }
}

/// A call that ended by itself: the runner's report, or why there is none. A failure of the glue
/// after the code started (or in an interpreter the code changed before) is the code's doing: it
/// can change any JavaScript object it reaches.
fn finished(observed: Observed) -> (Verdict, Option<SandboxEnd>) {
    let Observed {
        returned,
        report,
        user_started,
        tainted,
        ..
    } = observed;
    let broken = (!user_started).then_some(SandboxEnd::Broken);
    match (returned, report) {
        (returned, Some(report)) => (
            Verdict::Reported {
                report,
                collect_failure: returned.and_then(Result::err).map(stalled_or),
            },
            None,
        ),
        (Some(Err(e)), None) if user_started || tainted => (
            fail(
                ErrorKind::Python,
                ErrorType::SandboxError,
                format!(
                    "the sandbox's JavaScript failed {} (did the code change the JavaScript \
environment?): {}",
                    if user_started {
                        "after the code started"
                    } else {
                        "before the code could start"
                    },
                    stalled_or(e)
                ),
            ),
            broken,
        ),
        (Some(Err(e)), None) => (
            fail(ErrorKind::Runtime, ErrorType::SandboxError, stalled_or(e)),
            None,
        ),
        (_, None) if user_started || tainted => (
            fail(
                ErrorKind::Python,
                ErrorType::SandboxError,
                "the code ended without a result (did it change the sandbox's runner?)".into(),
            ),
            broken,
        ),
        (_, None) => (
            fail(
                ErrorKind::Runtime,
                ErrorType::SandboxError,
                "the sandbox ended without a result".into(),
            ),
            None,
        ),
    }
}

/// deno_core's message for a promise nothing can settle, said as what the code did.
fn stalled_or(message: String) -> String {
    if message.contains("Promise resolution is still pending") {
        "the code awaited something that can never complete (the event loop ran out of work)".into()
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case: what was observed, and what the call must say.
    struct Case {
        name: &'static str,
        stopped: Option<Stop>,
        /// What `run()` returned: `Some("")` for `Ok`, `Some(text)` for an exception.
        returned: Option<&'static str>,
        /// The runner's report: success, or the name of the exception it raised.
        report: Option<Result<(), &'static str>>,
        user_started: bool,
        tainted: bool,
        heap_exhausted: bool,
        budget_exceeded: bool,
        fatal: Option<&'static str>,
        session: bool,
        /// The error's kind and type (`None`: a report stands, successful or not).
        error: Option<(ErrorKind, &'static str)>,
        timed_out: bool,
        end: Option<SandboxEnd>,
    }

    const BASE: Case = Case {
        name: "",
        stopped: None,
        returned: Some(""),
        report: None,
        user_started: true,
        tainted: false,
        heap_exhausted: false,
        budget_exceeded: false,
        fatal: None,
        session: false,
        error: None,
        timed_out: false,
        end: None,
    };

    const STACK: &str = "RangeError: Maximum call stack size exceeded";

    const CASES: &[Case] = &[
        Case {
            name: "success",
            report: Some(Ok(())),
            ..BASE
        },
        Case {
            name: "a Python exception",
            report: Some(Err("ValueError")),
            ..BASE
        },
        Case {
            name: "timeout, one-call sandbox",
            stopped: Some(Stop::Deadline(Phase::User)),
            returned: None,
            error: Some((ErrorKind::Timeout, "TimeoutError")),
            timed_out: true,
            ..BASE
        },
        Case {
            name: "timeout in a session, interrupted",
            stopped: Some(Stop::Interrupted(Interrupt::Timeout)),
            report: Some(Err("KeyboardInterrupt")),
            session: true,
            error: Some((ErrorKind::Timeout, "TimeoutError")),
            timed_out: true,
            ..BASE
        },
        Case {
            name: "timeout in a session, not answering the interrupt",
            stopped: Some(Stop::Deadline(Phase::User)),
            returned: None,
            session: true,
            error: Some((ErrorKind::Timeout, "TimeoutError")),
            timed_out: true,
            end: Some(SandboxEnd::Timeout),
            ..BASE
        },
        Case {
            name: "set-up past its budget",
            stopped: Some(Stop::Deadline(Phase::Setup)),
            returned: None,
            user_started: false,
            tainted: true,
            session: true,
            error: Some((ErrorKind::Timeout, "SetupTimeout")),
            timed_out: true,
            end: Some(SandboxEnd::SetupTimeout),
            ..BASE
        },
        Case {
            name: "cancelled in a session, interrupted",
            stopped: Some(Stop::Interrupted(Interrupt::Cancel)),
            session: true,
            error: Some((ErrorKind::Cancelled, "Cancelled")),
            ..BASE
        },
        Case {
            name: "cancelled, terminated",
            stopped: Some(Stop::Cancelled),
            returned: None,
            user_started: false,
            session: true,
            error: Some((ErrorKind::Cancelled, "Cancelled")),
            end: Some(SandboxEnd::Cancelled),
            ..BASE
        },
        Case {
            name: "memory budget",
            stopped: Some(Stop::MemoryBudget),
            returned: None,
            budget_exceeded: true,
            session: true,
            error: Some((ErrorKind::Python, "MemoryLimitExceeded")),
            end: Some(SandboxEnd::Memory),
            ..BASE
        },
        Case {
            name: "V8 heap",
            returned: Some("terminated"),
            heap_exhausted: true,
            error: Some((ErrorKind::Python, "MemoryLimitExceeded")),
            ..BASE
        },
        Case {
            name: "a fatal error before the clock started (the import scan)",
            returned: Some(STACK),
            user_started: false,
            fatal: Some(STACK),
            session: true,
            error: Some((ErrorKind::Python, "InterpreterCrashed")),
            end: Some(SandboxEnd::Crashed),
            ..BASE
        },
        Case {
            name: "a fatal error, then the deadline",
            stopped: Some(Stop::Interrupted(Interrupt::Timeout)),
            fatal: Some(STACK),
            session: true,
            error: Some((ErrorKind::Python, "InterpreterCrashed")),
            timed_out: true,
            end: Some(SandboxEnd::Crashed),
            ..BASE
        },
        Case {
            name: "glue failure after the code started",
            returned: Some("TypeError: x"),
            error: Some((ErrorKind::Python, "SandboxError")),
            ..BASE
        },
        Case {
            name: "glue failure before the code, in a session the code changed",
            returned: Some("[object Object]"),
            user_started: false,
            tainted: true,
            session: true,
            error: Some((ErrorKind::Python, "SandboxError")),
            end: Some(SandboxEnd::Broken),
            ..BASE
        },
        Case {
            name: "glue failure in a fresh sandbox: the server's fault",
            returned: Some("TypeError: x"),
            user_started: false,
            error: Some((ErrorKind::Runtime, "SandboxError")),
            ..BASE
        },
        Case {
            name: "a replaced runner that reports nothing",
            user_started: false,
            tainted: true,
            session: true,
            error: Some((ErrorKind::Python, "SandboxError")),
            end: Some(SandboxEnd::Broken),
            ..BASE
        },
        Case {
            name: "no result from a fresh sandbox",
            user_started: false,
            error: Some((ErrorKind::Runtime, "SandboxError")),
            ..BASE
        },
        Case {
            name: "a report, then collecting files failed",
            returned: Some("broken stream"),
            report: Some(Ok(())),
            ..BASE
        },
        Case {
            name: "a report whose message says the session has ended is only a report",
            report: Some(Err("the session has ended")),
            session: true,
            ..BASE
        },
    ];

    fn observed(case: &Case) -> Observed {
        Observed {
            stopped: case.stopped,
            returned: case.returned.map(|text| {
                if text.is_empty() {
                    Ok(())
                } else {
                    Err(text.to_string())
                }
            }),
            report: case.report.map(|report| Report {
                success: report.is_ok(),
                result: report.is_ok().then(|| "1".to_string()),
                result_truncated: false,
                error_type: report.err().map(str::to_string),
                message: report.err().map(str::to_string),
                traceback: None,
            }),
            user_started: case.user_started,
            tainted: case.tainted,
            heap_exhausted: case.heap_exhausted,
            budget_exceeded: case.budget_exceeded,
            fatal: case.fatal.map(str::to_string),
            session: case.session,
        }
    }

    #[test]
    fn every_ending_is_classified_by_who_caused_it() {
        for case in CASES {
            let c = classify(observed(case), Limits::default());
            let name = case.name;
            assert_eq!(c.timed_out, case.timed_out, "{name}");
            assert_eq!(c.end, case.end, "{name}");
            match (&c.verdict, case.error) {
                (Verdict::Reported { report, .. }, None) => {
                    assert_eq!(report.success, case.report == Some(Ok(())), "{name}")
                }
                (Verdict::Failed(e), Some((kind, error_type))) => {
                    assert_eq!(e.kind, kind, "{name}");
                    assert_eq!(e.error_type, error_type, "{name}");
                    assert_eq!(
                        e.message.ends_with("the session has ended"),
                        case.end.is_some(),
                        "{name}: {}",
                        e.message
                    );
                }
                (verdict, error) => panic!("{name}: {verdict:?} against {error:?}"),
            }
        }
    }
}
