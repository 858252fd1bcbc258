// Inserted into Pyodide's pyodide.asm.mjs by src/sandbox/modules.rs: the main module's exports enter
// Emscripten's symbol table (wasmImports) when a name is first looked up, instead of all at start-up.
//
// receiveInstance() calls mergeLibSymbols(mainExports, "main"), which copies each of the main
// module's 8,556 exports into wasmImports unless a JavaScript library function of that name is
// already there: ~4 ms per sandbox for a table that only dynamic linking (a package's .so, dlsym)
// reads afterwards. Here wasmImports becomes a proxy over the same object. Reading, testing or
// describing a name copies that export in first, with the value the merge would have given it;
// listing the keys (dlsym does) copies in all the rest first; writes go to the object as before.
// Keys are only ever appended, so a key's index never changes once dlsym has seen it.
function sandboxLazyImports(imports, mainExports) {
  var merged = false;
  var copyIn = (name) => {
    if (merged || typeof name != "string") {
      return;
    }
    var existing = imports[name];
    if (existing && !existing.stub) {
      return;
    }
    // mergeLibSymbols's aliases: a main module's `__main_argc_argv` is also `main`, and back.
    var source = Object.hasOwn(mainExports, name)
      ? name
      : name == "main"
        ? "__main_argc_argv"
        : name == "__main_argc_argv"
          ? "main"
          : undefined;
    if (source !== undefined && Object.hasOwn(mainExports, source)) {
      imports[name] = mainExports[source];
    }
  };
  return new Proxy(imports, {
    get(target, name) {
      copyIn(name);
      return Reflect.get(target, name);
    },
    has(target, name) {
      copyIn(name);
      return Reflect.has(target, name);
    },
    getOwnPropertyDescriptor(target, name) {
      copyIn(name);
      return Reflect.getOwnPropertyDescriptor(target, name);
    },
    ownKeys(target) {
      if (!merged) {
        merged = true;
        mergeLibSymbols(mainExports, "main");
      }
      return Reflect.ownKeys(target);
    },
  });
}
