//! One sandbox's memory budget outside the V8 heap, enforced in Rust: every ArrayBuffer V8 allocates
//! for the isolate (typed arrays, MEMFS file data, Pyodide's conversions) goes through this isolate's
//! [`allocator`], which refuses what would take the sandbox past its budget; ArrayBuffers that ops
//! make from Rust bytes are charged the same way ([`MemoryBudget::array_buffer`]); and Python's
//! WebAssembly memory counts with its current size (it grows in place; the watchdog polls it). User
//! code cannot create another WebAssembly memory (see `wasm.rs`). Past the budget the isolate is
//! terminated and the call ends with `MemoryLimitExceeded`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use deno_core::v8;

/// The budget of one sandbox, shared with its allocator, its ops and its watchdog.
pub(crate) struct MemoryBudget {
    /// The most bytes ArrayBuffers and the WebAssembly memory may hold together.
    limit: usize,
    /// Bytes of live ArrayBuffers allocated by the allocator or charged by ops.
    buffers: AtomicUsize,
    /// Python's linear memory, once Pyodide has instantiated it.
    wasm: OnceLock<WasmMemory>,
    /// The budget was exceeded (and the isolate told to terminate).
    exceeded: AtomicBool,
    /// Terminates the isolate when the budget is exceeded.
    isolate: OnceLock<v8::IsolateHandle>,
    /// What must outlive the isolate (see `keep_until_disposed`).
    kept: std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>,
}

/// The backing store of Python's WebAssembly memory, read for its size from any thread.
struct WasmMemory(v8::SharedRef<v8::BackingStore>);

// SAFETY: only `byte_length()` is called on the store from other threads: V8 keeps a backing store's
// length in an atomic (WebAssembly memories grow in place and update it), and the shared pointer's
// reference count is atomic. The store's bytes are never touched through this handle.
unsafe impl Send for WasmMemory {}
// SAFETY: as for `Send`: through `&WasmMemory` only the atomic `byte_length()` is read.
unsafe impl Sync for WasmMemory {}

impl MemoryBudget {
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit_bytes,
            buffers: AtomicUsize::new(0),
            wasm: OnceLock::new(),
            exceeded: AtomicBool::new(false),
            isolate: OnceLock::new(),
            kept: Default::default(),
        })
    }

    /// Keeps `owner` until the sandbox's isolate is disposed: the budget outlives the isolate (the
    /// isolate's ArrayBuffer allocator holds it to the end, and the sandbox's own field is dropped
    /// after its runtime). For memory an isolate's backing stores point to without owning it.
    pub fn keep_until_disposed(&self, owner: Box<dyn std::any::Any + Send + Sync>) {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(owner);
    }

    /// The isolate to terminate when the budget is exceeded.
    pub fn watch(&self, isolate: v8::IsolateHandle) {
        let _ = self.isolate.set(isolate);
    }

    /// Counts `memory` (Python's linear memory) from now on; only the first one counts.
    pub fn set_wasm_memory(&self, memory: v8::SharedRef<v8::BackingStore>) {
        let _ = self.wasm.set(WasmMemory(memory));
    }

    /// Where Python's WebAssembly memory starts (its address), once it is counted.
    pub fn wasm_memory_data(&self) -> Option<usize> {
        self.wasm
            .get()
            .and_then(|m| m.0.data())
            .map(|d| d.as_ptr() as usize)
    }

    fn wasm_bytes(&self) -> usize {
        self.wasm.get().map_or(0, |m| m.0.byte_length())
    }

    /// Bytes in use: live ArrayBuffers plus the WebAssembly memory.
    pub fn used(&self) -> usize {
        self.buffers.load(Ordering::SeqCst) + self.wasm_bytes()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `bytes` more would still fit.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.used().saturating_add(bytes) <= self.limit
    }

    /// Whether the budget was exceeded.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::SeqCst)
    }

    /// Marks the budget exceeded and terminates the isolate (at its next interrupt check).
    pub fn exceed(&self) {
        self.exceeded.store(true, Ordering::SeqCst);
        if let Some(isolate) = self.isolate.get() {
            isolate.terminate_execution();
        }
    }

    /// `bytes` charged for as long as the returned value lives (what Rust holds for the sandbox,
    /// such as a response body not yet read), or `None` (and the budget exceeded) when they do not
    /// fit.
    pub fn hold(self: &Arc<Self>, bytes: usize) -> Option<Held> {
        self.charge(bytes).then(|| Held {
            budget: self.clone(),
            bytes,
        })
    }

    /// Charges `bytes`, or refuses (and exceeds the budget) when they do not fit.
    fn charge(&self, bytes: usize) -> bool {
        let wasm = self.wasm_bytes();
        let charged = self
            .buffers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
                let total = current.checked_add(bytes)?;
                (total.saturating_add(wasm) <= self.limit).then_some(total)
            })
            .is_ok();
        if !charged {
            self.exceed();
        }
        charged
    }

    fn release(&self, bytes: usize) {
        let _ = self
            .buffers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
                Some(current.saturating_sub(bytes))
            });
    }

    /// A new ArrayBuffer of the calling isolate that owns `bytes`, charged to this budget until V8
    /// frees it; a `RangeError` (and the budget exceeded) when they do not fit.
    pub fn array_buffer<'s>(
        self: &Arc<Self>,
        scope: &v8::PinScope<'s, '_>,
        bytes: Vec<u8>,
    ) -> Result<v8::Local<'s, v8::ArrayBuffer>, deno_error::JsErrorBox> {
        let len = bytes.len();
        if !self.charge(len) {
            return Err(deno_error::JsErrorBox::range_error(format!(
                "{len} bytes do not fit the sandbox's memory budget"
            )));
        }
        let data = Box::into_raw(bytes.into_boxed_slice());
        let owner = Arc::into_raw(self.clone());
        // SAFETY: `data` is a leaked boxed slice of `len` bytes and `owner` a leaked Arc; V8 calls
        // `free_charged` exactly once, with both, when the buffer's last user is gone, and nothing
        // else frees them.
        let store = unsafe {
            v8::ArrayBuffer::new_backing_store_from_ptr(
                data.cast::<c_void>(),
                len,
                free_charged,
                owner.cast_mut().cast::<c_void>(),
            )
        };
        Ok(v8::ArrayBuffer::with_backing_store(
            scope,
            &store.make_shared(),
        ))
    }
}

/// Bytes charged to a budget until this is dropped (see [`MemoryBudget::hold`]).
pub(crate) struct Held {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

unsafe extern "C" fn free_charged(data: *mut c_void, len: usize, owner: *mut c_void) {
    // SAFETY: the pointers `MemoryBudget::array_buffer` leaked, given back once by V8.
    unsafe {
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            data.cast::<u8>(),
            len,
        )));
        let budget = Arc::from_raw(owner.cast_const().cast::<MemoryBudget>());
        budget.release(len);
    }
}

/// The ArrayBuffer allocator of a sandbox isolate: `calloc`/`malloc`, charged to `budget`.
pub(crate) fn allocator(budget: &Arc<MemoryBudget>) -> v8::UniqueRef<v8::Allocator> {
    static VTABLE: v8::RustAllocatorVtable<MemoryBudget> = v8::RustAllocatorVtable {
        allocate,
        allocate_uninitialized,
        free,
        drop: drop_budget,
    };
    // SAFETY: the handle is a leaked Arc, taken back by `drop_budget` when V8 drops the allocator
    // (after the last ArrayBuffer it allocated is freed).
    unsafe { v8::new_rust_allocator(Arc::into_raw(budget.clone()), &VTABLE) }
}

/// Memory for one ArrayBuffer; at least one byte, so that an empty buffer still has an address.
fn reserve(budget: &MemoryBudget, len: usize, zeroed: bool) -> *mut c_void {
    if !budget.charge(len) {
        return std::ptr::null_mut();
    }
    // SAFETY: plain C allocation of at least one byte; the result is checked.
    let data = unsafe {
        if zeroed {
            libc::calloc(len.max(1), 1)
        } else {
            libc::malloc(len.max(1))
        }
    };
    if data.is_null() {
        budget.release(len);
    }
    data
}

unsafe extern "C" fn allocate(budget: &MemoryBudget, len: usize) -> *mut c_void {
    reserve(budget, len, true)
}

unsafe extern "C" fn allocate_uninitialized(budget: &MemoryBudget, len: usize) -> *mut c_void {
    reserve(budget, len, false)
}

unsafe extern "C" fn free(budget: &MemoryBudget, data: *mut c_void, len: usize) {
    // SAFETY: `data` came from `reserve` (calloc/malloc) and V8 frees it once.
    unsafe { libc::free(data) };
    budget.release(len);
}

unsafe extern "C" fn drop_budget(budget: *const MemoryBudget) {
    // SAFETY: the Arc leaked in `allocator`, given back once.
    drop(unsafe { Arc::from_raw(budget) });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_within_the_limit_and_refuses_beyond_it() {
        let budget = MemoryBudget::new(1000);
        assert!(budget.charge(600));
        assert!(budget.has_room(400) && !budget.has_room(401));
        assert!(!budget.exceeded());
        assert!(!budget.charge(401), "over the limit");
        assert!(budget.exceeded());
        assert_eq!(budget.used(), 600, "a refused charge takes nothing");
        budget.release(600);
        assert_eq!(budget.used(), 0);
        assert!(!budget.charge(usize::MAX), "no overflow");
    }

    #[test]
    fn the_allocator_functions_charge_and_release() {
        let budget = MemoryBudget::new(4096);
        // SAFETY: the allocator functions called as V8 would, each block freed once.
        unsafe {
            let a = allocate(&budget, 4000);
            assert!(!a.is_null());
            assert_eq!(budget.used(), 4000);
            assert!(allocate_uninitialized(&budget, 100).is_null());
            free(&budget, a, 4000);
            assert_eq!(budget.used(), 0);
            let empty = allocate(&budget, 0);
            assert!(!empty.is_null());
            free(&budget, empty, 0);
        }
    }
}
