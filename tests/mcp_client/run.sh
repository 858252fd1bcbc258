#!/usr/bin/env bash
# Runs test_client.py (official Python MCP SDK 2.x client, modes 2026-07-28 and legacy) against
# code-interpreter-mcp.
#
# Creates the venv .tools/venv from requirements.txt (skipped when already installed from the same
# file), starts the server binary on a free port, runs the test and always stops the server.
# Exit status is the test's: non-zero on any failure.
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to the repo root),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.tools/venv"
PY="$VENV/bin/python"
WORK="$ROOT/.tools/mcp_client"
mkdir -p "$WORK"

# --- install (skipped when the venv was built from the same requirements.txt) -------------------
if ! cmp -s "$HERE/requirements.txt" "$VENV/.installed-requirements.txt" || [ ! -x "$PY" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-input -r "$HERE/requirements.txt" \
    >"$WORK/pip.log" 2>&1 || {
    cat "$WORK/pip.log" >&2
    echo "mcp_client: pip install failed" >&2
    exit 1
  }
  cp "$HERE/requirements.txt" "$VENV/.installed-requirements.txt"
fi

# --- start the server ---------------------------------------------------------------------------
BIN="${CIM_BIN:-target/debug/code-interpreter-mcp}"
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
if [ ! -x "$BIN" ]; then
  echo "mcp_client: server binary not found: $BIN (build it first or set CIM_BIN)" >&2
  exit 1
fi
if [ -z "${CODE_INTERPRETER_MCP_PACKAGE_BASE_URL:-}" ] && [ -d "$ROOT/../shared/pyodide-packages" ]; then
  export CODE_INTERPRETER_MCP_PACKAGE_BASE_URL="$(cd "$ROOT/../shared/pyodide-packages" && pwd)"
fi

SERVER_OUT="$WORK/server.stdout"
SERVER_ERR="$WORK/server.stderr"
: >"$SERVER_OUT"
: >"$SERVER_ERR"
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

CODE_INTERPRETER_MCP_BIND_ADDR=127.0.0.1:0 RUST_LOG="${RUST_LOG:-warn}" \
  "$BIN" >"$SERVER_OUT" 2>"$SERVER_ERR" </dev/null &
SERVER_PID=$!

URL=""
for _ in $(seq 600); do # up to 60 s
  URL="$(sed -n 's#^code-interpreter-mcp listening on port [0-9][0-9]* at \(http://[^ ]*\)$#\1#p' "$SERVER_OUT" | head -n1 || true)"
  [ -n "$URL" ] && break
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "mcp_client: server exited before announcing its URL; stderr:" >&2
    cat "$SERVER_ERR" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$URL" ]; then
  echo "mcp_client: server did not announce its URL within 60 s; stderr:" >&2
  cat "$SERVER_ERR" >&2
  exit 1
fi

# --- run ----------------------------------------------------------------------------------------
rc=0
timeout 600 "$PY" "$HERE/test_client.py" "$URL" || rc=$?
stop_server
exit "$rc" # the test's closing "N passed, M failed" line stays the last line printed
