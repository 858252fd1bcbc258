//! Bytes that every sandbox gets as its own ArrayBuffer without copying them: the standard library
//! zip and the package layer, a few MiB that a sandbox mostly only reads.
//!
//! On Linux the bytes go once into an in-memory file (memfd) sealed against any change, and each
//! sandbox maps it `MAP_PRIVATE`: its pages are shared with every other sandbox until this one writes
//! to one, and then the kernel copies that page for it alone. Nothing a sandbox does can reach another
//! sandbox or the engine's copy. Elsewhere, or where the kernel refuses, each sandbox gets a copy.

use std::sync::Arc;

use deno_core::v8;

use crate::sandbox::isolate::memory::MemoryBudget;

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
                if map && let Some(store) = file.map_private() {
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

/// A backing store over a new private mapping of `len` bytes, unmapped when V8 frees it: of the file
/// `fd` from its start (copy-on-write), or without one anonymous zero pages that the kernel supplies
/// only when touched. `None` when the kernel refuses.
#[cfg(target_os = "linux")]
pub(crate) fn private_mapping(
    fd: Option<std::os::fd::RawFd>,
    len: usize,
) -> Option<v8::UniqueRef<v8::BackingStore>> {
    let data = map(fd, len)?;
    // SAFETY: `data` is `len` readable and writable bytes that belong to this backing store alone
    // until V8 calls `unmap` with the same pointer and length.
    Some(unsafe {
        v8::ArrayBuffer::new_backing_store_from_ptr(data, len, unmap, std::ptr::null_mut())
    })
}

#[cfg(target_os = "linux")]
fn map(fd: Option<std::os::fd::RawFd>, len: usize) -> Option<*mut std::ffi::c_void> {
    let (flags, fd) = match fd {
        Some(fd) => (libc::MAP_PRIVATE, fd),
        None => (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        ),
    };
    // SAFETY: a new mapping at an address the kernel picks, of `len` bytes of a file we were given
    // (or none); the result is checked.
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
    (len > 0 && data != libc::MAP_FAILED).then_some(data)
}

#[cfg(target_os = "linux")]
unsafe extern "C" fn unmap(data: *mut std::ffi::c_void, len: usize, _: *mut std::ffi::c_void) {
    // SAFETY: called once, with a mapping made by `map`.
    unsafe {
        libc::munmap(data, len);
    }
}

#[cfg(target_os = "linux")]
mod memfd {
    use std::fs::File;
    use std::io::Write as _;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::FileExt;

    use deno_core::v8;

    pub(super) struct SealedFile {
        file: File,
        len: usize,
    }

    impl SealedFile {
        pub fn new(bytes: &[u8]) -> std::io::Result<Self> {
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
            let mut file = unsafe { File::from_raw_fd(fd) };
            file.write_all(bytes)?;
            let seals =
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
            // SAFETY: fcntl on a descriptor we own; the result is checked.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Whether this system lets us map it is found out now, not in a sandbox.
            let probe = super::map(Some(file.as_raw_fd()), bytes.len())
                .ok_or_else(std::io::Error::last_os_error)?;
            // SAFETY: the mapping just made, of `len` bytes, used by nothing.
            unsafe { super::unmap(probe, bytes.len(), std::ptr::null_mut()) };
            Ok(Self {
                file,
                len: bytes.len(),
            })
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

        /// A backing store over a new private mapping of the file, unmapped when V8 frees it.
        pub fn map_private(&self) -> Option<v8::UniqueRef<v8::BackingStore>> {
            super::private_mapping(Some(self.file.as_raw_fd()), self.len)
        }
    }
}
