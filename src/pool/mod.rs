//! The worker pool: dedicated OS threads (never the async runtime's), each running one sandbox at a
//! time, fed by one shared queue of bounded capacity, fair between callers and first come first
//! served within one (`fair.rs`). Prewarmed workers keep a stock of booted
//! sandboxes ready (`ready_sandboxes` each): a call takes one, and the stock is refilled while no
//! call waits, so calls back to back are served from it instead of waiting for a boot. Health is
//! published through atomics only, so probes never touch the queue lock.
//!
//! The pool knows sandboxes only through [`Backend`] ("boot a ready sandbox", "run a job in it"), so
//! its queue, prewarming, cancellation, overload and drain logic are tested without V8 (see the
//! tests below); `engine.rs` implements it for the real engine, and `worker.rs` is one worker's loop
//! and its stock.

mod engine;
pub mod fair;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::telemetry::{self, QueueExit, Rejection};
use worker::Worker;

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
    /// Why a sandbox could not boot or give back memory (its message is shown to the caller and
    /// logged).
    type Error: std::error::Error + Send + 'static;

    /// The kind of sandbox that serves `job` best.
    fn flavor(&self, job: &Self::Job) -> Self::Flavor;

    /// Boots a fresh sandbox of `flavor`; the error is the reason, for the caller and the log.
    fn boot(&self, flavor: Self::Flavor) -> Result<Self::Sandbox, Self::Error>;

    /// Settles a sandbox booted ahead of its call, once no call has come for it for a moment (a
    /// call back to back takes it unsettled).
    fn settle(&self, _sandbox: &mut Self::Sandbox) {}

    /// Called on a worker that has had nothing to do for a moment since its last call or boot
    /// (its stock full, no job waiting): the backend may give freed memory back to the system.
    fn rest(&self) {}

    /// Called on each ready sandbox of a worker that has stayed idle for the configured time
    /// (`WorkerSettings::idle_give_back`) after it rested: the sandbox may give back memory it can
    /// get again on demand, at some cost to the call that takes it. An error means the sandbox
    /// cannot be used any more: the worker drops its stock (newest first, as V8 requires) and boots
    /// a new one.
    fn give_back(&self, _sandbox: &mut Self::Sandbox) -> Result<(), Self::Error> {
        Ok(())
    }

    /// How many sandboxes of `flavor` a prewarmed worker keeps ready, given `settings` (a kind that
    /// holds more memory may be kept fewer of).
    fn stock_size(&self, _flavor: Self::Flavor, settings: &WorkerSettings) -> usize {
        settings.ready_sandboxes
    }

    /// Runs `job`; `cancelled` is set when its caller goes away meanwhile (the run may stop early).
    /// The pool drops the used sandbox after the reply has been sent.
    fn run(
        &self,
        sandbox: &mut Self::Sandbox,
        job: Self::Job,
        cancelled: Arc<AtomicBool>,
    ) -> Self::Output;
}

pub use crate::config::WorkerSettings;

/// A job's outcome and where its time went.
#[derive(Debug)]
pub struct Completed<O> {
    pub result: Result<O, JobError>,
    /// Time spent waiting for a worker.
    pub queue_wait: Duration,
    /// Time on the worker: sandbox start-up (when not prewarmed) plus execution.
    pub execution: Duration,
    /// The part of `execution` spent booting a sandbox, when none was ready.
    pub boot: Option<Duration>,
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

/// Whose a queued job is, as the queue sees it.
#[derive(Debug, Clone, Copy)]
pub struct Lane {
    /// Any number that tells callers apart (0: the one lane of callers not told apart).
    pub id: u64,
    /// Its share when several lanes wait (1 to 100).
    pub weight: u32,
    /// The most jobs it may have waiting; `None`: as many as the queue holds.
    pub max_queued: Option<usize>,
}

impl Default for Lane {
    fn default() -> Self {
        Self {
            id: 0,
            weight: 1,
            max_queued: None,
        }
    }
}

/// Why a job could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "the execution queue is full ({waiting} waiting, workers.queue_capacity = {capacity}); retry later"
    )]
    Overloaded { waiting: usize, capacity: usize },
    /// The caller already has `max` jobs waiting (`quotas.max_queued_calls`).
    #[error(
        "this principal has {waiting} calls waiting for a worker (quotas.max_queued_calls = {max}); retry when one has started"
    )]
    LaneFull { waiting: usize, max: usize },
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
    jobs: fair::FairQueue<Job<J, O>>,
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
    pub fn start(backend: Arc<B>, config: WorkerSettings) -> Result<Self, PoolError> {
        let health = Arc::new(Health::default());
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: fair::FairQueue::default(),
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
            let worker = Worker::new(index, prewarmed, config, backend.clone(), shared.clone());
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

    /// Queues `job` for one anonymous caller; an overload or shutdown error when it cannot be
    /// queued.
    pub fn submit(&self, job: B::Job) -> Result<Ticket<B::Job, B::Output>, SubmitError> {
        self.submit_as(Lane::default(), job)
    }

    /// Queues `job` in `lane`: callers are served in turn (in proportion to their weights), each
    /// one's jobs in their order (see `fair.rs`); refused when the lane already has its
    /// `max_queued` jobs waiting.
    pub fn submit_as(
        &self,
        lane: Lane,
        job: B::Job,
    ) -> Result<Ticket<B::Job, B::Output>, SubmitError> {
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
        if let Some(max) = lane.max_queued {
            let waiting = queue.jobs.lane_len(lane.id);
            if waiting >= max {
                return Err(SubmitError::LaneFull { waiting, max });
            }
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, receiver) = oneshot::channel();
        let started = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicBool::new(false));
        queue.jobs.push(
            lane.id,
            lane.weight,
            Job {
                id,
                job,
                enqueued: Instant::now(),
                started: started.clone(),
                cancelled: cancelled.clone(),
                reply,
            },
        );
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
                queue.jobs.drain()
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
                boot: None,
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
        queue.jobs.position(|j| j.id == self.id)
    }

    /// Waits for the outcome.
    pub async fn wait(&mut self) -> Completed<O> {
        let receiver = self.receiver.as_mut().expect("waited once");
        let completed = receiver.await.unwrap_or(Completed {
            result: Err(JobError::WorkerLost),
            queue_wait: Duration::ZERO,
            execution: Duration::ZERO,
            boot: None,
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
            && let Some(job) = queue.jobs.remove(|j| j.id == self.id)
        {
            telemetry::queue_depth(queue.jobs.len());
            telemetry::queue_wait(QueueExit::Cancelled, job.enqueued.elapsed());
        }
    }
}

#[cfg(test)]
mod tests;
