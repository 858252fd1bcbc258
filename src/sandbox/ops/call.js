// One call's lifecycle (call.rs): the code and input files in, the Python runner, the report and the
// new files under /workspace out. Everything here runs with functions captured before any user code
// existed (the ops, the file-system functions of `sandbox.fs`); what it hands to Rust is checked and
// capped there.

import { core } from "ext:core/mod.js";
import { sandbox } from "ext:sandbox/pyodide.js";

const {
  op_sandbox_code,
  op_sandbox_collect_file,
  op_sandbox_input_file,
  op_sandbox_input_file_count,
  op_sandbox_offer_file,
  op_sandbox_report,
  op_sandbox_start_clock,
  op_sandbox_write,
} = core.ops;

const WORKSPACE = "/workspace";

/** Called by the runner when the user's code starts: the timeout runs from here. */
const startClock = () => op_sandbox_start_clock();

/** Called by the runner with what the code produced (Rust caps every field). */
const report = (success, result, resultTruncated, errorType, message, traceback) =>
  op_sandbox_report({ success, result, resultTruncated, errorType, message, traceback });

/**
 * Runs one request. Input files come from ops; the Python runner executes the code; new files under
 * /workspace are offered to Rust, which applies the returned-file limits.
 */
export async function run() {
  const { pyodide, runner, autoLoad, fs } = sandbox;
  const code = op_sandbox_code();
  fs.mkdirTree(WORKSPACE);
  fs.chdir(WORKSPACE);
  const count = op_sandbox_input_file_count();
  for (let i = 0; i < count; i++) {
    const [path, data] = op_sandbox_input_file(i);
    const full = `${WORKSPACE}/${path}`;
    fs.mkdirTree(full.slice(0, full.lastIndexOf("/")));
    fs.writeFile(full, new Uint8Array(data), { canOwn: true });
  }
  const before = new Set(workspaceFiles(fs));

  if (autoLoad) {
    // Not user time: the clock starts inside the runner.
    await pyodide.loadPackagesFromImports(code, {
      messageCallback: () => {},
      errorCallback: (msg) => op_sandbox_write(2, core.encode(msg + "\n")),
    });
  }
  await runner(code, startClock, report);
  collectFiles(fs, before);
}

/**
 * Every regular file below /workspace, as paths relative to it, sorted; none if /workspace is not a
 * directory (the code may have removed it, or replaced it with a link). Links are not followed.
 */
function workspaceFiles(fs) {
  let root;
  try {
    root = fs.lstat(WORKSPACE);
  } catch {
    return [];
  }
  if (!fs.isDir(root.mode)) return [];
  const out = [];
  const walk = (dir, prefix) => {
    for (const name of fs.readdir(dir)) {
      if (name === "." || name === "..") continue;
      const full = `${dir}/${name}`;
      const st = fs.lstat(full);
      if (fs.isDir(st.mode)) walk(full, `${prefix}${name}/`);
      else if (fs.isFile(st.mode)) out.push(`${prefix}${name}`);
    }
  };
  walk(WORKSPACE, "");
  return out.sort();
}

function collectFiles(fs, before) {
  for (const path of workspaceFiles(fs)) {
    if (before.has(path)) continue;
    const full = `${WORKSPACE}/${path}`;
    if (op_sandbox_offer_file(fs.lstat(full).size)) {
      op_sandbox_collect_file(path, fs.readFile(full));
    }
  }
}
