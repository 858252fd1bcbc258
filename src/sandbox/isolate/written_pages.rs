//! Which pages of a memory were written since a point in time, as the kernel records them (Linux
//! 6.7 or later): the range is registered with a userfaultfd for *asynchronous* write-protection and
//! every page write-protected; the first write to a page lifts its protection inside the kernel's
//! fault handler (no signal, no thread, no round trip to user space); `PAGEMAP_SCAN` then lists the
//! pages whose protection was lifted. `spare_memory.rs` uses it so that a worker's next sandbox
//! rewrites only the pages the last one wrote instead of comparing all of them.
//!
//! Code in a sandbox cannot hide a write from it: every write to the range, from WebAssembly,
//! JavaScript or a system call, goes through the page tables the kernel keeps the record in, and
//! nothing in a sandbox can reach the userfaultfd or the page map. Where userfaultfd is unavailable
//! (an older kernel, or a seccomp profile that refuses the system call, as containers' default
//! profiles do) nothing is recorded and the caller compares every page instead.

use std::fs::File;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sandbox::prepared::memory_image::PAGE;

// From <linux/userfaultfd.h> and <linux/fs.h> (Linux 6.7), which the libc crate does not carry.
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// Records writes to ranges of this process's memory (see the module doc).
pub(crate) struct Recorder {
    uffd: OwnedFd,
    pagemap: File,
}

impl Recorder {
    /// A recorder, if this system has asynchronous write-protection and lets the process use it.
    pub(crate) fn new() -> Option<Self> {
        // SAFETY: the system call takes flags only and returns a new descriptor (or -1).
        let fd = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
            )
        };
        let fd = libc::c_int::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: `fd` is a descriptor the kernel just gave this process, owned by nothing else.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes the struct passed, which lives across the call.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return None;
        }
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
        let whole = || UffdioRange {
            start: range.start as u64,
            len: (range.end - range.start) as u64,
        };
        let mut register = UffdioRegister {
            range: whole(),
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        let mut protect = UffdioWriteprotect {
            range: whole(),
            mode: UFFDIO_WRITEPROTECT_MODE_WP,
        };
        // SAFETY: both ioctls read (and UFFDIO_REGISTER writes) the struct passed, which lives
        // across the call; they change only the protection of pages the caller vouches for, and an
        // asynchronous write-protection never stops a writer.
        unsafe {
            libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_REGISTER, &mut register) == 0
                && libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut protect) == 0
        }
    }

    /// The pages of `range` written since [`start`](Self::start) was called on it, as byte ranges
    /// from the start of `range`, in order; `None` if the kernel cannot say (then any page may have
    /// been written). `range` must be the range given to `start`.
    pub(crate) fn written(&self, range: Range<usize>) -> Option<Vec<Range<usize>>> {
        let mut written: Vec<Range<usize>> = Vec::new();
        let mut regions = [PageRegion::default(); 256];
        let mut from = range.start as u64;
        while from < range.end as u64 {
            let mut scan = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                // Fails unless the whole range is registered for asynchronous write-protection.
                flags: PM_SCAN_CHECK_WPASYNC,
                start: from,
                end: range.end as u64,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: PAGE_IS_WRITTEN,
                category_anyof_mask: 0,
                return_mask: PAGE_IS_WRITTEN,
            };
            // SAFETY: PAGEMAP_SCAN reads the struct passed and writes at most `vec_len` regions to
            // `vec`, both of which live across the call; it only reads the page tables.
            let found = unsafe { libc::ioctl(self.pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut scan) };
            let found = usize::try_from(found).ok()?;
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
    use crate::sandbox::prepared::memory_image::tests::Memory;

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
