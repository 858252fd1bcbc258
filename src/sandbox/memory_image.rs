//! Copy-on-write restore of the snapshot's linear memory. Pyodide restores a memory snapshot by
//! copying the whole image (tens of MB) into each new sandbox's freshly allocated Wasm memory, which
//! costs one page fault per 4 KiB page plus the copy. On Linux the image is instead written once to
//! a sealed memfd, and each sandbox maps it privately over the start of its Wasm memory, as a forked
//! process shares its parent's pages: pages the sandbox only reads stay shared with the page cache,
//! and the first write to a page gives that sandbox its own copy. No sandbox can ever change the
//! image (the memfd is sealed against writes, and a private mapping never writes back), so isolation
//! is the same as with a copy. Elsewhere, or if the memfd cannot be made, Pyodide's copy is used.

/// Where the linear-memory image starts in a Pyodide snapshot: a little-endian u32 at byte 4 of the
/// header (Pyodide's `makeSnapshot` layout: magic, image offset, metadata length, ...).
fn image_offset(snapshot: &[u8]) -> Option<usize> {
    let offset = u32::from_le_bytes(snapshot.get(4..8)?.try_into().ok()?) as usize;
    (offset <= snapshot.len()).then_some(offset)
}

/// The snapshot's linear-memory image, ready to be mapped into sandboxes.
pub(crate) struct MemoryImage {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    /// Bytes mapped: the image rounded up to whole pages (the padding is zeros, as fresh memory is).
    mapped_len: usize,
    /// Where the image starts in the snapshot (the length of Pyodide's header).
    header_len: usize,
}

impl MemoryImage {
    /// Writes the image of `snapshot` to a sealed memfd. `None` (with a debug log) where that is not
    /// possible: sandboxes then restore by copying.
    pub fn new(snapshot: &[u8]) -> Option<Self> {
        let header_len = image_offset(snapshot)?;
        match Self::create(&snapshot[header_len..], header_len) {
            Ok(image) => Some(image),
            Err(e) => {
                tracing::debug!(error = %e, "memory snapshot: no copy-on-write image, sandboxes copy it");
                None
            }
        }
    }

    /// The length of Pyodide's snapshot header: what `restoreSnapshot` still needs to see once the
    /// image itself is mapped.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    #[cfg(target_os = "linux")]
    fn create(image: &[u8], header_len: usize) -> std::io::Result<Self> {
        use std::io::Write as _;
        use std::os::fd::{FromRawFd as _, OwnedFd};

        let page = page_size();
        let mapped_len = image.len().div_ceil(page) * page;
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"code-interpreter-mcp-snapshot".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a file descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut file = std::fs::File::from(fd);
        file.write_all(image)?;
        file.set_len(mapped_len as u64)?;
        let fd = OwnedFd::from(file);
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own; the result is checked.
        if unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::F_ADD_SEALS,
                seals,
            )
        } < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            mapped_len,
            header_len,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn create(_image: &[u8], _header_len: usize) -> std::io::Result<Self> {
        Err(std::io::Error::other("copy-on-write images need Linux"))
    }

    /// Maps the image privately over the start of `memory` (a sandbox's Wasm memory), replacing those
    /// bytes as Pyodide's copy would. `Ok(false)` when `memory` does not fit (too small or not page-aligned): the caller
    /// copies instead. An error means the memory may be unusable and the sandbox must be dropped.
    #[cfg(target_os = "linux")]
    pub fn map_onto(&self, memory: &mut [u8]) -> std::io::Result<bool> {
        use std::os::fd::AsRawFd as _;

        let start = memory.as_mut_ptr();
        if memory.len() < self.mapped_len || !(start as usize).is_multiple_of(page_size()) {
            return Ok(false);
        }
        // SAFETY: [start, start + mapped_len) lies inside `memory`, which we borrow mutably, so no
        // Rust reference reads it meanwhile; it is V8's readable and writable Wasm memory, and the
        // new mapping keeps exactly those permissions. MAP_FIXED replaces those pages atomically.
        let mapped = unsafe {
            libc::mmap(
                start.cast(),
                self.mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(true)
    }

    #[cfg(not(target_os = "linux"))]
    pub fn map_onto(&self, _memory: &mut [u8]) -> std::io::Result<bool> {
        Ok(false)
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(image: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; 16];
        bytes[4..8].copy_from_slice(&16u32.to_le_bytes());
        bytes.extend_from_slice(image);
        bytes
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_image_reads_like_a_copy_and_writes_stay_private() {
        let image: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let img = MemoryImage::new(&snapshot(&image)).expect("memfd");
        assert_eq!(img.header_len(), 16);
        // Page-aligned anonymous memory standing in for a Wasm memory.
        let len = 64 * 1024;
        // SAFETY: a fresh anonymous mapping, unmapped at the end of the test.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping above is `len` bytes, readable and writable, and only used here.
        let memory = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) };
        assert!(img.map_onto(memory).unwrap());
        assert_eq!(&memory[..image.len()], &image[..]);
        assert!(memory[image.len()..].iter().all(|&b| b == 0));
        memory[0] = 0xff;
        // A second sandbox sees the original bytes.
        let other = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let other_mem = unsafe { std::slice::from_raw_parts_mut(other.cast::<u8>(), len) };
        assert!(img.map_onto(other_mem).unwrap());
        assert_eq!(other_mem[0], image[0]);
        // Too small a memory is refused, not mapped.
        assert!(!img.map_onto(&mut other_mem[..4096]).unwrap());
        unsafe {
            libc::munmap(ptr, len);
            libc::munmap(other, len);
        }
    }

    #[test]
    fn a_truncated_header_gives_no_image() {
        assert!(MemoryImage::new(&[0u8; 6]).is_none());
        let mut bytes = vec![0u8; 16];
        bytes[4..8].copy_from_slice(&100u32.to_le_bytes());
        assert!(MemoryImage::new(&bytes).is_none());
    }
}
