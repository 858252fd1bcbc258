// One call's lifecycle (call.rs): the code and input files in, the Python runner, the report and the
// new files under /workspace out. Everything here runs with functions captured before any user code
// existed (the ops, the file-system functions of `sandbox.fs`); what it hands to Rust is checked and
// capped there.

import { core } from "ext:core/mod.js";
import { sandbox } from "ext:sandbox/pyodide.js";

const {
  op_sandbox_call_options,
  op_sandbox_code,
  op_sandbox_collect_file,
  op_sandbox_file_read,
  op_sandbox_files_listed,
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
  const { persistent, interrupt } = op_sandbox_call_options();
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
  const before = new Map(workspaceFiles(fs).map((path) => [path, version(fs, path)]));

  if (autoLoad) {
    // Not user time: the clock starts inside the runner.
    await pyodide.loadPackagesFromImports(code, {
      messageCallback: () => {},
      errorCallback: (msg) => op_sandbox_write(2, core.encode(msg + "\n")),
    });
  }
  await runner(code, startClock, report, persistent);
  collectFiles(fs, before, persistent);
}

/**
 * A session's files, for Rust (list_session_files, resources): with `path`, that file's bytes (or
 * that it is missing, or too large for `limit`); without, every regular file under /workspace with
 * its size.
 */
export function inspect(path, limit) {
  const { fs } = sandbox;
  if (path === undefined || path === null) {
    op_sandbox_files_listed(
      workspaceFiles(fs).map((p) => [p, fs.lstat(`${WORKSPACE}/${p}`).size]),
    );
    return;
  }
  let st;
  try {
    st = fs.lstat(`${WORKSPACE}/${path}`);
  } catch {
    op_sandbox_file_read(1, new Uint8Array(0));
    return;
  }
  if (!fs.isFile(st.mode)) op_sandbox_file_read(1, new Uint8Array(0));
  else if (st.size > limit) op_sandbox_file_read(2, new Uint8Array(0));
  else op_sandbox_file_read(0, fs.readFile(`${WORKSPACE}/${path}`));
}

/** What tells whether a file changed: its size and modification time. */
function version(fs, path) {
  const st = fs.lstat(`${WORKSPACE}/${path}`);
  return `${st.size}:${Number(st.mtime)}`;
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

/**
 * Offers Rust the files the call produced: new ones, and in a session changed ones too (a fresh
 * sandbox's call returns only files that were not there when it started, as the tool promises).
 */
function collectFiles(fs, before, persistent) {
  for (const path of workspaceFiles(fs)) {
    if (before.has(path) && (!persistent || before.get(path) === version(fs, path))) continue;
    const full = `${WORKSPACE}/${path}`;
    if (op_sandbox_offer_file(fs.lstat(full).size)) {
      op_sandbox_collect_file(path, fs.readFile(full));
    }
  }
}
