#!/usr/bin/env node
// Interop driver: the TypeScript MCP SDK v2 client (@modelcontextprotocol/client, pinned in
// package.json).
// Usage: client-v2.mjs (--url URL | --stdio) [--era modern|legacy|auto]
//   modern: versionNegotiation { pin: "2026-07-28" } (server/discover, stateless per-request _meta)
//   legacy: the plain 2025 initialize handshake (the SDK's default)
//   auto:   probe with server/discover, fall back to initialize
// Prints one "step <name>: ok|FAIL <reason>" line per step (see lib.mjs); exit 0 iff all passed.

import { load, main, parseArgs, transportFor } from "./lib.mjs";

const { Client, StreamableHTTPClientTransport } = await load("@modelcontextprotocol/client");
const { StdioClientTransport } = await load("@modelcontextprotocol/client/stdio");

const ERAS = ["modern", "legacy", "auto"];
const MODERN_VERSION = "2026-07-28";
const opts = parseArgs(process.argv.slice(2), ERAS);
const CALL_TIMEOUT_MS = 60000;

async function makeClient() {
  const mode = opts.era === "modern" ? { pin: MODERN_VERSION } : opts.era;
  const client = new Client({ name: "cim-interop-client-v2", version: "1.0.0" }, { versionNegotiation: { mode } });
  const transport = transportFor(opts, { StdioClientTransport, StreamableHTTPClientTransport });
  await client.connect(transport);
  process.stdout.write(`# client-v2 era ${opts.era}: negotiated protocol version ${client.getNegotiatedProtocolVersion?.() ?? "?"}\n`);
  return {
    async listTools() {
      const names = [];
      let cursor;
      do {
        const page = await client.listTools(cursor ? { cursor } : undefined);
        names.push(...page.tools.map((t) => t.name));
        cursor = page.nextCursor;
      } while (cursor);
      return names;
    },
    async callTool(name, args, { progress } = {}) {
      let n = 0;
      const result = await client.callTool(
        { name, arguments: args },
        { timeout: CALL_TIMEOUT_MS, ...(progress ? { onprogress: () => n++ } : {}) },
      );
      return { result, progress: progress ? n : null };
    },
    readResource: (uri) => client.readResource({ uri }),
    close: () => client.close(),
  };
}

await main(makeClient, opts);
