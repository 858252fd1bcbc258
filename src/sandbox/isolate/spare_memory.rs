//! A pool worker's spare memory: the pages of the last discarded sandbox's restored WebAssembly
//! memory, moved out of it (`mremap`, not copied) when it is dropped and moved into the next
//! sandbox's memory before the snapshot is written over them. Restoring into fresh memory made the
//! kernel clear every page first (`clear_page_erms` under the snapshot copy: ~18 % of a server's CPU
//! serving pandas calls back to back), only for the copy to overwrite it.
//!
//! What a used page held must never reach the next sandbox: the spare replaces exactly the bytes the
//! restore then makes the snapshot's (each page holding data compared with the snapshot's and copied
//! where it differs, each page the snapshot has zeros in cleared where it is not zeros:
//! `SharedSnapshot::restore_into`), and a spare of another length is unmapped instead. A range is
//! given up only while the memory it belongs to is alive (its backing store is held by the sandbox's
//! budget until the isolate is disposed), and the hole it leaves is mapped again at once, so V8
//! finds memory there to unmap.
//!
//! Only threads that opt in keep a spare ([`keep_on_this_thread`]: the pool's workers, which boot the
//! next sandbox right after dropping one), at most one, and [`release`] gives it back to the system.

use std::cell::{Cell, RefCell};
use std::ops::Range;

#[cfg(target_os = "linux")]
use crate::sandbox::engine::memory_image::PAGE;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    static SPARE: RefCell<Option<Spare>> = const { RefCell::new(None) };
}

/// Pages moved out of a dropped sandbox's memory: an anonymous private mapping of `len` bytes.
struct Spare {
    addr: usize,
    len: usize,
}

impl Drop for Spare {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `keep` for this `Spare` alone and nothing refers to it.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// How many times a sandbox's memory was given a spare, in the process.
static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many sandboxes have restored their snapshot into a dropped sandbox's pages (process-wide).
pub(crate) fn taken() -> u64 {
    TAKEN.load(std::sync::atomic::Ordering::Relaxed)
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
pub(crate) unsafe fn keep(_range: Range<usize>) {}

/// Moves this thread's spare over `heap` (see the Linux version); not on this platform.
#[cfg(not(target_os = "linux"))]
pub(crate) fn take_into(_heap: &mut [u8]) -> bool {
    false
}

/// Moves the pages of `range` (the restored part of a sandbox's WebAssembly memory, about to be
/// discarded with its isolate) out as this thread's spare, and maps fresh memory in their place.
///
/// # Safety
/// `range` must be readable and writable memory of a WebAssembly memory that stays alive until this
/// returns, that nothing reads or writes any more, and that is only unmapped (never read) afterwards.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn keep(range: Range<usize>) {
    let enabled = ENABLED.try_with(Cell::get).unwrap_or(false);
    if !enabled || range.is_empty() || !range.start.is_multiple_of(PAGE) {
        return;
    }
    let len = range.end - range.start;
    // Any previous spare goes first: one per thread.
    release();
    let old = range.start as *mut libc::c_void;
    // A place of our own for the pages, at the same offset within a 2 MiB stretch as the memory (so
    // its transparent huge pages stay whole): reserved with room to align, the rest given back.
    let Some(place) = reserve_like(range.start, len) else {
        return;
    };
    // SAFETY (for the calls below): the caller guarantees `range` is this memory's, unused from now
    // on, and `place` is a mapping of `len` bytes this function just made. mremap moves the memory's
    // pages over `place` (it fails, changing nothing, unless the range is one mapping); the fresh
    // anonymous mapping then fills the hole, so the memory's owner finds its whole range mapped
    // when it unmaps it.
    unsafe {
        let moved = libc::mremap(
            old,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            place as *mut libc::c_void,
        );
        if moved == libc::MAP_FAILED {
            libc::munmap(place as *mut libc::c_void, len);
            tracing::debug!(len, "a sandbox's memory could not be moved aside");
            return;
        }
        let refill = libc::mmap(
            old,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if refill == libc::MAP_FAILED {
            // Put the pages back rather than leave a hole in the memory.
            let back = libc::mremap(
                moved,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                old,
            );
            if back == libc::MAP_FAILED {
                libc::munmap(moved, len);
            }
            return;
        }
        let spare = Spare {
            addr: moved as usize,
            len,
        };
        // Kept unless the thread is ending (then dropped here: unmapped).
        let _ = SPARE.try_with(move |s| {
            if let Ok(mut slot) = s.try_borrow_mut() {
                *slot = Some(spare);
            }
        });
    }
}

/// A new inaccessible mapping of `len` bytes whose address is `like`'s modulo 2 MiB.
#[cfg(target_os = "linux")]
fn reserve_like(like: usize, len: usize) -> Option<usize> {
    let slack = HUGE_PAGE;
    // SAFETY: a fresh private anonymous mapping the kernel places; only its own parts are unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + slack,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = base + (like.wrapping_sub(base) % slack);
        if start > base {
            libc::munmap(p, start - base);
        }
        let end = start + len;
        if base + len + slack > end {
            libc::munmap(end as *mut libc::c_void, base + len + slack - end);
        }
        Some(start)
    }
}

/// Moves this thread's spare over the start of `heap` if it is exactly `heap.len()` bytes long (the
/// caller then makes every byte of `heap` the snapshot's); a spare of another length is unmapped.
/// Whether it did.
#[cfg(target_os = "linux")]
pub(crate) fn take_into(heap: &mut [u8]) -> bool {
    let Some(spare) = take_spare() else {
        return false;
    };
    let target = heap.as_mut_ptr();
    if spare.len != heap.len() || !(target as usize).is_multiple_of(PAGE) {
        return false;
    }
    if spare.addr < target as usize + heap.len() && (target as usize) < spare.addr + spare.len {
        // Cannot happen (the spare is a mapping of its own); never unmap `heap`'s pages.
        std::mem::forget(spare);
        return false;
    }
    // SAFETY: `heap` is memory this thread holds exclusively (a `&mut`) and whose every byte the
    // caller makes the snapshot's next; MREMAP_FIXED replaces its pages with the spare's (the same length, the
    // same protection and kind: anonymous private read-write), leaving `heap`'s address range
    // mapped. On failure nothing changed and the spare is unmapped.
    let moved = unsafe {
        libc::mremap(
            spare.addr as *mut libc::c_void,
            spare.len,
            spare.len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            target.cast::<libc::c_void>(),
        )
    };
    if moved == libc::MAP_FAILED {
        return false;
    }
    // The pages now belong to `heap`.
    std::mem::forget(spare);
    TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    true
}

#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 * 1024 * 1024;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::sandbox::engine::memory_image::tests::Memory;

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
            assert!(!take_into(Memory::new(pages).0));
            assert!(old.0.iter().all(|b| *b == 7));

            keep_on_this_thread();
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            // The old range is mapped again, fresh.
            assert!(old.0.iter().all(|b| *b == 0));
            // A memory of another length does not get the pages (and the spare is gone).
            assert!(!take_into(Memory::new(pages + 1).0));
            assert!(!take_into(Memory::new(pages).0));

            old.0.fill(9);
            // SAFETY: as above.
            unsafe { keep(range.clone()) };
            let next = Memory::new(pages);
            assert!(take_into(next.0));
            assert!(
                next.0.iter().all(|b| *b == 9),
                "the pages moved, not copied"
            );
            // The old range stayed mapped, apart from them.
            assert!(old.0.iter().all(|b| *b == 0));
            old.0.fill(1);
            assert!(next.0.iter().all(|b| *b == 9));
            assert!(!take_into(Memory::new(pages).0), "a spare is taken once");

            old.0.fill(3);
            // SAFETY: as above.
            unsafe { keep(range) };
            release();
            assert!(!take_into(Memory::new(pages).0));
        })
        .join()
        .unwrap();
    }
}
