"""Interop driver: FastMCP 4.2.3's Client (on the official mcp 2.x SDK).

Usage: fastmcp_client.py --url URL | --stdio

Calls go through Client.call_tool(..., raise_on_error=False), the high-level path that also
validates structuredContent against the tool's outputSchema, and read_resource().
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Outcome, to_dict  # noqa: E402

from fastmcp import Client  # noqa: E402
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport  # noqa: E402

CALL_TIMEOUT_S = 120


class Adapter:
    supports_progress = True

    def __init__(self, client: Client) -> None:
        self.c = client

    async def list_tools(self) -> list[dict]:
        return [to_dict(t) for t in await self.c.list_tools()]

    async def call(self, name, args, on_progress=None) -> Outcome:
        handler = None
        if on_progress is not None:

            async def handler(progress, total, message):
                await on_progress(progress, message)

        r = await self.c.call_tool(
            name, args, timeout=CALL_TIMEOUT_S, progress_handler=handler, raise_on_error=False
        )
        return Outcome(structured=r.structured_content, blocks=[to_dict(b) for b in r.content], is_error=r.is_error)

    async def read_resource(self, uri: str) -> list[dict]:
        return [to_dict(c) for c in await self.c.read_resource(uri)]


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    if args.url:
        transport = StreamableHttpTransport(args.url)
    else:
        transport = StdioTransport(**common.server_process())

    async def connected() -> bool:
        async with Client(transport, timeout=CALL_TIMEOUT_S) as client:
            return await common.run_workflow(Adapter(client))

    return await common.guarded(connected)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
