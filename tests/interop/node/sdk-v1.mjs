#!/usr/bin/env node
// Interop driver: the TypeScript MCP SDK v1 (@modelcontextprotocol/sdk, pinned in package.json).
// Usage: sdk-v1.mjs (--url URL | --stdio) [--era legacy]
// SDK v1 speaks only the initialize-handshake era (2025-11-25), so it has one era: "legacy".
// Prints one "step <name>: ok|FAIL <reason>" line per step (see lib.mjs); exit 0 iff all passed.

import { load, main, parseArgs, transportFor } from "./lib.mjs";

const { Client } = await load("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = await load("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { StdioClientTransport } = await load("@modelcontextprotocol/sdk/client/stdio.js");

const ERAS = ["legacy"];
const opts = parseArgs(process.argv.slice(2), ERAS);
const CALL_TIMEOUT_MS = 60000;

async function makeClient() {
  const client = new Client({ name: "cim-interop-sdk-v1", version: "1.0.0" });
  const transport = transportFor(opts, { StdioClientTransport, StreamableHTTPClientTransport });
  await client.connect(transport);
  process.stdout.write(`# sdk-v1 connected, protocol version ${transport.protocolVersion ?? "(stdio: not exposed)"}\n`);
  return {
    async listTools() {
      const names = [];
      let cursor;
      do {
        const page = await client.listTools(cursor ? { cursor } : {});
        names.push(...page.tools.map((t) => t.name));
        cursor = page.nextCursor;
      } while (cursor);
      return names;
    },
    async callTool(name, args, { progress } = {}) {
      let n = 0;
      const result = await client.callTool({ name, arguments: args }, undefined, {
        timeout: CALL_TIMEOUT_MS,
        ...(progress ? { onprogress: () => n++ } : {}),
      });
      return { result, progress: progress ? n : null };
    },
    readResource: (uri) => client.readResource({ uri }),
    close: () => client.close(),
  };
}

await main(makeClient, opts);
