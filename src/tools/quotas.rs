//! Per-principal quotas (`[quotas]`) on this replica: calls in progress at once, sandbox seconds per
//! minute (a bucket of `cpu_seconds_per_minute` seconds refilled continuously and charged with each
//! call's execution time), calls waiting for a worker (checked by the pool's queue, which knows each
//! principal's lane), and tasks held; sessions held are counted by the sessions. Without
//! authentication everyone is one principal, so the quotas act server-wide. A refusal names the
//! quota and, where time cures it, about when to retry. The registry keeps an entry only while its
//! principal has calls in progress or a bucket not yet full again, so it is bounded by the active
//! principals.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use code_interpreter_mcp_config::QuotaSettings;

use crate::sessions::{Caller, Principal};

/// A call or task refused by a quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaError {
    /// The `[quotas]` key.
    pub quota: &'static str,
    /// About when a retry may pass; `None` when only ending something cures it.
    pub retry_after: Option<Duration>,
    pub message: String,
}

/// The quotas and what each principal uses of them.
#[derive(Debug, Default)]
pub struct Quotas {
    /// The quotas of a caller without a profile (no authentication).
    limits: QuotaSettings,
    usage: Mutex<HashMap<[u8; 32], Usage>>,
}

#[derive(Debug)]
struct Usage {
    calls: u32,
    /// The bucket's size (the principal's `cpu_seconds_per_minute`), if it has one.
    size: Option<f64>,
    /// Sandbox seconds left in the bucket, as of `at` (may be negative after a long call).
    bucket: f64,
    at: Instant,
    /// Recent call durations, for the retry estimate of the concurrency quota (seconds, EWMA).
    typical: f64,
}

/// A call admitted under the quotas: ends its count when dropped; [`charge`](Self::charge) bills
/// its execution time first.
#[derive(Debug)]
pub struct Admitted {
    quotas: Option<Arc<Quotas>>,
    key: [u8; 32],
}

/// The key of a principal (everyone is one principal without authentication).
fn key(principal: Option<Principal>) -> [u8; 32] {
    principal.map_or([0; 32], |p| p.0)
}

impl Quotas {
    pub fn new(limits: QuotaSettings) -> Arc<Self> {
        Arc::new(Self {
            limits,
            usage: Mutex::default(),
        })
    }

    /// The quotas of `caller`: its profile's (overrides applied), else the server's.
    pub fn limits(&self, caller: &Caller) -> QuotaSettings {
        caller.profile.as_ref().map_or(self.limits, |p| p.limits)
    }

    /// Admits one call of `caller`, or says which quota refuses it.
    pub fn admit(self: &Arc<Self>, caller: &Caller) -> Result<Admitted, QuotaError> {
        let limits = self.limits(caller);
        if limits.max_concurrent_calls.is_none() && limits.cpu_seconds_per_minute.is_none() {
            return Ok(Admitted {
                quotas: None,
                key: [0; 32],
            });
        }
        let key = key(caller.principal);
        let now = Instant::now();
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let size = limits.cpu_seconds_per_minute.map(f64::from);
        let entry = usage.entry(key).or_insert(Usage {
            calls: 0,
            size,
            bucket: size.unwrap_or(0.0),
            at: now,
            typical: 1.0,
        });
        // The principal's quotas may have changed (a token renamed, another override).
        if entry.size != size {
            entry.size = size;
            entry.bucket = entry.bucket.min(size.unwrap_or(0.0));
        }
        if let Some(size) = size {
            refill(entry, size, now);
            if entry.bucket <= 0.0 {
                let rate = size / 60.0;
                let wait = Duration::from_secs_f64((-entry.bucket + 0.001) / rate);
                return Err(QuotaError {
                    quota: "cpu_seconds_per_minute",
                    retry_after: Some(wait),
                    message: format!(
                        "this principal has used its {size} sandbox seconds per minute (quotas.cpu_seconds_per_minute); retry in about {:.1} s",
                        wait.as_secs_f64()
                    ),
                });
            }
        }
        if let Some(max) = limits.max_concurrent_calls
            && entry.calls >= max
        {
            let wait = Duration::from_secs_f64(entry.typical.clamp(0.1, 60.0));
            return Err(QuotaError {
                quota: "max_concurrent_calls",
                retry_after: Some(wait),
                message: format!(
                    "this principal has {} calls in progress (quotas.max_concurrent_calls = {max}); retry when one ends, in about {:.1} s",
                    entry.calls,
                    wait.as_secs_f64()
                ),
            });
        }
        entry.calls += 1;
        Ok(Admitted {
            quotas: Some(Arc::clone(self)),
            key,
        })
    }

    /// Whether `caller`, holding `held` tasks, may create one more.
    pub fn admit_task(&self, caller: &Caller, held: usize) -> Result<(), QuotaError> {
        match self.limits(caller).max_tasks {
            Some(max) if held >= max as usize => Err(QuotaError {
                quota: "max_tasks",
                retry_after: None,
                message: format!(
                    "this principal holds {held} tasks (quotas.max_tasks = {max}); cancel one, or wait for one to end and its result to expire"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The most calls `caller` may have waiting for a worker.
    pub fn max_queued(&self, caller: &Caller) -> Option<usize> {
        self.limits(caller).max_queued_calls.map(|n| n as usize)
    }

    /// `caller`'s share of the workers when several principals wait (1 to 100).
    pub fn weight(&self, caller: &Caller) -> u32 {
        self.limits(caller).weight.clamp(1, 100)
    }

    /// The refusal of a call whose principal has `waiting` calls queued, `max` allowed: retry in
    /// about one of its calls' time (1 s while none is known).
    pub fn queue_refusal(
        &self,
        principal: Option<Principal>,
        waiting: usize,
        max: usize,
    ) -> QuotaError {
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let typical = usage.get(&key(principal)).map_or(1.0, |u| u.typical);
        let wait = Duration::from_secs_f64(typical.clamp(0.1, 60.0));
        QuotaError {
            quota: "max_queued_calls",
            retry_after: Some(wait),
            message: format!(
                "this principal has {waiting} calls waiting for a worker (quotas.max_queued_calls = {max}); retry when one has started, in about {:.1} s",
                wait.as_secs_f64()
            ),
        }
    }

    fn end(&self, key: [u8; 32], execution: Option<Duration>) {
        let now = Instant::now();
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = usage.get_mut(&key) else {
            return;
        };
        entry.calls = entry.calls.saturating_sub(1);
        if let Some(size) = entry.size {
            refill(entry, size, now);
        }
        if let Some(execution) = execution {
            let seconds = execution.as_secs_f64();
            entry.typical = 0.8 * entry.typical + 0.2 * seconds;
            if entry.size.is_some() {
                entry.bucket -= seconds;
            }
        }
        // Forget principals with nothing in progress and a full bucket (bounded by the active
        // principals).
        usage.retain(|_, u| {
            u.calls > 0
                || u.size.is_some_and(|size| {
                    u.bucket + now.duration_since(u.at).as_secs_f64() * size / 60.0 < size
                })
        });
    }
}

fn refill(entry: &mut Usage, size: f64, now: Instant) {
    let elapsed = now.duration_since(entry.at).as_secs_f64();
    entry.bucket = (entry.bucket + elapsed * size / 60.0).min(size);
    entry.at = now;
}

impl Admitted {
    /// Ends the call, charging `execution` to its principal's bucket.
    pub fn charge(mut self, execution: Duration) {
        if let Some(quotas) = self.quotas.take() {
            quotas.end(self.key, Some(execution));
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(quotas) = self.quotas.take() {
            quotas.end(self.key, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(principal: Option<Principal>) -> Caller {
        Caller {
            principal,
            ..Caller::default()
        }
    }

    fn quotas(calls: Option<u32>, cpu: Option<u32>) -> Arc<Quotas> {
        Quotas::new(QuotaSettings {
            max_concurrent_calls: calls,
            cpu_seconds_per_minute: cpu,
            max_tasks: Some(2),
            ..Default::default()
        })
    }

    #[test]
    fn concurrent_calls_are_counted_per_principal_and_released() {
        let q = quotas(Some(2), None);
        let (a, b) = (of(Some(Principal([1; 32]))), of(Some(Principal([2; 32]))));
        let first = q.admit(&a).unwrap();
        let _second = q.admit(&a).unwrap();
        let refused = q.admit(&a).unwrap_err();
        assert_eq!(refused.quota, "max_concurrent_calls");
        assert!(refused.retry_after.is_some());
        let _other = q.admit(&b).expect("another principal has its own count");
        drop(first);
        let _again = q.admit(&a).expect("one ended");
    }

    #[test]
    fn a_profiles_quotas_replace_the_servers() {
        use crate::sessions::{PrincipalKind, Profile};
        let q = quotas(Some(1), None);
        let mut batch = of(Some(Principal([3; 32])));
        batch.profile = Some(Arc::new(Profile {
            name: Some("batch".into()),
            kind: PrincipalKind::Token,
            limits: QuotaSettings {
                max_concurrent_calls: Some(2),
                weight: 5,
                ..Default::default()
            },
        }));
        let _first = q.admit(&batch).unwrap();
        let _second = q.admit(&batch).expect("its override allows two");
        assert_eq!(q.admit(&batch).unwrap_err().quota, "max_concurrent_calls");
        assert_eq!((q.weight(&batch), q.weight(&Caller::default())), (5, 1));
        assert_eq!(q.max_queued(&batch), None);
    }

    #[test]
    fn the_bucket_is_charged_with_execution_and_refills() {
        let q = quotas(None, Some(60));
        let a = of(Some(Principal([1; 32])));
        q.admit(&a).unwrap().charge(Duration::from_secs(61));
        let refused = q.admit(&a).unwrap_err();
        assert_eq!(refused.quota, "cpu_seconds_per_minute");
        let wait = refused.retry_after.unwrap();
        assert!(
            wait > Duration::from_millis(900) && wait < Duration::from_millis(1100),
            "{wait:?}"
        );
        // Without authentication everyone shares one bucket; another principal has its own.
        let _b = q.admit(&of(Some(Principal([2; 32])))).unwrap();
    }

    #[test]
    fn idle_principals_are_forgotten_and_tasks_are_capped() {
        let q = quotas(Some(1), Some(60));
        for i in 0..100u8 {
            q.admit(&of(Some(Principal([i; 32]))))
                .unwrap()
                .charge(Duration::ZERO);
        }
        assert!(q.usage.lock().unwrap().is_empty());
        let anyone = Caller::default();
        assert!(q.admit_task(&anyone, 1).is_ok());
        assert_eq!(q.admit_task(&anyone, 2).unwrap_err().quota, "max_tasks");
        assert!(
            Quotas::new(QuotaSettings::default())
                .admit_task(&Caller::default(), 1000)
                .is_ok()
        );
    }
}
