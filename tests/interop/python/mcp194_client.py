"""Interop driver: the official Python MCP SDK 1.9.4 (ClientSession), protocol 2025-03-26.

Usage: mcp194_client.py --url URL | --stdio

mcp 1.9.4 predates 2025-06-18: its types have no `resource_link` content block and no
structuredContent/outputSchema, and its Streamable HTTP reader parses every SSE `data:` as a JSON-RPC
message. So the server must, for a client that negotiated 2025-03-26, send files as embedded
resources (`type: "resource"`), the result as JSON text, and no SSE priming event (an empty `data:`
with an id). Any ERROR the SDK logs (e.g. "Error parsing SSE message" with a traceback, which is
what a priming event causes) fails the step it happened in.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Outcome, to_dict  # noqa: E402

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

CALL_TIMEOUT = timedelta(seconds=120)


class LogCapture(logging.Handler):
    """Collects WARNING+ records from the SDK (its SSE parse errors go through logger.exception)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        print(f"  [log {record.levelname} {record.name}] {record.getMessage()}", file=sys.stderr)


class Adapter:
    supports_progress = True

    def __init__(self, session: ClientSession, capture: LogCapture) -> None:
        self.s = session
        self.capture = capture

    async def list_tools(self) -> list[dict]:
        return [to_dict(t) for t in (await self.s.list_tools()).tools]

    async def call(self, name, args, on_progress=None) -> Outcome:
        callback = None
        if on_progress is not None:

            async def callback(progress, total, message=None):  # 1.9.4 passes (progress, total)
                await on_progress(progress, message)

        r = await self.s.call_tool(name, args, read_timeout_seconds=CALL_TIMEOUT, progress_callback=callback)
        raw = to_dict(r)
        # 1.9.4's CallToolResult has no structuredContent field; pydantic keeps extra fields, so a
        # server that still sends it would show up here — the new behaviour omits it.
        return Outcome(structured=raw.get("structuredContent"), blocks=raw.get("content") or [], is_error=r.isError)

    async def read_resource(self, uri: str) -> list[dict]:
        from pydantic import AnyUrl

        return [to_dict(c) for c in (await self.s.read_resource(AnyUrl(uri))).contents]

    def check_logs(self) -> str | None:
        bad = [r for r in self.capture.records if r.levelno >= logging.ERROR]
        self.capture.records.clear()
        if not bad:
            return None
        first = bad[0]
        detail = first.getMessage()
        if first.exc_info and first.exc_info[1] is not None:
            detail += f" ({type(first.exc_info[1]).__name__}: {str(first.exc_info[1]).splitlines()[0]})"
        return f"client logged {len(bad)} error(s): {detail}"


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    capture = LogCapture()
    for name in ("mcp", "root"):
        logger = logging.getLogger(None if name == "root" else name)
        logger.addHandler(capture)
    logging.getLogger("mcp").setLevel(logging.WARNING)

    async def connected() -> bool:
        if args.url:
            transport = streamablehttp_client(args.url, timeout=30, sse_read_timeout=300)
        else:
            transport = stdio_client(StdioServerParameters(**common.server_process()))
        async with transport as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                print(f"  negotiated protocol {init.protocolVersion}", file=sys.stderr)
                return await common.run_workflow(Adapter(session, capture))

    return await common.guarded(connected)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
