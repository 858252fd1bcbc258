// A session's sandbox parked ahead of its session (boot.rs): booted as far as Pyodide goes before it
// needs its memory snapshot, then finished once Rust has chosen the snapshot. `park` and `unpark` are
// handed to Rust through `op_sandbox_register` (runtime.js) and never stored on a global.

import { boot } from "ext:sandbox/pyodide.js";

/** A parked boot (see `park`): the boot, and what lets it go on. */
let parking = null;

/**
 * Boots a sandbox as far as it goes before it needs its memory snapshot (Pyodide's WebAssembly
 * instantiated) and waits there: resolves once it waits. `unpark`, called once Rust has chosen the
 * snapshot (a session's image, or the snapshot a new session starts from), lets the boot go on and
 * returns it. A session's sandbox is parked ahead of the session, which then waits only for the
 * restore.
 */
export function park() {
  return new Promise((parked, failed) => {
    let open = null;
    const gate = {
      then(resolve) {
        open = resolve;
        parked();
      },
    };
    const booting = boot(gate);
    parking = {
      booting,
      open: () => {
        if (!open) throw new Error("the sandbox is not waiting for its snapshot");
        open();
      },
    };
    booting.then(() => failed(new Error("Pyodide started without waiting for its snapshot")), failed);
  });
}

/** Lets the parked boot go on (see `park`); resolves when the sandbox is booted. */
export function unpark() {
  const parked = parking;
  parking = null;
  if (!parked) throw new Error("the sandbox is not parked");
  parked.open();
  return parked.booting;
}
