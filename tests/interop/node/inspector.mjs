#!/usr/bin/env node
// Interop driver: the MCP Inspector CLI (@modelcontextprotocol/inspector, pinned in package.json),
// run as a subprocess per step (one connection per process, as a shell or CI job uses it):
//   node <inspector>/clients/cli/build/index.js --format json -q --protocol-era ERA --method ...
// Usage: inspector.mjs (--url URL | --stdio) [--era legacy|modern|auto] [--jobs N]
//   The eras are the CLI's --protocol-era values: legacy (initialize handshake; the CLI's default
//   for ad-hoc targets), modern (2026-07-28, server/discover) and auto (probe, then fall back).
//   --stdio: every step starts its own "$CIM_BIN --stdio" through the CLI, so the session steps
//   rely on the server's durable default session store, shared by those processes.
// Prints one "step <name>: ok|FAIL <reason>" line per step (see lib.mjs); exit 0 iff all passed.
// The CLI cannot observe progress notifications, so long_call only checks the complete result.

import path from "node:path";
import { TOOLS, execFile, main, parseArgs, serverCommand } from "./lib.mjs";

const ERAS = ["legacy", "modern", "auto"];
const opts = parseArgs(process.argv.slice(2), ERAS, 0);
// Default lanes: 3 (each step is a process start: ~0.6 s on HTTP, plus a server start on stdio);
// over stdio every step also starts a server (CPU-bound), so 2 lanes on this 2-core budget.
// (The legacy era once needed 1 lane: the CLI declares the io.modelcontextprotocol/tasks extension
// in initialize yet cannot consume a task result from tools/call, and a call past the server's inline
// window came back as a task. The server now answers every session-era call inline.)
if (!opts.jobs) opts.jobs = opts.stdio ? 2 : 3;
const CLI = path.join(TOOLS, "node_modules/@modelcontextprotocol/inspector/clients/cli/build/index.js");
const STEP_TIMEOUT_MS = 120000;

// Env of the CLI process. MCP_INSPECTOR_SECRET_STORE=memory: the CLI treats stdio -e values as
// secrets and would otherwise write them to ~/.mcp-inspector/secrets.json when no keychain exists.
const cliEnv = { ...process.env, MCP_INSPECTOR_SECRET_STORE: "memory" };

function target() {
  if (!opts.stdio) return ["--transport", "http", "--server-url", opts.url];
  // The CLI starts stdio servers with only HOME, PATH, SHELL, TERM, USER, LOGNAME of its own env
  // (the SDK's default) plus -e KEY=VALUE; pass on what the server reads (its config variables,
  // logging, and the XDG/TMPDIR locations its default session store may depend on).
  // Each step's server answers one request and exits, so unless the caller chose otherwise it
  // starts with the smallest pools (one prewarmed worker, one ready sandbox) to cut its start-up CPU;
  // this changes no behaviour under test.
  const vars = {
    CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS: "1",
    CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES: "1",
    ...Object.fromEntries(
      Object.entries(process.env).filter(([k]) => /^(CODE_INTERPRETER_MCP_|RUST_LOG$|RUST_BACKTRACE$|XDG_|TMPDIR$)/.test(k)),
    ),
  };
  const env = Object.entries(vars).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
  const { command, args } = serverCommand();
  return [...env, "--transport", "stdio", "--connect-timeout", "60000", "--", command, ...args];
}

async function inspect(method, extra) {
  const args = [CLI, "--format", "json", "-q", "--protocol-era", opts.era, "--method", method, ...extra, ...target()];
  const { code, stdout, stderr } = await execFile(process.execPath, args, { env: cliEnv, timeoutMs: STEP_TIMEOUT_MS });
  let out;
  try {
    out = JSON.parse(stdout);
  } catch {
    out = undefined;
  }
  // Exit 0 with {"result": ...}; a tool result with isError:true exits 5 but still prints the
  // result (that is the CLI's contract, not a failure); anything else is an error envelope on stderr.
  if (out && out.result !== undefined && (code === 0 || (code === 5 && out.result.isError === true))) return out.result;
  const why = (stderr.trim().split("\n").filter((l) => l.startsWith("{")).pop() || stderr.trim() || stdout.trim()).slice(0, 300);
  throw new Error(`inspector ${method} exited ${code}: ${why}`);
}

async function makeClient() {
  process.stdout.write(`# inspector era ${opts.era}, one CLI process per request\n`);
  return {
    async listTools() {
      const r = await inspect("tools/list", []);
      return (r.tools || []).map((t) => t.name);
    },
    async callTool(name, args) {
      const result = await inspect("tools/call", ["--tool-name", name, "--tool-args-json", JSON.stringify(args)]);
      return { result, progress: null };
    },
    readResource: (uri) => inspect("resources/read", ["--uri", uri]),
    close: async () => {},
  };
}

await main(makeClient, opts);
