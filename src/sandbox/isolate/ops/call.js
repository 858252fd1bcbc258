// One call's lifecycle (call.rs): the code and input files in, the Python runner, the report and the
// new files under /workspace out. Everything here runs with functions captured before any user code
// existed (the ops, the file-system functions of `sandbox.fs`); what it hands to Rust is checked and
// capped there.

import { core, primordials } from "ext:core/mod.js";
import { checkImage, imageLibraries, makeImage } from "ext:sandbox/image.js";
import { fatallyFailed, sandbox } from "ext:sandbox/pyodide.js";
import { heldLength, takeHeldInto } from "ext:sandbox/web.js";

const {
  op_sandbox_call_options,
  op_sandbox_code,
  op_sandbox_collect_file,
  op_sandbox_display,
  op_sandbox_fetch,
  op_sandbox_fetch_body,
  op_sandbox_file_listed,
  op_sandbox_file_read,
  op_sandbox_image_part,
  op_sandbox_input_file,
  op_sandbox_input_file_count,
  op_sandbox_offer_file,
  op_sandbox_report,
  op_sandbox_start_clock,
  op_sandbox_upstream_call,
  op_sandbox_upstream_cancel,
  op_sandbox_upstream_catalog,
  op_sandbox_write,
} = core.ops;
const {
  ArrayIsArray,
  ArrayPrototypeSort,
  JSONParse,
  JSONStringify,
  SafeMap,
  String,
  StringPrototypeIncludes,
  StringPrototypeLastIndexOf,
  StringPrototypeSlice,
  StringPrototypeSplit,
  StringPrototypeStartsWith,
  StringPrototypeTrim,
  Uint8Array,
} = primordials;

const WORKSPACE = "/workspace";
/**
 * The other directories a session image carries, besides /workspace (whose files it names relative
 * to it): their files are named by absolute path.
 */
const CARRIED = ["/tmp", "/home/pyodide"];
/** No path Rust accepts is longer (it counts UTF-8 bytes: at least as many as UTF-16 units). */
const MAX_PATH_CHARS = 4096;

/** Called by the runner when the user's code starts: the timeout runs from here. */
const startClock = () => op_sandbox_start_clock();

/** Called by the runner with each rich output (a JSON bundle) or `clear` (Rust checks and caps them). */
const publish = (text) => op_sandbox_display(String(text));

/**
 * What `upstream.py` and `http.py` reach Rust through: `upstream("catalog")`, `upstream("call",
 * server, tool, args, id)` (a promise of its JSON reply), `upstream("cancel", id)`,
 * `upstream("http", url, method, headersJson, body)` (a promise of `[metaJson, bytes]`), and for
 * pyodide.http's `bytes()`: `upstream("bodyLength", response)` (the length of the body fetch() left
 * in Rust, or -1) and `upstream("bodyInto", response, bytes)` (that body copied into the Python
 * bytes object, through its buffer). One function, not an object: a method called on a JavaScript
 * object from Python leaves Pyodide holding the object, which a session's image cannot name. Rust
 * checks every argument; this grants nothing.
 */
const upstream = (what, a, b, c, d) => {
  if (what === "catalog") return op_sandbox_upstream_catalog();
  if (what === "call") return op_sandbox_upstream_call(String(a), String(b), String(c), d);
  if (what === "cancel") return op_sandbox_upstream_cancel(a);
  if (what === "http") return http(a, b, c, d);
  if (what === "bodyLength") return heldLength(a);
  if (what === "bodyInto") return bodyInto(a, b);
  throw new TypeError("upstream: catalog, call, cancel, http, bodyLength or bodyInto");
};

/** A held response body copied into the memory of `proxy`, a Python object with a buffer. */
function bodyInto(response, proxy) {
  const view = proxy.getBuffer("u8");
  try {
    takeHeldInto(response, view.data);
  } finally {
    view.release();
  }
}

/** One HTTPS request for urllib (http.py), through the same op as fetch. */
async function http(url, method, headersJson, body) {
  const headers = JSONParse(String(headersJson));
  const r = await op_sandbox_fetch(String(url), String(method), headers, body ?? null);
  const data = op_sandbox_fetch_body(r.body);
  const meta = { status: r.status, statusText: r.statusText, url: r.url, headers: r.headers };
  return [JSONStringify(meta), new Uint8Array(data)];
}

/** Called by the runner with what the code produced (Rust caps every field). */
const report = (success, result, resultTruncated, errorType, message, traceback) =>
  op_sandbox_report({ success, result, resultTruncated, errorType, message, traceback });

/**
 * Runs one request. Input files come from ops; the Python runner executes the code; new files under
 * /workspace are offered to Rust, which applies the returned-file limits.
 */
export async function run() {
  const { pyodide, runner, autoLoad, fs, transform } = sandbox;
  const code = op_sandbox_code();
  const { persistent, interrupt, gridRows } = op_sandbox_call_options();
  if (interrupt) pyodide.setInterruptBuffer(new Int32Array(interrupt));
  fs.mkdirTree(WORKSPACE);
  fs.chdir(WORKSPACE);
  const count = op_sandbox_input_file_count();
  for (let i = 0; i < count; i++) {
    const [path, data] = op_sandbox_input_file(i);
    const full = `${WORKSPACE}/${path}`;
    fs.mkdirTree(full.slice(0, full.lastIndexOf("/")));
    fs.writeFile(full, new Uint8Array(data), { canOwn: true });
  }
  // Files as they were before the code ran (in a session, changed files are returned too).
  const before = new SafeMap();
  walkWorkspace(fs, (path, st) => {
    before.set(path, `${st.size}:${Number(st.mtime)}`);
    return true;
  });

  if (autoLoad) {
    // Not user time: the clock starts inside the runner. Code the scan cannot read (nested too
    // deeply for the parser, say) is left to the runner, which compiles it and reports why.
    try {
      // (The scan reads the code as it will run: notebook syntax made Python.)
      await pyodide.loadPackagesFromImports(transform(code), {
        messageCallback: () => {},
        errorCallback: (msg) => op_sandbox_write(2, core.encode(msg + "\n")),
      });
    } catch (error) {
      // (A fatal error is recorded by Pyodide's hook; the check below stops the call.)
      op_sandbox_write(2, core.encode(`The code's imports could not be scanned: ${lastLine(error)}\n`));
    }
  }
  if (fatallyFailed()) return;
  try {
    await runner(code, startClock, report, persistent, publish, upstream, gridRows);
  } finally {
    fatallyFailed();
  }
  collectFiles(fs, before, persistent);
}

/** The last non-empty line of an error's text (a Python traceback's says what was raised), short. */
function lastLine(error) {
  let text;
  try {
    text = String(error);
  } catch {
    return "(an error that cannot be printed)";
  }
  const lines = StringPrototypeSplit(StringPrototypeTrim(text), "\n");
  return StringPrototypeSlice(lines[lines.length - 1], 0, 500);
}

/**
 * A session's files, for Rust (list_session_files, resources): with `path`, that file's bytes (or
 * that it is missing, or too large for `limit`); without, every regular file under /workspace with
 * its size. With `data` (an ArrayBuffer), writes it as the file at `path` instead (what Rust keeps of
 * a call's long output).
 */
export function inspect(path, limit, data) {
  const { fs } = sandbox;
  if (data !== undefined && data !== null) {
    // (A restored image's files under the other directories it carries come by absolute path.)
    let full = `${WORKSPACE}/${path}`;
    for (let i = 0; i < CARRIED.length; i++) {
      if (StringPrototypeStartsWith(path, `${CARRIED[i]}/`)) full = path;
    }
    fs.mkdirTree(StringPrototypeSlice(full, 0, StringPrototypeLastIndexOf(full, "/")));
    fs.writeFile(full, new Uint8Array(data), { canOwn: true });
    return;
  }
  if (path === undefined || path === null) {
    // Rust keeps at most its cap of entries and says when to stop.
    walkWorkspace(fs, (p, st) => op_sandbox_file_listed(p, st.size));
    return;
  }
  const st = lstatInWorkspace(fs, path);
  if (st === null || !fs.isFile(st.mode)) op_sandbox_file_read(1, new Uint8Array(0));
  else if (st.size > limit) op_sandbox_file_read(2, new Uint8Array(0));
  else op_sandbox_file_read(0, fs.readFile(`${WORKSPACE}/${path}`));
}

/**
 * A session's image, between calls (see `Sandbox::save_image`): Pyodide's memory snapshot and the
 * files under /workspace, handed to Rust part by part; or why the session cannot be saved. With
 * `checkOnly` (1), only whether it can be saved now (`Sandbox::check_image`): the reason, or nothing.
 */
export function saveImage(_path, checkOnly) {
  const { fs } = sandbox;
  let memory;
  try {
    if (checkOnly === 1) {
      checkImage();
      op_sandbox_image_part(3, imageLibraries(), new Uint8Array(0));
      return;
    }
    memory = makeImage();
    op_sandbox_image_part(3, imageLibraries(), new Uint8Array(0));
  } catch (error) {
    let text;
    try {
      text = String(error?.message ?? error);
    } catch {
      text = "the session holds something an image cannot carry";
    }
    op_sandbox_image_part(2, text, new Uint8Array(0));
    return;
  }
  op_sandbox_image_part(0, "", memory.header);
  op_sandbox_image_part(4, "", memory.heap);
  walkWorkspace(fs, (path) => {
    op_sandbox_image_part(1, path, fs.readFile(`${WORKSPACE}/${path}`));
    return true;
  });
  for (let i = 0; i < CARRIED.length; i++) {
    const root = CARRIED[i];
    walkTree(fs, root, `${root}/`, (path) => {
      op_sandbox_image_part(1, path, fs.readFile(path));
      return true;
    });
  }
}

/**
 * The lstat of `path` under /workspace, reached without following a link on the way (each
 * component is looked at itself), or null: a session's resources never lead out of /workspace.
 */
function lstatInWorkspace(fs, path) {
  let dir = WORKSPACE;
  let st;
  try {
    st = fs.lstat(dir);
    for (const name of StringPrototypeSplit(path, "/")) {
      if (!fs.isDir(st.mode)) return null;
      dir = `${dir}/${name}`;
      st = fs.lstat(dir);
    }
  } catch {
    return null;
  }
  return st;
}

/**
 * Calls `visit(path, stat)` for every regular file below /workspace (paths relative to it), in
 * sorted order, until it returns false; nothing if /workspace is not a directory (the code may have
 * removed it, or replaced it with a link). Links are not followed; entries the file system cannot
 * stat, whose names cannot be a path component (a `/` in them), or whose paths would be longer than
 * any path Rust accepts are skipped: the code may have made anything.
 */
function walkWorkspace(fs, visit) {
  walkTree(fs, WORKSPACE, "", visit);
}

/** `walkWorkspace` under `top`, each path given with `base` before its part below `top`. */
function walkTree(fs, top, base, visit) {
  let root;
  try {
    root = fs.lstat(top);
  } catch {
    return;
  }
  if (!fs.isDir(root.mode)) return;
  const walk = (dir, prefix) => {
    let names;
    try {
      names = fs.readdir(dir);
      if (!ArrayIsArray(names)) return true;
      names = ArrayPrototypeSort(names);
    } catch {
      return true;
    }
    for (const name of names) {
      if (name === "." || name === ".." || typeof name !== "string") continue;
      if (name === "" || StringPrototypeIncludes(name, "/")) continue;
      if (prefix.length + name.length > MAX_PATH_CHARS) continue;
      const full = `${dir}/${name}`;
      let st;
      try {
        st = fs.lstat(full);
      } catch {
        continue;
      }
      if (fs.isDir(st.mode)) {
        if (!walk(full, `${prefix}${name}/`)) return false;
      } else if (fs.isFile(st.mode) && !visit(`${prefix}${name}`, st)) {
        return false;
      }
    }
    return true;
  };
  walk(top, base);
}

/**
 * Offers Rust the files the call produced: new ones, and in a session changed ones too (a fresh
 * sandbox's call returns only files that were not there when it started, as the tool promises).
 */
function collectFiles(fs, before, persistent) {
  walkWorkspace(fs, (path, st) => {
    const seen = before.get(path);
    if (seen !== undefined && (!persistent || seen === `${st.size}:${Number(st.mtime)}`)) {
      return true;
    }
    if (op_sandbox_offer_file(st.size)) {
      op_sandbox_collect_file(path, fs.readFile(`${WORKSPACE}/${path}`));
    }
    return true;
  });
}
