//! The pool's logic against a fake backend: no V8, and no sleeps but one that checks that nothing
//! happens. Jobs report when they start and wait for the test to release them, so every ordering
//! below is forced by channels.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::executor::block_on;

use super::{Backend, JobError, Pool, PoolError, SubmitError, WorkerSettings};

mod stock;

/// Boots numbered sandboxes (or fails to, when told), runs jobs that announce themselves.
#[derive(Default)]
struct Fake {
    boots: AtomicUsize,
    fail_boots: AtomicBool,
    /// (job name, sandbox number) in the order jobs started.
    ran: Mutex<Vec<(&'static str, usize)>>,
    settled: AtomicUsize,
    /// The cancellation flag of the last job run.
    cancelled: Mutex<Option<Arc<AtomicBool>>>,
    /// The flavor of every sandbox booted, in order.
    flavors: Mutex<Vec<u8>>,
    /// Sandboxes alive, oldest first, and how often one was dropped before a newer one (V8 aborts
    /// the process when isolates of one thread are dropped out of order).
    alive: Arc<Mutex<Vec<usize>>>,
    out_of_order: Arc<AtomicUsize>,
    /// How many sandboxes had been booted at each rest.
    rests: Mutex<Vec<usize>>,
    /// The sandboxes that gave back memory, in order.
    given_back: Mutex<Vec<usize>>,
    /// Giving back fails (the sandbox is unusable after it).
    fail_give_back: AtomicBool,
    /// When set, the next boot reports its start and waits for the release.
    boot_gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// The same for the next settling.
    settle_gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

/// If `gate` is set: reports that it is reached, and waits for the release (once).
fn pass(gate: &Mutex<Option<(Sender<()>, Receiver<()>)>>) {
    let gate = gate.lock().unwrap().take();
    if let Some((reached, release)) = gate {
        let _ = reached.send(());
        let _ = release.recv();
    }
}

/// A fake sandbox: its number, and the record of live sandboxes it leaves when dropped.
struct FakeSandbox {
    number: usize,
    alive: Arc<Mutex<Vec<usize>>>,
    out_of_order: Arc<AtomicUsize>,
}

impl Drop for FakeSandbox {
    fn drop(&mut self) {
        let mut alive = self.alive.lock().unwrap();
        if alive.last() != Some(&self.number) {
            self.out_of_order.fetch_add(1, Ordering::SeqCst);
        }
        alive.retain(|n| *n != self.number);
    }
}

struct FakeJob {
    name: &'static str,
    /// Told when the job starts running.
    started: Option<Sender<()>>,
    /// The job runs until this is released (or dropped).
    hold: Option<Receiver<()>>,
    panic: bool,
    /// The kind of sandbox it asks for.
    flavor: u8,
}

impl FakeJob {
    fn quick(name: &'static str) -> Self {
        Self {
            name,
            started: None,
            hold: None,
            panic: false,
            flavor: 0,
        }
    }

    fn of_flavor(name: &'static str, flavor: u8) -> Self {
        Self {
            flavor,
            ..Self::quick(name)
        }
    }

    /// A job that reports its start and then waits for the returned sender.
    fn held(name: &'static str) -> (Self, Receiver<()>, Sender<()>) {
        let (started_tx, started_rx) = channel();
        let (release_tx, release_rx) = channel();
        let job = Self {
            name,
            started: Some(started_tx),
            hold: Some(release_rx),
            panic: false,
            flavor: 0,
        };
        (job, started_rx, release_tx)
    }
}

/// The fake's failures, by their message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(&'static str);

impl Backend for Fake {
    type Sandbox = FakeSandbox;
    type Job = FakeJob;
    type Output = (&'static str, usize);
    type Flavor = u8;
    type Error = Failed;

    fn flavor(&self, job: &FakeJob) -> u8 {
        job.flavor
    }

    fn boot(&self, flavor: u8) -> Result<FakeSandbox, Failed> {
        if self.fail_boots.load(Ordering::SeqCst) {
            return Err(Failed("no sandbox today"));
        }
        pass(&self.boot_gate);
        self.flavors.lock().unwrap().push(flavor);
        let number = self.boots.fetch_add(1, Ordering::SeqCst) + 1;
        self.alive.lock().unwrap().push(number);
        Ok(FakeSandbox {
            number,
            alive: self.alive.clone(),
            out_of_order: self.out_of_order.clone(),
        })
    }

    fn settle(&self, _sandbox: &mut FakeSandbox) {
        pass(&self.settle_gate);
        self.settled.fetch_add(1, Ordering::SeqCst);
    }

    fn rest(&self) {
        let boots = self.boots.load(Ordering::SeqCst);
        self.rests.lock().unwrap().push(boots);
    }

    fn give_back(&self, sandbox: &mut FakeSandbox) -> Result<(), Failed> {
        self.given_back.lock().unwrap().push(sandbox.number);
        if self.fail_give_back.load(Ordering::SeqCst) {
            return Err(Failed("the memory is gone"));
        }
        Ok(())
    }

    /// Flavor 2 stands for a kind that holds more memory: one is kept ready.
    fn stock_size(&self, flavor: u8, settings: &WorkerSettings) -> usize {
        if flavor == 2 {
            1
        } else {
            settings.ready_sandboxes
        }
    }

    fn run(
        &self,
        sandbox: &mut FakeSandbox,
        job: FakeJob,
        cancelled: Arc<AtomicBool>,
    ) -> (&'static str, usize) {
        *self.cancelled.lock().unwrap() = Some(cancelled);
        self.ran.lock().unwrap().push((job.name, sandbox.number));
        if let Some(started) = job.started {
            let _ = started.send(());
        }
        if let Some(hold) = job.hold {
            let _ = hold.recv();
        }
        if job.panic {
            panic!("the fake job panics");
        }
        (job.name, sandbox.number)
    }
}

fn pool(backend: &Arc<Fake>, workers: usize, queue: usize, prewarmed: usize) -> Pool<Fake> {
    stocked_pool(backend, workers, queue, prewarmed, 1)
}

fn stocked_pool(
    backend: &Arc<Fake>,
    workers: usize,
    queue: usize,
    prewarmed: usize,
    ready_sandboxes: usize,
) -> Pool<Fake> {
    Pool::start(
        backend.clone(),
        settings(workers, queue, prewarmed, ready_sandboxes),
    )
    .expect("pool starts")
}

/// Pool settings: `prewarmed` of `workers` keep `ready_sandboxes` each; no idle give-back.
fn settings(
    workers: usize,
    queue: usize,
    prewarmed: usize,
    ready_sandboxes: usize,
) -> WorkerSettings {
    WorkerSettings {
        max_workers: workers,
        queue_capacity: queue,
        prewarmed_workers: prewarmed,
        ready_sandboxes,
        ready_preimported_sandboxes: ready_sandboxes,
        idle_give_back: None,
    }
}

/// Whether a worker with a ready sandbox waits for a job.
fn ready_idle(pool: &Pool<Fake>) -> bool {
    pool.shared.lock().unwrap().ready_idle > 0
}

fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn jobs_run_in_fifo_order_and_return_their_output() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 8, 0);
    let (first, started, release) = FakeJob::held("first");
    let mut a = pool.submit(first).unwrap();
    started.recv().unwrap();
    let mut b = pool.submit(FakeJob::quick("second")).unwrap();
    let mut c = pool.submit(FakeJob::quick("third")).unwrap();
    assert_eq!((b.position(), c.position()), (Some(1), Some(2)));
    assert!(a.started() && !b.started());
    release.send(()).unwrap();
    let outputs: Vec<_> = [&mut a, &mut b, &mut c]
        .into_iter()
        .map(|t| block_on(t.wait()).result.unwrap().0)
        .collect();
    assert_eq!(outputs, ["first", "second", "third"]);
    let ran: Vec<_> = fake.ran.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(ran, ["first", "second", "third"]);
    // Not prewarmed: one sandbox booted on demand per job, each used once.
    assert_eq!(fake.boots.load(Ordering::SeqCst), 3);
}

#[test]
fn a_full_queue_refuses_at_once() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 1, 0);
    let (running, started, release) = FakeJob::held("running");
    let mut a = pool.submit(running).unwrap();
    started.recv().unwrap();
    let mut b = pool.submit(FakeJob::quick("queued")).unwrap();
    let refused = pool.submit(FakeJob::quick("refused")).err().unwrap();
    assert_eq!(
        refused,
        SubmitError::Overloaded {
            waiting: 1,
            capacity: 1
        }
    );
    assert!(refused.to_string().contains("workers.queue_capacity = 1"));
    release.send(()).unwrap();
    assert!(block_on(a.wait()).result.is_ok());
    assert!(block_on(b.wait()).result.is_ok());
}

#[test]
fn dropping_a_queued_ticket_removes_its_job() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 8, 0);
    let (running, started, release) = FakeJob::held("running");
    let mut a = pool.submit(running).unwrap();
    started.recv().unwrap();
    let cancelled = pool.submit(FakeJob::quick("cancelled")).unwrap();
    let mut kept = pool.submit(FakeJob::quick("kept")).unwrap();
    assert_eq!(kept.position(), Some(2));
    drop(cancelled);
    assert_eq!(kept.position(), Some(1), "the cancelled job left the queue");
    release.send(()).unwrap();
    block_on(a.wait()).result.unwrap();
    block_on(kept.wait()).result.unwrap();
    let ran: Vec<_> = fake.ran.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(ran, ["running", "kept"]);
}

#[test]
fn a_prewarmed_sandbox_takes_the_call_and_is_replaced_after_it() {
    let fake = Arc::new(Fake::default());
    // Two workers, one prewarmed: start-up boots exactly one sandbox and settles it.
    let pool = pool(&fake, 2, 8, 1);
    assert_eq!(fake.boots.load(Ordering::SeqCst), 1);
    assert_eq!(fake.settled.load(Ordering::SeqCst), 1);
    wait_until("the prewarmed worker to wait", || ready_idle(&pool));
    let mut t = pool.submit(FakeJob::quick("call")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("call", 1));
    // The prewarmed worker boots its replacement, and settles it once no call came for it; the
    // other worker booted nothing.
    wait_until("the replacement", || ready_idle(&pool));
    wait_until("the replacement settled", || {
        fake.settled.load(Ordering::SeqCst) == 2
    });
    assert_eq!(fake.boots.load(Ordering::SeqCst), 2);
    let mut t = pool.submit(FakeJob::quick("next")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("next", 2));
}

#[test]
fn a_waiting_call_takes_the_first_sandbox_ready_not_one_workers_boot() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 2, 8, 2);
    wait_until("both workers ready", || {
        pool.shared.lock().unwrap().ready_idle == 2
    });
    assert_eq!(fake.settled.load(Ordering::SeqCst), 2);
    // Two calls held running use both stocks, and a third waits behind them.
    let (first, first_started, release_first) = FakeJob::held("first");
    let (second, second_started, release_second) = FakeJob::held("second");
    let mut a = pool.submit(first).unwrap();
    let mut b = pool.submit(second).unwrap();
    first_started.recv().unwrap();
    second_started.recv().unwrap();
    let mut c = pool.submit(FakeJob::quick("third")).unwrap();
    // The first worker's next boot is slow.
    let (boot_started_tx, boot_started) = channel();
    let (release_boot, boot_release_rx) = channel();
    *fake.boot_gate.lock().unwrap() = Some((boot_started_tx, boot_release_rx));
    release_first.send(()).unwrap();
    block_on(a.wait()).result.unwrap();
    boot_started.recv().unwrap();
    // The second worker finishes meanwhile and boots: the third call takes that sandbox (3: a
    // fake sandbox is numbered when its boot ends), unsettled, instead of waiting for the slow boot
    // it would be bound to had the first worker booted for it.
    release_second.send(()).unwrap();
    block_on(b.wait()).result.unwrap();
    wait_until("the third call to run", || {
        fake.ran
            .lock()
            .unwrap()
            .iter()
            .any(|(name, _)| *name == "third")
    });
    release_boot.send(()).unwrap();
    assert_eq!(block_on(c.wait()).result.unwrap(), ("third", 3));
    // The slow boot went to its worker's stock, and is settled once no call comes; so is the
    // second worker's next one.
    wait_until("both stocks full and settled", || {
        fake.boots.load(Ordering::SeqCst) == 5 && fake.settled.load(Ordering::SeqCst) == 4
    });
}

#[test]
fn a_call_waits_for_a_worker_settling_its_sandbox_rather_than_a_boot_elsewhere() {
    let fake = Arc::new(Fake::default());
    // One prewarmed worker and one without a stock.
    let pool = pool(&fake, 2, 8, 1);
    wait_until("the prewarmed worker to wait", || ready_idle(&pool));
    let (settle_started_tx, settle_started) = channel();
    let (release_settle, settle_release_rx) = channel();
    *fake.settle_gate.lock().unwrap() = Some((settle_started_tx, settle_release_rx));
    let mut t = pool.submit(FakeJob::quick("first")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("first", 1));
    // The replacement (2) is settled once no call came for it; a call arriving meanwhile waits.
    settle_started.recv().unwrap();
    let mut t = pool.submit(FakeJob::quick("second")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    release_settle.send(()).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("second", 2));
    wait_until("the next replacement", || {
        fake.boots.load(Ordering::SeqCst) == 3
    });
    assert_eq!(
        *fake.flavors.lock().unwrap(),
        [0, 0, 0],
        "no boot but the stock's"
    );
}

#[test]
fn dropping_the_ticket_of_a_running_job_tells_it_to_stop() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 8, 0);
    let (running, started, release) = FakeJob::held("running");
    let ticket = pool.submit(running).unwrap();
    started.recv().unwrap();
    let flag = fake.cancelled.lock().unwrap().clone().unwrap();
    assert!(!flag.load(Ordering::SeqCst));
    drop(ticket);
    assert!(
        flag.load(Ordering::SeqCst),
        "the running job was told to stop"
    );
    release.send(()).unwrap();
    // The worker is free again.
    let mut next = pool.submit(FakeJob::quick("next")).unwrap();
    assert_eq!(block_on(next.wait()).result.unwrap().0, "next");
}

#[test]
fn shutdown_answers_queued_jobs_lets_running_ones_finish_and_refuses_new_ones() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 8, 0);
    let health = pool.health();
    assert!(health.ready());
    let (running, started, release) = FakeJob::held("running");
    let mut a = pool.submit(running).unwrap();
    started.recv().unwrap();
    let mut queued = pool.submit(FakeJob::quick("queued")).unwrap();
    pool.shutdown();
    assert!(!health.ready() && health.live());
    assert_eq!(
        block_on(queued.wait()).result.unwrap_err(),
        JobError::ShuttingDown
    );
    assert_eq!(
        pool.submit(FakeJob::quick("late")).err().unwrap(),
        SubmitError::ShuttingDown
    );
    assert!(!pool.workers_exited(), "the running job holds its worker");
    release.send(()).unwrap();
    assert_eq!(block_on(a.wait()).result.unwrap().0, "running");
    wait_until("the worker to exit", || pool.workers_exited());
    assert!(health.live(), "a drained pool is not a failed one");
}

#[test]
fn a_panicking_worker_is_reported_lost_and_counted() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 2, 8, 0);
    let health = pool.health();
    let mut job = FakeJob::quick("boom");
    job.panic = true;
    let mut t = pool.submit(job).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap_err(), JobError::WorkerLost);
    wait_until("the exit to be counted", || {
        health.unexpected_exits.load(Ordering::SeqCst) == 1
    });
    // One of two workers lost: still live and ready; the other one serves.
    assert!(health.live() && health.ready());
    let mut t = pool.submit(FakeJob::quick("after")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap().0, "after");
    // Losing the last worker too fails liveness.
    let mut job = FakeJob::quick("boom again");
    job.panic = true;
    let mut t = pool.submit(job).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap_err(), JobError::WorkerLost);
    wait_until("liveness to fail", || !health.live());
    assert!(!health.ready());
}

#[test]
fn boot_failures_fail_the_job_or_the_start() {
    let fake = Arc::new(Fake::default());
    fake.fail_boots.store(true, Ordering::SeqCst);
    let pool = pool(&fake, 1, 8, 0);
    let mut t = pool.submit(FakeJob::quick("x")).unwrap();
    assert_eq!(
        block_on(t.wait()).result.unwrap_err(),
        JobError::Boot("no sandbox today".into())
    );
    assert!(
        pool.health().ready(),
        "a failed boot does not kill the worker"
    );

    let error = Pool::start(fake.clone(), settings(2, 8, 1, 1))
        .err()
        .unwrap();
    assert!(
        matches!(&error, PoolError::Prewarm { worker: 0, message } if message == "no sandbox today"),
        "{error}"
    );
}

#[test]
fn a_worker_without_a_sandbox_leaves_the_call_to_an_idle_prewarmed_one() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 2, 8, 1);
    wait_until("the prewarmed worker to wait", || ready_idle(&pool));
    for name in ["a", "b", "c"] {
        let mut t = pool.submit(FakeJob::quick(name)).unwrap();
        let (_, sandbox) = block_on(t.wait()).result.unwrap();
        // Calls one at a time, each once the replacement is ready: each finds it, never an
        // on-demand boot by the other worker (which would make the number of boots run ahead).
        wait_until("the replacement", || ready_idle(&pool));
        assert_eq!(fake.boots.load(Ordering::SeqCst), sandbox + 1);
    }
    assert_eq!(fake.boots.load(Ordering::SeqCst), 4);
}

#[test]
fn a_call_gets_a_sandbox_of_its_flavor_and_the_next_ready_one_follows_it() {
    let fake = Arc::new(Fake::default());
    let pool = pool(&fake, 1, 8, 1);
    wait_until("the prewarmed worker to wait", || ready_idle(&pool));
    let flavors = || fake.flavors.lock().unwrap().clone();
    // Start-up prepares the default flavor.
    assert_eq!(flavors(), [0]);
    // A call of another flavor: booted on demand, then the ready sandbox follows the call's flavor.
    let mut t = pool.submit(FakeJob::of_flavor("data", 1)).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("data", 2));
    // (The worker counts as ready at once here: it still holds the other flavor's sandbox.)
    wait_until("the replacement", || flavors().len() == 3);
    assert_eq!(flavors(), [0, 1, 1]);
    // The next call of that flavor finds it ready.
    let mut t = pool.submit(FakeJob::of_flavor("more data", 1)).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("more data", 3));
    wait_until("the replacement", || ready_idle(&pool));
    assert_eq!(flavors(), [0, 1, 1, 1]);
    // And a default call after it boots its own.
    let mut t = pool.submit(FakeJob::quick("plain")).unwrap();
    assert_eq!(block_on(t.wait()).result.unwrap(), ("plain", 5));
    // (Again ready at once.)
    wait_until("the replacement", || flavors().len() == 6);
    assert_eq!(flavors(), [0, 1, 1, 1, 0, 0]);
}
