//! The part of a sandbox's WebAssembly memory a memory snapshot was restored into, as one owner
//! with two kinds: copied (the snapshot's bytes written into the memory's own pages, which may go to
//! the next sandbox as a spare) or mapped (the snapshot's sealed file mapped over it copy-on-write).
//! What may be done with the pages depends on the kind, and the kind changes in one place only (an
//! idle copied memory given back becomes a mapping), so a caller cannot, say, hand a mapped memory
//! on as a spare or give back pages of a memory that is not a mapping of the image.
//!
//! The memory itself is V8's: this value is made with one promise about it ([`RestoredMemory::
//! copied`], [`RestoredMemory::mapped`]), and every method after that is safe.

use std::marker::PhantomData;
use std::ops::Range;

use super::{MappedImage, PagesError, address_range, spare};

/// See the module doc. Not `Send`: it is used on the thread of the isolate whose memory it is.
pub(crate) struct RestoredMemory {
    range: Range<usize>,
    kind: Kind,
    _isolate_thread: PhantomData<*mut u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Copied,
    Mapped,
}

impl RestoredMemory {
    /// `memory`, into which the snapshot numbered `snapshot` was just copied (its every byte the
    /// snapshot's). On a thread that keeps spares, the kernel records the pages written from now
    /// on, so the next restore of that snapshot into these pages rewrites only those.
    ///
    /// # Safety
    /// `memory` must be private anonymous memory of a sandbox's WebAssembly memory that stays
    /// mapped read-write while this value lives, is read or written by nothing but that sandbox's
    /// isolate on this thread, never while a method of this value runs, and that is only unmapped
    /// (never read) after [`into_spare`](Self::into_spare).
    pub unsafe fn copied(memory: &mut [u8], snapshot: u64) -> Self {
        let range = address_range(memory);
        // SAFETY: as the caller guarantees (private anonymous memory, read-write).
        unsafe { spare::record_writes(range.clone(), snapshot) };
        Self {
            range,
            kind: Kind::Copied,
            _isolate_thread: PhantomData,
        }
    }

    /// `memory`, over which a [`MappedImage`] mapped its snapshot's memory (`map_over`).
    ///
    /// # Safety
    /// As for [`copied`](Self::copied), and `memory` must be the mapping `map_over` made.
    pub unsafe fn mapped(memory: &mut [u8]) -> Self {
        Self {
            range: address_range(memory),
            kind: Kind::Mapped,
            _isolate_thread: PhantomData,
        }
    }

    /// The memory's address range.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The memory's bytes, for the length of a method.
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: by the promise this value was made with, the range stays mapped read-write and
        // nothing else touches it while a method runs; `&mut self` keeps it to one borrow.
        unsafe { std::slice::from_raw_parts_mut(self.range.start as *mut u8, self.range.len()) }
    }

    /// Gives back the pages the memory holds unchanged from `image` (the image it was restored
    /// from). A mapped memory drops its copies of such pages; a copied one becomes a mapping of the
    /// image with the pages that differ written back (then it is no spare for the next sandbox).
    /// Returns how many bytes. After an error the memory may have lost pages: the sandbox must be
    /// dropped unused.
    pub fn give_back(&mut self, image: &MappedImage) -> Result<usize, PagesError> {
        match self.kind {
            // SAFETY: a mapped memory is the mapping `map_over` (or `map_copied`, below) made from
            // this image, as the constructor's promise and `kind` say.
            Kind::Mapped => Ok(unsafe { image.give_back_unchanged(self.bytes()) }),
            Kind::Copied => {
                // The recorder of writes keeps the pages' addresses: it forgets them first.
                spare::forget(&self.range);
                let given = image.map_copied(self.bytes());
                if !matches!(given, Ok(None)) {
                    // Mapped, or perhaps partly after an error: in no case a spare any more.
                    self.kind = Kind::Mapped;
                }
                Ok(given?.unwrap_or(0))
            }
        }
    }

    /// Measures `image`'s working set on this memory, a mapping of it (see
    /// `MappedImage::measure_working_set`); 0 bytes for a copied memory.
    pub fn measure_working_set(&self, image: &MappedImage) -> usize {
        match self.kind {
            Kind::Mapped => image.measure_working_set(self.range()),
            Kind::Copied => 0,
        }
    }

    /// The memory's sandbox is about to be dropped: a copied memory's pages become this thread's
    /// spare (if it keeps one) for the next sandbox it boots; a mapped one is left to be unmapped.
    pub fn into_spare(self) {
        if self.kind == Kind::Copied {
            // SAFETY: by the promise this value was made with, the memory is private anonymous
            // read-write memory that is only unmapped from now on.
            unsafe { spare::keep(self.range.clone()) };
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::sandbox::pages::PAGE;
    use crate::sandbox::pages::testing::Memory;

    #[test]
    fn a_copied_memory_goes_on_as_a_spare_and_a_mapped_one_does_not() {
        std::thread::spawn(|| {
            spare::keep_on_this_thread();
            let copied = Memory::new(4);
            copied.0.fill(5);
            // SAFETY: `copied` is a live private anonymous mapping only this test uses, unmapped
            // (never read as the sandbox's) after `into_spare`.
            let restored = unsafe { RestoredMemory::copied(copied.0, 1) };
            assert_eq!(restored.kind, Kind::Copied);
            restored.into_spare();
            let next = Memory::new(4);
            assert!(spare::take_into(next.0, 1).is_some());
            assert!(next.0.iter().all(|b| *b == 5));

            let mapped = Memory::new(4);
            mapped.0.fill(6);
            // SAFETY: as above (standing in for a mapping of an image: never given back here).
            let restored = unsafe { RestoredMemory::mapped(mapped.0) };
            assert_eq!(restored.kind, Kind::Mapped);
            restored.into_spare();
            assert!(spare::take_into(Memory::new(4).0, 1).is_none(), "no spare");
            assert!(mapped.0.iter().all(|b| *b == 6), "left as it was");
            assert_eq!(mapped.range().len(), 4 * PAGE);
        })
        .join()
        .unwrap();
    }
}
