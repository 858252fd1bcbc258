"""Interop driver: Pydantic AI 2.78.0 (pydantic-ai-slim[mcp]) MCPToolset.

Usage: pydantic_ai_client.py --url URL | --stdio

Pydantic AI 2.x removed MCPServerStreamableHTTP/MCPServerStdio in favour of MCPToolset, which wraps
a FastMCP Client (FastMCP 3.4.11 in this venv, on mcp 1.30.0). Calls go through
MCPToolset.direct_call_tool, which returns what the model would get: structuredContent when every
content block is text, else the mapped blocks (BinaryImage, ResourceLink, ...). A result with
isError: true raises ModelRetry (tool_error_behavior="retry", the default) carrying the content
text, as the model would see it; the driver reads the result from that text.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Outcome, to_dict  # noqa: E402

from pydantic_ai import ModelRetry  # noqa: E402
from pydantic_ai.mcp import MCPToolset  # noqa: E402

CALL_TIMEOUT_S = 120
_progress_target = None


async def _on_progress(progress, total, message) -> None:
    if _progress_target is not None:
        await _progress_target(progress, message)


def _part_to_wire(part) -> dict:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if isinstance(part, (dict, list)):
        return {"type": "text", "text": json.dumps(part)}
    kind = type(part).__name__
    if hasattr(part, "data") and hasattr(part, "media_type"):  # BinaryContent / BinaryImage
        if str(part.media_type).startswith("image/"):
            return {"type": "image", "data": base64.b64encode(part.data).decode(), "mimeType": part.media_type}
        return {"type": "resource", "resource": {"uri": "", "blob": base64.b64encode(part.data).decode(), "mimeType": part.media_type}}
    if kind == "ResourceLink":
        return {"type": "resource_link", "uri": str(part.uri)}
    if kind == "EmbeddedResource":
        res = part.resource
        data = getattr(res, "data", None)
        return {"type": "resource", "resource": {"uri": str(getattr(res, "uri", "")), "blob": base64.b64encode(data).decode() if isinstance(data, bytes) else None, "text": data if isinstance(data, str) else None}}
    return {"type": kind, "repr": repr(part)[:200]}


class Adapter:
    supports_progress = True

    def __init__(self, toolset: MCPToolset) -> None:
        self.t = toolset

    async def list_tools(self) -> list[dict]:
        return [to_dict(t) for t in await self.t.list_tools()]

    async def call(self, name, args, on_progress=None) -> Outcome:
        global _progress_target
        _progress_target = on_progress
        try:
            value = await self.t.direct_call_tool(name, args)
        except ModelRetry as exc:
            # isError: true -> ModelRetry with the model-visible text (the result as JSON text).
            return Outcome(structured=None, blocks=[{"type": "text", "text": str(exc.message)}], is_error=True)
        finally:
            _progress_target = None
        if isinstance(value, dict) and value.keys() & {"success", "snippets", "snippet"}:
            return Outcome(structured=value, blocks=[], is_error=None)
        parts = value if isinstance(value, list) else [value]
        blocks = [_part_to_wire(p) for p in parts]
        structured = next((p for p in parts if isinstance(p, dict) and "success" in p), None)
        return Outcome(structured=structured, blocks=blocks, is_error=None)

    async def read_resource(self, uri: str) -> list[dict]:
        value = await self.t.read_resource(uri)
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            if isinstance(item, str):
                out.append({"uri": uri, "text": item})
            else:
                out.append({"uri": uri, "blob": base64.b64encode(item.data).decode(), "mimeType": item.media_type})
        return out


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    if args.url:
        client = args.url
    else:
        from fastmcp.client.transports import StdioTransport

        client = StdioTransport(**common.server_process())

    async def connected() -> bool:
        toolset = MCPToolset(client, read_timeout=CALL_TIMEOUT_S, progress_handler=_on_progress)
        async with toolset:
            return await common.run_workflow(Adapter(toolset))

    return await common.guarded(connected)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
