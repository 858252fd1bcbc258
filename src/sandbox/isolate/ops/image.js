// A session's image (isolate/session.rs, `saveImage` in call.js): Pyodide's memory snapshot of the
// interpreter, made between calls with what was captured at boot, before any user code existed.
//
// Pyodide records the JavaScript objects Python holds (its hiwire table) by their path from the
// global object only when `_makeSnapshot` is set as it loads, and that wraps every `js` access in
// proxies (measured ~20x slower). A saveable sandbox loads without it; the save names each held
// object itself: the output streams the glue hands to Python, or the global object, its own
// properties and theirs (`Math`, `Math.floor`) as they were at boot, by path. Anything else (an object the code made or
// reached deeper) refuses the save, with the reason.

import { recordDylibs } from "ext:sandbox/dylink.js";

/** The JavaScript objects the glue hands to Python (the output streams), by the token an image uses. */
export const writers = { stdout: null, stderr: null };

/** Makes this sandbox's memory image (set at boot; null: the sandbox is not saveable). */
let maker = null;
/** Checks, without making it, that an image can be made now (set with `maker`). */
let checker = null;
/** The record of the shared libraries loaded in this sandbox (JSON; empty: none). */
let libraries = () => "";

/** An image's JavaScript objects, by token, in the sandbox it is restored into. */
export function deserialize(token) {
  if (Array.isArray(token)) {
    let value = globalThis;
    for (const key of token) value = value?.[key];
    return value ?? null;
  }
  return writers[token] ?? null;
}

/**
 * Captures what a session image needs (at the end of boot): Pyodide's `makeSnapshot`, the global
 * object's own properties, what was loaded then (packages), and starts recording the shared
 * libraries the session loads, after those of `dylibs` (the record this sandbox was relinked from:
 * a snapshot with pre-imported packages, or a restored session's image). Rust checks that every
 * recorded library is one of the package layer's, which a restore can relink.
 */
export function prepareImages(pyodide, dylibs) {
  const api = pyodide._api;
  const config = api.config;
  const makeSnapshot = api.makeSnapshot;
  const loadedPackages = pyodide.loadedPackages;
  const packagesAtBoot = new Set(Object.keys(loadedPackages));
  const record = recordDylibs(pyodide._module, dylibs);
  libraries = () => {
    const taken = record(false);
    return taken.loads.length > 0 ? JSON.stringify(taken) : "";
  };
  // The global object, its own properties and theirs (`Math`, `Math.floor`), by path.
  const known = new Map([[globalThis, []]]);
  const visit = (owner, path, depth) => {
    for (const name of Object.getOwnPropertyNames(owner)) {
      let value;
      try {
        value = owner[name];
      } catch {
        continue;
      }
      if ((typeof value !== "object" && typeof value !== "function") || value === null) continue;
      if (known.has(value)) continue;
      known.set(value, [...path, name]);
      if (depth > 0) visit(value, [...path, name], depth - 1);
    }
  };
  visit(globalThis, [], 1);
  // Tasks the code left pending on the event loop: their callbacks are JavaScript timers, which an
  // image does not carry.
  const pendingTasks = pyodide.runPython(`
def _sandbox_pending_tasks():
    import asyncio
    try:
        loop = asyncio.get_event_loop()
        return sum(1 for task in asyncio.all_tasks(loop) if not task.done())
    except Exception:
        return 0
_sandbox_pending_tasks
`);
  // Throws, saying why, when the session holds what an image does not carry.
  const check = () => {
    const added = Object.keys(loadedPackages).filter((name) => !packagesAtBoot.has(name));
    if (added.length > 0) {
      throw new Error(
        `packages were installed in it during the session (${added.slice(0, 5).join(", ")}), which a session image does not carry: only the server's preinstalled packages (preinstall_packages) are`,
      );
    }
    const pending = Number(pendingTasks());
    if (pending > 0) {
      throw new Error(
        `it has ${pending} asyncio task(s) still pending, whose timers a session image cannot carry`,
      );
    }
  };
  const named = (obj) => {
    if (obj === writers.stdout) return "stdout";
    if (obj === writers.stderr) return "stderr";
    const path = known.get(obj);
    if (path !== undefined) return path;
    throw new Error(
      `it holds a JavaScript object (${describe(obj)}, through \`import js\` or pyodide.ffi), which a session image cannot carry`,
    );
  };
  checker = () => {
    check();
    // (Walks the JavaScript objects Python holds, naming each, without copying memory.)
    api.serializeHiwireState(named);
  };
  // The heap is not copied here: Pyodide's makeSnapshot makes only its header (the held objects'
  // record) while the module's heap view is swapped for an empty one, and Rust copies the heap
  // once, straight from the WebAssembly memory.
  const module = pyodide._module;
  maker = () => {
    check();
    const heap = module.HEAP8;
    config._makeSnapshot = true;
    module.HEAP8 = new Int8Array(0);
    try {
      const header = makeSnapshot.call(api, named);
      return { header, heap: new Uint8Array(heap.buffer, heap.byteOffset, heap.length) };
    } finally {
      module.HEAP8 = heap;
      config._makeSnapshot = false;
    }
  };
}

/** A held object in a few words (its kind and constructor's name), whatever it is. */
function describe(obj) {
  try {
    const name = typeof obj === "function" ? `function ${obj.name}` : obj?.constructor?.name;
    return `${typeof obj}${name ? ` ${String(name).slice(0, 40)}` : ""}`;
  } catch {
    return typeof obj;
  }
}

/**
 * Pyodide's memory snapshot of this sandbox's interpreter, for a session image, as its header and
 * (a view of) the heap it is followed by; throws, saying why, when the session holds something an
 * image does not carry.
 */
export function makeImage() {
  if (maker === null) throw new Error("this sandbox was not booted to be saved");
  return maker();
}

/** Throws, saying why, when this sandbox's image cannot be made now (cheap: copies no memory). */
export function checkImage() {
  if (checker === null) throw new Error("this sandbox was not booted to be saved");
  checker();
}

/** The record of the shared libraries this sandbox has loaded, to relink on restore (JSON; empty: none). */
export function imageLibraries() {
  return libraries();
}
