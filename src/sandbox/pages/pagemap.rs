//! Which pages of a range of this process's memory are its own, as Linux's page map
//! (`/proc/self/pagemap`) says: present or swapped out (ever touched), and not a file's page (written,
//! or copied on write). Reading it reads no byte of the memory itself.

use std::sync::OnceLock;

use super::PAGE;

/// One page's entry in Linux's page map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageEntry(u64);

impl PageEntry {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    /// A page of a file (or shared memory), not the process's own.
    const FILE: u64 = 1 << 61;

    /// Whether the page may ever have been written (a page neither present nor swapped out was
    /// never touched and reads as zeros).
    pub fn touched(self) -> bool {
        self.0 & (Self::PRESENT | Self::SWAPPED) != 0
    }

    /// Whether the page is the process's own (written, or copied on write), not a file's.
    pub fn written(self) -> bool {
        self.touched() && self.0 & Self::FILE == 0
    }
}

/// The page-map entries of the `len` bytes at address `start` (a page boundary); `None` where the
/// system cannot say. Reads no byte of that memory.
pub(crate) fn page_map(start: usize, len: usize) -> Option<Vec<PageEntry>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::FileExt;
        static PAGEMAP: OnceLock<Option<std::fs::File>> = OnceLock::new();
        let pagemap = PAGEMAP
            .get_or_init(|| std::fs::File::open("/proc/self/pagemap").ok())
            .as_ref()?;
        if !start.is_multiple_of(PAGE) {
            return None;
        }
        let mut entries = vec![0u8; len.div_ceil(PAGE) * 8];
        pagemap
            .read_exact_at(&mut entries, (start / PAGE * 8) as u64)
            .ok()?;
        Some(
            entries
                .chunks_exact(8)
                .map(|e| PageEntry(u64::from_le_bytes(e.try_into().unwrap_or_default())))
                .collect(),
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (start, len);
        None
    }
}
