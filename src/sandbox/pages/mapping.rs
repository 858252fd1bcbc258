//! Mappings this process makes and owns, the sealed in-memory file that sandboxes map copy-on-write,
//! and the calls made on memory in place (a file mapped over it, advice about its pages).
//!
//! A [`Mapping`] owns its address range: it is unmapped when the value is dropped, and its bytes
//! are reachable only through it. A [`SealedFile`] is an in-memory file (memfd) sealed against any
//! change, so a private mapping of it shares its pages with every other mapping of it until one
//! writes a page, and then the kernel copies that page for that mapping alone. The in-place calls
//! take the memory as `&mut [u8]`: a borrow that nothing else reads or writes meanwhile, readable
//! and writable, which is all that replacing its pages with a file's, or advising about them, needs.

use std::ffi::c_void;
use std::ops::Range;

use super::PAGE;

/// A private read-write mapping of `len` bytes of this process, unmapped when dropped: anonymous
/// zero pages the kernel supplies only when touched, or a sealed file's pages, copied on write.
pub(crate) struct Mapping {
    data: *mut c_void,
    len: usize,
}

// SAFETY: a mapping is plain memory owned by this value; who writes to it is up to its users (the
// engine before it shares a snapshot, one isolate for a sandbox's own mapping).
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` yields only the address, the length and shared bytes; the bytes are written
// only through `&mut Mapping` or by the users named above, never by two threads at once.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes of anonymous zero pages, reserving no swap; `None` when the kernel refuses (or
    /// elsewhere than on Linux).
    pub fn anonymous(len: usize) -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous};
            if len == 0 {
                return None;
            }
            // SAFETY: a new mapping at an address the kernel picks; nothing refers to it yet.
            let data = unsafe {
                mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE | MapFlags::NORESERVE,
                )
            }
            .ok()?;
            Some(Self { data, len })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            None
        }
    }

    /// The first address of the mapping (for a V8 backing store over it: `cow.rs`).
    pub fn as_ptr(&self) -> *mut u8 {
        self.data.cast()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The mapping's bytes, written by no one else while borrowed.
    #[cfg(test)]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the whole mapping, readable and writable, owned by this value; the exclusive
        // borrow of the value is the exclusive borrow of the bytes (a backing store made over them
        // promised not to outlive or alias it: `cow::backing_store`).
        unsafe { std::slice::from_raw_parts_mut(self.data.cast(), self.len) }
    }

    /// The mapping as bytes that live until [`Mapping::from_leaked`] takes them back.
    #[cfg(test)]
    pub(super) fn leak(self) -> &'static mut [u8] {
        let bytes = std::mem::ManuallyDrop::new(self).bytes_mut_raw();
        // SAFETY: the mapping is no longer owned by a value that would unmap it.
        unsafe { &mut *bytes }
    }

    #[cfg(test)]
    fn bytes_mut_raw(&self) -> *mut [u8] {
        std::ptr::slice_from_raw_parts_mut(self.data.cast(), self.len)
    }

    /// Takes back bytes [`Mapping::leak`] gave out, to unmap them when dropped.
    ///
    /// # Safety
    /// `bytes` must come from `leak` and not be used after this.
    #[cfg(test)]
    pub(super) unsafe fn from_leaked(bytes: &mut [u8]) -> Self {
        Self {
            data: bytes.as_mut_ptr().cast(),
            len: bytes.len(),
        }
    }

    /// The mapping's address range.
    pub fn range(&self) -> Range<usize> {
        self.data as usize..self.data as usize + self.len
    }

    /// A new inaccessible mapping of `len` bytes whose address is `like`'s modulo `align` (so that
    /// pages moved into it keep their offset within a huge page).
    #[cfg(target_os = "linux")]
    pub(super) fn reserve_like(like: usize, len: usize, align: usize) -> Option<Self> {
        use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous, munmap};
        // SAFETY: a fresh private anonymous mapping the kernel places; only its own slack, on
        // either side of the part kept, is unmapped below.
        unsafe {
            let p = mmap_anonymous(
                std::ptr::null_mut(),
                len + align,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
            .ok()?;
            let base = p as usize;
            let start = base + (like.wrapping_sub(base) % align);
            if start > base {
                let _ = munmap(p, start - base);
            }
            let end = start + len;
            if base + len + align > end {
                let _ = munmap(end as *mut c_void, base + len + align - end);
            }
            Some(Self {
                data: start as *mut c_void,
                len,
            })
        }
    }

    /// Gives up the address range without unmapping it: what is mapped there now belongs to
    /// whatever the pages were moved to.
    #[cfg(target_os = "linux")]
    pub(super) fn into_moved(self) {
        std::mem::forget(self);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping this value owns, unmapped once; nothing refers to it any more.
        unsafe {
            let _ = rustix::mm::munmap(self.data, self.len);
        }
    }
}

/// Faults the pages `pages` (byte offsets, page-aligned) of `memory` in as written, copying them
/// now rather than at their first write (a private file mapping's pages; `MADV_POPULATE_WRITE`,
/// Linux 5.14). No byte changes. Whether the kernel did it.
#[cfg(target_os = "linux")]
pub(crate) fn populate_written(memory: &mut [u8], pages: Range<usize>) -> bool {
    let Some(part) = memory.get_mut(pages) else {
        return false;
    };
    // SAFETY: pages of memory the caller holds exclusively; the advice only faults them in as
    // written, which changes no byte.
    unsafe {
        rustix::mm::madvise(
            part.as_mut_ptr().cast(),
            part.len(),
            rustix::mm::Advice::LinuxPopulateWrite,
        )
    }
    .is_ok()
}

/// Asks the kernel to back the memory at `range` (addresses) with transparent huge pages where it
/// can (`MADV_HUGEPAGE`, on the whole pages inside it).
pub(crate) fn advise_huge_pages(range: Range<usize>) {
    #[cfg(target_os = "linux")]
    {
        let start = range.start.next_multiple_of(PAGE);
        let end = range.end - range.end % PAGE;
        if end <= start {
            return;
        }
        // SAFETY: MADV_HUGEPAGE only marks the mappings in the range as fit for huge pages: it
        // changes no byte and no protection, and dereferences nothing (on a range that is not all
        // mapped it fails with ENOMEM, which is ignored, as where the kernel has no THP).
        unsafe {
            let _ = rustix::mm::madvise(
                start as *mut c_void,
                end - start,
                rustix::mm::Advice::LinuxHugepage,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = range;
}

/// An in-memory file sealed against any change: no one, this process included, can write to it,
/// grow it or shrink it.
#[cfg(target_os = "linux")]
pub(crate) struct SealedFile {
    file: std::fs::File,
    len: usize,
}

#[cfg(target_os = "linux")]
impl SealedFile {
    pub fn new(bytes: &[u8]) -> std::io::Result<Self> {
        use std::io::Write as _;
        let mut file = create()?;
        file.write_all(bytes)?;
        Self::seal(file, bytes.len())
    }

    /// A file of `len` bytes holding each of `parts` (an offset and the bytes there) and zeros
    /// elsewhere: holes, which take no memory until something reads them.
    pub fn sparse<'a>(
        len: usize,
        parts: impl IntoIterator<Item = (usize, &'a [u8])>,
    ) -> std::io::Result<Self> {
        use std::os::unix::fs::FileExt;
        let file = create()?;
        file.set_len(len as u64)?;
        for (offset, bytes) in parts {
            if offset.checked_add(bytes.len()).is_none_or(|end| end > len) {
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
            }
            file.write_all_at(bytes, offset as u64)?;
        }
        Self::seal(file, len)
    }

    fn seal(file: std::fs::File, len: usize) -> std::io::Result<Self> {
        use rustix::fs::SealFlags;
        rustix::fs::fcntl_add_seals(
            &file,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
        )?;
        let sealed = Self { file, len };
        // Whether this system lets us map it is found out now, not in a sandbox.
        sealed
            .map_private()
            .ok_or_else(std::io::Error::last_os_error)?;
        Ok(sealed)
    }

    /// Maps the file's `target.len()` bytes from `offset` privately (copy-on-write) over `target`,
    /// in place of what was there: every byte of `target` then reads as the file's. `target` and
    /// `offset` must be whole pages.
    pub fn map_over(&self, offset: usize, target: &mut [u8]) -> std::io::Result<()> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        let invalid = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let len = target.len();
        if offset.checked_add(len).is_none_or(|end| end > self.len)
            || !offset.is_multiple_of(PAGE)
            || !len.is_multiple_of(PAGE)
            || !(target.as_ptr() as usize).is_multiple_of(PAGE)
        {
            return Err(invalid());
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: `target` is whole pages of readable and writable memory that the caller holds
        // exclusively; MAP_FIXED replaces exactly those pages with the file's, readable and
        // writable as before, so the borrow stays valid (only its bytes change, as a write would).
        unsafe {
            mmap(
                target.as_mut_ptr().cast(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED,
                &self.file,
                offset as u64,
            )
        }?;
        Ok(())
    }

    /// A copy of the file's bytes.
    pub fn read_all(&self) -> std::io::Result<Vec<u8>> {
        self.read_at(0, self.len)
    }

    /// A copy of `len` of the file's bytes from `offset`.
    pub fn read_at(&self, offset: usize, len: usize) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![0; len];
        self.file.read_exact_at(&mut bytes, offset as u64)?;
        Ok(bytes)
    }

    /// A new private (copy-on-write) mapping of the whole file.
    pub fn map_private(&self) -> Option<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        if self.len == 0 {
            return None;
        }
        // SAFETY: a new mapping at an address the kernel picks, of the file this value owns;
        // nothing refers to it yet.
        let data = unsafe {
            mmap(
                std::ptr::null_mut(),
                self.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
                &self.file,
                0,
            )
        }
        .ok()?;
        Some(Mapping {
            data,
            len: self.len,
        })
    }
}

/// A new in-memory file, which can be sealed.
#[cfg(target_os = "linux")]
fn create() -> std::io::Result<std::fs::File> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create(
        c"code-interpreter-mcp",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    Ok(std::fs::File::from(fd))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_file_maps_copy_on_write_and_refuses_changes() {
        let bytes: Vec<u8> = (0..3 * PAGE).map(|i| (i / PAGE) as u8 + 1).collect();
        let file = SealedFile::new(&bytes).unwrap();
        let mut one = file.map_private().unwrap();
        let two = file.map_private().unwrap();
        one.bytes_mut()[5] = 99;
        assert_eq!(one.bytes_mut()[5], 99);
        // SAFETY: `two` is a live mapping nothing writes.
        let two_bytes = unsafe { std::slice::from_raw_parts(two.as_ptr(), two.len()) };
        assert_eq!(
            two_bytes,
            &bytes[..],
            "another mapping keeps the file's bytes"
        );
        assert_eq!(file.read_all().unwrap(), bytes, "the file is unchanged");
        // The seals: no write, no growth.
        use std::os::unix::fs::FileExt;
        assert!(file.file.write_at(b"x", 0).is_err());
        assert!(file.file.set_len(10 * PAGE as u64).is_err());
    }

    #[test]
    fn a_file_maps_over_whole_pages_only() {
        let bytes = vec![7u8; 2 * PAGE];
        let file = SealedFile::new(&bytes).unwrap();
        let mut memory = Mapping::anonymous(4 * PAGE).unwrap();
        let target = memory.bytes_mut();
        assert!(file.map_over(0, &mut target[1..PAGE + 1]).is_err());
        assert!(file.map_over(1, &mut target[..PAGE]).is_err());
        assert!(
            file.map_over(PAGE, &mut target[..2 * PAGE]).is_err(),
            "past the file"
        );
        file.map_over(PAGE, &mut target[2 * PAGE..3 * PAGE])
            .unwrap();
        assert!(target[2 * PAGE..3 * PAGE].iter().all(|b| *b == 7));
        assert!(target[..2 * PAGE].iter().all(|b| *b == 0));
        assert!(populate_written(target, 2 * PAGE..3 * PAGE));
        target[2 * PAGE] = 1;
        assert_eq!(file.read_at(PAGE, 1).unwrap(), [7]);
    }

    #[test]
    fn a_reservation_keeps_the_offset_within_a_huge_page() {
        let align = 2 * 1024 * 1024;
        for like in [0usize, PAGE, 5 * PAGE, align - PAGE] {
            let reserved = Mapping::reserve_like(like, 3 * PAGE, align).unwrap();
            assert_eq!(reserved.range().start % align, like % align);
        }
    }
}
