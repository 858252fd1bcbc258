// The package layer in a sandbox's MEMFS (its ops are in layer.rs): its files as slices of
// the sandbox's copy-on-write map of the layer, each directory made when first looked up; and the
// installer that builds the layer at start-up.

import { core } from "ext:core/mod.js";

const {
  op_sandbox_layer_blob,
  op_sandbox_layer_capture,
  op_sandbox_layer_capture_loaded,
  op_sandbox_layer_dir,
  op_sandbox_layer_index,
  op_sandbox_layer_loaded,
  op_sandbox_log,
} = core.ops;

/**
 * Puts the package layer's files into this sandbox's MEMFS, as slices of its own copy-on-write map,
 * and (unless `records` is false) adds their packages to Pyodide's records of loaded packages.
 * Directories the layer adds are made when first looked up (`lazy`, the default): a sandbox pays for
 * the files its code touches, not for the whole layer.
 */
export function copyLayer(pyodide, { records = true, lazy = true } = {}) {
  const FS = pyodide.FS;
  if (op_sandbox_layer_dir("").length === 0) return;
  const blob = new Uint8Array(op_sandbox_layer_blob());
  if (lazy) attachLayer(FS, blob, "", FS.root);
  else writeLayer(FS, blob);
  if (!records) return;
  for (const [name, channel] of op_sandbox_layer_loaded()) {
    pyodide.loadedPackages[name] = channel;
  }
  // The runner's prepare() makes Python's import system see the new files.
}

/** Every file of the layer written now. */
function writeLayer(FS, blob) {
  const dirs = new Map();
  for (const [path, offset, length] of op_sandbox_layer_index()) {
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
}

/**
 * Merges the layer's directory `path` into the existing directory `node`: existing subdirectories
 * are merged in turn, files the layer replaces are written now, and the rest waits in `node` until
 * it is looked up.
 */
function attachLayer(FS, blob, path, node) {
  const pending = new Map();
  for (const [name, isDir, offset, length] of op_sandbox_layer_dir(path)) {
    const existing = node.contents && Object.hasOwn(node.contents, name) ? node.contents[name] : undefined;
    if (existing === undefined) pending.set(name, [isDir, offset, length]);
    else if (isDir && FS.isDir(existing.mode)) attachLayer(FS, blob, `${path}/${name}`, existing);
    else FS.writeFile(`${path}/${name}`, blob.subarray(offset, offset + length), { canOwn: true });
  }
  if (pending.size > 0) lazyDirectory(FS, blob, path, node, pending);
}

/**
 * Makes MEMFS directory `node` (the layer's `path`) hold the layer's entries not made yet
 * (`pending`, or all of the directory's, fetched on first use): a lookup makes the entry (a file
 * owning its slice of the layer, or a directory that is lazy in turn), a listing names them all.
 */
function lazyDirectory(FS, blob, path, node, pending) {
  const ops = node.node_ops;
  const entries = () =>
    (pending ??= new Map(
      op_sandbox_layer_dir(path).map(([name, isDir, offset, length]) => [name, [isDir, offset, length]]),
    ));
  node.node_ops = {
    ...ops,
    lookup(parent, name) {
      const entry = entries().get(name);
      if (entry === undefined) return ops.lookup(parent, name);
      pending.delete(name);
      const [isDir, offset, length] = entry;
      if (isDir) {
        const dir = ops.mknod(parent, name, DIR_MODE, 0);
        lazyDirectory(FS, blob, `${path}/${name}`, dir, null);
        return dir;
      }
      const file = ops.mknod(parent, name, FILE_MODE, 0);
      file.contents = blob.subarray(offset, offset + length);
      file.usedBytes = length;
      return file;
    },
    readdir(dir) {
      const names = ops.readdir(dir);
      for (const name of entries().keys()) names.push(name);
      return names;
    },
    rmdir(parent, name) {
      if (FS.lookupNode(parent, name).sandboxLayerPending?.()) throw new FS.ErrnoError(ENOTEMPTY);
      return ops.rmdir(parent, name);
    },
  };
  node.sandboxLayerPending = () => entries().size > 0;
}

/** A directory, rwxrwxrwx (what FS.mkdir creates). */
const DIR_MODE = 0o40777;
/** ENOTEMPTY in Emscripten's (WASI's) errno numbering. */
const ENOTEMPTY = 55;

/** A regular file, rw-rw-rw- (what FS.writeFile creates). */
const FILE_MODE = 0o100666;

/** Directories whose new files make up the package layer: site-packages and the shared-library dir. */
function layerRoots(pyodide) {
  return [pyodide._api.sitepackages, pyodide._api.dsodir].filter((d) => d && exists(pyodide.FS, d));
}

function exists(FS, path) {
  try {
    FS.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * The installer: loads micropip from the package source, installs the configured requirements with it
 * and hands every file they added (and Pyodide's record of loaded packages) to Rust.
 */
export async function buildLayer(pyodide, requirements, indexUrls) {
  const FS = pyodide.FS;
  const before = new Set(layerRoots(pyodide).flatMap((root) => listTree(FS, root)));
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
  for (const root of layerRoots(pyodide)) {
    for (const path of listTree(FS, root)) {
      if (!before.has(path)) op_sandbox_layer_capture(path, FS.readFile(path));
    }
  }
  const loaded = Object.entries(pyodide.loadedPackages)
    .filter(([name]) => !loadedBefore.has(name))
    .map(([name, channel]) => [name, String(channel)]);
  op_sandbox_layer_capture_loaded(loaded);
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
