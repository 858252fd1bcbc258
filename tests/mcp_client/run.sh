#!/usr/bin/env bash
# Runs test_client.py (official Python MCP SDK 2.x client, modes 2026-07-28 and legacy) against
# code-interpreter-mcp.
#
# Creates the venv .tools/venv from requirements.txt (skipped when already installed from the same
# file), starts the server binary on a free port, runs the test and always stops the server.
# Exit status is the test's: non-zero on any failure. With --install-only: the venv, then exit
# (scripts/install-test-tools, which CI runs while it compiles).
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
  "$PY" -m pip install --quiet --disable-pip-version-check --no-input --no-compile -r "$HERE/requirements.txt" \
    >"$WORK/pip.log" 2>&1 || {
    cat "$WORK/pip.log" >&2
    echo "mcp_client: pip install failed" >&2
    exit 1
  }
  cp "$HERE/requirements.txt" "$VENV/.installed-requirements.txt"
fi
[ "${1:-}" != --install-only ] || exit 0

# --- start the server ---------------------------------------------------------------------------
# shellcheck source=../lib/server.sh
. "$ROOT/tests/lib/server.sh"
start_server mcp_client "$WORK"

# --- run ----------------------------------------------------------------------------------------
rc=0
timeout 600 "$PY" "$HERE/test_client.py" "$URL" || rc=$?
stop_server
exit "$rc" # the test's closing "N passed, M failed" line stays the last line printed
