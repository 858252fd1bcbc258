//! The memory wing: every system call the engine makes on memory, and the types that own what they
//! make. It knows no V8, isolate or op (tests/it/layers.rs checks that it imports none, and that no
//! file outside it calls `mmap`, `mremap`, `madvise`, `memfd_create` or an ioctl), builds and tests
//! on its own, and is written on `rustix` and the kernel's own structs and ioctl numbers
//! (`linux-raw-sys`), not on numbers copied from C headers.
//!
//! - [`mapping`]: mappings this process makes and owns ([`Mapping`], unmapped on drop), and the
//!   sealed in-memory file sandboxes map copy-on-write ([`SealedFile`]);
//! - [`mapped_image`]: a memory snapshot's linear memory in such a file, mapped over a sandbox's
//!   memory instead of copied, and its pages given back when the sandbox idles;
//! - [`restored`]: the part of a sandbox's WebAssembly memory a snapshot was restored into
//!   ([`RestoredMemory`], copied or mapped), whose pages go to the next sandbox or back to the
//!   system through safe methods;
//! - [`spare`]: a pool worker's spare memory, the last dropped sandbox's pages moved aside for the
//!   next one (`mremap`, not copied);
//! - [`written`]: which pages of a memory were written since a point in time (userfaultfd's
//!   asynchronous write-protection and `PAGEMAP_SCAN`);
//! - [`pagemap`]: which pages of a range are the process's own (`/proc/self/pagemap`);
//! - [`c_heap`]: the C heap (glibc's malloc) tuned once, and its free memory given back.
//!
//! Outside the wing, `unsafe` is left only where V8 hands over memory it owns: a backing store made
//! over a [`Mapping`] (`cow.rs`), and the one promise a [`RestoredMemory`] is made with (the
//! WebAssembly memory stays mapped while it is held, and is touched by nothing else while one of
//! its methods runs).

pub(crate) mod c_heap;
pub(crate) mod mapped_image;
pub(crate) mod mapping;
pub(crate) mod pagemap;
pub(crate) mod restored;
pub(crate) mod spare;
#[cfg(target_os = "linux")]
mod written;

pub(crate) use mapped_image::MappedImage;
pub(crate) use mapping::Mapping;
#[cfg(target_os = "linux")]
pub(crate) use mapping::SealedFile;
pub(crate) use restored::RestoredMemory;

/// The granularity of mappings and of the page map: one OS page.
pub(crate) const PAGE: usize = 4096;

/// The addresses `bytes` occupy.
pub(crate) fn address_range(bytes: &[u8]) -> std::ops::Range<usize> {
    let range = bytes.as_ptr_range();
    range.start as usize..range.end as usize
}

/// What a system call on memory refused.
#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    #[error("{what}: {source}")]
    System {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl PagesError {
    fn system(what: &'static str, source: impl Into<std::io::Error>) -> Self {
        Self::System {
            what,
            source: source.into(),
        }
    }
}

/// Test helpers: memory standing in for a sandbox's WebAssembly memory.
#[cfg(all(test, target_os = "linux"))]
pub(crate) mod testing {
    use super::{Mapping, PAGE};

    /// A private anonymous read-write mapping of `pages` pages, unmapped when dropped, with its bytes
    /// as a slice (as a WebAssembly memory is to the code that restores into it).
    pub(crate) struct Memory(pub &'static mut [u8]);

    impl Memory {
        pub fn new(pages: usize) -> Self {
            Self(Mapping::anonymous(pages * PAGE).expect("a mapping").leak())
        }

        pub fn range(&self) -> std::ops::Range<usize> {
            super::address_range(self.0)
        }

        /// The pages of it that are the process's own.
        pub fn written(&self) -> Vec<usize> {
            let map = super::pagemap::page_map(self.0.as_ptr() as usize, self.0.len())
                .expect("a page map");
            (0..map.len()).filter(|&i| map[i].written()).collect()
        }
    }

    impl Drop for Memory {
        fn drop(&mut self) {
            // SAFETY: the bytes `new` leaked, not used after this.
            drop(unsafe { Mapping::from_leaked(self.0) });
        }
    }
}
