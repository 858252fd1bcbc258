//! The Pyodide memory snapshot: held once per process in a V8 backing store that every isolate maps
//! without copying (its zero pages taking no memory), and restored into each new sandbox's memory
//! writing only what differs from fresh memory (a session image: its base snapshot's pages, then the
//! pages it changed). On disk it is `snapshot_files.rs`'s business.

use deno_core::v8;
use sha2::{Digest, Sha256};

use crate::sandbox::pages::pagemap::page_map;
use crate::sandbox::pages::{MappedImage, Mapping, PAGE};
use crate::sandbox::prepared::session_base::{Delta, is_zero, memory_offset};

/// What the memory a snapshot is restored into holds before the restore.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pages<'a> {
    /// A new instance's memory: zeros except where instantiation wrote.
    Fresh,
    /// The pages of a sandbox restored from the same snapshot before, written since then anywhere.
    Reused,
    /// The pages of a sandbox restored from the same snapshot before, written since then only at
    /// these byte ranges (in order; see `pages/written.rs`).
    ReusedWritten(&'a [std::ops::Range<usize>]),
}

/// Gives each snapshot a number no other snapshot of the process has.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The kind of snapshot a sandbox starts from (the kind of sandbox a call runs in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Flavor {
    /// Restored from the plain snapshot (or booted in full, without one).
    #[default]
    Plain,
    /// Restored from the snapshot with the pre-imported modules.
    Preimported,
}

impl Flavor {
    /// How a session image names the snapshot kind it is based on.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Plain => "plain",
            Flavor::Preimported => "preimported",
        }
    }

    /// The snapshot kind an image names.
    pub fn named(name: &str) -> Option<Flavor> {
        match name {
            "plain" => Some(Flavor::Plain),
            "preimported" => Some(Flavor::Preimported),
            _ => None,
        }
    }
}

/// The snapshot bytes in a V8 backing store shared by every isolate, and a map of its linear memory.
/// The bytes are a [`Mapping`], which V8 does not count as any isolate's memory; each isolate given
/// an ArrayBuffer over the store keeps the mapping until it is disposed (see `op_sandbox_snapshot`).
pub(crate) struct SharedSnapshot {
    /// This snapshot's number in the process (a reused memory records which one it holds).
    id: u64,
    store: v8::SharedRef<v8::BackingStore>,
    /// The memory `store` points to, when it is a mapping.
    mapping: Option<std::sync::Arc<Mapping>>,
    /// Where the linear memory starts in the snapshot (after Pyodide's header).
    memory_offset: usize,
    /// The linear memory as runs of whole pages, in order: which hold data and which are all zeros.
    runs: Vec<Run>,
    /// The record of the shared libraries to relink after restoring (a snapshot with pre-imported
    /// modules).
    dylibs: Option<DylibRecord>,
    /// The digest of the bytes, once asked for (a session image names its base by it).
    digest: std::sync::OnceLock<String>,
    /// For a session image: the snapshot it is a delta against, and the delta (the shared bytes
    /// are then the image's header followed by zeros never read).
    overlay: Option<Overlay>,
    /// The bytes as a sealed file that sandboxes map their memory from, copy-on-write (the snapshot
    /// with pre-imported modules; see `pages/mapped_image.rs`): at restore if `maps`, otherwise once idle
    /// (`map_copied`).
    image: Option<MappedImage>,
    /// Whether a restore maps the image rather than copying the memory.
    maps: bool,
    /// Whether the bytes are a session's image (its own interpreter, whose code has run: see
    /// [`of_session`](Self::of_session)), not one of the engine's snapshots.
    session: bool,
}

/// How sandboxes get the memory of a snapshot with pre-imported modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SnapshotMemory {
    /// Copied into each sandbox's memory.
    Copied,
    /// Copied, from a sealed file that an idle ready sandbox then maps instead, giving back the
    /// pages it holds unchanged (`SharedSnapshot::map_copied`).
    CopiedFromFile,
    /// Mapped copy-on-write from a sealed file, the working set copied (`pages/mapped_image.rs`).
    Mapped,
}

/// A session image's memory: `base`'s, with the pages of `delta` over it.
struct Overlay {
    base: std::sync::Arc<SharedSnapshot>,
    delta: Delta,
}

/// The record of a snapshot's shared libraries, as `src/sandbox/isolate/ops/dylink.js` makes it and
/// relinks from it (JSON: the libraries' order, memory and table bases, handles), with the one part
/// Rust reads decoded once: the top-level packages imported in the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DylibRecord {
    json: std::sync::Arc<str>,
    modules: Vec<String>,
}

impl DylibRecord {
    /// The record `json` as `dylink.js` wrote it, if it is one (an object with a `modules` list).
    pub fn parse(json: String) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Head {
            modules: Vec<String>,
        }
        let head: Head = serde_json::from_str(&json).ok()?;
        Some(Self {
            modules: head.modules,
            json: json.into(),
        })
    }

    /// The record as `dylink.js` reads it.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The top-level packages imported in the snapshot.
    pub fn modules(&self) -> &[String] {
        &self.modules
    }
}

/// Pages `start..end` (byte offsets into the linear memory) of the snapshot, all-zero or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    start: usize,
    end: usize,
    zero: bool,
}

// SAFETY: a V8 BackingStore is reference-counted with atomic counts (std::shared_ptr) and may be used
// from any thread and isolate; its bytes are only read. Every isolate detaches its ArrayBuffer right
// after Pyodide has restored from it, before any user code runs, so no script can write to it.
unsafe impl Send for SharedSnapshot {}
// SAFETY: as for `Send`: through `&SharedSnapshot` the bytes are only read and the reference count
// is atomic.
unsafe impl Sync for SharedSnapshot {}

impl SharedSnapshot {
    /// A snapshot with pre-imported modules, whose shared libraries `dylibs` records, its memory
    /// given to sandboxes as `memory` says where the system allows (a sealed file needs Linux; see
    /// `pages/mapped_image.rs`): most of its ~90 MB is pandas' and matplotlib's objects, of which a call
    /// writes a small part.
    pub fn with_dylibs(bytes: Vec<u8>, dylibs: DylibRecord, memory: SnapshotMemory) -> Self {
        let offset = memory_offset(&bytes).unwrap_or(bytes.len());
        let runs = zero_runs(&bytes[offset..]);
        let file = memory != SnapshotMemory::Copied;
        let snapshot = match file.then(|| mapped_store(&bytes, offset, &runs)).flatten() {
            Some((store, mapping, image)) => Self {
                id: next_id(),
                store,
                mapping: Some(std::sync::Arc::new(mapping)),
                memory_offset: offset,
                runs,
                dylibs: None,
                digest: std::sync::OnceLock::new(),
                overlay: None,
                image: Some(image),
                maps: memory == SnapshotMemory::Mapped,
                session: false,
            },
            None => Self::sparse(bytes, offset, runs),
        };
        Self {
            dylibs: Some(dylibs),
            ..snapshot
        }
    }

    /// These bytes marked as a session's image: a sandbox restored from them counts as one whose
    /// user code has run from the start (its JavaScript and Python may be anything that code made).
    pub fn of_session(self) -> Self {
        Self {
            session: true,
            ..self
        }
    }

    /// Whether these bytes are a session's image (see [`of_session`](Self::of_session)).
    pub fn is_session(&self) -> bool {
        self.session
    }

    /// The record of the shared libraries to relink, for a snapshot with pre-imported modules.
    pub fn dylibs(&self) -> Option<&DylibRecord> {
        self.dylibs.as_ref()
    }

    /// The size of the snapshot.
    pub fn byte_len(&self) -> usize {
        self.store.byte_length()
    }

    pub fn new(bytes: Vec<u8>) -> Self {
        // Pyodide's format: u32 magic, u32 offset of the linear memory, then the header.
        let offset = memory_offset(&bytes).unwrap_or(bytes.len());
        let runs = zero_runs(&bytes[offset..]);
        Self::sparse(bytes, offset, runs)
    }

    /// The snapshot `bytes` (memory at `offset`, made of `runs`) in a store of zero pages.
    fn sparse(bytes: Vec<u8>, offset: usize, runs: Vec<Run>) -> Self {
        let (store, mapping) = sparse_store(&bytes, offset, &runs);
        Self {
            id: next_id(),
            store,
            mapping: mapping.map(std::sync::Arc::new),
            memory_offset: offset,
            runs,
            dylibs: None,
            digest: std::sync::OnceLock::new(),
            overlay: None,
            image: None,
            maps: false,
            session: false,
        }
    }

    /// A session image's memory: `base`'s with the pages of `delta` over it, never built as one
    /// buffer. The shared bytes are the image's header followed by zeros that the kernel supplies
    /// only if read: Pyodide reads the header and the memory's length, and `restore_into` writes
    /// the memory from `base` and `delta`.
    pub fn overlaid(
        base: std::sync::Arc<SharedSnapshot>,
        delta: Delta,
        dylibs: Option<DylibRecord>,
    ) -> Result<Self, String> {
        // (`Delta::parse` checked that the header ends where its memory starts.)
        let header = delta.header();
        if base.overlay.is_some() {
            return Err("an image cannot be based on another image".into());
        }
        // Pyodide sizes the memory by these bytes but never reads past the header (the restore
        // writes the memory, see `restore_into`): a fresh zero mapping, of which only the header's
        // pages are ever touched.
        let (store, mapping) = zeroed_store(header.len() + delta.heap_len());
        if let Some(data) = store.data() {
            // SAFETY: the backing store owns `byte_length` writable bytes at `data`, which nothing
            // else references yet; the header is shorter (it is part of that length).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    header.as_ptr(),
                    data.as_ptr().cast::<u8>(),
                    header.len(),
                );
            }
        }
        Ok(Self {
            id: next_id(),
            store: store.make_shared(),
            mapping: mapping.map(std::sync::Arc::new),
            memory_offset: header.len(),
            runs: Vec::new(),
            dylibs,
            digest: std::sync::OnceLock::new(),
            overlay: Some(Overlay { base, delta }),
            image: None,
            maps: false,
            session: false,
        })
    }

    /// A new ArrayBuffer of the calling isolate over the shared bytes, and what the isolate must
    /// keep until it is disposed (the mapping the bytes are in, if they are).
    pub fn array_buffer<'s>(
        &self,
        scope: &v8::PinScope<'s, '_>,
    ) -> (
        v8::Local<'s, v8::ArrayBuffer>,
        Option<std::sync::Arc<Mapping>>,
    ) {
        (
            v8::ArrayBuffer::with_backing_store(scope, &self.store),
            self.mapping.clone(),
        )
    }

    /// The sealed file sandboxes map this snapshot's memory from, if they do (at restore, or once
    /// idle).
    pub fn image(&self) -> Option<&MappedImage> {
        self.image.as_ref()
    }

    /// Whether a restore maps this snapshot's memory rather than copying it.
    pub fn maps_memory(&self) -> bool {
        self.maps && self.image.is_some()
    }

    /// A short digest of the snapshot's bytes (computed once).
    pub fn digest(&self) -> &str {
        self.digest
            .get_or_init(|| hex::encode(&Sha256::digest(self.bytes())[..16]))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self.store.data() {
            // SAFETY: the backing store owns `byte_length` bytes at `data` for as long as `store`
            // lives, and nothing writes to them (see the Send/Sync note).
            Some(data) => unsafe {
                std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), self.store.byte_length())
            },
            None => &[],
        }
    }

    /// Writes the snapshot's linear memory over `heap`, a new instance's memory whose bytes after
    /// instantiation are zeros except where data segments and constructors wrote: the same result as
    /// copying all of it, but pages that are zeros in the snapshot are only read (and cleared where
    /// not zero), so the kernel never has to supply them until Python uses them. About half of
    /// Pyodide's memory at start-up is such pages (most of its 10 MiB stack, free heap). Of those,
    /// only the ones Linux's page map shows as ever touched are read (~460 of ~3,800). A snapshot
    /// with a [`MappedImage`] maps its memory over `heap` instead (copy-on-write, its working set
    /// copied). `memory_offset` is where the caller found the memory in the snapshot, as a check.
    /// `pages`: what `heap` holds. The pages of a sandbox restored from the same snapshot before
    /// (see `pages/spare.rs`): a page holding data is compared first and copied only if it
    /// differs (most of them are still the snapshot's), and only the pages it wrote are rewritten,
    /// if the kernel recorded them (`Pages::ReusedWritten`). Every byte is written or checked
    /// otherwise. Returns the address range mapped, if the memory was mapped rather than written.
    pub fn restore_into(
        &self,
        heap: &mut [u8],
        memory_offset: usize,
        pages: Pages,
    ) -> Result<Option<std::ops::Range<usize>>, String> {
        let snapshot = self.bytes();
        if memory_offset != self.memory_offset {
            return Err(format!(
                "snapshot memory offset {memory_offset} does not match {}",
                self.memory_offset
            ));
        }
        let len = snapshot.len() - self.memory_offset;
        if heap.len() < len {
            return Err(format!(
                "WebAssembly memory of {} bytes is smaller than the snapshot's {len}",
                heap.len(),
            ));
        }
        let overlaps = |bytes: &[u8]| {
            let (h, s) = (heap.as_ptr_range(), bytes.as_ptr_range());
            h.start < s.end && s.start < h.end
        };
        if overlaps(snapshot)
            || self
                .overlay
                .as_ref()
                .is_some_and(|o| overlaps(o.base.bytes()))
        {
            return Err("the snapshot cannot be restored over itself".into());
        }
        if let Some(image) = self.image.as_ref().filter(|_| self.maps)
            && image.map_over(heap, len).map_err(|e| e.to_string())?
        {
            let start = heap.as_ptr() as usize;
            return Ok(Some(start..start + len));
        }
        let heap = &mut heap[..len];
        if let (Pages::ReusedWritten(written), None) = (pages, &self.overlay) {
            self.write_written(heap, written);
            return Ok(None);
        }
        let reused = !matches!(pages, Pages::Fresh);
        // (A reused memory's pages are all touched: its page map is not read.)
        let touched = if reused { None } else { touched_pages(heap) };
        let touched = touched.as_deref();
        let Some(overlay) = &self.overlay else {
            self.write_runs(heap, touched, reused);
            return Ok(None);
        };
        // A session image: its base's memory (as far as the image's goes), zeros past it, then the
        // pages the session changed.
        let base_len = overlay.base.bytes().len() - overlay.base.memory_offset;
        overlay.base.write_runs(heap, touched, reused);
        if len > base_len {
            clear_pages(&mut heap[base_len..], base_len / PAGE, touched);
        }
        overlay.delta.apply(heap)?;
        Ok(None)
    }

    /// Makes the byte ranges `written` of `heap` (a memory that held exactly this snapshot's memory
    /// before they were written) the snapshot's again: the data copied, the zeros cleared.
    fn write_written(&self, heap: &mut [u8], written: &[std::ops::Range<usize>]) {
        let memory = &self.bytes()[self.memory_offset..];
        for range in written {
            let end = range.end.min(heap.len());
            let mut at = range.start;
            let mut run = self.runs.partition_point(|r| r.end <= at);
            while at < end
                && let Some(r) = self.runs.get(run)
            {
                let to = r.end.min(end);
                if r.zero {
                    heap[at..to].fill(0);
                } else {
                    heap[at..to].copy_from_slice(&memory[at..to]);
                }
                at = to;
                run += 1;
            }
        }
    }

    /// This snapshot's number in the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Writes this snapshot's linear memory over `heap` as far as `heap` goes (see `restore_into`):
    /// the pages holding data copied (when `reused`, only those that differ), zero pages cleared
    /// where `touched` says they may not be.
    fn write_runs(&self, heap: &mut [u8], touched: Option<&[bool]>, reused: bool) {
        let memory = &self.bytes()[self.memory_offset..];
        for run in &self.runs {
            let end = run.end.min(heap.len());
            if run.start >= end {
                break;
            }
            let target = &mut heap[run.start..end];
            let source = &memory[run.start..end];
            if run.zero {
                clear_pages(target, run.start / PAGE, touched);
            } else if reused {
                // Reading both costs less than writing all: a used sandbox changed a fifth of them.
                for (page, data) in target.chunks_mut(PAGE).zip(source.chunks(PAGE)) {
                    if page != data {
                        page.copy_from_slice(data);
                    }
                }
            } else {
                target.copy_from_slice(source);
            }
        }
    }
}

/// Clears the pages of `target` (page `first` of the memory onwards) that are not zeros; a page
/// `touched` says was never touched is zeros and is not read.
fn clear_pages(target: &mut [u8], first: usize, touched: Option<&[bool]>) {
    for (i, page) in target.chunks_mut(PAGE).enumerate() {
        if touched.is_none_or(|t| t.get(first + i).copied().unwrap_or(true)) && !is_zero(page) {
            page.fill(0);
        }
    }
}

/// A backing store holding `bytes` (a snapshot whose linear memory starts at `offset` and is made of
/// `runs`) in which only the header and the pages that hold data were ever written: its zero pages
/// (about half of the plain snapshot: most of Python's stack, free heap) read as zeros but take no
/// memory, where a copy of `bytes` would keep every one of them resident for the engine's life.
fn sparse_store(
    bytes: &[u8],
    offset: usize,
    runs: &[Run],
) -> (v8::SharedRef<v8::BackingStore>, Option<Mapping>) {
    let (store, mapping) = zeroed_store(bytes.len());
    if let Some(data) = store.data() {
        // SAFETY: the backing store owns `bytes.len()` writable bytes at `data`, which nothing else
        // references yet; every range written lies within `bytes` (`runs` cover `bytes[offset..]`).
        let target =
            unsafe { std::slice::from_raw_parts_mut(data.as_ptr().cast::<u8>(), bytes.len()) };
        target[..offset].copy_from_slice(&bytes[..offset]);
        for run in runs.iter().filter(|run| !run.zero) {
            let (start, end) = (offset + run.start, offset + run.end);
            target[start..end].copy_from_slice(&bytes[start..end]);
        }
    }
    (store.make_shared(), mapping)
}

/// A backing store holding `bytes` (a snapshot whose linear memory starts at `offset` and is made of
/// `runs`) as a mapping of a sealed file that sandboxes map their memory from (see
/// `pages/mapped_image.rs`; the file's zero pages are holes), with the mapping and the file; `None` where
/// the system cannot.
fn mapped_store(
    bytes: &[u8],
    offset: usize,
    runs: &[Run],
) -> Option<(v8::SharedRef<v8::BackingStore>, Mapping, MappedImage)> {
    #[cfg(target_os = "linux")]
    {
        let data = runs
            .iter()
            .filter(|run| !run.zero)
            .map(|run| offset + run.start..offset + run.end);
        let (image, mapping, start) =
            crate::sandbox::pages::mapped_image::lay_out(bytes, offset, data)?;
        // SAFETY: the mapping is returned with the store; `SharedSnapshot` keeps both, and each
        // isolate given an ArrayBuffer over the store keeps the mapping (`array_buffer`).
        let store = unsafe { crate::sandbox::cow::backing_store_of(&mapping, start, bytes.len()) }?;
        Some((store.make_shared(), mapping, image))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (bytes, offset, runs);
        None
    }
}

/// A backing store of `len` zero bytes whose pages the kernel supplies only when touched: an
/// anonymous mapping (returned with it: it must outlive the store) on Linux. (A heap allocation of
/// that size need not be fresh pages: glibc serves large blocks from its heap once earlier ones were
/// freed, and then clears them, ~10 ms for the 30 MB of a session image.)
fn zeroed_store(len: usize) -> (v8::UniqueRef<v8::BackingStore>, Option<Mapping>) {
    #[cfg(target_os = "linux")]
    if let Some(mapping) = Mapping::anonymous(len) {
        // SAFETY: the mapping is returned with the store; `SharedSnapshot` keeps both, and each
        // isolate given an ArrayBuffer over the store keeps the mapping (`array_buffer`).
        return (
            unsafe { crate::sandbox::cow::backing_store(&mapping) },
            Some(mapping),
        );
    }
    let bytes = vec![0u8; len].into_boxed_slice();
    (v8::ArrayBuffer::new_backing_store_from_bytes(bytes), None)
}

/// For each page of `memory` (page-aligned), whether the process may ever have written to it: Linux's
/// page map says whether it is in memory or swapped out; a page that is neither was never touched and
/// reads as zeros. `None` where the system cannot say.
fn touched_pages(memory: &[u8]) -> Option<Vec<bool>> {
    let pages = page_map(memory.as_ptr() as usize, memory.len())?;
    Some(pages.into_iter().map(|page| page.touched()).collect())
}

/// Splits `memory` into maximal runs of all-zero and not-all-zero pages.
fn zero_runs(memory: &[u8]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (i, page) in memory.chunks(PAGE).enumerate() {
        let start = i * PAGE;
        let end = start + page.len();
        let zero = is_zero(page);
        match runs.last_mut() {
            Some(last) if last.zero == zero => last.end = end,
            _ => runs.push(Run { start, end, zero }),
        }
    }
    runs
}

/// Where the plain memory snapshot of an engine came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotOrigin {
    /// Read back from `package_cache_dir` (and booted from).
    ReadBack,
    /// Taken at this start; `on_disk`: stored for the next one.
    Taken { on_disk: bool },
}

#[cfg(test)]
mod tests;
