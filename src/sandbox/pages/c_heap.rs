//! The C heap (glibc's malloc) as sandboxes use it. V8 and the engine allocate through it while a
//! sandbox is made and dropped: tens of MiB at a time, freed again moments later. Left to its
//! defaults, glibc keeps such memory for reuse for good: its thresholds rise with the largest
//! blocks freed (up to 64 MiB kept free at an arena's top), and nothing asks it for the free blocks
//! between used ones. So the engine fixes the thresholds once per process ([`tune`]) and gives free
//! memory back when a pool worker rests ([`release_free`]) and, at most once a second, when a
//! session's sandbox is dropped ([`release_free_now_and_then`]). The measurements are in
//! docs/performance-log.md ("Idle memory"). Without glibc, all three do nothing.

/// An arena's free top above this is returned at once. Fixing it also stops glibc from raising it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 4 * 1024 * 1024;

/// Blocks of this size or more get a mapping of their own (returned when freed): glibc's own
/// largest, where its dynamic threshold settles under sandboxes' allocations anyway.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 * 1024 * 1024;

/// Sets glibc's thresholds, once per process.
pub(crate) fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static TUNED: std::sync::Once = std::sync::Once::new();
        TUNED.call_once(|| {
            // SAFETY: mallopt only sets glibc's malloc parameters; the results are checked.
            let set = unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                    && libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            };
            if !set {
                tracing::warn!("glibc refused the C heap's thresholds; memory may stay held");
            }
        });
    }
}

/// Gives the C heap's free memory back to the system: every arena's free blocks. Takes a few
/// milliseconds, walking every arena under its lock.
pub(crate) fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        LAST_RELEASE.store(now_s(), std::sync::atomic::Ordering::SeqCst);
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim only walks and locks glibc's own arenas; 0 keeps no extra pad.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released != 0,
            us = started.elapsed().as_micros() as u64,
            "gave the C heap's free memory back"
        );
    }
}

/// [`release_free`], unless it ran during this second already. Session threads each allocate in an
/// arena of their own, and a server that spills and resumes sessions all day would grow by their
/// freed pages (1,000 sessions through 8 places: 1,569 MiB RSS without, 1,384 MiB with).
pub(crate) fn release_free_now_and_then() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if LAST_RELEASE.load(std::sync::atomic::Ordering::SeqCst) != now_s() {
        release_free();
    }
}

/// The second of the last [`release_free`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static LAST_RELEASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
