//! The worker pool: dedicated OS threads (never the async runtime's), each running one sandbox at a
//! time, fed by one shared FIFO queue of bounded capacity. Prewarmed workers keep a stock of booted
//! sandboxes ready (`ready_sandboxes` each): a call takes one, and the stock is refilled while no
//! call waits, so calls back to back are served from it instead of waiting for a boot. Health is
//! published through atomics only, so probes never touch the queue lock.
//!
//! The pool knows sandboxes only through [`Backend`] ("boot a ready sandbox", "run a job in it"), so
//! its queue, prewarming, cancellation, overload and drain logic are tested without V8 (see the
//! tests below); `engine.rs` implements it for the real engine.

mod engine;

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::telemetry::{self, InitPhase, QueueExit, Rejection, WorkerState};

/// What the pool needs of sandboxes.
pub trait Backend: Send + Sync + 'static {
    /// A ready sandbox: booted and used on one worker thread only (it need not be `Send`).
    type Sandbox;
    /// What a call asks for.
    type Job: Send + 'static;
    /// What a call gets back.
    type Output: Send + 'static;
    /// The kinds of sandbox there are (`()` for one kind). A worker keeps a sandbox of the kind its
    /// last call needed ready for the next.
    type Flavor: Copy + PartialEq + Default + std::fmt::Debug + Send + 'static;

    /// The kind of sandbox that serves `job` best.
    fn flavor(&self, job: &Self::Job) -> Self::Flavor;

    /// Boots a fresh sandbox of `flavor`; the error is the reason, for the caller and the log.
    fn boot(&self, flavor: Self::Flavor) -> Result<Self::Sandbox, String>;

    /// Settles a sandbox booted ahead of its call (skipped when a job is already waiting for it).
    fn settle(&self, _sandbox: &mut Self::Sandbox) {}

    /// Runs `job`; `cancelled` is set when its caller goes away meanwhile (the run may stop early).
    /// The pool drops the used sandbox after the reply has been sent.
    fn run(
        &self,
        sandbox: &mut Self::Sandbox,
        job: Self::Job,
        cancelled: Arc<AtomicBool>,
    ) -> Self::Output;
}

/// Pool sizing.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    pub max_workers: usize,
    pub queue_capacity: usize,
    pub prewarmed_workers: usize,
    /// Sandboxes each prewarmed worker keeps booted and ready (at least 1).
    pub ready_sandboxes: usize,
}

/// How long a worker whose stock can still serve the next call waits for one before it boots a
/// replacement. Calls back to back arrive well within it (the client's round trip), so a burst is
/// served from the stock and the booting waits for the pause after it; without the pause every call
/// would find its worker busy booting the previous call's replacement.
const REFILL_PAUSE: Duration = Duration::from_millis(25);

/// A job's outcome and where its time went.
#[derive(Debug)]
pub struct Completed<O> {
    pub result: Result<O, JobError>,
    /// Time spent waiting for a worker.
    pub queue_wait: Duration,
    /// Time on the worker: sandbox start-up (when not prewarmed) plus execution.
    pub execution: Duration,
}

/// Why a queued job produced no output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The sandbox for it could not boot.
    #[error("{0}")]
    Boot(String),
    /// The pool shut down while it was queued.
    #[error("the server is shutting down; this queued execution was cancelled")]
    ShuttingDown,
    /// The worker running it ended unexpectedly.
    #[error("the worker running this execution stopped unexpectedly")]
    WorkerLost,
}

/// Why a job could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "the execution queue is full ({waiting} waiting, workers.queue_capacity = {capacity}); retry later"
    )]
    Overloaded { waiting: usize, capacity: usize },
    #[error("the server is shutting down and accepts no new executions")]
    ShuttingDown,
    #[error("the execution queue is broken")]
    Unavailable,
}

/// Health counters, read by the probes without locking anything.
#[derive(Debug, Default)]
pub struct Health {
    /// Submissions are accepted (false once shutdown began).
    pub accepting: AtomicBool,
    /// Worker threads started.
    pub started_workers: AtomicUsize,
    /// Worker threads alive (idle, initialising or executing).
    pub live_workers: AtomicUsize,
    /// Workers that ended outside normal shutdown (panics included).
    pub unexpected_exits: AtomicUsize,
    /// The queue's lock was poisoned.
    pub poisoned: AtomicBool,
}

impl Health {
    /// Liveness: no unrecoverable pool failure is known.
    pub fn live(&self) -> bool {
        let all_lost = self.started_workers.load(Ordering::SeqCst) > 0
            && self.live_workers.load(Ordering::SeqCst) == 0
            && self.unexpected_exits.load(Ordering::SeqCst) > 0;
        !self.poisoned.load(Ordering::SeqCst) && !all_lost
    }

    /// Readiness: live, accepting submissions, and at least one worker alive.
    pub fn ready(&self) -> bool {
        self.live()
            && self.accepting.load(Ordering::SeqCst)
            && self.live_workers.load(Ordering::SeqCst) > 0
    }
}

struct Job<J, O> {
    id: u64,
    job: J,
    enqueued: Instant,
    started: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    reply: oneshot::Sender<Completed<O>>,
}

struct Queue<J, O> {
    jobs: VecDeque<Job<J, O>>,
    closed: bool,
    /// Workers holding a ready sandbox that are idle or only tearing down their last one: while any
    /// exists, workers without one leave jobs to them.
    ready_idle: usize,
}

struct Shared<J, O> {
    queue: Mutex<Queue<J, O>>,
    available: Condvar,
    capacity: usize,
    next_id: AtomicU64,
    health: Arc<Health>,
}

impl<J, O> Shared<J, O> {
    fn lock(&self) -> Option<MutexGuard<'_, Queue<J, O>>> {
        match self.queue.lock() {
            Ok(q) => Some(q),
            Err(_) => {
                self.health.poisoned.store(true, Ordering::SeqCst);
                None
            }
        }
    }
}

/// Why the pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("cannot start worker thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("prewarmed worker {worker} failed to initialise Pyodide: {message}")]
    Prewarm { worker: usize, message: String },
}

/// Handle to the pool; cheap to clone.
pub struct Pool<B: Backend> {
    shared: Arc<Shared<B::Job, B::Output>>,
}

impl<B: Backend> Clone for Pool<B> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// The pool of the real engine.
pub type ExecPool = Pool<crate::sandbox::Engine>;

impl<B: Backend> Pool<B> {
    /// Starts the workers and waits until every prewarmed worker has booted its first sandbox.
    pub fn start(backend: Arc<B>, config: PoolConfig) -> Result<Self, PoolError> {
        let health = Arc::new(Health::default());
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
                ready_idle: 0,
            }),
            available: Condvar::new(),
            capacity: config.queue_capacity,
            next_id: AtomicU64::new(1),
            health: health.clone(),
        });
        let mut acks = Vec::new();
        for index in 0..config.max_workers.max(1) {
            let prewarmed = index < config.prewarmed_workers;
            let (ack_tx, ack_rx) = std::sync::mpsc::channel::<Result<(), String>>();
            let worker = Worker {
                index,
                prewarmed,
                stock_size: config.ready_sandboxes.max(1),
                announced: Cell::new(false),
                backend: backend.clone(),
                shared: shared.clone(),
            };
            health.started_workers.fetch_add(1, Ordering::SeqCst);
            health.live_workers.fetch_add(1, Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name(format!("python-worker-{index}"))
                .stack_size(8 * 1024 * 1024)
                .spawn(move || worker.run(ack_tx));
            if let Err(e) = spawned {
                health.live_workers.fetch_sub(1, Ordering::SeqCst);
                return Err(e.into());
            }
            if prewarmed {
                acks.push((index, ack_rx));
            }
        }
        let pool = Self { shared };
        for (worker, ack) in acks {
            let outcome = ack
                .recv()
                .unwrap_or_else(|_| Err("the worker stopped during start-up".into()));
            if let Err(message) = outcome {
                pool.shutdown();
                return Err(PoolError::Prewarm { worker, message });
            }
        }
        health.accepting.store(true, Ordering::SeqCst);
        Ok(pool)
    }

    pub fn health(&self) -> Arc<Health> {
        self.shared.health.clone()
    }

    /// Queues `job`; an overload or shutdown error when it cannot be queued.
    pub fn submit(&self, job: B::Job) -> Result<Ticket<B::Job, B::Output>, SubmitError> {
        if !self.shared.health.accepting.load(Ordering::SeqCst) {
            telemetry::rejection(Rejection::Shutdown);
            return Err(SubmitError::ShuttingDown);
        }
        let Some(mut queue) = self.shared.lock() else {
            return Err(SubmitError::Unavailable);
        };
        if queue.closed {
            telemetry::rejection(Rejection::Shutdown);
            return Err(SubmitError::ShuttingDown);
        }
        if queue.jobs.len() >= self.shared.capacity {
            telemetry::rejection(Rejection::QueueFull);
            return Err(SubmitError::Overloaded {
                waiting: queue.jobs.len(),
                capacity: self.shared.capacity,
            });
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, receiver) = oneshot::channel();
        let started = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicBool::new(false));
        queue.jobs.push_back(Job {
            id,
            job,
            enqueued: Instant::now(),
            started: started.clone(),
            cancelled: cancelled.clone(),
            reply,
        });
        telemetry::queue_depth(queue.jobs.len());
        drop(queue);
        // Every idle worker re-checks: the one with a ready sandbox takes the job first.
        self.shared.available.notify_all();
        Ok(Ticket {
            id,
            started,
            cancelled,
            receiver: Some(receiver),
            shared: self.shared.clone(),
        })
    }

    /// Starts shutdown: no new submissions, queued jobs are answered with `JobError::ShuttingDown`,
    /// workers finish what they run and exit.
    pub fn shutdown(&self) {
        self.shared.health.accepting.store(false, Ordering::SeqCst);
        let drained: Vec<Job<B::Job, B::Output>> = match self.shared.lock() {
            Some(mut queue) => {
                queue.closed = true;
                queue.jobs.drain(..).collect()
            }
            None => Vec::new(),
        };
        telemetry::queue_depth(0);
        self.shared.available.notify_all();
        for job in drained {
            let waited = job.enqueued.elapsed();
            telemetry::queue_wait(QueueExit::Shutdown, waited);
            let _ = job.reply.send(Completed {
                result: Err(JobError::ShuttingDown),
                queue_wait: waited,
                execution: Duration::ZERO,
            });
        }
    }

    /// Whether every worker thread has ended.
    pub fn workers_exited(&self) -> bool {
        self.shared.health.live_workers.load(Ordering::SeqCst) == 0
    }
}

/// A queued or running job. Dropping it before its outcome arrived cancels it: a queued job leaves
/// the queue, a running one is told to stop (and its result is discarded).
pub struct Ticket<J, O> {
    id: u64,
    started: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    receiver: Option<oneshot::Receiver<Completed<O>>>,
    shared: Arc<Shared<J, O>>,
}

impl<J, O> Ticket<J, O> {
    /// Whether a worker has taken the job.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// 1-based position in the queue while waiting; `None` once taken.
    pub fn position(&self) -> Option<usize> {
        let queue = self.shared.lock()?;
        queue
            .jobs
            .iter()
            .position(|j| j.id == self.id)
            .map(|p| p + 1)
    }

    /// Waits for the outcome.
    pub async fn wait(&mut self) -> Completed<O> {
        let receiver = self.receiver.as_mut().expect("waited once");
        let completed = receiver.await.unwrap_or(Completed {
            result: Err(JobError::WorkerLost),
            queue_wait: Duration::ZERO,
            execution: Duration::ZERO,
        });
        self.receiver = None;
        completed
    }
}

impl<J, O> Drop for Ticket<J, O> {
    fn drop(&mut self) {
        if self.receiver.is_none() {
            return;
        }
        if self.started() {
            self.cancelled.store(true, Ordering::SeqCst);
            return;
        }
        if let Some(mut queue) = self.shared.lock()
            && let Some(index) = queue.jobs.iter().position(|j| j.id == self.id)
            && let Some(job) = queue.jobs.remove(index)
        {
            telemetry::queue_depth(queue.jobs.len());
            telemetry::queue_wait(QueueExit::Cancelled, job.enqueued.elapsed());
        }
    }
}

struct Worker<B: Backend> {
    index: usize,
    prewarmed: bool,
    /// Sandboxes a prewarmed worker keeps ready.
    stock_size: usize,
    /// Whether this worker is counted in the queue's `ready_idle`.
    announced: Cell<bool>,
    backend: Arc<B>,
    shared: Arc<Shared<B::Job, B::Output>>,
}

/// What an idle worker does next.
enum Next<J, O> {
    Run(Job<J, O>),
    /// No job came: boot one for the stock.
    Refill,
    Closed,
}

/// A worker's ready sandboxes, all of one flavor (the last call's), the newest last. V8 requires the
/// isolates of one thread to be dropped in the reverse order of their creation, so only the newest
/// is ever taken, a sandbox booted on demand is dropped before anything older, and the stock is
/// dropped newest first.
struct Stock<F, S> {
    sandboxes: Vec<(F, S)>,
}

impl<F: Copy + PartialEq, S> Stock<F, S> {
    /// The newest sandbox if it is of `flavor`.
    fn take(&mut self, flavor: F) -> Option<S> {
        match self.sandboxes.last() {
            Some((f, _)) if *f == flavor => {
                telemetry::ready_sandboxes(-1.0);
                self.sandboxes.pop().map(|(_, s)| s)
            }
            _ => None,
        }
    }

    /// Whether the next call of `flavor` would find its sandbox here.
    fn serves(&self, flavor: F) -> bool {
        self.sandboxes.last().is_some_and(|(f, _)| *f == flavor)
    }

    fn len(&self) -> usize {
        self.sandboxes.len()
    }

    fn push(&mut self, flavor: F, sandbox: S) {
        self.sandboxes.push((flavor, sandbox));
        telemetry::ready_sandboxes(1.0);
    }
}

impl<F, S> Stock<F, S> {
    /// Drops every sandbox, newest first.
    fn clear(&mut self) {
        while let Some(newest) = self.sandboxes.pop() {
            drop(newest);
            telemetry::ready_sandboxes(-1.0);
        }
    }
}

impl<F, S> Drop for Stock<F, S> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Tracks the worker's state for the metrics and counts the worker out when its thread ends, as an
/// unexpected exit when it ends by panicking.
struct LiveGuard {
    health: Arc<Health>,
    state: Cell<Option<WorkerState>>,
}

impl LiveGuard {
    fn new(health: Arc<Health>, state: WorkerState) -> Self {
        telemetry::worker_state(None, Some(state));
        Self {
            health,
            state: Cell::new(Some(state)),
        }
    }

    fn set(&self, state: WorkerState) {
        telemetry::worker_state(self.state.get(), Some(state));
        self.state.set(Some(state));
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        telemetry::worker_state(self.state.take(), None);
        if std::thread::panicking() {
            self.health.unexpected_exits.fetch_add(1, Ordering::SeqCst);
            telemetry::worker_unexpected_exit();
        }
        self.health.live_workers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<B: Backend> Worker<B> {
    fn run(self, ack: std::sync::mpsc::Sender<Result<(), String>>) {
        let initial = if self.prewarmed {
            WorkerState::Initializing
        } else {
            WorkerState::Idle
        };
        let guard = LiveGuard::new(self.shared.health.clone(), initial);
        let mut stock = Stock {
            sandboxes: Vec::new(),
        };
        // The flavor the stock is kept in: the last call's.
        let mut wanted = B::Flavor::default();
        if self.prewarmed {
            match self.boot(&guard, InitPhase::Startup, wanted) {
                Ok(sandbox) => {
                    stock.push(wanted, sandbox);
                    let _ = ack.send(Ok(()));
                }
                Err(e) => {
                    let _ = ack.send(Err(e));
                    return;
                }
            }
        }
        drop(ack);
        // Set when booting for the stock failed: no retry before the next call.
        let mut refill_failed = false;
        loop {
            let refill = (self.prewarmed && !refill_failed)
                .then(|| {
                    if !stock.serves(wanted) {
                        // Nothing to serve the next call with: boot at once.
                        Some(Duration::ZERO)
                    } else {
                        (stock.len() < self.stock_size).then_some(REFILL_PAUSE)
                    }
                })
                .flatten();
            let job = match self.next_job(stock.len() > 0, refill) {
                Next::Run(job) => job,
                Next::Closed => break,
                Next::Refill => {
                    // A stock of another flavor makes way for one of the wanted flavor.
                    if stock.len() > 0 && !stock.serves(wanted) {
                        guard.set(WorkerState::Initializing);
                        stock.clear();
                    }
                    match self.boot(&guard, InitPhase::Replenishment, wanted) {
                        Ok(sandbox) => stock.push(wanted, sandbox),
                        Err(e) => {
                            refill_failed = true;
                            tracing::error!(worker = self.index, error = %e, "replacement sandbox failed to boot")
                        }
                    }
                    continue;
                }
            };
            job.started.store(true, Ordering::SeqCst);
            let queue_wait = job.enqueued.elapsed();
            telemetry::queue_wait(QueueExit::Dispatched, queue_wait);
            let started = Instant::now();
            let flavor = self.backend.flavor(&job.job);
            wanted = flavor;
            refill_failed = false;
            // A ready sandbox of another kind waits for a later call.
            let sandbox = match stock.take(flavor) {
                Some(sandbox) => Ok(sandbox),
                None => self.boot(&guard, InitPhase::OnDemand, flavor),
            };
            let (result, used) = match sandbox {
                Ok(mut sandbox) => {
                    guard.set(WorkerState::Executing);
                    let output = self.backend.run(&mut sandbox, job.job, job.cancelled);
                    (Ok(output), Some(sandbox))
                }
                Err(e) => (Err(JobError::Boot(e)), None),
            };
            let _ = job.reply.send(Completed {
                result,
                queue_wait,
                execution: started.elapsed(),
            });
            // The caller has its result; now tear the used isolate down (reported as preparing).
            // A worker with stock left counts as ready meanwhile: the next call waits the few
            // milliseconds for it rather than for a boot on a worker without one.
            guard.set(WorkerState::Initializing);
            if stock.len() > 0 {
                self.announce(true);
            }
            drop(used);
            guard.set(WorkerState::Idle);
        }
        drop(stock);
        tracing::debug!(worker = self.index, "worker stopped");
    }

    /// Boots a sandbox, as the worker's `initializing` state, recording how long it took.
    fn boot(
        &self,
        guard: &LiveGuard,
        phase: InitPhase,
        flavor: B::Flavor,
    ) -> Result<B::Sandbox, String> {
        guard.set(WorkerState::Initializing);
        let started = Instant::now();
        let mut sandbox = self.backend.boot(flavor);
        let took = started.elapsed();
        telemetry::isolate_initialization(phase, sandbox.is_ok(), took);
        tracing::debug!(
            worker = self.index,
            phase = ?phase,
            flavor = ?flavor,
            ok = sandbox.is_ok(),
            ms = took.as_secs_f64() * 1000.0,
            "sandbox boot"
        );
        // A sandbox prepared ahead of its call settles now rather than during the call; not when a
        // job already waits for it (settling would only delay that job).
        if !matches!(phase, InitPhase::OnDemand)
            && !self.jobs_waiting()
            && let Ok(sandbox) = &mut sandbox
        {
            self.backend.settle(sandbox);
        }
        guard.set(WorkerState::Idle);
        sandbox
    }

    fn jobs_waiting(&self) -> bool {
        self.shared.lock().is_some_and(|q| !q.jobs.is_empty())
    }

    /// Counts this worker in or out of the workers with a ready sandbox.
    fn announce(&self, ready: bool) {
        if let Some(mut queue) = self.shared.lock() {
            self.announce_in(&mut queue, ready);
        }
    }

    fn announce_in(&self, queue: &mut Queue<B::Job, B::Output>, ready: bool) {
        if self.announced.replace(ready) != ready {
            if ready {
                queue.ready_idle += 1;
            } else {
                queue.ready_idle -= 1;
                // Workers without a sandbox may now be the only idle ones.
                self.shared.available.notify_all();
            }
        }
    }

    /// The next job in FIFO order, or `Refill` when `refill` is set and no job came within it;
    /// `Closed` when the pool shuts down (or its queue broke). A worker without a ready sandbox takes
    /// a job only when no idle worker has one, so a call finds a ready sandbox whenever one exists.
    fn next_job(
        &self,
        has_ready_sandbox: bool,
        refill: Option<Duration>,
    ) -> Next<B::Job, B::Output> {
        let Some(mut queue) = self.shared.lock() else {
            return Next::Closed;
        };
        self.announce_in(&mut queue, has_ready_sandbox);
        let deadline = refill.map(|pause| Instant::now() + pause);
        let next = loop {
            if !queue.jobs.is_empty() && (has_ready_sandbox || queue.ready_idle == 0) {
                let job = queue.jobs.pop_front();
                telemetry::queue_depth(queue.jobs.len());
                break job.map_or(Next::Closed, Next::Run);
            }
            if queue.closed {
                break Next::Closed;
            }
            let waited = match deadline {
                None => self.shared.available.wait(queue),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Next::Refill;
                    }
                    self.shared
                        .available
                        .wait_timeout(queue, left)
                        .map(|(q, _)| q)
                        .map_err(|e| std::sync::PoisonError::new(e.into_inner().0))
                }
            };
            queue = match waited {
                Ok(q) => q,
                Err(_) => {
                    self.shared.health.poisoned.store(true, Ordering::SeqCst);
                    return Next::Closed;
                }
            };
        };
        self.announce_in(&mut queue, false);
        next
    }
}

impl<B: Backend> Drop for Worker<B> {
    /// A worker that ends, even by panicking, stops counting as ready.
    fn drop(&mut self) {
        if self.announced.get() {
            self.announce(false);
        }
    }
}

#[cfg(test)]
mod tests;
