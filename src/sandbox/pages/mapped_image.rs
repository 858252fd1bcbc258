//! A memory snapshot's linear memory mapped copy-on-write into each sandbox instead of copied (the
//! snapshot with pre-imported modules, on Linux), and the pages each sandbox gets written up front.
//!
//! The snapshot's bytes go once into a sealed in-memory file (`mapping::SealedFile`), the only copy the
//! engine keeps. A sandbox maps the memory part of the file privately over the start of its
//! WebAssembly memory: pages it only reads stay shared with every other sandbox, and a page it writes
//! becomes its own copy; no sandbox can change the file or see another's pages. A page written on
//! first touch costs a fault that is several times dearer than copying the page ahead, so each
//! sandbox also has its *working set* copied up front (`MADV_POPULATE_WRITE`): the pages that the
//! engine's start-up check wrote (a restore, then everyday numpy, pandas and matplotlib steps,
//! `working_set.py`, and the check itself). A ready sandbox then holds those pages of its own, not
//! the whole image (docs/performance-log.md: 88 -> 45 MiB per ready pre-imported sandbox, creation
//! 0.87x, a call 1-5 ms slower). Opt-in (`workers.map_snapshot_memory`): by default the memory is
//! copied, which keeps calls fastest.
//!
//! A ready sandbox that waits long (its worker idle for `workers.idle_give_back_s`) gives back the
//! pages it still holds unchanged (`give_back_unchanged`: the working set's pages not written since,
//! read from the file and compared): ~50 -> ~21 MiB each with pandas and matplotlib, for a first call
//! that then copies the pages it writes as it writes them (a pandas groupby ~10 ms slower). A copied
//! memory (the default; the engine then keeps the snapshot in the sealed file all the same, and
//! copies from it) does the same by becoming such a mapping (`map_copied`): ~90 -> ~20 MiB.
//!
//! Linux's page map (`/proc/self/pagemap`) says which pages of a mapping are a process's own; it is
//! also how a restore tells pages never touched (see `memory_snapshot::restore_into`).

use std::ops::Range;
use std::sync::OnceLock;

use super::PAGE;
use super::PagesError;
#[cfg(target_os = "linux")]
use super::mapping::{Mapping, SealedFile, populate_written};
use super::pagemap::page_map;

/// How much of the file is read at a time to compare a memory with it: 1 MiB.
#[cfg(target_os = "linux")]
const CHUNK: usize = 256 * PAGE;

/// The snapshot's bytes as a sealed file that sandboxes map their memory from.
pub(crate) struct MappedImage {
    #[cfg(target_os = "linux")]
    file: SealedFile,
    /// Where the linear memory starts in the file (a page boundary).
    memory_start: usize,
    /// The pages (byte ranges of the linear memory) each sandbox gets copied when it maps the
    /// memory; empty until the engine's check has measured them.
    working_set: OnceLock<Vec<Range<usize>>>,
}

/// The snapshot's bytes (`bytes`, whose memory starts at `offset`) laid out in a sealed file so that
/// the memory starts on a page: the header ends where padding puts it. `parts` are the ranges of
/// `bytes` that are not zeros (the rest is left as holes). Returns the file, mapped whole, and where
/// `bytes` start in it; `None` where this system cannot.
#[cfg(target_os = "linux")]
pub(crate) fn lay_out(
    bytes: &[u8],
    offset: usize,
    parts: impl Iterator<Item = Range<usize>>,
) -> Option<(MappedImage, Mapping, usize)> {
    let pad = (PAGE - offset % PAGE) % PAGE;
    let len = (pad + bytes.len()).next_multiple_of(PAGE);
    let parts = std::iter::once(0..offset)
        .chain(parts)
        .map(|r| (pad + r.start, &bytes[r]));
    let file = match SealedFile::sparse(len, parts) {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(error = %e, "cannot map the snapshot's memory copy-on-write; sandboxes copy it");
            return None;
        }
    };
    let mapping = file.map_private()?;
    Some((
        MappedImage {
            file,
            memory_start: pad + offset,
            working_set: OnceLock::new(),
        },
        mapping,
        pad,
    ))
}

impl MappedImage {
    /// Maps the memory's first `len` bytes over `heap` (a new sandbox's WebAssembly memory), in place
    /// of what instantiation left there, and copies the working set. `Ok(false)` where `heap` does
    /// not allow it (not whole pages): the caller copies instead. After an error the memory may have
    /// lost its pages: the sandbox must not be used.
    pub fn map_over(&self, heap: &mut [u8], len: usize) -> Result<bool, PagesError> {
        let start = heap.as_mut_ptr();
        if heap.len() < len || !(start as usize).is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Ok(false);
        }
        #[cfg(target_os = "linux")]
        {
            let memory = &mut heap[..len];
            self.file
                .map_over(self.memory_start, memory)
                .map_err(|e| PagesError::system("cannot map the snapshot's memory", e))?;
            for pages in self.working_set.get().into_iter().flatten() {
                // (Before Linux 5.14 the advice fails: the pages are copied when first written.)
                if pages.end > len || !populate_written(memory, pages.clone()) {
                    break;
                }
            }
            Ok(true)
        }
        #[cfg(not(target_os = "linux"))]
        Ok(false)
    }

    /// Gives back the pages of a mapped memory that are its own but hold the file's bytes again
    /// (the working set copied up front and not written since, or pages written back to what they
    /// were): the kernel drops its copy, and the page reads as the file's again. `memory` is the
    /// memory `map_over` mapped. The file is read, not mapped, for the comparison, so that it does
    /// not bring the file's pages into the process. Returns how many bytes were given back.
    ///
    /// # Safety
    /// `memory` must be a mapping that `map_over` (or `map_copied`) made from this image: dropping
    /// a page of any other memory would make it read zeros or another file's bytes.
    pub(super) unsafe fn give_back_unchanged(&self, memory: &mut [u8]) -> usize {
        #[cfg(target_os = "linux")]
        {
            let Some(pages) = page_map(memory.as_ptr() as usize, memory.len()) else {
                return 0;
            };
            // Runs of the pages that are the memory's own, each compared with the file's bytes.
            let mut given = 0;
            let mut i = 0;
            while i < pages.len() {
                if !pages[i].written() {
                    i += 1;
                    continue;
                }
                let first = i;
                while i < pages.len() && pages[i].written() && (i - first) * PAGE < CHUNK {
                    i += 1;
                }
                let run = first * PAGE..i * PAGE;
                let mut same: Vec<Range<usize>> = Vec::new();
                let compared = self.compare_pages(memory, run, |at, _, equal| {
                    if !equal {
                        return;
                    }
                    match same.last_mut() {
                        Some(r) if r.end == at => r.end = at + PAGE,
                        _ => same.push(at..at + PAGE),
                    }
                });
                if compared.is_err() {
                    return given;
                }
                for r in same {
                    // SAFETY: by the caller, a mapping of this image, whose pages `r` equal the
                    // file's (just compared, and the exclusive borrow keeps them so).
                    given += unsafe { drop_pages(memory, r) };
                }
            }
            given
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = memory;
            0
        }
    }

    /// Turns a copied memory into a mapping of this image holding the same bytes, so that the pages
    /// it holds unchanged are given back (the copied mode's counterpart of `give_back_unchanged`).
    /// `memory` is what a restore wrote the snapshot's memory over (copied, not mapped). Each page is compared with the file's (read, not mapped); the pages that differ are
    /// saved, the file is mapped privately over the whole range, and the saved pages are written
    /// back: every byte reads as before, and only the pages that differ are the memory's own.
    /// `Ok(None)` if it was left as it is (more than half of it differs, or not whole pages);
    /// otherwise how many bytes of its own it held before and holds no more. After an error the
    /// memory may have lost its pages: the sandbox must not be used.
    ///
    pub(super) fn map_copied(&self, memory: &mut [u8]) -> Result<Option<usize>, PagesError> {
        #[cfg(target_os = "linux")]
        {
            let len = memory.len();
            if !(memory.as_ptr() as usize).is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
                return Ok(None);
            }
            let own_before = match page_map(memory.as_ptr() as usize, len) {
                Some(pages) => pages.iter().filter(|p| p.written()).count() * PAGE,
                None => return Ok(None),
            };
            // The pages that differ from the file's: their offsets, and their bytes.
            let mut differ: Vec<usize> = Vec::new();
            let mut saved: Vec<u8> = Vec::new();
            for at in (0..len).step_by(CHUNK) {
                let run = at..(at + CHUNK).min(len);
                self.compare_pages(memory, run, |at, own, equal| {
                    if !equal {
                        differ.push(at);
                        saved.extend_from_slice(own);
                    }
                })
                .map_err(|e| PagesError::system("cannot read the snapshot's file", e))?;
                if saved.len() > len / 2 {
                    return Ok(None);
                }
            }
            self.file
                .map_over(self.memory_start, memory)
                .map_err(|e| PagesError::system("cannot map the snapshot's memory", e))?;
            for (at, bytes) in differ.iter().zip(saved.chunks(PAGE)) {
                memory[*at..*at + PAGE].copy_from_slice(bytes);
            }
            Ok(Some(own_before.saturating_sub(saved.len())))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = memory;
            Ok(None)
        }
    }

    /// Compares the pages `run` (byte offsets of the linear memory, whole pages, at most
    /// [`CHUNK`] bytes) of `memory` with the file's, which are read, not mapped (mapping them would
    /// bring the file's pages into the process): `each` gets each page's offset, its bytes in the
    /// memory, and whether they equal the file's.
    #[cfg(target_os = "linux")]
    fn compare_pages(
        &self,
        memory: &[u8],
        run: Range<usize>,
        mut each: impl FnMut(usize, &[u8], bool),
    ) -> std::io::Result<()> {
        let file = self
            .file
            .read_at(self.memory_start + run.start, run.len())?;
        let own = memory
            .get(run.clone())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        for (page, (own, file)) in own.chunks(PAGE).zip(file.chunks(PAGE)).enumerate() {
            each(run.start + page * PAGE, own, own == file);
        }
        Ok(())
    }

    /// Sets the working set, once: the pages of a mapped memory at `memory` (its address range) that
    /// are the sandbox's own (read from the page map, not from the memory). Returns how many bytes
    /// that is.
    pub(super) fn measure_working_set(&self, memory: Range<usize>) -> usize {
        let Some(pages) = page_map(memory.start, memory.len()) else {
            return 0;
        };
        let mut set: Vec<Range<usize>> = Vec::new();
        for (i, entry) in pages.iter().enumerate() {
            if !entry.written() {
                continue;
            }
            let start = i * PAGE;
            match set.last_mut() {
                Some(last) if last.end == start => last.end = start + PAGE,
                _ => set.push(start..start + PAGE),
            }
        }
        let bytes = set.iter().map(Range::len).sum();
        let _ = self.working_set.set(set);
        bytes
    }
}

/// Drops the pages `pages` (offsets, whole pages) of `memory`, a private file mapping, which then
/// read as the file's again. Returns how many bytes it dropped.
///
/// # Safety
/// `memory` must be a private mapping of a file whose bytes at `pages` equal those pages' own (the
/// caller compared them): dropping the copies then changes no byte anyone reads.
#[cfg(target_os = "linux")]
unsafe fn drop_pages(memory: &mut [u8], pages: Range<usize>) -> usize {
    let Some(part) = memory.get_mut(pages) else {
        return 0;
    };
    // SAFETY: as the caller guarantees; whole pages of memory held exclusively.
    let advised = unsafe {
        rustix::mm::madvise(
            part.as_mut_ptr().cast(),
            part.len(),
            rustix::mm::Advice::LinuxDontNeed,
        )
    };
    if advised.is_ok() { part.len() } else { 0 }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::sandbox::pages::testing::Memory;

    /// A snapshot in Pyodide's layout with a header of 100 bytes (so the memory is not on a page
    /// in the snapshot) and `pages` pages of memory, page `i` filled with `i`, page 2 all zeros.
    fn snapshot(pages: usize) -> (Vec<u8>, usize) {
        let offset = 100;
        let mut bytes = vec![0u8; offset];
        bytes[4..8].copy_from_slice(&(offset as u32).to_le_bytes());
        for i in 0..pages {
            bytes.extend(std::iter::repeat_n(if i == 2 { 0 } else { i as u8 }, PAGE));
        }
        (bytes, offset)
    }

    fn image(bytes: &[u8], offset: usize) -> MappedImage {
        let parts = std::iter::once(offset..bytes.len());
        let (image, _mapping, start) = lay_out(bytes, offset, parts).expect("a sealed file");
        assert_eq!(
            (start + offset) % PAGE,
            0,
            "the memory starts on a page of the file"
        );
        image
    }

    #[test]
    fn a_mapped_memory_reads_as_the_snapshot_and_what_a_sandbox_writes_stays_its_own() {
        let (bytes, offset) = snapshot(8);
        let image = image(&bytes, offset);
        let memory_len = 8 * PAGE;
        let first = Memory::new(10);
        first.0[9 * PAGE] = 42; // past the snapshot's memory: left alone
        assert!(image.map_over(first.0, memory_len).unwrap());
        assert_eq!(&first.0[..memory_len], &bytes[offset..]);
        assert_eq!(first.0[9 * PAGE], 42);
        first.0[3 * PAGE] = 0xff;
        let second = Memory::new(8);
        assert!(image.map_over(second.0, memory_len).unwrap());
        assert_eq!(
            &second.0[..memory_len],
            &bytes[offset..],
            "the first sandbox's write is its own"
        );
        // Memory that is not whole pages is left to the copy.
        let mut unaligned = vec![0u8; memory_len + 1];
        assert!(!image.map_over(&mut unaligned[1..], memory_len).unwrap());
    }

    #[test]
    fn the_working_set_is_what_the_measured_sandbox_wrote_and_every_later_one_gets_it_written() {
        let (bytes, offset) = snapshot(8);
        let image = image(&bytes, offset);
        let memory_len = 8 * PAGE;
        let measured = Memory::new(8);
        assert!(image.map_over(measured.0, memory_len).unwrap());
        assert!(
            measured.written().is_empty(),
            "nothing is copied before it is written"
        );
        // Reading shares the file's pages; writing copies.
        assert_eq!(measured.0[5 * PAGE], 5);
        measured.0[PAGE + 7] = 1;
        measured.0[6 * PAGE] = 1;
        measured.0[7 * PAGE] = 1;
        assert_eq!(measured.written(), [1, 6, 7]);
        assert_eq!(image.measure_working_set(measured.range()), 3 * PAGE);
        let later = Memory::new(8);
        assert!(image.map_over(later.0, memory_len).unwrap());
        assert_eq!(later.written(), [1, 6, 7], "copied up front");
        assert_eq!(
            &later.0[..memory_len],
            &bytes[offset..],
            "and equal to the snapshot"
        );
    }

    #[test]
    fn an_idle_sandbox_gives_back_the_pages_it_holds_unchanged_and_keeps_what_it_changed() {
        let (bytes, offset) = snapshot(8);
        let image = image(&bytes, offset);
        let memory_len = 8 * PAGE;
        let measured = Memory::new(8);
        assert!(image.map_over(measured.0, memory_len).unwrap());
        for page in [1, 6, 7] {
            measured.0[page * PAGE] = 9;
        }
        image.measure_working_set(measured.range());
        let sandbox = Memory::new(8);
        assert!(image.map_over(sandbox.0, memory_len).unwrap());
        assert_eq!(sandbox.written(), [1, 6, 7]);
        sandbox.0[6 * PAGE] = 0xee; // changed
        sandbox.0[7 * PAGE] = 0xee;
        sandbox.0[7 * PAGE] = 7; // written back to what it was
        // SAFETY: the mapping `map_over` made from this image; nothing else uses it.
        let given = unsafe { image.give_back_unchanged(sandbox.0) };
        assert_eq!(given, 2 * PAGE, "pages 1 and 7");
        assert_eq!(sandbox.written(), [6]);
        let mut expected = bytes[offset..].to_vec();
        expected[6 * PAGE] = 0xee;
        assert_eq!(&sandbox.0[..memory_len], &expected[..]);
        // Nothing more to give back; a page given back is copied again when written.
        // SAFETY: as above.
        assert_eq!(unsafe { image.give_back_unchanged(sandbox.0) }, 0);
        sandbox.0[PAGE] = 3;
        assert_eq!(sandbox.written(), [1, 6]);
    }

    #[test]
    fn an_idle_copied_memory_becomes_a_mapping_with_the_same_bytes_holding_only_what_differs() {
        let (bytes, offset) = snapshot(8);
        let image = image(&bytes, offset);
        let memory_len = 8 * PAGE;
        // A copied restore: the snapshot's pages written over fresh memory, zero page 2 untouched.
        let copied = Memory::new(9);
        for page in (0..8).filter(|p| *p != 2) {
            copied.0[page * PAGE..(page + 1) * PAGE]
                .copy_from_slice(&bytes[offset + page * PAGE..offset + (page + 1) * PAGE]);
        }
        copied.0[8 * PAGE] = 42; // past the snapshot's memory: left alone
        // The boot changed pages 3 and 6, and wrote page 2 (zeros in the snapshot).
        copied.0[3 * PAGE + 5] = 0xee;
        copied.0[6 * PAGE] = 0xee;
        copied.0[2 * PAGE + 9] = 1;
        let before = copied.0.to_vec();
        assert_eq!(copied.written(), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let given = image
            .map_copied(&mut copied.0[..memory_len])
            .expect("mapped");
        assert_eq!(given, Some(5 * PAGE), "8 own pages before, 3 after");
        assert_eq!(&copied.0[..], &before[..], "every byte as before");
        assert_eq!(copied.written(), [2, 3, 6, 8]);
        // A page it writes from now on is copied as it is written, and stays its own: the file and
        // a memory mapped from it later still read as the snapshot.
        copied.0[5 * PAGE] = 0xdd;
        assert_eq!(copied.written(), [2, 3, 5, 6, 8]);
        let other = Memory::new(8);
        assert!(image.map_over(other.0, memory_len).unwrap());
        assert_eq!(&other.0[..memory_len], &bytes[offset..]);
        // Now a mapping: what it holds unchanged is given back the mapped way.
        copied.0[5 * PAGE] = 5;
        // SAFETY: a mapping of this image, used by nothing else.
        let given = unsafe { image.give_back_unchanged(&mut copied.0[..memory_len]) };
        assert_eq!(given, PAGE);
        assert_eq!(&copied.0[..], &before[..]);

        // A memory that differs in more than half its pages is left as it is.
        let changed = Memory::new(8);
        changed.0.fill(0xab);
        assert!(matches!(image.map_copied(changed.0), Ok(None)));
        assert!(changed.0.iter().all(|b| *b == 0xab));
        assert_eq!(changed.written().len(), 8);
    }

    #[test]
    fn a_copied_memory_given_back_reads_the_same_holds_only_what_differs_and_is_no_spare() {
        use crate::sandbox::pages::{RestoredMemory, spare};
        std::thread::spawn(|| {
            spare::keep_on_this_thread();
            let (bytes, offset) = snapshot(8);
            let image = image(&bytes, offset);
            let memory = Memory::new(8);
            memory.0.copy_from_slice(&bytes[offset..]);
            memory.0[3 * PAGE] = 0xee;
            let before = memory.0.to_vec();
            // SAFETY: a live private anonymous mapping only this test uses, unmapped (never read
            // as a sandbox's) after `into_spare`.
            let mut restored = unsafe { RestoredMemory::copied(memory.0, 1) };
            assert_eq!(
                restored.give_back(&image).unwrap(),
                7 * PAGE,
                "8 own pages, 1 after"
            );
            assert_eq!(&memory.0[..], &before[..]);
            assert_eq!(memory.written(), [3]);
            // Now a mapping: nothing more to give back, and not a spare for the next sandbox.
            assert_eq!(restored.give_back(&image).unwrap(), 0);
            restored.into_spare();
            assert!(spare::take_into(Memory::new(8).0, 1).is_none());
            assert_eq!(&memory.0[..], &before[..]);
        })
        .join()
        .unwrap();
    }
}
