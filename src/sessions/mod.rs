//! Stateful sessions: one sandbox kept alive across calls, on a thread of its own (outside the
//! stateless pool's workers and queue), created from the memory snapshot exactly like a stateless
//! one and with the same limits. Calls to one session run one at a time in arrival order; other
//! sessions and stateless calls are never blocked by them. A session ends when it is cleared, when
//! it has been idle for `idle_timeout`, when it reaches `max_lifetime`, when a hard stop leaves its
//! interpreter unusable, or at shutdown; a background reaper ends the idle and old ones.
//!
//! A session id is 192 bits of OS randomness, URL-safe Base64, after `replica_id` and a dot when one is
//! set (so a load balancer can route by it): it is the only credential for the session. Logs name
//! sessions by the id's first six characters only (after the replica prefix).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tokio::sync::oneshot;

use crate::sandbox::{Engine, ExecRequest, ExecResult, FileRead, Flavor, Sandbox};
use crate::telemetry::{self, SessionEnd};

/// Session settings (from `[sessions]`, and the replica's name).
#[derive(Debug, Clone)]
pub struct SessionsConfig {
    pub max_sessions: usize,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
    /// Prefix of minted ids (`replica_id`); empty: none.
    pub replica_id: String,
}

/// A session's id as logs show it: the replica prefix, if any, and six more characters.
pub fn short(id: &str) -> &str {
    let start = id
        .find('.')
        .filter(|&dot| dot <= 63)
        .map_or(0, |dot| dot + 1);
    &id[..id.floor_char_boundary(start + 6)]
}

/// The replica named in a session id (the part before its first dot), if any.
pub fn replica_of(id: &str) -> Option<&str> {
    id.split_once('.').map(|(replica, _)| replica)
}

/// Why a session call could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session {0} does not exist or has expired; pass session_id = \"new\" to start a fresh session"
    )]
    NotFound(String),
    #[error(
        "session {id} was created by replica {owner}, and this is {here}: a session lives on the replica that created it (route session calls by the Mcp-Param-Session-Id header; see deploy/nginx), or it has ended; pass session_id = \"new\" to start a fresh session"
    )]
    OtherReplica {
        id: String,
        owner: String,
        here: String,
    },
    #[error(
        "no more sessions can be created: {live} are live, the limit sessions.max_sessions = {max}; clear one (clear_session) or retry later"
    )]
    TooMany { live: usize, max: usize },
    #[error("the session could not start: {0}")]
    Boot(String),
    #[error(
        "the server is shutting down: its sessions have ended and it accepts no session calls; pass session_id = \"new\" to start a fresh session (on another replica)"
    )]
    ShuttingDown,
}

/// One file of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFile {
    pub path: String,
    pub size: u64,
}

enum Job {
    Run {
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
        reply: oneshot::Sender<ExecResult>,
    },
    List {
        reply: oneshot::Sender<Result<Vec<SessionFile>, String>>,
    },
    Read {
        path: String,
        limit: u64,
        reply: oneshot::Sender<Result<FileRead, String>>,
    },
}

/// A live session: the channel to its thread and what the manager tracks about it.
struct Session {
    id: String,
    /// Who created it (the MCP session of the legacy era, or stdio); `None`: no client identity.
    owner: Option<String>,
    jobs: mpsc::Sender<Job>,
    created: Instant,
    last_used: Mutex<Instant>,
    /// Calls queued or running.
    busy: AtomicUsize,
    /// The stop flags of its queued and running calls (set when the session ends).
    stops: Mutex<Vec<Arc<AtomicBool>>>,
    /// The session's interpreter is gone (a hard stop): it takes no more calls.
    dead: AtomicBool,
}

impl Session {
    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    engine: Engine,
    config: SessionsConfig,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions being created (counted against the limit before they exist).
    starting: AtomicUsize,
    closed: AtomicBool,
}

/// The session manager; cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl Sessions {
    /// A manager for `engine`'s sessions; starts the reaper.
    pub fn new(engine: Engine, config: SessionsConfig) -> Self {
        let sessions = Self {
            inner: Arc::new(Inner {
                engine,
                config,
                sessions: Mutex::new(HashMap::new()),
                starting: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        };
        telemetry::sessions_live(0);
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

    /// Creates a session (booting its sandbox on a thread of its own) owned by `owner`; its id. The
    /// sandbox is of the flavor that serves `first_code`, the code of the session's first call.
    pub async fn create(
        &self,
        owner: Option<String>,
        first_code: &str,
    ) -> Result<String, SessionError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        {
            let sessions = lock(&inner.sessions);
            let live = sessions.len() + inner.starting.load(Ordering::SeqCst);
            if live >= inner.config.max_sessions {
                return Err(SessionError::TooMany {
                    live,
                    max: inner.config.max_sessions,
                });
            }
            inner.starting.fetch_add(1, Ordering::SeqCst);
        }
        let id = new_id(&inner.config.replica_id);
        let (jobs, receiver) = mpsc::channel();
        let (booted, booted_rx) = oneshot::channel();
        let engine = inner.engine.clone();
        let flavor = engine.flavor_for(first_code);
        let thread_id = id.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("session-{}", short(&id)))
            .stack_size(8 * 1024 * 1024)
            .spawn(move || session_thread(engine, flavor, thread_id, receiver, booted));
        let outcome = match spawned {
            Ok(_) => booted_rx
                .await
                .unwrap_or_else(|_| Err("the session's thread stopped".into())),
            Err(e) => Err(e.to_string()),
        };
        inner.starting.fetch_sub(1, Ordering::SeqCst);
        outcome.map_err(SessionError::Boot)?;
        let session = Arc::new(Session {
            id: id.clone(),
            owner,
            jobs,
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            stops: Mutex::new(Vec::new()),
            dead: AtomicBool::new(false),
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

    /// The error for an id with no live session here: another replica's, or unknown or ended.
    fn not_found(&self, id: &str) -> SessionError {
        let here = &self.inner.config.replica_id;
        match replica_of(id) {
            Some(owner) if owner != here.as_str() && !owner.is_empty() => {
                SessionError::OtherReplica {
                    id: short(id).to_string(),
                    owner: crate::config::limits::shown(owner),
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

    fn get(&self, id: &str) -> Result<Arc<Session>, SessionError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        lock(&self.inner.sessions)
            .get(id)
            .filter(|s| !s.dead.load(Ordering::SeqCst))
            .cloned()
            .ok_or_else(|| self.not_found(id))
    }

    /// Runs `request` in session `id`, after the calls queued before it. Dropping the future
    /// stops the call if it is running (the session survives only if Python stops when interrupted).
    pub async fn run(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        let session = self.get(id)?;
        session.busy.fetch_add(1, Ordering::SeqCst);
        session.touch();
        let cancel = Arc::new(AtomicBool::new(false));
        lock(&session.stops).push(cancel.clone());
        let (reply, result) = oneshot::channel();
        let sent = session.jobs.send(Job::Run {
            request,
            cancel: cancel.clone(),
            reply,
        });
        // A call whose caller goes away is stopped, like a stateless one.
        struct StopOnDrop(Arc<AtomicBool>, bool);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
        }
        let mut guard = StopOnDrop(cancel.clone(), false);
        let outcome = match sent {
            Ok(()) => result.await.map_err(|_| self.not_found(id)),
            Err(_) => Err(self.not_found(id)),
        };
        guard.1 = true;
        lock(&session.stops).retain(|c| !Arc::ptr_eq(c, &cancel));
        session.busy.fetch_sub(1, Ordering::SeqCst);
        session.touch();
        if let Ok(result) = &outcome
            && let Some(error) = &result.error
            && error.message.contains("the session has ended")
        {
            // A limit stopped it by force (a timeout Python did not answer, a memory budget), or
            // the engine failed.
            let reason = match error.error_type.as_str() {
                "TimeoutError" | "SetupTimeout" | "MemoryLimitExceeded" => SessionEnd::Limit,
                _ => SessionEnd::Error,
            };
            self.end(id, reason);
        }
        outcome
    }

    /// The regular files under the session's /workspace.
    pub async fn list_files(&self, id: &str) -> Result<Vec<SessionFile>, SessionError> {
        let session = self.get(id)?;
        let (reply, result) = oneshot::channel();
        session
            .jobs
            .send(Job::List { reply })
            .map_err(|_| self.not_found(id))?;
        match result.await {
            Ok(Ok(files)) => Ok(files),
            _ => {
                self.end(id, SessionEnd::Error);
                Err(self.not_found(id))
            }
        }
    }

    /// One file of the session's /workspace (`None`: no such regular file).
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
        limit: u64,
    ) -> Result<Option<Result<Vec<u8>, u64>>, SessionError> {
        let session = self.get(id)?;
        let (reply, result) = oneshot::channel();
        session
            .jobs
            .send(Job::Read {
                path: path.to_string(),
                limit,
                reply,
            })
            .map_err(|_| self.not_found(id))?;
        match result.await {
            Ok(Ok(FileRead::Found(data))) => Ok(Some(Ok(data))),
            Ok(Ok(FileRead::TooLarge)) => Ok(Some(Err(limit))),
            Ok(Ok(FileRead::Missing)) => Ok(None),
            _ => {
                self.end(id, SessionEnd::Error);
                Err(self.not_found(id))
            }
        }
    }

    /// Ends session `id` at once: a call running in it is stopped.
    pub fn clear(&self, id: &str) -> Result<(), SessionError> {
        self.get(id)?;
        self.end(id, SessionEnd::Cleared);
        Ok(())
    }

    /// The ids of the live sessions `owner` created (none without an owner).
    pub fn owned_by(&self, owner: Option<&str>) -> Vec<String> {
        let Some(owner) = owner else {
            return Vec::new();
        };
        let mut ids: Vec<String> = lock(&self.inner.sessions)
            .values()
            .filter(|s| s.owner.as_deref() == Some(owner) && !s.dead.load(Ordering::SeqCst))
            .map(|s| s.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// How many sessions are live.
    pub fn live(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    /// Removes session `id` (its thread ends when the last job is done; a running call is stopped).
    fn end(&self, id: &str, reason: SessionEnd) {
        let removed = lock(&self.inner.sessions).remove(id);
        if let Some(session) = removed {
            session.dead.store(true, Ordering::SeqCst);
            for stop in lock(&session.stops).iter() {
                stop.store(true, Ordering::SeqCst);
            }
            let live = self.live();
            telemetry::session_ended(reason, live);
            tracing::info!(
                session = short(id),
                reason = reason.label(),
                "session ended"
            );
            // Dropping the last sender ends the thread after its queued jobs.
        }
    }

    /// Ends sessions idle for longer than `idle_timeout` or older than `max_lifetime`.
    fn reap(&self) {
        let now = Instant::now();
        let config = &self.inner.config;
        let expired: Vec<(String, SessionEnd)> = lock(&self.inner.sessions)
            .values()
            .filter_map(|s| {
                if now.duration_since(s.created) >= config.max_lifetime {
                    Some((s.id.clone(), SessionEnd::Lifetime))
                } else if s.busy.load(Ordering::SeqCst) == 0
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

    /// Shutdown: no new session calls; calls running now may finish until `deadline`, then every
    /// session ends.
    pub async fn shutdown(&self, deadline: Instant) {
        self.inner.closed.store(true, Ordering::SeqCst);
        loop {
            let busy = lock(&self.inner.sessions)
                .values()
                .any(|s| s.busy.load(Ordering::SeqCst) > 0);
            if !busy || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ids: Vec<String> = lock(&self.inner.sessions).keys().cloned().collect();
        for id in ids {
            self.end(&id, SessionEnd::Shutdown);
        }
    }
}

/// A new session id: `replica.` (when set), then 24 bytes of OS randomness, URL-safe Base64 without
/// padding (32 characters; the alphabet has no dot).
fn new_id(replica: &str) -> String {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).expect("OS randomness");
    let random = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    if replica.is_empty() {
        random
    } else {
        format!("{replica}.{random}")
    }
}

/// The session's thread: boots its sandbox, answers, then runs its jobs in order until the manager
/// drops the session (or its interpreter is gone).
fn session_thread(
    engine: Engine,
    flavor: Flavor,
    id: String,
    jobs: mpsc::Receiver<Job>,
    booted: oneshot::Sender<Result<(), String>>,
) {
    let mut sandbox: Sandbox = match engine.boot_flavor(flavor) {
        Ok(sandbox) => sandbox,
        Err(e) => {
            let _ = booted.send(Err(e.to_string()));
            return;
        }
    };
    sandbox.keep_for_session();
    if booted.send(Ok(())).is_err() {
        return;
    }
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Run {
                request,
                cancel,
                reply,
            } => {
                if cancel.load(Ordering::SeqCst) {
                    // The session ended (or the caller left) before this call started.
                    continue;
                }
                let started = Instant::now();
                let result = sandbox.run(request, Some(cancel));
                telemetry::python_execution(result.outcome(), started.elapsed());
                let _ = reply.send(result);
            }
            Job::List { reply } => {
                let files = sandbox.list_files().map(|files| {
                    files
                        .into_iter()
                        .map(|(path, size)| SessionFile { path, size })
                        .collect()
                });
                let _ = reply.send(files);
            }
            Job::Read { path, limit, reply } => {
                let _ = reply.send(sandbox.read_file(&path, limit));
            }
        }
        if sandbox.ended().is_some() {
            break;
        }
    }
    tracing::debug!(session = short(&id), "session thread ended");
}
