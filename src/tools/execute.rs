//! One `run_python_code` execution after its arguments are parsed: validation (the synchronous cap
//! on `timeout_ms`, or a task's), then the worker pool or a session, with what the caller streams
//! while it runs: progress notices (queue position, a heartbeat) and, when a [`LiveOutput`] is given,
//! the output as it is written (at most one notice every 250 ms, at most 4 KiB each). Cancelling
//! (dropping the future, or the setup's token) stops the call: a queued job leaves the queue, a
//! running one is stopped (a session's code interrupted first).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use tokio_util::sync::CancellationToken;

use super::quotas::{QuotaError, Quotas};
use super::text::{self, Kept};
use super::validation::{FileInput, InputLimits, validate};
use crate::pool::{Completed, ExecPool, Lane, Ticket};
use crate::pool::{JobError, SubmitError};
use crate::protocol::limits::MAX_TIMEOUT_MS;
use crate::sandbox::{ExecRequest, ExecResult, LiveOutput};
use crate::sessions::{Caller, KeepOutputs, Principal, Profile, SessionError, Sessions};
use crate::telemetry::ToolOutcome;
use crate::telemetry::traces;
use crate::telemetry::{self, Rejection};

/// First queue-position notice after this long in the queue.
const FIRST_QUEUE_NOTICE: Duration = Duration::from_secs(1);
/// Then a notice (queued: position; running: elapsed time) this often.
const NOTICE_INTERVAL: Duration = Duration::from_secs(5);
/// Streamed output goes out at most this often.
const OUTPUT_INTERVAL: Duration = Duration::from_millis(250);

/// Where progress notifications for one call go.
#[derive(Clone)]
pub struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    sent: Arc<AtomicU32>,
}

impl Progress {
    /// The progress token of `context`'s request, if it sent one.
    pub fn of(context: &RequestContext<RoleServer>) -> Option<Self> {
        context.meta.get_progress_token().map(|token| Self {
            peer: context.peer.clone(),
            token,
            sent: Arc::default(),
        })
    }

    /// Sends one notice; `progress` counts notices so that it only increases, as MCP requires.
    async fn notify(&self, message: String) {
        let sent = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        let param = ProgressNotificationParam::new(self.token.clone(), f64::from(sent))
            .with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!(error = %e, "progress notification not delivered");
        }
    }
}

/// How one call runs beside its arguments.
pub struct Setup {
    pub caller: Caller,
    /// Progress notices (and streamed output) go here.
    pub progress: Option<Progress>,
    /// Cancelling it stops the call.
    pub cancelled: CancellationToken,
    /// The largest `timeout_ms` allowed: the synchronous cap, or a task's.
    pub max_timeout_ms: u64,
    /// The output as it is written, for a caller that streams it (made here when `progress` is
    /// set and none is given).
    pub live: Option<Arc<LiveOutput>>,
}

impl Setup {
    /// A synchronous call of `context`'s request.
    pub fn of(context: Option<&RequestContext<RoleServer>>) -> Self {
        Self {
            caller: caller(context),
            progress: context.and_then(Progress::of),
            cancelled: context.map(|c| c.ct.clone()).unwrap_or_default(),
            max_timeout_ms: MAX_TIMEOUT_MS,
            live: None,
        }
    }
}

/// One run_python_code call as the runner takes it (from the tool's arguments).
#[derive(Debug)]
pub struct Call {
    pub code: String,
    pub files: Vec<FileInput>,
    pub timeout_ms: u64,
    pub session_id: Option<String>,
    /// Rows of a table's grid data (see `ExecRequest::grid_rows`).
    pub grid_rows: u32,
}

/// How a call ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ran in a sandbox.
    Executed(ExecResult),
    /// It did not run.
    Refused(Refusal),
}

/// Why a call did not run.
#[derive(Debug)]
pub enum Refusal {
    Invalid(String),
    Queue(SubmitError),
    Job(JobError),
    Session(SessionError),
    /// A task could not be queued (its queue, or the tasks kept, are full).
    TaskQueue(String),
    /// The caller's principal is over a quota.
    Quota(QuotaError),
    Cancelled,
}

impl Outcome {
    /// The tool-call metric's outcome: the one mapping from a call to its label.
    pub fn metric(&self) -> ToolOutcome {
        match self {
            Outcome::Executed(result) => result.outcome().into(),
            Outcome::Refused(Refusal::Invalid(_)) => ToolOutcome::ValidationError,
            Outcome::Refused(Refusal::Queue(SubmitError::Overloaded { .. })) => {
                ToolOutcome::Overload
            }
            Outcome::Refused(Refusal::Cancelled) => ToolOutcome::Cancelled,
            Outcome::Refused(Refusal::TaskQueue(_) | Refusal::Quota(_)) => ToolOutcome::Overload,
            Outcome::Refused(Refusal::Session(
                SessionError::NotFound(_)
                | SessionError::Ended { .. }
                | SessionError::OtherReplica { .. }
                | SessionError::Unrestorable { .. }
                | SessionError::NotDurable { .. },
            )) => ToolOutcome::ValidationError,
            Outcome::Refused(Refusal::Session(
                SessionError::TooMany { .. }
                | SessionError::TooManyOwned { .. }
                | SessionError::TooManyResident { .. }
                | SessionError::Busy { .. }
                | SessionError::Elsewhere { .. },
            )) => ToolOutcome::Overload,
            Outcome::Refused(Refusal::Queue(_) | Refusal::Job(_) | Refusal::Session(_)) => {
                ToolOutcome::RuntimeFailure
            }
        }
    }
}

/// A call's outcome, where its time went, and the session it ran in.
pub struct Ended {
    pub outcome: Outcome,
    pub queue_wait: Duration,
    pub execution: Duration,
    pub session_id: Option<String>,
    /// Why its session cannot be saved (as of the end of the call), if it ran in one that cannot.
    pub unsaveable: Option<String>,
    /// The session files that hold the whole of its long outputs.
    pub kept: Kept,
}

impl Ended {
    pub fn refused(refusal: Refusal) -> Self {
        Self {
            outcome: Outcome::Refused(refusal),
            queue_wait: Duration::ZERO,
            execution: Duration::ZERO,
            session_id: None,
            unsaveable: None,
            kept: Kept::default(),
        }
    }
}

/// What runs a call: the pool, the sessions, the input limits and the text budget.
pub struct Runner<'a> {
    pub pool: &'a ExecPool,
    pub quotas: &'a Arc<Quotas>,
    pub sessions: Option<&'a Sessions>,
    pub limits: InputLimits,
    pub max_text_chars: usize,
}

/// The pool's queue lane of a caller: its bearer token (callers are served in turn, so one token's
/// burst does not hold up another's calls), or one lane for every call without a token.
pub(super) fn queue_lane(caller: &Caller) -> u64 {
    caller.principal.map_or(0, |Principal(digest)| {
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    })
}

/// The error of a `timeout_ms` over the synchronous cap, or over a task's.
fn timeout_refusal(timeout_ms: u64, max_timeout_ms: u64) -> String {
    if max_timeout_ms <= MAX_TIMEOUT_MS && timeout_ms > MAX_TIMEOUT_MS {
        format!(
            "timeout_ms = {timeout_ms} is over the {MAX_TIMEOUT_MS} ms of a synchronous call: run it \
as a task (declare the io.modelcontextprotocol/tasks extension; the result is then polled with \
tasks/get), where timeout_ms may be up to tasks.max_timeout_ms"
        )
    } else {
        format!("timeout_ms must be between 1 and {max_timeout_ms}, got {timeout_ms}")
    }
}

impl Runner<'_> {
    /// Validates the arguments, queues the execution (or runs it in its session) and waits for it,
    /// streaming what `setup` asks for.
    pub async fn execute(&self, args: Call, setup: Setup) -> Ended {
        let admitted = match self.quotas.admit(&setup.caller) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                telemetry::rejection(Rejection::Quota);
                return Ended::refused(Refusal::Quota(refusal));
            }
        };
        let ended = self.execute_for(args, setup).await;
        admitted.charge(ended.execution);
        ended
    }

    async fn execute_for(&self, args: Call, setup: Setup) -> Ended {
        if !(1..=setup.max_timeout_ms).contains(&args.timeout_ms) {
            return invalid(timeout_refusal(args.timeout_ms, setup.max_timeout_ms));
        }
        let files = match validate(&args.code, &args.files, self.limits) {
            Ok(files) => files,
            Err(message) => return invalid(message),
        };
        let live = setup
            .live
            .clone()
            .or_else(|| setup.progress.as_ref().map(|_| Arc::default()));
        let span = traces::current();
        span.set(vec![
            KeyValue::new("code_interpreter.code_bytes", args.code.len() as i64),
            KeyValue::new("code_interpreter.input_files", files.len() as i64),
            KeyValue::new(
                "code_interpreter.input_bytes",
                files.iter().map(|f| f.content.len() as i64).sum::<i64>(),
            ),
            KeyValue::new("code_interpreter.session", args.session_id.is_some()),
        ]);
        let request = ExecRequest {
            code: args.code,
            files,
            timeout: Duration::from_millis(args.timeout_ms),
            live: live.clone(),
            grid_rows: args.grid_rows,
            trace: span.context(),
        };
        let stream = stream_output(setup.progress.clone(), live);
        let cancelled = setup.cancelled.clone();
        let run = async {
            match args.session_id {
                Some(session_id) => self.in_session(session_id, request, &setup).await,
                None => self.stateless(request, &setup).await,
            }
        };
        tokio::select! {
            ended = run => ended,
            () = stream => unreachable!("streaming output never ends"),
            _ = cancelled.cancelled() => Ended::refused(Refusal::Cancelled),
        }
    }

    async fn stateless(&self, request: ExecRequest, setup: &Setup) -> Ended {
        let submitted = std::time::Instant::now();
        let lane = queue_lane(&setup.caller);
        let caller = &setup.caller;
        let lane = Lane {
            id: lane,
            weight: self.quotas.weight(caller),
            max_queued: self.quotas.max_queued(caller),
        };
        let ticket = match self.pool.submit_as(lane, request) {
            Ok(ticket) => ticket,
            Err(SubmitError::LaneFull { waiting, max }) => {
                telemetry::rejection(Rejection::Quota);
                let principal = setup.caller.principal;
                let refusal = self.quotas.queue_refusal(principal, waiting, max);
                return Ended::refused(Refusal::Quota(refusal));
            }
            Err(error) => return Ended::refused(Refusal::Queue(error)),
        };
        let completed = wait_with_progress(ticket, setup.progress.clone()).await;
        trace_worker_time(submitted, &completed);
        Ended {
            outcome: match completed.result {
                Ok(result) => Outcome::Executed(result),
                Err(error) => Outcome::Refused(Refusal::Job(error)),
            },
            queue_wait: completed.queue_wait,
            execution: completed.execution,
            session_id: None,
            unsaveable: None,
            kept: Kept::default(),
        }
    }

    /// Runs `request` in the session `session_id` names ("new" or "": a new one, owned by the
    /// caller). A new session whose id never reached its client is ended at once.
    async fn in_session(&self, session_id: String, request: ExecRequest, setup: &Setup) -> Ended {
        let Some(sessions) = self.sessions else {
            return invalid(
                "sessions are disabled on this server (sessions.enabled = false)".into(),
            );
        };
        let started = std::time::Instant::now();
        let keep = (self.max_text_chars > 0).then(|| KeepOutputs {
            stem: output_stem(),
            stdout_over: text::share("stdout", self.max_text_chars),
            stderr_over: text::share("stderr", self.max_text_chars),
        });
        let caller = &setup.caller;
        let run = async {
            let mut created = None;
            let id = if starts_a_session(&session_id) {
                let from = std::time::Instant::now();
                let id = sessions.create(caller.clone(), &request.code).await?;
                let to = std::time::Instant::now();
                traces::current().child("session.create", from, to, Vec::new());
                created = Some(Abandon {
                    sessions,
                    id: Some(id.clone()),
                });
                id
            } else {
                session_id
            };
            let result = sessions.run(&id, caller, request, keep).await?;
            // The id goes back to the client with this result: the session is the client's now.
            if let Some(mut created) = created {
                created.id = None;
            }
            Ok::<_, SessionError>((id, result))
        };
        match run.await {
            Ok((id, run)) => Ended {
                outcome: Outcome::Executed(run.result),
                queue_wait: Duration::ZERO,
                execution: started.elapsed(),
                session_id: Some(id),
                unsaveable: run.unsaveable,
                kept: Kept {
                    stdout: run.kept_stdout,
                    stderr: run.kept_stderr,
                },
            },
            Err(e) => Ended::refused(Refusal::Session(e)),
        }
    }
}

/// The children of the call's span for a pool job submitted at `submitted`: its wait in the queue,
/// the boot of a sandbox when none was ready, and its execution.
fn trace_worker_time(submitted: std::time::Instant, completed: &Completed<ExecResult>) {
    let span = traces::current();
    let dispatched = submitted + completed.queue_wait;
    let done = dispatched + completed.execution;
    span.child("queue.wait", submitted, dispatched, Vec::new());
    let booted = dispatched + completed.boot.unwrap_or_default();
    let source = if completed.boot.is_some() {
        "boot"
    } else {
        "ready"
    };
    if completed.boot.is_some() {
        span.child("sandbox.boot", dispatched, booted, Vec::new());
    }
    if completed.execution > Duration::ZERO {
        let attributes = vec![KeyValue::new("code_interpreter.sandbox", source)];
        span.child("sandbox.execute", booted, done, attributes);
    }
}

/// Sends the output written since the last notice every `OUTPUT_INTERVAL` (never resolves).
async fn stream_output(progress: Option<Progress>, live: Option<Arc<LiveOutput>>) {
    let (Some(progress), Some(live)) = (progress, live) else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(OUTPUT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(text) = live.take() {
            progress.notify(text).await;
        }
    }
}

/// Where a session call keeps its long outputs: `.outputs/call-MILLIS-RANDOM` under /workspace.
fn output_stem() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut random = [0u8; 3];
    let _ = getrandom::fill(&mut random);
    format!(".outputs/call-{millis}-{}", hex::encode(random))
}

/// Ends a session created for a call that went away before its id reached the client.
struct Abandon<'a> {
    sessions: &'a Sessions,
    /// `None` once the id is the client's.
    id: Option<String>,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.sessions.abandon(id);
        }
    }
}

/// Who makes a call: the client, for listing its sessions' resources later (the MCP session of a
/// legacy-era client, its `Mcp-Session-Id`; the stdio client; nobody known for a 2026-07-28
/// stateless request), and the bearer token it was authenticated with, if any.
pub fn caller(context: Option<&RequestContext<RoleServer>>) -> Caller {
    let Some(context) = context else {
        return Caller::default();
    };
    match context.extensions.get::<axum::http::request::Parts>() {
        None => Caller {
            client: Some("stdio".into()),
            ..Caller::default()
        },
        Some(parts) => Caller {
            client: parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(|v| format!("mcp-session:{v}")),
            principal: parts.extensions.get::<Principal>().copied(),
            profile: parts.extensions.get::<Arc<Profile>>().cloned(),
        },
    }
}

/// What `session_id` asks for: "none" is a fresh sandbox as when it is left out (what a strict-mode
/// model, which must send every argument, sends for no session); "new" or "" starts a session (as
/// the stateful spec's clients send it); anything else names one.
pub fn names_a_session(session_id: &str) -> bool {
    session_id != NO_SESSION
}

/// The `session_id` that asks for no session.
pub const NO_SESSION: &str = "none";

/// Whether `session_id` starts a new session.
pub fn starts_a_session(session_id: &str) -> bool {
    session_id.is_empty() || session_id == "new"
}

pub(super) fn invalid(message: String) -> Ended {
    telemetry::rejection(Rejection::Validation);
    Ended::refused(Refusal::Invalid(message))
}

/// Waits for `ticket`, sending the queue position after one second of waiting and every five seconds
/// while still queued, then a heartbeat with the elapsed time every five seconds while running.
async fn wait_with_progress(
    mut ticket: Ticket<ExecRequest, ExecResult>,
    progress: Option<Progress>,
) -> Completed<ExecResult> {
    let Some(progress) = progress else {
        return ticket.wait().await;
    };
    let submitted = tokio::time::Instant::now();
    let mut running_since: Option<tokio::time::Instant> = None;
    let mut next_notice = submitted + FIRST_QUEUE_NOTICE;
    loop {
        {
            let wait = ticket.wait();
            tokio::pin!(wait);
            tokio::select! {
                completed = &mut wait => return completed,
                _ = tokio::time::sleep_until(next_notice) => {}
            }
        }
        match (ticket.started(), running_since) {
            (false, _) => {
                if let Some(position) = ticket.position() {
                    progress
                        .notify(format!(
                            "queued: position {position} in the execution queue"
                        ))
                        .await;
                }
                next_notice += NOTICE_INTERVAL;
            }
            (true, None) => {
                // Just started: the first heartbeat comes five seconds from now.
                let now = tokio::time::Instant::now();
                running_since = Some(now);
                next_notice = now + NOTICE_INTERVAL;
            }
            (true, Some(since)) => {
                let secs = since.elapsed().as_secs();
                progress.notify(format!("running for {secs} s")).await;
                next_notice += NOTICE_INTERVAL;
            }
        }
    }
}
