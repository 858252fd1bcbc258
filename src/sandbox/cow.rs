//! Bytes that every sandbox gets as its own ArrayBuffer without copying them: the standard library
//! zip and the package layer, a few MiB that a sandbox mostly only reads. The sealed file is also
//! what the pre-imported snapshot's memory is mapped from (`SealedFile::map_over`, used by
//! `pages/mapped_image.rs`).
//!
//! On Linux the bytes go once into an in-memory file (memfd) sealed against any change, and each
//! sandbox maps it `MAP_PRIVATE`: its pages are shared with every other sandbox until this one writes
//! to one, and then the kernel copies that page for it alone. Nothing a sandbox does can reach another
//! sandbox or the engine's copy. Elsewhere, or where the kernel refuses, each sandbox gets a copy.
//! The file and the mappings are the memory wing's (`pages/mapping.rs`); this module makes them
//! ArrayBuffers.
//!
//! A mapping's backing store tells V8 it frees nothing ([`backing_store`]): bytes a sandbox
//! holds for its whole life, or that every sandbox shares, are no reason for its garbage collector to
//! run, and V8 would otherwise count them as the isolate's external memory (with the engine's memory
//! snapshot, two full collections per pre-imported sandbox; docs/performance-log.md). The mapping is
//! unmapped by its owner instead, which outlives the isolates holding it.

use std::sync::Arc;

use deno_core::v8;

use crate::sandbox::memory::MemoryBudget;
#[cfg(target_os = "linux")]
use crate::sandbox::pages::{Mapping, SealedFile};

pub(crate) struct CowBytes {
    source: Source,
}

enum Source {
    /// The sealed in-memory file, the only copy this keeps.
    #[cfg(target_os = "linux")]
    Sealed(SealedFile),
    /// Where there is no such file.
    Owned(Box<[u8]>),
}

impl CowBytes {
    pub fn new(bytes: &[u8]) -> Self {
        #[cfg(target_os = "linux")]
        if !bytes.is_empty() {
            match SealedFile::new(bytes) {
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
                    let store = unsafe { backing_store(&mapping) };
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

/// A backing store over the whole of `mapping` that V8 counts as no memory of the isolate's: its
/// deleter is V8's empty one, and the mapping is unmapped when its owner drops it.
///
/// # Safety
/// `mapping` must outlive every isolate that holds the store (or an ArrayBuffer over it), and no
/// Rust reference to its bytes may be used while an isolate does.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn backing_store(mapping: &Mapping) -> v8::UniqueRef<v8::BackingStore> {
    // SAFETY: the whole mapping; the caller's promise is passed on.
    unsafe { store_over(mapping.as_ptr(), mapping.len()) }
}

/// As [`backing_store`], over the `len` bytes from `start` only; `None` if they are not all in the
/// mapping.
///
/// # Safety
/// As for [`backing_store`].
#[cfg(target_os = "linux")]
pub(crate) unsafe fn backing_store_of(
    mapping: &Mapping,
    start: usize,
    len: usize,
) -> Option<v8::UniqueRef<v8::BackingStore>> {
    if start.checked_add(len)? > mapping.len() {
        return None;
    }
    // SAFETY: `start..start + len` lies in the mapping; the caller's promise is passed on.
    Some(unsafe { store_over(mapping.as_ptr().add(start), len) })
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
