// Inserted into Pyodide's pyodide.asm.mjs by src/sandbox/modules.rs: Emscripten's addFunction and
// getFunctionAddress without most of their start-up cost.
//
// At start-up, reportUndefinedSymbols() gives each of the ~280 JavaScript library functions that the
// main module imports through its GOT a table slot with addFunction(). Emscripten's version
// - looks each function up in a map of the whole function table, built on first use by reading every
//   slot (thousands of WebAssembly function objects made only to be compared), although a JavaScript
//   function can only be in the table if addFunction put it there, wrapped, and recorded it in the map;
// - then tries to store the JavaScript function itself in the table, which always throws;
// - and compiles a new one-function WebAssembly module to wrap each function, although the module
//   depends only on the signature.
// Here the table is read only when a function that may be WebAssembly is looked up, JavaScript
// functions go straight to their wrapper, and wrapper modules are compiled once per signature.
// Pyodide's call trampoline, exported by an instance made just before, is added without a look-up.
// The start-up's JavaScript functions are wrapped all at once: one WebAssembly instance for ~260.
// A sandbox relinking a snapshot's shared libraries gives their functions the slots the snapshot
// recorded, and a library's slots enter the map only once the table has been read (the read covers
// them): relinking reads no table at all. Functions get the same slots, in the same order, as before.

var sandboxTableRead = false;
var sandboxWrapperModules = new Map();

// False for a function that shows its JavaScript source: it cannot be a WebAssembly function.
function sandboxMayBeWasmFunction(func) {
  return Function.prototype.toString.call(func).endsWith("[native code] }");
}

function sandboxGetFunctionAddress(func) {
  functionsInTableMap ??= new WeakMap();
  if (!sandboxTableRead && sandboxMayBeWasmFunction(func)) {
    sandboxTableRead = true;
    updateTableMap(0, wasmTable.length);
  }
  return functionsInTableMap.get(func) || 0;
}

function sandboxAddFunction(func, sig) {
  var rtn = getFunctionAddress(func);
  if (rtn) {
    return rtn;
  }
  var ret = getEmptyTableSlot();
  var stored = false;
  if (sandboxMayBeWasmFunction(func)) {
    try {
      setWasmTableEntry(ret, func);
      stored = true;
    } catch (err) {
      if (!(err instanceof TypeError)) {
        throw err;
      }
    }
  }
  if (!stored) {
    setWasmTableEntry(ret, sandboxBatchWrappers?.get(func) ?? convertJsFunctionToWasm(func, sig));
  }
  functionsInTableMap.set(func, ret);
  return ret;
}

// addFunction for a WebAssembly function that an instance made just now exports: it cannot be in the
// table yet, so it takes a free slot without the look-up (which would read the whole table). Pyodide
// adds its call trampoline this way before every start. (Until the table is read, the map need not
// hold WebAssembly functions: the read finds them in the table.)
function sandboxAddNewFunction(func) {
  var ret = getEmptyTableSlot();
  setWasmTableEntry(ret, func);
  functionsInTableMap ??= new WeakMap();
  functionsInTableMap.set(func, ret);
  return ret;
}

// addFunction(func, sig) for `func`, a WebAssembly function exported as `symName`, without reading the
// function table where a sandbox relinking a snapshot's shared libraries (ops/dylink.js) knows the
// slot the snapshot's maker gave that symbol (`Module.sandboxDylink.slotOf`): that slot if the table
// holds `func` there (addFunction would have found it there), or a new slot if the recorded one is
// the one addFunction would have taken next (it found `func` nowhere). Anything else, or once the
// table has been read anyway, is addFunction's. Relinking pandas and matplotlib would otherwise read
// the whole table (tens of thousands of slots, a WebAssembly function object made for each) and
// then each library's slots, for answers the snapshot already holds.
function sandboxAddExport(symName, func, sig) {
  var slot = sandboxTableRead ? undefined : Module["sandboxDylink"]?.slotOf?.(symName);
  if (slot !== undefined && sandboxMayBeWasmFunction(func)) {
    if (slot < wasmTable.length && wasmTable.get(slot) === func) {
      return slot;
    }
    var next = freeTableIndexes.length ? freeTableIndexes[freeTableIndexes.length - 1] : wasmTable.length;
    if (slot === next) {
      return sandboxAddNewFunction(func);
    }
  }
  return addFunction(func, sig);
}

// While reportUndefinedSymbols() runs: the WebAssembly wrapper of each JavaScript function it is
// going to add, all made by one instantiation (see sandboxWrapAll).
var sandboxBatchWrappers = null;

// GOT entries made unresolved (value -1, by a module's import of a symbol nothing defines yet) since
// the last reportUndefinedSymbols(), in the order they were made: the only ones it has to resolve,
// since each run leaves none unresolved (or throws, and the rest wait for the next run). (Declared
// without a value: the first entries are made while this module function is still being evaluated.)
var sandboxUnresolvedGOT;

// Emscripten's reportUndefinedSymbols(), with the wrappers of the JavaScript functions it adds made
// beforehand in one go, over the entries left unresolved since its last run instead of the whole GOT
// (thousands of entries, walked after every shared library a package loads: ~30 ms for pandas and
// matplotlib). It resolves the same entries in the same order (the GOT's), so every function gets
// the slot it got before.
function sandboxReportUndefinedSymbols() {
  var pending = (sandboxUnresolvedGOT ?? []).filter((symName) => GOT[symName].value == -1);
  sandboxUnresolvedGOT = pending;
  var funcs = [];
  var seen = new Set();
  for (var symName of pending) {
    var value = resolveGlobalSymbol(symName, true).sym;
    if (
      typeof value == "function" &&
      typeof value.sig == "string" &&
      !seen.has(value) &&
      !sandboxMayBeWasmFunction(value) &&
      !functionsInTableMap?.has(value)
    ) {
      seen.add(value);
      funcs.push([value, value.sig]);
    }
  }
  try {
    sandboxBatchWrappers = funcs.length ? sandboxWrapAll(funcs) : null;
  } catch {
    // Each function is then wrapped on its own, as Emscripten does (and fails as it would).
    sandboxBatchWrappers = null;
  }
  try {
    for (var i = 0; i < pending.length; i++) {
      var name = pending[i];
      var entry = GOT[name];
      if (entry.value != -1) {
        continue;
      }
      var sym = resolveGlobalSymbol(name, true).sym;
      if (!sym && !entry.required) {
        entry.value = 0;
        continue;
      } else if (!sym) {
        sandboxUnresolvedGOT = pending.slice(i);
        throw new Error(`Dynamic linking error: undefined symbol '${name}'`);
      }
      if (typeof sym == "function") {
        entry.value = sandboxAddExport(name, sym, sym.sig);
      } else if (typeof sym == "number") {
        entry.value = sym;
      } else if (typeof sym.value == "number") {
        entry.value = sym;
      } else {
        sandboxUnresolvedGOT = pending.slice(i);
        throw new Error(`bad export type for '${name}': ${typeof sym} (${sym})`);
      }
    }
    sandboxUnresolvedGOT = [];
  } finally {
    sandboxBatchWrappers = null;
  }
}

// What convertJsFunctionToWasm(func, sig) returns, for each [func, sig] of `funcs`, as a Map, or
// null where the host does not provide the module: one module (see src/sandbox/wrappers.rs) imports
// every function with its signature and exports it again, which makes each export a WebAssembly
// function that calls it. One instantiation instead of one per function.
function sandboxWrapAll(funcs) {
  var module = Module["sandboxWrapperModule"]?.(funcs.map(([, sig]) => sig).join(","));
  if (!module) {
    return null;
  }
  var env = {};
  funcs.forEach(([func], i) => {
    env[i] = func;
  });
  var instance = new WebAssembly.Instance(module, { e: env });
  return new Map(funcs.map(([func], i) => [func, instance.exports[i]]));
}

// convertJsFunctionToWasm's module for `sig`, whose bytes are `bytes`.
function sandboxWrapperModule(sig, bytes) {
  var module = sandboxWrapperModules.get(sig);
  if (!module) {
    module = new WebAssembly.Module(bytes);
    sandboxWrapperModules.set(sig, module);
  }
  return module;
}
