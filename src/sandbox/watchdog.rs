//! The execution timeout: a thread that waits for user code to start, then for it to finish, and
//! terminates the isolate through V8's thread-safe handle when `timeout_ms` runs out first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use deno_core::v8;

/// Messages from the sandbox thread to its watchdog.
pub(crate) enum WatchMsg {
    /// User code started at this instant: the timeout runs from here.
    Arm(Instant),
    /// The execution is over (or abandoned): stop watching.
    Done,
}

/// A running watchdog for one execution.
pub(crate) struct Watchdog {
    tx: Sender<WatchMsg>,
    pub fired: Arc<AtomicBool>,
    pub wake: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(isolate: v8::IsolateHandle, timeout: Duration) -> Self {
        let (tx, rx) = channel();
        let fired = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let thread = {
            let fired = fired.clone();
            let wake = wake.clone();
            std::thread::Builder::new()
                .name("sandbox-watchdog".into())
                .spawn(move || watch(rx, isolate, timeout, &fired, &wake))
                .expect("spawning the watchdog thread")
        };
        Self {
            tx,
            fired,
            wake,
            thread: Some(thread),
        }
    }

    pub fn sender(&self) -> Sender<WatchMsg> {
        self.tx.clone()
    }

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
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

fn watch(
    rx: Receiver<WatchMsg>,
    isolate: v8::IsolateHandle,
    timeout: Duration,
    fired: &AtomicBool,
    wake: &tokio::sync::Notify,
) {
    let started = match rx.recv() {
        Ok(WatchMsg::Arm(at)) => at,
        _ => return,
    };
    let deadline = started + timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(WatchMsg::Arm(_)) => continue,
            Ok(WatchMsg::Done) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => break,
        }
    }
    fired.store(true, Ordering::SeqCst);
    isolate.terminate_execution();
    wake.notify_one();
}
