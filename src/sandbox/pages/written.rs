//! Which pages of a memory were written since a point in time, as the kernel records them (Linux
//! 6.7 or later): the range is registered with a userfaultfd for *asynchronous* write-protection and
//! every page write-protected; the first write to a page lifts its protection inside the kernel's
//! fault handler (no signal, no thread, no round trip to user space); `PAGEMAP_SCAN` then lists the
//! pages whose protection was lifted. `spare.rs` uses it so that a worker's next sandbox
//! rewrites only the pages the last one wrote instead of comparing all of them.
//!
//! Code in a sandbox cannot hide a write from it: every write to the range, from WebAssembly,
//! JavaScript or a system call, goes through the page tables the kernel keeps the record in, and
//! nothing in a sandbox can reach the userfaultfd or the page map. Where userfaultfd is unavailable
//! (an older kernel, or a seccomp profile that refuses the system call, as containers' default
//! profiles do) nothing is recorded and the caller compares every page instead.

use std::fs::File;
use std::ops::Range;
use std::os::fd::OwnedFd;

use linux_raw_sys::general::{
    PAGE_IS_WRITTEN, PM_SCAN_CHECK_WPASYNC, UFFD_API, UFFD_FEATURE_WP_ASYNC,
    UFFD_FEATURE_WP_UNPOPULATED, UFFD_USER_MODE_ONLY, UFFDIO_REGISTER_MODE_WP, page_region,
    pm_scan_arg, uffdio_api, uffdio_range, uffdio_register, uffdio_writeprotect,
};
use linux_raw_sys::ioctl::{UFFDIO_API, UFFDIO_REGISTER, UFFDIO_WRITEPROTECT};
use rustix::ioctl::{Ioctl, IoctlOutput, Opcode, Updater, opcode};

use super::PAGE;

/// `UFFDIO_WRITEPROTECT_MODE_WP` of <linux/userfaultfd.h>, which linux-raw-sys leaves out (the header
/// writes it as a cast).
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// `PAGEMAP_SCAN` (<linux/fs.h>: `_IOWR('f', 16, struct pm_scan_arg)`), built from its parts.
const PAGEMAP_SCAN: Opcode = opcode::read_write::<pm_scan_arg>(b'f', 16);

/// `PAGEMAP_SCAN` as rustix calls it: the kernel answers with how many regions it wrote.
struct Scan<'a>(&'a mut pm_scan_arg);

// SAFETY: the opcode is PAGEMAP_SCAN's, its argument a `pm_scan_arg` that lives across the call and
// that the kernel reads and updates (`walk_end`); the output is the ioctl's non-negative result.
unsafe impl Ioctl for Scan<'_> {
    type Output = usize;
    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        PAGEMAP_SCAN
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        std::ptr::from_mut(self.0).cast()
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _: *mut std::ffi::c_void,
    ) -> rustix::io::Result<usize> {
        usize::try_from(out).map_err(|_| rustix::io::Errno::INVAL)
    }
}

/// Records writes to ranges of this process's memory (see the module doc).
pub(crate) struct Recorder {
    uffd: OwnedFd,
    pagemap: File,
}

impl Recorder {
    /// A recorder, if this system has asynchronous write-protection and lets the process use it.
    pub(crate) fn new() -> Option<Self> {
        use rustix::mm::{UserfaultfdFlags, userfaultfd};
        let flags = UserfaultfdFlags::CLOEXEC
            | UserfaultfdFlags::NONBLOCK
            | UserfaultfdFlags::from_bits_retain(UFFD_USER_MODE_ONLY);
        // SAFETY: the descriptor is new and owned by this recorder; the faults it could report are
        // never asked for (asynchronous write-protection resolves them in the kernel), so no
        // thread ever waits on it.
        let uffd: OwnedFd = unsafe { userfaultfd(flags) }.ok()?;
        let mut api = uffdio_api {
            api: UFFD_API.into(),
            features: (UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED).into(),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a `uffdio_api`, the type the opcode is made for.
        unsafe { rustix::ioctl::ioctl(&uffd, Updater::<{ UFFDIO_API }, _>::new(&mut api)) }.ok()?;
        let pagemap = File::open("/proc/self/pagemap").ok()?;
        Some(Self { uffd, pagemap })
    }

    /// Starts recording writes to `range`: every page of it write-protected from now on, until a
    /// write lifts it. Whether it could.
    ///
    /// # Safety
    /// `range` must be page-aligned private anonymous memory of this process, mapped read-write.
    pub(crate) unsafe fn start(&self, range: Range<usize>) -> bool {
        if range.is_empty() || !range.start.is_multiple_of(PAGE) || !range.end.is_multiple_of(PAGE)
        {
            return false;
        }
        let whole = || uffdio_range {
            start: range.start as u64,
            len: (range.end - range.start) as u64,
        };
        let mut register = uffdio_register {
            range: whole(),
            mode: UFFDIO_REGISTER_MODE_WP.into(),
            ioctls: 0,
        };
        let mut protect = uffdio_writeprotect {
            range: whole(),
            mode: UFFDIO_WRITEPROTECT_MODE_WP,
        };
        // SAFETY: each ioctl takes the struct its opcode is made for, which lives across the call;
        // they change only the protection of pages the caller vouches for, and an asynchronous
        // write-protection never stops a writer.
        unsafe {
            rustix::ioctl::ioctl(
                &self.uffd,
                Updater::<{ UFFDIO_REGISTER }, _>::new(&mut register),
            )
            .is_ok()
                && rustix::ioctl::ioctl(
                    &self.uffd,
                    Updater::<{ UFFDIO_WRITEPROTECT }, _>::new(&mut protect),
                )
                .is_ok()
        }
    }

    /// The pages of `range` written since [`start`](Self::start) was called on it, as byte ranges
    /// from the start of `range`, in order; `None` if the kernel cannot say (then any page may have
    /// been written). `range` must be the range given to `start`.
    pub(crate) fn written(&self, range: Range<usize>) -> Option<Vec<Range<usize>>> {
        let mut written: Vec<Range<usize>> = Vec::new();
        let mut regions = [page_region {
            start: 0,
            end: 0,
            categories: 0,
        }; 256];
        let mut from = range.start as u64;
        while from < range.end as u64 {
            let mut scan = pm_scan_arg {
                size: std::mem::size_of::<pm_scan_arg>() as u64,
                // Fails unless the whole range is registered for asynchronous write-protection.
                flags: PM_SCAN_CHECK_WPASYNC.into(),
                start: from,
                end: range.end as u64,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: PAGE_IS_WRITTEN.into(),
                category_anyof_mask: 0,
                return_mask: PAGE_IS_WRITTEN.into(),
            };
            // SAFETY: PAGEMAP_SCAN reads the struct passed and writes at most `vec_len` regions to
            // `vec`, both of which live across the call; it only reads the page tables.
            let found = unsafe { rustix::ioctl::ioctl(&self.pagemap, Scan(&mut scan)) }.ok()?;
            for region in regions.get(..found)? {
                let start = usize::try_from(region.start)
                    .ok()?
                    .checked_sub(range.start)?;
                let end = usize::try_from(region.end).ok()?.checked_sub(range.start)?;
                match written.last_mut() {
                    Some(last) if last.end == start => last.end = end,
                    _ => written.push(start..end),
                }
            }
            if scan.walk_end <= from {
                return None;
            }
            from = scan.walk_end;
        }
        Some(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::pages::testing::Memory;

    /// A list of one range.
    fn only(range: Range<usize>) -> Option<Vec<Range<usize>>> {
        Some(std::iter::once(range).collect())
    }

    #[test]
    fn the_pages_written_after_the_start_are_listed_and_no_others() {
        let Some(recorder) = Recorder::new() else {
            eprintln!("userfaultfd with asynchronous write-protection is unavailable here");
            return;
        };
        let pages = 64;
        let memory = Memory::new(pages);
        memory.0.fill(1);
        let start = memory.0.as_ptr() as usize;
        let range = start..start + pages * PAGE;
        // SAFETY: `memory` is a private anonymous read-write mapping of whole pages.
        assert!(unsafe { recorder.start(range.clone()) });
        assert_eq!(recorder.written(range.clone()), Some(vec![]));
        // Two neighbours, one alone, the last; written twice or once, read or not.
        memory.0[3 * PAGE + 5] = 2;
        memory.0[4 * PAGE] = 2;
        memory.0[4 * PAGE + 1] = 3;
        memory.0[20 * PAGE + PAGE - 1] = 2;
        memory.0[(pages - 1) * PAGE] = 2;
        assert!(memory.0[30 * PAGE..31 * PAGE].iter().all(|b| *b == 1));
        assert_eq!(
            recorder.written(range.clone()),
            Some(vec![
                3 * PAGE..5 * PAGE,
                20 * PAGE..21 * PAGE,
                (pages - 1) * PAGE..pages * PAGE,
            ])
        );
        // Starting again forgets them.
        // SAFETY: as above.
        assert!(unsafe { recorder.start(range.clone()) });
        assert_eq!(recorder.written(range.clone()), Some(vec![]));
        memory.0[7 * PAGE] = 9;
        assert_eq!(recorder.written(range), only(7 * PAGE..8 * PAGE));
        // Pages never touched before the start (no page behind them yet) count once written, and
        // only then.
        let fresh = Memory::new(8);
        let fresh_start = fresh.0.as_ptr() as usize;
        let fresh_range = fresh_start..fresh_start + 8 * PAGE;
        // SAFETY: as above.
        assert!(unsafe { recorder.start(fresh_range.clone()) });
        assert_eq!(fresh.0[PAGE], 0);
        fresh.0[5 * PAGE + 9] = 1;
        assert_eq!(recorder.written(fresh_range), only(5 * PAGE..6 * PAGE));
        // A range that was never registered: the kernel cannot say.
        let other = Memory::new(4);
        let other_start = other.0.as_ptr() as usize;
        assert_eq!(recorder.written(other_start..other_start + 4 * PAGE), None);
    }
}
