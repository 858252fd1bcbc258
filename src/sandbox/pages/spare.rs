//! A pool worker's spare memory: the pages of the last discarded sandbox's restored WebAssembly
//! memory, moved out of it (`mremap`, not copied) when it is dropped and moved into the next
//! sandbox's memory before the snapshot is written over them. Restoring into fresh memory made the
//! kernel clear every page first (`clear_page_erms` under the snapshot copy: ~18 % of a server's CPU
//! serving pandas calls back to back), only for the copy to overwrite it.
//!
//! What a used page held must never reach the next sandbox: the spare replaces exactly the bytes the
//! restore then makes the snapshot's (each page holding data compared with the snapshot's and copied
//! where it differs, each page the snapshot has zeros in cleared where it is not zeros; or, where
//! the kernel recorded the pages written since the spare's own restore from that same snapshot,
//! those pages rewritten: `SharedSnapshot::restore_into`), and a spare of another length is
//! unmapped instead. A range is given up only while the memory it belongs to is alive (its backing
//! store is held by the sandbox's budget until the isolate is disposed), and it stays mapped
//! without its pages (`MREMAP_DONTUNMAP`), so V8 finds memory there to unmap and no other thread's
//! new mapping can land in a hole meanwhile.
//!
//! Only threads that opt in keep a spare ([`keep_on_this_thread`]: the pool's workers, which boot the
//! next sandbox right after dropping one), at most one, and [`release`] gives it back to the system.
//!
//! Where the kernel can record writes (`written.rs`), the restored memory is watched from the
//! end of its restore ([`record_writes`]) and the spare carries the list of pages written since and
//! the snapshot it was restored from: a restore of that same snapshot into it then rewrites only
//! those pages, instead of comparing all ~75 MiB of a pre-imported sandbox's.

use std::cell::{Cell, RefCell};
use std::ops::Range;

#[cfg(target_os = "linux")]
use super::PAGE;
#[cfg(target_os = "linux")]
use super::mapping::Mapping;
#[cfg(target_os = "linux")]
use super::written::Recorder;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    static SPARE: RefCell<Option<Spare>> = const { RefCell::new(None) };
    /// This thread's recorder of writes: not tried yet, or what trying gave.
    #[cfg(target_os = "linux")]
    static RECORDER: RefCell<Option<Option<Recorder>>> = const { RefCell::new(None) };
    /// The restored memories whose writes are being recorded, with their snapshot's number.
    #[cfg(target_os = "linux")]
    static RECORDING: RefCell<Vec<(Range<usize>, u64)>> = const { RefCell::new(Vec::new()) };
}

/// Pages moved out of a dropped sandbox's memory: an anonymous private mapping, unmapped if it is
/// dropped rather than moved into the next sandbox's memory.
struct Spare {
    #[cfg(target_os = "linux")]
    pages: Mapping,
    /// The snapshot they were restored from and the byte ranges written since, if recorded.
    #[cfg(target_os = "linux")]
    written: Option<(u64, Vec<Range<usize>>)>,
}

/// A spare moved into a new sandbox's memory (see [`take_into`]).
pub(crate) struct Reused {
    /// The byte ranges written since the pages were restored from the snapshot being restored now,
    /// if they were and the kernel recorded them (otherwise any page may differ from it).
    pub(crate) written: Option<Vec<Range<usize>>>,
}

/// How many times a sandbox's memory was given a spare, in the process.
static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many sandboxes have restored their snapshot into a dropped sandbox's pages (process-wide).
pub(crate) fn taken() -> u64 {
    TAKEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many of those rewrote only the pages the kernel recorded as written.
static RECORDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many sandboxes have restored their snapshot into a dropped sandbox's pages rewriting only
/// those it wrote (process-wide).
pub(crate) fn taken_recorded() -> u64 {
    RECORDED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this system lets the process record writes to its memory (see `written.rs`).
pub(crate) fn can_record_writes() -> bool {
    #[cfg(target_os = "linux")]
    return Recorder::new().is_some();
    #[cfg(not(target_os = "linux"))]
    return false;
}

/// This thread keeps the restored memory of the sandboxes it drops for the next one it boots.
pub(crate) fn keep_on_this_thread() {
    let _ = ENABLED.try_with(|e| e.set(true));
}

/// Gives this thread's spare memory back to the system.
pub(crate) fn release() {
    drop(take_spare());
}

/// This thread's spare, taken out. (`try_`: callers include drops, which must not panic, even while
/// the thread ends.)
fn take_spare() -> Option<Spare> {
    SPARE
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.take()))
        .ok()
        .flatten()
}

/// Moves the pages of `range` out as this thread's spare (see [`keep`]); not on this platform.
///
/// # Safety
/// As for the Linux version.
#[cfg(not(target_os = "linux"))]
pub(super) unsafe fn keep(_range: Range<usize>) {}

/// Moves this thread's spare over `heap` (see the Linux version); not on this platform.
#[cfg(not(target_os = "linux"))]
pub(crate) fn take_into(_heap: &mut [u8], _snapshot: u64) -> Option<Reused> {
    None
}

/// Records writes to a restored memory (see the Linux version); not on this platform.
///
/// # Safety
/// As for the Linux version.
#[cfg(not(target_os = "linux"))]
pub(super) unsafe fn record_writes(_range: Range<usize>, _snapshot: u64) {}

/// Starts recording the writes to `range`, the memory just restored from snapshot number
/// `snapshot` (its every byte the snapshot's), on a thread that keeps spares and where the kernel
/// can record them; [`keep`] then hands the list to the next sandbox with the pages. A range
/// recorded before that overlaps this one is forgotten (its memory is gone).
///
/// # Safety
/// `range` must be page-aligned private anonymous memory mapped read-write (a WebAssembly memory
/// the caller holds).
#[cfg(target_os = "linux")]
pub(super) unsafe fn record_writes(range: Range<usize>, snapshot: u64) {
    if !ENABLED.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    let _ = RECORDING.try_with(|recording| {
        let Ok(mut recording) = recording.try_borrow_mut() else {
            return;
        };
        recording.retain(|(r, _)| r.end <= range.start || range.end <= r.start);
        let started = RECORDER
            .try_with(|recorder| {
                let Ok(mut recorder) = recorder.try_borrow_mut() else {
                    return false;
                };
                let recorder = recorder.get_or_insert_with(|| {
                    let made = Recorder::new();
                    static SAID: std::sync::Once = std::sync::Once::new();
                    if made.is_none() {
                        SAID.call_once(|| {
                            tracing::info!(
                                "the kernel does not let this process record a sandbox's writes (userfaultfd with asynchronous write-protection, Linux 6.7+); a reused memory is compared page by page (~5 ms more CPU per pre-imported sandbox and call)"
                            );
                        });
                    }
                    made
                });
                // SAFETY: as the caller guarantees.
                recorder
                    .as_ref()
                    .is_some_and(|r| unsafe { r.start(range.clone()) })
            })
            .unwrap_or(false);
        if started {
            recording.push((range, snapshot));
            // A memory whose sandbox never finished booting is never kept (nor its entry taken
            // out): the oldest entries go, so the list stays short (a forgotten memory is only
            // compared page by page).
            if recording.len() > MAX_RECORDING {
                recording.remove(0);
            }
        }
    });
}

/// Stops recording the writes to `range` (its pages are about to be replaced): a memory kept as a
/// spare then carries no list, and its pages are compared in full by the next restore.
#[cfg(target_os = "linux")]
pub(super) fn forget(range: &Range<usize>) {
    let _ = RECORDING.try_with(|recording| {
        if let Ok(mut recording) = recording.try_borrow_mut() {
            recording.retain(|(r, _)| r != range);
        }
    });
}

/// Stops recording the writes to `range` (see the Linux version); not on this platform.
#[cfg(not(target_os = "linux"))]
pub(super) fn forget(_range: &Range<usize>) {}

/// Most restored memories a thread records the writes of at once (a worker holds its stock, at most a
/// few sandboxes).
#[cfg(target_os = "linux")]
const MAX_RECORDING: usize = 16;

/// The snapshot `range` was restored from and the byte ranges written since, if they were recorded
/// (the recording ends).
#[cfg(target_os = "linux")]
fn written_in(range: &Range<usize>) -> Option<(u64, Vec<Range<usize>>)> {
    let snapshot = RECORDING
        .try_with(|recording| {
            let mut recording = recording.try_borrow_mut().ok()?;
            let at = recording.iter().position(|(r, _)| r == range)?;
            Some(recording.swap_remove(at).1)
        })
        .ok()
        .flatten()?;
    let written = RECORDER
        .try_with(|recorder| {
            let recorder = recorder.try_borrow().ok()?;
            recorder.as_ref()?.as_ref()?.written(range.clone())
        })
        .ok()
        .flatten()?;
    Some((snapshot, written))
}

/// Moves the pages of `range` (the restored part of a sandbox's WebAssembly memory, about to be
/// discarded with its isolate) out as this thread's spare, leaving the range mapped without them.
///
/// # Safety
/// `range` must be readable and writable memory of a WebAssembly memory that stays alive until this
/// returns, that nothing reads or writes any more, and that is only unmapped (never read) afterwards.
#[cfg(target_os = "linux")]
pub(super) unsafe fn keep(range: Range<usize>) {
    let enabled = ENABLED.try_with(Cell::get).unwrap_or(false);
    if !enabled || range.is_empty() || !range.start.is_multiple_of(PAGE) {
        return;
    }
    let len = range.end - range.start;
    // Any previous spare goes first: one per thread.
    release();
    // Asked before the pages move (moving them ends their registration with the recorder).
    let written = written_in(&range);
    // A place of our own for the pages, at the same offset within a 2 MiB stretch as the memory (so
    // its transparent huge pages stay whole).
    let Some(place) = Mapping::reserve_like(range.start, len, HUGE_PAGE) else {
        return;
    };
    use rustix::mm::{MremapFlags, mremap_fixed};
    // SAFETY: the caller guarantees `range` is this memory's, unused from now on, and `place` is a
    // mapping of `len` bytes this function owns. mremap moves the memory's pages over `place` (it
    // fails, changing nothing, unless the range is one mapping) and, with MREMAP_DONTUNMAP, leaves
    // the range mapped as it was, without pages (read as zeros), so the memory's owner finds its
    // whole range mapped when it unmaps it. The range is never a hole, not even for a moment:
    // another thread's new mapping could be placed in one, and would then be lost to whatever
    // filled it (what the first version, which mapped fresh memory over the hole, risked).
    let moved = unsafe {
        mremap_fixed(
            range.start as *mut std::ffi::c_void,
            len,
            len,
            MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP,
            place.as_ptr().cast(),
        )
    };
    if moved.is_err() {
        // (Also before Linux 5.7, which has no MREMAP_DONTUNMAP: no spare is kept; `place` is
        // unmapped as it drops.)
        tracing::debug!(len, "a sandbox's memory could not be moved aside");
        return;
    }
    // `place` now holds the pages.
    let spare = Spare {
        pages: place,
        written,
    };
    // Kept unless the thread is ending (then dropped here: unmapped).
    let _ = SPARE.try_with(move |s| {
        if let Ok(mut slot) = s.try_borrow_mut() {
            *slot = Some(spare);
        }
    });
}

/// Moves this thread's spare over the start of `heap` if it is exactly `heap.len()` bytes long (the
/// caller then makes every byte of `heap` the snapshot numbered `snapshot`'s); a spare of another
/// length is unmapped. What was moved in, if anything was: with the pages written since, if they
/// were recorded and restored from that same snapshot (counted in [`taken_recorded`]).
#[cfg(target_os = "linux")]
pub(crate) fn take_into(heap: &mut [u8], snapshot: u64) -> Option<Reused> {
    let spare = take_spare()?;
    let target = heap.as_mut_ptr();
    if spare.pages.len() != heap.len() || !(target as usize).is_multiple_of(PAGE) {
        return None;
    }
    let (pages, theirs) = (spare.pages.range(), heap.as_ptr_range());
    if pages.start < theirs.end as usize && (theirs.start as usize) < pages.end {
        // Cannot happen (the spare is a mapping of its own); never unmap `heap`'s pages.
        std::mem::forget(spare);
        return None;
    }
    // SAFETY: `heap` is memory this thread holds exclusively (a `&mut`) and whose every byte the
    // caller makes the snapshot's next; MREMAP_FIXED replaces its pages with the spare's (the same
    // length, the same protection and kind: anonymous private read-write), leaving `heap`'s
    // address range mapped. On failure nothing changed and the spare is unmapped as it drops.
    let moved = unsafe {
        rustix::mm::mremap_fixed(
            spare.pages.as_ptr().cast(),
            spare.pages.len(),
            heap.len(),
            rustix::mm::MremapFlags::MAYMOVE,
            target.cast(),
        )
    };
    if moved.is_err() {
        return None;
    }
    // The pages now belong to `heap`: the spare's range is no longer mapped.
    let Spare { pages, written } = spare;
    pages.into_moved();
    let written = written
        .filter(|(id, _)| *id == snapshot)
        .map(|(_, written)| written);
    TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if written.is_some() {
        RECORDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Some(Reused { written })
}

#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 * 1024 * 1024;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::sandbox::pages::testing::Memory;

    #[test]
    fn a_dropped_memorys_pages_move_to_the_next_of_the_same_length_only_and_leave_it_mapped() {
        std::thread::spawn(|| {
            let pages = 16;
            let old = Memory::new(pages);
            let range = old.0.as_ptr() as usize..old.0.as_ptr() as usize + pages * PAGE;
            old.0.fill(7);
            // Not kept on a thread that did not opt in.
            // SAFETY: `old` is a live mapping nothing else uses.
            unsafe { keep(range.clone()) };
            assert!(take_into(Memory::new(pages).0, 1).is_none());
            assert!(old.0.iter().all(|b| *b == 7));

            keep_on_this_thread();
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            // The old range is still mapped, without pages.
            assert!(old.0.iter().all(|b| *b == 0));
            // A memory of another length does not get the pages (and the spare is gone).
            assert!(take_into(Memory::new(pages + 1).0, 1).is_none());
            assert!(take_into(Memory::new(pages).0, 1).is_none());

            old.0.fill(9);
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let next = Memory::new(pages);
            assert!(take_into(next.0, 1).is_some());
            assert!(
                next.0.iter().all(|b| *b == 9),
                "the pages moved, not copied"
            );
            // The old range stayed mapped, apart from them.
            assert!(old.0.iter().all(|b| *b == 0));
            old.0.fill(1);
            assert!(next.0.iter().all(|b| *b == 9));
            assert!(
                take_into(Memory::new(pages).0, 1).is_none(),
                "a spare is taken once"
            );

            old.0.fill(3);
            // SAFETY: as above.
            unsafe { keep(range) };
            release();
            assert!(take_into(Memory::new(pages).0, 1).is_none());
        })
        .join()
        .unwrap();
    }

    /// Workers dropping and restoring memories at once while another thread maps and unmaps
    /// memory of its own: every moved page arrives whole, every given-up range stays mapped and
    /// reads zeros, and nothing the other thread mapped is ever replaced. This is the test that
    /// found c4e9fca's race (a range left as a hole for a moment, which the other thread's new
    /// mapping could take and the refill then replaced) within seconds with the old `keep`, where
    /// 100 runs of the unit tests side by side found it in 1 to 21.
    #[test]
    fn workers_keep_and_take_spares_while_another_thread_maps_memory() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::time::{Duration, Instant};
        let seconds: u64 = std::env::var("SPARE_MEMORY_STRESS_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let other = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut checked = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let mut held: Vec<Memory> = (1..=8).map(Memory::new).collect();
                    for (i, memory) in held.iter_mut().enumerate() {
                        memory.0.fill(0xA0 + i as u8);
                    }
                    std::thread::yield_now();
                    for (i, memory) in held.iter().enumerate() {
                        assert!(
                            memory.0.iter().all(|b| *b == 0xA0 + i as u8),
                            "another thread's mapping was replaced"
                        );
                        checked += 1;
                    }
                }
                checked
            })
        };
        let workers: Vec<_> = (0..4u8)
            .map(|worker| {
                let (stop, rounds) = (stop.clone(), rounds.clone());
                std::thread::spawn(move || {
                    keep_on_this_thread();
                    let pages = 8 + worker as usize;
                    let mut current = Memory::new(pages);
                    let mut round = 0u8;
                    while !stop.load(Ordering::Relaxed) {
                        round = round.wrapping_add(1);
                        let mark = worker.wrapping_mul(61).wrapping_add(round) | 1;
                        current.0.fill(mark);
                        let range =
                            current.0.as_ptr() as usize..current.0.as_ptr() as usize + pages * PAGE;
                        // SAFETY: `current` is a live private anonymous mapping this thread alone
                        // uses, and only unmapped (on drop) after this.
                        unsafe { keep(range) };
                        assert!(
                            current.0.iter().all(|b| *b == 0),
                            "a given-up range reads zeros"
                        );
                        let next = Memory::new(pages);
                        assert!(take_into(next.0, 1).is_some(), "the spare moves in");
                        assert!(
                            next.0.iter().all(|b| *b == mark),
                            "every page arrives whole"
                        );
                        current = next;
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                    release();
                })
            })
            .collect();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(seconds) {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().expect("a worker's memory stayed whole");
        }
        let checked = other
            .join()
            .expect("the other thread's memory stayed whole");
        let rounds = rounds.load(Ordering::Relaxed);
        assert!(rounds > 100, "{rounds} rounds");
        println!("{rounds} spares kept and taken, {checked} other mappings checked");
    }

    #[test]
    fn a_spare_carries_the_pages_written_since_its_restore_and_for_that_snapshot_only() {
        std::thread::spawn(|| {
            if super::super::written::Recorder::new().is_none() {
                eprintln!("userfaultfd with asynchronous write-protection is unavailable here");
                return;
            }
            keep_on_this_thread();
            let pages = 16;
            let old = Memory::new(pages);
            let range = old.0.as_ptr() as usize..old.0.as_ptr() as usize + pages * PAGE;
            old.0.fill(7);
            // SAFETY: `old` is a live private anonymous mapping nothing else uses.
            unsafe { record_writes(range.clone(), 42) };
            old.0[2 * PAGE + 1] = 8;
            old.0[9 * PAGE] = 8;
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let next = Memory::new(pages);
            let reused = take_into(next.0, 42).expect("the spare");
            assert_eq!(
                reused.written.as_deref(),
                Some(&[2 * PAGE..3 * PAGE, 9 * PAGE..10 * PAGE][..])
            );

            // Restored for another snapshot: the list is not given.
            // SAFETY: as above.
            unsafe { record_writes(range.clone(), 42) };
            old.0[2 * PAGE] = 8;
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let reused = take_into(Memory::new(pages).0, 43).expect("the spare");
            assert_eq!(reused.written, None, "another snapshot");

            // At most MAX_RECORDING memories are recorded at once: the oldest is forgotten.
            // SAFETY: as above.
            unsafe { record_writes(range.clone(), 42) };
            let others: Vec<Memory> = (0..MAX_RECORDING).map(|_| Memory::new(1)).collect();
            for other in &others {
                let start = other.0.as_ptr() as usize;
                // SAFETY: as above.
                unsafe { record_writes(start..start + PAGE, 42) };
            }
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let reused = take_into(Memory::new(pages).0, 42).expect("the spare");
            assert_eq!(reused.written, None);

            // Forgotten (its pages were to be replaced): no list either.
            // SAFETY: as above.
            unsafe { record_writes(range.clone(), 42) };
            forget(&range);
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let reused = take_into(Memory::new(pages).0, 42).expect("the spare");
            assert_eq!(reused.written, None, "forgotten");

            // Not recorded (another range was): any page may have been written.
            let other = Memory::new(pages);
            let other_start = other.0.as_ptr() as usize;
            // SAFETY: as above.
            unsafe { record_writes(other_start..other_start + pages * PAGE, 42) };
            old.0.fill(3);
            // SAFETY: as above.
            unsafe { keep(range) };
            let reused = take_into(Memory::new(pages).0, 42).expect("the spare");
            assert_eq!(reused.written, None);
        })
        .join()
        .unwrap();
    }
}
