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
// Functions get the same slots, in the same order, as before.

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
    setWasmTableEntry(ret, convertJsFunctionToWasm(func, sig));
  }
  functionsInTableMap.set(func, ret);
  return ret;
}

// addFunction for a WebAssembly function that an instance made just now exports: it cannot be in the
// table yet, so it takes a free slot without the look-up (which would read the whole table). Pyodide
// adds its call trampoline this way before every start.
function sandboxAddNewFunction(func) {
  var ret = getEmptyTableSlot();
  setWasmTableEntry(ret, func);
  functionsInTableMap ??= new WeakMap();
  functionsInTableMap.set(func, ret);
  return ret;
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
