// Shared part of the Node interop drivers: argument parsing, the analyst workflow (the steps and
// their assertions) and the step report. Each driver supplies a client adapter:
//
//   listTools()                      -> array of tool names
//   callTool(name, args, {progress}) -> { result: CallToolResult JSON, progress: number|null }
//                                       (progress: notifications received, null when the client
//                                       cannot observe them); throws on a protocol error
//   readResource(uri)                -> ReadResourceResult JSON; throws on a protocol error
//   close()
//
// Output: exactly one line per step, "step <name>: ok" or "step <name>: FAIL <reason>", in the fixed
// order of STEPS. Extra observations (e.g. how many progress notifications arrived) are printed as
// comment lines starting with "# ", never as step lines. Exit status 0 iff every step passed.

import { spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../../..");

/** Where package.json + package-lock.json of this directory are installed (npm ci). */
export const TOOLS = process.env.CIM_INTEROP_NODE_TOOLS || path.join(ROOT, ".tools", "interop", "node");

/**
 * Imports a package installed in TOOLS. The drivers live in the repo and their packages in TOOLS,
 * which ES module resolution (no NODE_PATH) would not search; so the import is made from a one-line
 * module placed in TOOLS, which resolves against TOOLS/node_modules.
 */
export async function load(specifier) {
  const shim = path.join(TOOLS, "import-shim.mjs");
  if (!existsSync(shim)) writeFileSync(shim, "export const load = (s) => import(s);\n");
  const { load: shimLoad } = await import(pathToFileURL(shim).href);
  return shimLoad(specifier);
}

export const STEPS = [
  "list_tools",
  "print",
  "final_expression",
  "syntax_error",
  "timeout",
  "csv_groupby",
  "plot",
  "session_create",
  "session_reuse",
  "session_list_files",
  "session_read_resource",
  "session_fork",
  "session_clear",
  "snippets",
  "long_call",
];

export const EXPECTED_TOOLS = [
  "run_python_code",
  "list_session_files",
  "clear_session",
  "fork_session",
  "list_code_snippets",
  "get_code_snippet",
];

const USAGE = `usage: DRIVER (--url URL | --stdio) [--era ERA] [--jobs N] [--list-eras]
  --url URL    Streamable HTTP endpoint of a running server (its /mcp URL)
  --stdio      start "$CIM_BIN --stdio" (plus "--config $CIM_CONFIG" when CIM_CONFIG is set) as a child
  --era ERA    protocol era to use (one of the driver's eras; see --list-eras)
  --jobs N     run independent steps N at a time (the session steps stay in order in one lane)
  --list-eras  print the driver's eras, one per line (the first is the default), and exit`;

/** Parses argv. eras: the driver's eras, the first being the default; jobs: the default --jobs. */
export function parseArgs(argv, eras, jobs = 1) {
  const opts = { url: null, stdio: false, era: eras[0], jobs };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--url") opts.url = argv[++i];
    else if (a.startsWith("--url=")) opts.url = a.slice(6);
    else if (a === "--stdio") opts.stdio = true;
    else if (a === "--era") opts.era = argv[++i];
    else if (a.startsWith("--era=")) opts.era = a.slice(6);
    else if (a === "--jobs") opts.jobs = Number(argv[++i]);
    else if (a === "--list-eras") {
      process.stdout.write(eras.join("\n") + "\n");
      process.exit(0);
    } else usage(`unknown argument: ${a}`);
  }
  if (!opts.stdio === !opts.url) usage("give exactly one of --url URL or --stdio");
  if (!(Number.isInteger(opts.jobs) && opts.jobs >= 0)) usage("--jobs needs a positive integer");
  if (!eras.includes(opts.era)) usage(`unknown era ${opts.era}; this driver has: ${eras.join(", ")}`);
  return opts;
}

function usage(msg) {
  process.stderr.write(`${msg}\n${USAGE}\n`);
  process.exit(2);
}

/** The server command line for --stdio: $CIM_BIN --stdio [--config $CIM_CONFIG]. */
export function serverCommand() {
  const bin = process.env.CIM_BIN;
  if (!bin) usage("--stdio needs CIM_BIN (the server binary)");
  const args = ["--stdio"];
  if (process.env.CIM_CONFIG) args.push("--config", process.env.CIM_CONFIG);
  return { command: bin, args };
}

// The transport an SDK's client connects with, from that SDK's two transport classes: Streamable HTTP
// to --url, or the server started over stdio with the whole inherited environment (the SDKs'
// default passes only HOME, PATH, ... and would drop CODE_INTERPRETER_MCP_*); the server's log is
// piped and dropped.
export function transportFor(opts, { StdioClientTransport, StreamableHTTPClientTransport }) {
  if (!opts.stdio) return new StreamableHTTPClientTransport(new URL(opts.url));
  const { command, args } = serverCommand();
  const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "pipe" });
  transport.stderr?.on("data", () => {});
  return transport;
}

// --- helpers for the assertions -------------------------------------------------------------------

class StepError extends Error {}

export function check(cond, msg) {
  if (!cond) throw new StepError(msg);
}

const short = (v, n = 160) => {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return s === undefined ? String(v) : s.length > n ? `${s.slice(0, n)}…` : s;
};

/**
 * The full result JSON of a tool call: the structured content, or, when the client passes on only
 * the content blocks, the JSON in the first text block (the server's text for the model; it
 * abbreviates file contents but keeps every other field).
 */
export function payload(result) {
  check(result && typeof result === "object", `no result: ${short(result)}`);
  if (result.structuredContent && typeof result.structuredContent === "object") return result.structuredContent;
  const text = (result.content || []).find((b) => b.type === "text");
  check(text, `neither structuredContent nor a text block: ${short(result)}`);
  try {
    return JSON.parse(text.text);
  } catch {
    throw new StepError(`text block is not JSON: ${short(text.text)}`);
  }
}

/** Asserts a successful run_python_code and returns its payload. */
function ok(result) {
  const p = payload(result);
  check(p.success === true, `success is ${short(p.success)}; error=${short(p.error)} stderr=${short(p.stderr)}`);
  check(result.isError !== true, `isError is true although success is true`);
  return p;
}

const CSV = "region,sales\nnorth,10\nsouth,5\nnorth,7\nsouth,3\neast,1\n";

const CSV_CODE = `import json
import pandas as pd
df = pd.read_csv("data.csv")
totals = df.groupby("region")["sales"].sum()
print(totals.to_string())
json.dumps({k: int(v) for k, v in totals.items()}, sort_keys=True)`;

const PLOT_CODE = `import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
plt.savefig("plot.png")
plt.close("all")`;

const LONG_CODE = `import asyncio
for i in range(3):
    print(i, flush=True)
    await asyncio.sleep(1)
"done"`;

const PNG_B64_PREFIX = "iVBORw0KGgo"; // base64 of the PNG signature

// --- the workflow ---------------------------------------------------------------------------------

/**
 * Runs every step against the adapter and prints the report. opts.jobs > 1 runs the steps
 * that do not depend on each other concurrently (the session steps stay in order); the report is
 * always printed in STEPS order. Returns the exit code.
 */
export async function runWorkflow(client, opts = {}) {
  const state = {}; // shared by the session steps
  const notes = [];
  const note = (s) => notes.push(s);
  const call = (name, args, o) => client.callTool(name, args, o);
  const run = async (args, o) => (await call("run_python_code", args, o)).result;

  const steps = {
    async list_tools() {
      const names = await client.listTools();
      const missing = EXPECTED_TOOLS.filter((t) => !names.includes(t));
      check(missing.length === 0, `missing ${missing.join(", ")} in ${short(names)}`);
    },
    async print() {
      const p = ok(await run({ code: "print(1)" }));
      check(p.stdout === "1\n", `stdout is ${short(p.stdout)}`);
    },
    async final_expression() {
      const p = ok(await run({ code: "1+1" }));
      check(p.result === "2", `result is ${short(p.result)}`);
    },
    async syntax_error() {
      const r = await run({ code: "def (" });
      const p = payload(r);
      check(p.success === false, `success is ${short(p.success)}`);
      check(p.error && p.error.type === "SyntaxError", `error is ${short(p.error)}`);
      check(r.isError === true, `isError is ${short(r.isError)}`);
    },
    async timeout() {
      // No wall-clock bound here: with the Inspector over stdio a step's time includes a server start.
      const r = await run({ code: "while True: pass", timeout_ms: 1000 });
      const p = payload(r);
      check(p.success === false, `success is ${short(p.success)}`);
      check(p.timed_out === true, `timed_out is ${short(p.timed_out)}`);
      check(
        p.error && p.error.kind === "timeout" && p.error.type === "TimeoutError" && /timeout/i.test(p.error.message || ""),
        `error is ${short(p.error)}`,
      );
      check(r.isError === true, `isError is ${short(r.isError)}`);
    },
    async csv_groupby() {
      const files = [{ path: "data.csv", content_base64: Buffer.from(CSV).toString("base64") }];
      const p = ok(await run({ code: CSV_CODE, files }));
      let totals;
      try {
        totals = JSON.parse(p.result);
      } catch {
        throw new StepError(`result is not JSON: ${short(p.result)}`);
      }
      const want = { east: 1, north: 17, south: 8 };
      check(JSON.stringify(totals) === JSON.stringify(want), `totals are ${short(totals)}`);
      check(/north\s+17\b/.test(p.stdout) && /south\s+8\b/.test(p.stdout), `stdout is ${short(p.stdout)}`);
    },
    async plot() {
      const r = await run({ code: PLOT_CODE });
      const p = ok(r);
      const images = (r.content || []).filter((b) => b.type === "image");
      const img = images.find((b) => b.mimeType === "image/png" && String(b.data).startsWith(PNG_B64_PREFIX));
      const file = (p.files || []).find((f) => f.path === "plot.png");
      // The server documents both (README "Figures" and content blocks): require both.
      check(img, `no image/png content block (content types: ${short((r.content || []).map((b) => b.type))})`);
      check(file, `plot.png not in files: ${short((p.files || []).map((f) => f.path))}`);
      check(file.mime_type === "image/png", `plot.png mime_type is ${short(file.mime_type)}`);
      // Structured content carries the bytes; the text-only form says where they are instead.
      if (file.content_base64 !== undefined) {
        check(file.content_base64.startsWith(PNG_B64_PREFIX), "plot.png content is not a PNG");
      }
    },
    async session_create() {
      const r = await run({ code: 'x = 41; open("notes.txt","w").write("hi")', session_id: "new" });
      const p = ok(r);
      check(typeof p.session_id === "string" && p.session_id.length >= 16, `session_id is ${short(p.session_id)}`);
      state.sid = p.session_id;
      const link = (r.content || []).find((b) => b.type === "resource_link" && /\/notes\.txt$/.test(b.uri || ""));
      if (link) state.uri = link.uri;
      else note("session_create: no resource_link block for notes.txt");
    },
    async session_reuse() {
      check(state.sid, "no session (session_create failed)");
      const p = ok(await run({ code: "x + 1", session_id: state.sid }));
      check(p.result === "42", `result is ${short(p.result)}`);
    },
    async session_list_files() {
      check(state.sid, "no session (session_create failed)");
      const r = (await call("list_session_files", { session_id: state.sid })).result;
      const p = payload(r);
      check(r.isError !== true && p.success !== false, `list_session_files failed: ${short(p)}`);
      const entry = (p.files || []).find((f) => f.path === "notes.txt");
      check(entry, `notes.txt not listed: ${short(p.files)}`);
      if (entry.uri && !state.uri) state.uri = entry.uri;
    },
    async session_read_resource() {
      check(state.sid, "no session (session_create failed)");
      const uri = state.uri || `session://${state.sid}/notes.txt`;
      const r = await client.readResource(uri);
      const c = (r.contents || [])[0];
      check(c, `no contents: ${short(r)}`);
      const text = c.text !== undefined ? c.text : c.blob !== undefined ? Buffer.from(c.blob, "base64").toString() : undefined;
      check(text === "hi", `contents[0] is ${short(c)}`);
    },
    async session_fork() {
      check(state.sid, "no session (session_create failed)");
      const r = (await call("fork_session", { session_id: state.sid })).result;
      const p = payload(r);
      check(r.isError !== true && p.success === true, `fork_session failed: ${short(p)}`);
      check(typeof p.session_id === "string" && p.session_id && p.session_id !== state.sid, `fork id is ${short(p.session_id)}`);
      state.fork = p.session_id;
      const q = ok(await run({ code: "x", session_id: state.fork }));
      check(q.result === "41", `x in the fork is ${short(q.result)}`);
    },
    async session_clear() {
      check(state.sid, "no session (session_create failed)");
      const r = (await call("clear_session", { session_id: state.sid })).result;
      const p = payload(r);
      check(r.isError !== true && p.success === true, `clear_session failed: ${short(p)}`);
      const g = await run({ code: "x", session_id: state.sid });
      const q = payload(g);
      check(q.success === false, `a call in the cleared session succeeded: ${short(q)}`);
      check(q.error && q.error.kind === "session" && q.error.type === "SessionNotFound", `error is ${short(q.error)}`);
      check(g.isError === true, `isError is ${short(g.isError)}`);
    },
    async snippets() {
      const r = (await call("list_code_snippets", {})).result;
      const p = payload(r);
      check(r.isError !== true, `list_code_snippets failed: ${short(p)}`);
      const list = p.snippets || [];
      // The server ships no snippets by default: they come from [code_snippets.snippets.*] in its
      // configuration (the runner passes one with CIM_CONFIG / --config).
      check(list.length > 0, `no snippets listed (is the server configured with [code_snippets.snippets.*]?)`);
      const id = list[0].id;
      check(typeof id === "string" && id, `first snippet has no id: ${short(list[0])}`);
      const g = (await call("get_code_snippet", { id })).result;
      const q = payload(g);
      check(g.isError !== true, `get_code_snippet failed: ${short(q)}`);
      const code = q.snippet && q.snippet.code_snippet;
      check(typeof code === "string" && code.trim().length > 0, `no code for ${id}: ${short(q)}`);
    },
    async long_call() {
      const t0 = Date.now();
      const { result, progress } = await call("run_python_code", { code: LONG_CODE, timeout_ms: 20000 }, { progress: true });
      const ms = Date.now() - t0;
      const p = ok(result);
      check(p.stdout === "0\n1\n2\n", `stdout is ${short(p.stdout)}`);
      check(p.result === "done", `result is ${short(p.result)}`);
      check(ms >= 2500, `finished after ${ms} ms, expected about 3 s`);
      note(`long_call: ${ms} ms, progress notifications: ${progress === null ? "not observable with this client" : progress}`);
      // The server documents live output as notifications/progress for requests with a progress
      // token (README "Live output"), so a client that sends one must see them.
      if (progress !== null) check(progress > 0, "no notifications/progress arrived although a progress token was sent");
    },
  };

  const outcome = {};
  const timings = [];
  const runStep = async (name) => {
    const t0 = Date.now();
    try {
      await steps[name]();
      outcome[name] = "ok";
    } catch (e) {
      const msg = e instanceof StepError ? e.message : `${e && e.name ? e.name : "Error"}: ${e && e.message ? e.message : e}`;
      outcome[name] = `FAIL ${msg.replace(/\s+/g, " ").slice(0, 400)}`;
    }
    timings.push(`${name}=${Date.now() - t0}`);
  };

  const sessionChain = STEPS.filter((s) => s.startsWith("session_"));
  const independent = STEPS.filter((s) => !s.startsWith("session_"));
  const concurrency = Math.max(1, opts.jobs || 1);
  if (concurrency === 1) {
    for (const s of STEPS) await runStep(s);
  } else {
    // One lane runs the session chain in order; the other lanes take the independent steps,
    // slowest first (long_call, timeout) so that they overlap the rest.
    const queue = [...independent].sort((a, b) => (b === "long_call") - (a === "long_call") || (b === "timeout") - (a === "timeout"));
    const lane = async () => {
      while (queue.length) await runStep(queue.shift());
    };
    const chain = async () => {
      for (const s of sessionChain) await runStep(s);
    };
    await Promise.all([chain(), ...Array.from({ length: concurrency - 1 }, lane)]);
  }

  // Clean-up, not asserted: drop the fork so that durable stores do not accumulate sessions.
  if (state.fork) await call("clear_session", { session_id: state.fork }).catch(() => {});

  for (const s of STEPS) process.stdout.write(`step ${s}: ${outcome[s]}\n`);
  for (const n of notes) process.stdout.write(`# ${n}\n`);
  process.stdout.write(`# step ms: ${timings.join(" ")}\n`);
  return STEPS.every((s) => outcome[s] === "ok") ? 0 : 1;
}

/** Runs a driver's main: builds the adapter, runs the workflow, closes, exits. */
export async function main(makeClient, opts) {
  const t0 = Date.now();
  let client;
  let code = 1;
  try {
    client = await makeClient();
  } catch (e) {
    // Connecting failed: every step fails with the same reason.
    const msg = `connect: ${e && e.message ? e.message : e}`.replace(/\s+/g, " ").slice(0, 400);
    for (const s of STEPS) process.stdout.write(`step ${s}: FAIL ${msg}\n`);
    process.exit(1);
  }
  try {
    code = await runWorkflow(client, opts);
  } finally {
    try {
      await Promise.race([client.close(), new Promise((r) => setTimeout(r, 5000))]);
    } catch (e) {
      process.stdout.write(`# close failed: ${e && e.message ? e.message : e}\n`);
    }
  }
  process.stdout.write(`# ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
  process.exit(code);
}

/** Runs a command; resolves { code, stdout, stderr } (never rejects on a non-zero exit). */
export function execFile(command, args, { env, timeoutMs = 60000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code === null ? `signal ${signal}` : code, stdout, stderr });
    });
  });
}
