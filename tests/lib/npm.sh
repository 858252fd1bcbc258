# Shared by the Node-based harnesses: install a directory's pinned npm packages (package.json +
# package-lock.json) into a tools directory. Source this file, then call
# `npm_ci_pinned LABEL SOURCE_DIR TOOLS [FILE...]`: `npm ci --ignore-scripts` in TOOLS, skipped when
# the lockfile installed there matches SOURCE_DIR's and every FILE exists; a failed install prints
# npm's log and exits.

npm_ci_pinned() { # LABEL SOURCE_DIR TOOLS [FILE...]
  local label=$1 source=$2 tools=$3 file current=1
  shift 3
  mkdir -p "$tools"
  cmp -s "$source/package-lock.json" "$tools/node_modules/.installed-lock.json" || current=0
  for file in "$@"; do [ -e "$file" ] || current=0; done
  [ "$current" = 0 ] || return 0
  cp "$source/package.json" "$source/package-lock.json" "$tools/"
  (cd "$tools" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >"$tools/npm-ci.log" 2>&1) || {
    cat "$tools/npm-ci.log" >&2
    echo "$label: npm ci failed" >&2
    exit 1
  }
  cp "$source/package-lock.json" "$tools/node_modules/.installed-lock.json"
}
