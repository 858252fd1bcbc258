// The sandbox's JavaScript realm: the few Web APIs Pyodide needs, each backed by an op where it touches
// the host, plus the boot and run entry points that Rust calls. Loaded as the ESM entry point of the
// `sandbox` extension, so it runs before anything else and is the only code that ever sees `Deno.core`.
//
// Nothing here is reachable by user code except the Web APIs installed on `globalThis`; `boot` and `run`
// are handed to Rust through `op_sandbox_register` and never stored on a global.

import { core } from "ext:core/mod.js";

const {
  op_sandbox_atob,
  op_sandbox_boot_config,
  op_sandbox_btoa,
  op_sandbox_code,
  op_sandbox_collect_file,
  op_sandbox_decode,
  op_sandbox_fetch,
  op_sandbox_huge_pages,
  op_sandbox_input_file,
  op_sandbox_input_file_count,
  op_sandbox_layer_blob,
  op_sandbox_layer_capture,
  op_sandbox_layer_capture_loaded,
  op_sandbox_layer_index,
  op_sandbox_layer_loaded,
  op_sandbox_log,
  op_sandbox_now,
  op_sandbox_wasm_module,
  op_sandbox_wrapper_module,
  op_sandbox_offer_file,
  op_sandbox_random_fill,
  op_sandbox_read_asset,
  op_sandbox_read_asset_text,
  op_sandbox_register,
  op_sandbox_report,
  op_sandbox_restore_memory,
  op_sandbox_snapshot,
  op_sandbox_start_clock,
  op_sandbox_store_snapshot,
  op_sandbox_url_parse,
  op_sandbox_write,
  op_sandbox_yield,
} = core.ops;

// ---------------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------------

class TextEncoder {
  get encoding() {
    return "utf-8";
  }
  encode(input = "") {
    return core.encode(String(input));
  }
  encodeInto(input, dest) {
    const encoded = core.encode(String(input));
    if (encoded.length <= dest.length) {
      dest.set(encoded);
      return { read: String(input).length, written: encoded.length };
    }
    // Copy whole code points while they fit.
    let read = 0;
    let written = 0;
    for (const ch of String(input)) {
      const bytes = core.encode(ch);
      if (written + bytes.length > dest.length) break;
      dest.set(bytes, written);
      written += bytes.length;
      read += ch.length;
    }
    return { read, written };
  }
}

class TextDecoder {
  #label;
  #fatal;
  #ignoreBOM;
  constructor(label = "utf-8", options = {}) {
    this.#label = String(label).trim().toLowerCase();
    this.#fatal = !!options.fatal;
    this.#ignoreBOM = !!options.ignoreBOM;
    // Validate the label now, as the standard requires.
    op_sandbox_decode(this.#label, new Uint8Array(0), false, true);
  }
  get encoding() {
    return this.#label;
  }
  get fatal() {
    return this.#fatal;
  }
  get ignoreBOM() {
    return this.#ignoreBOM;
  }
  decode(input = new Uint8Array(0), _options = undefined) {
    let bytes;
    if (input instanceof Uint8Array) {
      bytes = input;
    } else if (ArrayBuffer.isView(input)) {
      bytes = new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
    } else {
      bytes = new Uint8Array(input);
    }
    return op_sandbox_decode(this.#label, bytes, this.#fatal, this.#ignoreBOM);
  }
}

// ---------------------------------------------------------------------------------------------------
// URL (parsed by the `url` crate)
// ---------------------------------------------------------------------------------------------------

class URLSearchParams {
  #pairs = [];
  constructor(init = "") {
    if (typeof init === "string") {
      const s = init.startsWith("?") ? init.slice(1) : init;
      for (const part of s.split("&")) {
        if (part === "") continue;
        const eq = part.indexOf("=");
        const k = eq === -1 ? part : part.slice(0, eq);
        const v = eq === -1 ? "" : part.slice(eq + 1);
        this.#pairs.push([decodeParam(k), decodeParam(v)]);
      }
    } else if (init && typeof init === "object") {
      const entries = Symbol.iterator in init ? init : Object.entries(init);
      for (const [k, v] of entries) this.#pairs.push([String(k), String(v)]);
    }
  }
  get(name) {
    const hit = this.#pairs.find(([k]) => k === name);
    return hit ? hit[1] : null;
  }
  getAll(name) {
    return this.#pairs.filter(([k]) => k === name).map(([, v]) => v);
  }
  has(name) {
    return this.#pairs.some(([k]) => k === name);
  }
  set(name, value) {
    this.delete(name);
    this.#pairs.push([String(name), String(value)]);
  }
  append(name, value) {
    this.#pairs.push([String(name), String(value)]);
  }
  delete(name) {
    this.#pairs = this.#pairs.filter(([k]) => k !== name);
  }
  entries() {
    return this.#pairs.map((p) => [...p])[Symbol.iterator]();
  }
  [Symbol.iterator]() {
    return this.entries();
  }
  toString() {
    return this.#pairs
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join("&");
  }
}

function decodeParam(s) {
  try {
    return decodeURIComponent(s.replaceAll("+", " "));
  } catch {
    return s;
  }
}

class URL {
  #p;
  constructor(url, base = undefined) {
    this.#p = op_sandbox_url_parse(String(url), base === undefined ? null : String(base));
  }
  static canParse(url, base = undefined) {
    try {
      new URL(url, base);
      return true;
    } catch {
      return false;
    }
  }
  get href() { return this.#p.href; }
  set href(value) { this.#p = op_sandbox_url_parse(String(value), null); }
  get origin() { return this.#p.origin; }
  get protocol() { return this.#p.protocol; }
  get username() { return this.#p.username; }
  get password() { return this.#p.password; }
  get host() { return this.#p.host; }
  get hostname() { return this.#p.hostname; }
  get port() { return this.#p.port; }
  get pathname() { return this.#p.pathname; }
  get search() { return this.#p.search; }
  get hash() { return this.#p.hash; }
  get searchParams() { return new URLSearchParams(this.#p.search); }
  toString() { return this.#p.href; }
  toJSON() { return this.#p.href; }
}

// ---------------------------------------------------------------------------------------------------
// Base64, time, timers, randomness
// ---------------------------------------------------------------------------------------------------

function btoa(data) {
  return op_sandbox_btoa(String(data));
}

function atob(data) {
  return op_sandbox_atob(String(data));
}

// Set when the sandbox boots (this module may have been evaluated long before, into the V8 startup
// snapshot).
let timeOrigin = 0;
const performance = {
  now: () => op_sandbox_now(),
  get timeOrigin() {
    return timeOrigin;
  },
  mark() {},
  measure() {},
};

const timers = new Map();
let nextTimerId = 1;

function addTimer(callback, delay, args, repeat) {
  if (typeof callback !== "function") {
    throw new TypeError("timer callback must be a function");
  }
  const id = nextTimerId++;
  const timer = core.createTimer(
    () => {
      if (!repeat) timers.delete(id);
      callback(...args);
    },
    Number(delay) || 0,
    undefined,
    repeat,
    true,
  );
  timers.set(id, timer);
  return id;
}

function clearTimer(id) {
  const timer = timers.get(id);
  if (timer !== undefined) {
    timers.delete(id);
    core.cancelTimer(timer);
  }
}

const setTimeout = (cb, delay = 0, ...args) => addTimer(cb, delay, args, false);
const setInterval = (cb, delay = 0, ...args) => addTimer(cb, delay, args, true);
const clearTimeout = (id) => clearTimer(id);
const clearInterval = (id) => clearTimer(id);

/**
 * The part of MessageChannel that Pyodide uses to schedule zero-delay tasks (asyncio's call_soon):
 * a message posted on port2 reaches port1.onmessage on the next event-loop turn, without the 1 ms
 * floor of timers.
 */
class MessageChannel {
  constructor() {
    const port1 = { onmessage: null, start() {}, close() {} };
    const port2 = {
      postMessage(data) {
        op_sandbox_yield().then(() => port1.onmessage?.({ data }));
      },
      start() {},
      close() {},
    };
    this.port1 = port1;
    this.port2 = port2;
  }
}

const crypto = {
  getRandomValues(view) {
    if (!ArrayBuffer.isView(view) || view instanceof Float32Array || view instanceof Float64Array) {
      throw new TypeError("getRandomValues needs an integer typed array");
    }
    if (view.byteLength > 65536) {
      throw new RangeError("getRandomValues is limited to 65536 bytes");
    }
    op_sandbox_random_fill(new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
    return view;
  },
  randomUUID() {
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  },
};

// ---------------------------------------------------------------------------------------------------
// fetch: HTTPS to allowlisted hosts only, performed by Rust
// ---------------------------------------------------------------------------------------------------

class Headers {
  #map = new Map();
  constructor(init = undefined) {
    if (init instanceof Headers) {
      for (const [k, v] of init) this.append(k, v);
    } else if (Array.isArray(init)) {
      for (const [k, v] of init) this.append(k, v);
    } else if (init && typeof init === "object") {
      for (const [k, v] of Object.entries(init)) this.append(k, v);
    }
  }
  append(name, value) {
    const key = String(name).toLowerCase();
    const prev = this.#map.get(key);
    this.#map.set(key, prev === undefined ? String(value) : `${prev}, ${value}`);
  }
  set(name, value) {
    this.#map.set(String(name).toLowerCase(), String(value));
  }
  get(name) {
    return this.#map.get(String(name).toLowerCase()) ?? null;
  }
  has(name) {
    return this.#map.has(String(name).toLowerCase());
  }
  delete(name) {
    this.#map.delete(String(name).toLowerCase());
  }
  forEach(fn, thisArg = undefined) {
    for (const [k, v] of this.#map) fn.call(thisArg, v, k, this);
  }
  keys() {
    return this.#map.keys();
  }
  values() {
    return this.#map.values();
  }
  entries() {
    return this.#map.entries();
  }
  [Symbol.iterator]() {
    return this.#map.entries();
  }
}

class Response {
  #body;
  constructor(body, init = {}) {
    this.#body = body ?? new Uint8Array(0);
    this.status = init.status ?? 200;
    this.statusText = init.statusText ?? "";
    this.headers = new Headers(init.headers);
    this.url = init.url ?? "";
    this.redirected = !!init.redirected;
    this.type = "basic";
    this.bodyUsed = false;
  }
  get ok() {
    return this.status >= 200 && this.status < 300;
  }
  #take() {
    if (this.bodyUsed) throw new TypeError("Body has already been consumed");
    this.bodyUsed = true;
    return this.#body;
  }
  async bytes() {
    return this.#take().slice();
  }
  async arrayBuffer() {
    return this.#take().slice().buffer;
  }
  async text() {
    return op_sandbox_decode("utf-8", this.#take(), false, false);
  }
  async json() {
    return JSON.parse(await this.text());
  }
  clone() {
    if (this.bodyUsed) throw new TypeError("Body has already been consumed");
    return new Response(this.#body.slice(), this);
  }
}

class AbortSignal {
  aborted = false;
  reason = undefined;
  addEventListener() {}
  removeEventListener() {}
  throwIfAborted() {
    if (this.aborted) throw this.reason;
  }
}

class AbortController {
  signal = new AbortSignal();
  abort(reason = new Error("aborted")) {
    this.signal.aborted = true;
    this.signal.reason = reason;
  }
}

async function fetch(input, init = {}) {
  const url = input instanceof Request ? input.url : String(input);
  const method = String(init.method ?? (input instanceof Request ? input.method : "GET")).toUpperCase();
  const headers = [...new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined))];
  let body = null;
  if (init.body !== undefined && init.body !== null) {
    if (typeof init.body === "string") body = core.encode(init.body);
    else if (init.body instanceof ArrayBuffer) body = new Uint8Array(init.body);
    else if (ArrayBuffer.isView(init.body)) {
      body = new Uint8Array(init.body.buffer, init.body.byteOffset, init.body.byteLength);
    } else body = core.encode(String(init.body));
  }
  const res = await op_sandbox_fetch(url, method, headers, body);
  return new Response(res.body, {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
    url: res.url,
    redirected: res.redirected,
  });
}

class Request {
  constructor(input, init = {}) {
    this.url = input instanceof Request ? input.url : String(input);
    this.method = String(init.method ?? "GET").toUpperCase();
    this.headers = new Headers(init.headers);
  }
}

// ---------------------------------------------------------------------------------------------------
// console: user-visible output goes to the sandbox's stderr, never to the server's own streams
// ---------------------------------------------------------------------------------------------------

function formatArgs(args) {
  return args
    .map((a) => {
      if (typeof a === "string") return a;
      try {
        return a instanceof Error ? String(a.stack ?? a) : JSON.stringify(a) ?? String(a);
      } catch {
        return String(a);
      }
    })
    .join(" ");
}

const toStderr = (...args) => op_sandbox_write(2, core.encode(formatArgs(args) + "\n"));
const console = {
  log: toStderr,
  info: toStderr,
  warn: toStderr,
  error: toStderr,
  debug: toStderr,
  trace: toStderr,
};

// ---------------------------------------------------------------------------------------------------
// Install the Web APIs
// ---------------------------------------------------------------------------------------------------

for (const [name, value] of Object.entries({
  TextEncoder,
  TextDecoder,
  URL,
  URLSearchParams,
  btoa,
  atob,
  performance,
  setTimeout,
  setInterval,
  clearTimeout,
  clearInterval,
  crypto,
  fetch,
  Headers,
  Response,
  Request,
  AbortController,
  AbortSignal,
  MessageChannel,
  console,
})) {
  Object.defineProperty(globalThis, name, {
    value,
    writable: true,
    configurable: true,
    enumerable: false,
  });
}

// Globals that must never be reachable from user code (Python's `js` module or JS evaluated by it).
const FORBIDDEN_GLOBALS = [
  "Deno",
  "__bootstrap",
  "__infra",
  "__timers",
  "process",
  "Bun",
  "require",
  "module",
  "window",
  "read",
  "load",
  "os",
];

// Virtual directory under which Pyodide asks for its runtime files; served by op_sandbox_read_asset.
const INDEX_URL = "/pyodide/";

/**
 * Makes the module `_sandbox_runner` from runner.py (passed as `source`). Done before a snapshot is taken,
 * so restored sandboxes find it imported. (Importing micropip there would leave JavaScript references
 * that a memory snapshot cannot hold; the runner holds none.)
 */
const DEFINE_RUNNER = `import sys, types
runner = types.ModuleType("_sandbox_runner")
exec(compile(source, "<sandbox-runner>", "exec"), runner.__dict__)
sys.modules["_sandbox_runner"] = runner
del runner, source`;
/**
 * Run just before the memory snapshot is taken: every object alive then (the interpreter's modules,
 * Pyodide's, the runner's) moves to the garbage collector's permanent generation, which its
 * collections never scan again. Without it each sandbox's first collections walked (and wrote to)
 * the whole restored heap: ~20,000 objects, 10 ms for a full collection.
 */
const FREEZE_HEAP = "import gc\ngc.collect()\ngc.freeze()";
/** The message of every refusal when runtime package installation is disabled. */
const DISABLED = "Runtime package installation is disabled";

let pyodide = null;
let runner = null;
let autoLoad = false;

/**
 * Boots Pyodide inside this isolate with the configuration Rust hands over. Resolves once the
 * interpreter is ready and every forbidden global is gone. The installer and the snapshot maker stop
 * earlier: they never run user code.
 */
async function boot() {
  timeOrigin = Date.now();
  const cfg = op_sandbox_boot_config();
  autoLoad = cfg.autoLoad;
  delete globalThis.Deno;
  defineShellGlobals();
  // Already evaluated if the isolate started from the V8 startup snapshot (see preloadPyodide).
  const { loadPyodide } = await import("asset:///pyodide.mjs");
  const asm = await import("asset:///pyodide.asm.mjs");

  // The snapshot's bytes are shared by every isolate: this ArrayBuffer is detached right after the
  // restore, so nothing reachable later can read or write them.
  const snapshot = cfg.loadSnapshot ? op_sandbox_snapshot() : null;
  const snapshotOptions = cfg.kind === "snapshot"
    ? { _makeSnapshot: true }
    : snapshot
      ? { _loadSnapshot: new Uint8Array(snapshot) }
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
            op_sandbox_huge_pages(new Uint8Array(instance.exports.memory.buffer));
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
      if (snapshot) {
        // Read by Pyodide's package-index set-up (see modules.rs): the snapshot holds its result.
        settings.sandboxRestored = true;
        // Called by Pyodide's restoreSnapshot (see modules.rs) with the snapshot's memory part.
        settings.sandboxRestoreMemory = (memory) => {
          op_sandbox_restore_memory(new Uint8Array(settings.HEAP8.buffer), memory.byteOffset);
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
    await buildLayer(cfg.requirements, cfg.indexUrls);
    return;
  }
  if (!cfg.loadSnapshot) defineRunner(cfg.runnerSource);
  if (cfg.kind === "snapshot") {
    // The runner and the modules it imports go into the snapshot; nothing else happens before it.
    // The package layer is not in it: MEMFS is not part of a memory snapshot, so every sandbox
    // copies the layer in after restoring.
    pyodide.runPython(FREEZE_HEAP, { filename: "<sandbox-snapshot>" });
    op_sandbox_store_snapshot(pyodide.makeMemorySnapshot());
    return;
  }
  copyLayer();

  // Raw byte streams: Python's own buffering decides when to write; Rust keeps the bytes.
  pyodide.setStdout({ write: (buf) => op_sandbox_write(1, buf) });
  pyodide.setStderr({ write: (buf) => op_sandbox_write(2, buf) });

  const module = pyodide.pyimport("_sandbox_runner");
  module.prepare();
  runner = module.run.copy();
  module.destroy();

  if (!cfg.autoLoad) disablePackageLoading();
  lockDown();
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
async function preloadPyodide() {
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

/** Directories whose new files make up the package layer: site-packages and the shared-library dir. */
function layerRoots() {
  return [pyodide._api.sitepackages, pyodide._api.dsodir].filter((d) => d && exists(d));
}

function exists(path) {
  try {
    pyodide.FS.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * The installer: loads micropip from the package source, installs the configured requirements with it
 * and hands every file they added (and Pyodide's record of loaded packages) to Rust.
 */
async function buildLayer(requirements, indexUrls) {
  const FS = pyodide.FS;
  const before = new Set(layerRoots().flatMap((root) => listTree(FS, root)));
  const loadedBefore = new Set(Object.keys(pyodide.loadedPackages));
  const log = (msg) => op_sandbox_log(String(msg));
  const failures = [];
  await pyodide.loadPackage("micropip", {
    messageCallback: log,
    errorCallback: (msg) => failures.push(String(msg)),
  });
  if (!("micropip" in pyodide.loadedPackages)) {
    throw new Error(`micropip could not be loaded: ${failures.join("; ") || "unknown error"}`);
  }
  if (requirements.length > 0) {
    const micropip = pyodide.pyimport("micropip");
    if (indexUrls.length > 0) micropip.set_index_urls(indexUrls);
    await micropip.install.callKwargs(requirements, { verbose: true });
    micropip.destroy();
    const installed = pyodide.runPython(
      "import micropip\n', '.join(sorted(f'{p.name} {p.version}' for p in micropip.list().values()))",
    );
    log(`installed: ${installed}`);
  }
  for (const root of layerRoots()) {
    for (const path of listTree(FS, root)) {
      if (!before.has(path)) op_sandbox_layer_capture(path, FS.readFile(path));
    }
  }
  const loaded = Object.entries(pyodide.loadedPackages)
    .filter(([name]) => !loadedBefore.has(name))
    .map(([name, channel]) => [name, String(channel)]);
  op_sandbox_layer_capture_loaded(loaded);
}

/** Defines the `_sandbox_runner` module from runner.py's source. */
function defineRunner(source) {
  const globals = pyodide.globals.get("dict")();
  globals.set("source", source);
  pyodide.runPython(DEFINE_RUNNER, { globals, filename: "<sandbox-runner-setup>" });
  globals.destroy();
}

/** Puts the package layer's files into this sandbox's MEMFS, as slices of its own copy-on-write map. */
function copyLayer() {
  const index = op_sandbox_layer_index();
  if (index.length === 0) return;
  const FS = pyodide.FS;
  const blob = new Uint8Array(op_sandbox_layer_blob());
  const dirs = new Map();
  for (const [path, offset, length] of index) {
    const slash = path.lastIndexOf("/");
    const dir = path.slice(0, slash);
    let parent = dirs.get(dir);
    if (parent === undefined) {
      FS.mkdirTree(dir);
      parent = FS.lookupPath(dir).node;
      dirs.set(dir, parent);
    }
    const data = blob.subarray(offset, offset + length);
    // What FS.writeFile(path, data, { canOwn: true }) makes (a MEMFS file that owns `data`), made
    // in the directory node directly instead of resolving the whole path again for every file.
    let node;
    try {
      node = parent.node_ops.mknod(parent, path.slice(slash + 1), FILE_MODE, 0);
    } catch {
      FS.writeFile(path, data, { canOwn: true });
      continue;
    }
    node.contents = data;
    node.usedBytes = length;
  }
  for (const [name, channel] of op_sandbox_layer_loaded()) {
    pyodide.loadedPackages[name] = channel;
  }
  // The runner's prepare() makes Python's import system see the new files.
}

/** A regular file, rw-rw-rw- (what FS.writeFile creates). */
const FILE_MODE = 0o100666;

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

function define(name, value) {
  Object.defineProperty(globalThis, name, {
    value,
    writable: true,
    configurable: true,
    enumerable: false,
  });
}

/** Removes every host-facing global and Pyodide's native file-system mounts. */
function lockDown() {
  for (const name of FORBIDDEN_GLOBALS) {
    delete globalThis[name];
  }
  for (const api of ["mountNodeFS", "mountNativeFS"]) {
    delete pyodide[api];
  }
  const filesystems = pyodide.FS.filesystems;
  for (const fs of Object.keys(filesystems)) {
    if (fs !== "MEMFS") delete filesystems[fs];
  }
}

/**
 * Runs one request. Input files come from ops; the Python runner executes the code; new files under
 * /workspace are offered to Rust, which applies the returned-file limits.
 */
async function run() {
  const code = op_sandbox_code();
  const FS = pyodide.FS;
  FS.mkdirTree("/workspace");
  FS.chdir("/workspace");
  const count = op_sandbox_input_file_count();
  for (let i = 0; i < count; i++) {
    const [path, data] = op_sandbox_input_file(i);
    const full = `/workspace/${path}`;
    const dir = full.slice(0, full.lastIndexOf("/"));
    FS.mkdirTree(dir);
    FS.writeFile(full, data);
  }
  const before = new Set(listFiles(FS, "/workspace"));

  if (autoLoad) {
    // Not user time: the clock starts inside the runner.
    await pyodide.loadPackagesFromImports(code, {
      messageCallback: () => {},
      errorCallback: (msg) => op_sandbox_write(2, core.encode(msg + "\n")),
    });
  }
  const outcome = await runner(code, () => op_sandbox_start_clock());
  const report = outcome.toJs({ dict_converter: Object.fromEntries });
  outcome.destroy();

  collectFiles(FS, before);
  op_sandbox_report(JSON.stringify(report));
}

/** Every regular file below `root` (absolute paths, sorted). Symlinks are skipped. */
function listTree(FS, root) {
  const out = [];
  const walk = (dir) => {
    for (const name of FS.readdir(dir)) {
      if (name === "." || name === "..") continue;
      const full = `${dir}/${name}`;
      const st = FS.lstat(full);
      if (FS.isDir(st.mode)) walk(full);
      else if (FS.isFile(st.mode)) out.push(full);
    }
  };
  walk(root);
  return out.sort();
}

/** Every regular file below `root`, as paths relative to /workspace, sorted. */
function listFiles(FS, root) {
  return listTree(FS, root).map((p) => p.slice("/workspace/".length));
}

function collectFiles(FS, before) {
  for (const path of listFiles(FS, "/workspace")) {
    if (before.has(path)) continue;
    const full = `/workspace/${path}`;
    const size = FS.lstat(full).size;
    if (op_sandbox_offer_file(path, size)) {
      op_sandbox_collect_file(path, FS.readFile(full));
    }
  }
}

// Rust calls __sandboxEntry() once in each isolate to receive the entry points, and
// __sandboxPreload() only in the isolate the V8 startup snapshot is made from. Both are gone before
// any user code runs.
define("__sandboxEntry", () => {
  delete globalThis.__sandboxEntry;
  delete globalThis.__sandboxPreload;
  op_sandbox_register(boot, run);
});
define("__sandboxPreload", preloadPyodide);
