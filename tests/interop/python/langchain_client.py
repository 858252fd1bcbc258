"""Interop driver: langchain-mcp-adapters 0.3.2 (MultiServerMCPClient, LangChain tools).

Usage: langchain_client.py --url URL | --stdio

Tools come from MultiServerMCPClient.get_tools() and are called as a LangGraph ToolNode would,
tool.ainvoke(ToolCall): the reply is a ToolMessage whose content holds the converted content
blocks and whose artifact holds structuredContent. By default every tool call opens a new MCP
session (initialize ... DELETE; a new child process over stdio), so state across calls must live
in the server's own session_id, not in the MCP session. resources/read goes through
client.get_resources(uris=...), which returns LangChain Blobs. Progress goes through
Callbacks(on_progress=...), set on the client.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Outcome, to_dict  # noqa: E402

from langchain_mcp_adapters.callbacks import Callbacks  # noqa: E402
from langchain_mcp_adapters.client import MultiServerMCPClient  # noqa: E402

SERVER = "cim"
# The progress callback is client-wide; the current step's handler is routed through this.
_progress_target = None


async def _on_progress(progress, total, message, context) -> None:
    if _progress_target is not None:
        await _progress_target(progress, message)


def _lc_block_to_wire(block) -> dict:
    """LangChain content block -> MCP-shaped block (text, image, resource_link, resource)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")}
    if kind in ("image", "file"):
        mime = block.get("mime_type")
        if block.get("url"):  # a resource_link
            return {"type": "resource_link", "uri": block["url"], "mimeType": mime}
        if kind == "image":
            return {"type": "image", "data": block.get("base64", ""), "mimeType": mime}
        # An embedded blob resource: the adapter keeps no URI, only the bytes.
        return {"type": "resource", "resource": {"uri": "", "blob": block.get("base64", ""), "mimeType": mime}}
    return dict(block)


class Adapter:
    supports_progress = True

    def __init__(self, client: MultiServerMCPClient) -> None:
        self.client = client
        self.tools: dict = {}
        self._ids = 0

    async def list_tools(self) -> list[dict]:
        tools = await self.client.get_tools(server_name=SERVER)
        self.tools = {t.name: t for t in tools}
        return [{"name": t.name, "inputSchema": t.args_schema if isinstance(t.args_schema, dict) else {}} for t in tools]

    async def call(self, name, args, on_progress=None) -> Outcome:
        global _progress_target
        if not self.tools:
            await self.list_tools()
        self._ids += 1
        _progress_target = on_progress
        try:
            msg = await self.tools[name].ainvoke(
                {"name": name, "args": args, "id": f"call_{self._ids}", "type": "tool_call"}
            )
        finally:
            _progress_target = None
        content = msg.content if isinstance(msg.content, list) else [msg.content]
        artifact = msg.artifact or {}
        structured = artifact.get("structured_content") if isinstance(artifact, dict) else None
        # status "error" is how the adapter marks isError: true (it raises, then handles the error).
        return Outcome(structured=structured, blocks=[_lc_block_to_wire(b) for b in content], is_error=msg.status == "error")

    async def read_resource(self, uri: str) -> list[dict]:
        blobs = await self.client.get_resources(server_name=SERVER, uris=[uri])
        out = []
        for blob in blobs:
            data = blob.as_bytes()
            out.append({"uri": str(blob.metadata.get("uri")), "mimeType": blob.mimetype, "blob": base64.b64encode(data).decode()})
        return out


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    if args.url:
        connection = {"transport": "streamable_http", "url": args.url, "timeout": 30, "sse_read_timeout": 300}
    else:
        connection = {"transport": "stdio", **common.server_process()}

    async def connected() -> bool:
        client = MultiServerMCPClient({SERVER: connection}, callbacks=Callbacks(on_progress=_on_progress))
        return await common.run_workflow(Adapter(client))

    return await common.guarded(connected)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
