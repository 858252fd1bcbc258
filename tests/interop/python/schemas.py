"""Schema portability check: do the server's tool input schemas survive the agent frameworks' own
conversions?

Usage: schemas.py --url URL | --stdio

For every tool from tools/list (fetched with the mcp SDK in this venv) it runs:
  * openai-agents: agents.strict_schema.ensure_strict_json_schema, called as MCPUtil.to_function_tool
    calls it (a failure means the tool is served to the model as non-strict);
  * Gemini (google-genai): google.genai._mcp_utils.mcp_to_gemini_tool, i.e. _filter_to_supported_schema
    then types.Schema.from_json_schema (what the SDK does for MCP tools passed in `tools=`), and checks
    that every input property survived with a type;
  * pydantic-ai: GoogleOpenAPISchemaTransformer and GoogleJsonSchemaTransformer (Gemini profiles);
and flags constructs that several clients mishandle: a "format" of "uint64" (or another schemars
integer format), "default": null, a "type" array, "$ref"/"$defs". Each tool gets one line per
converter; warnings (Python warnings and log records raised during a conversion) are printed too.
The check FAILS (exit 1) when a converter errors or any flagged construct is present, and
prints "schemas: ok" / "schemas: FAIL N problem(s)" last.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

UINT_FORMATS = {"uint", "uint8", "uint16", "uint32", "uint64", "uint128", "int8", "int16", "uint64"}


def flags(schema, path="$") -> list[str]:
    """Constructs in an input schema that portable tool schemas avoid."""
    found: list[str] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            here = f"{path}.{key}"
            if key == "format" and isinstance(value, str) and value in UINT_FORMATS:
                found.append(f'{here} = "{value}"')
            elif key == "default" and value is None:
                found.append(f"{here} = null")
            elif key == "type" and isinstance(value, list):
                found.append(f"{here} = {json.dumps(value)}")
            elif key in ("$ref", "$defs", "definitions"):
                found.append(f"{here} present")
            if key not in ("default", "enum", "const", "examples"):
                found.extend(flags(value, here))
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found.extend(flags(value, f"{path}[{i}]"))
    return found


class Captured:
    """Collects Python warnings and WARNING+ log records raised inside a `with` block."""

    def __enter__(self):
        self.items: list[str] = []
        self._w = warnings.catch_warnings(record=True)
        self._records = self._w.__enter__()
        warnings.simplefilter("always")
        self._handler = logging.Handler(logging.WARNING)
        self._handler.emit = lambda r: self.items.append(f"log {r.name}: {r.getMessage()}")
        logging.getLogger().addHandler(self._handler)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeHandler(self._handler)
        self.items.extend(f"warning {w.category.__name__}: {w.message}" for w in self._records)
        self._w.__exit__(*exc)
        return False


def check_openai(tool) -> tuple[bool, str]:
    from agents.strict_schema import ensure_strict_json_schema

    schema = copy.deepcopy(tool.inputSchema)
    schema.setdefault("properties", {})
    try:
        ensure_strict_json_schema(schema, _reject_open_objects=bool(tool.inputSchema))
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"
    return True, "strict"


def check_gemini(tool) -> tuple[bool, str]:
    from google.genai import _mcp_utils

    try:
        converted = _mcp_utils.mcp_to_gemini_tool(tool)
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    params = converted.function_declarations[0].parameters
    props = (params.properties or {}) if params is not None else {}
    lost = []
    for name, spec in (tool.inputSchema.get("properties") or {}).items():
        got = props.get(name)
        if got is None:
            lost.append(f"{name} dropped")
        elif got.type is None and not got.any_of:
            lost.append(f"{name} has no type")
        elif spec.get("type") == "array" and (got.items is None or (got.items.type is None and not got.items.properties)):
            lost.append(f"{name}.items lost")
    if lost:
        return False, "converted but " + ", ".join(lost)
    return True, "converted: " + ", ".join(f"{k}:{(v.type.value if v.type else '?')}{'?' if v.nullable else ''}" for k, v in props.items())


def check_pydantic_ai(tool, cls_name: str) -> tuple[bool, str]:
    from pydantic_ai.profiles import google as google_profile

    cls = getattr(google_profile, cls_name, None)
    if cls is None:
        return True, "skip (not in this pydantic-ai)"
    try:
        out = cls(copy.deepcopy(tool.inputSchema), strict=None).walk()
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"
    left = [f for f in flags(out) if "$ref" in f or "$defs" in f]
    if left and cls_name == "GoogleOpenAPISchemaTransformer":  # the OpenAPI subset has no $ref
        return False, "left " + ", ".join(left)
    if left:  # sent as parametersJsonSchema, which accepts $ref/$defs: not an error
        return True, "converted (keeps " + ", ".join(left) + "; sent as parametersJsonSchema)"
    return True, "converted"


async def fetch_tools(args):
    if args.url:
        transport = streamablehttp_client(args.url)
    else:
        transport = stdio_client(StdioServerParameters(**common.server_process()))
    async with transport as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return (await session.list_tools()).tools


async def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    tools = await fetch_tools(args)
    problems = 0
    for tool in sorted(tools, key=lambda t: t.name):
        print(f"{tool.name}:")
        found = flags(tool.inputSchema)
        for f in found:
            print(f"  FLAG input schema {f}")
        problems += len(found)
        checks = [
            ("openai-agents strict", lambda: check_openai(tool)),
            ("gemini mcp_to_gemini_tool", lambda: check_gemini(tool)),
            ("pydantic-ai GoogleOpenAPISchemaTransformer", lambda: check_pydantic_ai(tool, "GoogleOpenAPISchemaTransformer")),
            ("pydantic-ai GoogleJsonSchemaTransformer", lambda: check_pydantic_ai(tool, "GoogleJsonSchemaTransformer")),
        ]
        for label, fn in checks:
            with Captured() as cap:
                ok, detail = fn()
            print(f"  {'ok  ' if ok else 'FAIL'} {label}: {detail}")
            for item in cap.items:
                print(f"       {' '.join(item.split())[:300]}")
            problems += 0 if ok else 1
    print("schemas: ok" if problems == 0 else f"schemas: FAIL {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
