//! Leases: one session runs in one place at a time. A lease is a record (holder, expiry) written
//! beside the session's image as a numbered generation under `leases/<name>/`; a process takes the
//! lease by *creating* the next generation, which the store lets exactly one writer do (a conditional
//! create: a hard link on a directory, `If-None-Match: *` on S3), so two replicas racing for one
//! session never both win. A live lease of another holder is refused; an expired one (its holder
//! died) is taken over; the holder renews and releases its own the same way. Only create, list and
//! delete are used, which every backend offers.

use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, seal, unix_ms};

/// Generations kept behind the current one (older ones are deleted by the writer of a new one).
const KEEP: usize = 2;
/// The largest lease record read (a record is a few dozen bytes).
const MAX_RECORD: u64 = 64 << 10;

/// What a lease generation records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The process that holds it (its replica id and a random instance); empty: released.
    pub holder: String,
    /// Until when, milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

/// A lease this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The generation written.
    pub generation: u64,
    pub expires_ms: u64,
}

/// Why a lease was not taken: another live holder has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub holder: String,
    /// How long until it expires (unless renewed).
    pub expires_in: Duration,
}

fn dir(id: &str) -> ObjectPath {
    dir_of(&seal::name(id))
}

/// The lease directory of the session whose hashed name is `name`.
fn dir_of(name: &str) -> ObjectPath {
    ObjectPath::from(format!("leases/{name}"))
}

fn generation_path(id: &str, generation: u64) -> ObjectPath {
    dir(id).join(format!("{generation:020}"))
}

impl Store {
    /// The generations of `id`'s lease, newest last.
    async fn generations(&self, id: &str) -> Result<Vec<u64>, StoreError> {
        let listed: Vec<_> = self
            .objects
            .list(Some(&dir(id)))
            .try_collect()
            .await
            .map_err(|e| self.backend(e))?;
        let mut generations: Vec<u64> = listed
            .iter()
            .filter_map(|meta| meta.location.filename()?.parse().ok())
            .collect();
        generations.sort_unstable();
        Ok(generations)
    }

    async fn read(&self, id: &str, generation: u64) -> Result<Option<Record>, StoreError> {
        let bytes = self
            .fetch(&generation_path(id, generation), MAX_RECORD)
            .await?;
        // A record that does not parse is treated as released (it can only be a damaged write of
        // a holder that then died).
        Ok(bytes.map(|bytes| {
            serde_json::from_slice(&bytes).unwrap_or(Record {
                holder: String::new(),
                expires_ms: 0,
            })
        }))
    }

    /// Writes generation `generation` if nobody has: whether this writer won.
    async fn create(&self, id: &str, generation: u64, record: &Record) -> Result<bool, StoreError> {
        let body = serde_json::to_vec(record).map_err(|e| StoreError::Seal(e.to_string()))?;
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .objects
            .put_opts(
                &generation_path(id, generation),
                PutPayload::from(body),
                options,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// Deletes the generations older than `current` but the last `KEEP` (best effort).
    async fn prune(&self, id: &str, generations: &[u64], current: u64) {
        let old: Vec<u64> = generations
            .iter()
            .copied()
            .filter(|g| *g < current)
            .collect();
        for generation in old.iter().take(old.len().saturating_sub(KEEP)) {
            let _ = self.objects.delete(&generation_path(id, *generation)).await;
        }
    }

    /// Takes (or renews) session `id`'s lease for `holder` until `ttl` from now, unless another
    /// holder's lease is live.
    pub async fn take_lease(
        &self,
        id: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Result<Lease, Held>, StoreError> {
        // Two rounds: a writer that loses a race reads the winner's record.
        for _ in 0..2 {
            let generations = self.generations(id).await?;
            let current = generations.last().copied();
            let now = unix_ms();
            if let Some(generation) = current
                && let Some(record) = self.read(id, generation).await?
                && !record.holder.is_empty()
                && record.holder != holder
                && record.expires_ms > now
            {
                return Ok(Err(Held {
                    holder: record.holder,
                    expires_in: Duration::from_millis(record.expires_ms - now),
                }));
            }
            let next = current.map_or(1, |g| g + 1);
            let expires_ms = now + u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX / 2);
            let record = Record {
                holder: holder.to_string(),
                expires_ms,
            };
            if self.create(id, next, &record).await? {
                self.prune(id, &generations, next).await;
                return Ok(Ok(Lease {
                    generation: next,
                    expires_ms,
                }));
            }
        }
        // Lost twice: someone else is busy taking it.
        let generation = self.generations(id).await?.last().copied().unwrap_or(0);
        let now = unix_ms();
        let (holder, expires_ms) = self
            .read(id, generation)
            .await?
            .map_or((String::new(), now), |r| (r.holder, r.expires_ms));
        Ok(Err(Held {
            holder,
            expires_in: Duration::from_millis(expires_ms.saturating_sub(now)),
        }))
    }

    /// Releases `holder`'s lease of session `id` (if it still holds it: a lease it lost is left).
    pub async fn release_lease(&self, id: &str, holder: &str) -> Result<(), StoreError> {
        let generations = self.generations(id).await?;
        let Some(current) = generations.last().copied() else {
            return Ok(());
        };
        match self.read(id, current).await? {
            Some(record) if record.holder == holder => {
                let released = Record {
                    holder: String::new(),
                    expires_ms: 0,
                };
                if self.create(id, current + 1, &released).await? {
                    self.prune(id, &generations, current + 1).await;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Deletes every generation of session `id`'s lease (the session has ended).
    pub async fn forget_lease(&self, id: &str) -> Result<(), StoreError> {
        for generation in self.generations(id).await? {
            match self.objects.delete(&generation_path(id, generation)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.backend(e)),
            }
        }
        Ok(())
    }
}

impl Store {
    /// Deletes the images not written for `idle` (sessions nobody resumed within their idle
    /// timeout), with their leases, unless a live lease holds them (a replica has the session in
    /// memory); how many were deleted.
    pub async fn sweep(&self, idle: Duration) -> Result<usize, StoreError> {
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(idle).unwrap_or_default();
        let old: Vec<String> = self
            .objects
            .list(None)
            .try_filter_map(|meta| {
                let name = meta
                    .location
                    .filename()
                    .and_then(|f| f.strip_suffix(super::SUFFIX))
                    .filter(|_| meta.last_modified < cutoff)
                    .map(str::to_string);
                std::future::ready(Ok(name))
            })
            .try_collect()
            .await
            .map_err(|e| self.backend(e))?;
        let now = unix_ms();
        let mut deleted = 0;
        for name in old {
            let leases: Vec<_> = self
                .objects
                .list(Some(&dir_of(&name)))
                .try_collect()
                .await
                .map_err(|e| self.backend(e))?;
            let newest = leases
                .iter()
                .max_by_key(|m| m.location.filename().map(str::to_string));
            if let Some(meta) = newest
                && let Ok(Some(bytes)) = self.fetch(&meta.location, MAX_RECORD).await
                && let Ok(record) = serde_json::from_slice::<Record>(&bytes)
                && !record.holder.is_empty()
                && record.expires_ms > now
            {
                continue;
            }
            for meta in &leases {
                let _ = self.objects.delete(&meta.location).await;
            }
            self.forget_generation(&name);
            let _ = self
                .objects
                .delete(&ObjectPath::from(format!(
                    "{name}{}",
                    super::GENERATION_SUFFIX
                )))
                .await;
            match self
                .objects
                .delete(&ObjectPath::from(format!("{name}{}", super::SUFFIX)))
                .await
            {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                Err(e) => return Err(self.backend(e)),
            }
        }
        Ok(deleted)
    }
}

/// The marker of a session another process is waiting for.
fn want_path(name: &str) -> ObjectPath {
    ObjectPath::from(format!("wants/{name}"))
}

impl Store {
    /// Asks the holder of session `id`'s lease to hand the session over (its process saves it as
    /// soon as it is idle, see [`wanted`](Self::wanted)).
    pub async fn want(&self, id: &str) -> Result<(), StoreError> {
        self.objects
            .put(
                &want_path(&seal::name(id)),
                PutPayload::from_static(b"wanted"),
            )
            .await
            .map(drop)
            .map_err(|e| self.backend(e))
    }

    /// Withdraws the request to hand session `id` over.
    pub async fn unwant(&self, id: &str) -> Result<(), StoreError> {
        match self.objects.delete(&want_path(&seal::name(id))).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// The hashed names ([`seal::name`]) of the sessions other processes are waiting for.
    pub async fn wanted(&self) -> Result<Vec<String>, StoreError> {
        self.objects
            .list(Some(&ObjectPath::from("wants")))
            .try_filter_map(|meta| {
                std::future::ready(Ok(meta.location.filename().map(str::to_string)))
            })
            .try_collect()
            .await
            .map_err(|e| self.backend(e))
    }
}
