//! Durable sessions: spilling a session to the store and resuming it, here or on another replica.
//!
//! - **Spill.** An idle session (after `spill_after`, or the least recently used one when
//!   `max_resident` are in memory, or every one at shutdown) is saved between calls: its thread
//!   makes the image, the manager seals it into the store with a record of the session (created
//!   when, used when, whose token), then frees the sandbox. A save that is refused (the session holds
//!   what an image cannot carry) or that the store fails leaves the session in memory, with the
//!   reason logged and counted.
//! - **Resume.** A call for a spilled session takes the session's lease in the store (one process
//!   runs it at a time), loads and opens its image, and boots a sandbox from it; a call for a session
//!   this process does not know looks in the store first (a restart, another replica's session).
//!   The lease is renewed while the session is in memory and released when it is saved again.
//! - **End.** An ended session's image and lease are deleted; images nobody resumed for
//!   `idle_timeout` are swept from the store by every replica (unless a live lease holds them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::thread::{Job, Start};
use super::{
    Backend, Caller, Inner, Place, Principal, ResidentSlot, Session, SessionError, SessionId,
    Sessions, id, lock, short,
};
use crate::store::{Store, StoreError, unix_ms};
use crate::telemetry::{self, ResumeOutcome, SaveOutcome, SessionEnd};

/// How long a lease lasts unless renewed (a holder that died frees its sessions after this).
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// A spill that failed in the store is not tried again for this long (the reaper would otherwise
/// copy the session's memory four times a second).
pub(super) const SPILL_RETRY: Duration = Duration::from_secs(30);
/// How long a call waits for a session another replica holds to be handed over (saved there once
/// idle, see the reaper) before it answers `SessionElsewhere`.
const HANDOFF_WAIT: Duration = Duration::from_secs(10);
/// How long a call for a session waits, while the server drains, for the session to be saved.
pub(super) const DRAIN_WAIT: Duration = Duration::from_secs(25);
/// Saves running at once (each holds a copy of a sandbox's memory).
const CONCURRENT_SAVES: usize = 2;
/// How often each replica sweeps the store of images nobody resumed.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The session store and what the manager needs to use it.
pub struct Durability {
    pub(super) store: Store,
    /// Who this process is in leases: its replica id and a random instance.
    pub(super) holder: String,
    /// The largest image payload accepted (the sandbox's memory limit and its files).
    max_image_bytes: u64,
    saves: tokio::sync::Semaphore,
    pub(super) last_sweep: Mutex<Option<Instant>>,
    /// How long a call waits for another replica to hand a session over.
    handoff_wait: Duration,
}

impl Durability {
    /// Sessions saved to `store` by this process of `replica_id`, images of at most
    /// `max_image_bytes`.
    pub fn new(store: Store, replica_id: &str, max_image_bytes: u64) -> Self {
        let mut random = [0u8; 8];
        let _ = getrandom::fill(&mut random);
        Self {
            store,
            holder: format!("{replica_id}/{}", hex::encode(random)),
            max_image_bytes,
            saves: tokio::sync::Semaphore::new(CONCURRENT_SAVES),
            last_sweep: Mutex::new(None),
            handoff_wait: HANDOFF_WAIT,
        }
    }

    /// The same, waiting at most `wait` for another replica to hand a session over.
    pub fn with_handoff_wait(self, wait: Duration) -> Self {
        Self {
            handoff_wait: wait,
            ..self
        }
    }
}

/// What the store keeps of a session besides its image (sealed with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub created_ms: u64,
    pub last_used_ms: u64,
    pub principal: Option<Principal>,
}

const RECORD_MAGIC: &[u8; 8] = b"CIMREC\0\x01";
/// What is stored for a session that could not be saved when its process stopped: why.
const ENDED_MAGIC: &[u8; 8] = b"CIMEND\0\x01";

/// The stored payload of a session that ended unsaved (its next call hears why).
pub(super) fn tombstone(reason: &str) -> Vec<Bytes> {
    let mut out = ENDED_MAGIC.to_vec();
    out.extend_from_slice(reason.as_bytes());
    vec![out.into()]
}

/// What the store held for a session.
pub(super) enum Saved {
    Session(Record, Bytes),
    /// It ended unsaved, for this reason.
    Ended(String),
}

/// Reads a stored payload.
pub(super) fn decode_saved(bytes: Bytes) -> Result<Saved, String> {
    if bytes.starts_with(ENDED_MAGIC) {
        return Ok(Saved::Ended(
            String::from_utf8_lossy(&bytes[ENDED_MAGIC.len()..]).into_owned(),
        ));
    }
    Record::decode(bytes).map(|(record, image)| Saved::Session(record, image))
}

impl Record {
    /// The record, to be followed by the image payload's parts.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(RECORD_MAGIC);
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        out.extend_from_slice(&self.last_used_ms.to_le_bytes());
        match &self.principal {
            Some(Principal(digest)) => {
                out.push(1);
                out.extend_from_slice(digest);
            }
            None => out.push(0),
        }
        out.into()
    }

    /// The record and the image payload after it.
    pub fn decode(bytes: Bytes) -> Result<(Self, Bytes), String> {
        let bad = || "the saved session's record is malformed".to_string();
        if bytes.len() < 25 || &bytes[..8] != RECORD_MAGIC {
            return Err(bad());
        }
        let u64_at =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let (created_ms, last_used_ms) = (u64_at(8), u64_at(16));
        let (principal, start) = match bytes[24] {
            0 => (None, 25),
            1 if bytes.len() >= 57 => {
                let mut digest = [0u8; 32];
                digest.copy_from_slice(&bytes[25..57]);
                (Some(Principal(digest)), 57)
            }
            _ => return Err(bad()),
        };
        Ok((
            Self {
                created_ms,
                last_used_ms,
                principal,
            },
            bytes.slice(start..),
        ))
    }
}

impl<B: Backend> Inner<B> {
    /// Deletes session `id`'s image and lease (in the background; a failure is logged).
    pub(super) fn forget(&self, id: &str) {
        let (Some(durability), Some(runtime)) = (&self.durability, &self.runtime) else {
            return;
        };
        let (store, id) = (durability.store.clone(), id.to_string());
        runtime.spawn(async move {
            if let Err(e) = store.delete(&id).await {
                tracing::warn!(session = short(&id), error = %e, "an ended session's image was not deleted");
            }
            let _ = store.forget_lease(&id).await;
        });
    }
}

impl<B: Backend> Sessions<B> {
    /// A place in memory for one more sandbox, spilling the least recently used idle sessions
    /// (never `except`) to make one; an error when none can be spilled.
    pub(super) async fn make_room(
        &self,
        except: Option<&str>,
    ) -> Result<ResidentSlot<'_>, SessionError> {
        let inner = &self.inner;
        let mut tried: Vec<SessionId> = Vec::new();
        let now = self.now();
        loop {
            {
                let mut count = lock(&inner.resident);
                if *count < inner.config.max_resident {
                    *count += 1;
                    return Ok(ResidentSlot(Some(&inner.resident)));
                }
            }
            let candidate = lock(&inner.sessions)
                .values()
                .filter(|s| {
                    s.resident.load(Ordering::SeqCst)
                        && s.pending.load(Ordering::SeqCst) == 0
                        && s.spillable(now)
                        && Some(s.id.as_wire()) != except
                        && !tried.contains(&s.id)
                })
                .min_by_key(|s| s.last_used())
                .cloned();
            let Some(session) = candidate else {
                return Err(SessionError::TooManyResident {
                    max: inner.config.max_resident,
                });
            };
            tried.push(session.id.clone());
            self.spill(&session).await;
        }
    }

    /// Saves `session` to the store and frees its sandbox, if it is resident, idle and can be
    /// saved; whether it was spilled. A failure leaves it in memory (logged and counted).
    pub(super) async fn spill(&self, session: &Arc<Session>) -> bool {
        let Some(durability) = &self.inner.durability else {
            return false;
        };
        let Ok(mut place) = session.place.try_lock() else {
            return false;
        };
        if session.pending.load(Ordering::SeqCst) > 0 || session.dead.load(Ordering::SeqCst) {
            return false;
        }
        let Place::Resident(jobs) = &*place else {
            return false;
        };
        let Ok(_permit) = durability.saves.acquire().await else {
            return false;
        };
        let started = Instant::now();
        let (reply, saved) = oneshot::channel();
        if jobs
            .send(Job::Save {
                reply,
                pending: None,
            })
            .is_err()
        {
            return false;
        }
        let image = match saved.await {
            Ok(Ok(image)) => image,
            Ok(Err(reason)) => {
                tracing::info!(session = %session.id, reason = %reason, "session not saved: it holds what an image cannot carry; it stays in memory");
                *lock(&session.unsaveable) = Some(reason);
                telemetry::session_saved(SaveOutcome::Refused, started.elapsed(), None);
                return false;
            }
            Err(_) => return false,
        };
        let imaged = started.elapsed();
        let idle_for = self.now().saturating_duration_since(session.last_used());
        let record = Record {
            created_ms: session.created_ms,
            last_used_ms: unix_ms().saturating_sub(idle_for.as_millis() as u64),
            principal: session.caller.principal,
        };
        let mut payload = vec![record.encode()];
        payload.extend(image);
        let bytes = match durability.store.save(session.id.as_wire(), payload).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "session not saved: the store failed; it stays in memory");
                telemetry::session_saved(SaveOutcome::StoreFailed, started.elapsed(), None);
                *lock(&session.spill_failed) = Some(self.now());
                return false;
            }
        };
        // Dropping the channel ends the session's thread, and its sandbox with it.
        *place = Place::Spilled { leased: None };
        if session.resident.swap(false, Ordering::SeqCst) {
            *lock(&self.inner.resident) -= 1;
        }
        if lock(&session.leased).take().is_some()
            && let Err(e) = durability
                .store
                .release_lease(session.id.as_wire(), &durability.holder)
                .await
        {
            tracing::warn!(session = %session.id, error = %e, "a session's lease was not released; it expires");
        }
        telemetry::session_saved(SaveOutcome::Saved, started.elapsed(), Some(bytes));
        self.report_places();
        tracing::info!(
            session = %session.id,
            bytes,
            ms = started.elapsed().as_millis() as u64,
            image_ms = imaged.as_millis() as u64,
            "session saved and spilled"
        );
        true
    }

    /// Takes session `id`'s lease for this process. When another replica holds it, asks for it
    /// (a marker in the store its reaper looks for: it saves the session as soon as it is idle and
    /// releases the lease) and waits up to `HANDOFF_WAIT`.
    async fn lease(&self, durability: &Durability, id: &str) -> Result<(), SessionError> {
        let started = Instant::now();
        let mut asked = false;
        let outcome = loop {
            match durability
                .store
                .take_lease(id, &durability.holder, LEASE_TTL)
                .await
            {
                Ok(Ok(_)) => break Ok(()),
                Ok(Err(held)) if started.elapsed() >= durability.handoff_wait => {
                    telemetry::session_resumed(ResumeOutcome::Held, Duration::ZERO);
                    break Err(SessionError::Elsewhere {
                        id: short(id).to_string(),
                        expires_in_s: held.expires_in.as_secs().max(1),
                    });
                }
                Ok(Err(_)) => {
                    if !asked {
                        asked = true;
                        if let Err(e) = durability.store.want(id).await {
                            break Err(self.store_failed(id, e));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => break Err(self.store_failed(id, e)),
            }
        };
        if asked {
            let _ = durability.store.unwant(id).await;
        }
        outcome
    }

    fn store_failed(&self, id: &str, e: StoreError) -> SessionError {
        match e {
            StoreError::Open(open) => {
                telemetry::session_resumed(ResumeOutcome::Unrestorable, Duration::ZERO);
                SessionError::Unrestorable {
                    id: short(id).to_string(),
                    reason: open.to_string(),
                }
            }
            other => {
                telemetry::session_resumed(ResumeOutcome::StoreFailed, Duration::ZERO);
                tracing::warn!(session = short(id), error = %other, "the session store failed");
                SessionError::StoreUnavailable {
                    id: short(id).to_string(),
                    reason: "the store did not answer or refused the request".into(),
                }
            }
        }
    }

    /// The image of session `id` (this process holding its lease), its record checked.
    async fn load(
        &self,
        durability: &Durability,
        id: &str,
    ) -> Result<(Record, Bytes), SessionError> {
        let release = || async {
            let _ = durability.store.release_lease(id, &durability.holder).await;
        };
        let payload = match durability.store.load(id, durability.max_image_bytes).await {
            Ok(Some(payload)) => payload,
            Ok(None) => {
                release().await;
                return Err(self.not_found(id));
            }
            Err(e) => {
                release().await;
                return Err(self.store_failed(id, e));
            }
        };
        match decode_saved(payload) {
            Ok(Saved::Session(record, image)) => Ok((record, image)),
            Ok(Saved::Ended(reason)) => {
                release().await;
                Err(SessionError::Ended {
                    id: short(id).to_string(),
                    reason,
                })
            }
            Err(reason) => {
                release().await;
                telemetry::session_resumed(ResumeOutcome::Unrestorable, Duration::ZERO);
                Err(SessionError::Unrestorable {
                    id: short(id).to_string(),
                    reason,
                })
            }
        }
    }

    /// Session `id` found in the store (saved by this process before it restarted, or by another
    /// replica): known here from now on, spilled, its lease held and its image loaded.
    pub(super) async fn adopt(
        &self,
        id: &str,
        caller: &Caller,
    ) -> Result<Arc<Session>, SessionError> {
        let inner = &self.inner;
        let Some(durability) = &inner.durability else {
            return Err(self.not_found(id));
        };
        if !id::well_formed(id) || lock(&inner.ended).iter().any(|(e, _)| e == id) {
            return Err(self.not_found(id));
        }
        match durability.store.exists(id).await {
            Ok(true) => {}
            Ok(false) => return Err(self.not_found(id)),
            Err(e) => return Err(self.store_failed(id, e)),
        }
        {
            let live = lock(&inner.sessions).len();
            if live >= inner.config.max_sessions {
                return Err(SessionError::TooMany {
                    live,
                    max: inner.config.max_sessions,
                });
            }
        }
        self.lease(durability, id).await?;
        let (record, image) = self.load(durability, id).await?;
        if record.principal.is_some() && record.principal != caller.principal {
            let _ = durability.store.release_lease(id, &durability.holder).await;
            return Err(SessionError::NotFound(short(id).to_string()));
        }
        let age = Duration::from_millis(unix_ms().saturating_sub(record.created_ms));
        if age >= inner.config.max_lifetime {
            inner.remember_end(id, "it reached its lifetime (sessions.max_lifetime_s)");
            inner.forget(id);
            return Err(self.not_found(id));
        }
        let now = self.now();
        let idle = Duration::from_millis(unix_ms().saturating_sub(record.last_used_ms));
        let session = Arc::new(Session {
            id: SessionId::from_wire(id),
            caller: Caller {
                client: None,
                principal: record.principal,
                profile: None,
            },
            created: now.checked_sub(age).unwrap_or(now),
            created_ms: record.created_ms,
            last_used: Mutex::new(now.checked_sub(idle).unwrap_or(now)),
            pending: Arc::default(),
            stops: Mutex::new(Vec::new()),
            dead: Arc::new(AtomicBool::new(false)),
            place: tokio::sync::Mutex::new(Place::Spilled {
                leased: Some(image),
            }),
            resident: AtomicBool::new(false),
            unsaveable: Mutex::new(None),
            leased: Mutex::new(Some(now)),
            spill_failed: Mutex::new(None),
        });
        let session = lock(&inner.sessions)
            .entry(SessionId::from_wire(id))
            .or_insert(session)
            .clone();
        self.report_places();
        tracing::info!(session = short(id), "session found in the store");
        Ok(session)
    }

    /// Brings spilled `session` back into memory (`place` is its locked place): its lease, its
    /// image, a sandbox restored from it. An image that does not restore ends the session.
    pub(super) async fn resume(
        &self,
        session: &Arc<Session>,
        place: &mut Place,
    ) -> Result<(), SessionError> {
        let Some(durability) = &self.inner.durability else {
            return Err(self.not_found(session.id.as_wire()));
        };
        let room = self.make_room(Some(session.id.as_wire())).await?;
        let started = Instant::now();
        let image = match std::mem::replace(place, Place::Spilled { leased: None }) {
            Place::Spilled {
                leased: Some(image),
            } => image,
            _ => {
                self.lease(durability, session.id.as_wire()).await?;
                let leased = started.elapsed();
                let image = self.load(durability, session.id.as_wire()).await?.1;
                tracing::debug!(
                    lease_ms = leased.as_secs_f64() * 1e3,
                    load_ms = (started.elapsed() - leased).as_secs_f64() * 1e3,
                    "session image loaded"
                );
                image
            }
        };
        *lock(&session.leased) = Some(self.now());
        match self
            .spawn_thread(&session.id, Start::Restore(image), session.dead.clone())
            .await
        {
            Ok(jobs) => {
                *place = Place::Resident(jobs);
                session.resident.store(true, Ordering::SeqCst);
                room.kept();
                telemetry::session_resumed(ResumeOutcome::Resumed, started.elapsed());
                self.report_places();
                tracing::info!(
                    session = %session.id,
                    ms = started.elapsed().as_millis() as u64,
                    "session resumed"
                );
                Ok(())
            }
            Err(reason) => {
                telemetry::session_resumed(ResumeOutcome::BootFailed, started.elapsed());
                tracing::warn!(session = %session.id, error = %reason, "a saved session did not restore; it ends");
                self.inner.remember_end(
                    session.id.as_wire(),
                    "its saved image could not be restored",
                );
                self.end(session.id.as_wire(), SessionEnd::Error);
                Err(SessionError::Unrestorable {
                    id: session.id.to_string(),
                    reason,
                })
            }
        }
    }
}
