//! Every tool call's record when it ends: its metric, its log line (never code, file contents,
//! paths or a whole session id) and the end of its trace span with the outcome.

use std::time::{Duration, Instant};

use crate::sessions::Caller;
use crate::telemetry::{self, ToolOutcome};

tokio::task_local! {
    /// Who makes the call whose future this is (see [`as_caller`]).
    static CALLER: Caller;
}

/// Runs `future` (a tool call, or a task's run) as `caller`'s: its record names it.
pub(super) async fn as_caller<F: std::future::Future>(caller: Caller, future: F) -> F::Output {
    CALLER.scope(caller, future).await
}

/// What a tool call's log line says beyond its tool, outcome and duration.
#[derive(Debug, Default)]
pub(crate) struct Details<'a> {
    pub queue_wait: Option<Duration>,
    pub execution: Option<Duration>,
    pub output_truncated: Option<bool>,
    /// The session the call ran in (logged shortened).
    pub session: Option<&'a str>,
    /// How many snippets a search returned.
    pub results: Option<usize>,
    /// Whether a snippet was found.
    pub found: Option<bool>,
}

/// Ends a tool call: its metric, log line and span.
pub(crate) fn record(tool: &'static str, outcome: ToolOutcome, started: Instant, details: Details) {
    let elapsed = started.elapsed();
    let who = CALLER.try_with(Caller::clone).unwrap_or_default();
    let principal = who.principal;
    let profile = who.profile.as_deref();
    // The label of logs and spans: a named token's name, else a hash (never the token or subject).
    let label = match (profile.and_then(|p| p.name.as_deref()), principal) {
        (Some(name), _) => Some(name.to_string()),
        (None, Some(principal)) => Some(principal.label()),
        (None, None) => None,
    };
    let metric = match (profile, principal) {
        (Some(profile), _) => profile.metric_label(),
        (None, Some(_)) => "token",
        (None, None) => "anonymous",
    };
    telemetry::tool_call(tool, outcome, elapsed, metric);
    let span = telemetry::traces::current();
    if let Some(label) = &label
        && telemetry::traces::principal_attribute()
    {
        span.set(vec![opentelemetry::KeyValue::new(
            "code_interpreter.principal",
            label.clone(),
        )]);
    }
    let failed = !matches!(outcome, ToolOutcome::Success);
    span.end(outcome.label(), failed.then(|| outcome.label()));
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
    tracing::info!(
        tool,
        outcome = outcome.label(),
        total_ms = elapsed.as_millis() as u64,
        queue_wait_ms = ms(details.queue_wait),
        execution_ms = ms(details.execution),
        output_truncated = details.output_truncated,
        session = details.session.map(crate::sessions::short),
        results = details.results,
        found = details.found,
        principal = label,
        "tool call"
    );
}
