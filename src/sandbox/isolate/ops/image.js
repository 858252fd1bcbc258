// A session's image (isolate/session.rs, `saveImage` in call.js): Pyodide's memory snapshot of the
// interpreter, made between calls with what was captured at boot, before any user code existed.
//
// Python holds JavaScript objects through Pyodide's hiwire table; an image names each held object by
// a token, and a restore turns the tokens back into objects. Every step runs on what the boot
// captured, never on what the session's code can replace (`pyodide._api`, `Module`, `JSON`):
// - saving walks the table through the WebAssembly export that reads it (captured at boot) and names
//   each object itself: the output streams the glue hands to Python, Pyodide's API object, or one of
//   the global object's own properties or theirs (`Math`, `Math.floor`) as the boot found them
//   (`captureGlobals`, taken when the realm was sealed, before Pyodide started). Anything else (an
//   object the code made or reached deeper) refuses the save, with the reason. The header is built
//   here, not by Pyodide's `makeSnapshot`.
// - Rust checks every name an image carries against its fixed list before a restore begins and when
//   an image is made (`sandbox/image_refs.rs`); `deserialize` resolves only names the boot captured.

import { primordials } from "ext:core/mod.js";
import { recordDylibs } from "ext:sandbox/dylink.js";

const {
  ArrayIsArray,
  ArrayPrototypeJoin,
  ArrayPrototypePush,
  ArrayPrototypeSlice,
  Error,
  JSONStringify,
  MathCeil,
  NumberParseInt,
  ObjectGetOwnPropertyNames,
  SafeMap,
  StringPrototypeSlice,
  TypeError,
  Uint32Array,
  Uint8Array,
} = primordials;

/** Pyodide's memory snapshot header: its magic number and the offset of its JSON part. */
const SNAPSHOT_MAGIC = 1886286592;
const HEADER_JSON_AT = 48;
/** The hiwire slots Pyodide fills itself on restore (`getExpectedKeys`), and the first immortal one after its no-value marker. */
const EXPECTED_KEYS = 7;
const FIRST_IMMORTAL = 7;

/** The JavaScript objects the glue hands to Python (the output streams), by the token an image uses. */
export const writers = { stdout: null, stderr: null };

const encoder = new TextEncoder();
const encodeInto = encoder.encodeInto.bind(encoder);

/** Makes this sandbox's memory image (set at boot; null: the sandbox is not saveable). */
let maker = null;
/** Checks, without making it, that an image can be made now (set with `maker`). */
let checker = null;
/** The record of the JavaScript objects Python holds, each named (set with `maker`; throws if one cannot be). */
let serializer = null;
/** The record of the shared libraries loaded in this sandbox (JSON; empty: none). */
let libraries = () => "";
/** The global object's own properties and theirs, as the boot found them: object -> path, key -> object. */
let byObject = new SafeMap();
let byKey = new SafeMap();

const keyOf = (path) => ArrayPrototypeJoin(path, "\u0000");

/**
 * Records the global object, its own properties and theirs (`Math`, `Math.floor`) by path: what an
 * image may name. Called once the realm is sealed, before Pyodide starts (a restore needs them).
 */
export function captureGlobals() {
  byObject = new SafeMap([[globalThis, []]]);
  byKey = new SafeMap([["", globalThis]]);
  const visit = (owner, path, depth) => {
    for (const name of ObjectGetOwnPropertyNames(owner)) {
      let value;
      try {
        value = owner[name];
      } catch {
        continue;
      }
      if ((typeof value !== "object" && typeof value !== "function") || value === null) continue;
      if (byObject.has(value)) continue;
      const at = [...path, name];
      byObject.set(value, at);
      byKey.set(keyOf(at), value);
      if (depth > 0) visit(value, at, depth - 1);
    }
  };
  visit(globalThis, [], 1);
}

/**
 * An image's JavaScript object, by token, in the sandbox it is restored into: only what the boot
 * captured (Rust checked the tokens before the restore began).
 */
export function deserialize(token) {
  if (ArrayIsArray(token)) {
    const value = byKey.get(keyOf(token));
    if (value === undefined) {
      throw new TypeError("the image names a JavaScript object this sandbox does not have");
    }
    return value;
  }
  if (token === "stdout" || token === "stderr") return writers[token] ?? null;
  throw new TypeError("the image names an unknown JavaScript object");
}

/**
 * Captures what a session image needs (at the end of boot): the hiwire table's reader, Pyodide's API
 * object and build id, what was loaded then (packages), the runner's `release_files` (what holds
 * files open only as a cache lets go of them before open files refuse a save), and starts recording the shared libraries
 * the session loads, after those of `dylibs` (the record this sandbox was relinked from: a snapshot
 * with pre-imported packages, or a restored session's image). Rust checks that every recorded
 * library is one of the package layer's, which a restore can relink.
 */
export function prepareImages(pyodide, dylibs, releaseFiles) {
  const api = pyodide._api;
  const module = pyodide._module;
  const hiwireGet = module.__hiwire_get;
  const immortalGet = module.__hiwire_immortal_get;
  const abortSignalAny = api.abortSignalAny;
  const buildId = String(api.config.BUILD_ID);
  const loadedPackages = pyodide.loadedPackages;
  // The file system's table of open files (JavaScript state, which an image does not carry).
  const streams = pyodide.FS.streams;
  const packagesAtBoot = new Set(Object.keys(loadedPackages));
  const record = recordDylibs(module, dylibs);
  libraries = () => {
    const taken = record(false);
    return taken.loads.length > 0 ? JSONStringify(taken) : "";
  };
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
    const openFiles = () => {
      const open = [];
      for (let fd = 3; fd < streams.length; fd++) {
        if (streams[fd]) ArrayPrototypePush(open, fd);
      }
      return open;
    };
    let open = openFiles();
    if (open.length > 0) {
      releaseFiles();
      open = openFiles();
    }
    if (open.length > 0) {
      throw new Error(
        `it has ${open.length} file(s) open (descriptor ${ArrayPrototypeJoin(ArrayPrototypeSlice(open, 0, 5), ", ")}), which a session image does not carry: close them (for example with \`with open(...) as f:\`)`,
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
    const path = byObject.get(obj);
    if (path !== undefined) return path;
    throw new Error(
      `it holds a JavaScript object (${describe(obj)}, through \`import js\` or pyodide.ffi), which a session image cannot carry`,
    );
  };
  // The held objects' record, as Pyodide's own `serializeHiwireState` makes it (the slots Pyodide
  // fills itself on restore left out), read through the captured WebAssembly exports.
  const serialize = () => {
    const hiwireKeys = [];
    for (let i = EXPECTED_KEYS; ; i++) {
      let value;
      try {
        value = hiwireGet(i);
      } catch {
        break;
      }
      if (value === null) ArrayPrototypePush(hiwireKeys, null);
      else if (typeof value !== "object" && typeof value !== "function") {
        throw new Error(`it holds a JavaScript ${typeof value} Pyodide cannot restore`);
      } else if (value === api) ArrayPrototypePush(hiwireKeys, { API: true });
      else if (value === abortSignalAny) ArrayPrototypePush(hiwireKeys, { abortSignalAny: true });
      else ArrayPrototypePush(hiwireKeys, { serialized: named(value) });
    }
    const immortalKeys = [];
    for (let i = FIRST_IMMORTAL; ; i++) {
      let value;
      try {
        value = immortalGet(i);
      } catch {
        break;
      }
      if (typeof value !== "string") throw new Error("an interned string of Pyodide's is not one");
      ArrayPrototypePush(immortalKeys, value);
    }
    return { hiwireKeys, immortalKeys };
  };
  serializer = serialize;
  // What Python no longer uses but has not collected yet can hold JavaScript values (the exception a
  // caught rejection of an awaited promise raised, kept alive through its traceback): a record that
  // names something it cannot carry is tried again after a collection.
  const collectedSerialize = () => {
    try {
      return serialize();
    } catch {
      releaseFiles();
      return serialize();
    }
  };
  checker = () => {
    check();
    collectedSerialize();
  };
  // The header of Pyodide's memory snapshot format (see its `makeSnapshot`); Rust copies the heap
  // straight from the WebAssembly memory.
  maker = () => {
    check();
    const json = JSONStringify(collectedSerialize());
    const size = MathCeil((HEADER_JSON_AT + 2 * json.length) / 16) * 16;
    const header = new Uint8Array(size);
    const { written } = encodeInto(json, header.subarray(HEADER_JSON_AT));
    const words = new Uint32Array(header.buffer, 0, 12);
    words[0] = SNAPSHOT_MAGIC;
    words[1] = size;
    words[2] = written;
    words[3] = 0;
    for (let i = 0; i < 8; i++) {
      words[4 + i] = NumberParseInt(StringPrototypeSlice(buildId, i * 8, (i + 1) * 8), 16);
    }
    const heap = module.HEAP8;
    return { header, heap: new Uint8Array(heap.buffer, heap.byteOffset, heap.length) };
  };
}
/**
 * Throws, saying why, when Python holds a JavaScript object an image may not name: the end of every
 * saveable boot (a restored image's Python ran while Pyodide restored it).
 */
export function checkHeld() {
  if (serializer === null) throw new Error("this sandbox was not booted to be saved");
  serializer();
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
