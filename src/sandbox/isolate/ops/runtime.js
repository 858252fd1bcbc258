// The sandbox's JavaScript realm, the ESM entry point of the `sandbox` extension (mod.rs): it runs
// before anything else and is, with the modules it imports, the only code that ever sees `Deno.core`.
// - web.js installs the few Web APIs Pyodide needs on `globalThis`;
// - pyodide.js boots Pyodide (and takes the memory snapshot, or builds the package layer); park.js
//   parks a session's sandbox before its snapshot is chosen;
// - call.js runs one request.
//
// Nothing here is reachable by user code except the Web APIs installed on `globalThis`; `boot` and `run`
// are handed to Rust through `op_sandbox_register` and never stored on a global.

import { core, primordials } from "ext:core/mod.js";
import "ext:sandbox/web.js";
import { boot, define, preloadPyodide } from "ext:sandbox/pyodide.js";
import { park, unpark } from "ext:sandbox/park.js";
import { inspect, run, saveImage } from "ext:sandbox/call.js";

const { op_sandbox_glue_error, op_sandbox_register } = core.ops;
const { String, StringPrototypeSlice } = primordials;

/**
 * `run`, with any exception it ends in handed to Rust as a short text: such an exception can only
 * come from user code having changed the JavaScript environment, and it must not reach deno_core's
 * error conversion, which evaluates (and, for huge or odd values, unwraps) the thrown object.
 */
async function runGuarded() {
  try {
    await run();
  } catch (error) {
    let text;
    try {
      text = StringPrototypeSlice(String(error), 0, 2000);
    } catch {
      text = "(an exception that cannot be printed)";
    }
    op_sandbox_glue_error(text);
  }
}

// Rust calls __sandboxEntry() once in each isolate to receive the entry points, and
// __sandboxPreload() only in the isolate the V8 startup snapshot is made from. Both are gone before
// any user code runs.
define("__sandboxEntry", () => {
  delete globalThis.__sandboxEntry;
  delete globalThis.__sandboxPreload;
  op_sandbox_register(boot, runGuarded, inspect, saveImage, park, unpark);
});
define("__sandboxPreload", preloadPyodide);
