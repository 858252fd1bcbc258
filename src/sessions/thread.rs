//! A session's thread: boots its sandbox (fresh, or restored from an image), answers, then runs its
//! jobs in order until the session ends or is spilled (its channel closes), or its sandbox can run
//! nothing more, which it reports to the manager before it answers the call that found out, so the
//! next call already hears the session has ended. After every call it checks whether the session
//! can still be saved, and says so with the result. A *spare* thread is started ahead of the next
//! session with a sandbox parked on it (see `Backend::park`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{Backend, Inner, KeepOutputs, SessionId, SessionRun};

use crate::sandbox::{ExecRequest, FileListing, FileRead};

/// One job's place in its session's queue: counted from when it is queued until its thread is done
/// with it (run, skipped, or dropped with the queue), whether its caller still waits or not. A job's
/// place is given back before its reply is sent, so a caller that has its reply finds the session
/// idle.
pub(super) struct Pending(Arc<AtomicUsize>);

impl Pending {
    /// A place, unless `max` jobs are already queued or running: then how many are.
    pub fn take(counter: &Arc<AtomicUsize>, max: usize) -> Result<Self, usize> {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| Pending(counter.clone()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a session's sandbox comes to be.
pub(super) enum Start {
    /// Booted for the session's first code.
    Boot(String),
    /// Restored from an image payload.
    Restore(Bytes),
}

/// What a session's thread is asked to do.
pub(super) enum Job {
    /// The session's image payload, or why it cannot be saved (a spill holds no place in the
    /// queue: the manager only spills an idle session, holding its place lock).
    Save {
        reply: oneshot::Sender<Result<Vec<Bytes>, String>>,
        pending: Option<Pending>,
    },
    Run {
        request: ExecRequest,
        /// Which long outputs to keep as files.
        keep: Option<KeepOutputs>,
        /// Set when the caller goes away or the session ends: the call is skipped or stopped.
        cancel: Arc<AtomicBool>,
        reply: oneshot::Sender<SessionRun>,
        pending: Pending,
    },
    List {
        reply: oneshot::Sender<Result<FileListing, String>>,
        pending: Pending,
    },
    Read {
        path: String,
        limit: u64,
        reply: oneshot::Sender<Result<FileRead, String>>,
        pending: Pending,
    },
}

/// What a session's thread is given besides its jobs.
pub(super) struct Thread<B: Backend> {
    pub backend: Arc<B>,
    pub manager: Weak<Inner<B>>,
    pub id: SessionId,
    /// Why no session can be saved here (no store), if so: then nothing is checked.
    pub store_off: Option<String>,
    pub dead: Arc<AtomicBool>,
}

/// What a session's thread starts from: the session, its start, its jobs and where to say it booted.
pub(super) struct Launch<B: Backend> {
    pub thread: Thread<B>,
    pub start: Start,
    pub jobs: mpsc::Receiver<Job>,
    pub booted: oneshot::Sender<Result<(), String>>,
}

/// Starts the next session's spare thread when dropped (see `Sessions::spawn_thread`): once the
/// session it follows has its sandbox, or once that session's caller gives up waiting for it.
pub(super) struct SpareOnDrop<'a, B: Backend>(pub &'a super::Sessions<B>);

impl<B: Backend> Drop for SpareOnDrop<'_, B> {
    fn drop(&mut self) {
        self.0.keep_spare();
    }
}

/// A thread started ahead of the next session: it has parked a sandbox (`Backend::park`) and waits
/// for its session, which then waits only for the sandbox to be finished. Dropping it ends the
/// thread.
pub(super) struct Spare<B: Backend> {
    handoff: mpsc::Sender<Launch<B>>,
}

impl<B: Backend> Spare<B> {
    /// Starts a spare thread that parks a sandbox of `backend`.
    pub fn spawn(backend: Arc<B>) -> std::io::Result<Self> {
        let (handoff, launches) = mpsc::channel::<Launch<B>>();
        std::thread::Builder::new()
            .name("session-spare".into())
            .stack_size(STACK)
            .spawn(move || {
                let parked = backend.park();
                if let Ok(launch) = launches.recv() {
                    run(launch, parked);
                }
            })?;
        Ok(Self { handoff })
    }
}

/// A session thread's stack: Pyodide's deep recursion needs more than Rust's default.
const STACK: usize = 8 * 1024 * 1024;

/// Starts session `id`'s thread, on `spare` when there is one: it boots a sandbox from `start`,
/// says so on `booted`, then serves `jobs` until the channel closes or `dead` is set.
pub(super) fn spawn<B: Backend>(launch: Launch<B>, spare: Option<Spare<B>>) -> std::io::Result<()> {
    let launch = match spare {
        Some(spare) => match spare.handoff.send(launch) {
            Ok(()) => return Ok(()),
            // The spare's thread is gone (it can only have panicked): a thread of its own.
            Err(mpsc::SendError(launch)) => launch,
        },
        None => launch,
    };
    std::thread::Builder::new()
        .name(format!("session-{}", launch.thread.id))
        .stack_size(STACK)
        .spawn(move || run(launch, None))
        .map(drop)
}

/// A session thread's life: its sandbox made (finishing `parked` when given), then its jobs.
fn run<B: Backend>(launch: Launch<B>, parked: Option<B::Parked>) {
    let Launch {
        thread,
        start,
        jobs,
        booted,
    } = launch;
    let made = match start {
        Start::Boot(first_code) => thread.backend.boot(parked, &first_code),
        Start::Restore(payload) => thread.backend.restore(parked, payload),
    };
    // (Past this thread the backend's errors are their messages: the reasons callers are given.)
    let mut sandbox = match made {
        Ok(sandbox) => sandbox,
        Err(e) => {
            let _ = booted.send(Err(e.to_string()));
            return;
        }
    };
    if booted.send(Ok(())).is_err() {
        // The creating call went away: nobody knows this session.
        return;
    }
    serve(&thread, &mut sandbox, jobs);
    drop(sandbox);
    thread.backend.dropped();
    tracing::debug!(session = %thread.id, "session thread ended");
}

fn serve<B: Backend>(thread: &Thread<B>, sandbox: &mut B::Sandbox, jobs: mpsc::Receiver<Job>) {
    let Thread {
        backend,
        manager,
        id,
        store_off,
        dead,
    } = thread;
    let backend = &**backend;
    while let Ok(job) = jobs.recv() {
        if dead.load(Ordering::SeqCst) {
            // The session ended: what is queued is dropped with the channel.
            return;
        }
        let ended = match job {
            Job::Run {
                request,
                keep,
                cancel,
                reply,
                pending,
            } => {
                if cancel.load(Ordering::SeqCst) {
                    // The caller left before this call started.
                    continue;
                }
                let from = std::time::Instant::now();
                let result = backend.run(sandbox, request, cancel);
                let ran = (from, std::time::Instant::now());
                let ended = report_end(backend, sandbox, manager, id);
                let mut run = SessionRun {
                    result,
                    kept_stdout: None,
                    kept_stderr: None,
                    unsaveable: store_off.clone(),
                    ran,
                };
                if let Some(keep) = keep.filter(|_| !ended) {
                    keep_outputs(backend, sandbox, &keep, &mut run);
                }
                if !ended && store_off.is_none() {
                    run.unsaveable = backend.unsaveable(sandbox);
                }
                drop(pending);
                let _ = reply.send(run);
                ended
            }
            Job::Save { reply, pending } => {
                let saved = backend.save(sandbox).map_err(|e| e.to_string());
                let ended = report_end(backend, sandbox, manager, id);
                drop(pending);
                let _ = reply.send(saved);
                ended
            }
            Job::List { reply, pending } => {
                let listing = backend.list(sandbox).map_err(|e| e.to_string());
                let ended = report_end(backend, sandbox, manager, id);
                drop(pending);
                let _ = reply.send(listing);
                ended
            }
            Job::Read {
                path,
                limit,
                reply,
                pending,
            } => {
                let read = backend
                    .read(sandbox, &path, limit)
                    .map_err(|e| e.to_string());
                let ended = report_end(backend, sandbox, manager, id);
                drop(pending);
                let _ = reply.send(read);
                ended
            }
        };
        if ended {
            return;
        }
    }
}

/// Writes the call's streams that are longer than `keep` says as files of the session.
fn keep_outputs<B: Backend>(
    backend: &B,
    sandbox: &mut B::Sandbox,
    keep: &KeepOutputs,
    run: &mut SessionRun,
) {
    let streams = [
        ("stdout", run.result.stdout.clone(), keep.stdout_over),
        ("stderr", run.result.stderr.clone(), keep.stderr_over),
    ];
    for (stream, text, over) in streams {
        if text.chars().count() <= over {
            continue;
        }
        let path = format!("{}-{stream}.txt", keep.stem);
        match backend.store(sandbox, &path, text.into_bytes()) {
            Ok(()) if stream == "stdout" => run.kept_stdout = Some(path),
            Ok(()) => run.kept_stderr = Some(path),
            Err(e) => tracing::debug!(error = %e, "a long output could not be kept in the session"),
        }
    }
}

/// If the sandbox can run nothing more, the manager ends the session (saying why); true then.
fn report_end<B: Backend>(
    backend: &B,
    sandbox: &B::Sandbox,
    manager: &Weak<Inner<B>>,
    id: &SessionId,
) -> bool {
    let Some(end) = backend.ended(sandbox) else {
        return false;
    };
    if let Some(inner) = manager.upgrade() {
        inner.sandbox_ended(id.as_wire(), end);
    }
    true
}
