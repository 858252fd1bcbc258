//! Stateful sessions: one sandbox kept alive across calls, on a thread of its own (outside the
//! stateless pool's workers and queue), created from the memory snapshot exactly like a stateless
//! one and with the same limits. Calls to one session run one at a time in arrival order, at most
//! `queue_capacity` waiting behind the running one; other sessions and stateless calls are never
//! blocked by them. A session ends when it is cleared, when it has been idle for `idle_timeout`, when
//! it reaches `max_lifetime`, when its sandbox can run nothing more (a typed [`SandboxEnd`] its
//! thread reports: never a message's text), or at shutdown; a background reaper ends the idle and
//! old ones.
//!
//! Every path is cancel-safe: what a call holds (its place in the session's queue, its stop flag, a
//! creation's slot) is released by guards when the call's future is dropped, and a session whose
//! creating call went away before its id reached the client is ended at once.
//!
//! A session id is 192 bits of OS randomness, URL-safe Base64, after `replica_id` and a dot when one is
//! set (so a load balancer can route by it): it is the only credential for the session, and with
//! bearer tokens it only works with the token that created it. Logs and errors name sessions by
//! the id's first six characters only (after the replica prefix).
//!
//! The manager knows sandboxes only through [`Backend`], so its logic is tested without V8 and
//! without sleeps (a fake backend and an injected [`Clock`], see `tests.rs`); `engine.rs` is the real
//! engine's implementation, `thread.rs` a session's thread.

mod engine;
mod id;
#[cfg(test)]
mod tests;
mod thread;
mod types;

pub use id::{mint_id, replica_of, short};
pub use types::{SessionError, SessionFile, SessionFiles};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::config::SessionSettings;
use crate::sandbox::{ExecRequest, ExecResult, FileListing, FileRead, SandboxEnd};
use crate::telemetry::{self, SessionEnd};
use thread::{Job, Pending};

/// What the session manager needs of sandboxes. A sandbox is booted and used on its session's
/// thread only (it need not be `Send`).
pub trait Backend: Send + Sync + 'static {
    type Sandbox;

    /// Boots a sandbox kept for a session, of the kind that serves `first_code` (the code of the
    /// session's first call); the error is the reason.
    fn boot(&self, first_code: &str) -> Result<Self::Sandbox, String>;

    /// Runs one call; setting `cancel` stops it (interrupting the code first).
    fn run(
        &self,
        sandbox: &mut Self::Sandbox,
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
    ) -> ExecResult;

    /// The session's files (bounded).
    fn list(&self, sandbox: &mut Self::Sandbox) -> Result<FileListing, String>;

    /// One of the session's files, if it is a regular file of at most `limit` bytes.
    fn read(&self, sandbox: &mut Self::Sandbox, path: &str, limit: u64)
    -> Result<FileRead, String>;

    /// Writes `data` as the session's file at `path` (relative to /workspace).
    fn store(&self, sandbox: &mut Self::Sandbox, path: &str, data: Vec<u8>) -> Result<(), String>;

    /// Why the sandbox can run nothing more, if so.
    fn ended(&self, sandbox: &Self::Sandbox) -> Option<SandboxEnd>;
}

/// Where the manager reads the time (injected by tests).
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Which of a call's long outputs the session keeps as files under /workspace, so that a result
/// whose text is cut for a model can say where the whole is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepOutputs {
    /// The files' path stem relative to /workspace, e.g. `.outputs/20261203-044501-3f9a`: the
    /// streams go to `{stem}-stdout.txt` and `{stem}-stderr.txt`.
    pub stem: String,
    /// A stream longer than this many characters is kept.
    pub stdout_over: usize,
    pub stderr_over: usize,
}

/// A session call's result, and the files it kept of its long outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRun {
    pub result: ExecResult,
    /// Paths (relative to /workspace) of the whole stdout and stderr, when they were kept.
    pub kept_stdout: Option<String>,
    pub kept_stderr: Option<String>,
}

/// The bearer token a request was authenticated with, as its SHA-256 digest (put into the request's
/// extensions by the transport): a session created with a token answers only to that token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal(pub [u8; 32]);

/// Who makes a session call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client, for listing its sessions' resources (a legacy-era MCP session, or stdio).
    pub client: Option<String>,
    /// The bearer token, when the server requires one.
    pub principal: Option<Principal>,
}

/// A live session: the channel to its thread and what the manager tracks about it.
struct Session {
    id: String,
    caller: Caller,
    jobs: Mutex<mpsc::Sender<Job>>,
    created: Instant,
    last_used: Mutex<Instant>,
    /// Jobs queued or running on its thread (each job holds one count until its thread is done
    /// with it, whether its caller waits or not).
    pending: Arc<AtomicUsize>,
    /// The stop flags of its calls that still have a caller (set when the session ends).
    stops: Mutex<Vec<Arc<AtomicBool>>>,
    /// The session has ended: it takes no more calls (its thread drops what is queued).
    dead: Arc<AtomicBool>,
}

impl Session {
    fn touch(&self, now: Instant) {
        *lock(&self.last_used) = now;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many recently ended sessions are remembered, to say why they ended.
const REMEMBERED_ENDS: usize = 256;

struct Inner<B: Backend> {
    backend: Arc<B>,
    clock: Arc<dyn Clock>,
    config: SessionSettings,
    /// Prefix of minted ids (`replica_id`); empty: none.
    replica_id: String,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions ended by their sandbox, newest last (id, why), for the next call's error.
    ended: Mutex<VecDeque<(String, &'static str)>>,
    /// Sessions being created (counted against the limit before they exist).
    starting: AtomicUsize,
    closed: AtomicBool,
}

/// The session manager; cheap to clone.
pub struct Sessions<B: Backend = crate::sandbox::Engine> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for Sessions<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// Releases a creation's slot when dropped.
struct Starting<'a>(&'a AtomicUsize);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call's stop flag, registered with its session: set when the call's future is dropped before
/// its reply came (the caller went away), removed from the session either way.
struct StopGuard {
    session: Arc<Session>,
    flag: Arc<AtomicBool>,
    done: bool,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if !self.done {
            self.flag.store(true, Ordering::SeqCst);
        }
        lock(&self.session.stops).retain(|c| !Arc::ptr_eq(c, &self.flag));
    }
}

impl<B: Backend> Sessions<B> {
    /// A manager for `backend`'s sessions, minting ids for `replica_id` and reading `clock`; starts
    /// the reaper (a thread that ends idle and old sessions every 250 ms, while the manager exists).
    pub fn new(
        backend: Arc<B>,
        config: SessionSettings,
        replica_id: &str,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let sessions = Self::without_reaper(backend, config, replica_id, clock);
        let weak = Arc::downgrade(&sessions.inner);
        let _ = std::thread::Builder::new()
            .name("session-reaper".into())
            .spawn(move || {
                while let Some(inner) = weak.upgrade() {
                    if inner.closed.load(Ordering::SeqCst) {
                        break;
                    }
                    Sessions { inner }.reap();
                    std::thread::sleep(Duration::from_millis(250));
                }
            });
        sessions
    }

    /// A manager whose idle and old sessions end only when [`reap`](Self::reap) is called.
    pub fn without_reaper(
        backend: Arc<B>,
        config: SessionSettings,
        replica_id: &str,
        clock: Arc<dyn Clock>,
    ) -> Self {
        telemetry::sessions_live(0);
        Self {
            inner: Arc::new(Inner {
                backend,
                clock,
                config,
                replica_id: replica_id.to_string(),
                sessions: Mutex::new(HashMap::new()),
                ended: Mutex::new(VecDeque::new()),
                starting: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        }
    }

    fn now(&self) -> Instant {
        self.inner.clock.now()
    }

    /// Creates a session for `caller` (booting its sandbox on a thread of its own); its id. The
    /// sandbox is of the kind that serves `first_code`, the code of the session's first call.
    /// Dropping the future before it resolves leaves nothing behind.
    pub async fn create(&self, caller: Caller, first_code: &str) -> Result<String, SessionError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        let _slot = {
            let sessions = lock(&inner.sessions);
            let live = sessions.len() + inner.starting.load(Ordering::SeqCst);
            if live >= inner.config.max_sessions {
                return Err(SessionError::TooMany {
                    live,
                    max: inner.config.max_sessions,
                });
            }
            inner.starting.fetch_add(1, Ordering::SeqCst);
            Starting(&inner.starting)
        };
        let id = mint_id(&inner.replica_id, id::ID_BYTES)
            .map_err(|e| SessionError::Boot(format!("no OS randomness for the session id: {e}")))?;
        let (jobs, receiver) = mpsc::channel();
        let (booted, booted_rx) = oneshot::channel();
        let dead = Arc::new(AtomicBool::new(false));
        let spawned = thread::spawn(
            inner.backend.clone(),
            Arc::downgrade(inner),
            id.clone(),
            first_code.to_string(),
            dead.clone(),
            receiver,
            booted,
        );
        let outcome = match spawned {
            Ok(()) => booted_rx
                .await
                .unwrap_or_else(|_| Err("the session's thread stopped".into())),
            Err(e) => Err(e.to_string()),
        };
        outcome.map_err(SessionError::Boot)?;
        let now = self.now();
        let session = Arc::new(Session {
            id: id.clone(),
            caller,
            jobs: Mutex::new(jobs),
            created: now,
            last_used: Mutex::new(now),
            pending: Arc::default(),
            stops: Mutex::new(Vec::new()),
            dead,
        });
        let live = {
            let mut sessions = lock(&inner.sessions);
            sessions.insert(id.clone(), session);
            sessions.len()
        };
        telemetry::session_created(live);
        tracing::info!(session = short(&id), "session created");
        Ok(id)
    }

    /// The error for an id with no live session here: one that ended (and why), another replica's,
    /// or unknown.
    fn not_found(&self, id: &str) -> SessionError {
        if let Some((_, reason)) = lock(&self.inner.ended).iter().find(|(e, _)| e == id) {
            return SessionError::Ended {
                id: short(id).to_string(),
                reason,
            };
        }
        let here = &self.inner.replica_id;
        match replica_of(id) {
            Some(owner) if owner != here.as_str() && !owner.is_empty() => {
                SessionError::OtherReplica {
                    id: short(id).to_string(),
                    owner: crate::protocol::limits::shown(owner),
                    here: if here.is_empty() {
                        "a server without replica_id".into()
                    } else {
                        format!("replica {here}")
                    },
                }
            }
            _ => SessionError::NotFound(short(id).to_string()),
        }
    }

    /// The live session `id`, if `caller` may use it (with bearer tokens, only the token that
    /// created it may; to any other the session does not exist).
    fn get(&self, id: &str, caller: &Caller) -> Result<Arc<Session>, SessionError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        lock(&self.inner.sessions)
            .get(id)
            .filter(|s| !s.dead.load(Ordering::SeqCst))
            .filter(|s| s.caller.principal.is_none() || s.caller.principal == caller.principal)
            .cloned()
            .ok_or_else(|| self.not_found(id))
    }

    /// Queues `job` (made with its place in the queue) on the session's thread, unless the session
    /// already has a running call and `queue_capacity` waiting.
    fn submit(
        &self,
        session: &Arc<Session>,
        job: impl FnOnce(Pending) -> Job,
    ) -> Result<(), SessionError> {
        let capacity = self.inner.config.queue_capacity;
        let pending = Pending::take(&session.pending, capacity + 1).map_err(|waiting| {
            SessionError::Busy {
                id: short(&session.id).to_string(),
                waiting,
                capacity,
            }
        })?;
        session.touch(self.now());
        lock(&session.jobs)
            .send(job(pending))
            .map_err(|_| self.not_found(&session.id))
    }

    /// Runs `request` in session `id`, after the calls queued before it. Dropping the future stops
    /// the call: the code is interrupted, and the session lives on if it stops.
    pub async fn run(
        &self,
        id: &str,
        caller: &Caller,
        request: ExecRequest,
        keep: Option<KeepOutputs>,
    ) -> Result<SessionRun, SessionError> {
        let session = self.get(id, caller)?;
        let cancel = Arc::new(AtomicBool::new(false));
        lock(&session.stops).push(cancel.clone());
        let mut guard = StopGuard {
            session: session.clone(),
            flag: cancel.clone(),
            done: false,
        };
        let (reply, result) = oneshot::channel();
        self.submit(&session, |pending| Job::Run {
            request,
            keep,
            cancel,
            reply,
            pending,
        })?;
        let outcome = result.await;
        guard.done = true;
        session.touch(self.now());
        outcome.map_err(|_| self.not_found(id))
    }

    /// The regular files under the session's /workspace (at most `MAX_LISTED_FILES`).
    pub async fn list_files(
        &self,
        id: &str,
        caller: &Caller,
    ) -> Result<SessionFiles, SessionError> {
        let session = self.get(id, caller)?;
        let (reply, result) = oneshot::channel();
        self.submit(&session, |pending| Job::List { reply, pending })?;
        match result.await {
            Ok(Ok(listing)) => Ok(SessionFiles {
                files: listing
                    .files
                    .into_iter()
                    .map(|(path, size)| SessionFile { path, size })
                    .collect(),
                left_out: listing.left_out,
                truncated: listing.truncated,
            }),
            _ => Err(self.not_found(id)),
        }
    }

    /// One file of the session's /workspace (`None`: no such regular file; `Some(Err(limit))`:
    /// larger than `limit` bytes).
    pub async fn read_file(
        &self,
        id: &str,
        caller: &Caller,
        path: &str,
        limit: u64,
    ) -> Result<Option<Result<Vec<u8>, u64>>, SessionError> {
        let session = self.get(id, caller)?;
        let (reply, result) = oneshot::channel();
        let path = path.to_string();
        self.submit(&session, |pending| Job::Read {
            path,
            limit,
            reply,
            pending,
        })?;
        match result.await {
            Ok(Ok(FileRead::Found(data))) => Ok(Some(Ok(data))),
            Ok(Ok(FileRead::TooLarge)) => Ok(Some(Err(limit))),
            Ok(Ok(FileRead::Missing)) => Ok(None),
            _ => Err(self.not_found(id)),
        }
    }

    /// Ends session `id` at once: a call running in it is stopped.
    pub fn clear(&self, id: &str, caller: &Caller) -> Result<(), SessionError> {
        self.get(id, caller)?;
        self.end(id, SessionEnd::Cleared);
        Ok(())
    }

    /// Ends session `id` if it is still live: for a creating call that went away before the id
    /// reached its client (nobody else knows the id).
    pub fn abandon(&self, id: &str) {
        self.end(id, SessionEnd::Cleared);
    }

    /// The ids of the live sessions `client` created (none without a client).
    pub fn owned_by(&self, client: Option<&str>) -> Vec<String> {
        let Some(client) = client else {
            return Vec::new();
        };
        let mut ids: Vec<String> = lock(&self.inner.sessions)
            .values()
            .filter(|s| {
                s.caller.client.as_deref() == Some(client) && !s.dead.load(Ordering::SeqCst)
            })
            .map(|s| s.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// How many sessions are live.
    pub fn live(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    /// Removes session `id` (its thread ends when its queued jobs are dropped; a running call is
    /// stopped).
    fn end(&self, id: &str, reason: SessionEnd) {
        Self::end_in(&self.inner, id, reason);
    }

    fn end_in(inner: &Inner<B>, id: &str, reason: SessionEnd) {
        let removed = lock(&inner.sessions).remove(id);
        if let Some(session) = removed {
            session.dead.store(true, Ordering::SeqCst);
            for stop in lock(&session.stops).iter() {
                stop.store(true, Ordering::SeqCst);
            }
            let live = lock(&inner.sessions).len();
            telemetry::session_ended(reason, live);
            tracing::info!(
                session = short(id),
                reason = reason.label(),
                "session ended"
            );
            // Dropping the last sender ends the thread after its queued jobs (skipped: stopped).
        }
    }

    /// Its sandbox can run nothing more: the session ends, and the next call hears why.
    fn ended_by_sandbox(inner: &Inner<B>, id: &str, end: SandboxEnd) {
        {
            let mut ended = lock(&inner.ended);
            if ended.len() >= REMEMBERED_ENDS {
                ended.pop_front();
            }
            ended.push_back((id.to_string(), end.reason()));
        }
        let reason = if end.is_limit() {
            SessionEnd::Limit
        } else {
            SessionEnd::Error
        };
        Self::end_in(inner, id, reason);
    }

    /// Ends sessions idle for longer than `idle_timeout` or older than `max_lifetime`.
    pub fn reap(&self) {
        let now = self.now();
        let config = &self.inner.config;
        let expired: Vec<(String, SessionEnd)> = lock(&self.inner.sessions)
            .values()
            .filter_map(|s| {
                if now.duration_since(s.created) >= config.max_lifetime {
                    Some((s.id.clone(), SessionEnd::Lifetime))
                } else if s.pending.load(Ordering::SeqCst) == 0
                    && now.duration_since(*lock(&s.last_used)) >= config.idle_timeout
                {
                    Some((s.id.clone(), SessionEnd::Idle))
                } else {
                    None
                }
            })
            .collect();
        for (id, reason) in expired {
            self.end(&id, reason);
        }
    }

    /// Whether any session has a job queued or running.
    pub fn busy(&self) -> bool {
        lock(&self.inner.sessions)
            .values()
            .any(|s| s.pending.load(Ordering::SeqCst) > 0)
    }

    /// Shutdown: no new session calls; calls running now may finish until `deadline`, then every
    /// session ends.
    pub async fn shutdown(&self, deadline: Instant) {
        self.inner.closed.store(true, Ordering::SeqCst);
        while self.busy() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ids: Vec<String> = lock(&self.inner.sessions).keys().cloned().collect();
        for id in ids {
            self.end(&id, SessionEnd::Shutdown);
        }
    }
}

impl<B: Backend> Inner<B> {
    /// Called by a session's thread whose sandbox ended (see `thread.rs`).
    fn sandbox_ended(self: &Arc<Self>, id: &str, end: SandboxEnd) {
        Sessions::<B>::ended_by_sandbox(self, id, end);
    }
}
