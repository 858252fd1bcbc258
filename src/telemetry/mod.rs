//! Prometheus metrics: the twenty-eight `code_interpreter_mcp_` families recorded through the `metrics` facade,
//! the Prometheus recorder and its dedicated `/metrics` listener, and the five-second tokio-metrics
//! reporter for the main runtime. When metrics are disabled nothing is installed, so every recording
//! call below is a no-op; no listener opens and no reporter runs.
//!
//! Labels only ever take the fixed values of `labels.rs`: never code, paths, package names, URLs,
//! session ids or messages. Traces are in [`traces`], with the same rule for their attributes.

mod labels;
mod otlp_client;
pub mod traces;

pub use labels::*;

use std::net::SocketAddr;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const TOOL_CALLS: &str = "code_interpreter_mcp_tool_calls_total";
const TOOL_CALL_DURATION: &str = "code_interpreter_mcp_tool_call_duration_seconds";
const QUEUE_DEPTH: &str = "code_interpreter_mcp_execution_queue_depth";
const QUEUE_CAPACITY: &str = "code_interpreter_mcp_execution_queue_capacity";
const QUEUE_WAIT: &str = "code_interpreter_mcp_execution_queue_wait_seconds";
const WORKERS: &str = "code_interpreter_mcp_workers";
const PYTHON_DURATION: &str = "code_interpreter_mcp_python_execution_duration_seconds";
const ISOLATE_INIT: &str = "code_interpreter_mcp_isolate_initialization_duration_seconds";
const REJECTIONS: &str = "code_interpreter_mcp_execution_rejections_total";
const UNEXPECTED_EXITS: &str = "code_interpreter_mcp_worker_unexpected_exits_total";
const SESSIONS: &str = "code_interpreter_mcp_sessions";
const READY_SANDBOXES: &str = "code_interpreter_mcp_ready_sandboxes";
const SESSIONS_CREATED: &str = "code_interpreter_mcp_sessions_created_total";
const SESSIONS_ENDED: &str = "code_interpreter_mcp_sessions_ended_total";
const SESSIONS_RESIDENT: &str = "code_interpreter_mcp_sessions_resident";
const SESSIONS_SAVED: &str = "code_interpreter_mcp_sessions_saved";
const SESSION_SAVES: &str = "code_interpreter_mcp_session_saves_total";
const SESSION_RESUMES: &str = "code_interpreter_mcp_session_resumes_total";
const SESSION_SAVE_DURATION: &str = "code_interpreter_mcp_session_save_duration_seconds";
const SESSION_RESUME_DURATION: &str = "code_interpreter_mcp_session_resume_duration_seconds";
const SESSION_IMAGE_BYTES: &str = "code_interpreter_mcp_session_image_bytes";
const TASKS: &str = "code_interpreter_mcp_tasks";
const TASKS_ENDED: &str = "code_interpreter_mcp_tasks_ended_total";
const TASK_DURATION: &str = "code_interpreter_mcp_task_duration_seconds";
const UPSTREAM_CALLS: &str = "code_interpreter_mcp_upstream_calls_total";
const UPSTREAM_DURATION: &str = "code_interpreter_mcp_upstream_call_duration_seconds";
const AUTH_REFUSALS: &str = "code_interpreter_mcp_auth_refusals_total";
const KEYS_FETCHES: &str = "code_interpreter_mcp_authorization_keys_fetches_total";

/// Buckets of the Python execution histogram, in seconds.
pub const EXECUTION_BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Buckets of the queue-wait, isolate-initialisation and handler histograms: the above plus 300, 600.
pub const LONG_BUCKETS: [f64; 17] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];
/// Buckets of the session image size histogram (sealed bytes): 64 KiB to 1 GiB.
pub const IMAGE_BUCKETS: [f64; 9] = [
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    134217728.0,
    268435456.0,
    1073741824.0,
];
/// Buckets of the task-duration histogram: seconds to a day.
pub const TASK_BUCKETS: [f64; 12] = [
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 86400.0,
];

/// One completed (or cancelled) tool handler.
pub fn tool_call(tool: &'static str, outcome: ToolOutcome, duration: Duration, principal: &str) {
    if PRINCIPAL_LABEL.load(std::sync::atomic::Ordering::Relaxed) {
        let labels = [
            ("tool", tool.to_string()),
            ("outcome", outcome.label().to_string()),
            ("principal", principal.to_string()),
        ];
        counter!(TOOL_CALLS, &labels).increment(1);
        histogram!(TOOL_CALL_DURATION, &labels).record(duration.as_secs_f64());
        return;
    }
    let labels = [("tool", tool), ("outcome", outcome.label())];
    counter!(TOOL_CALLS, &labels).increment(1);
    histogram!(TOOL_CALL_DURATION, &labels).record(duration.as_secs_f64());
}

/// Whether the tool-call metrics carry a `principal` label (`integrations.prometheus
/// .principal_label`; set once at start).
static PRINCIPAL_LABEL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Labels the tool-call metrics by principal from now on.
pub fn label_principals() {
    PRINCIPAL_LABEL.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// One call to an upstream tool. `server` is a configured name and `tool` a granted tool's name
/// (or `other`): never anything the sandbox chose.
pub fn upstream_call(server: &str, tool: &str, outcome: UpstreamOutcome, duration: Duration) {
    counter!(
        UPSTREAM_CALLS,
        "server" => server.to_string(),
        "tool" => tool.to_string(),
        "outcome" => outcome.label()
    )
    .increment(1);
    histogram!(UPSTREAM_DURATION, "server" => server.to_string()).record(duration.as_secs_f64());
}

/// One /mcp request refused by authentication (401) or for a missing scope (403).
pub fn auth_refused(reason: AuthRefusal) {
    counter!(AUTH_REFUSALS, "reason" => reason.label()).increment(1);
}

/// One fetch of the authorization server's signing keys (with its metadata when discovered).
pub fn keys_fetched(outcome: KeysFetch) {
    counter!(KEYS_FETCHES, "outcome" => outcome.label()).increment(1);
}

pub fn rejection(reason: Rejection) {
    counter!(REJECTIONS, "reason" => reason.label()).increment(1);
}

pub fn queue_depth(depth: usize) {
    gauge!(QUEUE_DEPTH).set(depth as f64);
}

pub fn queue_wait(exit: QueueExit, waited: Duration) {
    histogram!(QUEUE_WAIT, "outcome" => exit.label()).record(waited.as_secs_f64());
}

/// A live worker moves from `from` (None: it just started) to `to` (None: it ended).
pub fn worker_state(from: Option<WorkerState>, to: Option<WorkerState>) {
    if let Some(from) = from {
        gauge!(WORKERS, "state" => from.label()).decrement(1.0);
    }
    if let Some(to) = to {
        gauge!(WORKERS, "state" => to.label()).increment(1.0);
    }
}

/// Python execution time (no queue wait, no initialisation) by outcome.
pub fn python_execution(outcome: ExecutionOutcome, duration: Duration) {
    histogram!(PYTHON_DURATION, "outcome" => outcome.label()).record(duration.as_secs_f64());
}

pub fn isolate_initialization(phase: InitPhase, success: bool, duration: Duration) {
    let outcome = if success {
        ExecutionOutcome::Success
    } else {
        ExecutionOutcome::RuntimeFailure
    };
    histogram!(ISOLATE_INIT, "phase" => phase.label(), "outcome" => outcome.label())
        .record(duration.as_secs_f64());
}

pub fn worker_unexpected_exit() {
    counter!(UNEXPECTED_EXITS).increment(1);
}

/// How many sessions are live.
/// Sandboxes booted and waiting in the workers' stocks changed by `delta`.
pub fn ready_sandboxes(delta: f64) {
    gauge!(READY_SANDBOXES).increment(delta);
}

pub fn sessions_live(live: usize) {
    gauge!(SESSIONS).set(live as f64);
}

/// A session was created; `live` now.
pub fn session_created(live: usize) {
    counter!(SESSIONS_CREATED).increment(1);
    sessions_live(live);
}

/// A session ended; `live` now.
pub fn session_ended(reason: SessionEnd, live: usize) {
    counter!(SESSIONS_ENDED, "reason" => reason.label()).increment(1);
    sessions_live(live);
}

/// Sessions in memory and saved in the store (of those this process knows).
pub fn sessions_placed(resident: usize, saved: usize) {
    gauge!(SESSIONS_RESIDENT).set(resident as f64);
    gauge!(SESSIONS_SAVED).set(saved as f64);
}

/// A session's save ended; with its duration and stored size when it was saved.
pub fn session_saved(outcome: SaveOutcome, duration: Duration, bytes: Option<u64>) {
    counter!(SESSION_SAVES, "outcome" => outcome.label()).increment(1);
    if outcome == SaveOutcome::Saved {
        histogram!(SESSION_SAVE_DURATION).record(duration.as_secs_f64());
    }
    if let Some(bytes) = bytes {
        histogram!(SESSION_IMAGE_BYTES).record(bytes as f64);
    }
}

/// A session's resume ended; with its duration when it resumed.
pub fn session_resumed(outcome: ResumeOutcome, duration: Duration) {
    counter!(SESSION_RESUMES, "outcome" => outcome.label()).increment(1);
    if outcome == ResumeOutcome::Resumed {
        histogram!(SESSION_RESUME_DURATION).record(duration.as_secs_f64());
    }
}

/// Tasks waiting for a running slot.
pub fn tasks_waiting(n: usize) {
    gauge!(TASKS, "state" => "waiting").set(n as f64);
}

/// Tasks not yet ended (waiting or running).
pub fn tasks_working(n: usize) {
    gauge!(TASKS, "state" => "working").set(n as f64);
}

/// One task ended, after `duration` from its creation.
pub fn task_ended(end: TaskEnd, duration: Duration) {
    counter!(TASKS_ENDED, "status" => end.label()).increment(1);
    histogram!(TASK_DURATION, "status" => end.label()).record(duration.as_secs_f64());
}

/// Why metrics could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the Prometheus recorder: {0}")]
    Recorder(String),
    #[error("cannot bind the Prometheus listener on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Installs the recorder, registers every family at zero, binds the `/metrics` listener and starts
/// the tokio reporter. Must run inside the main tokio runtime, before Python initialisation.
pub async fn start(addr: SocketAddr, queue_capacity: u64) -> Result<SocketAddr, TelemetryError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Bind { addr, source })?;
    let handle = install().map_err(|e| TelemetryError::Recorder(e.to_string()))?;
    register_families(queue_capacity);

    let local = listener.local_addr().unwrap_or(addr);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get({
            let handle = handle.clone();
            move || {
                let handle = handle.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        handle.render(),
                    )
                }
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "Prometheus listener failed");
        }
    });
    tokio::spawn(report_tokio_runtime(handle));
    tracing::info!(%local, "Prometheus metrics at /metrics");
    Ok(local)
}

fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let mut builder = PrometheusBuilder::new();
    builder = builder
        .set_buckets_for_metric(Matcher::Full(PYTHON_DURATION.into()), &EXECUTION_BUCKETS)?;
    builder = builder.set_buckets_for_metric(Matcher::Full(TASK_DURATION.into()), &TASK_BUCKETS)?;
    builder = builder
        .set_buckets_for_metric(Matcher::Full(SESSION_IMAGE_BYTES.into()), &IMAGE_BUCKETS)?;
    for name in [SESSION_SAVE_DURATION, SESSION_RESUME_DURATION] {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.into()), &EXECUTION_BUCKETS)?;
    }
    for name in [
        QUEUE_WAIT,
        ISOLATE_INIT,
        TOOL_CALL_DURATION,
        UPSTREAM_DURATION,
    ] {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.into()), &LONG_BUCKETS)?;
    }
    builder.install_recorder()
}

/// Counters and gauges start at zero (queue capacity at its configured value); histograms are
/// registered without observations.
fn register_families(queue_capacity: u64) {
    metrics::describe_counter!(TOOL_CALLS, "Completed or cancelled tool handlers");
    metrics::describe_counter!(
        UPSTREAM_CALLS,
        "Calls from sandboxes to upstream MCP tools, by server, tool and outcome"
    );
    metrics::describe_histogram!(
        UPSTREAM_DURATION,
        metrics::Unit::Seconds,
        "Duration of calls from sandboxes to upstream MCP tools"
    );
    metrics::describe_histogram!(
        TOOL_CALL_DURATION,
        metrics::Unit::Seconds,
        "Tool handler entry to completion, including queue wait and initialisation"
    );
    metrics::describe_gauge!(QUEUE_DEPTH, "Jobs waiting for a worker");
    metrics::describe_gauge!(QUEUE_CAPACITY, "Configured maximum waiting jobs");
    metrics::describe_histogram!(
        QUEUE_WAIT,
        metrics::Unit::Seconds,
        "Enqueue until removal from the queue"
    );
    metrics::describe_gauge!(WORKERS, "Live workers by state");
    metrics::describe_histogram!(
        PYTHON_DURATION,
        metrics::Unit::Seconds,
        "Python execution time, excluding queue wait and initialisation"
    );
    metrics::describe_histogram!(
        ISOLATE_INIT,
        metrics::Unit::Seconds,
        "Isolate and Pyodide initialisation time"
    );
    metrics::describe_counter!(REJECTIONS, "Submissions rejected before execution");
    metrics::describe_counter!(
        UNEXPECTED_EXITS,
        "Worker exits outside normal shutdown, panics included"
    );
    metrics::describe_gauge!(SESSIONS, "Live sessions");
    metrics::describe_gauge!(
        READY_SANDBOXES,
        "Sandboxes booted and ready in the workers' stocks"
    );
    metrics::describe_counter!(SESSIONS_CREATED, "Sessions created");
    metrics::describe_counter!(SESSIONS_ENDED, "Sessions ended, by reason");
    metrics::describe_gauge!(SESSIONS_RESIDENT, "Sessions in memory");
    metrics::describe_gauge!(
        SESSIONS_SAVED,
        "Sessions saved in the store and out of memory (of those this process knows)"
    );
    metrics::describe_counter!(
        SESSION_SAVES,
        "Session saves (spills, shutdown), by outcome"
    );
    metrics::describe_counter!(
        SESSION_RESUMES,
        "Session resumes from the store, by outcome"
    );
    metrics::describe_histogram!(
        SESSION_SAVE_DURATION,
        metrics::Unit::Seconds,
        "Saving a session: its image made, sealed and stored"
    );
    metrics::describe_histogram!(
        SESSION_RESUME_DURATION,
        metrics::Unit::Seconds,
        "Resuming a session: lease, image loaded and opened, sandbox restored"
    );
    metrics::describe_histogram!(
        SESSION_IMAGE_BYTES,
        metrics::Unit::Bytes,
        "Sealed session image size as stored"
    );
    metrics::describe_gauge!(
        TASKS,
        "Tasks not yet ended (working) and those waiting for a running slot (waiting)"
    );
    metrics::describe_counter!(TASKS_ENDED, "Tasks ended, by status");
    metrics::describe_histogram!(
        TASK_DURATION,
        metrics::Unit::Seconds,
        "Task lifetime from creation to its end, by status"
    );

    metrics::describe_counter!(
        AUTH_REFUSALS,
        "Requests to /mcp refused by authentication (401) or for a missing scope (403), by reason"
    );
    metrics::describe_counter!(
        KEYS_FETCHES,
        "Fetches of the OAuth authorization server's signing keys, by outcome"
    );
    for reason in AuthRefusal::ALL {
        counter!(AUTH_REFUSALS, "reason" => reason.label()).absolute(0);
    }
    for outcome in KeysFetch::ALL {
        counter!(KEYS_FETCHES, "outcome" => outcome.label()).absolute(0);
    }
    for tool in TOOLS {
        for outcome in ToolOutcome::ALL {
            let labels = [("tool", tool), ("outcome", outcome.label())];
            counter!(TOOL_CALLS, &labels).absolute(0);
            let _ = histogram!(TOOL_CALL_DURATION, &labels);
        }
    }
    gauge!(QUEUE_DEPTH).set(0.0);
    gauge!(QUEUE_CAPACITY).set(queue_capacity as f64);
    for exit in QueueExit::ALL {
        let _ = histogram!(QUEUE_WAIT, "outcome" => exit.label());
    }
    for state in WorkerState::ALL {
        gauge!(WORKERS, "state" => state.label()).set(0.0);
    }
    for outcome in ExecutionOutcome::ALL {
        let _ = histogram!(PYTHON_DURATION, "outcome" => outcome.label());
    }
    for phase in InitPhase::ALL {
        for outcome in [ExecutionOutcome::Success, ExecutionOutcome::RuntimeFailure] {
            let _ =
                histogram!(ISOLATE_INIT, "phase" => phase.label(), "outcome" => outcome.label());
        }
    }
    for reason in Rejection::ALL {
        counter!(REJECTIONS, "reason" => reason.label()).absolute(0);
    }
    counter!(UNEXPECTED_EXITS).absolute(0);
    gauge!(SESSIONS).set(0.0);
    gauge!(READY_SANDBOXES).set(0.0);
    counter!(SESSIONS_CREATED).absolute(0);
    for reason in SessionEnd::ALL {
        counter!(SESSIONS_ENDED, "reason" => reason.label()).absolute(0);
    }
    gauge!(SESSIONS_RESIDENT).set(0.0);
    gauge!(SESSIONS_SAVED).set(0.0);
    for outcome in SaveOutcome::ALL {
        counter!(SESSION_SAVES, "outcome" => outcome.label()).absolute(0);
    }
    for outcome in ResumeOutcome::ALL {
        counter!(SESSION_RESUMES, "outcome" => outcome.label()).absolute(0);
    }
    let _ = histogram!(SESSION_SAVE_DURATION);
    let _ = histogram!(SESSION_RESUME_DURATION);
    let _ = histogram!(SESSION_IMAGE_BYTES);
    for state in ["working", "waiting"] {
        gauge!(TASKS, "state" => state).set(0.0);
    }
    for end in TaskEnd::ALL {
        counter!(TASKS_ENDED, "status" => end.label()).absolute(0);
        let _ = histogram!(TASK_DURATION, "status" => end.label());
    }
}

/// Every five seconds: the main runtime's stable tokio-metrics as gauges (park counts and busy
/// durations describe the last interval), and the exporter's upkeep.
async fn report_tokio_runtime(handle: PrometheusHandle) {
    for (name, help) in [
        (
            "tokio_workers_count",
            "Worker threads of the main Tokio runtime",
        ),
        (
            "tokio_live_tasks_count",
            "Alive tasks in the main Tokio runtime",
        ),
        (
            "tokio_global_queue_depth",
            "Tasks in the main Tokio runtime's global queue",
        ),
        (
            "tokio_total_park_count",
            "Worker parks in the last interval, all workers",
        ),
        (
            "tokio_min_park_count",
            "Worker parks in the last interval, least-parked worker",
        ),
        (
            "tokio_max_park_count",
            "Worker parks in the last interval, most-parked worker",
        ),
        (
            "tokio_total_busy_duration_seconds",
            "Busy time in the last interval, all workers",
        ),
        (
            "tokio_min_busy_duration_seconds",
            "Busy time in the last interval, least-busy worker",
        ),
        (
            "tokio_max_busy_duration_seconds",
            "Busy time in the last interval, busiest worker",
        ),
        (
            "tokio_busy_ratio",
            "Fraction of available worker time spent busy in the last interval",
        ),
    ] {
        metrics::describe_gauge!(name, help);
    }
    let monitor = tokio_metrics::RuntimeMonitor::new(&tokio::runtime::Handle::current());
    let mut intervals = monitor.intervals();
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    loop {
        ticker.tick().await;
        let Some(m) = intervals.next() else { break };
        gauge!("tokio_workers_count").set(m.workers_count as f64);
        gauge!("tokio_live_tasks_count").set(m.live_tasks_count as f64);
        gauge!("tokio_global_queue_depth").set(m.global_queue_depth as f64);
        gauge!("tokio_total_park_count").set(m.total_park_count as f64);
        gauge!("tokio_min_park_count").set(m.min_park_count as f64);
        gauge!("tokio_max_park_count").set(m.max_park_count as f64);
        gauge!("tokio_total_busy_duration_seconds").set(m.total_busy_duration.as_secs_f64());
        gauge!("tokio_min_busy_duration_seconds").set(m.min_busy_duration.as_secs_f64());
        gauge!("tokio_max_busy_duration_seconds").set(m.max_busy_duration.as_secs_f64());
        gauge!("tokio_busy_ratio").set(m.busy_ratio());
        handle.run_upkeep();
    }
}
