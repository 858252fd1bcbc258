//! Stateful sessions: one sandbox kept alive across calls, on a thread of its own (outside the
//! stateless pool's workers and queue), created from the memory snapshot like a stateless one and
//! with the same limits. Calls to one session run one at a time in arrival order, at most
//! `queue_capacity` waiting behind the running one; other sessions and stateless calls are never
//! blocked by them.
//!
//! A session is *resident* (its sandbox in memory, on its thread) or *spilled* (saved as a sealed
//! image in the session store, no thread). An idle session is spilled after `spill_after`, and the
//! least recently used idle one when `max_resident` are in memory; its next call resumes it from
//! the store, on this replica or any other sharing the store (see `durable.rs`). A session that
//! holds what an image cannot carry stays resident, and says why in every result.
//!
//! A session ends when it is cleared, when it has been idle for `idle_timeout`, when it reaches
//! `max_lifetime`, when its sandbox can run nothing more (a typed [`SandboxEnd`] its thread
//! reports: never a message's text); its image is deleted then. At shutdown, resident sessions are
//! saved (those that cannot be end). A background reaper spills, ends and renews.
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

mod backend;
mod durable;
#[cfg(test)]
mod durable_tests;
mod engine;
mod id;
mod reaper;
mod state;
#[cfg(test)]
mod tests;
mod thread;
mod types;

pub use backend::{Backend, Clock, SystemClock};
pub use durable::Durability;
pub use id::{SessionId, mint_id, replica_of, short};
pub use types::{
    Caller, KeepOutputs, Principal, PrincipalKind, Profile, SessionError, SessionFile,
    SessionFiles, SessionRun,
};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::config::SessionSettings;
use crate::sandbox::{ExecRequest, FileRead, SandboxEnd};
use crate::telemetry::traces;
use crate::telemetry::{self, SessionEnd};
use state::{Place, ResidentSlot, Session, Starting, StartingFor, StopGuard, lock};
use thread::{Job, Pending, Start};

/// How many recently ended sessions are remembered, to say why they ended.
const REMEMBERED_ENDS: usize = 256;

struct Inner<B: Backend> {
    backend: Arc<B>,
    clock: Arc<dyn Clock>,
    config: SessionSettings,
    /// Prefix of minted ids (`replica_id`); empty: none.
    replica_id: String,
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Sessions ended by their sandbox, newest last (id, why), for the next call's error.
    ended: Mutex<VecDeque<(String, &'static str)>>,
    /// Sessions being created (counted against `max_sessions` before they exist).
    starting: AtomicUsize,
    /// Of those, how many each principal is creating (for `quotas.max_sessions`).
    starting_for: Mutex<HashMap<Option<[u8; 32]>, usize>>,
    /// Sandboxes in memory or booting (counted against `max_resident`).
    resident: Mutex<usize>,
    /// The session store, when sessions are durable.
    durability: Option<Durability>,
    /// Where deletions in the store run (the runtime the manager was made in).
    runtime: Option<tokio::runtime::Handle>,
    closed: AtomicBool,
    /// The thread the next session starts on, its sandbox parked (see `thread::Spare`).
    spare: Mutex<Option<thread::Spare<B>>>,
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

impl<B: Backend> Sessions<B> {
    /// A manager for `backend`'s sessions, minting ids for `replica_id`, reading `clock`, saving
    /// to `durability`'s store (`None`: sessions live in memory only); starts the reaper (a task that
    /// spills, ends and renews every 250 ms while the manager exists).
    pub fn new(
        backend: Arc<B>,
        config: SessionSettings,
        replica_id: &str,
        clock: Arc<dyn Clock>,
        durability: Option<Durability>,
    ) -> Self {
        let sessions = Self::without_reaper(backend, config, replica_id, clock, durability);
        let weak = Arc::downgrade(&sessions.inner);
        if let Some(runtime) = &sessions.inner.runtime {
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(250));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(inner) = weak.upgrade() else { break };
                    if inner.closed.load(Ordering::SeqCst) {
                        break;
                    }
                    Sessions { inner }.reap().await;
                }
            });
        }
        sessions
    }

    /// A manager whose sessions are spilled, ended and renewed only when [`reap`](Self::reap) is
    /// called.
    pub fn without_reaper(
        backend: Arc<B>,
        config: SessionSettings,
        replica_id: &str,
        clock: Arc<dyn Clock>,
        durability: Option<Durability>,
    ) -> Self {
        telemetry::sessions_live(0);
        telemetry::sessions_placed(0, 0);
        Self {
            inner: Arc::new(Inner {
                backend,
                clock,
                config,
                replica_id: replica_id.to_string(),
                sessions: Mutex::new(HashMap::new()),
                ended: Mutex::new(VecDeque::new()),
                starting: AtomicUsize::new(0),
                starting_for: Mutex::default(),
                resident: Mutex::new(0),
                durability,
                runtime: tokio::runtime::Handle::try_current().ok(),
                closed: AtomicBool::new(false),
                spare: Mutex::new(None),
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
        self.start(caller, Start::Boot(first_code.to_string()))
            .await
    }

    /// A new session holding a copy of session `id`'s state (its interpreter and its files); its
    /// id. A session that cannot be saved cannot be copied either (the error says why).
    pub async fn fork(&self, id: &str, caller: &Caller) -> Result<String, SessionError> {
        let session = self.find(id, caller).await?;
        let (reply, result) = oneshot::channel();
        self.submit(&session, |pending| Job::Save {
            reply,
            pending: Some(pending),
        })
        .await?;
        let payload = match result.await {
            Ok(Ok(payload)) => payload,
            Ok(Err(reason)) => {
                return Err(SessionError::NotDurable {
                    id: short(id).to_string(),
                    reason,
                });
            }
            Err(_) => return Err(self.not_found(id)),
        };
        self.start(
            caller.clone(),
            Start::Restore(crate::sandbox::join(&payload)),
        )
        .await
    }

    /// Starts a session's thread from `start`, counted against both limits while it boots.
    async fn start(&self, caller: Caller, start: Start) -> Result<String, SessionError> {
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
            let owner = caller.principal.map(|p| p.0);
            let mut starting_for = lock(&inner.starting_for);
            let max = match &caller.profile {
                Some(profile) => profile.limits.max_sessions.map(|n| n as usize),
                None => inner.config.max_per_principal,
            };
            if let Some(max) = max {
                let held = sessions
                    .values()
                    .filter(|s| s.caller.principal.map(|p| p.0) == owner)
                    .count()
                    + starting_for.get(&owner).copied().unwrap_or(0);
                if held >= max {
                    return Err(SessionError::TooManyOwned { held, max });
                }
            }
            *starting_for.entry(owner).or_default() += 1;
            inner.starting.fetch_add(1, Ordering::SeqCst);
            (
                Starting(&inner.starting),
                StartingFor(&inner.starting_for, owner),
            )
        };
        let room = self.make_room(None).await?;
        let id = SessionId::mint(&inner.replica_id)
            .map_err(|e| SessionError::Boot(format!("no OS randomness for the session id: {e}")))?;
        let dead = Arc::new(AtomicBool::new(false));
        let jobs = self
            .spawn_thread(&id, start, dead.clone())
            .await
            .map_err(SessionError::Boot)?;
        let now = self.now();
        let session = Arc::new(Session {
            id: id.clone(),
            caller,
            created: now,
            created_ms: crate::store::unix_ms(),
            last_used: Mutex::new(now),
            pending: Arc::default(),
            stops: Mutex::new(Vec::new()),
            dead,
            place: tokio::sync::Mutex::new(Place::Resident(jobs)),
            resident: AtomicBool::new(true),
            unsaveable: Mutex::new(self.store_off()),
            leased: Mutex::new(None),
            spill_failed: Mutex::new(None),
        });
        room.kept();
        let live = {
            let mut sessions = lock(&inner.sessions);
            sessions.insert(id.clone(), session);
            sessions.len()
        };
        telemetry::session_created(live);
        self.report_places();
        tracing::info!(session = %id, "session created");
        Ok(id.as_wire().to_string())
    }

    /// Boots a session's sandbox from `start` on a thread of its own; the channel to it.
    async fn spawn_thread(
        &self,
        id: &SessionId,
        start: Start,
        dead: Arc<AtomicBool>,
    ) -> Result<mpsc::Sender<Job>, String> {
        let (jobs, receiver) = mpsc::channel();
        let (booted, booted_rx) = oneshot::channel();
        let thread = thread::Thread {
            backend: self.inner.backend.clone(),
            manager: Arc::downgrade(&self.inner),
            id: id.clone(),
            store_off: self.store_off(),
            dead,
        };
        let launch = thread::Launch {
            thread,
            start,
            jobs: receiver,
            booted,
        };
        let spare = lock(&self.inner.spare).take();
        // The next session's thread, started once this one's sandbox is made (both on two cores
        // would slow this one), or once the caller gives up waiting for it.
        let _next = thread::SpareOnDrop(self);
        thread::spawn(launch, spare).map_err(|e| e.to_string())?;
        booted_rx
            .await
            .unwrap_or_else(|_| Err("the session's thread stopped".into()))?;
        Ok(jobs)
    }

    /// Starts a spare session thread unless there is one (or the manager is closed).
    fn keep_spare(&self) {
        let inner = &self.inner;
        let mut spare = lock(&inner.spare);
        if spare.is_none() && !inner.closed.load(Ordering::SeqCst) {
            *spare = thread::Spare::spawn(inner.backend.clone())
                .inspect_err(|e| tracing::warn!(error = %e, "no spare session thread"))
                .ok();
        }
    }

    /// Why sessions cannot be saved at all here (no store), if so.
    fn store_off(&self) -> Option<String> {
        self.inner.durability.is_none().then(|| {
            "this server has no session store (sessions.store_url = off, or its default directory cannot be written): sessions live in memory only and end with it"
                .to_string()
        })
    }

    /// The error for an id with no session here or in the store: one that ended (and why), another
    /// replica's, or unknown.
    fn not_found(&self, id: &str) -> SessionError {
        if let Some((_, reason)) = lock(&self.inner.ended).iter().find(|(e, _)| e == id) {
            return SessionError::Ended {
                id: short(id).to_string(),
                reason: reason.to_string(),
            };
        }
        let here = &self.inner.replica_id;
        match replica_of(id) {
            Some(owner) if owner != here.as_str() && !owner.is_empty() => {
                SessionError::OtherReplica {
                    id: short(id).to_string(),
                    // (Its first characters only: the prefix of an id the client made up may be
                    // another session's whole random part.)
                    owner: id::shown_replica(owner),
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

    /// The session `id` here, if `caller` may use it (with bearer tokens, only the token that
    /// created it may; to any other the session does not exist).
    fn known(&self, id: &str, caller: &Caller) -> Result<Option<Arc<Session>>, SessionError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        match lock(&self.inner.sessions).get(id) {
            Some(s) if s.dead.load(Ordering::SeqCst) => Err(self.not_found(id)),
            Some(s) if s.caller.principal.is_some() && s.caller.principal != caller.principal => {
                Err(SessionError::NotFound(short(id).to_string()))
            }
            Some(s) => Ok(Some(s.clone())),
            None => Ok(None),
        }
    }

    /// The session `id`: known here, or found in the store (saved by this process before a
    /// restart, or by another replica).
    async fn find(&self, id: &str, caller: &Caller) -> Result<Arc<Session>, SessionError> {
        match self.known(id, caller)? {
            Some(session) => Ok(session),
            None => {
                let from = std::time::Instant::now();
                let adopted = self.adopt(id, caller).await;
                let to = std::time::Instant::now();
                traces::current().child("session.restore", from, to, Vec::new());
                adopted
            }
        }
    }

    /// Queues `job` (made with its place in the queue) on the session's thread, resuming the
    /// session first if it is spilled, unless it already has a running call and `queue_capacity`
    /// waiting.
    async fn submit(
        &self,
        session: &Arc<Session>,
        job: impl FnOnce(Pending) -> Job,
    ) -> Result<(), SessionError> {
        let capacity = self.inner.config.queue_capacity;
        let pending = Pending::take(&session.pending, capacity + 1).map_err(|waiting| {
            SessionError::Busy {
                id: session.id.to_string(),
                waiting,
                capacity,
            }
        })?;
        session.touch(self.now());
        let mut place = session.place.lock().await;
        if session.dead.load(Ordering::SeqCst) {
            return Err(self.not_found(session.id.as_wire()));
        }
        if let Place::Spilled { .. } = &*place {
            let from = std::time::Instant::now();
            let resumed = self.resume(session, &mut place).await;
            let to = std::time::Instant::now();
            traces::current().child("session.resume", from, to, Vec::new());
            resumed?;
        }
        match &*place {
            Place::Resident(jobs) => jobs
                .send(job(pending))
                .map_err(|_| self.not_found(session.id.as_wire())),
            Place::Spilled { .. } => Err(self.not_found(session.id.as_wire())),
        }
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
        let session = self.find(id, caller).await?;
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
        })
        .await?;
        let queued = std::time::Instant::now();
        let outcome = result.await;
        guard.done = true;
        session.touch(self.now());
        let run = outcome.map_err(|_| self.not_found(id))?;
        let span = traces::current();
        span.child("session.wait", queued, run.ran.0.max(queued), Vec::new());
        span.child("sandbox.execute", run.ran.0, run.ran.1, Vec::new());
        *lock(&session.unsaveable) = run.unsaveable.clone();
        Ok(run)
    }

    /// The regular files under the session's /workspace (at most `MAX_LISTED_FILES`).
    pub async fn list_files(
        &self,
        id: &str,
        caller: &Caller,
    ) -> Result<SessionFiles, SessionError> {
        let session = self.find(id, caller).await?;
        let (reply, result) = oneshot::channel();
        self.submit(&session, |pending| Job::List { reply, pending })
            .await?;
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
        let session = self.find(id, caller).await?;
        let (reply, result) = oneshot::channel();
        let path = path.to_string();
        self.submit(&session, |pending| Job::Read {
            path,
            limit,
            reply,
            pending,
        })
        .await?;
        match result.await {
            Ok(Ok(FileRead::Found(data))) => Ok(Some(Ok(data))),
            Ok(Ok(FileRead::TooLarge)) => Ok(Some(Err(limit))),
            Ok(Ok(FileRead::Missing)) => Ok(None),
            _ => Err(self.not_found(id)),
        }
    }

    /// Ends session `id` at once (a call running in it is stopped) and deletes its image.
    pub async fn clear(&self, id: &str, caller: &Caller) -> Result<(), SessionError> {
        self.find(id, caller).await?;
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
            .map(|s| s.id.as_wire().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// How many sessions are live (resident or spilled).
    pub fn live(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    /// How many sessions are in memory.
    pub fn resident(&self) -> usize {
        lock(&self.inner.sessions)
            .values()
            .filter(|s| s.resident.load(Ordering::SeqCst))
            .count()
    }

    fn report_places(&self) {
        let (resident, all) = {
            let sessions = lock(&self.inner.sessions);
            let resident = sessions
                .values()
                .filter(|s| s.resident.load(Ordering::SeqCst))
                .count();
            (resident, sessions.len())
        };
        telemetry::sessions_placed(resident, all - resident);
    }

    /// Removes session `id` (its thread ends when its queued jobs are dropped; a running call is
    /// stopped); its image and lease are deleted unless the process is shutting down.
    fn end(&self, id: &str, reason: SessionEnd) {
        Self::end_in(&self.inner, id, reason);
    }

    fn end_in(inner: &Inner<B>, id: &str, reason: SessionEnd) {
        let removed = lock(&inner.sessions).remove(id);
        let Some(session) = removed else { return };
        session.dead.store(true, Ordering::SeqCst);
        for stop in lock(&session.stops).iter() {
            stop.store(true, Ordering::SeqCst);
        }
        let was_resident = session.resident.swap(false, Ordering::SeqCst);
        if was_resident {
            *lock(&inner.resident) -= 1;
        }
        // Dropping the last sender ends the thread after its queued jobs (skipped: stopped).
        if let Ok(mut place) = session.place.try_lock() {
            *place = Place::Spilled { leased: None };
        }
        // (A spilled session that went idle here may be in use on another replica: its image is
        // left to the store's sweep, which spares images under a live lease.)
        let others_may_hold = reason == SessionEnd::Idle && !was_resident;
        if reason != SessionEnd::Shutdown && !others_may_hold {
            inner.forget(id);
        }
        let live = lock(&inner.sessions).len();
        telemetry::session_ended(reason, live);
        tracing::info!(
            session = short(id),
            reason = reason.label(),
            "session ended"
        );
    }

    /// Its sandbox can run nothing more: the session ends, and the next call hears why.
    fn ended_by_sandbox(inner: &Inner<B>, id: &str, end: SandboxEnd) {
        inner.remember_end(id, end.reason());
        let reason = if end.is_limit() {
            SessionEnd::Limit
        } else {
            SessionEnd::Error
        };
        Self::end_in(inner, id, reason);
    }

    /// Whether any session has a job queued or running.
    pub fn busy(&self) -> bool {
        lock(&self.inner.sessions)
            .values()
            .any(|s| s.pending.load(Ordering::SeqCst) > 0)
    }
}

impl<B: Backend> Inner<B> {
    /// Called by a session's thread whose sandbox ended (see `thread.rs`).
    fn sandbox_ended(self: &Arc<Self>, id: &str, end: SandboxEnd) {
        Sessions::<B>::ended_by_sandbox(self, id, end);
    }

    /// Remembers why session `id` ended, for its next call's error.
    fn remember_end(&self, id: &str, reason: &'static str) {
        let mut ended = lock(&self.ended);
        if ended.len() >= REMEMBERED_ENDS {
            ended.pop_front();
        }
        ended.push_back((id.to_string(), reason));
    }
}
