//! The watchdog of one sandbox's boot or call: a thread that terminates the isolate through V8's
//! thread-safe handle when a deadline passes (the boot's, the call's set-up budget, then `timeout_ms`
//! from the start of the user's code), when the sandbox's memory budget is exceeded (polled every few
//! milliseconds: Python's WebAssembly memory grows without telling anyone), or when the caller
//! cancels. In a session (which has an interrupt buffer) the user's deadline and a cancellation
//! first interrupt Python, and terminate only if it has not stopped within [`INTERRUPT_GRACE`].
//! Whatever it stops, it says why ([`Stop`]) and wakes the thread that waits for the isolate.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deno_core::v8;

use crate::sandbox::memory::MemoryBudget;

/// How often the memory budget and the cancellation flag are checked.
const POLL: Duration = Duration::from_millis(10);

/// What a deadline bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The sandbox starting.
    Boot,
    /// A call's set-up: input files, package loading.
    Setup,
    /// The user's code.
    User,
}

/// How long a session's code has to stop after its interrupt before the isolate is terminated.
pub(crate) const INTERRUPT_GRACE: Duration = Duration::from_secs(1);

/// Why the watchdog stopped the isolate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// A deadline passed; the isolate was terminated.
    Deadline(Phase),
    /// The memory budget was exceeded; the isolate was terminated.
    MemoryBudget,
    /// The caller cancelled; the isolate was terminated.
    Cancelled,
    /// The interpreter failed fatally (see `op_sandbox_fatal`); the isolate was terminated at once.
    Fatal,
    /// In a session, `timeout_ms` ran out or the caller cancelled while the user's code ran: Python
    /// was interrupted (KeyboardInterrupt) and stopped within `INTERRUPT_GRACE`, so the isolate was
    /// left running.
    Interrupted(Interrupt),
}

/// What a session's interrupt answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    Timeout,
    Cancel,
}

impl Stop {
    fn encode(self) -> u8 {
        match self {
            Stop::Deadline(Phase::Boot) => 1,
            Stop::Deadline(Phase::Setup) => 2,
            Stop::Deadline(Phase::User) => 3,
            Stop::MemoryBudget => 4,
            Stop::Cancelled => 5,
            Stop::Interrupted(Interrupt::Timeout) => 6,
            Stop::Interrupted(Interrupt::Cancel) => 7,
            Stop::Fatal => 8,
        }
    }

    fn decode(value: u8) -> Option<Self> {
        Some(match value {
            1 => Stop::Deadline(Phase::Boot),
            2 => Stop::Deadline(Phase::Setup),
            3 => Stop::Deadline(Phase::User),
            4 => Stop::MemoryBudget,
            5 => Stop::Cancelled,
            6 => Stop::Interrupted(Interrupt::Timeout),
            7 => Stop::Interrupted(Interrupt::Cancel),
            8 => Stop::Fatal,
            _ => return None,
        })
    }
}

/// Messages to a watchdog.
pub(crate) enum WatchMsg {
    /// `phase` runs until `deadline`.
    Arm(Phase, Instant),
    /// The interpreter failed fatally: stop the call now.
    Fatal,
    /// The execution is over (or abandoned): stop watching.
    Done,
}

/// What the watchdog and the sandbox thread share.
struct Shared {
    stop: AtomicU8,
    wake: tokio::sync::Notify,
    /// The deadline in force, for the ops that must bound their own blocking work.
    deadline: Mutex<Option<Instant>>,
}

/// A running watchdog.
pub(crate) struct Watchdog {
    tx: Sender<WatchMsg>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A handle for arming the watchdog and reading its deadline, kept by the sandbox's ops.
#[derive(Clone)]
pub(crate) struct Arming {
    tx: Sender<WatchMsg>,
    shared: Arc<Shared>,
}

impl Arming {
    /// `phase` starts now and may run for `limit`.
    pub fn arm(&self, phase: Phase, limit: Duration) {
        let deadline = Instant::now() + limit;
        *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        let _ = self.tx.send(WatchMsg::Arm(phase, deadline));
    }

    /// The interpreter failed fatally: the call is stopped at once (nothing of it can still run).
    pub fn fatal(&self) {
        let _ = self.tx.send(WatchMsg::Fatal);
    }

    /// The deadline in force, if any.
    pub fn deadline(&self) -> Option<Instant> {
        *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchdog {
    /// Starts watching `isolate`; with `budget`, its memory too; with `cancel`, the caller's flag;
    /// with `interrupt` (a session's), the user's deadline first interrupts Python and terminates
    /// only if it has not stopped within `INTERRUPT_GRACE`.
    pub fn start(
        isolate: v8::IsolateHandle,
        budget: Option<Arc<MemoryBudget>>,
        cancel: Option<Arc<AtomicBool>>,
        interrupt: Option<Arc<AtomicI32>>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            stop: AtomicU8::new(0),
            wake: tokio::sync::Notify::new(),
            deadline: Mutex::new(None),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("sandbox-watchdog".into())
                .spawn(move || {
                    let watched = Watched {
                        isolate,
                        budget,
                        cancel,
                        interrupt,
                    };
                    watch(rx, watched, &shared)
                })?
        };
        Ok(Self {
            tx,
            shared,
            thread: Some(thread),
        })
    }

    pub fn arming(&self) -> Arming {
        Arming {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Why the isolate was stopped, if it was.
    pub fn stopped(&self) -> Option<Stop> {
        Stop::decode(self.shared.stop.load(Ordering::SeqCst))
    }

    /// Resolves when the watchdog stops the isolate.
    pub async fn fired(&self) {
        self.shared.wake.notified().await
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.tx.send(WatchMsg::Done);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a watchdog watches.
struct Watched {
    isolate: v8::IsolateHandle,
    budget: Option<Arc<MemoryBudget>>,
    cancel: Option<Arc<AtomicBool>>,
    interrupt: Option<Arc<AtomicI32>>,
}

fn watch(rx: Receiver<WatchMsg>, watched: Watched, shared: &Shared) {
    let Watched {
        isolate,
        budget,
        cancel,
        interrupt,
    } = watched;
    let polling = budget.is_some() || cancel.is_some();
    let mut armed: Option<(Phase, Instant)> = None;
    let stop = loop {
        let now = Instant::now();
        if let Some((phase, deadline)) = armed
            && now >= deadline
        {
            if phase == Phase::User
                && let Some(buffer) = &interrupt
                && interrupted(buffer, &rx, shared, Interrupt::Timeout)
            {
                return;
            }
            break Stop::Deadline(phase);
        }
        if let Some(budget) = &budget
            && (budget.exceeded() || budget.used() > budget.limit())
        {
            budget.exceed();
            break Stop::MemoryBudget;
        }
        if cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst)) {
            // Only the user's code can answer an interrupt: a call still setting up is terminated.
            if armed.is_some_and(|(phase, _)| phase == Phase::User)
                && let Some(buffer) = &interrupt
                && interrupted(buffer, &rx, shared, Interrupt::Cancel)
            {
                return;
            }
            break Stop::Cancelled;
        }
        let until_deadline = armed.map(|(_, deadline)| deadline.saturating_duration_since(now));
        let message = match (until_deadline, polling) {
            (Some(wait), true) => rx.recv_timeout(wait.min(POLL)),
            (Some(wait), false) => rx.recv_timeout(wait),
            (None, true) => rx.recv_timeout(POLL),
            (None, false) => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match message {
            Ok(WatchMsg::Arm(phase, deadline)) => armed = Some((phase, deadline)),
            Ok(WatchMsg::Fatal) => break Stop::Fatal,
            Ok(WatchMsg::Done) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
    };
    shared.stop.store(stop.encode(), Ordering::SeqCst);
    isolate.terminate_execution();
    shared.wake.notify_one();
    // deno_core cancels a termination to turn it into an error (and may run user code meanwhile,
    // an error's getters): keep terminating until the sandbox thread is done with the isolate.
    loop {
        match rx.recv_timeout(POLL) {
            Ok(WatchMsg::Done) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(WatchMsg::Arm(..) | WatchMsg::Fatal) | Err(RecvTimeoutError::Timeout) => {
                isolate.terminate_execution();
            }
        }
    }
}

/// Interrupts a session's Python (SIGINT: KeyboardInterrupt at its next check) and waits up to
/// `INTERRUPT_GRACE` for the call to end; true when it did (the isolate stays usable).
fn interrupted(
    buffer: &AtomicI32,
    rx: &Receiver<WatchMsg>,
    shared: &Shared,
    why: Interrupt,
) -> bool {
    buffer.store(2, Ordering::SeqCst);
    shared
        .stop
        .store(Stop::Interrupted(why).encode(), Ordering::SeqCst);
    let grace = Instant::now() + INTERRUPT_GRACE;
    loop {
        match rx.recv_timeout(grace.saturating_duration_since(Instant::now())) {
            Ok(WatchMsg::Done) | Err(RecvTimeoutError::Disconnected) => return true,
            Ok(WatchMsg::Arm(..)) => {}
            // The interpreter died while it was being interrupted: terminate.
            Ok(WatchMsg::Fatal) | Err(RecvTimeoutError::Timeout) => return false,
        }
    }
}
