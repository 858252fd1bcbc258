//! A bounded executor: a fixed set of dedicated OS threads (never the async runtime's) that each boot a
//! fresh sandbox per job, fed by one FIFO queue of limited capacity. A full queue refuses at once.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::sandbox::{Engine, ErrorKind, ExecError, ExecRequest, ExecResult};

struct Job {
    request: ExecRequest,
    enqueued: Instant,
    reply: oneshot::Sender<Completed>,
}

/// An execution's result and where its time went.
#[derive(Debug)]
pub struct Completed {
    pub result: ExecResult,
    /// Time spent waiting for a worker.
    pub queue_wait: Duration,
    /// Time on the worker: sandbox start-up plus execution.
    pub execution: Duration,
}

impl Completed {
    fn immediate(result: ExecResult) -> Self {
        Self {
            result,
            queue_wait: Duration::ZERO,
            execution: Duration::ZERO,
        }
    }
}

/// Handle for submitting executions.
#[derive(Clone)]
pub struct Executor {
    queue: SyncSender<Job>,
}

impl Executor {
    /// Starts `workers` threads sharing a queue of `queue_capacity` waiting jobs.
    pub fn start(engine: Engine, workers: usize, queue_capacity: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Job>(queue_capacity);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            let engine = engine.clone();
            std::thread::Builder::new()
                .name(format!("python-worker-{i}"))
                .stack_size(8 * 1024 * 1024)
                .spawn(move || worker(engine, rx))?;
        }
        Ok(Self { queue: tx })
    }

    /// Runs `request` on a worker; an overload or runtime error result when it cannot be queued.
    pub async fn execute(&self, request: ExecRequest) -> Completed {
        let (reply, result) = oneshot::channel();
        let job = Job {
            request,
            enqueued: Instant::now(),
            reply,
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Completed::immediate(ExecResult::failure(ExecError::new(
                    ErrorKind::Overload,
                    "Overloaded",
                    "the execution queue is full; retry later",
                )));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Completed::immediate(ExecResult::failure(ExecError::new(
                    ErrorKind::Runtime,
                    "Unavailable",
                    "no execution workers are running",
                )));
            }
        }
        result.await.unwrap_or_else(|_| {
            Completed::immediate(ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "WorkerLost",
                "the worker running this execution stopped",
            )))
        })
    }
}

fn worker(engine: Engine, rx: Arc<Mutex<Receiver<Job>>>) {
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        if job.reply.is_closed() {
            continue; // the caller went away while queued
        }
        let queue_wait = job.enqueued.elapsed();
        let started = Instant::now();
        let result = engine.execute(job.request);
        let _ = job.reply.send(Completed {
            result,
            queue_wait,
            execution: started.elapsed(),
        });
    }
}
