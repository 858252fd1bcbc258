# syntax=docker/dockerfile:1
# code-interpreter-mcp: the server binary, the pinned Pyodide files (checked against
# deploy/pyodide-assets.sha256) and a package layer + memory snapshot prepared at build time, on a
# distroless base, as a non-root user. The root file system can be mounted read-only: nothing is written
# at run time (the package layer under /app/package-cache is baked into the image and only read).
#
#   docker build -t code-interpreter-mcp .
#   docker run --rm --read-only -p 8000:8000 code-interpreter-mcp
#
# Build arguments:
#   PACKAGE_BASE_URL     where wheels come from, at build time and at run time (default: the Pyodide
#                        CDN directory of the pinned version)
#   PREINSTALL_PACKAGES  packages baked into the package layer, whitespace-separated (e.g. "numpy pandas")
#   PREIMPORT_MODULES    more modules baked, imported, into a second memory snapshot, comma-separated
#                        (e.g. "scipy.stats"); the preinstalled packages' own top-level modules are
#                        pre-imported anyway (preimport_preinstalled, on by default)
# Both are kept in the runtime stage's environment (overriding a mounted file's lists): the baked
# files are used only while the server's configuration matches what they were made from.
# scripts/container-layout reproduces the runtime stage's layout, user, command and environment in a
# directory and starts the server from it (CI runs it; no Docker engine needed).

ARG RUST_VERSION=1.91

FROM rust:${RUST_VERSION}-bookworm AS build
# Node.js/npm only fetch the pinned Pyodide package and the views' scripts; they do not reach the
# runtime stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY deploy/pyodide-assets.sha256 deploy/app-assets.sha256 deploy/
WORKDIR /src/node_modules/pyodide
RUN sha256sum --check --strict /src/deploy/pyodide-assets.sha256
# The MCP Apps views' two scripts (plotly.js, the ext-apps app library), flat, checked by hash.
WORKDIR /src/app-assets
RUN cp /src/node_modules/plotly.js-cartesian-dist-min/plotly-cartesian.min.js \
       /src/node_modules/@modelcontextprotocol/ext-apps/dist/src/app-with-deps.js . \
    && sha256sum --check --strict /src/deploy/app-assets.sha256
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin code-interpreter-mcp \
    && mkdir -p /out/app/pyodide /out/app/ui \
    && cp target/release/code-interpreter-mcp /out/app/ \
    && cp app-assets/plotly-cartesian.min.js app-assets/app-with-deps.js /out/app/ui/ \
    && cp node_modules/pyodide/package.json node_modules/pyodide/pyodide.mjs \
       node_modules/pyodide/pyodide.asm.mjs node_modules/pyodide/pyodide.asm.wasm \
       node_modules/pyodide/python_stdlib.zip node_modules/pyodide/pyodide-lock.json /out/app/pyodide/

FROM build AS prepare
ARG PACKAGE_BASE_URL=""
ARG PREINSTALL_PACKAGES=""
ARG PREIMPORT_MODULES=""
# Downloads micropip and the preinstalled packages (checked against pyodide-lock.json's sha256), builds
# the package layer and the memory snapshot, test-boots a sandbox from them, and exits.
RUN CODE_INTERPRETER_MCP_ASSET_DIR=/out/app/pyodide \
    CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR=/out/app/package-cache \
    CODE_INTERPRETER_MCP_PACKAGE_BASE_URL="${PACKAGE_BASE_URL}" \
    CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES="${PREINSTALL_PACKAGES}" \
    CODE_INTERPRETER_MCP_PREIMPORT_MODULES="${PREIMPORT_MODULES}" \
    /out/app/code-interpreter-mcp prepare

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
ARG PACKAGE_BASE_URL=""
ARG PREINSTALL_PACKAGES=""
ARG PREIMPORT_MODULES=""
COPY --from=prepare --chown=0:0 /out/app /app
# The configuration file (code-interpreter-mcp.toml) is read from the working directory; mount one there.
WORKDIR /etc/code-interpreter-mcp
ENV CODE_INTERPRETER_MCP_ASSET_DIR=/app/pyodide \
    CODE_INTERPRETER_MCP_RESULTS_APPS_ASSET_DIR=/app/ui \
    CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR=/app/package-cache \
    CODE_INTERPRETER_MCP_PACKAGE_BASE_URL=${PACKAGE_BASE_URL} \
    CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES="${PREINSTALL_PACKAGES}" \
    CODE_INTERPRETER_MCP_PREIMPORT_MODULES="${PREIMPORT_MODULES}" \
    CODE_INTERPRETER_MCP_BIND_ADDR=0.0.0.0:8000 \
    CODE_INTERPRETER_MCP_LOG_FORMAT=json
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/app/code-interpreter-mcp"]
