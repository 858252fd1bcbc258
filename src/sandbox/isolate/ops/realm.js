// The sandbox's realm (realm.rs checks it from Rust when a boot ends): sealed before Pyodide starts
// (`sealRealm`: only the globals Rust lists, WebAssembly through Rust, the prototypes closed), and
// locked down once it has (`lockDown`: the boot's own globals and Pyodide's native file-system
// mounts gone, MEMFS held to the memory budget).

import { core, primordials } from "ext:core/mod.js";

const { op_sandbox_compile_wasm, op_sandbox_memory_room } = core.ops;
const { ReflectDeleteProperty, ReflectOwnKeys, SafeSet } = primordials;

/**
 * Seals a sandbox's realm before Pyodide starts: every global that `allowed` (Rust's list of what a
 * user realm has, `sandbox/image.rs`) does not name is removed (deno_core's `Deno`, `__bootstrap`
 * and the like), and WebAssembly is routed through Rust. A session image's Python runs while
 * Pyodide restores it (Pyodide imports from the restored heap), so from here on nothing is reachable
 * that a user realm does not have. Rust checks the realm again when the boot ends (`realm.rs`).
 */
export function sealRealm(allowed) {
  removeUnlisted(allowed);
  guardWebAssembly();
  // No new properties on the two prototypes every array and object inherits from: deno_core builds
  // arrays with index writes that would run a setter defined there (an index accessor on
  // Array.prototype re-entering a promise-rejection callback aborts the process).
  Object.preventExtensions(Array.prototype);
  Object.preventExtensions(Object.prototype);
}

/** Removes every own global (string-keyed) that `allowed` does not name. */
function removeUnlisted(allowed) {
  const keep = new SafeSet(allowed);
  for (const name of ReflectOwnKeys(globalThis)) {
    if (typeof name === "string" && !keep.has(name)) ReflectDeleteProperty(globalThis, name);
  }
}

/**
 * Removes what the boot itself defined on the global object (the shell functions Pyodide read its
 * files with) and anything else not on `allowed`, Pyodide's native file-system mounts, and makes
 * MEMFS fail writes past the memory budget with ENOSPC.
 */
export function lockDown(pyodide, allowed) {
  removeMemoryConstructor();
  limitFileStorage(pyodide.FS);
  removeUnlisted(allowed);
  for (const api of ["mountNodeFS", "mountNativeFS"]) {
    delete pyodide[api];
  }
  const filesystems = pyodide.FS.filesystems;
  for (const name of Object.keys(filesystems)) {
    if (name !== "MEMFS") delete filesystems[name];
  }
}

/**
 * After boot V8 compiles WebAssembly only inside `op_sandbox_compile_wasm` (Rust refuses every other
 * compilation; see wasm.rs): `WebAssembly.Module`, `compile` and `instantiate` go there, so that
 * Pyodide's dynamic linker (a package's .so files) and user code keep working with modules that
 * import the interpreter's memory, and a module that defines a memory of its own is refused. The
 * `WebAssembly.Memory` constructor goes away: the sandbox has exactly one memory, Python's, which its
 * memory budget counts.
 */
function guardWebAssembly() {
  const WA = WebAssembly;
  const OriginalModule = WA.Module;
  const CompileError = WA.CompileError;
  const instantiate = WA.instantiate;
  const bytesOf = (source) =>
    ArrayBuffer.isView(source)
      ? new Uint8Array(source.buffer, source.byteOffset, source.byteLength)
      : new Uint8Array(source);
  const compile = (source) => {
    const bytes = bytesOf(source);
    try {
      return op_sandbox_compile_wasm(bytes);
    } catch (error) {
      throw new CompileError(String(error?.message ?? error));
    }
  };
  function Module(source) {
    if (new.target === undefined) {
      throw new TypeError("WebAssembly.Module must be invoked with 'new'");
    }
    return compile(source);
  }
  Module.prototype = OriginalModule.prototype;
  for (const name of ["exports", "imports", "customSections"]) {
    Module[name] = OriginalModule[name];
  }
  Object.defineProperty(OriginalModule.prototype, "constructor", {
    value: Module,
    writable: true,
    configurable: true,
    enumerable: false,
  });
  WA.Module = Module;
  WA.compile = async (source) => compile(source);
  WA.instantiate = async (source, imports) => {
    if (source instanceof OriginalModule) return instantiate(source, imports);
    const module = compile(source);
    return { module, instance: await instantiate(module, imports) };
  };
  // While Pyodide starts it makes one memory of one page (a shared one to sleep on); then the
  // constructor goes (see `removeMemoryConstructor`). Until then, at most that.
  const OriginalMemory = WA.Memory;
  let memoriesLeft = 1;
  function Memory(descriptor) {
    if (new.target === undefined) throw new TypeError("WebAssembly.Memory must be invoked with 'new'");
    const pages = Number(descriptor?.maximum);
    if (memoriesLeft <= 0 || !(pages <= 1)) {
      throw new TypeError("a sandbox has exactly one WebAssembly memory, Python's");
    }
    memoriesLeft--;
    return new OriginalMemory({ initial: 1, maximum: 1, shared: descriptor.shared === true });
  }
  Memory.prototype = OriginalMemory.prototype;
  Object.defineProperty(OriginalMemory.prototype, "constructor", {
    value: Memory,
    writable: true,
    configurable: true,
    enumerable: false,
  });
  WA.Memory = Memory;
  removeMemoryConstructor = () => {
    delete WA.Memory;
    delete OriginalMemory.prototype.constructor;
  };
}

/** Removes the `WebAssembly.Memory` constructor, once Pyodide has started (see `guardWebAssembly`). */
let removeMemoryConstructor = null;

/** ENOSPC in Emscripten's (WASI's) errno numbering. */
const ENOSPC = 51;

/**
 * A MEMFS file grows only while the sandbox's memory budget has room; past it the write fails with
 * ENOSPC (Python: OSError [Errno 28]). The budget itself is enforced by Rust's allocator whatever
 * happens here; this turns its end into an error the code can handle.
 */
function limitFileStorage(FS) {
  const MEMFS = FS.filesystems.MEMFS;
  const room = (node, end) => {
    const have = node.contents ? node.contents.length : 0;
    return end <= have || op_sandbox_memory_room(end - have);
  };
  for (const name of ["expandFileStorage", "resizeFileStorage"]) {
    const grow = MEMFS[name];
    if (typeof grow !== "function") continue;
    MEMFS[name] = function (node, size) {
      if (!room(node, size)) throw new FS.ErrnoError(ENOSPC);
      return grow.call(this, node, size);
    };
  }
  // A first write to an empty file copies the data without growing storage: checked here.
  const streamOps = new Set([MEMFS.stream_ops, MEMFS.ops_table?.file?.stream].filter(Boolean));
  for (const ops of streamOps) {
    const write = ops.write;
    ops.write = function (stream, buffer, offset, length, position, canOwn) {
      if (!canOwn && length > 0 && !room(stream.node, position + length)) {
        throw new FS.ErrnoError(ENOSPC);
      }
      return write.call(this, stream, buffer, offset, length, position, canOwn);
    };
  }
}
