#!/usr/bin/env bash
# Installs moto's S3 server (pinned in requirements.txt beside this file) into the venv .tools/moto
# for the session store's tests (tests/it/store.rs runs this before it starts the server), skipped
# when the venv was installed from the same requirements file. Safe to run concurrently: it works
# under an exclusive flock on .tools/moto.lock. Prints nothing on success; the pip log on failure.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/.tools/moto"
mkdir -p "$ROOT/.tools"
exec 9>"$ROOT/.tools/moto.lock"
flock 9
if cmp -s "$HERE/requirements.txt" "$VENV/installed-requirements.txt" && [ -x "$VENV/bin/moto_server" ]; then
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input --no-compile -r "$HERE/requirements.txt" >"$log" 2>&1 || {
  cat "$log" >&2
  echo "store: pip install moto failed" >&2
  exit 1
}
cp "$HERE/requirements.txt" "$VENV/installed-requirements.txt"
