"""Interop driver: OpenAI Agents SDK 0.24.0 (MCPServerStreamableHttp / MCPServerStdio).

Usage: openai_agents_client.py --url URL | --stdio

Tools are taken the way an Agent takes them, MCPUtil.get_function_tools(...,
convert_schemas_to_strict=True), and called through FunctionTool.on_invoke_tool: what the model
would see, with no model or API key. The tool output is the content blocks (text, image; other
blocks are serialised as JSON text) since use_structured_content is left at its default (False);
the result object comes from the server's JSON text block. The driver prints to stderr which tools
converted to strict schemas. resources/read goes through MCPServer.read_resource.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Outcome, to_dict  # noqa: E402

from agents import Agent  # noqa: E402
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp, MCPUtil  # noqa: E402
from agents.strict_schema import ensure_strict_json_schema  # noqa: E402
from agents.run_context import RunContextWrapper  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

# The SDK's default client_session_timeout_seconds is 5 s: the MCP ClientSession read timeout for
# every request, tool calls included. A cold pandas/matplotlib call or the 3 s long_call step
# (plus start-up) can exceed it, and the call then fails with a timeout although the server is
# fine. Agents running this server need a longer one; 120 s matches the server's per-call cap.
SESSION_TIMEOUT_S = 120


class Adapter:
    supports_progress = False  # MCPServer.call_tool has no progress callback

    def __init__(self, server) -> None:
        self.server = server
        self.tools: dict = {}
        self.raw: dict = {}
        self._ids = 0

    async def list_tools(self) -> list[dict]:
        agent = Agent(name="interop")
        tools = await MCPUtil.get_function_tools(
            self.server, convert_schemas_to_strict=True, run_context=RunContextWrapper(None), agent=agent
        )
        self.tools = {t.name: t for t in tools}
        raw = [to_dict(t) for t in await self.server.list_tools()]
        self.raw = {t["name"]: t for t in raw}
        for t in tools:
            why = ""
            if not t.strict_json_schema:  # the SDK logs no reason by default; find it
                try:
                    # the same call as MCPUtil.to_function_tool makes for a non-empty schema
                    ensure_strict_json_schema(copy.deepcopy(self.raw[t.name]["inputSchema"]), _reject_open_objects=True)
                except Exception as exc:  # noqa: BLE001
                    why = f" ({type(exc).__name__}: {exc})"
            print(f"  strict schema: {t.name}: {t.strict_json_schema}{why}", file=sys.stderr)
        return raw

    async def call(self, name, args, on_progress=None) -> Outcome:
        if not self.tools:
            await self.list_tools()
        tool = self.tools[name]
        self._ids += 1
        payload = json.dumps(args)
        ctx = ToolContext(None, tool_name=name, tool_call_id=f"call_{self._ids}", tool_arguments=payload)
        output = await tool.on_invoke_tool(ctx, payload)
        items = output if isinstance(output, list) else [output]
        blocks: list[dict] = []
        for item in items:
            if isinstance(item, str):  # the failure_error_function's message, or a plain string
                blocks.append({"type": "text", "text": item})
            elif isinstance(item, dict) and item.get("type") == "image":
                url = item.get("image_url") or ""
                mime, _, data = url.partition(";base64,")
                blocks.append({"type": "image", "mimeType": mime.removeprefix("data:"), "data": data})
            elif isinstance(item, dict) and item.get("type") == "text":
                text = item.get("text") or ""
                try:  # non-text/image blocks arrive as their JSON serialisation
                    value = json.loads(text)
                except ValueError:
                    value = None
                if isinstance(value, dict) and value.get("type") in ("resource_link", "resource"):
                    blocks.append(value)
                else:
                    blocks.append({"type": "text", "text": text})
            else:
                blocks.append(to_dict(item))
        return Outcome(structured=None, blocks=blocks, is_error=None)

    async def read_resource(self, uri: str) -> list[dict]:
        return [to_dict(c) for c in (await self.server.read_resource(uri)).contents]


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    logging.getLogger("openai.agents").setLevel(logging.INFO)
    logging.getLogger("openai.agents").addHandler(logging.StreamHandler(sys.stderr))
    if args.url:
        server = MCPServerStreamableHttp(
            {"url": args.url, "timeout": 30, "sse_read_timeout": 300},
            client_session_timeout_seconds=SESSION_TIMEOUT_S,
            name="cim",
        )
    else:
        server = MCPServerStdio(
            common.server_process(),
            client_session_timeout_seconds=SESSION_TIMEOUT_S,
            name="cim",
        )

    async def connected() -> bool:
        async with server:
            return await common.run_workflow(Adapter(server))

    return await common.guarded(connected)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
