//! How a call ended, decided once from what was observed (the watchdog's stop, what `run()` returned,
//! the runner's report, the memory flags, a fatal interpreter error) by who caused it: a pure function
//! with a table-driven test. Anything the user's code caused is `python` (or `timeout`, or
//! `cancelled`); `runtime` is left for the server's own faults. For a sandbox kept for a session it
//! also says whether the sandbox can run anything more ([`SandboxEnd`]), as a type: no message text
//! decides it.

use super::output::Report;
use super::types::{ErrorKind, ErrorType, ExecError, SandboxEnd};
use super::watchdog::{INTERRUPT_GRACE, Interrupt, Phase, Stop};

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
    let Observed {
        stopped,
        returned,
        report,
        user_started,
        tainted,
        heap_exhausted,
        budget_exceeded,
        fatal,
        session,
    } = observed;
    let timeout_ms = limits.timeout_ms;
    let fail = |kind, error_type, message: String| {
        Verdict::Failed(ExecError::new(kind, error_type, message))
    };
    let (verdict, end) = match stopped {
        // Nothing but the code runs in the interpreter: whatever crashed it, the code caused, and
        // however the call then ended, the interpreter is gone.
        _ if fatal.is_some() || stopped == Some(Stop::Fatal) => (
            fail(
                ErrorKind::Python,
                ErrorType::InterpreterCrashed,
                format!(
                    "the Python interpreter failed fatally ({}): usually a WebAssembly stack overflow \
from code nested too deeply (split long expressions, lower the recursion), or a crash in a native \
extension; the interpreter cannot be used any more",
                    fatal.as_deref().unwrap_or("no cause was given")
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
        Some(Stop::Deadline(Phase::User)) if session => (
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
                if limits.setup_within_timeout {
                    format!(
                        "setting up the call (writing its input files, loading the packages its \
imports need) exceeded its budget and was stopped: in a session whose code has already run, set-up \
is bounded by timeout_ms = {timeout_ms} ms too (at most workers.setup_timeout_s = {} s)",
                        limits.setup_timeout_s
                    )
                } else {
                    format!(
                        "setting up the call (writing its input files, loading the packages its \
imports need) exceeded workers.setup_timeout_s = {} s and was stopped",
                        limits.setup_timeout_s
                    )
                },
            ),
            Some(SandboxEnd::SetupTimeout),
        ),
        _ if budget_exceeded || stopped == Some(Stop::MemoryBudget) => (
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
        _ if heap_exhausted => (
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
        _ => match (returned, report) {
            (returned, Some(report)) => (
                Verdict::Reported {
                    report,
                    collect_failure: returned.and_then(Result::err).map(stalled_or),
                },
                None,
            ),
            // The sandbox's own JavaScript failed after the code started (or in an interpreter the
            // code had changed before): something the code did (it can change any JavaScript
            // object it reaches) made it fail.
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
                (!user_started).then_some(SandboxEnd::Broken),
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
                (!user_started).then_some(SandboxEnd::Broken),
            ),
            (_, None) => (
                fail(
                    ErrorKind::Runtime,
                    ErrorType::SandboxError,
                    "the sandbox ended without a result".into(),
                ),
                None,
            ),
        },
    };
    let timed_out = matches!(
        stopped,
        Some(Stop::Deadline(_) | Stop::Interrupted(Interrupt::Timeout))
    );
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

    fn report(success: bool) -> Report {
        Report {
            success,
            result: success.then(|| "1".to_string()),
            result_truncated: false,
            error_type: (!success).then(|| "ValueError".to_string()),
            message: (!success).then(|| "bad".to_string()),
            traceback: None,
        }
    }

    /// (case, observed) → (kind or None for success, error type, timed out, session end).
    #[test]
    fn every_ending_is_classified_by_who_caused_it() {
        type Row = (
            &'static str,
            Observed,
            Option<ErrorKind>,
            &'static str,
            bool,
            Option<SandboxEnd>,
        );
        let session = |o: Observed| Observed { session: true, ..o };
        let rows: Vec<Row> = vec![
            (
                "success",
                Observed {
                    returned: Some(Ok(())),
                    report: Some(report(true)),
                    user_started: true,
                    ..Default::default()
                },
                None,
                "",
                false,
                None,
            ),
            (
                "a Python exception",
                Observed {
                    returned: Some(Ok(())),
                    report: Some(report(false)),
                    user_started: true,
                    ..Default::default()
                },
                Some(ErrorKind::Python),
                "ValueError",
                false,
                None,
            ),
            (
                "timeout, one-call sandbox",
                Observed {
                    stopped: Some(Stop::Deadline(Phase::User)),
                    user_started: true,
                    ..Default::default()
                },
                Some(ErrorKind::Timeout),
                "TimeoutError",
                true,
                None,
            ),
            (
                "timeout in a session, interrupted",
                session(Observed {
                    stopped: Some(Stop::Interrupted(Interrupt::Timeout)),
                    report: Some(report(false)),
                    user_started: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Timeout),
                "TimeoutError",
                true,
                None,
            ),
            (
                "timeout in a session, not answering the interrupt",
                session(Observed {
                    stopped: Some(Stop::Deadline(Phase::User)),
                    user_started: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Timeout),
                "TimeoutError",
                true,
                Some(SandboxEnd::Timeout),
            ),
            (
                "set-up past its budget",
                session(Observed {
                    stopped: Some(Stop::Deadline(Phase::Setup)),
                    tainted: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Timeout),
                "SetupTimeout",
                true,
                Some(SandboxEnd::SetupTimeout),
            ),
            (
                "cancelled in a session, interrupted",
                session(Observed {
                    stopped: Some(Stop::Interrupted(Interrupt::Cancel)),
                    user_started: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Cancelled),
                "Cancelled",
                false,
                None,
            ),
            (
                "cancelled, terminated",
                session(Observed {
                    stopped: Some(Stop::Cancelled),
                    ..Default::default()
                }),
                Some(ErrorKind::Cancelled),
                "Cancelled",
                false,
                Some(SandboxEnd::Cancelled),
            ),
            (
                "memory budget",
                session(Observed {
                    stopped: Some(Stop::MemoryBudget),
                    budget_exceeded: true,
                    user_started: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Python),
                "MemoryLimitExceeded",
                false,
                Some(SandboxEnd::Memory),
            ),
            (
                "V8 heap",
                Observed {
                    heap_exhausted: true,
                    returned: Some(Err("terminated".into())),
                    user_started: true,
                    ..Default::default()
                },
                Some(ErrorKind::Python),
                "MemoryLimitExceeded",
                false,
                None,
            ),
            (
                "a fatal error before the clock started (the import scan)",
                session(Observed {
                    returned: Some(Err("RangeError: Maximum call stack size exceeded".into())),
                    fatal: Some("RangeError: Maximum call stack size exceeded".into()),
                    ..Default::default()
                }),
                Some(ErrorKind::Python),
                "InterpreterCrashed",
                false,
                Some(SandboxEnd::Crashed),
            ),
            (
                "a fatal error, then the deadline",
                session(Observed {
                    stopped: Some(Stop::Interrupted(Interrupt::Timeout)),
                    fatal: Some("RangeError: Maximum call stack size exceeded".into()),
                    user_started: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Python),
                "InterpreterCrashed",
                true,
                Some(SandboxEnd::Crashed),
            ),
            (
                "glue failure after the code started",
                Observed {
                    returned: Some(Err("TypeError: x".into())),
                    user_started: true,
                    ..Default::default()
                },
                Some(ErrorKind::Python),
                "SandboxError",
                false,
                None,
            ),
            (
                "glue failure before the code, in a session the code changed",
                session(Observed {
                    returned: Some(Err("[object Object]".into())),
                    tainted: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Python),
                "SandboxError",
                false,
                Some(SandboxEnd::Broken),
            ),
            (
                "glue failure in a fresh sandbox: the server's fault",
                Observed {
                    returned: Some(Err("TypeError: x".into())),
                    ..Default::default()
                },
                Some(ErrorKind::Runtime),
                "SandboxError",
                false,
                None,
            ),
            (
                "a replaced runner that reports nothing",
                session(Observed {
                    returned: Some(Ok(())),
                    tainted: true,
                    ..Default::default()
                }),
                Some(ErrorKind::Python),
                "SandboxError",
                false,
                Some(SandboxEnd::Broken),
            ),
            (
                "no result from a fresh sandbox",
                Observed {
                    returned: Some(Ok(())),
                    ..Default::default()
                },
                Some(ErrorKind::Runtime),
                "SandboxError",
                false,
                None,
            ),
            (
                "a report, then collecting files failed",
                Observed {
                    returned: Some(Err("broken sort".into())),
                    report: Some(report(true)),
                    user_started: true,
                    ..Default::default()
                },
                None,
                "",
                false,
                None,
            ),
        ];
        for (case, observed, kind, error_type, timed_out, end) in rows {
            let session = observed.session;
            let c = classify(observed, Limits::default());
            assert_eq!(c.timed_out, timed_out, "{case}");
            assert_eq!(c.end, end, "{case}");
            match (&c.verdict, kind) {
                (Verdict::Reported { report, .. }, None) => assert!(report.success, "{case}"),
                (Verdict::Reported { report, .. }, Some(ErrorKind::Python)) => {
                    assert_eq!(report.error_type.as_deref(), Some(error_type), "{case}")
                }
                (Verdict::Failed(e), Some(kind)) => {
                    assert_eq!(e.kind, kind, "{case}");
                    assert_eq!(e.error_type, error_type, "{case}");
                    assert_eq!(
                        e.message.ends_with("the session has ended"),
                        session && end.is_some(),
                        "{case}: {}",
                        e.message
                    );
                }
                (verdict, kind) => panic!("{case}: {verdict:?} against {kind:?}"),
            }
        }
    }

    #[test]
    fn no_message_text_decides_an_ending() {
        // A report whose message says the session has ended is only a report.
        let mut said = report(false);
        said.message = Some("the session has ended".into());
        let c = classify(
            Observed {
                returned: Some(Ok(())),
                report: Some(said),
                user_started: true,
                session: true,
                ..Default::default()
            },
            Limits::default(),
        );
        assert_eq!(c.end, None);
    }
}
