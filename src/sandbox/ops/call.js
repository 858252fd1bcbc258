// One call's lifecycle (call.rs): the code and input files in, the Python runner, the report and the
// new files under /workspace out.

import { core } from "ext:core/mod.js";
import { listTree, sandbox } from "ext:sandbox/pyodide.js";

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

/**
 * Runs one request. Input files come from ops; the Python runner executes the code; new files under
 * /workspace are offered to Rust, which applies the returned-file limits.
 */
export async function run() {
  const { pyodide, runner, autoLoad } = sandbox;
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
