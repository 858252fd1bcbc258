// Inserted into Pyodide's pyodide.asm.mjs by src/sandbox/modules.rs: applySignatureConversions()
// without its copy of every export.
//
// Emscripten copies the instance's ~8,600 exports into a new object (the instance's own exports
// object is frozen) only to replace the ~20 that return pointers with wrappers. Here the new object
// inherits the exports and has own, writable properties only for the names the function replaces
// (modules.rs reads them out of its source). Every export reads as before; Emscripten's code only
// reads and writes named exports of this object, it never lists them.
function sandboxExportsView(exports, names) {
  var view = Object.create(exports);
  for (var name of names) {
    Object.defineProperty(view, name, {
      value: exports[name],
      writable: true,
      enumerable: true,
      configurable: true,
    });
  }
  return view;
}
