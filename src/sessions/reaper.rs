//! The reaper's rounds and shutdown: sessions that went idle or old end, idle ones are spilled,
//! leases of resumed ones are renewed, the store is swept; at shutdown every resident session that
//! can be saved is, and the others leave word of why they ended.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::durable::{LEASE_TTL, SWEEP_EVERY, tombstone};
use super::{Backend, Session, SessionId, Sessions, lock};
use crate::telemetry::SessionEnd;

impl<B: Backend> Sessions<B> {
    /// Ends sessions idle for longer than `idle_timeout` or older than `max_lifetime`, spills the
    /// idle ones past `spill_after` and those over `max_resident`, renews the leases of resumed
    /// ones, and now and then sweeps the store.
    pub async fn reap(&self) {
        let now = self.now();
        let config = &self.inner.config;
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let mut keep = Vec::new();
        for s in sessions {
            let idle = s.pending.load(Ordering::SeqCst) == 0;
            if now.duration_since(s.created) >= config.max_lifetime {
                self.end(s.id.as_wire(), SessionEnd::Lifetime);
            } else if idle && now.duration_since(s.last_used()) >= config.idle_timeout {
                self.end(s.id.as_wire(), SessionEnd::Idle);
            } else {
                keep.push(s);
            }
        }
        let Some(durability) = &self.inner.durability else {
            return;
        };
        let mut resident: Vec<&Arc<Session>> = keep
            .iter()
            .filter(|s| s.resident.load(Ordering::SeqCst))
            .collect();
        resident.sort_by_key(|s| s.last_used());
        let over = resident.len().saturating_sub(config.max_resident);
        for (n, s) in resident.iter().enumerate() {
            let idle_for = now.duration_since(s.last_used());
            let due = n < over || config.spill_after.is_some_and(|after| idle_for >= after);
            if due && s.spillable(now) {
                self.spill(s).await;
            }
        }
        // Sessions another replica is waiting for are handed over as soon as they are idle. Only
        // a session this process holds the lease of (it came from the store) can be waited for, so
        // the store is asked only when there is one.
        let leased: Vec<&Arc<Session>> = resident
            .iter()
            .copied()
            .filter(|s| s.resident.load(Ordering::SeqCst) && lock(&s.leased).is_some())
            .collect();
        let wanted = if leased.is_empty() {
            Vec::new()
        } else {
            durability.store.wanted().await.unwrap_or_default()
        };
        for s in &leased {
            if wanted.contains(&crate::store::seal::name(s.id.as_wire())) && s.spillable(now) {
                self.spill(s).await;
            }
        }
        for s in &keep {
            let renew = s.resident.load(Ordering::SeqCst)
                && lock(&s.leased).is_some_and(|at| now.duration_since(at) >= LEASE_TTL / 3);
            if renew {
                match durability
                    .store
                    .take_lease(s.id.as_wire(), &durability.holder, LEASE_TTL)
                    .await
                {
                    Ok(Ok(_)) => *lock(&s.leased) = Some(now),
                    Ok(Err(_)) => tracing::warn!(
                        session = %s.id,
                        "another replica took a session's lease while it was in memory here"
                    ),
                    Err(e) => {
                        tracing::warn!(session = %s.id, error = %e, "a session's lease was not renewed")
                    }
                }
            }
        }
        let sweep = {
            let mut last = lock(&durability.last_sweep);
            let due = last.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY);
            if due {
                *last = Some(now);
            }
            due
        };
        if sweep {
            match durability.store.sweep(config.idle_timeout).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(images = n, "idle session images swept from the store"),
                Err(e) => tracing::warn!(error = %e, "the session store was not swept"),
            }
        }
    }

    /// Whether the manager is shutting down (it takes no more session calls).
    pub fn draining(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// While draining: waits until session `id` is no longer in memory here (saved to the store for
    /// another replica to resume, or ended), or the drain is over.
    pub async fn handed_over(&self, id: &str) {
        let started = Instant::now();
        while started.elapsed() < super::durable::DRAIN_WAIT {
            let here = lock(&self.inner.sessions)
                .get(id)
                .is_some_and(|s| s.resident.load(Ordering::SeqCst));
            if !here {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Shutdown: no new session calls; calls running now may finish until `deadline`, then every
    /// resident session that can be saved is (until `deadline`), and every session ends here.
    /// Saved sessions resume on their next call, on any replica sharing the store.
    pub async fn shutdown(&self, deadline: Instant) {
        self.inner.closed.store(true, Ordering::SeqCst);
        // The spare session thread ends with its parked sandbox.
        drop(super::lock(&self.inner.spare).take());
        while self.busy() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(durability) = &self.inner.durability else {
            let ids: Vec<SessionId> = lock(&self.inner.sessions).keys().cloned().collect();
            for id in ids {
                self.end(id.as_wire(), SessionEnd::Shutdown);
            }
            return;
        };
        let resident: Vec<Arc<Session>> = lock(&self.inner.sessions)
            .values()
            .filter(|s| s.resident.load(Ordering::SeqCst) && lock(&s.unsaveable).is_none())
            .cloned()
            .collect();
        let started = Instant::now();
        let saves = futures::future::join_all(resident.iter().map(|s| self.spill(s)));
        let saved = tokio::time::timeout_at(deadline.into(), saves)
            .await
            .map(|done| done.into_iter().filter(|s| *s).count());
        match saved {
            Ok(n) => tracing::info!(
                saved = n,
                of = resident.len(),
                ms = started.elapsed().as_millis() as u64,
                "sessions saved at shutdown"
            ),
            Err(_) => tracing::warn!("the shutdown deadline came before every session was saved"),
        }
        // Those that could not be saved leave word of why, for their next call on any replica.
        let unsaved: Vec<(String, String)> = lock(&self.inner.sessions)
            .values()
            .filter(|s| s.resident.load(Ordering::SeqCst))
            .map(|s| {
                let why = lock(&s.unsaveable)
                    .clone()
                    .unwrap_or_else(|| "it could not be saved before the deadline".to_string());
                (
                    s.id.as_wire().to_string(),
                    format!("the server it ran on stopped, and it was not saved: {why}"),
                )
            })
            .collect();
        let store = durability.store.clone();
        let notes = futures::future::join_all(
            unsaved
                .iter()
                .map(|(id, why)| store.save(id, tombstone(why))),
        );
        let _ = tokio::time::timeout_at(deadline.into(), notes).await;
        let ids: Vec<SessionId> = lock(&self.inner.sessions).keys().cloned().collect();
        for id in ids {
            self.end(id.as_wire(), SessionEnd::Shutdown);
        }
    }
}
