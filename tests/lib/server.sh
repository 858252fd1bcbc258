# Shared by the client and conformance harnesses: start the server binary on a free loopback port and
# stop it again. Source this file, then call `start_server LABEL LOG_DIR`; it sets URL and SERVER_PID
# and installs an EXIT trap that stops the server.
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to ROOT),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present).

SERVER_PID=""
URL=""

stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}

start_server() { # LABEL LOG_DIR
  local label=$1 logs=$2
  local bin="${CIM_BIN:-target/debug/code-interpreter-mcp}"
  case "$bin" in /*) ;; *) bin="$ROOT/$bin" ;; esac
  if [ ! -x "$bin" ]; then
    echo "$label: server binary not found: $bin (build it first or set CIM_BIN)" >&2
    exit 1
  fi
  if [ -z "${CODE_INTERPRETER_MCP_PACKAGE_BASE_URL:-}" ] && [ -d "$ROOT/../shared/pyodide-packages" ]; then
    CODE_INTERPRETER_MCP_PACKAGE_BASE_URL="$(cd "$ROOT/../shared/pyodide-packages" && pwd)"
    export CODE_INTERPRETER_MCP_PACKAGE_BASE_URL
  fi
  local out="$logs/server.stdout" err="$logs/server.stderr"
  : >"$out"
  : >"$err"
  trap stop_server EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  CODE_INTERPRETER_MCP_BIND_ADDR=127.0.0.1:0 RUST_LOG="${RUST_LOG:-warn}" \
    "$bin" >"$out" 2>"$err" </dev/null &
  SERVER_PID=$!
  for _ in $(seq 600); do # up to 60 s
    URL="$(sed -n 's#^code-interpreter-mcp listening on port [0-9][0-9]* at \(http://[^ ]*\)$#\1#p' "$out" | head -n1 || true)"
    [ -n "$URL" ] && return 0
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "$label: server exited before announcing its URL; stderr:" >&2
      cat "$err" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "$label: server did not announce its URL within 60 s; stderr:" >&2
  cat "$err" >&2
  exit 1
}
