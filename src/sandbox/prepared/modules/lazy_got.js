// Inserted into Pyodide's pyodide.asm.mjs (Emscripten's dynamic linker) by src/sandbox/modules.rs:
// a lazy Global Offset Table for the main module.
//
// Emscripten's receiveInstance() calls updateGOT(mainExports), which creates a GOT entry for every one
// of the main module's ~8,800 exports, adding ~5,000 functions to the table one slot at a time, and
// loadDylibs() then walks all of them. Only the ~280 entries the main module imports itself are needed
// at start-up; the rest matter only when a side module (a package's .so) imports or exports one of
// those symbols. Here the start-up fills just the entries that already exist, and every other main
// export gets its entry — with the same value eager linking would give it — the first time a side
// module asks for it or links against it. Symbol resolution is unchanged: a main-module export still
// wins over a side module's export of the same name. Table slots are assigned in a different (but
// deterministic) order; the snapshot's key covers the served source, so it changes with this file.
var lazyGOTMainExports = null;
// What eager linking stores in a GOT entry for an export: a function's table slot (added if need be)
// or a data symbol's address; undefined for anything else.
var lazyGOTValue = (symName, value) => {
  if (typeof value == "function") {
    return typeof sandboxAddExport == "function"
      ? sandboxAddExport(symName, value)
      : addFunction(value);
  }
  return typeof value.value == "number" ? value : undefined;
};
var materializeGOT = (symName) => {
  if (
    !lazyGOTMainExports ||
    GOT[symName] ||
    !Object.hasOwn(lazyGOTMainExports, symName) ||
    isInternalSym(symName)
  ) {
    return GOT[symName];
  }
  var newValue = lazyGOTValue(symName, lazyGOTMainExports[symName]);
  if (newValue === undefined) {
    return undefined;
  }
  GOT[symName] = new WebAssembly.Global({ value: "i32", mutable: true });
  GOT[symName].value = newValue;
  return GOT[symName];
};
// Fills the GOT entries the main module imports itself that it also exports. (In the pinned Pyodide
// none of its ~280 GOT imports is one of its own exports: Emscripten's reportUndefinedSymbols()
// resolves them all from the JavaScript library; this keeps eager linking's result if that changes.)
var initLazyGOT = (exports) => {
  lazyGOTMainExports = exports;
  for (var symName of Object.keys(GOT)) {
    var entry = GOT[symName];
    if (entry.value != -1 || !Object.hasOwn(exports, symName) || isInternalSym(symName)) {
      continue;
    }
    var newValue = lazyGOTValue(symName, exports[symName]);
    if (newValue !== undefined) {
      entry.value = newValue;
    }
  }
};
