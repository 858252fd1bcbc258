// Shared libraries in a memory snapshot (pyodide.rs hands over the record; modules/mod.rs adds the
// hooks to Emscripten's loadWebAssemblyModule that call `Module.sandboxDylink`).
//
// A package's extension modules (`.so` files) live outside the memory image: each is a WebAssembly
// instance whose data sits at a memory base in the linear memory and whose functions sit at a table
// base in the function table. A snapshot taken after `import pandas` holds their data and every pointer
// to their functions, but not the instances. The snapshot maker therefore records, for every library
// in the order it was allocated, its bases, the table's length and free slots just before it, and its
// dlopen handles; a restored sandbox instantiates the same libraries (compiled once per process) at
// the same bases in the same order, right after the memory image is written, and skips their
// relocations and constructors, whose effects the image already holds. Anything that does not match
// the record throws, and the engine falls back to the snapshot without pre-imported packages.

/**
 * Starts recording the shared libraries `Module` loads, after those of `base` (the record this
 * sandbox was relinked from, if any: a session's record goes on from its snapshot's); returns the
 * function that gives the record (to be taken right before the memory snapshot) and, unless called
 * with `stop = false` (a session saved now and again later), ends the recording.
 */
export function recordDylibs(Module, base = null) {
  const loads = base ? base.loads.map((load) => ({ ...load })) : [];
  const open = [];
  const baseTable = base ? base.baseTable : Module.wasmTable.length;
  Module.sandboxDylink = {
    memoryBase(libName, metadata, tableLength) {
      const load = {
        libName,
        memorySize: metadata.memorySize,
        tableSize: metadata.tableSize,
        tableLenBefore: tableLength,
        freeBefore: [...Module.freeTableIndexes],
      };
      loads.push(load);
      open.push(load);
      return undefined;
    },
    allocated(_libName, _metadata, memoryBase, tableBase) {
      const load = open.at(-1);
      load.memoryBase = memoryBase;
      load.tableBase = tableBase;
    },
    loaded(_libName, _exports, tableLength) {
      open.pop().tableLenAfter = tableLength;
    },
  };
  const hooks = Module.sandboxDylink;
  return (stop = true) => {
    if (stop && Module.sandboxDylink === hooks) delete Module.sandboxDylink;
    const handles = {};
    for (const [handle, dso] of Object.entries(Module.LDSO.loadedLibsByHandle)) {
      if (Number(handle) !== 0) (handles[dso.name] ??= []).push(Number(handle));
    }
    const libs = {};
    for (const load of loads) {
      const dso = Module.LDSO.loadedLibsByName[load.libName];
      if (!dso) throw new Error(`${load.libName} was loaded but is not in the linker's list`);
      // JSON has no Infinity: null stands for "never unloaded".
      libs[load.libName] = {
        global: Boolean(dso.global),
        refcount: Number.isFinite(dso.refcount) ? dso.refcount : null,
      };
    }
    return {
      baseTable,
      finalTable: Module.wasmTable.length,
      slots: functionSlots(Module),
      freeAfter: [...Module.freeTableIndexes],
      loads: loads.map((load) => ({ ...load })),
      libs,
      handles,
      modules: base?.modules ?? [],
    };
  };
}

/**
 * Each GOT entry's value that may be a table slot (a function's; a data symbol's address may pass too,
 * and is never asked for), by symbol: relinking gives the same functions the same slots again
 * without reading the function table (`sandboxAddExport` in the served pyodide.asm.mjs checks each
 * slot against the table before it uses it).
 */
function functionSlots(Module) {
  const length = Module.wasmTable.length;
  const slots = {};
  for (const [name, entry] of Object.entries(Module.GOT ?? {})) {
    const slot = entry?.value;
    if (Number.isInteger(slot) && slot > 0 && slot < length) slots[name] = slot;
  }
  return slots;
}

/**
 * Instantiates the recorded libraries again, in a sandbox whose memory was just restored from the
 * snapshot they were recorded for. `compiled(path)` gives each library's WebAssembly module.
 */
export function relinkDylibs(Module, record, compiled) {
  const table = Module.wasmTable;
  if (table.length > record.baseTable) {
    throw new Error(
      `the function table has ${table.length} slots before relinking, more than the ${record.baseTable} recorded`,
    );
  }
  let current = null;
  let saved = null;
  const slots = record.slots ?? {};
  Module.sandboxDylink = {
    slotOf: (symName) => (Object.hasOwn(slots, symName) ? slots[symName] : undefined),
    memoryBase(libName, metadata, tableLength) {
      if (
        libName !== current.libName || metadata.memorySize !== current.memorySize ||
        metadata.tableSize !== current.tableSize || tableLength !== current.tableLenBefore
      ) {
        throw new Error(`${libName} does not relink as recorded`);
      }
      // Instantiation writes the library's initial data over what the snapshot holds there.
      saved = current.memorySize
        ? Module.HEAPU8.slice(current.memoryBase, current.memoryBase + current.memorySize)
        : null;
      return current.memoryBase;
    },
    instantiated(_libName, _metadata, memoryBase) {
      if (saved) Module.HEAPU8.set(saved, memoryBase);
      saved = null;
    },
    skipInit: () => true,
    loaded(libName, _exports, tableLength) {
      if (tableLength !== current.tableLenAfter) {
        throw new Error(`${libName} took other function-table slots than recorded`);
      }
    },
  };
  try {
    for (const load of record.loads) {
      current = load;
      if (table.length > load.tableLenBefore) {
        throw new Error(`the function table is longer than recorded before ${load.libName}`);
      }
      if (table.length < load.tableLenBefore) table.grow(load.tableLenBefore - table.length);
      // Free slots (ctypes' closures freed before the library loaded) are reused as they were.
      Module.freeTableIndexes.length = 0;
      Module.freeTableIndexes.push(...load.freeBefore);
      const lib = record.libs[load.libName] ?? { global: false, refcount: 1 };
      const dso = Module.newDSO(load.libName, undefined, "loading");
      dso.refcount = lib.refcount ?? Infinity;
      dso.global = lib.global;
      const localScope = lib.global ? undefined : {};
      dso.exports = Module.loadWebAssemblyModule(
        compiled(load.libName),
        { global: lib.global, nodelete: lib.refcount === null },
        load.libName,
        localScope,
        undefined,
      );
      if (lib.global) Module.mergeLibSymbols(dso.exports, load.libName);
      for (const handle of record.handles[load.libName] ?? []) {
        Module.LDSO.loadedLibsByHandle[handle] = dso;
      }
      // A library that needs this one finds it by file name (the package files are not in MEMFS yet).
      const base = load.libName.slice(load.libName.lastIndexOf("/") + 1);
      Module.LDSO.loadedLibsByName[base] ??= dso;
    }
    if (table.length < record.finalTable) table.grow(record.finalTable - table.length);
    if (table.length !== record.finalTable) {
      throw new Error("the function table does not end as recorded");
    }
    Module.freeTableIndexes.length = 0;
    Module.freeTableIndexes.push(...record.freeAfter);
  } finally {
    delete Module.sandboxDylink;
  }
}
