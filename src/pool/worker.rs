//! One worker thread of the pool: its stock of ready sandboxes (newest last, dropped newest first, as
//! V8 requires of the isolates of one thread), when it refills that stock, which queued job it
//! takes, and its state for the metrics. The queue it takes jobs from and the pool's handle are in
//! `mod.rs`.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Backend, Completed, Health, Job, JobError, Queue, Shared};
use crate::telemetry::{self, InitPhase, QueueExit, WorkerState};

/// How long a worker whose stock can still serve the next call waits for one before it boots a
/// replacement. Calls back to back arrive well within it (the client's round trip), so a burst is
/// served from the stock and the booting waits for the pause after it; without the pause every call
/// would find its worker busy booting the previous call's replacement.
const REFILL_PAUSE: Duration = Duration::from_millis(25);

/// How long a worker with nothing left to do (its stock full) waits for a job before it rests
/// (`Backend::rest`): long enough that a burst of calls, or a run of refills, is over.
pub(super) const REST_PAUSE: Duration = Duration::from_millis(200);

/// How long a sandbox booted for the stock waits for a call before the worker settles it
/// (`Backend::settle`, ~15 ms of CPU for a pre-imported one). A call back to back takes it unsettled
/// rather than waiting for that, and a run of calls leaves the CPU to the boots it needs; a stock
/// that stays idle is settled.
const SETTLE_PAUSE: Duration = REFILL_PAUSE;

pub(super) struct Worker<B: Backend> {
    index: usize,
    prewarmed: bool,
    /// How many sandboxes a prewarmed worker keeps ready (of each kind: see `Backend::stock_size`).
    settings: super::WorkerSettings,
    /// Whether this worker is counted in the queue's `ready_idle`.
    announced: Cell<bool>,
    backend: Arc<B>,
    shared: Arc<Shared<B::Job, B::Output>>,
}

/// What an idle worker does next.
enum Next<J, O> {
    Run(Job<J, O>),
    /// No job came within the pause asked for: boot one for the stock, or rest.
    Woken,
    Closed,
}

/// What a waiting worker knows when it decides how long to wait for a job and what to do if none
/// comes: its stock and its debts, without the sandboxes or the queue.
#[derive(Debug, Clone, Copy)]
struct View {
    prewarmed: bool,
    /// Booting for the stock failed: no retry before the next call.
    refill_failed: bool,
    /// The stock holds a sandbox of the flavor the next call is expected to want (the last one's).
    serves_wanted: bool,
    stock_len: usize,
    /// How many sandboxes of that flavor the stock keeps.
    stock_size: usize,
    has_unsettled: bool,
    /// It has called or booted since it last rested.
    rest_due: bool,
    /// Its stock is to give back memory once it has stayed idle long enough.
    give_back_due: bool,
    idle_give_back: Option<Duration>,
}

/// How a waiting worker waits: for how long (`None`: until a job or the end), whether a job may
/// wait for this worker's boot, and what it does when the time passes without a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    wake_after: Option<Duration>,
    boots_for_jobs: bool,
    on_wake: Action,
}

/// What a worker does when no job came in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Settle the newest unsettled ready sandbox (a collection before the next call).
    Settle,
    /// Tell the backend the worker rests (it gives back what used sandboxes freed).
    Rest,
    /// Give back the ready sandboxes' idle memory.
    GiveBack,
    /// Boot one more sandbox for the stock (of the wanted flavor).
    Refill,
}

/// The worker's decision, a pure function of what it knows (see the table tests).
fn plan(v: &View) -> Plan {
    let refill = (v.prewarmed && !v.refill_failed)
        .then(|| {
            if !v.serves_wanted {
                // Nothing to serve the next call with: boot at once.
                Some(Duration::ZERO)
            } else {
                (v.stock_len < v.stock_size.max(1)).then_some(REFILL_PAUSE)
            }
        })
        .flatten();
    let settle = (v.prewarmed && v.has_unsettled).then_some(SETTLE_PAUSE);
    let give_back = v.idle_give_back.filter(|_| v.give_back_due);
    let wake_after = match (refill, settle) {
        (Some(r), Some(s)) => Some(r.min(s)),
        (r, s) => r.or(s).or(v.rest_due.then_some(REST_PAUSE)).or(give_back),
    };
    let on_wake = if settle.is_some() && refill != Some(Duration::ZERO) {
        Action::Settle
    } else if refill.is_none() && v.rest_due {
        Action::Rest
    } else if refill.is_none() {
        Action::GiveBack
    } else {
        Action::Refill
    };
    Plan {
        wake_after,
        // A prewarmed worker boots for its stock, not for a job: a job waits for whichever
        // worker has a sandbox first, not for this worker's boot (see `next_job`).
        boots_for_jobs: !v.prewarmed || v.refill_failed,
        on_wake,
    }
}

/// A worker's ready sandboxes, all of one flavor (the last call's), the newest last, each with
/// whether it has been settled. V8 requires the isolates of one thread to be dropped in the reverse
/// order of their creation, so only the newest is ever taken, a sandbox booted on demand is dropped
/// before anything older, and the stock is dropped newest first.
struct Stock<F, S> {
    sandboxes: Vec<(F, S, bool)>,
}

impl<F: Copy + PartialEq, S> Stock<F, S> {
    /// The newest sandbox if it is of `flavor`.
    fn take(&mut self, flavor: F) -> Option<S> {
        match self.sandboxes.last() {
            Some((f, _, _)) if *f == flavor => {
                telemetry::ready_sandboxes(-1.0);
                self.sandboxes.pop().map(|(_, s, _)| s)
            }
            _ => None,
        }
    }

    /// Whether the next call of `flavor` would find its sandbox here.
    fn serves(&self, flavor: F) -> bool {
        self.sandboxes.last().is_some_and(|(f, _, _)| *f == flavor)
    }

    /// A sandbox not settled yet, marked settled (the caller settles it).
    fn unsettled(&mut self) -> Option<&mut S> {
        let (_, sandbox, settled) = self.sandboxes.iter_mut().rev().find(|(_, _, s)| !*s)?;
        *settled = true;
        Some(sandbox)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.sandboxes.iter_mut().map(|(_, sandbox, _)| sandbox)
    }

    fn has_unsettled(&self) -> bool {
        self.sandboxes.iter().any(|(_, _, settled)| !settled)
    }

    fn len(&self) -> usize {
        self.sandboxes.len()
    }

    fn push(&mut self, flavor: F, sandbox: S, settled: bool) {
        self.sandboxes.push((flavor, sandbox, settled));
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
    pub(super) fn new(
        index: usize,
        prewarmed: bool,
        settings: super::WorkerSettings,
        backend: Arc<B>,
        shared: Arc<Shared<B::Job, B::Output>>,
    ) -> Self {
        Self {
            index,
            prewarmed,
            settings,
            announced: Cell::new(false),
            backend,
            shared,
        }
    }

    pub(super) fn run(self, ack: std::sync::mpsc::Sender<Result<(), String>>) {
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
                Ok(mut sandbox) => {
                    // No call can come before start-up is over: settled at once.
                    self.backend.settle(&mut sandbox);
                    stock.push(wanted, sandbox, true);
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
        // Whether the worker has called or booted since it last rested.
        let mut rest_due = true;
        // Whether the stock is to give back memory once the worker has stayed idle long enough
        // (set when it rests, cleared when it gives back).
        let mut give_back_due = false;
        loop {
            let view = View {
                prewarmed: self.prewarmed,
                refill_failed,
                serves_wanted: stock.serves(wanted),
                stock_len: stock.len(),
                stock_size: self.backend.stock_size(wanted, &self.settings),
                has_unsettled: stock.has_unsettled(),
                rest_due,
                give_back_due,
                idle_give_back: self.settings.idle_give_back,
            };
            let plan = plan(&view);
            let job = match self.next_job(stock.len() > 0, plan.boots_for_jobs, plan.wake_after) {
                Next::Run(job) => job,
                Next::Closed => break,
                Next::Woken if plan.on_wake == Action::Settle => {
                    rest_due = true;
                    // Still counted as ready meanwhile (as while tearing down): a call waits the
                    // few milliseconds for this sandbox rather than for a boot on a worker without.
                    self.announce(true);
                    guard.set(WorkerState::Initializing);
                    if let Some(sandbox) = stock.unsettled() {
                        self.backend.settle(sandbox);
                    }
                    guard.set(WorkerState::Idle);
                    continue;
                }
                Next::Woken if plan.on_wake == Action::Rest => {
                    self.backend.rest();
                    rest_due = false;
                    give_back_due = stock.len() > 0;
                    continue;
                }
                Next::Woken if plan.on_wake == Action::GiveBack => {
                    let mut failed = None;
                    for sandbox in stock.iter_mut() {
                        if let Err(e) = self.backend.give_back(sandbox) {
                            failed = Some(e);
                            break;
                        }
                    }
                    give_back_due = false;
                    if let Some(e) = failed {
                        tracing::error!(worker = self.index, error = %e, "a ready sandbox could not give back memory; the worker's ready sandboxes are replaced");
                        guard.set(WorkerState::Initializing);
                        stock.clear();
                        guard.set(WorkerState::Idle);
                    }
                    continue;
                }
                Next::Woken => {
                    rest_due = true;
                    // A stock of another flavor makes way for one of the wanted flavor.
                    if stock.len() > 0 && !stock.serves(wanted) {
                        guard.set(WorkerState::Initializing);
                        stock.clear();
                    }
                    match self.boot(&guard, InitPhase::Replenishment, wanted) {
                        Ok(sandbox) => stock.push(wanted, sandbox, false),
                        Err(e) => {
                            refill_failed = true;
                            tracing::error!(worker = self.index, error = %e, "replacement sandbox failed to boot")
                        }
                    }
                    continue;
                }
            };
            rest_due = true;
            job.started.store(true, Ordering::SeqCst);
            let queue_wait = job.enqueued.elapsed();
            telemetry::queue_wait(QueueExit::Dispatched, queue_wait);
            let started = Instant::now();
            let flavor = self.backend.flavor(&job.job);
            wanted = flavor;
            refill_failed = false;
            // A ready sandbox of another kind waits for a later call.
            let (sandbox, boot) = match stock.take(flavor) {
                Some(sandbox) => (Ok(sandbox), None),
                None => {
                    let sandbox = self.boot(&guard, InitPhase::OnDemand, flavor);
                    (sandbox, Some(started.elapsed()))
                }
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
                boot,
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
        // (The reason, from here on, is a message: for the caller, the log and the start-up.)
        let sandbox = self.backend.boot(flavor).map_err(|e| e.to_string());
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
        guard.set(WorkerState::Idle);
        sandbox
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

    /// The next job in FIFO order, or `Woken` when `wake_after` is set and no job came within it;
    /// `Closed` when the pool shuts down (or its queue broke).
    ///
    /// A worker without a ready sandbox takes a job only when it `boots_for_jobs` (it keeps no
    /// stock, or booting for its stock failed) and no idle worker has one, so a call finds a ready
    /// sandbox whenever one exists. A prewarmed worker without one boots for its stock instead and
    /// takes the job only once that boot is done, unless another worker's sandbox was ready first:
    /// a job bound to one worker's boot would wait for it even when the other worker's finishes
    /// earlier (measured back to back: a call arriving while one worker settled its new sandbox
    /// waited for a whole boot on the other).
    fn next_job(
        &self,
        has_ready_sandbox: bool,
        boots_for_jobs: bool,
        wake_after: Option<Duration>,
    ) -> Next<B::Job, B::Output> {
        let Some(mut queue) = self.shared.lock() else {
            return Next::Closed;
        };
        self.announce_in(&mut queue, has_ready_sandbox);
        let deadline = wake_after.map(|pause| Instant::now() + pause);
        let next = loop {
            if !queue.jobs.is_empty()
                && (has_ready_sandbox || (boots_for_jobs && queue.ready_idle == 0))
            {
                let job = queue.jobs.pop();
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
                        break Next::Woken;
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
mod tests {
    use super::*;

    /// A prewarmed worker whose full, settled stock serves the next call, that has just called.
    fn base() -> View {
        View {
            prewarmed: true,
            refill_failed: false,
            serves_wanted: true,
            stock_len: 4,
            stock_size: 4,
            has_unsettled: false,
            rest_due: true,
            give_back_due: false,
            idle_give_back: Some(Duration::from_secs(30)),
        }
    }

    /// A plan as (wake_after, boots_for_jobs, on_wake).
    type Decided = (Option<Duration>, bool, Action);
    /// A case: what it is, how its view differs from [`base`], and the plan.
    type Case = (&'static str, fn(&mut View), Decided);

    fn plan_of(change: impl Fn(&mut View)) -> Decided {
        let mut view = base();
        change(&mut view);
        let p = plan(&view);
        (p.wake_after, p.boots_for_jobs, p.on_wake)
    }

    #[test]
    fn the_worker_decides_from_its_stock_and_its_debts() {
        let thirty = Some(Duration::from_secs(30));
        let table: [Case; 9] = [
            (
                "full and settled, just called: rest after a pause",
                |_| {},
                (Some(REST_PAUSE), false, Action::Rest),
            ),
            (
                "nothing owed: wait for a job without end",
                |v| v.rest_due = false,
                (None, false, Action::GiveBack),
            ),
            (
                "rested with a stock: give back after idle_give_back_s",
                |v| {
                    v.rest_due = false;
                    v.give_back_due = true;
                },
                (thirty, false, Action::GiveBack),
            ),
            (
                "one taken: refill after a pause",
                |v| v.stock_len = 3,
                (Some(REFILL_PAUSE), false, Action::Refill),
            ),
            (
                "nothing of the wanted flavor: boot at once",
                |v| v.serves_wanted = false,
                (Some(Duration::ZERO), false, Action::Refill),
            ),
            (
                "an unsettled sandbox: settle it first",
                |v| v.has_unsettled = true,
                (Some(SETTLE_PAUSE), false, Action::Settle),
            ),
            (
                "unsettled, and nothing of the wanted flavor: the boot comes first",
                |v| {
                    v.has_unsettled = true;
                    v.serves_wanted = false;
                },
                (Some(Duration::ZERO), false, Action::Refill),
            ),
            (
                "a failed refill: no retry, and jobs may wait for this worker's boot",
                |v| {
                    v.refill_failed = true;
                    v.stock_len = 0;
                },
                (Some(REST_PAUSE), true, Action::Rest),
            ),
            (
                "not prewarmed: no stock to keep, boots for jobs",
                |v| {
                    v.prewarmed = false;
                    v.stock_len = 0;
                    v.serves_wanted = false;
                },
                (Some(REST_PAUSE), true, Action::Rest),
            ),
        ];
        for (case, change, expected) in table {
            assert_eq!(plan_of(change), expected, "{case}");
        }
    }
}
