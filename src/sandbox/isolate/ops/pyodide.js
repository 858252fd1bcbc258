// Pyodide plumbing (pyodide.rs): boots Pyodide in this isolate with what Rust hands over (the lock
// file, the memory snapshot, Pyodide's compiled WebAssembly, the package layer), takes the memory
// snapshot or builds the package layer when the isolate exists only for that, and locks the realm
// down before any user code can run.

import { core, primordials } from "ext:core/mod.js";
import { setTimeOrigin } from "ext:sandbox/web.js";
import { recordDylibs, relinkDylibs } from "ext:sandbox/dylink.js";
import { buildLayer, copyLayer } from "ext:sandbox/layer.js";
import { captureGlobals, checkHeld, deserialize, prepareImages, writers } from "ext:sandbox/image.js";
import { lockDown, sealRealm } from "ext:sandbox/realm.js";

const {
  op_sandbox_boot_config,
  op_sandbox_fatal,
  op_sandbox_main_memory,
  op_sandbox_layer_module,
  op_sandbox_log,
  op_sandbox_read_asset,
  op_sandbox_read_asset_text,
  op_sandbox_restore_memory,
  op_sandbox_snapshot,
  op_sandbox_store_snapshot,
  op_sandbox_wasm_module,
  op_sandbox_wrapper_module,
  op_sandbox_write,
} = core.ops;

// Virtual directory under which Pyodide asks for its runtime files; served by op_sandbox_read_asset.
const INDEX_URL = "/pyodide/";

/**
 * Makes the modules `_sandbox_display` (display.py, passed as `display`), `_sandbox_notebook`
 * (notebook.py, as `notebook`), `_sandbox_upstream` (upstream.py, as `upstream`), `_sandbox_http`
 * (http.py, as `http`) and `_sandbox_runner` (runner.py, as `source`), each importing those
 * before it. Done before a snapshot is taken, so restored sandboxes
 * find them imported. (Importing micropip there would leave JavaScript references that a memory
 * snapshot cannot hold; the runner holds none.)
 */
const DEFINE_RUNNER = `import sys, types
for name, text, filename in (("_sandbox_display", display, "<sandbox-display>"), ("_sandbox_notebook", notebook, "<sandbox-notebook>"), ("_sandbox_upstream", upstream, "<sandbox-upstream>"), ("_sandbox_http", http, "<sandbox-http>"), ("_sandbox_runner", source, "<sandbox-runner>")):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(text, filename, "exec"), module.__dict__)
del name, text, filename, module, display, notebook, upstream, http, source`;
/**
 * Run just before the memory snapshot is taken: every object alive then (the interpreter's modules,
 * Pyodide's, the runner's) moves to the garbage collector's permanent generation, which its
 * collections never scan again. Without it each sandbox's first collections walked (and wrote to)
 * the whole restored heap: ~20,000 objects, 10 ms for a full collection.
 */
const FREEZE_HEAP = "import gc\ngc.collect()\ngc.freeze()";
/** The top-level packages imported from site-packages, as JSON. */
const IMPORTED_PACKAGES = `import json, sys
json.dumps(sorted({n.split(".")[0] for n, m in list(sys.modules.items()) if "site-packages" in (getattr(m, "__file__", None) or "")}))`;
/**
 * The snapshot maker's imports when modules are pre-imported (`modules`: their names as JSON). With
 * pyplot, one figure is drawn and saved, so the libraries a first plot loads (Agg, Pillow) are in the
 * snapshot too; then matplotlib's font cache is emptied, which closes the font files it holds open
 * (open files are JavaScript state, which a snapshot cannot hold).
 */
const PREIMPORT = `import gc, importlib, json, sys
for name in json.loads(modules):
    importlib.import_module(name)
if "matplotlib.pyplot" in sys.modules:
    import io
    plt = sys.modules["matplotlib.pyplot"]
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2])
    ax.set_title("snapshot")
    fig.savefig(io.BytesIO(), format="png")
    plt.close("all")
    del io, plt, fig, ax
if "matplotlib.font_manager" in sys.modules:
    sys.modules["matplotlib.font_manager"]._get_font.cache_clear()
del name, modules
gc.collect()`;
const { ObjectGetOwnPropertyDescriptor, String: PrimordialString, StringPrototypeSlice } = primordials;

/** The message of every refusal when runtime package installation is disabled. */
const DISABLED = "Runtime package installation is disabled";

let pyodide = null;
let runner = null;
let transform = null;
let fatalSeen = false;
let autoLoad = false;
let fs = null;

/** What a booted sandbox's call needs: the Pyodide instance, the runner, whether imports auto-load. */
export const sandbox = {
  get pyodide() {
    return pyodide;
  },
  get runner() {
    return runner;
  },
  /** The notebook cell transform (notebook.py), for the import scan. */
  get transform() {
    return transform;
  },
  get autoLoad() {
    return autoLoad;
  },
  get fs() {
    return fs;
  },
};

/** Tells Rust that Pyodide failed fatally, with the cause as short text (once). */
function reportFatal(cause) {
  if (fatalSeen) return;
  fatalSeen = true;
  let text;
  try {
    text = StringPrototypeSlice(PrimordialString(cause), 0, 1000);
  } catch {
    text = "a cause that cannot be printed";
  }
  op_sandbox_fatal(text);
}

/**
 * Whether Pyodide has failed fatally (and told Rust so if it had not heard): Pyodide's `on_fatal`
 * hook reports it, and a fatal error also replaces the API's methods with getters that throw,
 * which is checked here in case the code removed the hook. (Code that defines such a getter itself
 * has broken its own interpreter: the same answer.)
 */
export function fatallyFailed() {
  if (fatalSeen) return true;
  const descriptor = pyodide && ObjectGetOwnPropertyDescriptor(pyodide, "runPython");
  if (descriptor && typeof descriptor.get === "function") {
    reportFatal("Pyodide's API was disabled by a fatal error");
  }
  return fatalSeen;
}

/**
 * Boots Pyodide inside this isolate with the configuration Rust hands over. Resolves once the
 * interpreter is ready and every forbidden global is gone. The installer and the snapshot maker stop
 * earlier: they never run user code.
 */
export async function boot(gate = null) {
  setTimeOrigin();
  const cfg = op_sandbox_boot_config();
  autoLoad = cfg.autoLoad;
  delete globalThis.Deno;
  const user = cfg.kind === "sandbox";
  if (user) sealRealm(cfg.globals);
  // What a session image may name, as the sealed realm has it (a restore resolves names from it).
  if (user && cfg.saveable) captureGlobals();
  defineShellGlobals();
  // Already evaluated if the isolate started from the V8 startup snapshot (see preloadPyodide).
  const { loadPyodide } = await import("asset:///pyodide.mjs");
  const asm = await import("asset:///pyodide.asm.mjs");

  // The snapshot's bytes are shared by every isolate: this ArrayBuffer is detached right after the
  // restore, so nothing reachable later can read or write them. A snapshot with pre-imported
  // modules comes with the record of its shared libraries.
  let snapshot = null;
  let dylibs = null;
  // Whether the snapshot is a session's image (its interpreter continues; nothing is reseeded).
  let image = cfg.image;
  const takeSnapshot = (relink) => {
    snapshot = op_sandbox_snapshot();
    dylibs = relink ? JSON.parse(relink) : null;
    return new Uint8Array(snapshot);
  };
  // Parked (see `park` in park.js): Pyodide awaits its snapshot once its WebAssembly is instantiated, and the
  // gate opens when Rust has chosen it (the configuration is read again: it names the libraries to
  // relink).
  const restoring = gate !== null || cfg.loadSnapshot;
  const loadSnapshot = gate
    ? {
      then(resolve, reject) {
        gate.then(() => {
          setTimeOrigin();
          try {
            const chosen = op_sandbox_boot_config();
            image = chosen.image;
            resolve(takeSnapshot(chosen.relink));
          } catch (error) {
            reject(error);
          }
        }, reject);
      },
    }
    : cfg.loadSnapshot
      ? takeSnapshot(cfg.relink)
      : null;
  const snapshotOptions = cfg.kind === "snapshot"
    ? { _makeSnapshot: true }
    : restoring
      ? { _loadSnapshot: loadSnapshot, _snapshotDeserializer: deserialize }
      : {};

  pyodide = await loadPyodide({
    ...snapshotOptions,
    indexURL: INDEX_URL,
    lockFileContents: cfg.lockFile,
    packageBaseUrl: INDEX_URL,
    env: cfg.env,
    stdin: () => null,
    // The installer's output (micropip's progress) goes to the server log.
    stdout: cfg.kind === "installer"
      ? (line) => op_sandbox_log(line)
      : (line) => op_sandbox_write(1, core.encode(line + "\n")),
    stderr: cfg.kind === "installer"
      ? (line) => op_sandbox_log(line)
      : (line) => op_sandbox_write(2, core.encode(line + "\n")),
    // Emscripten picks its environment inside this call: as a "web" runtime it draws entropy from
    // crypto.getRandomValues (our OS-randomness op) instead of the d8 shell's os.system().
    // Pyodide instantiates its WebAssembly with WebAssembly.instantiate(bytes): for our sentinel
    // bytes it gets the module compiled once per process instead (see op_sandbox_wasm_module).
    createPyodideModule: async (settings) => {
      define("window", globalThis);
      const instantiate = WebAssembly.instantiate;
      WebAssembly.instantiate = function (source, imports) {
        if (ArrayBuffer.isView(source) && source.buffer === WASM_SENTINEL) {
          const module = op_sandbox_wasm_module();
          return instantiate.call(WebAssembly, module, imports).then((instance) => {
            op_sandbox_main_memory(instance.exports.memory.buffer);
            return { instance, module };
          });
        }
        return instantiate.call(WebAssembly, source, imports);
      };
      // Emscripten stores ~6,500 functions on the settings object (its `Module`): in dictionary mode
      // from the start, each is one hash-table insertion rather than a new hidden class (map).
      settings.sandboxDictionaryMode = true;
      settings.sandboxDictionaryMode2 = true;
      delete settings.sandboxDictionaryMode;
      delete settings.sandboxDictionaryMode2;
      // Called by function_table.js's sandboxWrapAll (see modules.rs) while Pyodide starts.
      settings.sandboxWrapperModule = (signatures) => op_sandbox_wrapper_module(signatures);
      if (restoring) {
        // Pyodide instantiates before it awaits its snapshot (see modules.rs): not `main` then.
        settings.noInitialRun = true;
        // Read by Pyodide's package-index set-up (see modules.rs): the snapshot holds its result.
        settings.sandboxRestored = true;
        // Called by Pyodide's restoreSnapshot (see modules.rs) with the snapshot's memory part.
        settings.sandboxRestoreMemory = (memory) => {
          // (Pyodide sizes the memory to its own start-up, smaller than what imports grew it to.)
          if (settings.HEAP8.length < memory.byteLength) settings.growMemory(memory.byteLength);
          op_sandbox_restore_memory(new Uint8Array(settings.HEAP8.buffer), memory.byteOffset);
          if (dylibs) relinkDylibs(settings, dylibs, op_sandbox_layer_module);
        };
      }
      try {
        return await asm.default(settings);
      } finally {
        WebAssembly.instantiate = instantiate;
        delete globalThis.window;
      }
    },
  });

  delete pyodide._module.sandboxWrapperModule;
  if (snapshot) {
    snapshot.transfer(0);
    delete pyodide._module.sandboxRestoreMemory;
    delete pyodide._module.sandboxRestored;
  }

  if (cfg.kind === "installer") {
    await buildLayer(pyodide, cfg.requirements, cfg.indexUrls);
    return;
  }
  if (!restoring) defineRunner(cfg.runnerSource, cfg.notebookSource, cfg.displaySource, cfg.upstreamSource, cfg.httpSource);
  if (cfg.kind === "snapshot") {
    // The runner and the modules it imports go into the snapshot, and with `preimport` those
    // modules; nothing else happens before it. The package layer is not in it: MEMFS is not part of
    // a memory snapshot, so every sandbox copies the layer in after restoring.
    const record = cfg.preimport.length > 0 ? preimport(cfg.preimport) : null;
    pyodide.runPython(FREEZE_HEAP, { filename: "<sandbox-snapshot>" });
    op_sandbox_store_snapshot(pyodide.makeMemorySnapshot(), record ? JSON.stringify(record) : "");
    return;
  }
  copyLayer(pyodide);

  // Raw byte streams: Python's own buffering decides when to write; Rust keeps the bytes.
  writers.stdout = { write: (buf) => op_sandbox_write(1, buf) };
  writers.stderr = { write: (buf) => op_sandbox_write(2, buf) };
  pyodide.setStdout(writers.stdout);
  pyodide.setStderr(writers.stderr);

  const module = pyodide.pyimport("_sandbox_runner");
  // (A JavaScript null would reach Python as `jsnull`, not None: pass the message only when set.)
  const options = {
    table_rows: cfg.tableRows,
    table_columns: cfg.tableColumns,
    figure_plotly_js: cfg.figurePlotlyJs,
    reseed: !image,
  };
  // (A JavaScript null would reach Python as `jsnull`, not None: the message only when set.)
  if (cfg.micropipUnavailable) options.micropip_unavailable = cfg.micropipUnavailable;
  if (cfg.upstream) options.upstream = true;
  module.prepare.callKwargs(options);
  // `import IPython` is served by the stand-in (display.py) unless the real IPython was
  // installed: the import scan does not load Pyodide's (heavy) IPython for it.
  pyodide._api._import_name_to_package_name?.delete("IPython");
  runner = module.run.copy();
  const releaseFiles = module.release_files.copy();
  module.destroy();
  const notebook = pyodide.pyimport("_sandbox_notebook");
  transform = notebook.transform.copy();
  notebook.destroy();
  fs = captureFs(pyodide.FS);
  // A WebAssembly trap or stack overflow leaves the interpreter unusable: Rust hears of it at once.
  pyodide._api.on_fatal = reportFatal;

  if (!cfg.autoLoad) disablePackageLoading();
  // The options loadPyodide was given stay reachable (pyodide._api.config): drop the loader closure,
  // which holds the start-up's ops (they refuse after boot anyway), and the snapshot view.
  const config = pyodide._api.config;
  if (config) {
    delete config.createPyodideModule;
    delete config._loadSnapshot;
  }
  lockDown(pyodide, cfg.globals);
  // A session's sandbox: what its image needs, taken now, before any user code exists; and what
  // Python holds of JavaScript is only what an image may name (a restored image's Python ran while
  // Pyodide restored it).
  if (cfg.saveable) {
    prepareImages(pyodide, dylibs, releaseFiles);
    checkHeld();
  }
}

/**
 * The snapshot maker's pre-import: the package layer copied in and the runner prepared as in a
 * sandbox, then `modules` imported while the shared libraries they load are recorded. Returns the
 * record (see dylink.js).
 */
function preimport(modules) {
  // (Not Pyodide's package records: the snapshot requires them as they were at start-up, and every
  // restored sandbox adds them with the files.)
  copyLayer(pyodide, { records: false, lazy: false });
  const module = pyodide.pyimport("_sandbox_runner");
  module.prepare();
  module.destroy();
  const finish = recordDylibs(pyodide._module);
  const globals = pyodide.globals.get("dict")();
  globals.set("modules", JSON.stringify(modules));
  let packages;
  try {
    pyodide.runPython(PREIMPORT, { globals, filename: "<sandbox-preimport>" });
    // The packages now imported (a call importing any of them gets a sandbox from this snapshot).
    packages = pyodide.runPython(IMPORTED_PACKAGES, { globals, filename: "<sandbox-preimport>" });
  } finally {
    globals.destroy();
  }
  const record = finish();
  record.modules = JSON.parse(packages);
  const open = [];
  pyodide.FS.streams.forEach((stream, fd) => {
    if (stream && fd > 2) open.push(`${fd}: ${stream.path}`);
  });
  if (open.length > 0) {
    throw new Error(`the pre-imported modules left files open (${open.join(", ")})`);
  }
  return record;
}

/**
 * The file-system functions a call uses, captured before any user code exists: code that replaces
 * `FS.readdir` or `FS.lstat` later does not change what these are (what Rust accepts as returned
 * files is checked in Rust anyway).
 */
function captureFs(FS) {
  const bound = (name) => {
    const f = FS[name];
    return (...args) => f.apply(FS, args);
  };
  return Object.freeze({
    chdir: bound("chdir"),
    isDir: FS.isDir,
    isFile: FS.isFile,
    lstat: bound("lstat"),
    mkdirTree: bound("mkdirTree"),
    readFile: bound("readFile"),
    readdir: bound("readdir"),
    writeFile: bound("writeFile"),
  });
}

/**
 * Pyodide's environment detection (done when pyodide.mjs is evaluated): without `Deno`, with
 * `read`/`load` functions it takes its "shell" path, which reads its files synchronously through
 * `readbuffer` (our asset op).
 */
function defineShellGlobals() {
  define("read", (path) => op_sandbox_read_asset_text(String(path)));
  define("readbuffer", readAsset);
  define("load", () => {
    throw new Error("load() is not available in the sandbox");
  });
}

/**
 * Evaluates Pyodide's two modules, as a sandbox's boot would, into the realm the V8 startup snapshot
 * is made from; leaves the globals as it found them.
 */
export async function preloadPyodide() {
  const deno = Object.getOwnPropertyDescriptor(globalThis, "Deno");
  delete globalThis.Deno;
  defineShellGlobals();
  try {
    await import("asset:///pyodide.mjs");
    await import("asset:///pyodide.asm.mjs");
  } finally {
    for (const name of ["read", "readbuffer", "load"]) delete globalThis[name];
    Object.defineProperty(globalThis, "Deno", deno);
  }
}

/** Defines the `_sandbox_runner` module from runner.py's source (and the helpers it uses). */
function defineRunner(source, notebook, display, upstream, http) {
  const globals = pyodide.globals.get("dict")();
  globals.set("source", source);
  globals.set("upstream", upstream);
  globals.set("http", http);
  globals.set("notebook", notebook);
  globals.set("display", display);
  pyodide.runPython(DEFINE_RUNNER, { globals, filename: "<sandbox-runner-setup>" });
  globals.destroy();
}

/** Runtime installation disabled: Pyodide's package-loading APIs refuse. */
function disablePackageLoading() {
  const refuse = () => {
    throw new Error(DISABLED);
  };
  for (const api of ["loadPackage", "loadPackagesFromImports"]) {
    Object.defineProperty(pyodide, api, { value: refuse, writable: false, configurable: false });
  }
  const internal = pyodide._api;
  if (internal.packageManager) internal.packageManager.loadPackage = refuse;
  internal.install = refuse;
}

/** Stands in for pyodide.asm.wasm's bytes; see createPyodideModule in boot(). */
const WASM_SENTINEL = new ArrayBuffer(8);

/**
 * `readbuffer` for Pyodide's shell path: runtime files and verified lock-file wheels, each a new
 * ArrayBuffer of this sandbox's own, which Pyodide's `new Uint8Array(...)` wraps without copying.
 */
function readAsset(path) {
  path = String(path);
  if (path.endsWith("/pyodide.asm.wasm")) return WASM_SENTINEL;
  return op_sandbox_read_asset(path);
}

export function define(name, value) {
  Object.defineProperty(globalThis, name, {
    value,
    writable: true,
    configurable: true,
    enumerable: false,
  });
}
