# `import upstream`: the tools of the upstream MCP servers the operator granted, as Python functions.
#
#     from upstream import memory                 # one configured server
#     found = await memory.search_nodes(query="x")  # structuredContent, else the text, else blocks
#     found = memory.search_nodes.sync(query="x")   # the same without await (plain scripts)
#     help(memory.search_nodes)                    # the tool's description and parameters
#     await everything["get-sum"](a=1, b=2)        # tools whose names are not identifiers
#
# Loaded as the module `_sandbox_upstream` before the memory snapshot is taken. Each call goes
# through one Rust op (the JavaScript function call.js passes to the runner for every call, `_js`),
# which decides everything: grant, arguments, budget, deadline. The checks here only fail early with
# a clearer message. Builtins are bound when this module is defined, before any user code exists.

import asyncio
import inspect
import json
import keyword
import sys
import types

# The JavaScript function of the running call (`_js("catalog")`, `_js("call", ...)`, `_js("cancel",
# id)`), None between calls.
_js = None
_next_id = 0


class UpstreamError(Exception):
    """A call to an upstream tool failed; `kind` says how."""

    kind = "error"


class ToolError(UpstreamError):
    """The tool ran and reported an error (`isError`); `text` holds what it said, `result` all."""

    kind = "tool_error"

    def __init__(self, text, result=None):
        super().__init__(text)
        self.text = text
        self.result = result


class Unavailable(UpstreamError):
    """The server is not connected (or no longer lists the tool)."""

    kind = "unavailable"


class BudgetExceeded(UpstreamError):
    """This execution has made all the calls the server allows it."""

    kind = "budget"


class Denied(UpstreamError, PermissionError):
    """The tool is not granted to the sandbox."""

    kind = "denied"


class UpstreamTimeout(UpstreamError, TimeoutError):
    """No answer within the server's timeout or the execution's."""

    kind = "timeout"


class ResultTooLarge(UpstreamError):
    """The result is larger than the server's max_result_kb."""

    kind = "too_large"


_ERRORS = {
    cls.kind: cls
    for cls in (UpstreamError, Unavailable, BudgetExceeded, Denied, UpstreamTimeout, ResultTooLarge)
}
_ERRORS["invalid_arguments"] = TypeError
_ERRORS["cancelled"] = asyncio.CancelledError

_JSON_TYPES = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list, tuple),
    "null": (type(None),),
}


def _handle():
    js = _js
    if js is None:
        raise Unavailable("upstream tools can be called only while code runs")
    return js


def _type_ok(value, expected, isinstance=isinstance, bool=bool):
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kinds = _JSON_TYPES.get(name)
        if kinds is None:
            return True
        if isinstance(value, bool) and name in ("number", "integer"):
            continue
        if isinstance(value, kinds):
            return True
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def _check(tool, schema, kwargs):
    properties = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if name not in kwargs:
            raise TypeError(f"{tool}() missing required keyword argument '{name}'")
    closed = schema.get("additionalProperties") is False
    for name, value in kwargs.items():
        prop = properties.get(name)
        if prop is None:
            if closed:
                raise TypeError(f"{tool}() got an unexpected keyword argument '{name}'")
            continue
        expected = prop.get("type") if isinstance(prop, dict) else None
        if expected is not None and not _type_ok(value, expected):
            raise TypeError(
                f"{tool}() argument '{name}' must be of JSON type {expected}, not {type(value).__name__}"
            )


def _result(result):
    """A CallToolResult as Python: structuredContent, else one text block's text, else the blocks."""
    content = result.get("content") or []
    if result.get("isError"):
        text = "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
        raise ToolError(text or "the tool reported an error", result)
    if "structuredContent" in result:
        return result["structuredContent"]
    if len(content) == 1 and content[0].get("type") == "text":
        return content[0].get("text", "")
    return content


async def _call(server, tool, kwargs):
    global _next_id
    js = _handle()
    try:
        text = json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{server}.{tool}: the arguments are not JSON: {exc}") from None
    _next_id = _next_id % 0x3FFFFFFF + 1
    call_id = _next_id
    try:
        reply = await js("call", server, tool, text, call_id)
    except asyncio.CancelledError:
        js("cancel", call_id)
        raise
    finally:
        # (An exception raised below keeps this frame; it must not keep the call's JavaScript handle,
        # or a session whose code keeps the exception could not be saved.)
        js = None
    reply = json.loads(str(reply))
    if "error" in reply:
        error = reply["error"]
        raise _ERRORS.get(error.get("kind"), UpstreamError)(error.get("message", ""))
    return _result(reply["ok"])


def _python_name(name):
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if not text or text[0].isdigit():
        text = "_" + text
    if keyword.iskeyword(text):
        text += "_"
    return text


def _signature(schema):
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = []
    for name, prop in properties.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            continue
        default = inspect.Parameter.empty if name in required else None
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    if schema.get("additionalProperties") is not False or len(params) < len(properties):
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _doc(server, spec):
    schema = spec.get("inputSchema") or {}
    lines = [spec.get("description") or f"The tool {spec['name']} of {server}.", ""]
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    if properties:
        lines.append("Parameters (keyword-only):")
        for name, prop in properties.items():
            prop = prop if isinstance(prop, dict) else {}
            kind = prop.get("type", "any")
            need = "required" if name in required else "optional"
            text = prop.get("description", "")
            lines.append(f"    {name} ({kind}, {need}){': ' + text if text else ''}")
    lines.append("")
    lines.append(f"Await it, or call .sync(...). MCP tool {spec['name']!r} of the upstream server {server!r}.")
    return "\n".join(lines)


def _make_tool(server, spec):
    name = spec["name"]
    schema = spec.get("inputSchema") or {}

    async def tool(**kwargs):
        _check(f"{server}.{name}", schema, kwargs)
        return await _call(server, name, kwargs)

    def sync(**kwargs):
        from pyodide.ffi import can_run_sync, run_sync

        if not can_run_sync():
            raise RuntimeError(f"{server}.{name}.sync() cannot run here: use `await {server}.{name}(...)`")
        return run_sync(tool(**kwargs))

    tool.__name__ = tool.__qualname__ = _python_name(name)
    tool.__module__ = f"upstream.{server}"
    tool.__doc__ = _doc(server, spec)
    tool.__signature__ = _signature(schema)
    tool.sync = sync
    tool.tool_name = name
    tool.input_schema = schema
    return tool


class Server:
    """An upstream MCP server: its granted tools as attributes (`server.tool`) and items
    (`server["tool-name"]`)."""

    def __init__(self, name, tools, available=True, reason=None):
        self._name = name
        self._tools = {spec["name"]: _make_tool(name, spec) for spec in tools}
        self._by_attr = {_python_name(t): f for t, f in self._tools.items()}
        self._available = available
        self._reason = reason
        self.__doc__ = f"The upstream MCP server {name!r}: " + (
            ", ".join(sorted(self._by_attr)) if self._tools else f"no tools available ({reason})"
        )

    def __getattr__(self, attr):
        tools = self.__dict__.get("_by_attr", {})
        if attr in tools:
            return tools[attr]
        reason = self.__dict__.get("_reason")
        more = f" (the server is unavailable: {reason})" if reason else ""
        raise AttributeError(f"upstream server {self.__dict__.get('_name')!r} has no tool {attr!r}{more}")

    def __getitem__(self, name):
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"upstream server {self._name!r} has no tool {name!r}") from None

    def __dir__(self):
        return sorted(self._by_attr)

    def __iter__(self):
        return iter(self._tools)

    @property
    def tools(self):
        return list(self._tools)

    def __repr__(self):
        return f"<upstream server {self._name!r}: {len(self._tools)} tools>"


def _build_module():
    catalog = json.loads(str(_handle()("catalog")))
    module = types.ModuleType(
        "upstream",
        "The upstream MCP servers this sandbox may call, as objects whose tools are async functions.",
    )
    names = []
    for entry in catalog.get("servers", ()):
        server = Server(entry["name"], entry.get("tools", ()), entry.get("available", True), entry.get("reason"))
        setattr(module, entry["name"], server)
        names.append(entry["name"])
    for cls in (UpstreamError, ToolError, Unavailable, BudgetExceeded, Denied, UpstreamTimeout, ResultTooLarge):
        setattr(module, cls.__name__, cls)
    module.Server = Server
    module.servers = tuple(names)
    module.__all__ = list(names)
    return module


class _Loader:
    @staticmethod
    def create_module(spec):
        return _build_module()

    @staticmethod
    def exec_module(module):
        pass


class _Finder:
    """Serves `import upstream` (after every other finder: an installed package of that name wins)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "upstream":
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, _Loader)


def release():
    """The end of every call: the handle is dropped (a session's image names no JavaScript)."""
    global _js
    _js = None


def install():
    """Called by the runner's prepare() on a server with upstreams configured."""
    if _Finder not in sys.meta_path:
        sys.meta_path.append(_Finder)
