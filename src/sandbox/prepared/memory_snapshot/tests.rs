//! The shared memory snapshot against snapshots made in the test: how V8 counts it, what the
//! engine keeps of it, and restoring it (equal to a copy, reading only what it must, refusing what
//! does not fit).

use super::*;

/// A snapshot in Pyodide's layout: magic, memory offset, header padding, then `memory`.
fn snapshot(memory: &[u8]) -> SharedSnapshot {
    let mut bytes = vec![0u8; 64];
    bytes[4..8].copy_from_slice(&64u32.to_le_bytes());
    bytes.extend_from_slice(memory);
    SharedSnapshot::new(bytes)
}

/// V8 recognises the stores' empty deleter (`cow::Mapping`): the ArrayBuffer an isolate gets
/// over the engine's snapshot adds nothing to the isolate's external memory, while one that owns
/// as many bytes adds all of them.
#[test]
#[cfg(target_os = "linux")]
fn v8_counts_the_shared_snapshot_as_no_memory_of_the_isolate() {
    crate::sandbox::prepared::startup::init_v8(2048);
    let snap = snapshot(&vec![7u8; 8 << 20]);
    let len = snap.byte_len();
    let mut isolate = v8::Isolate::new(Default::default());
    v8::scope!(let scope, &mut isolate);
    let context = v8::Context::new(scope, Default::default());
    let scope = &mut v8::ContextScope::new(scope, context);
    let before = scope.adjust_amount_of_external_allocated_memory(0);
    let (_shared, mapping) = snap.array_buffer(scope);
    assert!(mapping.is_some(), "the snapshot's bytes are a mapping");
    let after_shared = scope.adjust_amount_of_external_allocated_memory(0);
    let owned = v8::ArrayBuffer::new_backing_store_from_bytes(vec![0u8; len]).make_shared();
    let _owned = v8::ArrayBuffer::with_backing_store(scope, &owned);
    let after_owned = scope.adjust_amount_of_external_allocated_memory(0);
    assert_eq!(after_shared, before, "the shared snapshot is not counted");
    assert_eq!(after_owned - after_shared, len as i64, "owned bytes are");
}

#[test]
fn restoring_equals_copying_whatever_the_memory_held() {
    let mut memory = vec![0u8; 10 * PAGE + 100];
    memory[5] = 1; // page 0: data
    memory[3 * PAGE + 7] = 2; // page 3: data
    memory[10 * PAGE + 99] = 3; // the short last page: data
    let snap = snapshot(&memory);
    assert_eq!(
        snap.runs.iter().map(|r| r.zero).collect::<Vec<_>>(),
        [false, true, false, true, false]
    );
    // Instantiation left bytes where the snapshot has zeros, and the memory is larger.
    let mut heap = vec![0u8; 12 * PAGE];
    heap[PAGE + 1] = 9;
    heap[9 * PAGE] = 9;
    heap[11 * PAGE] = 7;
    snap.restore_into(&mut heap, 64, Pages::Fresh).unwrap();
    assert_eq!(&heap[..memory.len()], &memory[..]);
    assert_eq!(
        heap[11 * PAGE],
        7,
        "bytes beyond the snapshot are left alone"
    );
    // A used sandbox's pages (reused): some of its data pages still the snapshot's, others and
    // its zero pages written over.
    let mut used = heap.clone();
    used[3 * PAGE + 8] = 0x5a; // a data page changed
    used[5] = 1; // a data page as in the snapshot
    used[2 * PAGE..3 * PAGE].fill(0x5a); // a zero page written
    used[10 * PAGE + 50] = 0x5a; // the short last page
    let mut recorded = used.clone();
    snap.restore_into(&mut used, 64, Pages::Reused).unwrap();
    assert_eq!(&used[..memory.len()], &memory[..]);
    // The same, with the pages written recorded (two of them adjacent, one past the snapshot's
    // memory, which is left alone): only they are rewritten.
    recorded[7 * PAGE + 1] = 0x77; // not recorded as written: stays
    let written = [2 * PAGE..4 * PAGE, 10 * PAGE..12 * PAGE];
    let mut expected = memory.clone();
    expected[7 * PAGE + 1] = 0x77;
    snap.restore_into(&mut recorded, 64, Pages::ReusedWritten(&written))
        .unwrap();
    assert_eq!(&recorded[..memory.len()], &expected[..]);
    assert_eq!(recorded[11 * PAGE], 7);
}

#[cfg(target_os = "linux")]
#[test]
fn the_engines_copy_holds_every_byte_but_keeps_no_zero_page() {
    let mut memory = vec![0u8; 64 * PAGE];
    memory[0] = 1;
    memory[40 * PAGE + 5] = 2;
    memory[64 * PAGE - 1] = 3;
    let mut bytes = vec![0u8; 64];
    bytes[4..8].copy_from_slice(&64u32.to_le_bytes());
    bytes[9] = 7;
    bytes.extend_from_slice(&memory);
    let snap = SharedSnapshot::new(bytes.clone());
    // Only the pages holding the header and the three memory pages with data were ever written
    // (each memory page straddles two of the store's, 64 bytes in): 6 of 65. (Checked before
    // the bytes are read: reading a zero page maps the kernel's shared zero page.)
    let touched = touched_pages(snap.bytes()).expect("Linux has a page map");
    assert_eq!(touched.len(), 65);
    assert!(touched.iter().filter(|t| **t).count() <= 6, "{touched:?}");
    assert_eq!(snap.bytes(), &bytes[..]);
}

#[cfg(target_os = "linux")]
#[test]
fn restoring_into_mapped_memory_reads_only_touched_zero_pages_and_still_clears_them() {
    let mut memory = vec![0u8; 64 * PAGE];
    memory[0] = 1;
    memory[40 * PAGE] = 2;
    let snap = snapshot(&memory);
    let mapped = crate::sandbox::pages::testing::Memory::new(80);
    let heap = &mut *mapped.0;
    // Pages 10 and 50 were written (as constructors might), page 20 only read; the rest untouched.
    heap[10 * PAGE + 3] = 9;
    heap[50 * PAGE] = 9;
    assert_eq!(heap[20 * PAGE], 0);
    let touched = touched_pages(&heap[..memory.len()]).expect("Linux has a page map");
    assert!(touched[10] && touched[50]);
    assert!(!touched[30] && !touched[63]);
    snap.restore_into(heap, 64, Pages::Fresh).unwrap();
    assert_eq!(&heap[..memory.len()], &memory[..]);
}

#[test]
fn restoring_refuses_a_small_memory_or_a_wrong_offset() {
    let snap = snapshot(&[1u8; 2 * PAGE]);
    assert!(
        snap.restore_into(&mut vec![0u8; PAGE], 64, Pages::Fresh)
            .is_err()
    );
    assert!(
        snap.restore_into(&mut vec![0u8; 2 * PAGE], 60, Pages::Fresh)
            .is_err()
    );
}
