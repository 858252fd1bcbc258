//! `run_python_code` as an MCP task (SEP-2663, the `io.modelcontextprotocol/tasks` extension): a
//! client that declares the extension gets its result inline when the call ends within
//! `tasks.immediate_result_ms` (1 s), else a task handle for the call, still running, and polls
//! `tasks/get`,
//! whose status message says how long the code has run, how much output it wrote and its newest
//! output (at most 4 KiB); the terminal state carries the ordinary result. `tasks/cancel` stops the
//! code (a session's is interrupted first) and the task ends `cancelled` within a second.
//!
//! Bounds: at most `tasks.max_running` tasks run at once (default `max_workers - 1`, so long tasks
//! never take every worker from synchronous calls), `tasks.queue_capacity` wait, served in turn
//! between bearer tokens as the worker queue is (`pool/fair.rs`) (one more is the
//! overload error, answered synchronously), each is kept for `tasks.ttl_s` (rmcp's task manager
//! fails a task still running then and drops a finished one a TTL later), and at most
//! `MAX_TASKS` exist at once. Task ids are random (UUID v4) and, with bearer tokens, visible only to
//! the token that created the task: to any other, `tasks/get` and `tasks/cancel` answer as for an
//! unknown id. At shutdown, waiting tasks fail at once and running ones may finish until shortly
//! before the drain deadline ([`Tasks::stop`]); then they are stopped and end `failed` with a
//! shutdown error, which `tasks/get` returns until HTTP closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use opentelemetry::KeyValue;
use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult, GetTaskResult, TaskStatus};
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::CodeInterpreter;
use super::era::Era;
use super::execute::{Outcome, Refusal, Setup, caller};
use super::run::RunPythonCodeArgs;
use crate::config::TaskSettings;
use crate::pool::fair::FairQueue;
use crate::pool::{JobError, SubmitError};
use crate::protocol::limits::MAX_TIMEOUT_MS;
use crate::sandbox::LiveOutput;
use crate::sessions::Principal;
use crate::telemetry::traces::CallSpan;
use crate::telemetry::{self, TaskEnd};

/// Tasks that may exist at once (running, waiting or finished and still kept).
pub const MAX_TASKS: usize = 4096;
/// Clients are asked to poll this often.
const POLL_INTERVAL_MS: u64 = 1000;
/// A running task's status message is refreshed this often.
const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// The tasks of the server.
#[derive(Clone)]
pub struct Tasks {
    manager: TaskManager,
    settings: TaskSettings,
    running: Arc<Semaphore>,
    /// The tickets of the tasks waiting for a running slot, in fair order between bearer tokens:
    /// only the first one waits on `running`, the others for `turn`.
    waiting: Arc<Mutex<FairQueue<u64>>>,
    /// Notified whenever a ticket leaves `waiting`.
    turn: Arc<Notify>,
    next_ticket: Arc<AtomicU64>,
    /// Who created each task (its bearer token), for `tasks/get` and `tasks/cancel`.
    owners: Arc<Mutex<HashMap<String, Option<Principal>>>>,
    /// Tasks not yet ended.
    working: Arc<AtomicUsize>,
    /// Cancelled at shutdown: waiting tasks stop waiting.
    closing: CancellationToken,
    /// Cancelled when the drain deadline is near: running tasks stop and fail.
    stopping: CancellationToken,
}

/// The error for a task id the caller may not see, exactly as for an unknown one. (The id shows
/// its first eight characters only: without bearer tokens it is all a task's reader needs, and
/// rmcp logs error responses.)
fn unknown(task_id: &str) -> ErrorData {
    let mut shown: String = task_id
        .chars()
        .take(8)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if task_id.chars().nth(8).is_some() {
        shown.push('…');
    }
    ErrorData::invalid_params(format!("unknown task: \"{shown}\""), None)
}

/// The manager's error for `task_id`, with an unknown id's answer as `unknown` gives it.
fn redacted(task_id: &str, error: ErrorData) -> ErrorData {
    if error.code == rmcp::model::ErrorCode::INVALID_PARAMS
        && error.message.starts_with("unknown task")
    {
        unknown(task_id)
    } else {
        error
    }
}

impl Tasks {
    pub fn new(settings: TaskSettings) -> Self {
        telemetry::tasks_waiting(0);
        telemetry::tasks_working(0);
        Self {
            manager: TaskManager::new(),
            running: Arc::new(Semaphore::new(settings.max_running)),
            settings,
            waiting: Arc::default(),
            turn: Arc::default(),
            next_ticket: Arc::default(),
            owners: Arc::default(),
            working: Arc::default(),
            closing: CancellationToken::new(),
            stopping: CancellationToken::new(),
        }
    }

    /// The largest `timeout_ms` a task may set.
    pub fn max_timeout_ms(&self) -> u64 {
        self.settings.max_timeout_ms
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, FairQueue<u64>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Principal>>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner record of `task_id`, checked against `principal`.
    fn check(&self, task_id: &str, principal: Option<Principal>) -> Result<(), ErrorData> {
        match self.lock().get(task_id) {
            Some(owner) if owner.is_none() || *owner == principal => Ok(()),
            _ => Err(unknown(task_id)),
        }
    }

    /// Forgets owners of tasks the manager has dropped (expired).
    fn prune(&self) {
        let mut owners = self.lock();
        owners.retain(|id, _| self.manager.get_task(id).is_ok());
    }

    /// Runs `args` for the request of `context`, a client that declared tasks: answered inline when
    /// it ends within `tasks.immediate_result_ms` (a task only costs such a call a poll interval,
    /// and some clients handle tasks badly), else as a task of `interpreter` that carries on with
    /// the same running call. A call whose `timeout_ms` exceeds the synchronous cap, or that finds
    /// no running slot free, becomes a task at once. A call refused before it became a task (too
    /// many tasks waiting or kept) is answered as a synchronous result.
    pub async fn spawn(
        &self,
        interpreter: &CodeInterpreter,
        args: RunPythonCodeArgs,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> CallToolResponse {
        let started = Instant::now();
        if let Err(refusal) = self.admit(interpreter, context) {
            telemetry::rejection(telemetry::Rejection::Quota);
            let ended = super::execute::Ended::refused(Refusal::Quota(refusal));
            let (result, kept) = interpreter.finish(ended, started);
            return CallToolResponse::Complete(interpreter.reply(
                &result,
                &kept,
                interpreter.era(context),
            ));
        }
        let window = self.settings.immediate_result;
        let inline = !window.is_zero()
            && args.timeout_ms <= MAX_TIMEOUT_MS
            && self.queue().is_empty()
            && self.lock().len() < MAX_TASKS;
        if let Some(permit) = inline
            .then(|| self.running.clone().try_acquire_owned().ok())
            .flatten()
        {
            let max = self.settings.max_timeout_ms;
            let (mut call, live) = start_call(interpreter, args, caller(Some(context)), max);
            return match tokio::time::timeout(window, &mut call).await {
                Ok(ended) => {
                    drop(permit);
                    let (result, kept) = interpreter.finish(ended, started);
                    CallToolResponse::Complete(interpreter.reply(
                        &result,
                        &kept,
                        interpreter.era(context),
                    ))
                }
                Err(_) => {
                    let running = Running {
                        call,
                        permit,
                        live,
                        started,
                    };
                    self.create(interpreter, context, started, Begin::Running(running))
                }
            };
        }
        if self.lock().len() >= MAX_TASKS {
            self.prune();
        }
        let waiting = self.queue().len();
        let kept = self.lock().len();
        // (A task that finds a running slot free does not wait.)
        let must_wait = self.running.available_permits() <= waiting;
        if (must_wait && waiting >= self.settings.queue_capacity) || kept >= MAX_TASKS {
            telemetry::rejection(telemetry::Rejection::QueueFull);
            let message = if kept >= MAX_TASKS {
                format!("{kept} tasks are kept on this server (at most {MAX_TASKS}); retry later")
            } else {
                format!(
                    "the task queue is full ({waiting} waiting, tasks.queue_capacity = {}); retry later",
                    self.settings.queue_capacity
                )
            };
            let ended = super::execute::Ended::refused(Refusal::TaskQueue(message));
            let (result, kept) = interpreter.finish(ended, started);
            return CallToolResponse::Complete(interpreter.reply(
                &result,
                &kept,
                interpreter.era(context),
            ));
        }
        let who = caller(Some(context));
        let lane = super::execute::queue_lane(&who);
        let weight = interpreter.quotas().weight(&who);
        let begin = Begin::Queued {
            args,
            ticket: Waiting::enter(self, lane, weight),
        };
        self.create(interpreter, context, started, begin)
    }

    /// Whether `context`'s principal may hold one more task (`quotas.max_tasks`).
    fn admit(
        &self,
        interpreter: &CodeInterpreter,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), super::quotas::QuotaError> {
        let who = caller(Some(context));
        let principal = who.principal;
        let held = |tasks: &Self| tasks.lock().values().filter(|o| **o == principal).count();
        if interpreter.quotas().admit_task(&who, held(self)).is_err() {
            // Expired tasks do not count: forget them, then count again.
            self.prune();
        }
        interpreter.quotas().admit_task(&who, held(self))
    }

    /// Makes the task that `begin` starts (queued, or already running), for `context`'s caller.
    fn create(
        &self,
        interpreter: &CodeInterpreter,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
        started: Instant,
        begin: Begin,
    ) -> CallToolResponse {
        let caller = caller(Some(context));
        let principal = caller.principal;
        let tasks = self.clone();
        let interpreter = interpreter.clone();
        let options = TaskOptions::new()
            .with_ttl_ms(u64::try_from(self.settings.ttl.as_millis()).unwrap_or(u64::MAX))
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_status_message("queued");
        // A task stops at its TTL whether or not anyone polls it (the manager expires it only
        // when asked): its code ends and its slot is free at once.
        let deadline = tokio::time::Instant::now() + self.settings.ttl;
        self.working.fetch_add(1, Ordering::SeqCst);
        telemetry::tasks_working(self.working.load(Ordering::SeqCst));
        // The task's run is a span of its own, a child of the call that created it.
        let span = CallSpan::start(
            "task run_python_code".into(),
            telemetry::traces::current().context().as_ref(),
            vec![KeyValue::new("gen_ai.tool.name", "run_python_code")],
        );
        let who = caller.clone();
        let task = self.manager.spawn(options, move |ctx| {
            Box::pin(span.scope(super::record::as_caller(who, async move {
                // (The manager aborts a task still running at its TTL: the guard then counts it
                // as failed.)
                let mut ending = Ending {
                    working: tasks.working.clone(),
                    started,
                    end: TaskEnd::Failed,
                };
                let outcome = tasks.run(&interpreter, begin, caller, deadline, &ctx).await;
                ending.end = match &outcome {
                    Ok(_) => TaskEnd::Completed,
                    Err(TaskExit::Cancelled) => TaskEnd::Cancelled,
                    Err(TaskExit::Error(_)) => TaskEnd::Failed,
                };
                outcome
            })))
        });
        self.lock().insert(task.task_id.clone(), principal);
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// A task's life: wait for a running slot, run the call while its status follows the output,
    /// and settle as completed (the result), cancelled, or failed (the server shut down, or its
    /// TTL came at `deadline`: the code is stopped as a cancellation stops it).
    async fn run(
        &self,
        interpreter: &CodeInterpreter,
        begin: Begin,
        caller: crate::sessions::Caller,
        deadline: tokio::time::Instant,
        ctx: &TaskContext,
    ) -> Result<CallToolResult, TaskExit> {
        let Running {
            mut call,
            permit,
            live,
            started,
        } = match begin {
            Begin::Running(running) => running,
            Begin::Queued { args, ticket } => {
                let permit = {
                    let mut tick = tokio::time::interval(STATUS_INTERVAL);
                    // First this task's turn among the waiting ones, then a running slot.
                    loop {
                        let turn = self.turn.notified();
                        tokio::pin!(turn);
                        turn.as_mut().enable();
                        if ticket.first() {
                            break;
                        }
                        self.wait_queued(turn, &ticket, &mut tick, deadline, ctx)
                            .await?;
                    }
                    let acquire = self.running.clone().acquire_owned();
                    self.wait_queued(acquire, &ticket, &mut tick, deadline, ctx)
                        .await?
                        .map_err(|_| shutting_down())?
                };
                ticket.taken();
                let started = Instant::now();
                let max = self.settings.max_timeout_ms;
                let (call, live) = start_call(interpreter, args, caller, max);
                Running {
                    call,
                    permit,
                    live,
                    started,
                }
            }
        };
        ctx.set_status_message(status(&live, started, "running for"));
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        let ended = loop {
            tokio::select! {
                ended = &mut call => break ended,
                () = ctx.cancelled() => {
                    ctx.set_status_message(status(&live, started, "cancelled after"));
                    return Err(TaskExit::Cancelled);
                }
                () = self.stopping.cancelled() => {
                    ctx.set_status_message(status(&live, started, "stopped by the shutdown after"));
                    return Err(shutting_down());
                }
                () = tokio::time::sleep_until(deadline) => {
                    ctx.set_status_message(status(&live, started, "expired (tasks.ttl_s) after"));
                    return Err(expired());
                }
                _ = tick.tick() => ctx.set_status_message(status(&live, started, "running for")),
            }
        };
        drop(permit);
        if matches!(
            ended.outcome,
            Outcome::Refused(
                Refusal::Queue(SubmitError::ShuttingDown) | Refusal::Job(JobError::ShuttingDown)
            )
        ) {
            return Err(shutting_down());
        }
        let (result, kept) = interpreter.finish(ended, started);
        ctx.set_status_message(status(&live, started, "ran for"));
        // (Only a client of the tasks extension gets here: 2025-11-25 or later.)
        Ok(interpreter.reply(&result, &kept, Era::Resumable.min(interpreter.newest)))
    }

    /// Waits for `until` while a task is queued for a running slot: its cancellation, the shutdown
    /// and its TTL end the wait first; its status shows its place in the queue meanwhile.
    async fn wait_queued<T>(
        &self,
        until: impl std::future::Future<Output = T>,
        ticket: &Waiting,
        tick: &mut tokio::time::Interval,
        deadline: tokio::time::Instant,
        ctx: &TaskContext,
    ) -> Result<T, TaskExit> {
        tokio::pin!(until);
        loop {
            tokio::select! {
                value = &mut until => return Ok(value),
                () = ctx.cancelled() => return Err(TaskExit::Cancelled),
                () = self.closing.cancelled() => return Err(shutting_down()),
                () = tokio::time::sleep_until(deadline) => {
                    ctx.set_status_message("expired before it could run");
                    return Err(expired());
                }
                _ = tick.tick() => ctx.set_status_message(ticket.status()),
            }
        }
    }

    /// `tasks/get` for `principal`.
    pub fn get(
        &self,
        task_id: &str,
        principal: Option<Principal>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.check(task_id, principal)?;
        let detailed = self.manager.get_task(task_id).map_err(|_| {
            self.lock().remove(task_id);
            unknown(task_id)
        })?;
        Ok(GetTaskResult::new(detailed))
    }

    /// `tasks/cancel` for `principal`: the code is stopped, and the task ends `cancelled`.
    pub fn cancel(&self, task_id: &str, principal: Option<Principal>) -> Result<(), ErrorData> {
        self.check(task_id, principal)?;
        self.manager
            .cancel_task(task_id)
            .map_err(|e| redacted(task_id, e))
    }

    /// `tasks/update` for `principal` (no task of this server asks for input: accepted, ignored).
    pub fn update(
        &self,
        task_id: &str,
        principal: Option<Principal>,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), ErrorData> {
        self.check(task_id, principal)?;
        self.manager
            .update_task(task_id, responses)
            .map_err(|e| redacted(task_id, e))
    }

    /// How many tasks have not ended.
    pub fn working(&self) -> usize {
        self.working.load(Ordering::SeqCst)
    }

    /// Shutdown: waiting tasks fail at once; running ones may finish until [`Tasks::stop`].
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Shutdown, near the drain deadline: running tasks are stopped (their code too) and fail with
    /// the shutdown error, which `tasks/get` returns while the server still answers.
    pub fn stop(&self) {
        self.stopping.cancel();
    }

    /// Whether `task_id` is in a terminal state (for tests and shutdown).
    pub fn is_terminal(&self, task_id: &str) -> bool {
        self.manager
            .get_task(task_id)
            .is_ok_and(|t| t.task.status != TaskStatus::Working)
    }
}

/// Records a task's end when its future finishes or is dropped (aborted at its TTL).
struct Ending {
    working: Arc<AtomicUsize>,
    started: Instant,
    end: TaskEnd,
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.working.fetch_sub(1, Ordering::SeqCst);
        telemetry::tasks_working(self.working.load(Ordering::SeqCst));
        telemetry::task_ended(self.end, self.started.elapsed());
    }
}

/// A task's place in the queue for a running slot (its bearer token's lane), until it takes a
/// slot or is dropped.
struct Waiting {
    queue: Arc<Mutex<FairQueue<u64>>>,
    turn: Arc<Notify>,
    ticket: u64,
}

impl Waiting {
    fn enter(tasks: &Tasks, lane: u64, weight: u32) -> Self {
        let ticket = tasks.next_ticket.fetch_add(1, Ordering::SeqCst);
        let mut queue = tasks.queue();
        queue.push(lane, weight, ticket);
        telemetry::tasks_waiting(queue.len());
        drop(queue);
        Self {
            queue: tasks.waiting.clone(),
            turn: tasks.turn.clone(),
            ticket,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FairQueue<u64>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this task is the next to take a running slot.
    fn first(&self) -> bool {
        self.lock().position(|t| *t == self.ticket) == Some(1)
    }

    /// "queued: position P of N waiting for a running slot".
    fn status(&self) -> String {
        let queue = self.lock();
        let position = queue.position(|t| *t == self.ticket).unwrap_or(1);
        format!(
            "queued: position {position} of {} waiting for a running slot",
            queue.len()
        )
    }

    /// The task took its slot: it leaves the queue as the next in turn.
    fn taken(self) {
        let mut queue = self.lock();
        queue.take(|t| *t == self.ticket);
        telemetry::tasks_waiting(queue.len());
        drop(queue);
        self.turn.notify_waiters();
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut queue = self.lock();
        if queue.remove(|t| *t == self.ticket).is_some() {
            telemetry::tasks_waiting(queue.len());
            drop(queue);
            self.turn.notify_waiters();
        }
    }
}

fn shutting_down() -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(
        "the server is shutting down: this task did not finish; run it again (on another replica)"
            .to_string(),
        None,
    ))
}

/// How a task begins: waiting for a running slot, or with its call already running (a call that
/// did not end within the inline window).
enum Begin {
    Queued {
        args: RunPythonCodeArgs,
        ticket: Waiting,
    },
    Running(Running),
}

/// A call running for a task: its future, its running slot, its output so far, when it started.
struct Running {
    call: Call,
    permit: tokio::sync::OwnedSemaphorePermit,
    live: Arc<LiveOutput>,
    started: Instant,
}

/// A running call's future.
type Call = std::pin::Pin<Box<dyn std::future::Future<Output = super::execute::Ended> + Send>>;

/// Starts running `args` for `caller`, `timeout_ms` allowed up to `max_timeout_ms` (with its output
/// followed live); the call and its output.
fn start_call(
    interpreter: &CodeInterpreter,
    args: RunPythonCodeArgs,
    caller: crate::sessions::Caller,
    max_timeout_ms: u64,
) -> (Call, Arc<LiveOutput>) {
    let live = Arc::new(LiveOutput::default());
    let setup = Setup {
        caller,
        progress: None,
        cancelled: CancellationToken::new(),
        max_timeout_ms,
        live: Some(live.clone()),
    };
    let interpreter = interpreter.clone();
    // Traced under the span current now, whichever future polls it later.
    let span = telemetry::traces::current();
    let call =
        Box::pin(span.scope(async move { interpreter.runner().execute(args.into(), setup).await }));
    (call, live)
}

/// Why a task that reached its TTL failed.
fn expired() -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(
        "task expired: its TTL (tasks.ttl_s) elapsed before it completed, and its code was stopped"
            .to_string(),
        None,
    ))
}

/// A task's status message once it runs: how long it has run (`how`: "running for", "ran for",
/// "cancelled after"), the bytes written, the newest output.
fn status(live: &LiveOutput, started: Instant, how: &str) -> String {
    let (tail, stdout, stderr) = live.status();
    let so_far = if how == "running for" { " so far" } else { "" };
    let mut message = format!(
        "{how} {:.1} s; {stdout} bytes of stdout, {stderr} bytes of stderr{so_far}",
        started.elapsed().as_secs_f64()
    );
    if !tail.is_empty() {
        message.push_str("; newest output:\n");
        message.push_str(&tail);
    }
    message
}
