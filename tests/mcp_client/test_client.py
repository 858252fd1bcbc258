"""End-to-end check of code-interpreter-mcp with the official Python MCP client (mcp 2.x).

Usage: test_client.py URL   (e.g. http://127.0.0.1:PORT/mcp)

Runs the same checks in both client modes: "2026-07-28" (stateless, per-request _meta)
and "legacy" (initialize handshake). Prints one line per check and ends with
"N passed, M failed"; exits non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client

MODES = ("2026-07-28", "legacy")
TOOL = "run_python_code"
CALL_TIMEOUT_S = 120.0


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


async def check_list_tools(client: Client) -> None:
    result = await client.list_tools()
    names = [t.name for t in result.tools]
    _check(TOOL in names, f"{TOOL} not in tools/list: {names}")
    tool = next(t for t in result.tools if t.name == TOOL)
    schema = tool.input_schema
    _check(schema.get("type") == "object", f"inputSchema.type is {schema.get('type')!r}")
    _check("code" in (schema.get("required") or []), f"inputSchema.required lacks 'code': {schema.get('required')}")
    _check("code" in (schema.get("properties") or {}), "inputSchema.properties lacks 'code'")


async def check_call_ok(client: Client) -> None:
    result = await client.call_tool(TOOL, {"code": "print('hi')\n6*7"}, read_timeout_seconds=CALL_TIMEOUT_S)
    sc: Any = result.structured_content
    _check(result.is_error is False, f"isError is {result.is_error!r}; structuredContent={sc!r}")
    _check(isinstance(sc, dict), f"structuredContent is not an object: {sc!r}")
    _check(sc.get("stdout") == "hi\n", f"stdout is {sc.get('stdout')!r}")
    _check(sc.get("result") == "42", f"result is {sc.get('result')!r}")


async def check_call_python_error(client: Client) -> None:
    result = await client.call_tool(TOOL, {"code": "raise ValueError('x')"}, read_timeout_seconds=CALL_TIMEOUT_S)
    sc: Any = result.structured_content
    _check(result.is_error is True, f"isError is {result.is_error!r}; structuredContent={sc!r}")
    _check(isinstance(sc, dict), f"structuredContent is not an object: {sc!r}")
    err = sc.get("error")
    _check(isinstance(err, dict), f"structuredContent.error is not an object: {err!r}")
    _check(err.get("kind") == "python", f"error.kind is {err.get('kind')!r}")


async def check_call_pandas_file(client: Client) -> None:
    code = (
        "import pandas as pd\n"
        "frame = pd.DataFrame({'value': [1, 2, 3]})\n"
        "frame.loc[frame['value'] > 1].to_csv('results.csv', index=False)\n"
        "int(frame['value'].sum())"
    )
    result = await client.call_tool(TOOL, {"code": code}, read_timeout_seconds=CALL_TIMEOUT_S)
    sc: Any = result.structured_content
    _check(result.is_error is False, f"isError is {result.is_error!r}; structuredContent={sc!r}")
    _check(sc.get("result") == "6", f"result is {sc.get('result')!r}")
    files = {f.get("path"): f for f in sc.get("files") or []}
    _check("results.csv" in files, f"results.csv not returned: {list(files)}")
    content = base64.b64decode(files["results.csv"]["content_base64"]).decode()
    _check(content == "value\n2\n3\n", f"results.csv is {content!r}")


# A 1x1 PNG written with zlib + struct (no packages needed).
PNG_CODE = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)
png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))
png += chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')
open('dot.png', 'wb').write(png)
counter += 1
counter
"""


async def check_session(client: Client) -> None:
    async def call(tool: str, args: dict[str, Any]) -> Any:
        return await client.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT_S)

    first = await call(TOOL, {"code": "counter = 41", "session_id": "new"})
    sc: Any = first.structured_content
    _check(first.is_error is False, f"new session failed: {sc!r}")
    session = sc.get("session_id")
    _check(isinstance(session, str) and len(session) >= 22, f"session_id is {session!r}")
    second = await call(TOOL, {"code": PNG_CODE, "session_id": session})
    sc = second.structured_content
    _check(sc.get("result") == "42", f"state did not persist: {sc!r}")
    kinds = [block.type for block in second.content]
    _check("image" in kinds, f"no image content block: {kinds}")
    links = [block for block in second.content if block.type == "resource_link"]
    uri = f"session://{session}/dot.png"
    _check([str(link.uri) for link in links] == [uri], f"resource links: {links!r}")
    read = await client.read_resource(uri)
    blob = read.contents[0]
    _check(getattr(blob, "mime_type", None) == "image/png", f"resource read: {blob!r}")
    _check(base64.b64decode(blob.blob).startswith(b"\x89PNG"), "resource blob is not the PNG")
    stateless = await call(TOOL, {"code": "'counter' in globals()"})
    _check(stateless.structured_content.get("result") == "False", "session state leaked into a stateless call")
    cleared = await call("clear_session", {"session_id": session})
    _check(cleared.structured_content.get("success") is True, f"clear_session: {cleared.structured_content!r}")
    gone = await call(TOOL, {"code": "counter", "session_id": session})
    err = gone.structured_content.get("error") or {}
    _check(err.get("kind") == "session" and err.get("type") == "SessionNotFound", f"after clear: {err!r}")


CHECKS: list[tuple[str, Callable[[Client], Awaitable[None]]]] = [
    ("list_tools", check_list_tools),
    ("call_ok", check_call_ok),
    ("call_python_error", check_call_python_error),
    ("call_pandas_file", check_call_pandas_file),
    ("session", check_session),
]


async def run_mode(url: str, mode: str) -> tuple[int, int]:
    passed = failed = 0
    try:
        async with Client(url, mode=mode, raise_exceptions=True) as client:
            version = client.session.protocol_version
            print(f"[{mode}] connected, protocol version {version}")
            for name, fn in CHECKS:
                try:
                    await fn(client)
                except Exception as exc:  # noqa: BLE001 - report every failure, keep going
                    failed += 1
                    print(f"FAIL [{mode}] {name}: {type(exc).__name__}: {exc}")
                else:
                    passed += 1
                    print(f"PASS [{mode}] {name}")
    except Exception as exc:  # noqa: BLE001 - connection failure fails every check in this mode
        print(f"FAIL [{mode}] session: {type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
        # Checks never reached count as failed; a failure only at teardown still counts once.
        return passed, max(len(CHECKS) - passed, 1)
    return passed, failed


async def main(url: str) -> int:
    # Show the SDK's own warnings (e.g. an unexpected DELETE status) in order, on stdout,
    # before the closing summary line. They are reported, not counted as failures.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("WARN [%(name)s] %(message)s"))
    sdk_logger = logging.getLogger("mcp")
    sdk_logger.addHandler(handler)
    sdk_logger.setLevel(logging.WARNING)
    sdk_logger.propagate = False
    total_passed = total_failed = 0
    for mode in MODES:
        p, f = await run_mode(url, mode)
        total_passed += p
        total_failed += f
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: test_client.py URL", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(main(sys.argv[1])))
