//! Bytes that every sandbox gets as its own ArrayBuffer without copying them: the standard library
//! zip and the package layer, a few MiB that a sandbox mostly only reads. The sealed file is also
//! what the pre-imported snapshot's memory is mapped from (`SealedFile::map_over`, used by
//! `prepared/memory_image.rs`).
//!
//! On Linux the bytes go once into an in-memory file (memfd) sealed against any change, and each
//! sandbox maps it `MAP_PRIVATE`: its pages are shared with every other sandbox until this one writes
//! to one, and then the kernel copies that page for it alone. Nothing a sandbox does can reach another
//! sandbox or the engine's copy. Elsewhere, or where the kernel refuses, each sandbox gets a copy.
//!
//! A mapping's backing store tells V8 it frees nothing ([`Mapping::backing_store`]): bytes a sandbox
//! holds for its whole life, or that every sandbox shares, are no reason for its garbage collector to
//! run, and V8 would otherwise count them as the isolate's external memory (with the engine's memory
//! snapshot, two full collections per pre-imported sandbox; docs/performance-log.md). The mapping is
//! unmapped by its owner instead, which outlives the isolates holding it.

use std::sync::Arc;

use deno_core::v8;

use crate::sandbox::memory::MemoryBudget;

pub(crate) struct CowBytes {
    source: Source,
}

enum Source {
    /// The sealed in-memory file, the only copy this keeps.
    #[cfg(target_os = "linux")]
    Sealed(memfd::SealedFile),
    /// Where there is no such file.
    Owned(Box<[u8]>),
}

impl CowBytes {
    pub fn new(bytes: &[u8]) -> Self {
        #[cfg(target_os = "linux")]
        if !bytes.is_empty() {
            match memfd::SealedFile::new(bytes) {
                Ok(file) => {
                    return Self {
                        source: Source::Sealed(file),
                    };
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "cannot share read-mostly bytes copy-on-write; sandboxes copy them"
                ),
            }
        }
        Self {
            source: Source::Owned(bytes.into()),
        }
    }

    /// A new ArrayBuffer of the calling isolate holding these bytes, which the isolate may write to:
    /// a mapping if `map` and the system allows, else a copy charged to `budget`.
    pub fn array_buffer<'s>(
        &self,
        scope: &v8::PinScope<'s, '_>,
        map: bool,
        budget: &Arc<MemoryBudget>,
    ) -> Result<v8::Local<'s, v8::ArrayBuffer>, deno_error::JsErrorBox> {
        let copy = match &self.source {
            #[cfg(target_os = "linux")]
            Source::Sealed(file) => {
                if map && let Some(mapping) = file.map_private() {
                    // SAFETY: the budget keeps the mapping until the isolate is disposed.
                    let store = unsafe { mapping.backing_store() };
                    budget.keep_until_disposed(Box::new(mapping));
                    return Ok(v8::ArrayBuffer::with_backing_store(
                        scope,
                        &store.make_shared(),
                    ));
                }
                file.read_all().map_err(|e| {
                    deno_error::JsErrorBox::generic(format!("reading shared bytes: {e}"))
                })?
            }
            Source::Owned(bytes) => bytes.to_vec(),
        };
        budget.array_buffer(scope, copy)
    }

    /// A copy of `len` bytes from `offset`.
    pub fn read(&self, offset: usize, len: usize) -> std::io::Result<Vec<u8>> {
        let out_of_range = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        match &self.source {
            #[cfg(target_os = "linux")]
            Source::Sealed(file) => file.read_at(offset, len),
            Source::Owned(bytes) => offset
                .checked_add(len)
                .and_then(|end| bytes.get(offset..end))
                .map(<[u8]>::to_vec)
                .ok_or_else(out_of_range),
        }
    }
}

/// A private mapping of `len` bytes of this process, unmapped when dropped: of the file `fd` from its
/// start (copy-on-write), or without one anonymous zero pages that the kernel supplies only when
/// touched.
pub(crate) struct Mapping {
    data: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: a mapping is plain memory owned by this value; who writes to it is up to its users (the
// engine before it shares a snapshot, one isolate for a sandbox's own mapping).
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` yields only the address and the length; the bytes are written only by the
// users named above, never by two threads at once.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new mapping, or `None` when the kernel refuses (or elsewhere than on Linux).
    pub fn new(fd: Option<i32>, len: usize) -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            let (flags, fd) = match fd {
                Some(fd) => (libc::MAP_PRIVATE, fd),
                None => (
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                ),
            };
            if len == 0 {
                return None;
            }
            // SAFETY: a new mapping at an address the kernel picks, of `len` bytes of a file we were
            // given (or none); the result is checked.
            let data = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    fd,
                    0,
                )
            };
            (data != libc::MAP_FAILED).then_some(Self { data, len })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (fd, len);
            None
        }
    }

    /// A backing store over the mapping that V8 counts as no memory of the isolate's: its deleter is
    /// V8's empty one, and the mapping is unmapped when this value is dropped.
    ///
    /// # Safety
    /// This value must outlive every isolate that holds the store (or an ArrayBuffer over it).
    #[cfg(target_os = "linux")]
    pub unsafe fn backing_store(&self) -> v8::UniqueRef<v8::BackingStore> {
        // SAFETY: the whole mapping; the caller's promise is passed on.
        unsafe { store_over(self.data.cast(), self.len) }
    }

    /// As [`Mapping::backing_store`], over the `len` bytes from `start` only; `None` if they are not
    /// all in the mapping.
    ///
    /// # Safety
    /// As for [`Mapping::backing_store`].
    #[cfg(target_os = "linux")]
    pub unsafe fn backing_store_of(
        &self,
        start: usize,
        len: usize,
    ) -> Option<v8::UniqueRef<v8::BackingStore>> {
        if start.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: `start..start + len` lies in the mapping; the caller's promise is passed on.
        Some(unsafe { store_over(self.data.cast::<u8>().add(start), len) })
    }
}

/// A backing store over `len` bytes at `data` with V8's empty deleter.
///
/// # Safety
/// `data..data + len` must stay readable and writable for as long as any isolate holds the store.
#[cfg(target_os = "linux")]
unsafe fn store_over(data: *mut u8, len: usize) -> v8::UniqueRef<v8::BackingStore> {
    // SAFETY: the caller's promise; V8 frees nothing through the empty deleter.
    unsafe {
        v8::ArrayBuffer::new_backing_store_from_ptr(
            data.cast(),
            len,
            v8_empty_deleter,
            std::ptr::null_mut(),
        )
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.data, self.len);
        }
    }
}

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// `v8::BackingStore::EmptyDeleter`, part of V8's API (v8-array-buffer.h) but not bound by the
    /// `v8` crate. V8 recognises this very function: a store with it frees nothing, so V8 does not
    /// count it as the isolate's external memory.
    #[link_name = "_ZN2v812BackingStore12EmptyDeleterEPvmS1_"]
    fn v8_empty_deleter(
        data: *mut std::ffi::c_void,
        len: usize,
        deleter_data: *mut std::ffi::c_void,
    );
}

#[cfg(target_os = "linux")]
pub(crate) use memfd::SealedFile;

#[cfg(target_os = "linux")]
mod memfd {
    use std::fs::File;
    use std::io::Write as _;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::FileExt;

    /// An in-memory file sealed against any change: no one, this process included, can write to
    /// it, grow it or shrink it.
    pub(crate) struct SealedFile {
        file: File,
        len: usize,
    }

    impl SealedFile {
        pub fn new(bytes: &[u8]) -> std::io::Result<Self> {
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

        fn seal(file: File, len: usize) -> std::io::Result<Self> {
            let seals =
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
            // SAFETY: fcntl on a descriptor we own; the result is checked.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Whether this system lets us map it is found out now, not in a sandbox.
            super::Mapping::new(Some(file.as_raw_fd()), len)
                .ok_or_else(std::io::Error::last_os_error)?;
            Ok(Self { file, len })
        }

        /// Maps the file's `len` bytes from `offset` privately (copy-on-write) over the `len` bytes
        /// at `target`, in place of what was there.
        ///
        /// # Safety
        /// `target..target + len` must be readable and writable memory of this process that nothing
        /// else owns (no Rust reference reads or writes it meanwhile), and `target`, `offset` and
        /// `len` whole pages.
        pub unsafe fn map_over(
            &self,
            offset: usize,
            target: *mut u8,
            len: usize,
        ) -> std::io::Result<()> {
            if offset.checked_add(len).is_none_or(|end| end > self.len) {
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
            }
            // SAFETY: the caller vouches for the target range; MAP_FIXED replaces its pages with
            // the file's, readable and writable as before. The result is checked.
            let mapped = unsafe {
                libc::mmap(
                    target.cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    self.file.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if mapped == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }

        /// A copy of the file's bytes.
        pub fn read_all(&self) -> std::io::Result<Vec<u8>> {
            self.read_at(0, self.len)
        }

        /// A copy of `len` of the file's bytes from `offset`.
        pub fn read_at(&self, offset: usize, len: usize) -> std::io::Result<Vec<u8>> {
            let mut bytes = vec![0; len];
            self.file.read_exact_at(&mut bytes, offset as u64)?;
            Ok(bytes)
        }

        /// A new private (copy-on-write) mapping of the file.
        pub fn map_private(&self) -> Option<super::Mapping> {
            super::Mapping::new(Some(self.file.as_raw_fd()), self.len)
        }
    }

    /// A new in-memory file, which can be sealed.
    fn create() -> std::io::Result<File> {
        // SAFETY: a C string literal and flags; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"code-interpreter-mcp".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}
